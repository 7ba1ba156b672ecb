"""The demo's Prometheus check names why the exporter served no recommended k (issue 22)."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer

from rich.console import Console

from httpstub import QuietHandler, base_url, send

from specwatch import demo


def _prometheus_answering(result: list[dict]) -> tuple[ThreadingHTTPServer, str]:
    """A stand-in for Prometheus' /api/v1/query answering ``result`` (a vector) to every query."""
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()

    class H(QuietHandler):
        def do_GET(self):
            assert self.path.startswith("/api/v1/query?")
            send(self, body, "application/json")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, base_url(srv)


def test_withheld_reasons_are_read_from_the_series_labels_and_explained():
    srv, url = _prometheus_answering([
        {"metric": {"__name__": "specwatch_recommendation_withheld", "upstream": "spec", "window": "5m",
                    "reason": "insufficient_data"}, "value": [0, "1"]}])
    try:
        reasons = demo.withheld_reasons(url)
    finally:
        srv.shutdown()
    assert reasons == ["insufficient_data"]
    con = Console(record=True, width=200)
    demo._print_prometheus_check({}, con, reasons)
    text = con.export_text()
    assert "withheld: insufficient_data: too few engine steps or drafts in the 5m window" in text


def test_no_prometheus_gives_no_reason_and_the_generic_hint():
    assert demo.withheld_reasons("http://127.0.0.1:9") == []  # nothing listens on the discard port
    con = Console(record=True, width=200)
    demo._print_prometheus_check({}, con, [])
    assert "specwatch top says why" in con.export_text()


def test_an_unknown_reason_is_shown_as_is():
    assert demo._withheld_text(["new_reason"]) == "(withheld: new_reason)"
