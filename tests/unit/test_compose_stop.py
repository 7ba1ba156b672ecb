"""Issue #38 item 10 (the part that needs no engine): the CPU vLLM container stops within its stop
grace period. ``specwatch vllm`` stops vLLM's process group with SIGTERM and SIGKILL after
VllmServer's ``stop_timeout``; Docker's default grace of 10 s killed it mid-shutdown on a loaded
machine and ``docker compose down`` failed ("did not receive an exit event"). An init process as
PID 1 forwards the signal and reaps what exits. (That ``down`` then exits 0 the first time needs a
Docker engine under load: the compose tier.)"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import yaml

from specwatch.localvllm.server import VllmServer

ROOT = Path(__file__).resolve().parents[2]


def _seconds(text: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", str(text))
    assert parts and "".join(a + b for a, b in parts) == str(text), text
    return sum(float(a) * units[b] for a, b in parts)


def test_the_cpu_vllm_has_an_init_and_a_grace_period_beyond_its_own_stop_timeout():
    svc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["vllm-cpu"]
    assert svc.get("init") is True
    stop_timeout = inspect.signature(VllmServer).parameters["stop_timeout"].default
    assert _seconds(svc["stop_grace_period"]) >= stop_timeout + 15, (svc.get("stop_grace_period"), stop_timeout)
