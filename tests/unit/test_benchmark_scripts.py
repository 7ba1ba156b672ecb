"""The benchmark scripts run (tiny sizes): they are not timed tests, but they must keep working
and must compare like with like (same requests, every request completed by both clients)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.vllmpkg  # scripts/bench_client.py runs vLLM's own benchmark client (vllm.benchmarks)
@pytest.mark.parametrize("stub", ["fast", "aiohttp"])
def test_bench_client_script_compares_both_clients(tmp_path, stub):
    pytest.importorskip("vllm.benchmarks.serve")
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_client.py"), "--concurrency", "8",
                        "--num-prompts", "40", "--output-len", "16", "--rounds", "1", "--stub", stub,
                        "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "failed 0) | vllm bench serve" in r.stdout and r.stdout.count("(failed 0)") == 2
    res = json.loads(out.read_text())
    assert res["target"] == f"{stub} stub"
    for who in ("specwatch", "vllm"):
        assert res[f"{who}_request_throughput"] > 0
        # every request got all its tokens: tokens/s = 16 × requests/s
        assert res[f"{who}_output_throughput"] == pytest.approx(16 * res[f"{who}_request_throughput"], rel=1e-6)
    assert res["ratio_request_throughput"] == pytest.approx(
        res["specwatch_request_throughput"] / res["vllm_request_throughput"])
