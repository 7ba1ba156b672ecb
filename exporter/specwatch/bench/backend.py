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


class OpenAIBackend:
    """A pooled aiohttp session to one OpenAI-compatible server; use as ``async with``.

    ``base_url``: server root (``/v1`` suffix tolerated). ``model``: value of the request's
    ``model`` field. ``api_key``: sent as a Bearer token (None: no header). ``timeout``:
    seconds a whole request may take before it fails (a total, like ``vllm bench serve``'s).
    ``read_timeout``: seconds without any byte from the server before a request fails (aiohttp
    ``ClientTimeout(sock_read=...)``; detects a stalled server long before ``timeout``).
    ``max_response_bytes``: a streamed response larger than this fails the request with
    "response exceeded N bytes" (bounds the client's memory). ``metrics_url``: where
    :meth:`fetch_metrics` reads Prometheus text (default ``<base_url>/metrics``).
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
    ) -> None:
        self.base_url = normalize_base_url(base_url)
        self.model = model
        self.metrics_url = metrics_url or self.base_url + "/metrics"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.read_timeout = read_timeout
        self.max_response_bytes = max_response_bytes
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
        is_chat = request.endpoint == "chat"
        url = self.base_url + request.path
        payload = request.payload(model)
        text_parts: list[str] = []
        itl = out.itl
        decode = _DECODER.raw_decode  # no whitespace regexes on the hot path
        perf = time.perf_counter
        st = perf()
        out.start_time = st
        last = st
        done = False
        done_ts = st
        chunks = 0
        usage_tokens: int | None = None
        try:
            async with self.session.post(url, json=payload) as resp:
                out.status = resp.status
                if resp.status != 200:
                    body = await resp.text()
                    out.error = _clip(f"HTTP {resp.status} {resp.reason or ''}: {body}")
                    return out
                buf = b""
                received = 0
                limit = self.max_response_bytes
                async for data in resp.content.iter_any():
                    ts = perf()
                    received += len(data)
                    if received > limit:
                        raise ResponseTooLarge(f"response exceeded {limit} bytes (--max-response-bytes)")
                    if buf:
                        data = buf + data
                    if b"\r" in data:
                        data = data.replace(b"\r\n", b"\n")
                    if data.endswith(b"\n\n"):
                        buf = b""
                    else:
                        cut = data.rfind(b"\n\n")
                        if cut < 0:
                            buf = data
                            continue
                        buf = data[cut + 2:]
                        data = data[:cut]
                    for ev in data.split(b"\n\n"):
                        if ev.startswith(b"data: ") and b"\n" not in ev:
                            bodies: Any = (ev[6:],)  # the usual one-line event
                        else:  # multi-line events, SSE comments (":ping"), event:/id: lines
                            bodies = [ln[5:].strip() for ln in ev.split(b"\n") if ln.startswith(b"data:")]
                        for body in bodies:
                            if body == b"[DONE]":
                                done = True
                                done_ts = ts
                                continue
                            try:
                                obj = decode(body.decode())[0]
                            except ValueError:  # whitespace around the JSON, or not JSON (raises)
                                obj = _DECODER.decode(body.decode())
                            choices = obj.get("choices")
                            if choices:
                                c0 = choices[0]
                                ci = c0.get("index")
                                if len(choices) > 1 or ci:  # n > 1: more than one sequence
                                    for c in choices:
                                        ci = c.get("index") if isinstance(c, dict) else None
                                        if isinstance(ci, int) and ci + 1 > out.num_choices:
                                            out.num_choices = ci + 1
                                    out.num_choices = max(out.num_choices, len(choices))
                                elif not out.num_choices:
                                    out.num_choices = 1
                                if is_chat:
                                    delta = c0.get("delta") or {}
                                    piece = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                                    is_token = bool(piece)
                                else:
                                    piece = c0.get("text")
                                    is_token = True
                                if c0.get("finish_reason"):
                                    out.finish_reason = c0["finish_reason"]
                                if is_token:
                                    if chunks == 0:
                                        out.ttft = ts - st
                                    else:
                                        itl.append(ts - last)
                                    last = ts
                                    chunks += 1
                                    if piece:
                                        text_parts.append(piece)
                            usage = obj.get("usage")
                            if usage:
                                ct = usage.get("completion_tokens")
                                if ct is not None:
                                    usage_tokens = int(ct)
                                pt = usage.get("prompt_tokens")
                                if pt is not None:
                                    out.prompt_tokens = int(pt)
                                m = obj.get("metrics")
                                if isinstance(m, dict) and m.get("speculative_decoding") is not None:
                                    out.spec_decode = m["speculative_decoding"]  # validated by bench.perrequest
                            if "error" in obj and not choices:
                                err = obj["error"]
                                msg = err.get("message", err) if isinstance(err, dict) else err
                                raise RuntimeError(f"error event in stream: {msg}")
                end = done_ts if done else perf()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed request is recorded, never raised
            if isinstance(exc, ResponseTooLarge):
                out.error = str(exc)
            elif (isinstance(exc, aiohttp.SocketTimeoutError) and self.read_timeout is not None):
                out.error = f"no data from the server for {self.read_timeout:g} s (--read-timeout): {type(exc).__name__}"
            elif isinstance(exc, asyncio.TimeoutError) and not isinstance(exc, aiohttp.ServerTimeoutError):
                out.error = f"request timed out after {self._timeout.total:g} s in total (--timeout)"
            else:
                out.error = _clip(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            out.latency = perf() - st
            out.chunks = chunks
            out.generated_text = "".join(text_parts)
            return out
        out.latency = end - st
        out.chunks = chunks
        out.generated_text = "".join(text_parts)
        if usage_tokens is not None:
            out.output_tokens = usage_tokens
            out.tokens_from_usage = True
        else:
            out.output_tokens = chunks
        if not done:
            out.error = f"stream ended before 'data: [DONE]' after {chunks} content chunks"
        elif chunks == 0:
            out.error = "stream finished without any content chunk"
        else:
            out.success = True
        return out
