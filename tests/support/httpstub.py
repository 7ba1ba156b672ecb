"""Small HTTP servers in a thread of the test process, standing in for an upstream (/metrics,
/server_info) or Prometheus' query API; they listen on 127.0.0.1 only, on a port the kernel picks.

- :func:`serve_in_thread`: a ``with`` block serving a handler class;
- :func:`send`: one whole answer from a handler (status, Content-Type, Content-Length, body);
- :func:`serve_pages`: fixed answers by path;
- :class:`QuietHandler`: a handler base that logs no request.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextlib.contextmanager
def serve_in_thread(handler: type[BaseHTTPRequestHandler],
                    server_class: type[ThreadingHTTPServer] = ThreadingHTTPServer) -> Iterator[ThreadingHTTPServer]:
    """Serve ``handler`` with ``server_class`` on 127.0.0.1 (a free port) in a daemon thread for the
    ``with`` block; yields the server (its URL: :func:`base_url`). Shut down and closed on exit."""
    srv = server_class(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def base_url(srv: ThreadingHTTPServer) -> str:
    """``http://127.0.0.1:PORT`` of a server :func:`serve_in_thread` started."""
    return f"http://127.0.0.1:{srv.server_address[1]}"


def send(handler: BaseHTTPRequestHandler, body: bytes, content_type: str | None = None, code: int = 200) -> None:
    """Answer the handler's request with ``code``, a Content-Type (when given), a Content-Length
    and ``body``."""
    handler.send_response(code)
    if content_type is not None:
        handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing (http.server prints every request to stderr)."""

    def log_message(self, *args):  # http.server API
        pass


@contextlib.contextmanager
def serve_pages(pages: dict[str, tuple[int, str, bytes]]) -> Iterator[str]:
    """Serve ``{path: (status, content type, body)}`` on 127.0.0.1 in a thread; yields the base URL."""

    class H(QuietHandler):
        def do_GET(self):
            code, ctype, body = pages[self.path]
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.end_headers()
            self.wfile.write(body)

    with serve_in_thread(H) as srv:
        yield base_url(srv)
