"""Issue 23: `specwatch advise` never drops what was measured.

Ragged cells score their own k (what-ifs from lower-bound curves labelled), every (family,
workload, concurrency) gets a row (unscorable rows say why), "all workloads" combines the
workloads through time (--mix), noise-aware sweep cells (95 % intervals, --target-ci,
--max-batches) and ties by overlapping intervals; old result files without intervals still load.

Real data: tests/fixtures/sweeps/embedded-ngram-ragged-ci-sweep.json (a real CPU sweep with
intervals, README there) and embedded-ngram-draft-sweep.json (an older real sweep: 2 batches per
cell, no stored intervals).
"""

from __future__ import annotations

import copy
import json
import math
import statistics
from pathlib import Path

import pytest
from click.testing import CliRunner

from specwatch.bench.results import t975, throughput_interval
from specwatch.choosek.advise import advise_sweep, recommendation_note
from specwatch.choosek.cli import advise as advise_cmd
from specwatch.choosek.cli import sweep as sweep_cmd
from specwatch.choosek.model import KChoiceError, Measurement, combine_by_time, parse_mix, recommend, ThroughputPrediction
from specwatch.choosek.resultfile import measurements
from records import sweep_document, sweep_record
from specwatch.choosek.sweep import SweepPlan, build_configs, run_sweep


SWEEPS = Path(__file__).parents[1] / "fixtures" / "sweeps"
NEW = SWEEPS / "embedded-ngram-ragged-ci-sweep.json"
OLD = SWEEPS / "embedded-ngram-draft-sweep.json"


def _recs(doc, **kw):
    (a,) = [x for x in advise_sweep(sweep_record(doc), **kw) if "ngram" in x.family]
    return a, {(r.workload, r.concurrency): r for r in a.recommendations}


def _batches(doc, config, wl, c) -> dict[int, float]:
    cell = next(x for x in doc["cells"] if (x["config"], x["workload"], x["max_concurrency"]) == (config, wl, c))
    return {b["batch_index"]: b["output_throughput"] for b in cell["batches"] if not b["warmup"]}


def _paired(doc, config, wl, c) -> float:
    """The geometric mean of the per-batch ratios config / baseline over the batch indices both ran."""
    a, b = _batches(doc, config, wl, c), _batches(doc, "baseline", wl, c)
    idx = sorted(set(a) & set(b))
    return math.exp(statistics.fmean(math.log(a[i] / b[i]) for i in idx))


def _thr(doc) -> dict[tuple[str, str, int], Measurement]:
    return {(m.config, m.workload, m.concurrency): m for m in measurements(sweep_record(doc))}


# ------------------------------------------------------------------------------- intervals
def test_t_quantiles_and_the_interval_of_a_cell():
    assert t975(1) == pytest.approx(12.706, abs=1e-3) and t975(5) == pytest.approx(2.571, abs=1e-3)
    assert t975(30) == pytest.approx(2.042, abs=1e-3)
    assert t975(60) == pytest.approx(2.000, abs=0.002) and t975(1000) == pytest.approx(1.962, abs=0.001)
    with pytest.raises(ValueError):
        t975(0)
    xs = [100.0, 104.0, 98.0, 102.0]
    ci = throughput_interval(xs).to_json()
    half = t975(3) * statistics.stdev(xs) / 2
    assert ci["batches"] == 4 and ci["low"] == pytest.approx(101 - half) and ci["high"] == pytest.approx(101 + half)
    assert ci["relative_half_width"] == pytest.approx(half / 101)
    # two scattered batches: t(1) = 12.7 makes the half width larger than the mean; the lower end stops at 0
    wide = throughput_interval([20.0, 60.0]).to_json()
    assert wide["low"] == 0.0 and wide["high"] == pytest.approx(40 + t975(1) * statistics.stdev([20.0, 60.0]) / math.sqrt(2))
    assert wide["relative_half_width"] > 1
    one = throughput_interval([50.0]).to_json()
    assert one["batches"] == 1 and one["low"] is None and one["relative_half_width"] is None


# ------------------------------------------------------------------------------- the real sweep (fresh, with intervals)
@pytest.fixture(scope="module")
def new_doc():
    if not NEW.exists():
        pytest.skip("fixture not recorded")
    return sweep_document(NEW)


def test_real_sweep_stores_intervals_and_batches_per_cell(new_doc):
    s = new_doc["settings"]
    assert s["target_ci"] == 0.05 and s["max_batches"] >= s["num_batches"] >= 2
    for c in new_doc["cells"]:
        ci = c["summary"]["output_throughput_ci95"]
        n = len([b for b in c["batches"] if not b["warmup"]])
        assert ci["batches"] == n == c["summary"]["num_batches"]
        assert s["num_batches"] <= n <= s["max_batches"]
        # a cell stops as soon as its interval is within the target (no batch more than it needs) ...
        if n < s["max_batches"]:
            assert ci["relative_half_width"] <= s["target_ci"]
            if n > s["num_batches"]:  # ... and was not within it one batch earlier
                thr = c["summary"]["output_throughput_per_batch"]
                assert throughput_interval(thr[:-1]).to_json()["relative_half_width"] > s["target_ci"]
        else:
            assert n == s["max_batches"]
        assert ci["low"] <= c["summary"]["output_throughput"] <= ci["high"]


def test_real_sweep_ragged_random_output_cells_get_rows_and_say_off(new_doc):
    ms = _thr(new_doc)
    ragged = [m for m in ms.values() if m.workload == "random-output" and m.k > 0 and m.ragged_drafts]
    assert ragged, "the random-output cells of a real ngram sweep are ragged"
    a, recs = _recs(new_doc)
    wls = {wl for wl, _ in recs}
    assert wls == {"copy", "random-output", "*"}  # every workload, and all workloads
    for c in (1, 4):
        r = recs[("random-output", c)]
        assert r.k is not None and r.reason is None
        # scored by the paired ratios of the measured batches: the baseline and every ngram k
        assert set(r.measured_ks) == {0, 2, 4}
        for k in (2, 4):
            assert r.scores[f"k={k}"] == pytest.approx(_paired(new_doc, f"ngram-k{k}", "random-output", c), rel=1e-12)
        assert r.scores["off"] == 1.0
        best = max(r.scores, key=r.scores.get)
        if best == "off":
            assert r.k == 0  # speculation off where the baseline is best
    # a measured k beyond the cell's per-position curve (ngram's drafts there never reached k tokens,
    # so the exact per-request curve is shorter than k) keeps its measurement, without a prediction
    beyond = {(p.concurrency, p.k) for p in a.throughput if p.workload == "random-output" and p.curve_basis == "beyond_curve"}
    assert (4, 4) in beyond
    assert all(p.measured == ms[(f"ngram-k{p.k}", "random-output", p.concurrency)].output_throughput for p in a.throughput
               if p.workload == "random-output" and p.curve_basis == "beyond_curve")
    # what-if k (not run) are never shown as measured
    assert all(p.measured is None for p in a.throughput if p.k in (1, 3))


def _combined(doc, config, c, w) -> float:
    """Batch by batch: S_i = 1 / Σ v_w / r_w,i (v_w: the workload's share of the baseline's time,
    w_w / mean baseline throughput, normalised), then exp(mean log S_i)."""
    base = {wl: statistics.fmean(_batches(doc, "baseline", wl, c).values()) for wl in w}
    v = {wl: w[wl] / base[wl] for wl in w}
    tot = sum(v.values())
    ratios = {wl: (_batches(doc, config, wl, c), _batches(doc, "baseline", wl, c)) for wl in w}
    idx = sorted(set.intersection(*(set(a) & set(b) for a, b in ratios.values())))
    logs = [-math.log(sum(v[wl] / tot / (ratios[wl][0][i] / ratios[wl][1][i]) for wl in w)) for i in idx]
    return math.exp(statistics.fmean(logs))


def test_real_sweep_all_workloads_is_the_combination_through_time(new_doc):
    _, recs = _recs(new_doc)
    w = {"copy": 1.0, "random-output": 1.0}
    for c in (1, 4):
        star = recs[("*", c)]
        assert star.combination.startswith("time, equal work")
        for k in (2, 4):
            # equal output tokens from each workload: total baseline time / total time with k, batch by batch
            assert star.scores[f"k={k}"] == pytest.approx(_combined(new_doc, f"ngram-k{k}", c, w), rel=1e-9)
            # between the per-workload speedups (a weighted harmonic mean of them, batch by batch)
            per = [recs[(wl, c)].scores[f"k={k}"] for wl in w]
            assert min(per) * 0.8 < star.scores[f"k={k}"] < max(per) * 1.2
            cand = next(x for x in star.pick.candidates if x.name == f"k={k}")
            assert cand.has_interval and 0 < cand.lower <= cand.value <= cand.upper  # log scale: positive
        if max(star.scores[f"k={k}"] for k in (2, 4)) < 1 * (1 - star.tolerance):
            assert star.k == 0  # below off at every k: off


def test_real_sweep_picks_follow_the_rule(new_doc):
    """Every row: the pick is the best estimate, or a smaller k within the tolerance of it; never
    a smaller k or off because intervals overlap; every printed interval positive."""
    _, recs = _recs(new_doc)
    for r in recs.values():
        if r.k is None:
            continue
        best = max((x for x in r.pick.candidates if not x.never_accepted), key=lambda x: x.value)
        assert r.pick.pick.value >= best.value * (1 - r.tolerance)
        assert r.tie == (r.pick.pick.name != best.name)
        for x in r.pick.candidates:
            assert x.lower is None or 0 < x.lower <= x.value <= x.upper


def test_real_sweep_noise_in_a_smaller_k_never_turns_the_pick_into_it(new_doc, tmp_path):
    """Widen k=2's batches around the same geometric mean: its paired interval now overlaps
    k=4's, yet the pick stays k=4, the better estimate, and says it cannot tell them apart (the
    overlap rule turned this into k=2, "tie")."""
    doc = copy.deepcopy(new_doc)
    _, recs = _recs(doc)
    wl, c = "copy", 1
    assert recs[(wl, c)].config == "k=4"
    cell = next(x for x in doc["cells"] if x["config"] == "ngram-k2" and x["workload"] == wl and x["max_concurrency"] == c)
    measured = [b for b in cell["batches"] if not b["warmup"]]
    for j, b in enumerate(measured[:2]):
        b["output_throughput"] *= (0.2, 1 / 0.2)[j]
    cell["summary"]["output_throughput_per_batch"] = [b["output_throughput"] for b in measured]
    _, recs2 = _recs(doc)
    r2 = recs2[(wl, c)]
    assert r2.config == "k=4" and not r2.tie
    k2 = next(x for x in r2.pick.candidates if x.name == "k=2")
    assert k2.upper > r2.pick.pick.lower  # the two intervals overlap (the old rule's "tie")
    r = CliRunner().invoke(advise_cmd, [str(_write(doc, tmp_path / "tie.json"))])
    assert r.exit_code == 0 and "tie:" not in r.output


def _write(doc, path: Path) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_advise_json_carries_the_format_key_in_both_modes(tmp_path):
    """``advise --json`` names its format as the other result files do (specwatch_advice_format),
    from a sweep result (beside its advise_format) and from live data."""
    from specwatch.choosek.advise import ADVICE_FORMAT_KEY, ADVISE_FORMAT, LiveAdviceResult, advice_document, live_advices

    out = tmp_path / "a.json"
    r = CliRunner().invoke(advise_cmd, [str(NEW), "--json", str(out)])
    assert r.exit_code == 0, r.output
    j = json.loads(out.read_text())
    assert ADVICE_FORMAT_KEY == "specwatch_advice_format" and list(j)[:2] == ["source", ADVICE_FORMAT_KEY]
    assert j[ADVICE_FORMAT_KEY] == j["advise_format"] == ADVISE_FORMAT == 3
    items = tuple(live_advices({("spec", "m", "0"): (0.9, 0.8)}, (1, 8), None, 0.02, None))
    live = LiveAdviceResult(source="http://x/metrics", items=items, concurrencies=(1, 8), tolerance=0.02, profile=None,
                            profile_path=None, method=None, drafter=None)
    doc = advice_document(live)
    assert doc == {ADVICE_FORMAT_KEY: 3, **live.to_json()} and list(doc)[:2] == ["source", ADVICE_FORMAT_KEY]


def test_report_on_live_advice_json_says_what_the_file_is(tmp_path):
    """``specwatch report`` given ``advise --exporter … --json``'s file (no advise_format key, only
    specwatch_advice_format) names it, as it names the sweep-mode advice file."""
    from specwatch.choosek.advise import LiveAdviceResult, advice_document, live_advices
    from specwatch.choosek.cli import report as report_cmd

    items = tuple(live_advices({("spec", "m", "0"): (0.9, 0.8)}, (1, 8), None, 0.02, None))
    live = LiveAdviceResult(source="http://x/metrics", items=items, concurrencies=(1, 8), tolerance=0.02, profile=None,
                            profile_path=None, method=None, drafter=None)
    path = _write(advice_document(live), tmp_path / "live-advice.json")
    r = CliRunner().invoke(report_cmd, [str(path), "--output", str(tmp_path / "r.html")])
    assert r.exit_code != 0 and "specwatch advise's JSON (--json)" in r.output, r.output


def test_real_sweep_advise_cli_lists_every_workload_and_json_format(new_doc, tmp_path):
    out = tmp_path / "a.json"
    r = CliRunner().invoke(advise_cmd, [str(NEW), "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "random-output" in r.output and "all workloads" in r.output and "combined through time" in r.output
    j = json.loads(out.read_text())
    assert j["advise_format"] == 3
    fam = next(f for f in j["families"] if "ngram" in f["family"])
    rows = {(x["workload"], x["concurrency"]) for x in fam["recommendations"]}
    assert rows == {(wl, c) for wl in ("copy", "random-output", "*") for c in (1, 4)}
    for x in fam["recommendations"]:  # workload, concurrency, k, and the pick of the one rule
        assert {"workload", "concurrency", "k", "config", "reason", "batches", "tie", "pick"} <= set(x)
        assert "intervals" not in x and "tied" not in x
        if x["k"] is not None:
            assert x["pick"]["pick"] == x["config"] and x["pick"]["text"] in r.output.replace("\n", " ") or x["pick"]["text"]


def test_mix_changes_the_all_workloads_weights(new_doc, tmp_path):
    ms = _thr(new_doc)
    _, recs = _recs(new_doc, mix={"copy": 3.0, "random-output": 1.0})
    star = recs[("*", 1)]
    assert star.combination == "time, mix copy=3, random-output=1"
    spec = {wl: ms[("ngram-k4", wl, 1)].output_throughput for wl in ("copy", "random-output")}
    base = {wl: ms[("baseline", wl, 1)].output_throughput for wl in ("copy", "random-output")}
    w = {"copy": 3.0, "random-output": 1.0}
    assert star.scores["k=4"] == pytest.approx(_combined(new_doc, "ngram-k4", 1, w), rel=1e-9)
    # near the ratio of the mean throughputs combined through time (what the mix means)
    assert star.scores["k=4"] == pytest.approx(sum(w[x] / base[x] for x in w) / sum(w[x] / spec[x] for x in w), rel=0.1)
    r = CliRunner().invoke(advise_cmd, [str(NEW), "--mix", "copy=3,random-output=1"])
    assert r.exit_code == 0 and "mix copy=3, random-output=1" in r.output
    # traffic that is mostly random-like: the combination through time is below 1 at every k: off
    # (the older real sweep, where every ngram k loses on random-output)
    _, recs = _recs(sweep_document(OLD), mix={"copy": 1.0, "random-output": 20.0})
    stars = [r for (wl, _), r in recs.items() if wl == "*"]
    assert len(stars) == 4
    for star in stars:
        assert max(v for k, v in star.scores.items() if k != "off") < 1
        assert star.k == 0 and star.speedup == 1.0 and star.config == "off"
        assert star.pick.runner_up.name in recommendation_note(star)


@pytest.mark.parametrize("mix, msg", [("copy=3,explain=1", "unknown workload 'explain'"),
                                      ("copy=0,random-output=1", "positive"),
                                      ("copy=-1", "positive"), ("copy=abc", "not a number"),
                                      ("copy", "WORKLOAD=WEIGHT"), ("copy=nan", "positive")])
def test_bad_mix_is_one_line_exit_2(mix, msg):
    r = CliRunner().invoke(advise_cmd, [str(OLD), "--mix", mix])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and msg in lines[0] and "--mix" in lines[0]


@pytest.mark.parametrize("value", ["0", "1", "1.5", "-0.1"])
def test_target_ci_outside_0_1_is_one_line_exit_2(value, tmp_path):
    r = CliRunner().invoke(sweep_cmd, ["--target-ci", value, "--result-file", str(tmp_path / "s.json")])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "--target-ci must be in (0, 1)" in lines[0]
    assert not (tmp_path / "s.json").exists()


# ------------------------------------------------------------------------------- the old real sweep (no intervals stored)
def test_old_result_file_loads_with_intervals_from_its_batches():
    doc = sweep_document(OLD)
    assert not any("output_throughput_ci95" in c["summary"] for c in doc["cells"])
    ms = _thr(doc)
    m = ms[("ngram-k4", "copy", 1)]
    lo, hi = m.interval
    ci = throughput_interval(m.batch_throughputs).to_json()
    assert (lo, hi) == (ci["low"], ci["high"]) and lo < m.output_throughput < hi
    _, recs = _recs(doc)
    assert all(r.batches and set(r.batches.values()) == {2} for r in recs.values() if r.workload != "*")
    # cut every cell to one measured batch: a value, no interval, said so
    one = copy.deepcopy(doc)
    for c in one["cells"]:
        c["summary"]["output_throughput_per_batch"] = c["summary"]["output_throughput_per_batch"][:1]
        first = min(b["batch_index"] for b in c["batches"] if not b["warmup"])
        c["batches"] = [b for b in c["batches"] if b["warmup"] or b["batch_index"] == first]
    a, recs1 = _recs(one)
    r = recs1[("copy", 1)]
    assert not r.tie and r.one_batch == ("k=2", "k=4") and r.interval is None
    assert r.k == 4 and r.verdict == "cannot_tell"  # the best value; without an interval it cannot tell
    from rich.console import Console

    from specwatch.choosek.advise import render_advice
    con = Console(width=250, record=True)
    render_advice(a, con)
    text = con.export_text()
    assert "1 batch (no interval): k=2, k=4" in text and "(1 batch: no interval)" in text


# ------------------------------------------------------------------------------- rows that cannot be scored
def test_every_measured_cell_gets_a_row_and_unscorable_rows_say_why():
    doc = sweep_document(OLD)
    doc = copy.deepcopy(doc)
    for c in doc["cells"]:  # ngram's random-output c=4 cells failed: not scorable, row kept with the reason
        if c["config"].startswith("ngram") and c["workload"] == "random-output" and c["max_concurrency"] == 4:
            c["summary"]["failed"] = c["summary"]["completed"]
            c["summary"]["completed"] = 0
    _, recs = _recs(doc)
    r = recs[("random-output", 4)]
    assert r.k is None and "requests failed" in r.reason and "ngram-k2" in r.reason
    star = recs[("*", 4)]
    assert star.k is None and "random-output" in star.reason  # never all workloads from copy alone
    assert recs[("*", 1)].k is not None
    # the draft_model family measured the same cells: its rows are there too
    (d,) = [x for x in advise_sweep(sweep_record(doc)) if "draft_model" in x.family]
    assert {(r.workload, r.concurrency) for r in d.recommendations} == {
        (wl, c) for wl in ("copy", "random-output", "*") for c in (1, 2, 4, 8)}


def test_a_family_that_skipped_a_cell_the_baseline_measured_says_so():
    doc = copy.deepcopy(sweep_document(OLD))
    doc["cells"] = [c for c in doc["cells"] if not (c["config"] == "draft_model-k3" and c["max_concurrency"] == 8)]
    (d,) = [x for x in advise_sweep(sweep_record(doc)) if "draft_model" in x.family]
    recs = {(r.workload, r.concurrency): r for r in d.recommendations}
    assert recs[("copy", 8)].k is None and "no draft_model run was measured here" in recs[("copy", 8)].reason


# ------------------------------------------------------------------------------- the maths
def test_combine_by_time_is_the_harmonic_mean_for_equal_baselines():
    # the GPU example: copy 2.57x and random-output 0.36x of the same baseline -> 0.63x
    comb_k, _ = combine_by_time({"copy": 2.57, "ro": 0.36}, {"copy": 1, "ro": 1})
    comb_0, _ = combine_by_time({"copy": 1.0, "ro": 1.0}, {"copy": 1, "ro": 1})
    assert comb_k / comb_0 == pytest.approx(2 / (1 / 2.57 + 1 / 0.36)) == pytest.approx(0.6315, abs=1e-4)
    # arithmetic (1.47) and geometric (0.96) means would both be wrong here
    # the half width propagates to first order
    c, h = combine_by_time({"a": 100.0, "b": 50.0}, {"a": 1, "b": 1}, {"a": 10.0, "b": 0.0})
    t = 0.5 / 100 + 0.5 / 50
    assert c == pytest.approx(1 / t) and h == pytest.approx((0.5 * 10 / 100 ** 2) / t ** 2)
    with pytest.raises(KChoiceError):
        combine_by_time({"a": 0.0}, {"a": 1})


def test_parse_mix():
    assert parse_mix("copy=3, random-output=1", ["copy", "random-output"]) == {"copy": 3.0, "random-output": 1.0}
    for bad in ("copy=1,copy=2", "", "x=1", "copy=inf"):
        with pytest.raises(KChoiceError):
            parse_mix(bad, ["copy"])


def _p(wl, k, thr, iv=None, basis="exact"):
    return ThroughputPrediction(wl, 1, k, thr, thr, 1.0, 0.0, None, None, basis, iv, 3 if iv else 1)


def test_predictions_alone_decide_by_the_tolerance_only():
    """Without measurements (nothing to pair) every measured k is a candidate with its ratio and
    no interval: the 2 % tolerance is the only tie."""
    r = recommend([_p("copy", 0, 100.0), _p("copy", 2, 110.0), _p("copy", 4, 118.0)], 0.02, "measured", "measured")[0]
    assert (r.k, r.tie, r.pick.certain) == (4, False, False)
    r = recommend([_p("copy", 0, 100.0), _p("copy", 2, 117.0), _p("copy", 4, 118.0)], 0.02, "measured", "measured")[0]
    assert (r.k, r.tie, r.best_k) == (2, True, 4)


# ------------------------------------------------------------------------------- noise-aware sweep cells (stub server)
def _plan(**kw) -> SweepPlan:
    return SweepPlan(build_configs((2,), (), True), ("copy",), (1,), 8, None, 1, 2, 1, 0, **{"paired": False, **kw})


def test_noise_aware_cells_repeat_batches_until_the_target_or_the_cap(tmp_path, stub):
    template, _ = stub
    msgs: list[str] = []
    # an unreachable target: every cell runs the cap, says so, and stores its interval
    doc = run_sweep(_plan(target_ci=1e-9, max_batches=4), tmp_path / "a.json", template=template, lock=False,
                    progress=False, echo=lambda m, **_: msgs.append(m)).to_json()
    for c in doc["cells"]:
        assert c["summary"]["num_batches"] == 4 and len([b for b in c["batches"] if not b["warmup"]]) == 4
        ci = c["summary"]["output_throughput_ci95"]
        assert ci["batches"] == 4 and ci["low"] <= c["summary"]["output_throughput"] <= ci["high"]
    assert sum("(95 %, 4 batches; target 1e-07 % not reached)" in m for m in msgs) == 2, msgs
    # a reachable target: each cell stops at the first batch count whose interval is within it
    doc = run_sweep(_plan(target_ci=0.3, max_batches=12), tmp_path / "b.json", template=template, lock=False,
                    progress=False, echo=lambda *a, **k: None).to_json()
    for c in doc["cells"]:
        thr = c["summary"]["output_throughput_per_batch"]
        n = len(thr)
        assert 2 <= n <= 12
        firsts = [j for j in range(2, n + 1) if throughput_interval(thr[:j]).to_json()["relative_half_width"] <= 0.3]
        assert firsts[:1] == ([n] if n < 12 else firsts[:1])  # no batch more than the target needs
    assert doc["settings"]["target_ci"] == 0.3 and doc["settings"]["max_batches"] == 12


def test_resumed_noise_aware_sweep_keeps_its_cells_and_old_files_resume(tmp_path, stub):
    template, log = stub
    out = tmp_path / "s.json"
    doc = run_sweep(_plan(target_ci=0.5, max_batches=3), out, template=template, lock=False, progress=False,
                    echo=lambda *a, **k: None).to_json()
    before = {(c["config"], c["workload"]): c["finished_at"] for c in doc["cells"]}
    plan2 = SweepPlan(build_configs((2, 4), (), True), ("copy",), (1,), 8, None, 1, 2, 1, 0, target_ci=0.5, max_batches=3,
                      paired=False)
    doc2 = run_sweep(plan2, out, template=template, lock=False, progress=False, echo=lambda *a, **k: None).to_json()
    for c in doc2["cells"]:
        if (c["config"], c["workload"]) in before:
            assert c["finished_at"] == before[(c["config"], c["workload"])]
    assert len(doc2["cells"]) == 3
    # another target is another measurement: refused, nothing lost
    text = out.read_text()
    from specwatch.choosek.resultfile import SweepError
    with pytest.raises(SweepError, match="target_ci"):
        run_sweep(_plan(target_ci=0.1, max_batches=3), out, template=template, lock=False, progress=False,
                  echo=lambda *a, **k: None)
    assert out.read_text() == text
    # a file written before noise-aware cells (no target_ci/max_batches settings) resumes and keeps its cells
    old = json.loads(text)
    for key in ("target_ci", "max_batches"):
        old["settings"].pop(key)
    for c in old["cells"]:
        c["summary"].pop("output_throughput_ci95")
    out.write_text(json.dumps(old))
    doc3 = run_sweep(_plan(target_ci=0.05, max_batches=3), out, template=template, lock=False, progress=False,
                     echo=lambda *a, **k: None).to_json()
    assert len(doc3["cells"]) == 3 and all("output_throughput_ci95" not in c["summary"] for c in doc3["cells"])
    assert all(m.interval is not None for m in measurements(sweep_record(doc3)))


def test_max_batches_below_num_batches_is_one_line_exit_2(tmp_path):
    r = CliRunner().invoke(sweep_cmd, ["--num-batches", "3", "--max-batches", "2", "--result-file", str(tmp_path / "s.json")])
    assert r.exit_code == 2
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "--max-batches (2) must be >= --num-batches (3)" in lines[0]
