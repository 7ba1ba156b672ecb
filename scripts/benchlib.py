"""Shared parts of the exporter benchmarks (scripts/bench_exporter*.py): a stand-in upstream that
serves captured vLLM /metrics bodies, and the result writer.

Imported by the scripts from their own directory (``python scripts/bench_exporter.py`` puts
``scripts/`` first on ``sys.path``); not part of the installed package.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


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
