"""scripts/verify_speedup.py (issue 23): the live-speedup check on any server — the sweep's
--server-command template and --speculative-config, the baseline-upstream mode, the per-cell checks,
the JSON rewritten after every cell, and one-line exit-2 errors. Runs against the sweep's stub
server (tests/support/sweep_stub.py); the embedded default is run by scripts/verify_speedup.sh."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pids import alive as _alive
from polling import wait_until
from sweep_stub import make_stub

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "verify_speedup.py"
PROFILE = Path(__file__).resolve().parents[2] / "exporter" / "specwatch" / "data" / "cost-profiles" / \
    "cpu-2core-smollm2-135m-vllm0.32.yaml"


@pytest.fixture(scope="module")
def vs():
    spec = importlib.util.spec_from_file_location("verify_speedup", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["verify_speedup"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_judge_checks_each_cell(vs):
    j = vs.judge(2.0, {"value": 2.2, "basis": "measured", "lower": 1.9, "upper": 2.4})
    assert j["relative_error"] == pytest.approx(0.1) and j["within_15_percent"] and not j["wrong_side_of_1"]
    assert j["interval_contains_ratio"] and j["interval_tight"]  # 2.4 / 1.9 = 1.26
    j = vs.judge(0.8, {"value": 1.1, "basis": "measured", "lower": 0.7, "upper": 1.2})
    assert j["wrong_side_of_1"] and not j["within_15_percent"] and j["interval_contains_ratio"] and not j["interval_tight"]
    # inside 0.95-1.05 the side of 1 is not judged
    assert vs.judge(0.97, {"value": 1.02, "basis": "profile", "lower": None, "upper": None})["wrong_side_of_1"] is False
    # no lower/upper served (an exporter without them): those checks are None, the others still judged
    j = vs.judge(1.5, {"value": 1.4, "basis": "measured", "lower": None, "upper": None})
    assert j["interval_contains_ratio"] is None and j["interval_tight"] is None and j["within_15_percent"]
    assert vs.judge(1.5, None)["within_15_percent"] is None


def test_rounds_alternate_abba_and_combine_as_total_tokens_over_total_time(vs):
    calls = []
    base = iter([10.0, 30.0, 10.0])
    spec = iter([20.0, 20.0, 40.0])

    def run_b():
        calls.append("b")
        return next(base)

    def run_s():
        calls.append("s")
        return next(spec)

    rounds = vs.interleaved_rounds(run_b, run_s, 3)
    assert calls == ["b", "s", "s", "b", "b", "s"]
    # equal work per round: 3 / (1/10 + 1/30 + 1/10) = 12.857 tok/s, not the arithmetic 16.7
    assert vs.combined_throughput(rounds, "baseline") == pytest.approx(3 / (0.1 + 1 / 30 + 0.1))
    assert vs.combined_throughput(rounds, "speculative") == pytest.approx(3 / (0.05 + 0.05 + 0.025))
    assert vs.round_ratios(rounds) == pytest.approx([2.0, 20 / 30, 4.0])


def test_live_speedup_reads_the_server_k_with_lower_and_upper(vs):
    text = "\n".join([
        "# TYPE specwatch_speedup gauge",
        'specwatch_speedup{upstream="spec",model_name="m",engine="0",k="2",window="WIN",basis="profile"} 1.1',
        'specwatch_speedup{upstream="spec",model_name="m",engine="0",k="4",window="SHORT",basis="measured"} 9.0',
        'specwatch_speedup{upstream="spec",model_name="m",engine="0",k="4",window="WIN",basis="measured"} 1.7',
        "# TYPE specwatch_speedup_lower gauge",
        'specwatch_speedup_lower{upstream="spec",model_name="m",engine="0",k="4",window="WIN"} 1.5',
        "# TYPE specwatch_speedup_upper gauge",
        'specwatch_speedup_upper{upstream="spec",model_name="m",engine="0",k="4",window="WIN"} 1.9',
        "# TYPE specwatch_cost_profile_error_ratio gauge",
        'specwatch_cost_profile_error_ratio{upstream="spec",model_name="m",engine="0",window="WIN"} 1.08', ""])
    text = text.replace("WIN", vs.WINDOW).replace("SHORT", vs.SHORT_WINDOW)
    assert vs.live_speedup(text, 4, "spec") == {"value": 1.7, "basis": "measured", "lower": 1.5, "upper": 1.9}
    assert vs.live_speedup(text, 4, "base") is None
    assert vs.live_speedup(text.split("# TYPE specwatch_speedup_lower")[0], 4)["lower"] is None  # tolerated absence
    assert vs.drift(text) == 1.08


def _cell(ratio, lo, hi, basis="measured", cal=None):
    c = {"config": "ngram-k4", "workload": "copy", "concurrency": 1, "measured_ratio": ratio,
         "exporter_speedup": {"value": (lo + hi) / 2, "basis": basis, "lower": lo, "upper": hi},
         "interval_contains_ratio": lo <= ratio <= hi}
    if cal:
        c["calibrated"] = cal
    return c


def test_coverage_counts_the_cells_whose_interval_holds_the_client_ratio(vs, tmp_path, capsys):
    rows = [_cell(2.0, 1.9, 2.1), _cell(2.0, 2.05, 2.3), _cell(0.5, 0.4, 0.6), _cell(1.0, 0.9, 1.1, basis="calibrated")]
    cov = vs.coverage(rows)
    assert (cov["cells"], cov["covered"]) == (3, 2) and cov["share"] == pytest.approx(2 / 3)
    assert cov["missed"] == ["ngram-k4 copy c=1: ratio 2.000 outside [2.050, 2.300]"]
    assert "2 of 3 cells (66.7 %" in vs.coverage_line(cov, "measured")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"mode": "baseline-upstream", "settings": {"load_hog": 0}, "status": "complete",
                             "cells": [_cell(2.0, 1.9, 2.1)] * 9}))
    b.write_text(json.dumps({"mode": "baseline-upstream", "settings": {"load_hog": 1}, "status": "complete",
                             "cells": [_cell(2.0, 2.05, 2.3)]}))
    assert vs.main(["--coverage", str(a), str(b)]) == 0  # 9 of 10: 90 %
    out = capsys.readouterr().out
    assert "all 2 runs: the measured 95 % interval holds the client ratio in 9 of 10 cells (90.0 %" in out
    b.write_text(json.dumps({"mode": "baseline-upstream", "cells": [_cell(2.0, 2.05, 2.3)] * 2}))
    assert vs.main(["--coverage", str(a), str(b)]) == 1  # 9 of 11
    (tmp_path / "bad.json").write_text("{")
    assert vs.main(["--coverage", str(tmp_path / "bad.json")]) == 2
    assert "not a verify_speedup result file" in capsys.readouterr().err
    assert vs.main(["--coverage"]) == 2


@pytest.mark.parametrize("args, msg", [
    (["--server-command", "nosuchprogram-xyz --port {port} {spec_args}", "--baseline-upstream"], "not found"),
    (["--server-command", "python3 -m x {spec_args}", "--baseline-upstream"], "{port}"),
    (["--server-command", "python3 --port {port}", "--baseline-upstream"], "{spec_args}"),
    (["--baseline-upstream", "--server-command", "python3 --port {port} {spec_args}", "--speculative-config", "{"], "JSON"),
    (["--concurrency", "1,x", "--baseline-upstream"], "--concurrency"),
    ([], "--cost-profile is required"),
])
def test_bad_input_is_one_line_exit_2(vs, capsys, args, msg, tmp_path):
    assert vs.main([*args, "--out", str(tmp_path / "v.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0], err
    assert not (tmp_path / "v.json").exists()


def test_baseline_upstream_mode_on_a_template_server(vs, tmp_path, monkeypatch, capsys):
    """Both servers from the sweep's --server-command template up at once (the stub logs its starts:
    0 = baseline, 2 = ngram k=2), each cell benched on both, the JSON written per cell."""
    from specwatch.localvllm import server as localvllm_server

    monkeypatch.setattr(localvllm_server, "LOCK_PATH", tmp_path / "vllm.lock")
    template, log = make_stub(tmp_path, monkeypatch)
    out = tmp_path / "v.json"
    rc = vs.main(["--baseline-upstream", "--server-command", template, "--speculative-config",
                  '{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":3}', "--workloads", "copy,explain",
                  "--concurrency", "1", "--output-len", "8", "--prompts-per-concurrency", "1", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["mode"] == "baseline-upstream" and doc["server"]["kind"] == "template" and doc["status"] == "complete"
    assert sorted(int(x) for x in log.read_text().split()) == [0, 2]  # both up at once, started once
    cells = doc["cells"]
    assert [(c["config"], c["workload"]) for c in cells] == [("ngram-k2", "copy"), ("ngram-k2", "explain")]
    for c in cells:
        assert c["baseline_output_throughput"] > 0 and c["output_throughput"] > 0
        assert [r["order"] for r in c["rounds"]] == ["baseline,speculative", "speculative,baseline"]  # --rounds 2
        assert len(c["round_ratios"]) == 2
        assert c["measured_ratio"] == pytest.approx(c["output_throughput"] / c["baseline_output_throughput"])
        assert {"exporter_speedup", "drift", "within_15_percent", "wrong_side_of_1", "interval_contains_ratio",
                "interval_tight"} <= set(c)
    table = capsys.readouterr().out
    assert "ngram-k2" in table and "cells within 15 %" in table
    assert rc in (0, 1)  # the stub has no step-time histograms: the exporter may serve no measured speedup


def test_sigterm_stops_servers_exporters_and_load_hogs_and_keeps_the_file(tmp_path, monkeypatch):
    """Killing the check with SIGTERM (``timeout``, a closed session) stops both template servers
    and the CPU-burning load process it started and writes the result file as "interrupted"
    (exit 130), instead of leaving servers running."""
    template, log = make_stub(tmp_path, monkeypatch)
    pids = tmp_path / "pids.log"
    out = tmp_path / "v.json"
    wrapper = ("import runpy, sys; from pathlib import Path; import specwatch.localvllm.server as s; "
               f"s.LOCK_PATH = Path({str(tmp_path / 'vllm.lock')!r}); sys.argv = [{str(SCRIPT)!r}] + sys.argv[1:]; "
               f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    env = dict(os.environ, STUB_PID_LOG=str(pids))
    proc = subprocess.Popen(
        [sys.executable, "-c", wrapper, "--baseline-upstream", "--server-command", template, "--speculative-config",
         '{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":3}', "--workloads", "copy",
         "--concurrency", "1", "--output-len", "4000", "--prompts-per-concurrency", "50", "--load-hog", "1",
         "--out", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (pids.exists() and len(pids.read_text().split()) >= 2):
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.2)
        server_pids = [int(p) for p in pids.read_text().split()]
        assert len(server_pids) == 2 and all(_alive(p) for p in server_pids)
        time.sleep(1.0)  # the bench is under way
        proc.send_signal(signal.SIGTERM)
        text, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, text[-2000:]
    hog = [int(x) for x in re.findall(r"CPU-burning processes: pids ([\d, ]+)", text)[0].split(",")]
    wait_until(lambda: not any(_alive(p) for p in server_pids + hog), 10, interval=0.2)
    left = [p for p in server_pids + hog if _alive(p)]
    for p in left:  # never leave them behind, even when the check fails
        os.kill(p, signal.SIGKILL)
    assert not left, "left running after SIGTERM"
    doc = json.loads(out.read_text())
    assert doc["status"] == "interrupted" and "interrupted: finished cells are in" in text


def test_an_exporter_interrupted_while_starting_is_stopped(vs, tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM while ``start_exporter`` waits for the new exporter to answer (the CI run
    of 2026-12-02 sent SIGTERM just then): the half-started exporter is stopped, not orphaned
    holding the caller's stdout."""
    fake = tmp_path / "specwatch"
    fake.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(120)\n")
    fake.chmod(0o755)
    monkeypatch.setattr(vs, "SPECWATCH", fake)
    started = []
    real_popen = subprocess.Popen

    def popen(*a, **kw):
        started.append(real_popen(*a, **kw))
        return started[-1]

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(vs.subprocess, "Popen", popen)
    monkeypatch.setattr(vs, "wait_http", interrupted)
    with pytest.raises(KeyboardInterrupt):
        vs.start_exporter(["spec=http://127.0.0.1:9"], None, None)
    (proc,) = started
    assert proc.poll() is not None, "the exporter was left running"
    assert not _alive(proc.pid)
