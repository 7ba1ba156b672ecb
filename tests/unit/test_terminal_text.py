"""Issue #38 item 6: terminal escape codes in an upstream's model name never reach the terminal
raw through ``specwatch advise --exporter`` / ``--prometheus`` (upstream text is escaped:
:func:`specwatch.common.labels.for_terminal`)."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from specwatch.choosek.cli import advise
from specwatch.common.labels import for_terminal

EVIL = "llama\x1b]0;pwned\x07\x1b[2J\x1b[31m\u202eevil\x9b"


@pytest.mark.parametrize(("text", "shown"), [
    ("plain-model", "plain-model"),
    ("é/中文/Qwen3-0.6B", "é/中文/Qwen3-0.6B"),
    ("a\x1b[31mb", "a\\x1b[31mb"),
    ("x\u202ey", "x\\u202ey"),
    ("bell\x07", "bell\\x07"),
    ("c1\x9b", "c1\\x9b"),
    ("nl\nand\rcr", "nl\\nand\\rcr"),
])
def test_for_terminal_escapes_what_a_terminal_would_act_on(text, shown):
    assert for_terminal(text) == shown
    assert for_terminal(for_terminal(text)) == for_terminal(text)


@contextmanager
def _serve(path: str, body: bytes, content_type: str = "text/plain; version=0.0.4"):
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path.split("?")[0] == path
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", content_type)
            self.end_headers()
            self.wfile.write(body if ok else b"")

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _exporter_text(model: str) -> str:
    esc = model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    lines = ["# HELP specwatch_position_acceptance_rate x", "# TYPE specwatch_position_acceptance_rate gauge"]
    for pos, rate in enumerate((0.8, 0.6, 0.4, 0.2), start=1):
        lines.append(f'specwatch_position_acceptance_rate{{upstream="u",model_name="{esc}",engine="0",position="{pos}",'
                     f'window="lifetime",basis="exact"}} {rate}')
    return "\n".join(lines) + "\n"


def test_advise_exporter_never_prints_an_upstreams_escape_codes(tmp_path):
    with _serve("/metrics", _exporter_text(EVIL).encode()) as base:
        out = tmp_path / "a.json"
        r = CliRunner().invoke(advise, ["--exporter", base + "/metrics", "--concurrency", "1", "--json", str(out)])
    assert r.exit_code == 0, r.output
    for raw in ("\x1b", "\x07", "\u202e", "\x9b"):
        assert raw not in r.output, repr(r.output)
    assert "llama\\x1b" in r.output, r.output
    assert "\x1b" not in out.read_text()


def test_advise_prometheus_never_prints_an_upstreams_escape_codes():
    data = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"job": "vllm\x1b[2J", "model_name": EVIL, "position": str(p)}, "value": [0, str(r)]}
        for p, r in enumerate((0.8, 0.6, 0.4), start=1)]}}
    with _serve("/api/v1/query", json.dumps(data).encode(), "application/json") as base:
        r = CliRunner().invoke(advise, ["--prometheus", base, "--concurrency", "1"])
    assert r.exit_code == 0, r.output
    for raw in ("\x1b", "\x07", "\u202e", "\x9b"):
        assert raw not in r.output, repr(r.output)
    assert "llama\\x1b" in r.output


def test_a_prometheus_error_is_printed_escaped():
    data = {"status": "error", "error": "bad query \x1b[2J"}
    with _serve("/api/v1/query", json.dumps(data).encode(), "application/json") as base:
        r = CliRunner().invoke(advise, ["--prometheus", base])
    assert r.exit_code == 1 and "\x1b" not in r.output and "bad query \\x1b[2J" in r.output, r.output


def _evil_exporter_text() -> str:
    from exporter_helpers import exporter_text

    esc = EVIL.replace("\\", "\\\\").replace('"', '\\"')
    return exporter_text().replace('model_name="smollm2"', f'model_name="{esc}"').replace(
        'upstream="vllm"', 'upstream="vllm\x1b[1m[bold]"')


@pytest.mark.parametrize("window", ["lifetime"])
def test_top_once_never_prints_an_upstreams_escape_codes(window):
    from specwatch.top.cli import top

    with _serve("/metrics", _evil_exporter_text().encode()) as base:
        r = CliRunner().invoke(top, ["--exporter", base + "/metrics", "--once", "--window", window])
    assert r.exit_code == 0, r.output
    for raw in ("\x1b", "\x07", "\u202e", "\x9b"):
        assert raw not in r.output, repr(r.output)
    assert "model llama\\x1b" in r.output and "upstream vllm\\x1b[1m[bold]" in r.output, r.output


def test_top_live_panel_title_shows_markup_and_escapes_as_text():
    import io

    from prometheus_client.parser import text_string_to_metric_families
    from rich.console import Console

    from specwatch.top.model import build_view
    from specwatch.top.render import render_live

    samples = [s for f in text_string_to_metric_families(_evil_exporter_text()) for s in f.samples]
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(render_live(build_view(samples, "lifetime"), "test", 200))
    text = buf.getvalue()
    assert "\x1b" not in text and "vllm\\x1b[1m[bold]" in text and "llama\\x1b" in text, text
