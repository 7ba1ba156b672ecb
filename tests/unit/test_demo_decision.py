"""The demo's decision table (specwatch.demo.decision) on the result files of a real
`specwatch demo` run (tests/fixtures/demo, see its README): every number is recomputed here from
the bench files by its documented formula (numpy, not the module's code), the table in
demo-summary.json is what the module computes from them, and the console table keeps workload
names whole. The checks read the JSON document of decide()'s record (``to_json()``), the one
demo-summary.json holds."""

from __future__ import annotations

import copy
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from rich.table import Table

from specwatch.demo import decision as dd
from specwatch.specdecode.costprofile import EMBEDDED_CPU_PROFILE, load_profile
from specwatch.specdecode.decision import Candidate, decide, ratio_from_logs
from specwatch.demo.decisionrecords import Decision, DecisionRow, ProfileFit
from records import bench_record, record

DEMO = Path(__file__).parents[1] / "fixtures" / "demo"
T975 = {1: 12.706204736, 2: 4.302652730, 3: 3.182446305, 4: 2.776445105}  # Student's t, two-sided 95 %


def _load(name):
    return json.loads((DEMO / name).read_text())


@pytest.fixture
def docs():
    return _load("bench-baseline.json"), _load("bench-speculative.json"), _load("demo-summary.json")


def _plain():
    prof = load_profile(EMBEDDED_CPU_PROFILE)
    return lambda b: prof.plain_step(b).seconds


def _cell(doc, wl, c):
    (rec,) = [r for r in doc["summary"] if r["workload"] == wl and r["max_concurrency"] == c]
    return rec


def _batches(doc, wl, c):
    return {b["batch_index"]: b for b in doc["batches"] if not b["warmup"] and b["workload"] == wl
            and b["max_concurrency"] == c}


def _t_interval(value, ratios):
    logs = np.log(ratios)
    h = T975[len(logs) - 1] * np.std(logs, ddof=1) / math.sqrt(len(logs))
    return value * math.exp(-h), value * math.exp(h)


def _geomean(ratios):
    return float(np.exp(np.mean(np.log(ratios))))


def test_the_fixture_is_a_real_run_with_what_the_decision_needs(docs):
    base, spec, summary = docs
    assert summary["num_batches"] >= 3 and len(summary["workloads"]) >= 3 and len(summary["concurrencies"]) >= 2
    for rec in spec["summary"]:
        assert rec["server_step_duration_ms"] > 0 and rec["server_request_steps"] > 0
        assert rec["spec_decode_per_request"]["source"].startswith("vLLM per-request metrics")
    assert all(r["server_step_duration_ms"] > 0 for r in base["summary"])


def test_measured_ratio_and_its_interval_come_from_the_paired_batches(docs):
    base, spec, summary = docs
    d = dd.decide(bench_record(base), bench_record(spec), summary["k"], plain_step=_plain()).to_json()
    assert len(d["rows"]) == len(summary["comparison"]) == len(summary["workloads"]) * len(summary["concurrencies"])
    for row in d["rows"]:
        wl, c = row["workload"], row["concurrency"]
        bb, sb = _batches(base, wl, c), _batches(spec, wl, c)
        assert row["batches"] == len(bb) == len(sb) == summary["num_batches"]
        value = _cell(spec, wl, c)["output_throughput"] / _cell(base, wl, c)["output_throughput"]
        (cmp_row,) = [r for r in summary["comparison"] if r["workload"] == wl and r["max_concurrency"] == c]
        assert row["ratio"] == pytest.approx(cmp_row["ratio"]) == pytest.approx(value)
        # the measured estimate is the paired ratio: exp(mean log r_i), exp(mean ± t sd / sqrt n)
        ratios = [sb[i]["output_throughput"] / bb[i]["output_throughput"] for i in bb]
        paired = _geomean(ratios)
        lo, hi = _t_interval(paired, ratios)
        m = row["measured"]
        assert (m["value"], m["lower"], m["upper"]) == pytest.approx((paired, lo, hi), rel=1e-9)
        assert m["basis"] == "measured"
        assert m["verdict"] == ("pays" if lo > 1 else "loses" if hi < 1 else "cannot_tell")


def test_calibrated_is_the_server_step_cost_measured_here(docs):
    base, spec, summary = docs
    d = dd.decide(bench_record(base), bench_record(spec), summary["k"]).to_json()
    for row in d["rows"]:
        wl, c = row["workload"], row["concurrency"]
        b, s = _cell(base, wl, c), _cell(spec, wl, c)
        cost = s["server_step_duration_ms"] / b["server_step_duration_ms"]
        tau = 1 + s["spec_decode_accepted_tokens"] / s["server_request_steps"]
        assert row["cost"]["c"] == pytest.approx(cost)
        assert row["cost"]["x"] == pytest.approx(s["spec_decode_draft_tokens"] / s["server_request_steps"])
        bb, sb = _batches(base, wl, c), _batches(spec, wl, c)
        per_batch = [(1 + sb[i]["spec_decode_accepted_tokens"] / sb[i]["server_request_steps"])
                     * bb[i]["server_step_duration_ms"] / sb[i]["server_step_duration_ms"] for i in bb]
        lo, hi = _t_interval(tau / cost, per_batch)
        cal = row["calibrated"]
        assert cal["basis"] == "calibrated"
        assert (cal["value"], cal["lower"], cal["upper"]) == pytest.approx((tau / cost, lo, hi), rel=1e-9)


def test_what_ifs_use_the_exact_curve_and_the_fitted_slope(docs):
    base, spec, summary = docs
    k = summary["k"]
    d = dd.decide(bench_record(base), bench_record(spec), k).to_json()
    checked = 0
    for c in summary["concurrencies"]:
        rows = [r for r in d["rows"] if r["concurrency"] == c]
        xs = np.array([r["cost"]["x"] for r in rows])
        cs = np.array([r["cost"]["c"] for r in rows])
        slope, intercept = np.polyfit(xs, cs, 1)
        line = d["cost_lines"][str(c)]
        assert (line["b"], line["a"]) == pytest.approx((slope, intercept))
        for r in rows:
            s = _cell(spec, r["workload"], c)
            pr = s["spec_decode_per_request"]
            share = s["spec_decode_num_drafts"] / s["server_request_steps"]
            anchor = r["measured"] or r["calibrated"]
            exp = pr.get("expected_acceptance_lengths") or {}
            # τ at the run's k from the same curve; the counters' where the curve stops short of k
            tau_k = (1 + share * (exp[str(k)] - 1) if str(k) in exp else
                     1 + s["spec_decode_accepted_tokens"] / s["server_request_steps"]) if share else 1.0
            run = tau_k / r["cost"]["c"]
            for w in r["what_if"]:
                if w["k"] == k:  # the run's k is the anchor: the client ratio with its interval
                    assert w["basis"] == anchor["basis"] == "measured" and w["value"] == anchor["value"]
                    continue
                x2 = r["cost"]["x"] * w["k"] / k
                c2 = r["cost"]["c"] + slope * (x2 - r["cost"]["x"])
                e = pr["expected_acceptance_lengths"][str(w["k"])] if share else 1.0
                assert w["x"] == pytest.approx(x2) and w["c"] == pytest.approx(c2)
                assert w["value"] == pytest.approx(anchor["value"] * (1 + share * (e - 1)) / c2 / run)
                # the interval is the anchor's widened by the slope's (never narrower)
                assert w["upper"] / w["value"] >= anchor["upper"] / anchor["value"] * (1 - 1e-9)
                assert w["basis"] in ("profile", "extrapolated")
                checked += 1
    assert checked >= len(summary["workloads"])


def test_the_k_to_run_is_the_one_rule_over_off_the_run_k_and_the_what_ifs(docs):
    """decision.decide over off, the run's k (the measured paired ratio with its per-batch log
    ratios) and the what-if k' (the run's batches shifted by log R(k'), with the slope's error):
    the row's k, verdict and confidence are its."""
    base, spec, summary = docs
    k = summary["k"]
    d = dd.decide(bench_record(base), bench_record(spec), k).to_json()
    runs = set()
    for row in d["rows"]:
        wl, c = row["workload"], row["concurrency"]
        bb, sb = _batches(base, wl, c), _batches(spec, wl, c)
        logs = [math.log(sb[i]["output_throughput"] / bb[i]["output_throughput"]) for i in sorted(bb)]
        na = all(sb[i]["spec_decode_accepted_tokens"] == 0 for i in sb)
        run = ratio_from_logs(logs)
        cands = [Candidate.from_ratio(f"k={k}", k, run, log_ratios=logs, never_accepted=na)]
        h_run = math.log(run.upper / run.value)
        for w in row["what_if"]:
            if w["k"] == k:
                continue
            # the what-if is the run's batches shifted by log R(k'), with the slope's own error: the
            # part of its interval beyond the anchor's (the two in quadrature)
            h_model = math.sqrt(max(0.0, math.log(w["upper"] / w["value"]) ** 2 - h_run ** 2))
            cands.append(Candidate(f"k={w['k']}", w["k"], w["value"], w["lower"], w["upper"], w["basis"],
                                   never_accepted=na, log_ratios=[x + math.log(w["relative_to_run"]) for x in logs],
                                   model_log_halfwidth=h_model))
        p = decide(sorted(cands, key=lambda x: x.k))
        got = row["choice"]
        assert (got["k"], got["basis"]) == (p.k, p.basis)
        assert row["verdict"] == p.verdict and row["confidence"] == p.confidence_text()
        want = json.loads(json.dumps(p.to_json()))
        vs_got, vs_want = row["pick"].pop("versus_runner_up"), want.pop("versus_runner_up")
        assert row["pick"] == want  # (the reconstructed model error differs in the last bits)
        assert (vs_got is None) == (vs_want is None)
        if vs_got is not None:
            assert {k: v for k, v in vs_got.items() if not isinstance(v, float)} == \
                {k: v for k, v in vs_want.items() if not isinstance(v, float)}
            assert [vs_got[k] for k in ("value", "lower", "upper")] == \
                pytest.approx([vs_want[k] for k in ("value", "lower", "upper")], rel=1e-12)
        assert row["never_accepted"] == na
        assert got["certain"] == (p.certain and not na)
        assert "at_value" not in got  # the three-scenario choice is gone
        text = dd.format_choice(record(DecisionRow, row))
        run = "off" if p.k == 0 else f"k={p.k}"
        runs.add(run)
        assert text.startswith(f"{run} (")  # a k or off in every row, never "withheld"
    assert runs  # every row says something


def _without(doc, key: str):
    """``doc`` without ``key`` in any of its objects (a key the decision gained after a fixture was captured)."""
    if isinstance(doc, dict):
        return {k: _without(v, key) for k, v in doc.items() if k != key}
    if isinstance(doc, list):
        return [_without(v, key) for v in doc]
    return doc


def test_demo_summary_holds_the_decision_the_module_computes(docs):
    base, spec, summary = docs
    got = _without(json.loads(json.dumps(dd.decide(bench_record(base), bench_record(spec), summary["k"],
                                                   plain_step=_plain()).to_json())), "start_limited")
    written = summary["decision"]
    assert "start_limited" not in json.dumps(written)  # the fixture was captured before the key existed
    assert written["profile"]["file"].endswith(EMBEDDED_CPU_PROFILE.name) and written["decision_format"] == 2
    assert {k: v for k, v in written.items() if k not in ("profile", "how")} == \
        {k: v for k, v in got.items() if k != "how"}
    assert dd.table_rows(record(Decision, written)) == dd.table_rows(record(Decision, got))
    assert set(written["how"]) == {"measured", "calibrated", "profile", "extrapolated"}


def test_profile_fit_compares_the_measured_plain_step_with_the_shipped_profile(docs):
    base, spec, summary = docs
    prof = load_profile(EMBEDDED_CPU_PROFILE)
    fit = [f.to_json() for f in dd.profile_fit(bench_record(base), _plain())]
    assert [f["concurrency"] for f in fit] == summary["concurrencies"]
    for f in fit:
        cells = [r for r in base["summary"] if r["max_concurrency"] == f["concurrency"]]
        steps = sum(r["server_request_steps"] for r in cells)
        b = steps / sum(r["server_engine_steps"] for r in cells)
        t0 = sum(r["server_itl_sum_seconds"] for r in cells) / steps * 1000
        assert f["running_requests"] == pytest.approx(b) and f["measured_t0_ms"] == pytest.approx(t0)
        assert f["profile_t0_ms"] == pytest.approx(prof.plain_step(b).seconds * 1000)
        assert f["ratio"] == pytest.approx(t0 / f["profile_t0_ms"])
    lines = dd.profile_fit_lines([record(ProfileFit, f) for f in fit], prof.name)
    f0 = fit[0]
    assert (f"the shipped profile's plain step is {f0['profile_t0_ms']:.1f} ms at b={f0['running_requests']:.2f}; "
            f"this machine measured {f0['measured_t0_ms']:.1f} ms (ratio {f0['ratio']:.2f})") in lines[1]
    if any(not f["fits"] for f in fit):
        assert "cancels" in lines[-1] and "widen with the drift" in lines[-1]
    # a profile whose plain step is 1 s is flagged at every concurrency
    slow = [f.to_json() for f in dd.profile_fit(bench_record(base), lambda b: 1.0)]
    assert slow and all(not f["fits"] and f["ratio"] < 0.5 for f in slow)
    assert dd.profile_fit(bench_record(base), None) == []


def test_one_measured_batch_gives_no_interval_but_still_a_k_from_the_point_values(docs):
    base, spec, summary = docs
    b1, s1 = copy.deepcopy(base), copy.deepcopy(spec)
    for doc in (b1, s1):
        doc["batches"] = [b for b in doc["batches"] if b["warmup"] or b["batch_index"] == 1]
    d = dd.decide(bench_record(b1), bench_record(s1), summary["k"]).to_json()
    full = {(r["workload"], r["concurrency"]): r for r in dd.decide(bench_record(base), bench_record(spec), summary["k"]).to_json()["rows"]}
    for row in d["rows"]:
        assert row["measured"] is None and row["calibrated"] is None and row["batches"] == 1
        assert "--num-batches 2" in row["note"]
        ch = row["choice"]
        assert ch["k"] is not None and not ch["certain"]
        assert ch["reason"] == ("never_accepted" if row["never_accepted"] else "no_interval")
        if not row["never_accepted"]:
            assert dd.format_choice(record(DecisionRow, row)).endswith("; 1 batch: no interval)")
            assert row["verdict"] == "cannot_tell" and "no interval" in row["confidence"]
        # the point values: the one batch's client ratio at the run's k, the same R(k') as with an interval
        bb, sb = _batches(b1, row["workload"], row["concurrency"]), _batches(s1, row["workload"], row["concurrency"])
        ratio = sb[1]["output_throughput"] / bb[1]["output_throughput"]
        rel = {w["k"]: w["relative_to_run"] for w in full[(row["workload"], row["concurrency"])]["what_if"]}
        points = [Candidate("off" if kk == 0 else f"k={kk}", kk, ratio * r, never_accepted=row["never_accepted"])
                  for kk, r in sorted(rel.items())]
        assert ch["k"] == decide(points).k
        assert dd.table_rows(record(Decision, {"rows": [row]}))[0][2].endswith("(no interval) measured")


def test_bad_k_and_missing_files():
    with pytest.raises(ValueError, match="k must be >= 1"):
        dd.decide(bench_record({}), bench_record({}), 0)
    assert dd.decide(None, None, 4).to_json()["rows"] == []
    with pytest.raises(ValueError):
        dd.t975(0)
    assert dd.t975(2) == pytest.approx(4.303, abs=1e-3) and dd.t975(500) == pytest.approx(1.96, abs=1e-2)


def test_console_tables_keep_workload_names_whole(docs):
    """Issue 25: the demo's terminal tables cut random-output to random-…"""
    from specwatch import demo as demo_mod
    from specwatch.bench.results import keep_names_whole

    base, spec, summary = docs
    buf = io.StringIO()
    old = demo_mod.console
    demo_mod.console = Console(width=100, file=buf, color_system=None)
    try:
        demo_mod._print_decision(record(Decision, summary["decision"]))
    finally:
        demo_mod.console = old
    out = buf.getvalue()
    for wl in summary["workloads"]:
        assert wl in out
    assert "random-…" not in out and "calibrated" in out and "measured" in out
    # the bench tables' 12 columns at 130 characters (the demo's width without a terminal)
    t = Table()
    for col in ("role", "workload", "concurrency", "batches", "ok/failed", "tok/s", "TTFT med ms", "TPOT med ms",
                "ITL p99 ms", "E2E p90 s", "acceptance", "acc. length"):
        t.add_column(col)
    t.add_row("speculative", "random-output", "8", "1", "8/0", "123.4", "1234", "12.34", "123", "1.23", "12.3 %", "1.23")
    plain = io.StringIO()
    Console(width=130, file=plain, color_system=None).print(t)
    assert "random-…" in plain.getvalue()  # what rich does by itself
    fixed = io.StringIO()
    Console(width=130, file=fixed, color_system=None).print(keep_names_whole(t))
    assert "random-output" in fixed.getvalue() and "speculative" in fixed.getvalue()


def test_an_interactive_demo_says_how_to_stop_it():
    from specwatch.demo import KEEP_RUNNING_HINT

    text = KEEP_RUNNING_HINT.format(prom="http://127.0.0.1:9090", exporter="http://127.0.0.1:19337/metrics")
    assert "Ctrl-C" in text and "--no-keep-running" in text
