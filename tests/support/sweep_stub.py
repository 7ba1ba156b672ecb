"""The stub vLLM server that sweep tests start from a ``--server-command`` template: the load
generator's stub (specwatch.testing.stubserver: constructed vLLM V1 spec-decode counters), reading
``--speculative-config`` like vLLM, with a constructed ``vllm:cache_config_info`` (capacity
shrinks with k), logging every start (k to ``STUB_START_LOG``, pid to ``STUB_PID_LOG``), and
on request failing every Nth request (``STUB_ERROR_EVERY``) or exiting after N requests
(``STUB_DIE_AFTER``).

A pytest plugin too (tests/conftest.py lists it in ``pytest_plugins``): the fixture ``stub`` is
:func:`make_stub` for the test's tmp_path; :func:`starts` reads the start log it returns."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

STUB = r'''
import argparse, json, os
from aiohttp import web
from specwatch.testing.stubserver import StubConfig, StubServer
ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--speculative-config", default=None)
ap.add_argument("--api-key", default=None)
a = ap.parse_args()
k = json.loads(a.speculative_config)["num_speculative_tokens"] if a.speculative_config else 0
with open(os.environ["STUB_START_LOG"], "a") as f:
    f.write(f"{k}\n")
if os.environ.get("STUB_PID_LOG"):
    with open(os.environ["STUB_PID_LOG"], "a") as f:
        f.write(f"{os.getpid()}\n")
die_after = int(os.environ.get("STUB_DIE_AFTER") or 0)
seen = [0]
@web.middleware
async def die(request, handler):
    if request.method == "POST":
        seen[0] += 1
        if die_after and seen[0] > die_after:
            os._exit(7)
    return await handler(request)
class S(StubServer):
    def metrics_text(self):  # constructed cache info: capacity shrinks with k
        return super().metrics_text() + (
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="16",engine="0",num_gpu_blocks="{1000 - 10 * k}"}} 1.0\n')
srv = S(StubConfig(k=k, accept_pattern=(3, 1, 0, 2), require_api_key=a.api_key,
                   error_every=int(os.environ.get("STUB_ERROR_EVERY") or 0)))
srv.app.middlewares.append(die)
web.run_app(srv.app, host="127.0.0.1", port=a.port, access_log=None, print=None)
'''


def make_stub(tmp_path: Path, monkeypatch) -> tuple[str, Path]:
    """Write the stub script under ``tmp_path``; returns (``--server-command`` template, start log)."""
    script = tmp_path / "stub.py"
    script.write_text(STUB)
    log = tmp_path / "starts.log"
    monkeypatch.setenv("STUB_START_LOG", str(log))
    monkeypatch.delenv("STUB_ERROR_EVERY", raising=False)
    monkeypatch.delenv("STUB_DIE_AFTER", raising=False)
    template = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} --port {{port}} {{spec_args}}"
    return template, log


@pytest.fixture
def stub(tmp_path, monkeypatch) -> tuple[str, Path]:
    """(``--server-command`` template, start log) of a stub written under the test's tmp_path (:func:`make_stub`)."""
    return make_stub(tmp_path, monkeypatch)


def starts(log: Path) -> list[int]:
    """The k of every stub start so far, in order (0: no speculation); [] before the first."""
    return [int(x) for x in log.read_text().split()] if log.exists() else []
