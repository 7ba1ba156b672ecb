"""The exporter's own HTTP listener, hardened against floods and slow clients.

A small HTTP/1.1 server (one request per connection, ``Connection: close``) that runs a WSGI app
(:func:`specwatch.exporter.app.make_app`). Limits, all enforced by the clock or by counters:

- at most ``max_connections`` connections still *sending their request head* (line and headers;
  one thread each). A new connection beyond that evicts the one that has waited longest for its
  head — among those of the source address holding the most such connections, and only one
  waiting at least :data:`EVICT_MIN_AGE` seconds — which is answered ``503`` and closed; when
  none can be evicted the new connection is answered ``503`` without reading and closed;
- up to ``max_requests`` more connections (the *reserve*) for those that completed their head
  and are being answered: a full set of idle or half-sent connections never blocks a client
  that sends its request at once (a scraper); beyond both, ``503`` at once;
- at most ``max_requests`` ``/metrics`` requests served at once (like node_exporter's
  ``--web.max-requests``); more get ``503 Service Unavailable`` at once;
- the request line and headers must arrive within ``request_timeout`` seconds in total (a
  slowloris client is dropped then, however slowly it trickles) and within ``max_header_bytes``
  (``431`` beyond); the answer must be taken within ``request_timeout`` seconds too;
- the listen backlog is the system's ``SOMAXCONN`` (at most 1024); ``accept()`` failing for lack
  of file descriptors backs off for 50 ms instead of spinning;
- IPv4 and IPv6 listen addresses (``[::]`` accepts both families where the system allows);
- a request the app cannot answer (an exception) is answered ``500`` and logged at warning level,
  never closed without an answer.

Why eviction and not only a cap or a shorter timeout (docs/exporter.md, "The listener"): a client
that re-opens each connection as soon as it is answered keeps any fixed cap full, whatever the
timeout, so the newcomer must be able to take the place of a connection that has had its chance.
After a flood ends, held connections time out within ``request_timeout`` and the next scrape is
answered normally.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import socket
import sys
import threading
import time
from typing import Callable, Iterable

from specwatch.specdecode.metrics import clip

log = logging.getLogger("specwatch.exporter")

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
            503: "Service Unavailable"}

#: Seconds a connection must have waited for its request head before a newcomer may evict it
#: (a client that sends its request right after connecting is never evicted; it also bounds how
#: fast eviction can cycle: at most ``max_connections / EVICT_MIN_AGE`` evictions per second).
EVICT_MIN_AGE = 0.1


def _simple_response(code: int, text: str) -> bytes:
    body = (text + "\n").encode()
    return (f"HTTP/1.1 {code} {_REASONS.get(code, 'Error')}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


class Listener:
    """Bound and listening at construction (so a bad address fails before anything starts).

    ``app`` is a WSGI callable; ``metrics_path`` requests count against ``max_requests``.
    Raises :class:`OSError` when the address cannot be bound (in use, not on this host…).
    """

    def __init__(self, host: str, port: int, app: Callable, *, max_requests: int = 40,
                 max_connections: int = 200, request_timeout: float = 10.0,
                 max_header_bytes: int = 16384, metrics_path: str = "/metrics"):
        self.app = app
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.max_header_bytes = max_header_bytes
        self.metrics_path = metrics_path
        self._requests = threading.BoundedSemaphore(max_requests)
        self.max_open = max_connections + max_requests  # pending + the reserve for those answered
        self._conns = 0
        self._conns_lock = threading.Lock()
        # connections still sending their head, oldest first: socket -> (source address, accepted at)
        self._pending: dict[socket.socket, tuple[str, float]] = {}
        self._pending_per_addr: dict[str, int] = {}
        self.evicted = 0  # connections evicted so far (for tests and logs)
        self._stop = threading.Event()
        self._stopped = threading.Event()
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and host == "::":
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(addr)
            sock.listen(min(socket.SOMAXCONN, 1024))
        except OSError:
            sock.close()
            raise
        sock.settimeout(0.5)
        self.socket = sock
        self.server_address = sock.getsockname()[:2]

    # ---- accept loop -------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Accept connections until :meth:`shutdown`."""
        try:
            while not self._stop.is_set():
                try:
                    conn, peer = self.socket.accept()
                except socket.timeout:
                    continue
                except OSError as exc:
                    if self._stop.is_set():
                        break
                    if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        time.sleep(0.05)  # out of descriptors: back off, never spin
                    continue
                addr = str(peer[0]) if isinstance(peer, tuple) and peer else ""
                victim = None
                with self._conns_lock:
                    full = self._conns >= self.max_open
                    if not full and len(self._pending) >= self.max_connections:
                        victim = self._pick_victim(time.monotonic())
                        full = victim is None
                    if not full:
                        self._conns += 1
                        self._add_pending(conn, addr)
                if victim is not None:
                    self._evict(victim)
                if full:
                    self._refuse(conn)
                    continue
                try:
                    threading.Thread(target=self._handle, args=(conn,), daemon=True).start()
                except RuntimeError:  # cannot start a thread
                    with self._conns_lock:
                        self._conns -= 1
                        self._drop_pending(conn)
                    self._refuse(conn)
        finally:
            self._stopped.set()

    # ---- connections still sending their head (called with _conns_lock held) -----------------

    def _add_pending(self, conn: socket.socket, addr: str) -> None:
        self._pending[conn] = (addr, time.monotonic())
        self._pending_per_addr[addr] = self._pending_per_addr.get(addr, 0) + 1

    def _drop_pending(self, conn: socket.socket) -> bool:
        """Forget ``conn`` as pending; False when it was not (evicted, or its head is complete)."""
        got = self._pending.pop(conn, None)
        if got is None:
            return False
        n = self._pending_per_addr[got[0]] - 1
        if n:
            self._pending_per_addr[got[0]] = n
        else:
            del self._pending_per_addr[got[0]]
        return True

    def _pick_victim(self, now: float) -> socket.socket | None:
        """The pending connection a newcomer takes the place of: the longest-waiting one (at least
        :data:`EVICT_MIN_AGE` s) of the source address holding the most pending connections,
        else the longest-waiting one of any address; None when every one is younger."""
        heaviest = max(self._pending_per_addr, key=self._pending_per_addr.__getitem__)
        fallback = None
        for conn, (addr, since) in self._pending.items():  # oldest first
            if now - since < EVICT_MIN_AGE:
                break
            if addr == heaviest:
                self._drop_pending(conn)
                return conn
            if fallback is None:
                fallback = conn
        if fallback is not None:
            self._drop_pending(fallback)
        return fallback

    def _evict(self, conn: socket.socket) -> None:
        """Answer 503 (without blocking) and shut ``conn`` down; its thread then ends and closes it."""
        self.evicted += 1
        with contextlib.suppress(OSError):
            conn.send(_simple_response(503, "evicted: request head not sent in time while the listener is full"),
                      socket.MSG_DONTWAIT)
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)

    def _refuse(self, conn: socket.socket) -> None:
        try:
            conn.setblocking(False)
            conn.send(_simple_response(503, "too many connections"))
        except OSError:
            pass
        finally:
            conn.close()

    def shutdown(self) -> None:
        """Stop accepting (returns once the accept loop has ended, at most about 1 s)."""
        self._stop.set()
        self._stopped.wait(2.0)

    def server_close(self) -> None:
        """Close the listening socket (after :meth:`shutdown`)."""
        self.socket.close()

    # ---- one connection ----------------------------------------------------------------------

    def _read_head(self, conn: socket.socket, deadline: float) -> bytes | int | None:
        """The request head (up to the blank line), a status code to answer with, or None (gone)."""
        buf = bytearray()
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                end = buf.find(b"\n\n")
            if end >= 0:  # the cap is exact: a head that arrived whole in one read is no exception
                return bytes(buf[:end]) if end <= self.max_header_bytes else 431
            if len(buf) - 3 > self.max_header_bytes:  # (the blank line may be cut after its first byte)
                return 431
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return 408
            conn.settimeout(remaining)
            try:
                chunk = conn.recv(4096)
            except socket.timeout:
                return 408
            except OSError:
                return None
            if not chunk:
                return None
            buf += chunk

    def _handle(self, conn: socket.socket) -> None:
        try:
            deadline = time.monotonic() + self.request_timeout
            head = self._read_head(conn, deadline)
            with self._conns_lock:
                still = self._drop_pending(conn)  # now answered from the reserve
            if head is None or not still:  # gone, or evicted meanwhile
                return
            if isinstance(head, int):
                self._send(conn, _simple_response(head, _REASONS[head].lower()))
                return
            self._serve(conn, head)
        except Exception:  # one bad connection never stops the listener
            log.debug("connection failed", exc_info=True)
        finally:
            try:
                conn.close()
            finally:
                with self._conns_lock:
                    self._drop_pending(conn)
                    self._conns -= 1

    def _send(self, conn: socket.socket, data: bytes) -> None:
        conn.settimeout(self.request_timeout)  # total time for sendall (Python >= 3.5)
        conn.sendall(data)  # OSError (client gone, timeout) ends the connection in _handle

    def _serve(self, conn: socket.socket, head: bytes) -> None:
        lines = head.decode("latin-1").replace("\r\n", "\n").split("\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self._send(conn, _simple_response(400, "bad request line"))
            return
        method, target, _version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if method not in ("GET", "HEAD"):
            self._send(conn, _simple_response(405, "only GET and HEAD"))
            return
        path, _, query = target.partition("?")
        limited = path == self.metrics_path
        if limited and not self._requests.acquire(blocking=False):
            self._send(conn, _simple_response(503, "too many concurrent requests"))
            return
        try:
            head, body = self._run_app(method, path, query, headers)
        except Exception as exc:  # answer 500, never a silent close
            log.warning("%s %s failed: %s: %s; answered HTTP 500", method, clip(path, 100), type(exc).__name__,
                        clip(str(exc), 200))
            head, body = b"", _simple_response(500, "internal error: see the exporter's log")
        finally:
            if limited:
                self._requests.release()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # head and body: no copy, no Nagle stall
        self._send(conn, head)
        if body:
            self._send(conn, body)

    def _run_app(self, method: str, path: str, query: str, headers: dict[str, str]) -> tuple[bytes, bytes]:
        """Run the WSGI app; returns the response head (status line and headers) and body."""
        host, port = self.server_address[:2]
        environ = {
            "REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query, "SCRIPT_NAME": "",
            "SERVER_NAME": str(host), "SERVER_PORT": str(port), "SERVER_PROTOCOL": "HTTP/1.1",
            "wsgi.version": (1, 0), "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(b""),
            "wsgi.errors": sys.stderr, "wsgi.multithread": True, "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }
        for name in ("accept", "accept-encoding", "user-agent", "host"):
            if name in headers:
                environ["HTTP_" + name.upper().replace("-", "_")] = headers[name]
        status_headers: list = []

        def start_response(status: str, response_headers: list, exc_info=None):
            status_headers[:] = [status, response_headers]

        result: Iterable[bytes] = self.app(environ, start_response)
        try:
            body = b"".join(result)
        finally:
            close = getattr(result, "close", None)
            if close:
                close()
        status, hdrs = status_headers
        out = [f"HTTP/1.1 {status}"]
        out += [f"{k}: {v}" for k, v in hdrs if k.lower() not in ("content-length", "connection")]
        out += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
        return "\r\n".join(out).encode("latin-1"), (b"" if method == "HEAD" else body)
