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


def _script_module(name: str):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_compare_sweep_modes_f_distribution_and_expected_cells():
    """The per-cell bar's expectation (issue #37): F(d1, d2)'s CDF against closed forms and a table
    value, and the expected count of cells at most half as wide at a given pooled width ratio."""
    m = _script_module("compare_sweep_modes")
    assert m.f_cdf(2.5, 2, 2) == pytest.approx(2.5 / 3.5, abs=1e-9)  # F(2, 2): x / (1 + x)
    assert m.f_cdf(1.0, 3, 3) == pytest.approx(0.5, abs=1e-9)  # equal df: the median is 1
    assert m.f_cdf(9.277, 3, 3) == pytest.approx(0.95, abs=1e-3)  # the 95th percentile of F(3, 3)
    assert m.f_cdf(0.0, 3, 3) == 0.0 and m.regularized_beta(1.0, 2, 3) == 1.0
    with pytest.raises(ValueError):
        m.regularized_beta(0.5, 0.25, 1)
    rows = [{"n": 4}] * 8
    # at a pooled ratio of 0.5 half the cells are expected at most half as wide, fewer above it
    assert m.expected_half_as_wide(0.5, rows, rows) == pytest.approx(4.0, abs=1e-6)
    assert m.expected_half_as_wide(0.54, rows, rows) < 4.0 < m.expected_half_as_wide(0.3, rows, rows)


def test_changing_load_pins_its_busy_processes_where_it_is_told(tmp_path):
    """scripts/changing_load.sh SEED LOG CPUS: the busy processes run only on CPUS (taskset)."""
    import os
    import signal
    import time

    log = tmp_path / "phases.txt"
    p = subprocess.Popen(["bash", str(ROOT / "scripts" / "changing_load.sh"), "8", str(log), "0"],
                         start_new_session=True)  # seed 8: the first phase runs 2 busy processes
    try:
        busy: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(busy) < 2:
            busy = subprocess.run(["pgrep", "-g", str(p.pid), "-x", "yes"], capture_output=True, text=True).stdout.split()
            time.sleep(0.1)
        assert len(busy) == 2, busy
        assert all(os.sched_getaffinity(int(pid)) == {0} for pid in busy)
    finally:
        os.kill(p.pid, signal.SIGTERM)  # as the other test: the script ends its busy processes itself
        assert p.wait(timeout=10) == 0
    time.sleep(0.5)

    def alive(pid: str) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    left = [pid for pid in subprocess.run(["pgrep", "-g", str(p.pid)], capture_output=True, text=True).stdout.split()
            if alive(pid)]
    if left:
        os.killpg(p.pid, signal.SIGKILL)
    assert left == []


def test_changing_load_logs_its_phases_and_leaves_nothing_behind(tmp_path):
    """scripts/changing_load.sh (the neighbour of the 2026-12-05 sweep comparison): a seeded phase
    schedule, logged; SIGTERM ends it with its busy processes and its timer (no `yes` left)."""
    import os
    import signal
    import time

    log = tmp_path / "phases.txt"
    p = subprocess.Popen(["bash", str(ROOT / "scripts" / "changing_load.sh"), "8", str(log)],
                         start_new_session=True)  # seed 8: the first phase runs 2 busy processes
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (log.exists() and log.read_text()):
            time.sleep(0.1)
        first = log.read_text().splitlines()[0].split(" ", 1)[1]
        level, dur = int(first.split()[1]), int(first.split()[3])
        assert level == 2 and 20 <= dur <= 90, first
        time.sleep(0.5)
        group = subprocess.run(["pgrep", "-g", str(p.pid)], capture_output=True, text=True).stdout.split()
        assert len(group) >= 4, group  # the script, two `yes`, the timer
    finally:
        os.kill(p.pid, signal.SIGTERM)
        assert p.wait(timeout=10) == 0
    time.sleep(0.5)

    def alive(pid: str) -> bool:  # a killed child may linger as a zombie until its new parent reaps it
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    left = subprocess.run(["pgrep", "-g", str(p.pid)], capture_output=True, text=True).stdout.split()
    left = [pid for pid in left if alive(pid)]
    if left:  # the test must not leave them either
        os.killpg(p.pid, signal.SIGKILL)
    assert left == []
    # the same seed, the same schedule: bash's RANDOM seeded as the script seeds it
    again = subprocess.run(["bash", "-c", "RANDOM=8; echo $((RANDOM % 3)) $((20 + RANDOM % 71))"],
                           capture_output=True, text=True).stdout.split()
    assert [int(x) for x in again] == [level, dur]
