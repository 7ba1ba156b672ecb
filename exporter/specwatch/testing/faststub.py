"""A minimal, fast streaming OpenAI-compatible server, for measuring load-generator *clients*.

:mod:`specwatch.testing.stubserver` (aiohttp) is the test stub: it can fail, drop, stall and
diverge on demand, and it costs about 8 µs of CPU per streamed token — more than a client spends
reading one. Against it, a client benchmark measures the stub. This server does the least work a
streaming server can: it parses HTTP/1.1 requests itself (keep-alive, ``Content-Length`` bodies),
answers every token with one precomputed chunked-encoding SSE event, and runs like an inference
engine: one loop that, per step, writes the next token of every running request (so 64
concurrent streams interleave as they do on vLLM, one event per request per step).

Endpoints: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming only: the
answer is ``max_tokens`` / ``max_completion_tokens`` tokens — ``default_tokens`` when absent —
of the text ``" tok"``, a final usage chunk when ``stream_options.include_usage`` is set, then
``data: [DONE]``), ``GET /v1/models`` and ``GET /metrics`` (a comment only: no spec-decode
counters). Anything else gets 404; a request that cannot be parsed gets 400 and the connection is
closed. A stream whose socket buffer is above ``HIGH_WATER`` bytes skips steps until the client
catches up (a slow reader cannot make the server buffer without bound).

Run: ``python -m specwatch.testing.faststub --port 8123 [--host 127.0.0.1] [--model stub-model]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass

#: Bytes queued on a connection above which its stream waits for the client.
HIGH_WATER = 256 * 1024

#: Largest request head + body accepted (bytes).
MAX_REQUEST_BYTES = 8 * 1024 * 1024

#: Largest answer (tokens) one request may ask for.
MAX_TOKENS = 1_000_000

_HEAD_SSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
             b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: object) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


def _plain(status: str, body: bytes, content_type: bytes = b"application/json", close: bool = False) -> bytes:
    return (b"HTTP/1.1 " + status.encode() + b"\r\nContent-Type: " + content_type
            + b"\r\nContent-Length: " + str(len(body)).encode()
            + (b"\r\nConnection: close" if close else b"") + b"\r\n\r\n" + body)


@dataclass
class _Stream:
    transport: asyncio.Transport
    remaining: int
    token: bytes
    last: bytes
    tail: bytes
    on_done: Callable[[], None] | None = None


class FastStub:
    """The server's state: the running streams and the engine-like step loop.

    ``model``: the model id served; ``default_tokens``: tokens per answer when the request gives
    no limit. Counters: ``requests`` (streaming requests accepted), ``tokens`` (token events
    written).
    """

    def __init__(self, model: str = "stub-model", default_tokens: int = 16) -> None:
        self.model = model
        self.default_tokens = default_tokens
        self.requests = 0
        self.tokens = 0
        self._streams: list[_Stream] = []
        self._wake = asyncio.Event()
        self._templates: dict[tuple[bool, bool], tuple[bytes, bytes, bytes, bytes]] = {}

    def _events(self, chat: bool, usage: bool, n: int) -> tuple[bytes, bytes, bytes, bytes]:
        """(first, token, last token, tail) event bytes; tail = usage (if asked) + [DONE] + end."""
        key = (chat, usage)
        if key not in self._templates:
            obj = "chat.completion.chunk" if chat else "text_completion"
            base = {"id": "stub", "object": obj, "created": 0, "model": self.model}

            def tok(fin: str | None) -> bytes:
                choice = ({"index": 0, "delta": {"content": " tok"}, "finish_reason": fin} if chat
                          else {"index": 0, "text": " tok", "logprobs": None, "finish_reason": fin})
                return _event({**base, "choices": [choice]})

            first = _event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                  "finish_reason": None}]}) if chat else b""
            self._templates[key] = (first, tok(None), tok("length"), _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        first, token, last, tail = self._templates[key]
        if usage:
            u = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
            tail = _event({"id": "stub", "object": "chat.completion.chunk" if chat else "text_completion",
                           "created": 0, "model": self.model, "choices": [], "usage": u}) + tail
        return first, token, last, tail

    def start_stream(self, transport: asyncio.Transport, body: bytes, chat: bool,
                     on_done: Callable[[], None] | None = None) -> bytes | None:
        """Queue one streaming answer for the request ``body`` (JSON); returns an error response
        (bytes) instead when the body is not a streaming request. ``on_done`` is called when the
        answer has been written completely (or its connection closed)."""
        try:
            req = json.loads(body)
            if not isinstance(req, dict) or not req.get("stream"):
                raise ValueError("only streaming requests are served")
            n = req.get("max_completion_tokens" if chat else "max_tokens")
            if n is None:
                n = req.get("max_tokens")
            try:
                n = self.default_tokens if n is None else int(n)
            except (ValueError, TypeError, OverflowError):
                raise ValueError(f"max_tokens must be an integer, got {n!r}") from None
            if not 1 <= n <= MAX_TOKENS:
                raise ValueError(f"max_tokens must be in [1, {MAX_TOKENS}]")
            opts = req.get("stream_options") or {}
            if not isinstance(opts, dict):
                raise ValueError("stream_options must be an object")
            usage = bool(opts.get("include_usage"))
        except (ValueError, TypeError, OverflowError) as exc:
            return _plain("400 Bad Request", json.dumps({"error": {"message": str(exc)}}).encode())
        first, token, last, tail = self._events(chat, usage, n)
        self.requests += 1
        transport.write(_HEAD_SSE + first)
        self._streams.append(_Stream(transport, n, token, last, tail, on_done))
        self._wake.set()
        return None

    async def run(self) -> None:
        """The step loop: every step writes one token event to every running stream."""
        while True:
            if not self._streams:
                self._wake.clear()
                await self._wake.wait()
            running = []
            written = 0
            for s in self._streams:
                t = s.transport
                if t.is_closing():
                    continue  # the client went away: drop the stream (its connection is gone)
                if t.get_write_buffer_size() > HIGH_WATER:
                    running.append(s)
                    continue
                s.remaining -= 1
                written += 1
                if s.remaining > 0:
                    t.write(s.token)
                    running.append(s)
                else:
                    t.write(s.last + s.tail)
                    if s.on_done is not None:
                        s.on_done()
            self.tokens += written
            self._streams = running
            # one step done: let the loop read new requests (and back off when every running
            # stream waits for a slow client)
            await asyncio.sleep(0 if written or not running else 0.001)

    def protocol_factory(self) -> Callable[[], asyncio.Protocol]:
        return lambda: _Connection(self)


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection. Pipelined requests are answered in order: while a
    stream runs, the requests behind it wait in the buffer."""

    def __init__(self, server: FastStub) -> None:
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.streaming = False
        self.eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def eof_received(self) -> bool:
        """The client half-closed after sending: finish what it asked for, then close."""
        self.eof = True
        self._close_if_finished()
        return True  # keep the transport open for writing

    def _close_if_finished(self) -> None:
        if self.eof and not self.streaming and self.transport is not None and b"\r\n\r\n" not in self.buf:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > MAX_REQUEST_BYTES:
            self._fail("request too large")
            return
        self._process()

    def _stream_done(self) -> None:
        self.streaming = False
        if self.buf:
            self._process()
        self._close_if_finished()

    def _process(self) -> None:
        while self.transport is not None and not self.transport.is_closing() and not self.streaming:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            try:
                lines = self.buf[:end].decode("latin-1").split("\r\n")
                method, path, _version = lines[0].split(" ", 2)
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                        if length < 0:
                            raise ValueError("negative Content-Length")
                        if length > MAX_REQUEST_BYTES:
                            raise ValueError(f"Content-Length above {MAX_REQUEST_BYTES} bytes")
                    elif name.strip().lower() == "transfer-encoding":
                        raise ValueError("chunked request bodies are not supported")
            except ValueError as exc:
                self._fail(f"bad request: {exc}")
                return
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            self._handle(method, path.split("?", 1)[0], body)

    def _handle(self, method: str, path: str, body: bytes) -> None:
        t = self.transport
        assert t is not None
        s = self.server
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            self.streaming = True
            err = s.start_stream(t, body, chat=path.endswith("chat/completions"), on_done=self._stream_done)
            if err is not None:
                self.streaming = False
                t.write(err)
        elif method == "GET" and path == "/v1/models":
            t.write(_plain("200 OK", json.dumps({"object": "list", "data": [{"id": s.model, "object": "model"}]}).encode()))
        elif method == "GET" and path == "/metrics":
            t.write(_plain("200 OK", b"# specwatch fast stub: no metrics\n", b"text/plain; version=0.0.4"))
        else:
            t.write(_plain("404 Not Found", b'{"error":{"message":"not found"}}'))

    def _fail(self, message: str) -> None:
        if self.transport is not None:
            self.transport.write(_plain("400 Bad Request", json.dumps({"error": {"message": message}}).encode(), close=True))
            self.transport.close()


async def serve(host: str, port: int, model: str = "stub-model", default_tokens: int = 16,
                ready: Callable[[int], None] | None = None) -> None:
    """Serve until cancelled. ``ready`` is called with the bound port (useful with ``port=0``)."""
    stub = FastStub(model, default_tokens)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(stub.protocol_factory(), host, port, backlog=1024)
    engine = asyncio.ensure_future(stub.run())
    try:
        if ready is not None:
            ready(server.sockets[0].getsockname()[1])
        await server.serve_forever()
    finally:
        engine.cancel()
        server.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="stub-model")
    ap.add_argument("--default-tokens", type=int, default=16)
    a = ap.parse_args(argv)
    if not 0 <= a.port <= 65535:
        ap.error(f"--port must be in [0, 65535], got {a.port}")
    try:
        asyncio.run(serve(a.host, a.port, a.model, a.default_tokens))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        raise SystemExit(f"faststub: cannot listen on {a.host}:{a.port}: {exc.strerror or exc}") from None


if __name__ == "__main__":
    main()
