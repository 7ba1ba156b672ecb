"""Async streaming client for OpenAI-compatible servers (vLLM's ``/v1/completions`` and
``/v1/chat/completions``), built on aiohttp.

Every request streams (``stream: true`` with ``stream_options.include_usage``). Timing, all from
``time.perf_counter`` on the client:

- TTFT: from sending the request to the first *content chunk* (a completions chunk carrying a
  choice; a chat chunk whose delta carries non-empty content — vLLM's first, role-only chat
  chunk is not a token);
- ITL: between consecutive content chunks (one value per chunk after the first);
- E2E latency: from sending to the end of the stream (``data: [DONE]``);
- output tokens: ``usage.completion_tokens`` of the final usage chunk when the server sends it,
  else the number of content chunks;
- TPOT = (E2E − TTFT) / (output tokens − 1), for requests with more than one token.

A failed request (connection refused or dropped, HTTP status other than 200, an error event in
the stream, a stream that ends without ``[DONE]``, a timeout — total or no byte for
``read_timeout`` seconds —, a response larger than ``max_response_bytes``) comes back as a
:class:`RequestOutcome` with ``success=False`` and the error text; :meth:`OpenAIBackend.send`
never raises (except ``asyncio.CancelledError``, which is re-raised so a run can be
interrupted). The API key is sent as ``Authorization: Bearer …`` and never appears in outcomes,
reprs or errors.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from specwatch.bench.workloads import BenchRequest
from specwatch.common.defaults import MAX_RESPONSE_BYTES

_DECODER = json.JSONDecoder()

#: Longest error text kept per request (characters).
MAX_ERROR_CHARS = 500

#: Default cap on the bytes of one streamed response (16 MiB): a 256-token completion is a few
#: tens of KiB, so only a runaway server reaches it.
DEFAULT_MAX_RESPONSE_BYTES = MAX_RESPONSE_BYTES


class ResponseTooLarge(Exception):
    """A streamed response exceeded the backend's ``max_response_bytes``."""


def normalize_base_url(url: str) -> str:
    """Server root without trailing ``/`` or ``/v1`` (``http://h:8000/v1/`` → ``http://h:8000``).

    Raises ValueError for a URL that is not http(s)://…
    """
    u = url.strip().rstrip("/")
    if not u.startswith(("http://", "https://")):
        raise ValueError(f"base URL must start with http:// or https://, got {url!r}")
    try:
        parts = urllib.parse.urlsplit(u)
        parts.port  # noqa: B018  the access validates the port (ValueError when out of range or not a number)
    except ValueError as exc:
        raise ValueError(f"not a valid URL: {url!r} ({exc})") from None
    if not parts.hostname:
        raise ValueError(f"not a valid URL (no host): {url!r}")
    if u.endswith("/v1"):
        u = u[: -len("/v1")]
    return u


@dataclass
class RequestOutcome:
    """What happened to one streamed request. Times are seconds (``perf_counter`` based).

    ``ttft`` is None when no content chunk arrived; ``itl`` holds one inter-chunk gap per content
    chunk after the first; ``output_tokens`` comes from ``usage.completion_tokens`` when
    ``tokens_from_usage`` is True, else it counts content chunks; ``prompt_tokens`` is
    ``usage.prompt_tokens`` (or the request's known token-id count), None if unknown.
    """

    index: int
    success: bool = False
    error: str = ""
    status: int | None = None
    generated_text: str = ""
    output_tokens: int = 0
    tokens_from_usage: bool = False
    prompt_tokens: int | None = None
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0
    chunks: int = 0
    finish_reason: str | None = None
    #: vLLM's per-request speculative-decoding metrics (``metrics.speculative_decoding`` of the final
    #: usage chunk; a server started with ``--per-request-spec-decode-metrics``), None when absent.
    #: Kept as sent, whatever its JSON type: :func:`specwatch.bench.perrequest.parse_payload` counts
    #: a value that is not an object as ``inconsistent``.
    spec_decode: Any = field(default=None, repr=False)
    #: Choices the response carried: 1 + the largest ``choices[].index`` seen (0 before any choice).
    #: More than 1 means the server generated n > 1 sequences (vLLM then returns no per-request
    #: spec-decode metrics: counted as ``n_gt_1``).
    num_choices: int = 0
    #: One-line prompt excerpt (for outlier listings; never the whole prompt).
    prompt_excerpt: str = ""

    @property
    def tpot(self) -> float | None:
        """(E2E − TTFT) / (output_tokens − 1) in seconds; None for ≤ 1 token or a failure."""
        if not self.success or self.ttft is None or self.output_tokens <= 1:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def _count_choices(out: RequestOutcome, choices: list[Any], c0: Any) -> None:
    """Chunk step: raise ``out.num_choices`` to the choices this chunk shows (n > 1: more than one sequence)."""
    ci = c0.get("index")
    if len(choices) > 1 or ci:  # n > 1: more than one sequence
        for c in choices:
            ci = c.get("index") if isinstance(c, dict) else None
            if isinstance(ci, int) and ci + 1 > out.num_choices:
                out.num_choices = ci + 1
        out.num_choices = max(out.num_choices, len(choices))
    elif not out.num_choices:
        out.num_choices = 1


class _Stream:
    """One request's response as it is read: the SSE framing, the parsed chunks, their times, and
    the :class:`RequestOutcome` they fill."""

    __slots__ = ("out", "is_chat", "st", "last", "done", "done_ts", "chunks", "usage_tokens", "text_parts", "buf")

    def __init__(self, out: RequestOutcome, is_chat: bool, st: float) -> None:
        self.out = out
        self.is_chat = is_chat
        self.st = st
        self.last = st
        self.done = False
        self.done_ts = st
        self.chunks = 0
        self.usage_tokens: int | None = None
        self.text_parts: list[str] = []
        self.buf = b""

    def frame(self, data: bytes) -> bytes | None:
        """Framing step: join ``data`` to the unfinished event before it; return the complete
        events (None while the first is incomplete), keep the rest for the next read."""
        if self.buf:
            data = self.buf + data
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        if data.endswith(b"\n\n"):
            self.buf = b""
            return data
        cut = data.rfind(b"\n\n")
        if cut < 0:
            self.buf = data
            return None
        self.buf = data[cut + 2:]
        return data[:cut]

    def feed(self, data: bytes, ts: float) -> None:
        """Parsing step: every ``data:`` line of the complete events read at ``ts``."""
        events = self.frame(data)
        if events is None:
            return
        for ev in events.split(b"\n\n"):
            if ev.startswith(b"data: ") and b"\n" not in ev:
                bodies: Any = (ev[6:],)  # the usual one-line event
            else:  # multi-line events, SSE comments (":ping"), event:/id: lines
                bodies = [ln[5:].strip() for ln in ev.split(b"\n") if ln.startswith(b"data:")]
            for body in bodies:
                self.event(body, ts)

    def event(self, body: bytes, ts: float) -> None:
        """Chunk step: ``[DONE]``, or one JSON chunk (its first choice, its usage, an error event,
        which raises)."""
        if body == b"[DONE]":
            self.done = True
            self.done_ts = ts
            return
        try:
            obj = _DECODER.raw_decode(body.decode())[0]  # no whitespace regexes on the hot path
        except ValueError:  # whitespace around the JSON, or not JSON (raises)
            obj = _DECODER.decode(body.decode())
        choices = obj.get("choices")
        if choices:
            self.choice(choices, ts)
        usage = obj.get("usage")
        if usage:
            self.usage(obj, usage)
        if "error" in obj and not choices:
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise RuntimeError(f"error event in stream: {msg}")

    def choice(self, choices: list[Any], ts: float) -> None:
        """Chunk step: the first choice's piece of text and finish reason; a content chunk is a token."""
        out = self.out
        c0 = choices[0]
        _count_choices(out, choices, c0)
        if self.is_chat:
            delta = c0.get("delta") or {}
            piece = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
            is_token = bool(piece)
        else:
            piece = c0.get("text")
            is_token = True
        if c0.get("finish_reason"):
            out.finish_reason = c0["finish_reason"]
        if is_token:
            if self.chunks == 0:
                out.ttft = ts - self.st
            else:
                out.itl.append(ts - self.last)
            self.last = ts
            self.chunks += 1
            if piece:
                self.text_parts.append(piece)

    def usage(self, obj: dict[str, Any], usage: dict[str, Any]) -> None:
        """Chunk step: the usage chunk's token counts and vLLM's per-request spec-decode metrics."""
        out = self.out
        ct = usage.get("completion_tokens")
        if ct is not None:
            self.usage_tokens = int(ct)
        pt = usage.get("prompt_tokens")
        if pt is not None:
            out.prompt_tokens = int(pt)
        m = obj.get("metrics")
        if isinstance(m, dict) and m.get("speculative_decoding") is not None:
            out.spec_decode = m["speculative_decoding"]  # validated by bench.perrequest

    def keep_text(self) -> None:
        """Outcome step (also of a failure): the content chunks counted and the text they carried."""
        self.out.chunks = self.chunks
        self.out.generated_text = "".join(self.text_parts)

    def finish(self, end: float) -> None:
        """Outcome step of a stream read to its end at ``end``: latency, output tokens (usage, else
        content chunks), and success or why not."""
        out = self.out
        out.latency = end - self.st
        self.keep_text()
        if self.usage_tokens is not None:
            out.output_tokens = self.usage_tokens
            out.tokens_from_usage = True
        else:
            out.output_tokens = self.chunks
        if not self.done:
            out.error = f"stream ended before 'data: [DONE]' after {self.chunks} content chunks"
        elif self.chunks == 0:
            out.error = "stream finished without any content chunk"
        else:
            out.success = True


class OpenAIBackend:
    """A pooled aiohttp session to one OpenAI-compatible server; use as ``async with``.

    ``base_url``: server root (``/v1`` suffix tolerated). ``model``: value of the request's
    ``model`` field. ``api_key``: sent as a Bearer token (None: no header). ``timeout``:
    seconds a whole request may take before it fails (a total, like ``vllm bench serve``'s).
    ``read_timeout``: seconds without any byte from the server before a request fails (aiohttp
    ``ClientTimeout(sock_read=...)``; detects a stalled server long before ``timeout``).
    ``max_response_bytes``: a streamed response larger than this fails the request with
    "response exceeded N bytes" (bounds the client's memory). ``metrics_url``: where
    :meth:`fetch_metrics` reads Prometheus text (default ``<base_url>/metrics``). ``cache_salt``:
    sent as vLLM's ``cache_salt`` field with every request (None: not sent), which keeps the
    prefix-cache blocks of its requests apart from those of any other salt.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None,
        *,
        api_key: str | None = None,
        timeout: float = 3600.0,
        read_timeout: float | None = 300.0,
        connect_timeout: float = 30.0,
        metrics_url: str | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        cache_salt: str | None = None,
    ) -> None:
        self.base_url = normalize_base_url(base_url)
        self.model = model
        self.metrics_url = metrics_url or self.base_url + "/metrics"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.read_timeout = read_timeout
        self.max_response_bytes = max_response_bytes
        self.cache_salt = cache_salt
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout, sock_read=read_timeout)
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:  # never show the key
        return f"OpenAIBackend(base_url={self.base_url!r}, model={self.model!r})"

    async def __aenter__(self) -> "OpenAIBackend":
        # The connection settings of vllm bench serve's client (the concurrency cap is ours).
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, use_dns_cache=True, keepalive_timeout=60,
                                         enable_cleanup_closed=True, force_close=False)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, headers=self._headers or None
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("OpenAIBackend must be used as 'async with OpenAIBackend(...)'")
        return self._session

    async def first_model(self) -> str:
        """The first model id listed by ``GET /v1/models`` (as ``vllm bench serve`` does when
        ``--model`` is not given). Raises RuntimeError if the server cannot be asked."""
        try:
            async with self.session.get(self.base_url + "/v1/models") as resp:
                if resp.status != 200:
                    raise RuntimeError(f"GET {self.base_url}/v1/models returned HTTP {resp.status}")
                # Any content type: some servers/proxies send JSON as text/plain.
                data = await resp.json(content_type=None)
            return str(data["data"][0]["id"])
        except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, IndexError, TypeError, ValueError) as exc:
            raise RuntimeError(f"cannot list models at {self.base_url}/v1/models: {type(exc).__name__}: {exc}") from exc

    async def fetch_metrics(self) -> str:
        """GET the server's Prometheus text. Raises RuntimeError (with the reason) on failure."""
        try:
            async with self.session.get(self.metrics_url) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"GET {self.metrics_url} returned HTTP {resp.status}")
                return await resp.text()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise RuntimeError(f"GET {self.metrics_url} failed: {type(exc).__name__}: {exc}") from exc

    async def send(self, request: BenchRequest) -> RequestOutcome:
        """Send one request and stream the answer. Never raises except CancelledError."""
        out = RequestOutcome(index=request.index, prompt_tokens=request.prompt_len,
                             prompt_excerpt=request.excerpt())
        model = self.model or ""
        url = self.base_url + request.path
        payload = request.payload(model)
        if self.cache_salt is not None:
            payload["cache_salt"] = self.cache_salt
        perf = time.perf_counter
        st = perf()
        out.start_time = st
        stream = _Stream(out, request.endpoint == "chat", st)
        try:
            async with self.session.post(url, json=payload) as resp:
                out.status = resp.status
                if resp.status != 200:
                    body = await resp.text()
                    out.error = _clip(f"HTTP {resp.status} {resp.reason or ''}: {body}")
                    return out
                await self._read(resp, stream)
                end = stream.done_ts if stream.done else perf()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed request is recorded, never raised
            out.error = self._failure(exc)
            out.latency = perf() - st
            stream.keep_text()
            return out
        stream.finish(end)
        return out

    async def _read(self, resp: aiohttp.ClientResponse, stream: _Stream) -> None:
        """Streaming step: feed the body to ``stream`` as it arrives, timed, capped at ``max_response_bytes``."""
        perf = time.perf_counter
        received = 0
        limit = self.max_response_bytes
        async for data in resp.content.iter_any():
            ts = perf()
            received += len(data)
            if received > limit:
                raise ResponseTooLarge(f"response exceeded {limit} bytes (--max-response-bytes)")
            stream.feed(data, ts)

    def _failure(self, exc: Exception) -> str:
        """Failure step: the error text of a request that raised (too large, stalled, timed out, other)."""
        if isinstance(exc, ResponseTooLarge):
            return str(exc)
        if (isinstance(exc, aiohttp.SocketTimeoutError) and self.read_timeout is not None):
            return f"no data from the server for {self.read_timeout:g} s (--read-timeout): {type(exc).__name__}"
        if isinstance(exc, asyncio.TimeoutError) and not isinstance(exc, aiohttp.ServerTimeoutError):
            return f"request timed out after {self._timeout.total:g} s in total (--timeout)"
        return _clip(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
