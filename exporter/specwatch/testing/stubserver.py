"""A fast local OpenAI-compatible streaming stub: measures the load generator alone and lets
tests exercise it without a model.

It streams ``max_tokens`` (default 16) content chunks per request in vLLM's SSE format
(completions and chat, role-only first chat chunk, a final usage chunk when
``stream_options.include_usage`` is set, then ``data: [DONE]``), and serves ``/metrics`` with
*constructed* vLLM V1 spec-decode counters that grow as it "generates": each verify step proposes
``k`` draft tokens and accepts the next value of ``accept_pattern`` of them (a chain drafter:
accepting ``a`` tokens counts positions ``0..a-1``), then emits ``a + 1`` tokens. With ``k = 0`` it
acts as a server without speculation (no spec-decode series). Every ``/metrics`` body it served is
remembered (``StubState.metrics_served``) so tests can check deltas against it.

Failure injection: ``error_every`` (every n-th request gets HTTP 500), ``drop_every`` +
``drop_after`` (every n-th request's connection is dropped after that many chunks),
``diverge_marker`` + ``diverge_at`` (prompts containing the marker get different text from token
``diverge_at`` on), ``require_api_key``, ``send_usage`` (False: no usage chunk), ``token_delay``,
``models_status`` / ``models_content_type`` (answer of ``GET /v1/models``), ``flood_bytes``
(stream about that many bytes of ``data: xxx…`` lines, never a blank line, instead of tokens: a
runaway server), ``stall_after`` + ``stall_seconds`` (after that many chunks send nothing for
that long: a stalled server), ``per_request_payloads`` (replay given per-request spec-decode
payloads, e.g. real captures damaged by a test), ``num_choices`` (stream n > 1 choices).

Run standalone: ``python -m specwatch.testing.stubserver --port 18080``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

MODEL = "stub-model"


@dataclass
class StubConfig:
    """Behaviour of the stub (see module docstring)."""

    default_tokens: int = 16
    token_delay: float = 0.0
    k: int = 4
    accept_pattern: tuple[int, ...] = (4, 2, 0, 3)
    error_every: int = 0
    drop_every: int = 0
    drop_after: int = 3
    diverge_marker: str | None = None
    diverge_at: int = 5
    require_api_key: str | None = None
    send_usage: bool = True
    model: str = MODEL
    models_status: int = 200
    models_content_type: str = "application/json"
    flood_bytes: int = 0
    stall_after: int = -1
    stall_seconds: float = 0.0
    #: Send vLLM's per-request ``metrics.speculative_decoding`` (``detailed``) in the usage chunk.
    per_request_metrics: bool = False
    #: Replayed ``metrics.speculative_decoding`` values (any JSON value, NaN and Infinity included as
    #: Python's json writes them): the n-th request (in arrival order) gets entry (n − 1) mod len,
    #: instead of the stub's own payload. Tests feed real captured payloads, damaged.
    per_request_payloads: tuple[Any, ...] = ()
    #: Choices per response (vLLM's n): tokens are streamed once per choice index 0 … n − 1.
    num_choices: int = 1
    #: Serve vLLM's POST /tokenize and /detokenize (a token = a space-led piece of text; ids by first use).
    tokenizer: bool = False


@dataclass
class StubState:
    """Counters and request log of a running stub (mutated only on the stub's event loop)."""

    requests: int = 0
    payloads: list[dict[str, Any]] = field(default_factory=list)
    auth_headers: list[str | None] = field(default_factory=list)
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: list[int] = field(default_factory=list)
    generation_tokens: int = 0
    prompt_tokens: int = 0
    step: int = 0
    metrics_served: list[str] = field(default_factory=list)
    metrics_snapshots: list[dict[str, Any]] = field(default_factory=list)
    #: Streams the client closed before the stub finished writing them (ConnectionResetError on
    #: write): counted here instead of aiohttp's "Error handling request" traceback in test logs.
    client_disconnects: int = 0

    def counters(self) -> dict[str, Any]:
        """The spec-decode counters now (what /metrics reports)."""
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted": self.accepted,
                "per_pos": list(self.per_pos), "generation_tokens": self.generation_tokens}


def prompt_key(payload: dict[str, Any]) -> str:
    """Stable short hash of the request's prompt or messages (selects the generated words)."""
    src = payload.get("prompt") if "prompt" in payload else payload.get("messages")
    return hashlib.sha1(json.dumps(src, sort_keys=True).encode()).hexdigest()[:6]


def prompt_text(payload: dict[str, Any]) -> str:
    """The prompt as text (token ids joined, chat contents joined)."""
    if "prompt" in payload:
        p = payload["prompt"]
        return p if isinstance(p, str) else " ".join(map(str, p))
    return "\n".join(str(m.get("content", "")) for m in payload.get("messages") or [])


def token_text(key: str, i: int, diverged: bool = False) -> str:
    """Text of generated token ``i`` for prompt key ``key`` (``diverged`` changes it)."""
    return f" {'x' if diverged else 't'}{key}{i}"


class StubServer:
    """The stub's aiohttp application plus its :class:`StubState`."""

    def __init__(self, config: StubConfig | None = None) -> None:
        self.config = config or StubConfig()
        self.state = StubState(per_pos=[0] * self.config.k)
        self._vocab: dict[str, int] = {}
        self.app = web.Application()
        self.app.router.add_post("/v1/completions", self.completions)
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_get("/metrics", self.metrics)
        if self.config.tokenizer:
            self.app.router.add_post("/tokenize", self.tokenize)
            self.app.router.add_post("/detokenize", self.detokenize)

    # ---------------------------------------------------------------- spec-decode simulation
    def _generate(self, n_tokens: int) -> tuple[list[int], list[int]]:
        """Advance the counters for one request of ``n_tokens``; returns its per-step
        (accepted, drafted) lists, as vLLM's per-request metrics would hold them."""
        c, s = self.config, self.state
        s.generation_tokens += n_tokens
        accs: list[int] = []
        if c.k <= 0:
            return accs, []
        left = n_tokens
        while left > 0:
            a = min(c.accept_pattern[s.step % len(c.accept_pattern)], c.k, left - 1)
            s.step += 1
            s.drafts += 1
            s.draft_tokens += c.k
            s.accepted += a
            for i in range(a):
                s.per_pos[i] += 1
            accs.append(a)
            left -= a + 1
        return accs, [c.k] * len(accs)

    def metrics_text(self) -> str:
        """Constructed exposition text in vLLM 0.32's V1 format (labels engine, model_name)."""
        s, m = self.state, self.config.model
        lab = f'engine="0",model_name="{m}"'
        lines = [
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{lab}}} {float(s.generation_tokens)}",
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{{{lab}}} {float(s.prompt_tokens)}",
        ]
        if self.config.k > 0:
            for name, val in (("num_drafts", s.drafts), ("num_draft_tokens", s.draft_tokens),
                              ("num_accepted_tokens", s.accepted)):
                lines += [f"# HELP vllm:spec_decode_{name}_total Spec decode {name}.",
                          f"# TYPE vllm:spec_decode_{name}_total counter",
                          f"vllm:spec_decode_{name}_total{{{lab}}} {float(val)}",
                          f"# HELP vllm:spec_decode_{name}_created Spec decode {name}.",
                          f"# TYPE vllm:spec_decode_{name}_created gauge",
                          f"vllm:spec_decode_{name}_created{{{lab}}} 1.7e9"]
            lines += ["# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per position.",
                      "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter"]
            for i, v in enumerate(s.per_pos):
                lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {float(v)}')
        return "\n".join(lines) + "\n"

    async def metrics(self, request: web.Request) -> web.Response:
        text = self.metrics_text()
        self.state.metrics_served.append(text)
        self.state.metrics_snapshots.append(self.state.counters())
        return web.Response(text=text, content_type="text/plain")

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``POST /tokenize`` shape: ``{"tokens": [...], "count": n}``."""
        body = await request.json()
        ids = [self._vocab.setdefault(p, len(self._vocab)) for p in re.findall(r"\s*\S+|\s+$", body.get("prompt", ""))]
        return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": 2048})

    async def detokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``POST /detokenize`` shape: ``{"prompt": text}``."""
        body = await request.json()
        back = {i: p for p, i in self._vocab.items()}
        return web.json_response({"prompt": "".join(back.get(i, "") for i in body.get("tokens", []))})

    async def models(self, request: web.Request) -> web.Response:
        c = self.config
        if c.models_status != 200:
            return web.json_response({"error": {"message": "not here"}}, status=c.models_status)
        body = json.dumps({"object": "list", "data": [{"id": c.model, "object": "model"}]})
        return web.Response(text=body, headers={"Content-Type": c.models_content_type})

    # ---------------------------------------------------------------- generation
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, chat=True)

    async def _stream(self, request: web.Request, chat: bool) -> web.StreamResponse:
        """One streamed completion; a client that goes away mid-stream (the load generator's
        response cap, a read timeout, Ctrl-C) ends it quietly and is counted in
        ``state.client_disconnects``."""
        prepared: list[web.StreamResponse] = []
        try:
            return await self._stream_body(request, chat, prepared)
        except ConnectionResetError:  # aiohttp's ClientConnectionResetError: "Cannot write to closing transport"
            self.state.client_disconnects += 1
            return prepared[0] if prepared else web.Response(status=499)

    async def _stream_body(self, request: web.Request, chat: bool, prepared: list) -> web.StreamResponse:
        c, s = self.config, self.state
        s.requests += 1
        nth = s.requests
        payload = await request.json()
        s.payloads.append(payload)
        auth = request.headers.get("Authorization")
        s.auth_headers.append(auth)
        if c.require_api_key is not None and auth != f"Bearer {c.require_api_key}":
            return web.json_response({"error": {"message": "invalid api key"}}, status=401)
        if c.error_every and nth % c.error_every == 0:
            return web.json_response({"error": {"message": "injected failure"}}, status=500)
        n = payload.get("max_completion_tokens" if chat else "max_tokens") or c.default_tokens
        key = prompt_key(payload)
        diverge = c.diverge_marker is not None and c.diverge_marker in prompt_text(payload)
        drop = bool(c.drop_every) and nth % c.drop_every == 0
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        prepared.append(resp)
        obj = "chat.completion.chunk" if chat else "text_completion"
        rid = f"stub-{nth}"
        prompt_tokens = len(prompt_text(payload).split())
        if c.flood_bytes:
            line = b"data: " + b"x" * 1018 + b"\n"  # 1 KiB lines of one endless event
            for _ in range(c.flood_bytes // len(line)):
                await resp.write(line)
            await resp.write(b"\ndata: [DONE]\n\n")
            await resp.write_eof()
            return resp
        if chat:
            first = {"id": rid, "object": obj, "model": c.model,
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
            await resp.write(b"data: " + json.dumps(first).encode() + b"\n\n")
        for i in range(n):
            if drop and i == c.drop_after:
                request.transport.abort() if request.transport else None
                return resp
            if c.token_delay:
                await asyncio.sleep(c.token_delay)
            if i == c.stall_after:
                await asyncio.sleep(c.stall_seconds)
            text = token_text(key, i, diverge and i >= c.diverge_at)
            fin = "length" if i == n - 1 else None
            for ci in range(max(1, c.num_choices)):
                choice = ({"index": ci, "delta": {"content": text}, "finish_reason": fin} if chat
                          else {"index": ci, "text": text, "logprobs": None, "finish_reason": fin})
                await resp.write(b"data: " + json.dumps({"id": rid, "object": obj, "model": c.model,
                                                         "choices": [choice]}).encode() + b"\n\n")
        accs, drafted = self._generate(n)
        s.prompt_tokens += prompt_tokens
        if c.send_usage and (payload.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
            final: dict[str, Any] = {"id": rid, "object": obj, "model": c.model, "choices": [], "usage": usage}
            if c.per_request_payloads:
                final["metrics"] = {"speculative_decoding": c.per_request_payloads[(nth - 1) % len(c.per_request_payloads)]}
            elif c.per_request_metrics and c.k > 0:
                hist = [0] * (c.k + 1)
                for a in accs:
                    hist[a] += 1
                final["metrics"] = {"speculative_decoding": {
                    "mean_acceptance_length": 1 + sum(accs) / len(accs) if accs else 1.0,
                    "draft_acceptance_rate": sum(accs) / sum(drafted) if drafted else 0.0,
                    "acceptance_histogram": hist, "num_spec_steps": len(accs), "num_accepted_draft_tokens": sum(accs),
                    "num_draft_tokens": sum(drafted), "num_spec_tokens": c.k,
                    "per_step_accepted": accs, "per_step_drafted": drafted}}
            await resp.write(b"data: " + json.dumps(final).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


class ThreadedStub:
    """Run a :class:`StubServer` on 127.0.0.1 (free port) in a daemon thread; ``with`` it.

    ``url`` is the server root. The stub's state must only be read after requests finished.
    """

    def __init__(self, config: StubConfig | None = None) -> None:
        self.server = StubServer(config)
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()

    def __enter__(self) -> "ThreadedStub":
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("stub server did not start")
        return self

    def _main(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._runner = web.AppRunner(self.server.app, access_log=None)
        loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(self._runner.cleanup())
        loop.close()

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def state(self) -> StubState:
        return self.server.state


def main(argv: list[str] | None = None) -> None:
    """``python -m specwatch.testing.stubserver --port P [--tokens N] [--k K]``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tokens", type=int, default=16, help="tokens per request when max_tokens is unset")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--token-delay", type=float, default=0.0)
    a = ap.parse_args(argv)
    srv = StubServer(StubConfig(default_tokens=a.tokens, k=a.k, token_delay=a.token_delay))
    try:  # optional: uvloop is not a dependency
        import uvloop  # type: ignore[import-not-found]
        uvloop.install()
    except ImportError:
        pass
    web.run_app(srv.app, host=a.host, port=a.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
