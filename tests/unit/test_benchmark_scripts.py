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


def test_compare_sweep_modes_on_real_sweeps(tmp_path):
    """scripts/compare_sweep_modes.py (issue #37): the same estimator on both files; a file against
    itself gives width ratio 1 in every cell; a file that is not a sweep is one line, exit 2."""
    fix = ROOT / "tests" / "fixtures" / "sweeps" / "embedded-ngram-draft-sweep.json"
    out = tmp_path / "modes.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_sweep_modes.py"), str(fix), str(fix),
                        "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["cells"] == 24 and doc["half_as_wide"] == 0
    assert all(row["width_ratio"] == 1.0 for row in doc["rows"] if row["width_ratio"] is not None)
    row = next(x for x in doc["rows"] if x["cell"] == ["ngram-k4", "copy", 4])
    assert 0 < row["paired"]["lower"] < row["paired"]["ratio"] < row["paired"]["upper"]
    assert row["paired"]["n"] == 2 and row["paired"]["wall_s"] > 0
    assert doc["pooled"]["width_ratio"] == pytest.approx(1.0)
    # the two real sweeps of the same cells (2026-12-04): pooled variances and the paired order effect
    sweeps = ROOT / "tests" / "fixtures" / "sweeps"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_sweep_modes.py"),
                        str(sweeps / "embedded-paired-sweep.json"), str(sweeps / "embedded-sequential-sweep.json"),
                        "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    rows = [x["paired"] for x in doc["rows"]]
    pooled = sum((x["n"] - 1) * x["log_sd"] ** 2 for x in rows) / sum(x["n"] - 1 for x in rows)
    assert doc["pooled"]["paired_variance"] == pytest.approx(pooled) and doc["pooled"]["df"] == [24, 24]
    assert doc["pooled"]["width_ratio"] < 0.5  # pooled, pairing cut the interval by more than half there
    assert doc["order_effect"]["cells"] == 8 and doc["order_effect"]["mean"] > 0 and doc["order_effect"]["t"] > 2
    assert "paired order effect" in r.stdout
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_sweep_modes.py"), str(bad), str(fix)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error:") and len(r.stderr.strip().splitlines()) == 1
