"""The fast stub used by the client benchmark: the load generator's client reads it like a vLLM
server (completions and chat, usage, [DONE]), many streams interleave, and bad requests get
clear HTTP errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading

import pytest
import requests

from specwatch.bench.backend import OpenAIBackend
from specwatch.testing.faststub import serve
from specwatch.bench.workloads import BenchRequest


@pytest.fixture(scope="module")
def fast_stub():
    """The fast stub on a free port in a background thread's event loop; yields its base URL."""
    port_box: list[int] = []
    ready = threading.Event()
    loop = asyncio.new_event_loop()

    def on_ready(port: int) -> None:
        port_box.append(port)
        ready.set()

    task_box = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        task_box.append(loop.create_task(serve("127.0.0.1", 0, "stub-model", 16, on_ready)))
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task_box[0])

    th = threading.Thread(target=run, daemon=True)
    th.start()
    assert ready.wait(10)
    yield f"http://127.0.0.1:{port_box[0]}"
    loop.call_soon_threadsafe(task_box[0].cancel)
    th.join(5)


def _req(i: int, endpoint: str = "completions", n: int = 7) -> BenchRequest:
    if endpoint == "chat":
        return BenchRequest(workload="t", index=i, endpoint="chat", messages=(("user", "hi"),), max_tokens=n)
    return BenchRequest(workload="t", index=i, endpoint="completions", prompt="hello", max_tokens=n)


async def _send_all(url: str, reqs: list[BenchRequest]):
    async with OpenAIBackend(url, "stub-model") as b:
        return await asyncio.gather(*(b.send(r) for r in reqs))


def test_client_reads_completions_and_chat_streams(fast_stub):
    reqs = [_req(i, "chat" if i % 2 else "completions", n=5 + i) for i in range(40)]
    outs = asyncio.run(_send_all(fast_stub, reqs))
    for r, o in zip(reqs, outs, strict=True):
        assert o.success, o.error
        assert o.output_tokens == r.max_tokens and o.tokens_from_usage
        assert o.chunks == r.max_tokens  # one content event per token; chat's role-only chunk not counted
        assert o.generated_text == " tok" * r.max_tokens
        assert o.finish_reason == "length"
        assert len(o.itl) == r.max_tokens - 1


def test_streams_interleave_like_engine_steps():
    """Every step writes one event to every running stream (in order), as an engine step does."""
    from specwatch.testing.faststub import FastStub

    class FakeTransport:
        def __init__(self, name: str, log: list) -> None:
            self.name, self.log = name, log

        def write(self, data: bytes) -> None:
            self.log.append((self.name, data.count(b"data: ")))

        def is_closing(self) -> bool:
            return False

        def get_write_buffer_size(self) -> int:
            return 0

    async def go() -> tuple[list, FastStub]:
        log: list = []
        stub = FastStub()
        for name, n in (("a", 3), ("b", 1), ("c", 2)):
            body = json.dumps({"stream": True, "max_tokens": n, "stream_options": {"include_usage": True}}).encode()
            assert stub.start_stream(FakeTransport(name, log), body, chat=False) is None
        task = asyncio.ensure_future(stub.run())
        for _ in range(20):
            await asyncio.sleep(0)
        task.cancel()
        return log, stub

    log, stub = asyncio.run(go())
    heads = [x for x in log if x[1] == 0]  # the response heads (no event)
    assert [n for n, _ in heads] == ["a", "b", "c"]
    events = [x for x in log if x[1] > 0]
    # step 1: a, b (its last token + usage + [DONE]), c; step 2: a, c (last); step 3: a (last)
    assert events == [("a", 1), ("b", 3), ("c", 1), ("a", 1), ("c", 3), ("a", 3)]
    assert stub.requests == 3 and stub.tokens == 6


def test_models_metrics_and_errors(fast_stub):
    assert requests.get(fast_stub + "/v1/models", timeout=5).json()["data"][0]["id"] == "stub-model"
    m = requests.get(fast_stub + "/metrics", timeout=5)
    assert m.status_code == 200 and m.text.startswith("#")
    assert requests.get(fast_stub + "/nope", timeout=5).status_code == 404
    r = requests.post(fast_stub + "/v1/completions", data=b"not json", timeout=5)
    assert r.status_code == 400 and "error" in r.json()
    r = requests.post(fast_stub + "/v1/completions", json={"prompt": "x", "max_tokens": 3}, timeout=5)
    assert r.status_code == 400 and "streaming" in r.json()["error"]["message"]
    r = requests.post(fast_stub + "/v1/completions", json={"stream": True, "max_tokens": 0}, timeout=5)
    assert r.status_code == 400


def test_garbage_request_line_closes_the_connection(fast_stub):
    host, port = fast_stub.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"NONSENSE\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    assert data.startswith(b"HTTP/1.1 400")
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["message"].startswith("bad request")


def _raw(url: str, payload: bytes, half_close: bool = False, timeout: float = 5.0) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(payload)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            data += chunk
    return data


def _post(body: dict, path: str = "/v1/completions") -> bytes:
    b = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(b)}\r\n\r\n").encode() + b


def test_negative_content_length_is_a_400_and_the_server_stays_up(fast_stub):
    data = _raw(fast_stub, b"GET /v1/models HTTP/1.1\r\nContent-Length: -1000000\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 400") and b"negative Content-Length" in data
    assert requests.get(fast_stub + "/v1/models", timeout=5).status_code == 200


@pytest.mark.parametrize("body, message", [
    ({"stream": True, "max_tokens": 1e999}, "max_tokens"),
    ({"stream": True, "max_tokens": 10**12}, "max_tokens"),
    ({"stream": True, "max_tokens": 3, "stream_options": "x"}, "stream_options"),
])
def test_odd_request_fields_get_400(fast_stub, body, message):
    r = requests.post(fast_stub + "/v1/completions", data=json.dumps(body), timeout=5)
    assert r.status_code == 400 and message in r.json()["error"]["message"]


def test_pipelined_requests_are_answered_in_order_and_half_close_is_served(fast_stub):
    a = _post({"stream": True, "max_tokens": 5, "prompt": "a"})
    b = _post({"stream": True, "max_tokens": 2, "prompt": "b"}, "/v1/chat/completions")
    data = _raw(fast_stub, a + b, half_close=True)
    # two complete responses, one after the other: head, 5 text events, [DONE], end; then the chat one
    first, sep, rest = data.partition(b"0\r\n\r\n")
    assert sep and first.count(b"HTTP/1.1 200") == 1 and first.count(b'"text_completion"') == 5
    second, sep2, tail = rest.partition(b"0\r\n\r\n")
    assert sep2 and tail == b""
    assert second.startswith(b"HTTP/1.1 200") and second.count(b"chat.completion.chunk") == 3  # role + 2 tokens


def test_oversized_content_length_is_refused_up_front(fast_stub):
    data = _raw(fast_stub, b"POST /v1/completions HTTP/1.1\r\nContent-Length: 9000000\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 400") and b"Content-Length above" in data
