"""Cost profiles (specdecode.costprofile), speedups with their basis (specdecode.speedup) and the
calibration sources (choosek.calibrate), on hand-checkable numbers and the shipped profiles."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from specwatch.choosek.calibrate import CalibrationError, profile_from_forward
from specwatch.choosek.cli import calibrate
from specwatch.specdecode.costprofile import (
    CALIBRATED,
    DEFAULT,
    EXTRAPOLATED,
    MEASURED,
    PROFILE,
    CostProfileError,
    SpeculativeCurve,
    StepPoint,
    default_step_cost_ratio,
    load_profile,
    make_profile,
    profile_from_dict,
)
from specwatch.specdecode.speedup import LiveCost, current_speedup, profile_error_ratio, speedups, upper_rates
from specwatch.specdecode.steptime import StepTimes

PROFILES = Path(__file__).resolve().parents[2] / "exporter" / "specwatch" / "data" / "cost-profiles"
PROV = {"hardware": "test", "model": "m", "served_model_name": "m", "source": "test", "how": "by hand"}


def simple_profile():
    """t0(b) = 10 ms + 1 ms × b; ngram t(b, k) = t0 × (1 + 0.1 k) measured at k = 2 and 4."""
    bs = (1.0, 2.0, 4.0, 8.0)
    plain = [StepPoint(b, 0.010 + 0.001 * b) for b in bs]
    curves = [SpeculativeCurve("ngram", None, k, tuple(StepPoint(b, (0.010 + 0.001 * b) * (1 + 0.1 * k)) for b in bs))
              for k in (2, 4)]
    return make_profile("t", PROV, plain, curves)


def test_lookups_interpolate_and_say_when_they_extrapolate():
    p = simple_profile()
    assert p.plain_step(4).seconds == pytest.approx(0.014) and p.plain_step(4).basis == PROFILE
    assert p.plain_step(3).seconds == pytest.approx(0.013)  # linear between 2 and 4
    assert p.speculative_step(4, 3).seconds == pytest.approx(0.014 * 1.3)  # linear in k between 2 and 4
    assert p.speculative_step(4, 3).basis == PROFILE
    far = p.plain_step(32)
    assert far.basis == EXTRAPOLATED and far.seconds == pytest.approx(0.010 + 0.032)  # the end segment's line
    assert p.speculative_step(4, 8).basis == EXTRAPOLATED
    assert p.speculative_step(4, 8).seconds == pytest.approx(0.014 * 1.8)  # the line through k = 2 and 4
    assert p.speculative_step(4, 1).seconds == pytest.approx(0.014 * 1.1)
    assert p.speculative_step(4, 3, method="draft_model") is None
    # the relative cost c = t / t0 (what travels between machines), at any b
    assert p.cost_ratio(4, 4).seconds == pytest.approx(1.4) and p.cost_ratio(1, 2).seconds == pytest.approx(1.2)
    assert p.plain_step(1.1).basis == PROFILE and p.plain_step(0.5).basis == EXTRAPOLATED


def test_profile_round_trips_through_yaml(tmp_path):
    p = simple_profile()
    f = tmp_path / "p.yaml"
    f.write_text(p.dumps())
    q = load_profile(f)
    assert q.plain == p.plain and q.speculative == p.speculative and q.name == "t"
    assert q.provenance["served_model_name"] == "m" and "measured_at" in q.provenance


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(specwatch_cost_profile=3), "specwatch_cost_profile"),
    (lambda d: d.pop("points_total"), "points_total"),
    (lambda d: d.update(points_total=d["points_total"] - 1), "points_total"),
    (lambda d: d["speculative"][0]["points"].pop(), "points_total"),
    (lambda d: d["speculative"][0].update(spread=-0.1), "speculative[0].spread"),
    (lambda d: d["speculative"][0]["points"][0].update(cost_ratio=0), "speculative[0].points[0].cost_ratio"),
    (lambda d: d.pop("plain"), "plain"),
    (lambda d: d["plain"][0].update(step_seconds=-0.01), "plain[0].step_seconds"),
    (lambda d: d["plain"][1].update(step_seconds=float("nan")), "plain[1].step_seconds"),
    (lambda d: d["plain"][1].update(step_seconds=0), "plain[1].step_seconds"),
    (lambda d: d["plain"][0].update(step_seconds="fast"), "plain[0].step_seconds"),
    (lambda d: d["speculative"][0].update(k=0), "speculative[0].k"),
    (lambda d: d["speculative"][1]["points"][0].pop("running_requests"), "speculative[1].points[0].running_requests"),
    (lambda d: d["provenance"].pop("hardware"), "provenance.hardware"),
    (lambda d: d["plain"].append(dict(d["plain"][0])), "plain"),
])
def test_bad_profiles_name_the_file_and_the_field(tmp_path, mutate, field):
    doc = yaml.safe_load(simple_profile().dumps())
    mutate(doc)
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(doc))
    with pytest.raises(CostProfileError) as info:
        load_profile(f)
    msg = str(info.value)
    assert msg.startswith(f"{f}: ") and field in msg and "\n" not in msg


def test_unreadable_profiles(tmp_path):
    with pytest.raises(CostProfileError, match="no such cost profile"):
        load_profile(tmp_path / "missing.yaml")
    (tmp_path / "x.yaml").write_text("a: [1,\n")
    with pytest.raises(CostProfileError, match=r"not valid YAML \(line"):
        load_profile(tmp_path / "x.yaml")
    with pytest.raises(CostProfileError, match="not a specwatch cost profile"):
        profile_from_dict([1, 2], "list.yaml")


def test_shipped_profiles_load_and_the_h200_reference_matches_its_table():
    names = sorted(p.name for p in PROFILES.glob("*.yaml"))
    assert "h200-llama-8b-forward-only.yaml" in names
    for path in PROFILES.glob("*.yaml"):
        assert load_profile(path).provenance["source"]
    h200 = load_profile(PROFILES / "h200-llama-8b-forward-only.yaml")
    assert h200.forward_only
    # the reference table: c(4, 64) = 1.23 and c(8, 128) = 1.62 on an H200 (forward pass only)
    assert h200.speculative_step(64, 4).seconds / h200.plain_step(64).seconds == pytest.approx(1.23, abs=0.005)
    assert h200.speculative_step(128, 8).seconds / h200.plain_step(128).seconds == pytest.approx(1.62, abs=0.005)
    # the case: 64 running requests, mean acceptance length 3 at k = 4: ~2.4x on the forward pass,
    # where the built-in guess says speculation loses
    rates = (0.8, 0.6, 0.4, 0.2)  # E(4) = 3.0
    sp = speedups(rates, LiveCost(profile=h200, running_requests_fallback=64))
    assert sp[4].basis == PROFILE and sp[4].value == pytest.approx(3.0 / 1.23, rel=0.01)
    guess = speedups(rates, LiveCost(running_requests_fallback=64))
    assert guess[4].basis == DEFAULT and guess[4].value < 1


def test_speedup_bases():
    p = simple_profile()
    rates = (0.9, 0.8, 0.7, 0.6)
    # live: 4 requests per step, a request decodes at 200 tok/s with the spec server
    step = StepTimes(step_duration_seconds=0.02, running_requests_per_step=4.0, request_decode_tokens_per_second=200.0,
                     engine_steps=100, request_steps=400)
    sp = speedups(rates, LiveCost(step=step, draft_share=1.0, profile=p))
    # the server's own k without a baseline: calibrated, v × t / c (the live step over the profile's
    # relative cost; a uniformly slower machine cancels), never "measured"
    assert sp[4].basis == CALIBRATED
    assert sp[4].value == pytest.approx(200.0 * 0.02 / 1.4)
    assert sp[4].lower < sp[4].value < sp[4].upper
    e2 = 1 + 0.9 + 0.8
    assert sp[2].basis == PROFILE and sp[2].value == pytest.approx(e2 / 1.2)
    # half the request-steps carried a draft: τ(k') = 1 + s (E(k') − 1)
    half = speedups(rates, LiveCost(step=step, draft_share=0.5, profile=p))
    # what-ifs are anchored on the server's own k (issue #36): its live speedup over the model's,
    # here the live 4 tokens per step against the model's τ(4) = 1 + 0.5 × 3 = 2.5
    anchor = half[4].value / ((1 + 0.5 * (1 + 0.9 + 0.8 + 0.7 + 0.6 - 1)) / 1.4)
    assert anchor == pytest.approx(1.6)
    assert half[2].value == pytest.approx(anchor * (1 + 0.5 * (e2 - 1)) / 1.2)
    # a baseline server's live decode speed: measured (both sides live)
    with_base = speedups(rates, LiveCost(step=step, profile=p, baseline_decode_tokens_per_second=80.0))
    assert with_base[4].value == pytest.approx(2.5) and with_base[4].basis == MEASURED
    # no profile, no baseline: the built-in guess, labelled default, even for the current k
    guess = speedups(rates, LiveCost(step=step))
    assert {v.basis for v in guess.values()} == {DEFAULT}
    assert guess[4].value == pytest.approx((1 + sum(rates)) / default_step_cost_ratio(4, 4.0))
    # b outside the profile: extrapolated, even the server's k
    far = StepTimes(0.05, 30.0, 60.0, 100, 3000)
    assert {v.basis for v in speedups(rates, LiveCost(step=far, profile=p)).values()} == {EXTRAPOLATED}
    # too few engine steps for an interval: no live speedup for the server's k
    few = StepTimes(0.02, 4.0, 200.0, 5, 20)
    assert current_speedup(LiveCost(step=few, profile=p), 4) is None


def test_speedup_is_a_request_time_ratio_with_prefill():
    """S = (P_b + D t0) / (P + I): prefill time counts on both sides, so the live speedup compares
    with a client's output-throughput ratio (the decode-only ratio overstates copy at c = 1 by
    10-20 % in the real sweep)."""
    p = simple_profile()
    # 1000 decode tokens in 250 request-steps of 20 ms (5 s), 10 requests with 0.1 s TTFT each
    step = StepTimes(0.02, 4.0, 1000 / 5.0, 100, 250, decode_tokens=1000.0, itl_seconds=5.0, prefill_seconds=1.0,
                     first_tokens=10.0)
    got = current_speedup(LiveCost(step=step, profile=p), 4)
    t0 = 0.02 / 1.4
    assert got.value == pytest.approx((1.0 + 1000 * t0) / (1.0 + 5.0))
    assert got.value < 1000 * t0 / 5.0  # the decode-only ratio
    # with a baseline server: its own mean TTFT for the same requests
    base = StepTimes(0.015, 4.0, 1 / 0.015, 400, 1600, decode_tokens=1600.0, itl_seconds=24.0, prefill_seconds=0.4,
                     first_tokens=5.0)
    m = current_speedup(LiveCost(step=step, profile=p, baseline=base), 4)
    assert m.basis == MEASURED and m.value == pytest.approx((0.08 * 10 + 1000 * 0.015) / 6.0)


def test_intervals_widen_with_drift_mismatch_and_forward_only_and_ragged_curves_raise_the_upper_end():
    p = simple_profile()
    rates = (0.9, 0.8, 0.7, 0.6)

    def width(step, **kw):
        v = speedups(rates, LiveCost(step=step, profile=p, **kw), current_k=4)
        return v[4].upper / v[4].lower, v

    on = StepTimes(0.014 * 1.4, 4.0, 4.4 / (0.014 * 1.4), 400, 1600)  # the profile's own step: drift 1
    off = StepTimes(2 * 0.014 * 1.4, 4.0, 4.4 / (2 * 0.014 * 1.4), 400, 1600)  # 2x slower machine
    w_on, v_on = width(on)
    w_off, v_off = width(off)
    assert profile_error_ratio(LiveCost(step=off, profile=p), 4) == pytest.approx(2.0)
    assert v_on[4].value == pytest.approx(v_off[4].value)  # relative cost: the slower machine cancels
    assert w_off > w_on > 1
    w_mm, _ = width(on, profile_model_mismatch=True)
    assert w_mm > 2.5  # another model's profile: never a confident number
    # a ragged curve: the what-if upper ends count every never-drafted position as accepted
    ragged = speedups(rates, LiveCost(step=on, profile=p, missing_ratio=0.05), current_k=4)
    assert ragged[2].upper > v_on[2].upper and ragged[2].lower == pytest.approx(v_on[2].lower)
    assert upper_rates(rates, 4, 0.05) == pytest.approx((1.0, 1.0, 0.9, 0.8))
    fwd = make_profile("f", dict(PROV, forward_only=True), p.plain, p.speculative)
    fo = speedups(rates, LiveCost(step=on, profile=fwd), current_k=4)
    assert fo[2].upper == pytest.approx(fo[2].value) and fo[2].lower < fo[2].value / 10  # a bound, not a number


def test_decisions_by_the_one_rule():
    """speedup.pick: the best estimate, with its confidence; an uncertain pick is served, never
    withheld (issue #36; the three-scenario choose/recommend are gone)."""
    from specwatch.specdecode.speedup import Speedup, pick

    sure = {1: Speedup(1.5, PROFILE, 1.4, 1.6), 2: Speedup(1.8, PROFILE, 1.7, 1.9), 3: Speedup(1.6, PROFILE, 1.5, 1.7)}
    p = pick(sure)
    assert p.k == 2 and p.runner_up.name == "k=3" and not p.versus_runner_up.paired
    assert pick({1: Speedup(1.02, CALIBRATED, 0.8, 1.3)}).k == 0  # within 2 % of off: off wins the tie
    unsure = {1: Speedup(1.05, CALIBRATED, 0.8, 1.3)}
    p = pick(unsure)
    assert p.k == 1 and not p.certain and p.verdict == "cannot_tell"  # the better estimate, said uncertain
    loses = {1: Speedup(0.6, CALIBRATED, 0.5, 0.7), 2: Speedup(0.5, PROFILE, 0.4, 0.6)}
    assert pick(loses).k == 0 and pick(loses).verdict == "loses"
    assert sure[2].estimate.verdict == "pays" and loses[1].estimate.verdict == "loses"
    assert unsure[1].estimate.verdict == "cannot_tell"
    within = pick({1: Speedup(1.5, MEASURED, 1.4, 1.6), 2: Speedup(1.52, PROFILE, 1.4, 1.6),
                   3: Speedup(1.2, EXTRAPOLATED, 1.1, 1.3)})
    assert within.k == 1 and within.tie and within.basis == PROFILE  # 1.5 is within 2 % of 1.52: the smaller k
    with pytest.raises(ValueError):
        pick({})


def test_drift_ratio():
    p = simple_profile()
    step = StepTimes(0.014 * 1.4 * 1.3, 4.0, 100.0, 10, 40)
    assert profile_error_ratio(LiveCost(step=step, profile=p), 4) == pytest.approx(1.3)
    assert profile_error_ratio(LiveCost(step=StepTimes(0.028, 4.0, 30.0, 1, 4), profile=p), 0) == pytest.approx(2.0)
    assert profile_error_ratio(LiveCost(step=step), 4) is None
    assert profile_error_ratio(LiveCost(step=step, profile=p, method="eagle"), 4) is None


# vllm bench forward --output-json: the shape vLLM 0.33.0 writes (vllm/benchmarks/forward/main.py:
# a list of {"case", "requests": [asdict(BenchRequest)], "median_us", "ranks"}); constructed here.
def _forward_case(name, b, k, median_us, kv=4096):
    req = {"query_len": 1 + k, "kv_len": kv, "num_draft_tokens": k, "chunked": False}
    return {"case": name, "requests": [req] * b, "median_us": median_us, "ranks": [{}]}


def test_calibrate_from_vllm_bench_forward(tmp_path):
    doc = [_forward_case("d1", 1, 0, 4740.0), _forward_case("d64", 64, 0, 18290.0),
           _forward_case("v1", 1, 4, 4977.0), _forward_case("v64", 64, 4, 22497.0),
           {"case": "prefill", "requests": [{"query_len": 8192, "kv_len": 8192, "num_draft_tokens": 0}], "median_us": 9e4}]
    p = profile_from_forward(doc, name="gpu", method="eagle", provenance={"hardware": "H200", "model": "llama-8b"})
    assert p.forward_only and [x.running_requests for x in p.plain] == [1.0, 64.0]
    assert p.speculative_step(64, 4, "eagle").seconds / p.plain_step(64).seconds == pytest.approx(22497 / 18290)
    f = tmp_path / "fwd.json"
    f.write_text(json.dumps(doc))
    out = tmp_path / "gpu.yaml"
    r = CliRunner().invoke(calibrate, ["--from-forward-json", str(f), "-o", str(out), "--method", "eagle",
                                       "--hardware", "H200", "--model", "llama-8b"])
    assert r.exit_code == 0, r.output
    assert load_profile(out).provenance["source"] == "vllm-bench-forward"
    with pytest.raises(CalibrationError):
        profile_from_forward({"not": "a list"}, name="x", method="m", provenance={})
    r = CliRunner().invoke(calibrate, ["--from-forward-json", str(f), "-o", str(out)])
    assert r.exit_code == 2 and "--method" in r.output


def test_calibrate_flag_errors(tmp_path):
    r = CliRunner().invoke(calibrate, ["-o", str(tmp_path / "x.yaml")])
    assert r.exit_code == 2 and "exactly one source" in r.output
    r = CliRunner().invoke(calibrate, ["--baseline-url", "http://127.0.0.1:1", "-o", str(tmp_path / "x.yaml")])
    assert r.exit_code == 2 and "--url" in r.output
    assert math.isfinite(default_step_cost_ratio(4, 64))


SWEEP = Path(__file__).resolve().parents[1] / "fixtures" / "sweeps" / "embedded-ngram-draft-sweep.json"


def test_calibrate_from_a_real_sweep(tmp_path):
    """The shipped CPU profile is what `specwatch calibrate` makes of the real sweep it came from
    (format 2): one plain point per baseline cell (its server-measured step time and b, its context),
    one speculative point per cell with c = t / t0 against the baseline cell of the same workload and
    concurrency and x = draft tokens / request-steps; a draft model's step costs several plain steps,
    ngram on random output (x near 0) much less than on copy (x = k)."""
    from records import sweep_document

    doc = sweep_document(SWEEP)
    out = tmp_path / "cpu.yaml"
    r = CliRunner().invoke(calibrate, ["--from-sweep", str(SWEEP), "-o", str(out), "--name", "t"])
    assert r.exit_code == 0, r.output
    p = load_profile(out)
    assert p.format == 2 and p.plain_spread and all(c.spread for c in p.speculative)
    cells = {(c["config"], c["workload"], c["max_concurrency"]): c["summary"] for c in doc["cells"]}
    for (cfg, wl, conc), s in cells.items():
        if cfg == "baseline":
            assert any(pt.workload == wl and pt.step_seconds == pytest.approx(s["server_step_duration_ms"] / 1000, abs=1e-6)
                       and pt.running_requests == pytest.approx(s["server_running_requests"], abs=1e-4) for pt in p.plain)
            continue
        base = cells[("baseline", wl, conc)]
        curve = next(c for c in p.speculative if c.k == int(cfg[-1]))
        pt = next(pt for pt in curve.points
                  if pt.workload == wl and pt.running_requests == pytest.approx(s["server_running_requests"], abs=1e-4))
        assert pt.cost_ratio == pytest.approx(s["server_step_duration_ms"] / base["server_step_duration_ms"], abs=1e-3)
        assert pt.drafted_tokens_per_step == pytest.approx(s["spec_decode_draft_tokens"] / s["server_request_steps"], abs=1e-3)
    assert {(c.method, c.k) for c in p.speculative} == {("ngram", 2), ("ngram", 4), ("draft_model", 3)}
    assert p.provenance["source"] == "sweep" and "vLLM's histograms" in p.provenance["how"]
    assert p.served_model_name == "smollm2"
    for b in (1.0, 4.0):
        c_draft = p.cost_ratio(b, 3, "draft_model").seconds
        c_copy = p.cost_ratio(b, 4, "ngram", drafted_tokens_per_step=4.0).seconds
        c_random = p.cost_ratio(b, 4, "ngram", drafted_tokens_per_step=0.02).seconds
        assert c_draft > 3 > 1 < c_random < c_copy < 2  # the drafter's own forward passes are in the step
    # the shipped profile holds the same numbers (its drafter named by the directory, not the local path)
    shipped = load_profile(PROFILES / "cpu-2core-smollm2-135m-vllm0.32.yaml")
    assert shipped.plain == p.plain and [c.points for c in shipped.speculative] == [c.points for c in p.speculative]
    assert ("draft_model", "SmolLM2-135M-Instruct") in shipped.methods()
    # a sweep without a baseline cannot give t0(b)
    nobase = dict(doc, cells=[c for c in doc["cells"] if c["k"] > 0])
    (tmp_path / "nobase.json").write_text(json.dumps(nobase))
    r = CliRunner().invoke(calibrate, ["--from-sweep", str(tmp_path / "nobase.json"), "-o", str(tmp_path / "x.yaml")])
    assert r.exit_code == 1 and "no finished baseline" in r.output and not (tmp_path / "x.yaml").exists()


def test_a_profile_cut_at_a_line_boundary_is_refused(tmp_path):
    text = (PROFILES / "cpu-2core-smollm2-135m-vllm0.32.yaml").read_text()
    lines = text.splitlines(keepends=True)
    for cut in (len(lines) - 1, len(lines) // 2, len(lines) - 8):
        f = tmp_path / f"cut{cut}.yaml"
        f.write_text("".join(lines[:cut]))
        with pytest.raises(CostProfileError) as info:
            load_profile(f)
        assert str(info.value).startswith(f"{f}: ")
        if cut == len(lines) - 1:  # every point whole, only the count gone: still refused, and why
            assert "points_total" in str(info.value) and "cut short" in str(info.value)


def test_a_format_1_profile_is_read_with_a_wider_interval(tmp_path):
    """A profile written by the previous calibrate (format 1: absolute t(b, k) pooled over workloads)
    still loads; its relative cost is t(b, k) / t0(b) and its spread the format-1 default."""
    from specwatch.specdecode.costprofile import FORMAT1_SPREAD

    v1 = {"specwatch_cost_profile": 1, "name": "old", "provenance": PROV,
          "plain": [{"running_requests": 1.0, "step_seconds": 0.02}, {"running_requests": 4.0, "step_seconds": 0.025}],
          "speculative": [{"method": "ngram", "drafter": None, "k": 4,
                           "points": [{"running_requests": 1.0, "step_seconds": 0.024}, {"running_requests": 4.0, "step_seconds": 0.035}]}]}
    f = tmp_path / "v1.yaml"
    f.write_text(yaml.safe_dump(v1))
    p = load_profile(f)
    assert p.format == 1
    c = p.cost_ratio(4.0, 4, "ngram")
    assert c.seconds == pytest.approx(0.035 / 0.025) and c.spread == FORMAT1_SPREAD


def test_exporter_window_without_drafts_still_has_the_measured_speedup():
    """ngram on random output drafts (almost) nothing: the window has no acceptance curve, hence
    no what-if and no recommended k, but the server's own k keeps its measured speedup (live
    decode speed × t0(b)). The second body is the real k=4 capture with more decode steps and no
    new drafts (constructed from it: ITL, iteration, generation and first-token counters raised)."""
    import re

    from exporter_helpers import fixture, make_exporter, raw_value, series

    after = fixture("vllm-0.32-ngram-k4-after-traffic.txt")
    bumps = {"vllm:inter_token_latency_seconds_sum": 12.0, "vllm:inter_token_latency_seconds_count": 400.0,
             "vllm:iteration_tokens_total_count": 100.0, "vllm:generation_tokens_total": 412.0,
             "vllm:time_to_first_token_seconds_count": 12.0}

    def bump(m):
        return f"{m.group(1)}{m.group(2)} {float(m.group(3)) + bumps[m.group(1)]!r}"

    later = re.sub(r"^(" + "|".join(re.escape(k) for k in bumps) + r")(\{[^}]*\}) ([0-9.e+]+)$", bump, after, flags=re.M)
    assert raw_value(later, "vllm:inter_token_latency_seconds_count") == raw_value(after, "vllm:inter_token_latency_seconds_count") + 400
    profile = PROFILES / "cpu-2core-smollm2-135m-vllm0.32.yaml"
    reg, fetcher, clock = make_exporter({"spec": after}, windows=("1m",), cost_profile=str(profile))
    reg.specwatch_collector.current_round()
    fetcher.bodies["spec"] = later
    clock.t += 30
    sel = {"upstream": "spec", "window": "1m"}
    got = series(reg, "specwatch_speedup", **sel)
    assert len(got) == 1, got
    (key, value), = got.items()
    labels = dict(key)
    assert labels["k"] == "4" and labels["basis"] == "calibrated"
    decode = (412 - 12) / 12.0  # tok/s of a running request over the window
    b, step = 400 / 100, 12.0 / 400
    # no new drafts: the relative cost at x = 0 drafted tokens per step (ngram's random-output points)
    c = load_profile(profile).cost_ratio(b, 4, drafted_tokens_per_step=0.0).seconds
    assert 1.0 < c < 1.3
    assert value == pytest.approx(decode * step / c, rel=1e-9)  # no TTFT in the window: the decode ratio
    assert value < 1
    assert series(reg, "specwatch_recommended_num_speculative_tokens", **sel) == {}
    assert [dict(k)["reason"] for k in series(reg, "specwatch_recommendation_withheld", **sel)] == ["insufficient_data"]
    lo = series(reg, "specwatch_speedup_lower", **sel)[key]
    hi = series(reg, "specwatch_speedup_upper", **sel)[key]
    assert lo < value < hi


def test_calibrate_live_from_two_servers(tmp_path):
    """`specwatch calibrate --baseline-url --url`: both servers' /metrics read every interval; each
    interval's step time and b come from the increases of vLLM's histograms. The servers here are
    local HTTP servers replaying the real k=4 capture with counters that grow by known amounts
    each read (constructed from the capture): baseline 20 ms steps at b = 2, speculative 30 ms at
    b = 4."""
    import http.server
    import re
    import threading

    from exporter_helpers import fixture
    from httpstub import QuietHandler, send

    base_text = fixture("vllm-0.32-nospec-after-traffic.txt")
    spec_text = fixture("vllm-0.32-ngram-k4-after-traffic.txt")
    names = ("vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count",
             "vllm:iteration_tokens_total_count", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count")

    def grown(text, n, step_s, b):
        # per read: 50 engine steps, 50 b request-steps of step_s seconds each
        add = {names[0]: n * 50 * b * step_s, names[1]: n * 50 * b, names[2]: n * 50, names[3]: n * 50 * b, names[4]: 0}
        return re.sub(r"^(" + "|".join(map(re.escape, names)) + r")(\{[^}]*\}) ([0-9.e+]+)$",
                      lambda m: f"{m.group(1)}{m.group(2)} {float(m.group(3)) + add[m.group(1)]!r}", text, flags=re.M)

    class Server(http.server.ThreadingHTTPServer):
        reads = 0

    def handler(text, step_s, b):
        class H(QuietHandler):
            def do_GET(self):
                body = grown(text, self.server.reads, step_s, b).encode()
                self.server.reads += 1
                send(self, body, "text/plain; version=0.0.4")
        return H

    servers = [Server(("127.0.0.1", 0), handler(base_text, 0.020, 2)), Server(("127.0.0.1", 0), handler(spec_text, 0.030, 4))]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        urls = [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
        out = tmp_path / "live.yaml"
        r = CliRunner().invoke(calibrate, ["--baseline-url", urls[0], "--url", urls[1], "--duration", "2.5",
                                           "--interval", "0.5", "-o", str(out), "--method", "ngram", "--model", "m",
                                           "--hardware", "test"])
        assert r.exit_code == 0, r.output
        p = load_profile(out)
        assert [(pt.running_requests, round(pt.step_seconds, 6)) for pt in p.plain] == [(2.0, 0.02)]
        ((method, k, pts),) = [(c.method, c.k, c.points) for c in p.speculative]
        assert (method, k) == ("ngram", 4) and [(pt.running_requests, round(pt.step_seconds, 6)) for pt in pts] == [(4.0, 0.03)]
        assert p.provenance["source"] == "live-baseline"
        # a server without speculation as --url: one line, no profile
        r = CliRunner().invoke(calibrate, ["--baseline-url", urls[0], "--url", urls[0], "--duration", "1", "--interval", "0.5",
                                           "-o", str(tmp_path / "no.yaml"), "--method", "ngram", "--model", "m"])
        assert r.exit_code == 1 and "no speculative decoding" in r.output and not (tmp_path / "no.yaml").exists()
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


# ------------------------------------------------------------------------------------------------
# A profile without a curve for the running drafter (issue 15): no guess stands in for it
# ------------------------------------------------------------------------------------------------
CLOSE_AFTER = "vllm-0.32-draft-close-k3-after-traffic.txt"  # real: draft_model, drafter close, k = 3
NOSPEC_AFTER = "vllm-0.32-nospec-after-traffic.txt"  # real: the same model without speculation
DRAFTERS_PROFILE = PROFILES / "cpu-2core-smollm2-135m-drafters-vllm0.32.yaml"
STUDY_SWEEP = Path(__file__).resolve().parents[2] / "docs" / "drafter-study" / "sweep.json"


def _live_measured(text: str, profile) -> float:
    """The measured speedup at the server's k from the raw lifetime counters of a capture (prometheus_client's
    parser): decode speed Δ(generation − first tokens) / ITL sum × t0(b), b = ITL count / iteration count."""
    from exporter_helpers import raw_value

    decode = ((raw_value(text, "vllm:generation_tokens_total") - raw_value(text, "vllm:time_to_first_token_seconds_count"))
              / raw_value(text, "vllm:inter_token_latency_seconds_sum"))
    b = raw_value(text, "vllm:inter_token_latency_seconds_count") / raw_value(text, "vllm:iteration_tokens_total_count")
    return decode * profile.plain_step(b).seconds


def test_a_profile_measured_for_another_drafter_withholds_the_recommendation():
    """The demo's case on the real close capture: the CPU profile's draft_model curve is the target as
    drafter, the server runs drafter close. No what-if speedup and no recommended k (before: k = 1, 2 from
    the built-in guess at 1.55x and 1.85x and a recommended k = 2, where the server measures 0.62x at its
    k = 3); the withheld reason says why, and the measured speedup at k = 3 stays."""
    from exporter_helpers import fixture, make_exporter, series

    text = fixture(CLOSE_AFTER)
    profile = PROFILES / "cpu-2core-smollm2-135m-vllm0.32.yaml"
    reg, _, _ = make_exporter({"d": text}, cost_profile=str(profile), speculative_method="draft_model", drafter="close")
    sel = {"upstream": "d", "window": "lifetime"}
    assert series(reg, "specwatch_recommended_num_speculative_tokens", **sel) == {}
    withheld = series(reg, "specwatch_recommendation_withheld", **sel)
    assert [dict(k)["reason"] for k in withheld] == ["no_cost_curve"]
    # without a curve for this drafter and without a baseline there is nothing to relate the live
    # step to: no speedup at all (the profile's absolute t0 was measured on another machine)
    assert series(reg, "specwatch_speedup", **sel) == {}
    # the same profile with the drafter it was measured for: the server's k calibrated, a decision on
    # the interval (a k, or withheld as uncertain), no basis default in it
    reg2, _, _ = make_exporter({"d": text}, cost_profile=str(profile), speculative_method="draft_model",
                               drafter="SmolLM2-135M-Instruct")
    got = {(dict(k)["k"], dict(k)["basis"]) for k in series(reg2, "specwatch_speedup", **sel)}
    assert ("3", "calibrated") in got and not any(b == DEFAULT for _, b in got)
    rec = series(reg2, "specwatch_recommended_num_speculative_tokens", **sel)
    reasons = [dict(k)["reason"] for k in series(reg2, "specwatch_recommendation_withheld", **sel)]
    assert (len(rec) == 1 and not reasons) or (not rec and reasons == ["uncertain"])


def test_the_built_in_guess_contradicted_by_the_measurement_is_not_a_recommendation():
    """No profile, a baseline server beside the draft-model one (both real captures): the guess at the server's
    k = 3 is far above the measured speedup (live decode speed / the baseline's), so its k = 1, 2 are not
    served and no k is recommended (reason default_contradicted). Without the baseline nothing was measured,
    and the guess is served as a guess (basis default)."""
    from exporter_helpers import fixture, make_exporter, raw_value, series

    close, plain = fixture(CLOSE_AFTER), fixture(NOSPEC_AFTER)
    reg, _, _ = make_exporter({"d": close, "base": plain}, baseline_upstream="base")
    sel = {"upstream": "d", "window": "lifetime"}

    def decode(t):
        return ((raw_value(t, "vllm:generation_tokens_total") - raw_value(t, "vllm:time_to_first_token_seconds_count"))
                / raw_value(t, "vllm:inter_token_latency_seconds_sum"))

    assert series(reg, "specwatch_recommended_num_speculative_tokens", **sel) == {}
    assert [dict(k)["reason"] for k in series(reg, "specwatch_recommendation_withheld", **sel)] == ["default_contradicted"]
    got = {(dict(k)["k"], dict(k)["basis"]): v for k, v in series(reg, "specwatch_speedup", **sel).items()}
    assert list(got) == [("3", "measured")]
    # a request-time ratio (prefill included): close to the decode-speed ratio on these captures
    assert got[("3", "measured")] == pytest.approx(decode(close) / decode(plain), rel=0.15)
    assert got[("3", "measured")] < 1
    alone, _, _ = make_exporter({"d": close})
    assert {dict(k)["basis"] for k in series(alone, "specwatch_speedup", **sel)} == {DEFAULT}
    # a guess (a factor 2 either way) tells no k apart: the best estimate is served, not certain (#36)
    assert len(series(alone, "specwatch_recommended_num_speculative_tokens", basis=DEFAULT, **sel)) == 1
    assert list(series(alone, "specwatch_recommendation_certain", **sel).values()) == [0.0]
    assert series(alone, "specwatch_recommendation_withheld", **sel) == {}


def test_calibrate_names_the_sweeps_drafters_and_the_shipped_drafter_profile_is_its_output(tmp_path):
    """`calibrate --from-sweep` on the draft-model study's real sweep records the sweep's drafter names
    (close, far), not a machine's local path; the shipped drafter profile holds exactly its points."""
    out = tmp_path / "d.yaml"
    r = CliRunner().invoke(calibrate, ["--from-sweep", str(STUDY_SWEEP), "-o", str(out), "--name", "t"])
    assert r.exit_code == 0, r.output
    p = load_profile(out)
    assert {(c.method, c.drafter, c.k) for c in p.speculative} == {
        ("draft_model", d, k) for d in ("close", "far") for k in (1, 2, 3, 4)}
    shipped = load_profile(DRAFTERS_PROFILE)
    assert shipped.plain == p.plain
    assert {(c.drafter, c.k): c.points for c in shipped.speculative} == {(c.drafter, c.k): c.points for c in p.speculative}
    for b in (1.0, 8.0):  # same-size drafters: a step costs about k + 1 plain steps
        assert shipped.speculative_step(b, 3, "draft_model", "close").seconds / shipped.plain_step(b).seconds > 3


def test_the_demos_exporter_has_a_curve_for_every_embedded_drafter():
    """`specwatch demo` states the speculative upstream's method and drafter and picks a profile with a curve
    for it; on the real close capture that exporter recommends turning speculation off (measured and profile
    bases; the study measured a loss at every k), never a k from the built-in guess."""
    from exporter_helpers import fixture, make_exporter, series
    from specwatch.demo import exporter_cost_options

    for method, drafter in (("ngram", None), ("draft_model", "close"), ("draft_model", "far"), ("draft_model", "target")):
        path, key = exporter_cost_options(method, drafter)
        assert load_profile(path).has_curve(method, key), (method, drafter)
    path, key = exporter_cost_options("draft_model", "close")
    reg, _, _ = make_exporter({"spec": fixture(CLOSE_AFTER)}, cost_profile=str(path),
                              upstreams_options={"spec": f",method=draft_model,drafter={key}"})
    sel = {"upstream": "spec", "window": "lifetime"}
    rec = series(reg, "specwatch_recommended_num_speculative_tokens", **sel)
    assert len(rec) == 1, series(reg, "specwatch_recommendation_withheld", **sel)
    (labels, k), = rec.items()
    assert k == 0 and dict(labels)["basis"] in (MEASURED, PROFILE, EXTRAPOLATED)
    assert all(dict(lab)["basis"] != DEFAULT for lab in series(reg, "specwatch_speedup", **sel))


def test_live_advice_withholds_when_the_profile_has_no_curve_for_the_drafter():
    """`specwatch advise --exporter/--prometheus --cost-profile P --method draft_model --drafter close` follows
    the exporter's rule: the CPU profile's draft_model curve is the target as drafter, so no k is recommended
    for close (before: the built-in guess recommended k > 0); with the drafter profile a k is."""
    from specwatch.choosek.advise import live_advices

    curves = {("spec", "smollm2", "0"): (0.72, 0.55, 0.41)}  # the close capture's per-position curve, rounded
    cpu = load_profile(PROFILES / "cpu-2core-smollm2-135m-vllm0.32.yaml")
    (item,) = [a.to_json() for a in live_advices(curves, (1, 4), cpu, 0.02, None, method="draft_model", drafter="close")]
    assert item["withheld"] == "no_cost_curve" and not item["k_by_concurrency"] and not item["speedup"]
    drafters = load_profile(DRAFTERS_PROFILE)
    (item,) = [a.to_json() for a in live_advices(curves, (1, 4), drafters, 0.02, None, method="draft_model", drafter="close")]
    assert "withheld" not in item and item["k_by_concurrency"] == {"1": 0, "4": 0}
    assert DEFAULT not in set(item["basis_by_concurrency"].values())


def test_advise_cli_says_why_no_k_is_recommended_for_an_uncalibrated_drafter():
    from exporter_helpers import exporter_text as _exporter_text, serve_pages as _pages

    from specwatch.choosek.cli import advise

    with _pages({"/metrics": (200, "text/plain", _exporter_text().encode())}) as base:
        r = CliRunner().invoke(advise, ["--exporter", base + "/metrics", "--concurrency", "1",
                                        "--cost-profile", str(PROFILES / "cpu-2core-smollm2-135m-vllm0.32.yaml"),
                                        "--method", "draft_model", "--drafter", "close"])
    assert r.exit_code == 0, r.output
    assert "no k recommended" in r.output and "no curve for method draft_model, drafter close" in r.output
    assert "SmolLM2-135M-Instruct" in r.output  # what the profile has


def test_the_mixin_reads_the_bases_and_reasons_the_exporter_serves():
    """The alerts and dashboards name bases and withheld reasons as strings (mixin/config.py); they
    must be the exporter's own (specdecode.costprofile / speedup / decision)."""
    from specwatch.mixin import config as mixin_config
    from specwatch.specdecode import speedup
    from specwatch.specdecode.costprofile import BASES

    assert set(mixin_config.CURRENT_K_BASES) == {MEASURED, CALIBRATED} and set(mixin_config.CURRENT_K_BASES) <= set(BASES)
    assert mixin_config.DRIFT_MEASURED_BASIS == PROFILE
    # an uncertain pick is served with its confidence, never withheld (#36)
    assert set(mixin_config.WITHHELD_REASONS) == {speedup.REASON_INSUFFICIENT_DATA, speedup.REASON_NO_COST_CURVE,
                                                   speedup.REASON_DEFAULT_CONTRADICTED}
    assert "uncertain" not in mixin_config.WITHHELD_REASONS  # issue #36: an uncertain pick is served, never withheld


def test_the_real_capture_carries_prefill_and_context_into_the_speedup():
    """The speedup's TTFT and context terms come from real /metrics: vllm:time_to_first_token_seconds_sum
    and the request prompt/generation token histograms pass the exporter's line pre-filter (they did not:
    every live speedup silently fell back to the decode-speed ratio)."""
    from exporter_helpers import fixture, raw_value

    from specwatch.specdecode.metrics import parse_metrics
    from specwatch.specdecode.steptime import step_times

    text = fixture("vllm-0.32-ngram-k4-after-traffic.txt")
    (st,) = parse_metrics(text).steps.values()
    t = step_times(st)
    assert t.prefill_seconds == pytest.approx(raw_value(text, "vllm:time_to_first_token_seconds_sum"))
    prompt = raw_value(text, "vllm:request_prompt_tokens_sum") / raw_value(text, "vllm:request_prompt_tokens_count")
    out = raw_value(text, "vllm:request_generation_tokens_sum") / raw_value(text, "vllm:request_generation_tokens_count")
    assert t.context_tokens == pytest.approx(prompt + out / 2)
    p = load_profile(PROFILES / "cpu-2core-smollm2-135m-vllm0.32.yaml")
    live = current_speedup(LiveCost(step=t, profile=p, drafted_tokens_per_step=4.0, method="ngram"), 4)
    decode_only = t.request_decode_tokens_per_second * t.step_duration_seconds / p.cost_ratio(
        t.running_requests_per_step, 4, "ngram", drafted_tokens_per_step=4.0, context_tokens=t.context_tokens).seconds
    assert live.value < decode_only  # prefill time counts on both sides, so the ratio moves towards 1


def test_an_extrapolated_interval_widens_with_the_distance_from_what_was_measured():
    """Issue #37: a profile measured at k = 4 only; a what-if k farther from 4 is carried further
    (c from 1 at k = 0 to c(4)), so its interval is wider, and wider than the fixed extrapolation
    margin alone (on an H200 a k = 2 extrapolated from k = 4 missed its client ratio by up to 2x)."""
    from specwatch.specdecode.speedup import EXTRAPOLATION_HALFWIDTH

    bs = (1.0, 2.0, 4.0, 8.0)
    plain = [StepPoint(b, 0.010 + 0.001 * b) for b in bs]
    only4 = make_profile("k4", PROV, plain, [SpeculativeCurve("ngram", None, 4, tuple(
        StepPoint(b, (0.010 + 0.001 * b) * 2.0) for b in bs))])
    assert only4.cost_ratio(4, 4).extrapolation == 0.0
    c3, c1 = only4.cost_ratio(4, 3), only4.cost_ratio(4, 1)
    assert c3.basis == c1.basis == EXTRAPOLATED
    assert c3.extrapolation == pytest.approx(math.log(2.0 / 1.75)) and c1.extrapolation == pytest.approx(math.log(2.0 / 1.25))
    step = StepTimes(step_duration_seconds=0.02, running_requests_per_step=4.0, request_decode_tokens_per_second=200.0,
                     engine_steps=100, request_steps=400)
    sp = speedups((0.9, 0.8, 0.7, 0.6), LiveCost(step=step, draft_share=1.0, profile=only4), current_k=4)
    width = {k: math.log(sp[k].upper / sp[k].lower) / 2 for k in (1, 3)}
    assert width[1] > width[3] > EXTRAPOLATION_HALFWIDTH
