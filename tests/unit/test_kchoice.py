"""The offline k-choice maths (specwatch.choosek.model) with known curves.

Measurements here are *constructed* from a known model (i.i.d. acceptance α, step time
T(x) = T0 + β·x), so every prediction has an exact expected value computed independently.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from exporter_helpers import exporter_text as _exporter_text, serve_pages as _pages
from records import cell_record
from specwatch.specdecode.cost import estimated_speedups, recommend_k
from specwatch.specdecode.cost import CostModel
from dataclasses import replace

from specwatch.choosek.model import (
    KChoiceError,
    Measurement,
    ThroughputPrediction,
    advise,
    advise_from_curve,
    cell_scores,
    dynamic_schedule,
    evaluate_choices,
    expected_length,
    fit_step_cost,
    iid_curve,
    iid_expected_length,
    predict_acceptance_lengths,
    predict_throughputs,
    recommend,
    speculative_config_advice,
    log_throughput_interval,
)


# ------------------------------------------------------------------------------- model world
def synth(k: int, alpha: float, c: int = 1, t0: float = 0.05, beta: float = 0.004, tbase: float = 0.04,
          wl: str = "copy", drafts: float = 1000.0, draft_share: float = 1.0) -> Measurement:
    """A cell measured on an ideal chain drafter with i.i.d. acceptance α: every quantity follows
    the definitions (S = G − A request-steps; f = drafts / S; T = T0 + β·x; thr = c·τ / T)."""
    if k == 0:
        return Measurement("baseline", 0, wl, c, c / tbase, generation_tokens=5000.0, batch_throughputs=(c / tbase,) * 4)
    rates = iid_curve(alpha, k)
    steps = drafts / draft_share
    accepted = drafts * sum(rates)
    gen = steps + accepted
    x = drafts * k / steps
    thr = c * (gen / steps) / (t0 + beta * x)
    return Measurement(f"ngram-k{k}", k, wl, c, thr, family="ngram", acceptance_length=1 + accepted / drafts,
                       position_rates=rates, drafts=drafts, draft_tokens=drafts * k, accepted_tokens=accepted,
                       generation_tokens=gen, batch_throughputs=(thr * 0.999, thr * 1.001) * 2)


PROFILES = Path(__file__).resolve().parents[2] / "exporter" / "specwatch" / "data" / "cost-profiles"


def true_throughput(k: int, alpha: float, c: int = 1, t0: float = 0.05, beta: float = 0.004, draft_share: float = 1.0) -> float:
    """Closed-form throughput of the model world (independent of kchoice's code path)."""
    tau = 1 + draft_share * alpha * (1 - alpha ** k) / (1 - alpha)
    return c * tau / (t0 + beta * draft_share * k)


# ------------------------------------------------------------------------------- E(k)
@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.7, 0.95, 1.0])
@pytest.mark.parametrize("k", [0, 1, 2, 3, 4, 6, 8])
def test_iid_expected_length_matches_curve_and_closed_form(alpha, k):
    geometric = sum(alpha ** j for j in range(k + 1))  # 1 + α + … + α^k
    assert iid_expected_length(alpha, k) == pytest.approx(geometric)
    assert expected_length(iid_curve(alpha, 8), k) == pytest.approx(geometric)
    if alpha < 1:
        assert iid_expected_length(alpha, k) == pytest.approx((1 - alpha ** (k + 1)) / (1 - alpha))


def test_iid_limits_and_bad_input():
    assert iid_expected_length(0.0, 8) == 1.0
    assert iid_expected_length(1.0, 8) == 9.0
    for bad in (-0.1, 1.1, float("nan")):
        with pytest.raises(KChoiceError):
            iid_expected_length(bad, 3)
    with pytest.raises(KChoiceError):
        expected_length((0.9, 0.8), 3)


def test_expected_length_monotone_and_concave_for_decreasing_curves():
    rng = random.Random(7)
    for _ in range(50):
        rates = sorted((rng.random() for _ in range(8)), reverse=True)
        e = [expected_length(rates, k) for k in range(9)]
        assert all(b >= a for a, b in zip(e, e[1:], strict=False))
        gains = [b - a for a, b in zip(e, e[1:], strict=False)]
        assert all(g2 <= g1 + 1e-12 for g1, g2 in zip(gains, gains[1:], strict=False))
        assert e[8] <= 9


def test_acceptance_prediction_error_zero_for_consistent_runs_and_signed_when_off():
    ms = [synth(k, 0.8) for k in (1, 2, 4, 8)]
    preds = {p.k: p for p in predict_acceptance_lengths(ms)}
    assert sorted(preds) == list(range(1, 9))
    assert all(p.source_k == 8 for p in preds.values())
    for k in (1, 2, 4, 8):
        assert preds[k].error == pytest.approx(0, abs=1e-12)
    assert preds[3].measured is None and preds[3].predicted == pytest.approx(iid_expected_length(0.8, 3))
    # measured at k=2 is 0.1 token longer than the curve says: error = predicted - measured = -0.1
    off = synth(2, 0.8)
    off = Measurement(**{**off.__dict__, "acceptance_length": off.acceptance_length + 0.1})
    p2 = {p.k: p for p in predict_acceptance_lengths([off, synth(8, 0.8)])}[2]
    assert p2.error == pytest.approx(-0.1)
    assert p2.relative_error == pytest.approx(-0.1 / (iid_expected_length(0.8, 2) + 0.1))


# ------------------------------------------------------------------------------- step cost / throughput
def test_step_cost_fit_recovers_the_model_and_predicts_unmeasured_k():
    ms = [synth(0, 0.9), synth(1, 0.9), synth(2, 0.9), synth(8, 0.9)]
    fit = fit_step_cost(ms)
    assert fit.method == "least-squares"
    assert fit.intercept_s == pytest.approx(0.05)
    assert fit.slope_s == pytest.approx(0.004)
    assert fit.baseline_step_s == pytest.approx(0.04)
    preds, _ = predict_throughputs(ms)
    by_k = {p.k: p for p in preds}
    assert sorted(by_k) == list(range(0, 9))
    for k in range(1, 9):  # k = 3..7 were never measured
        assert by_k[k].predicted == pytest.approx(true_throughput(k, 0.9))
    assert by_k[0].predicted == pytest.approx(1 / 0.04)


def test_partial_drafting_is_modelled():
    """ngram proposes nothing on some steps: f = drafts / request-steps < 1 scales both gain and cost."""
    ms = [synth(k, 0.7, draft_share=0.5) for k in (1, 4, 8)]
    assert ms[0].draft_fraction == pytest.approx(0.5)
    preds, _ = predict_throughputs(ms)
    for p in preds:
        assert p.predicted == pytest.approx(true_throughput(p.k, 0.7, draft_share=0.5))


def test_single_run_fit_uses_the_cost_model():
    m = synth(4, 0.9, c=8)
    cm = CostModel(0.05, 0.02)
    fit = fit_step_cost([m], cm)
    assert fit.method == "cost-model"
    per_tok = 0.05 + 0.02 * 8
    assert fit.slope_s == pytest.approx(fit.intercept_s * per_tok)
    assert fit.step_time(m.verified_per_step) == pytest.approx(m.step_time_s)


def test_fit_rejects_mixed_cells():
    with pytest.raises(KChoiceError):
        fit_step_cost([synth(1, 0.9, c=1), synth(2, 0.9, c=4)])


# ------------------------------------------------------------------------------- recommendation
def _tp(k: int, thr: float, c: int = 1, wl: str = "copy") -> ThroughputPrediction:
    return ThroughputPrediction(wl, c, k, thr, thr, 1.0, float(k), None)


def test_recommend_prefers_the_smaller_k_within_noise():
    preds = [_tp(0, 100.0), _tp(2, 200.0), _tp(4, 202.0)]  # k=4 is 1 % better than k=2
    loose = {r.workload: r for r in recommend(preds, tolerance=0.02)}
    assert loose["copy"].k == 2 and loose["copy"].best_k == 4
    tight = {r.workload: r for r in recommend(preds, tolerance=0.005)}
    assert tight["copy"].k == 4
    assert tight["copy"].speedup == pytest.approx(2.02)


def test_speculation_off_when_every_k_loses():
    ms = [synth(0, 0.3, c=16, tbase=0.04)] + [synth(k, 0.3, c=16, t0=0.05, beta=0.01) for k in (1, 2, 4)]
    a = advise(ms)
    rec = {(r.workload, r.concurrency): r for r in a.recommendations}
    assert rec[("copy", 16)].k == 0 and rec[("*", 16)].k == 0
    assert a.speculative_config is None
    # and baseline within tolerance of a speculative k: baseline (smaller k) still wins
    close = [_tp(0, 100.0), _tp(1, 101.0)]
    assert {r.workload: r for r in recommend(close, 0.02)}["copy"].k == 0


def test_recommend_candidates_measured_vs_all():
    ms = [synth(0, 0.95, tbase=0.06), synth(1, 0.95), synth(8, 0.95, beta=0.0005)]
    preds, _ = predict_throughputs(ms)
    measured_only = {r.workload: r for r in recommend(preds, 0.0, "measured", measurements=ms)}["copy"]
    assert set(measured_only.scores) == {"off", "k=1", "k=8"}
    everything = {r.workload: r for r in recommend(preds, 0.0, "all", measurements=ms)}["copy"]
    assert set(everything.scores) == {"off"} | {f"k={k}" for k in range(1, 9)}
    # what-ifs carry their basis and no per-batch ratios; measured configurations are paired
    cands = {c.name: c for c in everything.pick.candidates}
    assert cands["k=3"].basis == "calibrated" and cands["k=3"].log_ratios is None
    assert cands["k=8"].basis == "calibrated"  # basis "model" (recommend's default): scored by the prediction
    measured = {r.workload: r for r in recommend(preds, 0.0, "all", "measured", measurements=ms)}["copy"]
    cands = {c.name: c for c in measured.pick.candidates}
    assert cands["k=8"].basis == "measured" and len(cands["k=8"].log_ratios) == 4
    best_true = max(range(1, 9), key=lambda k: true_throughput(k, 0.95, beta=0.0005))
    assert everything.k == best_true
    with pytest.raises(KChoiceError):
        recommend(preds, 0.0, "some")
    with pytest.raises(KChoiceError):
        recommend(preds, 1.5)


def test_advice_end_to_end_on_a_model_world():
    """High acceptance at c=1 (k large wins), costly verification at c=16 (off)."""
    ms = []
    for c, beta in ((1, 0.001), (16, 0.1)):
        ms.append(synth(0, 0.9, c=c, tbase=0.045))
        ms += [synth(k, 0.9, c=c, beta=beta) for k in (1, 2, 3, 4, 6, 8)]
    a = advise(ms, tolerance=0.02)
    per = {(r.workload, r.concurrency): r.k for r in a.recommendations}
    truth1 = {k: true_throughput(k, 0.9, c=1, beta=0.001) for k in (1, 2, 3, 4, 6, 8)}
    best1 = max(truth1.values())
    expected1 = min(k for k, v in truth1.items() if v >= best1 * 0.98)
    assert per[("copy", 1)] == expected1
    base16 = 16 / 0.045
    assert max(true_throughput(k, 0.9, c=16, beta=0.1) for k in (1, 2, 3, 4, 6, 8)) < base16  # every k loses
    assert per[("copy", 16)] == 0
    assert a.k_by_concurrency == {1: expected1, 16: 0}
    # different picks per concurrency: no single answer; the composed table is a candidate to
    # measure, never the config to paste
    assert a.answer == "per_concurrency" and a.speculative_config is None
    assert a.candidate_config["num_speculative_tokens"] == expected1
    assert a.candidate_config["num_speculative_tokens_per_batch_size"] == [[1, 4, expected1], [5, 16, 0]]
    assert a.acceptance_error.to_json()["max_abs_relative"] == pytest.approx(0, abs=1e-12)
    assert a.worst_shortfall <= 0.02 + 1e-12  # smaller k within the tolerance costs at most 2 %
    d = a.to_dict()
    assert d["k_by_concurrency"] == {"1": expected1, "16": 0}


def test_evaluate_choices_reports_shortfall():
    ms = [synth(0, 0.5), Measurement("ngram-k2", 2, "copy", 1, 90.0), Measurement("ngram-k4", 4, "copy", 1, 30.0)]
    recs = recommend([_tp(0, 25.0), _tp(2, 30.0), _tp(4, 31.0)], 0.0)  # predicts k=4 best
    (cell,) = evaluate_choices(recs, ms)
    assert cell.picked_k == 4 and cell.best_k == 2
    assert cell.shortfall == pytest.approx(1 - 30.0 / 90.0)


def _tpm(k: int, predicted: float, measured: float | None, c: int = 1, wl: str = "copy") -> ThroughputPrediction:
    return ThroughputPrediction(wl, c, k, predicted, measured, 1.0, float(k), None)


def test_measured_basis_follows_the_measurement_and_calibrates_unmeasured_k():
    # the model thinks k=6 and k=8 tie (0.8 % apart); the runs say k=8 is 4 % faster
    ps = [_tpm(0, 100.0, 100.0), _tpm(6, 200.0, 200.0), _tpm(7, 200.8, None), _tpm(8, 201.6, 208.0)]
    model = {r.workload: r for r in recommend(ps, 0.02, "measured", "model")}["copy"]
    assert model.k == 6  # within the 2 % tolerance of the predicted best
    measured = {r.workload: r for r in recommend(ps, 0.02, "measured", "measured")}["copy"]
    assert measured.k == 8 and measured.scores == pytest.approx({"off": 1.0, "k=6": 2.0, "k=8": 2.08})
    assert measured.speedup == pytest.approx(2.08)
    # k=7 was not run: prediction × the measured/predicted ratio interpolated between k=6 (1.0)
    # and k=8 (208 / 201.6)
    sc = cell_scores({p.k: p for p in ps}, "measured")
    assert sc[7] == pytest.approx(200.8 * (1.0 + 0.5 * (208.0 / 201.6 - 1.0)))
    assert cell_scores({p.k: p for p in ps}, "model")[8] == 201.6
    # beyond the last measured k the nearest ratio is used; with no measured k > 0 the prediction
    sc = cell_scores({0: _tpm(0, 50.0, 50.0), 2: _tpm(2, 80.0, 88.0), 4: _tpm(4, 90.0, None)}, "measured")
    assert sc[4] == pytest.approx(90.0 * 1.1)
    assert cell_scores({0: _tpm(0, 50.0, 50.0), 4: _tpm(4, 90.0, None)}, "measured")[4] == 90.0
    with pytest.raises(KChoiceError):
        recommend(ps, 0.02, "measured", "guess")


def test_measured_basis_shortfall_is_bounded_by_the_tolerance():
    """Whatever the model says, a measured-basis pick is within the tolerance of the best measured
    k (the property the accuracy benchmark checks on the real vLLM)."""
    rng = random.Random(7)
    for _ in range(200):
        ks = (0, 1, 2, 4, 8)
        ps = [_tpm(k, rng.uniform(50, 150), rng.uniform(50, 150)) for k in ks]
        tol = rng.choice((0.0, 0.01, 0.02, 0.05))
        (r,) = [r for r in recommend(ps, tol, "measured", "measured") if r.workload == "copy"]
        best = max(p.measured for p in ps) / ps[0].measured
        assert r.scores[r.config] >= best * (1 - tol) - 1e-9
        k_of = {n: (0 if n == "off" else int(n.split("=")[1])) for n in r.scores}
        assert all(v < best * (1 - tol) for n, v in r.scores.items() if k_of[n] < r.k)  # the smallest such k


def _mb(k: int, batches: tuple[float, ...], wl: str = "copy", c: int = 1) -> Measurement:
    return Measurement("baseline" if k == 0 else f"ngram-k{k}", k, wl, c, sum(batches) / len(batches),
                       family="" if k == 0 else "ngram", batch_throughputs=batches)


def test_paired_batches_decide_where_unpaired_intervals_overlap():
    """Batch i of every configuration served the same prompts: a drifting host moves the baseline
    and k=4 together, so their unpaired intervals overlap widely while every paired ratio is
    above k=2's; the rule picks k=4 and says it is certain (the overlap rule picked k=2)."""
    drift = (1.0, 1.4, 0.7, 1.2)
    ms = [_mb(0, tuple(100.0 * d for d in drift)), _mb(2, tuple(150.0 * d for d in drift)),
          _mb(4, tuple(180.0 * d * e for d, e in zip(drift, (1.0, 1.02, 0.99, 1.01), strict=True)))]
    ms = [replace(m, accepted_tokens=10.0, draft_tokens=20.0, drafts=10.0) if m.k else m for m in ms]
    (r, _star) = recommend([], 0.02, measurements=ms)
    assert r.config == "k=4" and r.pick.certain and r.pick.runner_up.name == "k=2"
    assert r.pick.pick.lower > 1.7 and r.pick.versus_runner_up.lower > 1.1
    # the unpaired 95 % intervals of the two throughputs overlap (what the old rule tied on)
    lo4, hi4 = log_throughput_interval(ms[2])
    lo2, hi2 = log_throughput_interval(ms[1])
    assert lo4 < hi2


# ------------------------------------------------------------------------------- vLLM config
def test_dynamic_schedule_ranges():
    assert dynamic_schedule({1: 4, 8: 2, 32: 0}) == [[1, 2, 4], [3, 16, 2], [17, 32, 0]]
    assert dynamic_schedule({1: 3, 4: 3}) == [[1, 4, 3]]
    assert dynamic_schedule({4: 2}) == [[1, 4, 2]]
    with pytest.raises(KChoiceError):
        dynamic_schedule({})
    with pytest.raises(KChoiceError):
        dynamic_schedule({0: 2})


@pytest.mark.vllmpkg
def test_dynamic_schedule_is_accepted_by_vllm():
    utils = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")
    sched = dynamic_schedule({1: 8, 4: 4, 16: 2, 64: 0})
    assert utils.validate_and_normalize_dynamic_sd_schedule(sched) == [tuple(r) for r in sched]
    dense = utils.build_dynamic_sd_schedule_lookup(sched, vllm_max_batch_size=128, vllm_num_speculative_tokens=8)
    assert dense[1] == 8 and dense[4] == 4 and dense[16] == 2 and dense[64] == 0 and dense[128] == 0


def test_speculative_config_advice():
    base = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    same = speculative_config_advice(base, {1: 3, 8: 3})
    assert same == {**base, "num_speculative_tokens": 3}
    dyn = speculative_config_advice(base, {1: 6, 8: 2})
    assert dyn["num_speculative_tokens"] == 6
    assert dyn["num_speculative_tokens_per_batch_size"] == [[1, 2, 6], [3, 8, 2]]
    assert speculative_config_advice(base, {1: 0, 8: 0}) is None


# ------------------------------------------------------------------------------- inputs
def test_measurement_from_a_bench_cell_record():
    """Build the record with the load generator's own result classes (real code path)."""
    from bench_records import one_batch_cell_record

    rec = one_batch_cell_record()
    m = Measurement.from_cell(cell_record(rec), config="ngram-k4", k=4, family="ngram")
    assert m.output_throughput == pytest.approx(256.0)
    assert m.position_rates == pytest.approx((0.9, 0.7, 0.5, 0.4))
    assert m.acceptance_length == pytest.approx(3.5)
    assert m.acceptance_rate == pytest.approx(250 / 400)
    assert m.request_steps == pytest.approx(512 - 250)
    assert m.tokens_per_step == pytest.approx(512 / 262)
    assert m.verified_per_step == pytest.approx(400 / 262)
    assert m.draft_fraction == pytest.approx(100 / 262)
    assert m.step_time_s == pytest.approx(4 * (512 / 262) / 256.0)
    assert m.step_time_tpot_s == pytest.approx(0.01 * 512 / 262)
    with pytest.raises(KChoiceError):
        Measurement.from_cell(cell_record({**rec, "output_throughput": None}), config="x", k=4)


def test_live_advice_matches_the_exporters_functions():
    rates = iid_curve(0.8, 6)
    out = advise_from_curve(rates, [1, 8], CostModel())
    assert out[1] == estimated_speedups(rates, 1.0, CostModel())
    assert recommend_k(out[1]) >= recommend_k(out[8])
    assert math.isclose(out[8][0], 1.0)


def test_cell_without_any_draft_recommends_speculation_off():
    """ngram found no match (random output): no curve, yet the speculative server is slower."""
    def nodraft(k: int) -> Measurement:
        return Measurement(f"ngram-k{k}", k, "random-output", 1, 16.0 - 0.1 * k, family="ngram", drafts=0.0,
                           draft_tokens=0.0, accepted_tokens=0.0, generation_tokens=512.0)

    ms = [Measurement("baseline", 0, "random-output", 1, 20.0, generation_tokens=512.0)] + [nodraft(k) for k in (1, 4)]
    preds, fits = predict_throughputs(ms)
    assert {p.k for p in preds} == {0, 1, 2, 3, 4}
    assert all(p.tokens_per_step == 1.0 and p.verified_per_step == 0.0 for p in preds)
    (rec,) = [r for r in recommend(preds) if r.workload == "random-output"]
    assert rec.k == 0


def test_acceptance_error_can_ignore_runs_with_few_drafts():
    few = Measurement(**{**synth(2, 0.8, drafts=10.0).__dict__, "acceptance_length": 1.5})  # 10 drafts, far off
    a = advise([few, synth(4, 0.8), synth(8, 0.8)])
    by_k = {p.k: p for p in a.acceptance}
    assert by_k[2].measured_drafts == 10.0 and by_k[4].measured_drafts == 1000.0
    assert a.acceptance_error.to_json()["n"] == 2
    assert a.acceptance_error.to_json()["max_abs_relative"] == pytest.approx(abs(iid_expected_length(0.8, 2) - 1.5) / 1.5)
    strict = a.acceptance_error_over(100.0).to_json()
    assert strict["n"] == 1 and strict["max_abs_relative"] == pytest.approx(0, abs=1e-12)


def test_held_out_fit_predicts_the_other_k():
    """Step cost fitted on k = 1 and 8 only; k = 2, 4 are predicted, not fitted."""
    ms = [synth(0, 0.85), *(synth(k, 0.85) for k in (1, 2, 4, 8))]
    # perturb the k=2 and k=4 throughputs: with all k in the fit they move the fit, held out they must not
    ms[2] = Measurement(**{**ms[2].__dict__, "output_throughput": ms[2].output_throughput * 1.2})
    ms[3] = Measurement(**{**ms[3].__dict__, "output_throughput": ms[3].output_throughput * 1.2})
    held, fits = predict_throughputs(ms, fit_ks=(1, 8))
    assert [p[0] for p in fits[0].points] == [1, 8]
    for p in held:
        if p.k > 0:
            assert p.predicted == pytest.approx(true_throughput(p.k, 0.85))
    full, _ = predict_throughputs(ms)
    assert {p.k: p.predicted for p in full}[4] != pytest.approx(true_throughput(4, 0.85))


def test_measured_acceptance_mode_uses_each_runs_own_tokens_per_step():
    """A drafter that accepts more at small k than the k=8 curve says (as ngram does on word-chain)."""
    ms = [synth(0, 0.8), synth(1, 0.9), synth(2, 0.9), synth(8, 0.8)]  # k=1,2 drafted with α=0.9
    curve, _ = predict_throughputs(ms, acceptance="curve")
    meas, _ = predict_throughputs(ms, acceptance="measured")
    c2 = {p.k: p for p in curve}[2]
    m2 = {p.k: p for p in meas}[2]
    assert m2.tokens_per_step == pytest.approx(1 + 0.9 + 0.81)
    assert c2.tokens_per_step == pytest.approx(1 + 0.8 + 0.64)
    r2 = (1 + 0.9 + 0.81) / (1 + 0.8 + 0.64)  # measured / curve at k=2; 1 at k=8 (the curve's own run)
    curve4 = 1 + 0.8 + 0.64 + 0.512 + 0.4096
    assert {p.k: p.tokens_per_step for p in meas}[4] == pytest.approx(curve4 * (r2 + (4 - 2) / 6 * (1 - r2)))
    assert abs(m2.relative_error) < abs(c2.relative_error)
    with pytest.raises(KChoiceError):
        predict_throughputs(ms, acceptance="guess")


# ------------------------------------------------------------------------------- live advice
def test_exporter_speedups_on_a_real_capture_follow_the_formula():
    """On a real vLLM capture (lifetime window, no cost profile): specwatch_speedup{basis="default"}
    = τ(k) / c(k, b) with τ(k) = 1 + s (E(k) − 1), s = drafts / request-steps and b = request-steps /
    engine steps, all from vLLM's own counters; advise's curve from the same text is the exporter's."""
    from exporter_helpers import FIXTURES, raw_value
    from prometheus_client.parser import text_string_to_metric_families

    from specwatch.choosek.advise import curves_from_exporter

    raw = (FIXTURES / "vllm-0.32-ngram-k4-after-traffic.txt").read_text()
    lab = {"model_name": "smollm2", "engine": "0"}
    drafts = raw_value(raw, "vllm:spec_decode_num_drafts_total", **lab)
    itl_n = raw_value(raw, "vllm:inter_token_latency_seconds_count", **lab)
    steps = raw_value(raw, "vllm:iteration_tokens_total_count", **lab)
    per_pos = [raw_value(raw, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i), **lab) for i in range(4)]
    rates = [p / drafts for p in per_pos]
    s, b = drafts / itl_n, itl_n / steps
    text = _exporter_text()
    ((key, curve),) = curves_from_exporter(text, "5m").items()  # no 5m window configured: lifetime
    assert curve == pytest.approx(rates, rel=1e-12)
    got = {int(x.labels["k"]): (x.value, x.labels["basis"]) for f in text_string_to_metric_families(text)
           if f.name == "specwatch_speedup" for x in f.samples if x.labels["window"] == "lifetime"}
    for k in range(1, 5):
        tau = 1 + s * sum(rates[:k])
        assert got[k] == (pytest.approx(tau / (1 + k * (0.05 + 0.02 * b)), rel=1e-12), "default")


def test_advise_cli_against_a_live_exporter(tmp_path):
    import json

    from click.testing import CliRunner

    from specwatch.choosek.cli import advise
    from specwatch.specdecode.costprofile import load_profile
    from specwatch.specdecode.speedup import LiveCost, pick, speedups

    profile_path = PROFILES / "h200-llama-8b-forward-only.yaml"
    with _pages({"/metrics": (200, "text/plain", _exporter_text().encode())}) as base:
        out = tmp_path / "live.json"
        url = base + "/metrics"
        r = CliRunner().invoke(advise, ["--exporter", url, "--concurrency", "1,64", "--cost-profile", str(profile_path),
                                        "--json", str(out)])
        assert r.exit_code == 0, r.output
        doc = json.loads(out.read_text())
        live = doc["live"][0]
        assert doc["cost_profile"] == str(profile_path) and live["cost_profile"] == "h200-llama-8b-forward-only"
        rates = tuple(live["position_acceptance_rates"])
        for c in (1, 64):
            choice = pick(speedups(rates, LiveCost(profile=load_profile(profile_path),
                                                   running_requests_fallback=float(c)), current_k=0))
            # a forward-pass-only profile gives upper bounds (its intervals reach 11.2x down): the best estimate
            # is served, never certain, never withheld (#36)
            assert not choice.certain and live["certain_by_concurrency"][str(c)] is False
            assert str(c) not in live["withheld_by_concurrency"]
            assert live["k_by_concurrency"][str(c)] == choice.k and live["basis_by_concurrency"][str(c)] == choice.basis == "profile"
            for v in live["speedup"][str(c)].values():
                assert v["upper"] == pytest.approx(v["value"]) and v["lower"] < v["value"] / 10
        assert "recommended k" in r.output and "h200-llama-8b-forward-only" in r.output and "(not certain)" in r.output
        assert "withheld" not in r.output
        # not certain: the config is a candidate to measure with the sweep command, not a flag to paste
        assert "a candidate to measure" in r.output and "specwatch sweep --speculative-config" in r.output
        assert "vLLM flag to paste" not in r.output
        # without a profile: the built-in guess, and every number says so
        r = CliRunner().invoke(advise, ["--exporter", url, "--concurrency", "1,64", "--json", str(out)])
        assert r.exit_code == 0, r.output
        live = json.loads(out.read_text())["live"][0]
        assert set(live["basis_by_concurrency"].values()) == {"default"}
        assert "vLLM flag to paste" not in r.output  # a guess is never the answer to paste
        assert {v["basis"] for c in live["speedup"].values() for v in c.values()} == {"default"}
        assert "no cost profile" in r.output
        # the old coefficient flags are gone, with a pointer to what replaced them
        r = CliRunner().invoke(advise, ["--exporter", url, "--step-cost-per-draft-token", "0.1"])
        assert r.exit_code == 2 and "--cost-profile" in r.output
        bad = tmp_path / "bad.yaml"
        bad.write_text("specwatch_cost_profile: 1\nname: x\n")
        r = CliRunner().invoke(advise, ["--exporter", url, "--cost-profile", str(bad)])
        assert r.exit_code == 2 and str(bad) in r.output and "provenance" in r.output
        r = CliRunner().invoke(advise, ["--exporter", url, "--cost-profile", str(profile_path), "--method", "eagle"])
        assert r.exit_code == 2 and "no curve for method 'eagle'" in r.output
        r = CliRunner().invoke(advise, ["--exporter", url, "--concurrency", "0"])
        assert r.exit_code != 0
        r = CliRunner().invoke(advise, [])
        assert r.exit_code != 0 and "exactly one" in r.output


def test_measured_mode_interpolates_the_curve_bias_for_k_not_run():
    ms = [synth(0, 0.8), synth(1, 0.9), synth(2, 0.9), synth(4, 0.9), synth(8, 0.8)]
    meas, _ = predict_throughputs(ms, acceptance="measured")
    tau = {p.k: p.tokens_per_step for p in meas if p.k > 0}
    for k in (1, 2, 4, 8):
        assert tau[k] == pytest.approx(iid_expected_length(0.8 if k == 8 else 0.9, k))  # measured
    r2 = iid_expected_length(0.9, 2) / iid_expected_length(0.8, 2)
    r4 = iid_expected_length(0.9, 4) / iid_expected_length(0.8, 4)
    assert tau[3] == pytest.approx(iid_expected_length(0.8, 3) * (r2 + r4) / 2)
    assert tau[6] == pytest.approx(iid_expected_length(0.8, 6) * (r4 + 1.0) / 2)
    assert tau[3] > tau[2] and tau[4] > tau[3]  # between its measured neighbours


def test_advise_exporter_errors_are_one_line(tmp_path):
    """An HTML page, garbage, an HTTP error or a refused connection: one line naming the URL and the
    reason, exit 1, no traceback."""
    import socket

    from click.testing import CliRunner

    from specwatch.choosek.cli import advise

    pages = {"/html": (200, "text/html", b"<!DOCTYPE html><html><head><title>Grafana</title></head><body>hi</body></html>\n"),
             "/garbage": (200, "text/html", b"foo{bar 1 2 3\n\x00\x01"),
             "/missing": (404, "text/html", b"not found")}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens here once the socket is closed
    with _pages(pages) as base:
        for url, reason in ((base + "/html", "not the specwatch exporter"), (base + "/garbage", "not the specwatch exporter"),
                            (base + "/missing", "HTTP 404"), (f"http://127.0.0.1:{closed}/metrics", "connection refused")):
            r = CliRunner().invoke(advise, ["--exporter", url])
            assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (url, r.output, r.exception)
            assert url in r.output and reason in r.output, r.output
            assert len(r.output.strip().splitlines()) == 1, r.output
            assert "urllib3" not in r.output and "object at 0x" not in r.output


def test_advise_prometheus_shows_a_lower_bound_curve_without_recommending_k(tmp_path):
    """specwatch advise --prometheus against a fake Prometheus HTTP API (127.0.0.1) answering the
    recording rule model_name:specwatch_position_acceptance_rate:ratio_rate5m with one curve
    labelled basis="lower_bound" (a dynamic table, ragged drafts) and one exact: the lower-bound
    curve is shown with its basis and gets no k; the exact one gets its advice."""
    import json
    import urllib.parse

    from click.testing import CliRunner

    from httpstub import QuietHandler, base_url, send, serve_in_thread

    from specwatch.choosek.cli import advise

    def sample(job, basis, pos, v):
        return {"metric": {"__name__": "model_name:specwatch_position_acceptance_rate:ratio_rate5m", "job": job,
                           "model_name": "smollm2", "position": str(pos), "basis": basis}, "value": [1796104210.0, str(v)]}

    result = [sample("dyn", "lower_bound", i, v) for i, v in enumerate((1.0, 0.005, 0.005))]
    result += [sample("fixed", "exact", i, v) for i, v in enumerate((0.9, 0.8, 0.7))]
    queries = []

    class Prom(QuietHandler):
        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            if url.path != "/api/v1/query":
                self.send_error(404)
                return
            queries.append(urllib.parse.parse_qs(url.query)["query"][0])
            send(self, json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode(),
                 "application/json")

    out = tmp_path / "live.json"
    with serve_in_thread(Prom) as srv:
        r = CliRunner().invoke(advise, ["--prometheus", base_url(srv), "--concurrency", "1,4", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert queries == ["model_name:specwatch_position_acceptance_rate:ratio_rate5m"]
    assert "dyn / smollm2" in r.output and "basis=lower_bound" in r.output and "(not certain)" in r.output
    live = {tuple(x["series"]): x for x in json.loads(out.read_text())["live"]}
    assert live[("dyn", "smollm2")]["curve_basis"] == "lower_bound"
    # a lower-bound curve: its speedups stay, upper ends with every undrafted position accepted; the best
    # estimate is served with its confidence, never withheld as uncertain (#36; no blanket "ragged" refusal)
    dyn = live[("dyn", "smollm2")]
    assert "withheld" not in dyn and set(dyn["k_by_concurrency"]) == {"1", "4"} and not dyn["withheld_by_concurrency"]
    assert False in dyn["certain_by_concurrency"].values()
    assert "not yet the answer" in r.output
    assert live[("fixed", "smollm2")]["curve_basis"] == "exact"
    assert set(live[("fixed", "smollm2")]["k_by_concurrency"]) == {"1", "4"}
