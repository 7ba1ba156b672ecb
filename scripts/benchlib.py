"""Shared parts of the exporter benchmarks (scripts/bench_exporter*.py): a stand-in upstream that
serves captured vLLM /metrics bodies (as they are, or with their counters grown), and the result writer.

Imported by the scripts from their own directory (``python scripts/bench_exporter.py`` puts
``scripts/`` first on ``sys.path``); not part of the installed package.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "metrics"
#: real vLLM 0.32 captures the exporter benchmarks serve as their upstreams' bodies
CAPTURES = [FIXTURES / f"vllm-0.32-ngram-k{k}-after-traffic.txt" for k in (2, 4, 8)]
# sample lines whose value grows with traffic (the counters the exporter reads)
_GROWING = re.compile(
    r"^((?:vllm:spec_decode_num_\w+_total|vllm:generation_tokens_total|vllm:inter_token_latency_seconds_(?:sum|count)"
    r"|vllm:iteration_tokens_total_count|vllm:time_to_first_token_seconds_count)(?:\{[^}]*\})?) (\S+)$", re.M)


def growing_template(text: str) -> list:
    """Body split into static text and (value) slots: [str, float, str, float, …, str]."""
    out: list = []
    pos = 0
    for m in _GROWING.finditer(text):
        out.append(text[pos:m.start(2)])
        out.append(float(m.group(2)))
        pos = m.end(2)
    out.append(text[pos:])
    return out


def render_growing(tpl: list, mult: int) -> bytes:
    """The body of ``tpl`` with every growing value multiplied by ``mult`` (an integer, so vLLM's
    invariants hold)."""
    return "".join(p if isinstance(p, str) else repr(p * mult) for p in tpl).encode()


def serve_bodies(bodies: list[bytes]) -> tuple[ThreadingHTTPServer, str]:
    """Serve ``bodies`` (captured /metrics texts) on 127.0.0.1 at a free port, in a daemon thread.

    ``GET /<i>/…`` answers ``bodies[i % len(bodies)]`` (so N upstream URLs can share one server);
    any other path answers ``bodies[0]``. HTTP/1.1 keep-alive, Nagle off (no delayed-ACK stalls
    between header and body writes), a listen backlog of 1024 (128 concurrent connects must not
    overflow it). Returns (server, base URL ``http://127.0.0.1:PORT``); ``server.shutdown()`` stops it.
    Raises ValueError when ``bodies`` is empty.
    """
    if not bodies:
        raise ValueError("serve_bodies: no bodies to serve")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, *a):
            pass

        def do_GET(self):
            head = self.path.strip("/").split("/")[0]
            body = bodies[int(head) % len(bodies)] if head.isdigit() else bodies[0]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 1024

    srv = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def write_result(path: Path | None, doc: dict[str, Any]) -> None:
    """Write a benchmark's result ``doc`` as indented JSON to ``path`` (nothing when None)."""
    if path is not None:
        path.write_text(json.dumps(doc, indent=2) + "\n")
