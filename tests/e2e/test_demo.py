"""The README's main job (`specwatch demo`) end to end on the real embedded vLLM, made small:
one workload, concurrency 1, short outputs. It starts its own two servers, side by side (paired
rounds, issue #37)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import realstack
from reportcheck import (CHROMIUM, check_decision_table_first, check_latency_charts_are_the_result_files,
                         check_report_opens_in_chromium)

pytestmark = [pytest.mark.realvllm, pytest.mark.prometheus]


def test_demo_runs_the_main_job(tmp_path):
    reason = realstack.skip_real_reason()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "demo"
    r = subprocess.run(
        [sys.executable, "-m", "specwatch", "demo", "--workloads", "copy", "--max-concurrency", "1",
         "--output-len", "24", "--equivalence-output-len", "16", "--result-dir", str(out), "--no-keep-running"],
        capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "baseline vs speculative" in r.stdout and "per-position acceptance" in r.stdout
    summary = json.loads((out / "demo-summary.json").read_text())
    assert set(summary["servers"]) == {"baseline", "speculative"}
    (row,) = summary["comparison"]
    assert row["workload"] == "copy" and row["baseline_output_throughput"] > 0 and row["ratio"] > 0
    curve = summary["per_position"]
    assert len(curve["per_position_acceptance_rate"]) == 4
    assert curve["mean_acceptance_length"] == pytest.approx(1 + sum(curve["per_position_acceptance_rate"]))
    assert summary["equivalence"]["total"] == 12
    # it ends with a decision by the one rule: one row per cell, the paired measured ratio with an
    # interval, always a k or "off", its verdict and confidence (issue #36)
    (drow,) = summary["decision"]["rows"]
    assert summary["decision"]["decision_format"] == 2
    m = drow["measured"]
    assert m["basis"] == "measured" and 0 < m["lower"] <= m["value"] <= m["upper"]
    assert drow["calibrated"]["basis"] == "calibrated" and drow["choice"]["k"] is not None
    assert drow["choice"]["run"] == ("off" if drow["choice"]["k"] == 0 else f"k={drow['choice']['k']}")
    assert drow["verdict"] in ("pays", "loses", "cannot_tell") and drow["confidence"]
    (cell,) = json.loads((out / "bench-speculative.json").read_text())["summary"]
    if cell["spec_decode_accepted_tokens"] == 0 or cell["spec_decode_num_drafts"] == 0:
        assert drow["choice"]["k"] == 0 and drow["never_accepted"]  # physics first
    assert "the decision: does speculation (k=4) pay here" in r.stdout and "this machine measured" in r.stdout
    assert "specwatch top --window 15s" in r.stdout
    # `specwatch advise` on the result folder decides the same k, verdict and confidence
    adv = subprocess.run([sys.executable, "-m", "specwatch", "advise", str(out), "--json", str(tmp_path / "advice.json")],
                         capture_output=True, text=True, timeout=300)
    assert adv.returncode == 0, adv.stdout[-3000:] + adv.stderr[-3000:]
    (arow,) = json.loads((tmp_path / "advice.json").read_text())["decision"]["rows"]
    assert (arow["choice"], arow["verdict"], arow["confidence"]) == (drow["choice"], drow["verdict"], drow["confidence"])
    # paired rounds: both bench files hold the same batches of the cell, and the demo's exporter
    # served the measured speedup (both servers live) after every cell (issue #37)
    bb = json.loads((out / "bench-baseline.json").read_text())["batches"]
    sb = json.loads((out / "bench-speculative.json").read_text())["batches"]
    assert [b["batch_index"] for b in bb] == [b["batch_index"] for b in sb]
    live = summary["live_measured"]
    assert set(live) == {"copy/c=1"}
    for cell, got in live.items():
        measured = {w: v for w, v in got["windows"].items() if v["basis"] == "measured"}
        assert measured, f"{cell}: the exporter served no measured speedup: {got}"
        assert all(0 < v["lower"] <= v["value"] <= v["upper"] for v in measured.values())
    assert "basis=measured" in r.stdout
    # Prometheus scraped the exporter and evaluated the rules while the speculative server ran
    prom = summary["prometheus"]
    assert prom['specwatch_draft_acceptance_rate{upstream="spec",window="lifetime"}']
    assert prom["model_name:specwatch_mean_acceptance_length:ratio_rate5m"]
    for name in ("bench-baseline.json", "bench-baseline.csv", "bench-speculative.json", "bench-speculative.csv"):
        assert (out / name).stat().st_size > 0
    # how to watch it live, said before the load; the report's path is the console's last line
    assert r.stdout.index("specwatch top") < r.stdout.index("baseline server")
    report = out / "report.html"
    assert r.stdout.strip().splitlines()[-1] == f"Report: {report}"
    html = report.read_text()
    assert len(re.findall(r'src="data:image/png;base64,', html)) == 6  # rendered by specwatch.demo.report
    # its TTFT and TPOT charts are the bench files' values
    assert check_latency_charts_are_the_result_files(out) == 2
    # and the demo's own report.html opens in headless Chromium with every image rendered
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs it): report.html not opened")
    assert len(check_report_opens_in_chromium(out, tmp_path)) == 6
    assert check_decision_table_first(out, tmp_path) == 1  # the report opens with the decision
