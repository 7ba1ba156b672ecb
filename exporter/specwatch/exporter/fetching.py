"""Fetching upstream /metrics for the exporter: one deadline per fetch, enforced by the clock.

Every fetch of an upstream — connect, request, response headers, body, decoding and parsing — is
bounded by one total deadline (``--timeout``), whatever the upstream does (refuse, hang, trickle
its headers or body a byte at a time, send an endless or huge body).

- :class:`AsyncHttpRunner` (the default) runs all fetches on one asyncio event loop in one
  daemon thread with aiohttp and ``ClientTimeout(total=…)``: no thread per fetch, so no pool that
  hung upstreams could fill. Each body is parsed off that loop, in a small pool of parse threads
  (:data:`PARSE_WORKERS`), under the same deadline (``asyncio.wait_for``): while one body parses,
  the other fetches keep moving and are parsed beside it.
- :class:`ThreadRunner` runs an injected synchronous fetcher (tests, embedding) with at most one
  worker per upstream.

Both keep at most one fetch in flight per upstream: :meth:`FetchRunner.submit` refuses a second
one while the first is still running, its parse included (the round reports ``timeout`` for it
instead).

Why parse threads and not processes: a thread holds the GIL while ``prometheus_client.parser``
runs (pure Python), so it does not parse faster, but CPython hands the GIL over every 5 ms
(``sys.getswitchinterval()``), so the fetch loop keeps reading the other upstreams and the
deadline fires on time; the parse itself is bounded by the pre-filter's caps
(:data:`specwatch.specdecode.metrics.MAX_LINE_CHARS`, ``MAX_LABELS_PER_LINE``, ``MAX_READ_CHARS``),
which are what really bound its cost. A process pool would pickle every body (up to
``--max-body-bytes``) and snapshot across processes on every scrape, and cost a Python
interpreter's memory per worker, for parses the caps already keep short. Measured (2-core machine,
2026-12-01): see docs/exporter.md, "Bad input".

An upstream configured with ``,server_info=on`` also gets its dev-mode
``/server_info?config_format=json`` read (:attr:`specwatch.exporter.config.Upstream.server_info_url`:
its own host and port, never a URL from a request) after a successful /metrics fetch, within what is
left of the same deadline, at most every :data:`SERVER_INFO_REFRESH_SECONDS` (after a failure every
:data:`SERVER_INFO_RETRY_SECONDS`). Its failure never fails the upstream: the last good answer is
kept and the failure is logged. Any exception while reading or parsing it (JSON nested too deeply,
a method or drafter that cannot be a label value: :mod:`specwatch.common.labels`) is such a
failure, and the retry interval applies after it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import re
import threading
import time
import zlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # imported by AsyncHttpRunner: `serve --help` and a config error answer sooner
    import aiohttp

from specwatch.exporter.config import Upstream
from specwatch.specdecode.metrics import (MetricsParseError, UpstreamSnapshot, clip, find_non_exposition_line,
                                         parse_metrics)
from specwatch.specdecode.serverinfo import SpeculativeInfo, speculative_info

log = logging.getLogger("specwatch.exporter")

#: How often an upstream's /server_info is read again after a good answer, and after a failure (s).
SERVER_INFO_REFRESH_SECONDS = 300.0
SERVER_INFO_RETRY_SECONDS = 60.0
#: The largest /server_info body accepted (it holds the whole vLLM config: tens of KiB).
SERVER_INFO_MAX_BYTES = 1024 * 1024


class FetchError(Exception):
    """An upstream could not be fetched; ``reason`` is a short label (connect, timeout, truncated,
    http_status, too_large, decode, parse, invalid_value, too_many_series) and the message says what was wrong
    (upstream text in it is escaped and cut to about 200 characters)."""

    def __init__(self, reason: str, message: str):
        super().__init__(clip(message, 240))
        self.reason = reason


#: ``fetch(upstream, timeout_seconds, max_bytes) -> body text``; raises :class:`FetchError`.
Fetcher = Callable[[Upstream, float, int], str]
#: ``on_body(upstream name, body text)``: sees each body :func:`parse_body` accepted.
BodyObserver = Callable[[str, str], None]

ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
_OPENMETRICS = "application/openmetrics-text"


@dataclass(frozen=True)
class FetchResult:
    """Outcome of one fetch + parse: ``snapshot`` or ``error`` (exactly one is set);
    ``seconds`` is the wall time it took (monotonic clock)."""

    snapshot: UpstreamSnapshot | None
    error: FetchError | None
    seconds: float
    server_info: "ServerInfo | None" = None


@dataclass(frozen=True)
class ServerInfo:
    """The last good answer of an upstream's dev-mode ``/server_info``: ``info`` is its
    ``speculative_config`` (:func:`specwatch.specdecode.serverinfo.speculative_info`; None when
    speculation is off); ``fetched_at`` on the runner's monotonic clock (seconds)."""

    info: SpeculativeInfo | None
    fetched_at: float


def parse_server_info(text: str) -> SpeculativeInfo | None:
    """The ``speculative_config`` of a ``/server_info?config_format=json`` body; :class:`FetchError`
    ``parse`` when it is not JSON or not a vLLM server_info object."""
    try:
        return speculative_info(json.loads(text))
    except (ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
        raise FetchError("parse", f"/server_info: {exc}") from None
    except RecursionError:
        raise FetchError("parse", "/server_info: JSON nested too deeply") from None
    except Exception as exc:  # whatever the body holds, one failed read
        raise FetchError("parse", f"/server_info: {type(exc).__name__}: {exc}") from None


def check_complete(text: str, content_type: str = "") -> None:
    """Detect truncation where the text itself can show it: a body that does not end with a
    newline was cut inside a line (e.g. mid-number); an OpenMetrics body (by content type, or one
    holding a ``# EOF`` line) must end with ``# EOF``. A text-format body cut exactly at a line
    boundary without Content-Length or chunked framing cannot be detected (documented in docs/exporter.md).
    Raises :class:`FetchError` ``truncated``."""
    if text and not text.endswith("\n") and not text.endswith("# EOF"):
        raise FetchError("truncated", "body does not end with a newline: cut inside a line")
    is_om = content_type.split(";")[0].strip().lower() == _OPENMETRICS
    if (is_om or "\n# EOF" in text or text.startswith("# EOF")) and text.rstrip("\n").rsplit("\n", 1)[-1] != "# EOF":
        raise FetchError("truncated", "OpenMetrics body does not end with # EOF")


def decode_body(data: bytes) -> str:
    """UTF-8 text of a body (a leading byte-order mark is dropped); :class:`FetchError` ``decode``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise FetchError("decode", "body is not UTF-8 text") from None
    return text[1:] if text.startswith("\ufeff") else text


#: What the last line of a body cut inside a line can read: the start of a comment, or of a sample
#: (a name, cut labels, or labels and the start of a value and timestamp). Anything else (``</html>``,
#: ``{"status": "ok"}``, ``hello world``) was never an exposition line: the body is "parse".
_CUT_LINE = re.compile(r"#.*|[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{.*|(?:\{.*\})?[ \t]+(?:[-+]?[0-9.eE+-]*|[-+]?[IiNn][a-zA-Z]*)"
                       r"(?:[ \t]+-?[0-9]*)?)?", re.S)


def parse_body(text: str, max_bytes: int, content_type: str = "") -> UpstreamSnapshot:
    """The one reading of an upstream's /metrics body, shared by ``serve`` and ``top --upstream``
    (both fetch through :class:`AsyncHttpRunner`): errors as :class:`FetchError`, classified in
    this order.

    1. ``parse``: a complete line of it is no exposition line (a sample, a comment or blank;
       :func:`specwatch.specdecode.metrics.find_non_exposition_line`), wherever it stands: a junk
       first line, an HTML page, a JSON answer. Prometheus itself fails such a scrape whole.
    2. ``truncated`` (:func:`check_complete`): no final newline, or an OpenMetrics body without
       its ``# EOF``; but ``parse`` when the unfinished last line cannot be the start of an
       exposition line (``</html>``, ``{"status": "ok"}``).
    3. :func:`specwatch.specdecode.metrics.parse_metrics`'s ``parse`` or ``invalid_value``.
    """
    if len(text) > max_bytes:  # before any scan (an injected fetcher is not capped)
        raise FetchError("parse", f"body of {len(text)} bytes exceeds the {max_bytes}-byte cap")
    complete = text.rfind("\n") + 1
    bad = find_non_exposition_line(text, complete)
    if bad is not None:
        raise FetchError("parse", f"not a /metrics exposition: a line reads '{clip(bad, 80)}'")
    try:
        check_complete(text, content_type)
    except FetchError:
        last = text[complete:]
        if last and last != "# EOF" and not _CUT_LINE.fullmatch(last):
            raise FetchError("parse", f"not a /metrics exposition: a line reads '{clip(last, 80)}'") from None
        raise
    try:
        return parse_metrics(text, max_bytes=max_bytes)
    except MetricsParseError as exc:
        raise FetchError(exc.reason, str(exc)) from None


async def _read_limited(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    length = resp.content_length
    if length is not None and length > max_bytes:
        raise FetchError("too_large", f"Content-Length {length} exceeds the {max_bytes}-byte cap")
    encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("identity", "", "gzip", "deflate"):
        raise FetchError("decode", f"unsupported Content-Encoding {encoding!r}")
    inflate = None
    if encoding in ("gzip", "deflate"):
        inflate = zlib.decompressobj(wbits=47 if encoding == "gzip" else 15)
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await resp.content.read(65536)
        if not chunk:
            break
        if inflate is not None:
            # bounded inflation: never more than what is left of the cap (+1 to notice overflow)
            chunk = inflate.decompress(chunk, max_bytes - size + 1)
            if inflate.unconsumed_tail:
                raise FetchError("too_large", f"decompressed body exceeds the {max_bytes}-byte cap")
        size += len(chunk)
        if size > max_bytes:
            raise FetchError("too_large", f"body exceeds the {max_bytes}-byte cap")
        chunks.append(chunk)
    return b"".join(chunks)


async def fetch_text(session: aiohttp.ClientSession, upstream: Upstream, timeout_seconds: float,
                     max_bytes: int) -> tuple[str, str]:
    """GET ``upstream.metrics_url`` (plain text format asked for, identity encoding, redirects
    never followed) within ``timeout_seconds`` in total; returns ``(text, content type)``.

    Raises :class:`FetchError` (connect, timeout, http_status, too_large, truncated, decode).
    """
    import aiohttp  # loaded already: the session is aiohttp's

    try:
        async with session.get(
            upstream.metrics_url,
            timeout=aiohttp.ClientTimeout(total=timeout_seconds),
            headers={"Accept": ACCEPT, "Accept-Encoding": "identity"},
            allow_redirects=False,
        ) as resp:
            if resp.status != 200:
                what = "/server_info" if "/server_info" in upstream.metrics_url else "/metrics"
                raise FetchError("http_status", f"HTTP {resp.status} from {what}")
            data = await _read_limited(resp, max_bytes)
            ctype = resp.headers.get("Content-Type", "")
    except FetchError:
        raise
    except asyncio.TimeoutError:
        raise FetchError("timeout", f"no complete answer within {timeout_seconds:g} s") from None
    except aiohttp.ClientPayloadError:
        raise FetchError("truncated", "connection closed before the body was complete") from None
    except aiohttp.ClientResponseError as exc:  # malformed status line / headers, header limits
        raise FetchError("http_status", f"bad HTTP response: {exc.message}") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise FetchError("connect", f"connection failed: {type(exc).__name__}") from None
    return decode_body(data), ctype


def _new_session(limit: int) -> aiohttp.ClientSession:
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, limit_per_host=0, enable_cleanup_closed=True),
        auto_decompress=False,
        trust_env=False,  # never a proxy from the environment: only configured upstreams are fetched
        max_line_size=8190,
        max_field_size=8190,
    )


def http_fetch(upstream: Upstream, timeout_seconds: float, max_bytes: int) -> str:
    """Synchronous one-off fetch (own event loop): the body text of ``upstream``'s /metrics within
    ``timeout_seconds`` in total (see :func:`fetch_text`); raises :class:`FetchError`."""

    async def run() -> str:
        async with _new_session(4) as session:
            text, ctype = await asyncio.wait_for(fetch_text(session, upstream, timeout_seconds, max_bytes),
                                                 timeout_seconds + 0.5)
            check_complete(text, ctype)
            return text

    try:
        return asyncio.run(run())
    except asyncio.TimeoutError:
        raise FetchError("timeout", f"no complete answer within {timeout_seconds:g} s") from None


class FetchRunner:
    """Runs fetch + parse per upstream, at most one in flight per upstream.

    :meth:`submit` returns a :class:`concurrent.futures.Future` of :class:`FetchResult`, or
    ``None`` when the previous fetch of that upstream is still running.

    ``on_body(upstream name, body text)``, when given, is called after each body that
    :func:`parse_body` accepted (``specwatch top --upstream`` reads vLLM's request gauges from it,
    which the exporter does not serve); whatever it raises is logged and never fails the fetch.
    """

    def __init__(self, timeout_seconds: float, max_bytes: int, on_body: BodyObserver | None = None):
        self.timeout_seconds = timeout_seconds
        self.max_bytes = max_bytes
        self._on_body = on_body
        self._inflight: dict[str, concurrent.futures.Future] = {}
        self._lock = threading.Lock()
        self._server_info: dict[str, ServerInfo] = {}  # last good answer per upstream
        self._server_info_next: dict[str, float] = {}  # when to read it again (monotonic)

    def _server_info_due(self, upstream: Upstream, now: float) -> bool:
        return upstream.read_server_info and now >= self._server_info_next.get(upstream.name, 0.0)

    def _server_info_done(self, upstream: Upstream, now: float, info: SpeculativeInfo | None,
                          error: Exception | None) -> None:
        """Keep a good answer (or keep the old one and log a failure) and schedule the next read."""
        if error is None:
            self._server_info[upstream.name] = ServerInfo(info, now)
            self._server_info_next[upstream.name] = now + SERVER_INFO_REFRESH_SECONDS
        else:
            log.warning("upstream %s: /server_info not read (%s); kept the last answer", upstream.name, clip(str(error), 200))
            self._server_info_next[upstream.name] = now + SERVER_INFO_RETRY_SECONDS

    def _with_server_info(self, upstream: Upstream, result: FetchResult) -> FetchResult:
        got = self._server_info.get(upstream.name)
        return replace(result, server_info=got) if got is not None else result

    def submit(self, upstream: Upstream) -> concurrent.futures.Future | None:
        """Start fetch + parse of ``upstream``; ``None`` while its previous fetch still runs."""
        with self._lock:
            prev = self._inflight.get(upstream.name)
            if prev is not None and not prev.done():
                return None
            if self._busy(upstream.name):  # checked after prev: prev is done only once this is set
                return None
            fut = self._start(upstream)
            self._inflight[upstream.name] = fut
            return fut

    def _start(self, upstream: Upstream) -> concurrent.futures.Future:
        raise NotImplementedError

    def _parse(self, name: str, text: str, content_type: str = "") -> UpstreamSnapshot:
        """:func:`parse_body`, then ``on_body`` (its failure logged, never the fetch's)."""
        snap = parse_body(text, self.max_bytes, content_type)
        if self._on_body is not None:
            try:
                self._on_body(name, text)
            except Exception as exc:
                log.debug("upstream %s: on_body failed: %s", name, clip(f"{type(exc).__name__}: {exc}", 200))
        return snap

    def _busy(self, name: str) -> bool:
        """True while work of upstream ``name`` outlives its finished fetch (none here)."""
        return False

    def close(self) -> None:
        """Stop background work (idempotent)."""


#: Parse threads of :class:`AsyncHttpRunner` (bodies are parsed off the fetch loop). More would
#: not parse faster (the GIL); more than one keeps a slow body from queueing the others behind it.
PARSE_WORKERS = 4


class AsyncHttpRunner(FetchRunner):
    """All fetches on one asyncio loop (one daemon thread) with one aiohttp session; bodies parsed
    in at most :data:`PARSE_WORKERS` threads, within the same per-fetch deadline."""

    def __init__(self, timeout_seconds: float, max_bytes: int, n_upstreams: int, on_body: BodyObserver | None = None):
        import aiohttp  # noqa: F401  loaded here, at start-up, not inside the first fetch's deadline

        super().__init__(timeout_seconds, max_bytes, on_body)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="specwatch-fetch", daemon=True)
        self._thread.start()
        self._session: aiohttp.ClientSession | None = None
        self._limit = max(16, 2 * n_upstreams)
        self._parse_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, min(PARSE_WORKERS, n_upstreams)), thread_name_prefix="specwatch-parse")
        # parses that outlived their fetch's deadline: no new fetch of that upstream until they end
        self._parsing: dict[str, concurrent.futures.Future] = {}
        self._closed = False

    def _busy(self, name: str) -> bool:
        """True while a parse of upstream ``name`` that ran past its deadline is still running."""
        late = self._parsing.get(name)
        if late is not None and late.done():
            self._parsing.pop(name, None)
            return False
        return late is not None

    async def _fetch_parse(self, upstream: Upstream) -> FetchResult:
        t0 = time.monotonic()
        deadline = t0 + self.timeout_seconds + 0.25
        if self._session is None:
            self._session = _new_session(self._limit)
        try:
            text, ctype = await asyncio.wait_for(
                fetch_text(self._session, upstream, self.timeout_seconds, self.max_bytes),
                self.timeout_seconds + 0.25)
            parse = self._parse_pool.submit(self._parse, upstream.name, text, ctype)
            del text
            waiter = asyncio.wrap_future(parse)
            try:
                snap = await asyncio.wait_for(asyncio.shield(waiter), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                waiter.add_done_callback(lambda f: f.cancelled() or f.exception())  # nothing left to log
                if not parse.done():
                    self._parsing[upstream.name] = parse
                raise FetchError("timeout", f"fetch and parse took more than {self.timeout_seconds:g} s") from None
            seconds = time.monotonic() - t0
            now = time.monotonic()
            if self._server_info_due(upstream, now):
                await self._read_server_info(upstream, max(0.1, self.timeout_seconds - (now - t0)))
            return self._with_server_info(upstream, FetchResult(snap, None, seconds))
        except asyncio.TimeoutError:
            err = FetchError("timeout", f"no complete answer within {self.timeout_seconds:g} s")
            return FetchResult(None, err, time.monotonic() - t0)
        except FetchError as exc:
            return FetchResult(None, exc, time.monotonic() - t0)

    async def _read_server_info(self, upstream: Upstream, budget: float) -> None:
        """GET the upstream's own /server_info within ``budget`` seconds (same client limits)."""
        info, error = None, None
        assert self._session is not None
        try:
            target = Upstream(upstream.name, upstream.server_info_url)
            text, _ = await asyncio.wait_for(fetch_text(self._session, target, budget, SERVER_INFO_MAX_BYTES), budget + 0.25)
            info = parse_server_info(text)
        except asyncio.TimeoutError:
            error = FetchError("timeout", f"no complete answer within {budget:.3g} s")
        except FetchError as exc:
            error = exc
        except Exception as exc:  # a bad /server_info never fails the upstream
            error = FetchError("parse", f"/server_info: {type(exc).__name__}: {exc}")
        self._server_info_done(upstream, time.monotonic(), info, error)

    def _start(self, upstream: Upstream) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(self._fetch_parse(upstream), self._loop)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def _close():
            if self._session is not None:
                await self._session.close()

        with contextlib.suppress(Exception):  # best effort at shutdown
            asyncio.run_coroutine_threadsafe(_close(), self._loop).result(timeout=2)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._parse_pool.shutdown(wait=False, cancel_futures=True)


class ThreadRunner(FetchRunner):
    """An injected synchronous :data:`Fetcher`, one worker thread per upstream at most."""

    def __init__(self, fetch: Fetcher, timeout_seconds: float, max_bytes: int, n_upstreams: int,
                 on_body: BodyObserver | None = None):
        super().__init__(timeout_seconds, max_bytes, on_body)
        self._fetch = fetch
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, n_upstreams),
                                                           thread_name_prefix="fetch")

    def _run(self, upstream: Upstream) -> FetchResult:
        t0 = time.monotonic()
        try:
            text = self._fetch(upstream, self.timeout_seconds, self.max_bytes)
            if text.startswith("\ufeff"):
                text = text[1:]
            snap = self._parse(upstream.name, text)
            result = FetchResult(snap, None, time.monotonic() - t0)
        except FetchError as exc:
            return FetchResult(None, exc, time.monotonic() - t0)
        now = time.monotonic()
        if self._server_info_due(upstream, now):
            info, error = None, None
            try:  # the injected fetcher, asked for the upstream's own /server_info URL
                info = parse_server_info(self._fetch(Upstream(upstream.name + "#server_info", upstream.server_info_url),
                                                     self.timeout_seconds, SERVER_INFO_MAX_BYTES))
            except Exception as exc:  # never fails the upstream
                error = exc
            self._server_info_done(upstream, now, info, error)
        return self._with_server_info(upstream, result)

    def _start(self, upstream: Upstream) -> concurrent.futures.Future:
        return self._pool.submit(self._run, upstream)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
