"""Choosing k offline: the maths behind ``specwatch advise`` (a sweep's measured runs in, advice out).

Inputs are :class:`Measurement` objects, one per measured (server configuration, workload,
concurrency) cell of a sweep (``specwatch sweep``), built from the load generator's cell summary
(field names of ``vllm bench serve``: ``output_throughput``, ``mean_tpot_ms``,
``spec_decode_acceptance_length``, ``spec_decode_per_position_acceptance_rates``, …; the
spec-decode values come from the difference of the server's ``vllm:spec_decode_*`` counters over
the measured batches).

1. Acceptance length for every smaller k (:func:`predict_acceptance_lengths`).
   From the per-position acceptance rates r_i = Δper_pos[i] / Δdrafts of the run with the largest
   k (K), the expected mean acceptance length (tokens per verify step, bonus included) at k' ≤ K is

       E(k') = 1 + Σ_{i<k'} r_i

   exact for chain drafters (ngram, draft model, EAGLE chain) if the drafter behaves the same at
   k' as at K. For i.i.d. acceptance with probability α, r_i = α^(i+1) and
   E(k) = (1 − α^(k+1)) / (1 − α) (:func:`iid_expected_length`). The prediction is checked
   against the runs measured at k' < K: error = predicted − measured (and relative to measured).

2. Step time (:func:`fit_step_cost`). A running request gains 1 + a tokens per engine step
   (a accepted draft tokens; the 1 is the bonus or corrected token, or the plain token of a step
   without a draft), so over a cell the number of request-steps is

       S = G − A      (G = Δvllm:generation_tokens_total, A = Δ…num_accepted_tokens_total)

   and the tokens per request-step are τ = G / S (1 without speculation). With c requests
   decoding side by side, every engine step advances each of them once, so

       output_throughput = c × τ / T   ⇒   T = c × τ / output_throughput = 1 / ((thr / c) / τ)

   T is the *throughput-equivalent step time* (s): the step time that explains the measured
   throughput, prefill and batch tails amortised into it. (The TPOT route, T = TPOT × τ, measures
   the decode step alone; it is reported beside it — :attr:`Measurement.step_time_tpot_s` — but
   the throughput route is the one that predicts throughput.) c is the concurrency, capped by the
   prompts per batch. The verify cost grows with the draft tokens each request-step verifies,
   x = Δdraft_tokens / S (ngram proposes nothing when it finds no match, so x ≤ k), so for every
   (workload, concurrency) the speculative runs are fitted with

       T(x) = T₀ + β × x        (least squares over the measured k; β ≥ 0)

   T₀ is the step time of the speculative server with nothing to verify: on vLLM's CPU build it is
   larger than the baseline's step time (speculation switches to a slower model runner), which is
   why the baseline (k = 0) is not a point of the fit. With a single speculative run the slope
   comes from the configured cost model (:mod:`specwatch.specdecode.cost`):
   β = T₀ × (a + s × c), i.e. T = T₀ × c(x, c).

3. Throughput for every k' ≤ K (:func:`predict_throughputs`). With f = Δdrafts / S at K (share
   of request-steps that carry a draft) and d̄ = Δdraft_tokens / Δdrafts at K:

       τ̂(k') = 1 + f × Σ_{i<k'} r_i,   x̂(k') = f × min(k', d̄),
       thr̂(k') = c × τ̂(k') / T(x̂(k'))

   k' = 0 is the baseline's measured throughput. With ``acceptance="measured"`` (the CLI's
   default) a k that was run uses its own measured τ and x instead of the curve's, and a k that
   was not run takes the curve's value scaled by the measured / curve ratio interpolated between
   its nearest measured neighbours; ``"curve"`` predicts every k from the curve alone.

4. Recommendation (:func:`recommend`): the one decision rule of the project
   (:func:`specwatch.specdecode.decision.decide`, docs/choosing-k.md#the-decision-rule) on paired
   evidence. Batch i (same ``batch_index``, seed and number of prompts) of every configuration at
   a (workload, concurrency) served the same seeded prompts, so each configuration's speedup over
   the baseline is the paired ratio of its per-batch throughputs (:func:`paired_logs`; exp(mean
   log r_i) with interval exp(mean ± t·sd/√n), never negative; one batch: a value, no interval).
   The candidates (:func:`cell_candidates`) are off, every measured configuration — a fixed k and
   a dynamic table are two configurations — and, with ``candidates="all"``, the what-if k′ from
   the curve and the measured costs (basis calibrated). A configuration whose drafts were never
   accepted cannot pay (physics first). "All workloads" combines the per-workload ratios through
   time batch by batch on the log scale (:func:`combine_ratios_by_time`). The pick carries its
   confidence against the runner-up; uncertainty never turns into the smaller k or into off.
   :func:`evaluate_choices` measures each pick's shortfall against the best measured
   configuration of its cell.

5. What to run (:func:`configuration_advice`): the configuration picked at every measured
   concurrency, or per concurrency; a table composed from per-concurrency fixed-k picks
   (:func:`dynamic_schedule`) is a candidate to measure, never the answer: its
   ``num_speculative_tokens_per_batch_size`` ranges ``[start_bs, end_bs, k]`` (inclusive,
   starting at 1, boundaries at the geometric midpoint of neighbouring concurrencies, the last k
   carried forward by vLLM to max_num_seqs), and ``num_speculative_tokens`` = the largest k.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Any

from specwatch.choosek.measurement import KChoiceError, Measurement
from specwatch.specdecode.cost import estimated_speedups
from specwatch.specdecode.cost import CostModel
from specwatch.specdecode.decision import BASES, OFF, TOLERANCE, Candidate, Pick, StartSpread, decide, ratio_from_logs
from specwatch.specdecode.derive import expected_lengths

__all__ = [
    "AccuracyCell",
    "AcceptanceError",
    "AcceptancePrediction",
    "Advice",
    "Measurement",
    "Recommendation",
    "StepCostFit",
    "ThroughputError",
    "ThroughputPrediction",
    "advise",
    "advise_from_curve",
    "cell_scores",
    "candidate_name",
    "cell_candidates",
    "combine_ratios_by_time",
    "configuration_advice",
    "paired_logs",
    "log_throughput_interval",
    "unpaired_line",
    "dynamic_schedule",
    "evaluate_choices",
    "expected_length",
    "fit_step_cost",
    "iid_curve",
    "iid_expected_length",
    "predict_acceptance_lengths",
    "predict_throughputs",
    "recommend",
    "speculative_config_advice",
]

#: Default noise tolerance (relative): a smaller k within this fraction of the best predicted
#: throughput wins. The one tie tolerance of the project, :data:`specwatch.specdecode.decision.TOLERANCE`.
DEFAULT_TOLERANCE = TOLERANCE


# --------------------------------------------------------------------------------------------
# Expected acceptance length
# --------------------------------------------------------------------------------------------


def iid_curve(alpha: float, k: int) -> tuple[float, ...]:
    """Per-position acceptance rates of i.i.d. acceptance: r_i = α^(i+1), i = 0 … k-1.

    Raises KChoiceError unless 0 ≤ α ≤ 1 and k ≥ 0.
    """
    if not (0.0 <= alpha <= 1.0) or k < 0:
        raise KChoiceError(f"need 0 <= alpha <= 1 and k >= 0, got alpha={alpha!r}, k={k!r}")
    return tuple(alpha ** (i + 1) for i in range(k))


def iid_expected_length(alpha: float, k: int) -> float:
    """Expected mean acceptance length (tokens per verify step, bonus included) for i.i.d.
    acceptance α at k draft tokens: (1 − α^(k+1)) / (1 − α); k + 1 when α = 1.

    Raises KChoiceError unless 0 ≤ α ≤ 1 and k ≥ 0.
    """
    if not (0.0 <= alpha <= 1.0) or k < 0:
        raise KChoiceError(f"need 0 <= alpha <= 1 and k >= 0, got alpha={alpha!r}, k={k!r}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_length(rates: Sequence[float], k: int) -> float:
    """E(k) = 1 + Σ_{i<k} r_i from unconditional per-position acceptance rates (0–1) measured at
    some K ≥ k (``spec_decode_per_position_acceptance_rates``; vLLM's
    ``vllm:spec_decode_num_accepted_tokens_per_pos_total`` / ``…num_drafts_total``).

    Raises KChoiceError if k < 0 or k > len(rates).
    """
    if k < 0 or k > len(rates):
        raise KChoiceError(f"k={k} outside 0..{len(rates)} (the curve has {len(rates)} positions)")
    return expected_lengths(tuple(rates[:k]))[-1] if k else 1.0  # the one E(k): specdecode.derive


# --------------------------------------------------------------------------------------------
# 1. acceptance-length prediction
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AcceptancePrediction:
    """E(k) predicted from the curve measured at ``source_k`` against the length measured at k."""

    workload: str
    concurrency: int
    k: int
    source_k: int
    predicted: float
    measured: float | None
    measured_drafts: float | None = None  # Δdrafts behind the measured value (its sample size)

    @property
    def error(self) -> float | None:
        """predicted − measured (tokens per verify step)."""
        return None if self.measured is None else self.predicted - self.measured

    @property
    def relative_error(self) -> float | None:
        """(predicted − measured) / measured."""
        return None if self.measured is None else (self.predicted - self.measured) / self.measured


def _cells(ms: Iterable[Measurement]) -> dict[tuple[str, int], list[Measurement]]:
    out: dict[tuple[str, int], list[Measurement]] = defaultdict(list)
    for m in ms:
        out[(m.workload, m.concurrency)].append(m)
    return dict(sorted(out.items()))


def _source(runs: Sequence[Measurement]) -> Measurement | None:
    """The speculative run with the largest k that has a per-position curve and drafts."""
    spec = [m for m in runs if m.k > 0 and m.position_rates and m.drafts and m.curve_basis != "lower_bound"]
    # a fixed k before a dynamic table (its curve mixes widths), then the largest k
    return max(spec, key=lambda m: (not m.variable_width, m.k, len(m.position_rates))) if spec else None


def _lower_bound_source(runs: Sequence[Measurement]) -> Measurement | None:
    """The fixed-k speculative run with the largest k whose only curve is a lower bound (ragged drafts)."""
    spec = [m for m in runs if m.k > 0 and m.position_rates and m.drafts and m.curve_basis == "lower_bound"
            and not m.variable_width]
    return max(spec, key=lambda m: (m.k, len(m.position_rates))) if spec else None


def _measured_only(wl: str, c: int, by_k: Mapping[int, Measurement], basis: str) -> list[ThroughputPrediction]:
    """Predictions that are the measurements (no model): every fixed-k run of a cell."""
    return [ThroughputPrediction(wl, c, k, m.output_throughput, m.output_throughput, m.tokens_per_step or 1.0,
                                 m.verified_per_step or 0.0, m.step_time_s, m.noise, basis, log_throughput_interval(m),
                                 len(m.batch_throughputs) or None)
            for k, m in sorted(by_k.items()) if k > 0 and not m.variable_width]


def predict_acceptance_lengths(measurements: Iterable[Measurement]) -> list[AcceptancePrediction]:
    """For every (workload, concurrency): E(k) for k = 1 … K from the largest k's curve, with the
    measured mean acceptance length where k was run (``measured`` None otherwise; the source
    run's own k is included: its error is 0 by construction of vLLM's counters)."""
    out = []
    for (wl, c), runs in _cells(measurements).items():
        src = _source(runs)
        if src is None:
            continue
        measured = {m.k: m for m in runs if m.k > 0 and not m.ragged_drafts and not m.variable_width}
        for k in range(1, len(src.position_rates) + 1):
            m = measured.get(k)
            out.append(AcceptancePrediction(wl, c, k, src.k, expected_length(src.position_rates, k),
                                            None if m is None else m.acceptance_length,
                                            None if m is None else m.drafts))
    return out


# --------------------------------------------------------------------------------------------
# 2. step-cost fit
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepCostFit:
    """T(x) = intercept_s + slope_s × x for one (workload, concurrency) (see module docstring).

    ``points``: (k, x, T) of the speculative runs used; ``method``: "least-squares" or
    "cost-model" (one run; slope from :class:`specwatch.specdecode.cost.CostModel`);
    ``baseline_step_s``: the baseline's T (None if no baseline run).
    """

    workload: str
    concurrency: int
    intercept_s: float
    slope_s: float
    method: str
    points: tuple[tuple[int, float, float], ...]
    baseline_step_s: float | None = None

    def step_time(self, x: float) -> float:
        """Predicted step time (s) at x draft tokens verified per request-step."""
        return self.intercept_s + self.slope_s * x

    @property
    def max_residual(self) -> float:
        """Largest |T − T(x)| / T over the fitted points (0 for a single point)."""
        return max((abs(t - self.step_time(x)) / t for _, x, t in self.points), default=0.0)


def fit_step_cost(runs: Sequence[Measurement], prior: CostModel | None = None) -> StepCostFit | None:
    """Fit T(x) = T₀ + β x over the speculative runs of one (workload, concurrency).

    Returns None when no speculative run has a step time. Raises KChoiceError if ``runs`` mix
    workloads or concurrencies.
    """
    if not runs:
        return None
    keys = {(m.workload, m.concurrency) for m in runs}
    if len(keys) != 1:
        raise KChoiceError(f"fit_step_cost needs runs of one (workload, concurrency), got {sorted(keys)}")
    (wl, c), = keys
    prior = prior or CostModel()
    base = [m.step_time_s for m in runs if m.k == 0 and m.step_time_s is not None]
    pts = tuple(
        (m.k, m.verified_per_step, m.step_time_s)
        for m in sorted(runs, key=lambda m: m.k)
        if m.k > 0 and m.step_time_s is not None and m.verified_per_step is not None
    )
    if not pts:
        return None
    xs = [p[1] for p in pts]
    ts = [p[2] for p in pts]
    base_t = statistics.fmean(base) if base else None
    if len(pts) >= 2 and max(xs) - min(xs) > 1e-9:
        mx, mt = statistics.fmean(xs), statistics.fmean(ts)
        sxx = math.fsum((x - mx) ** 2 for x in xs)
        slope = math.fsum((x - mx) * (t - mt) for x, t in zip(xs, ts, strict=True)) / sxx
        if slope < 0:  # verifying more tokens never makes a step cheaper: treat as flat
            slope, intercept = 0.0, mt
        else:
            intercept = mt - slope * mx
        if intercept <= 0:  # keep T₀ physical: refit through a small positive intercept
            intercept = min(ts) * 0.5
            slope = max(0.0, math.fsum((t - intercept) * x for x, t in zip(xs, ts, strict=True)) / math.fsum(x * x for x in xs))
        return StepCostFit(wl, c, intercept, slope, "least-squares", pts, base_t)
    per_tok = prior.step_cost_per_draft_token + prior.step_cost_per_draft_token_per_running_request * c
    k, x, t = pts[-1]
    t0 = t / (1.0 + x * per_tok)
    return StepCostFit(wl, c, t0, t0 * per_tok, "cost-model", pts, base_t)


# --------------------------------------------------------------------------------------------
# 3. throughput prediction
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ThroughputPrediction:
    """Predicted output throughput (tok/s) at k for one (workload, concurrency), with the
    measured one where k was run (``measured`` None for a dynamic-table run: it ran other widths
    under its largest k, so its throughput is not that of a fixed k; a fixed-k run whose drafts
    were short keeps its measured throughput). k = 0 is the baseline (predicted = measured). ``verified_per_step`` x = f·min(k, d̄)
    draft tokens per request-step (f·k when the curve is an exact per-request one from a ragged
    cell: the prediction is for full drafts of k tokens)."""

    workload: str
    concurrency: int
    k: int
    predicted: float
    measured: float | None
    tokens_per_step: float
    verified_per_step: float
    step_time_s: float | None
    noise: float | None = None
    #: What the prediction rests on: "exact" (an exact per-position curve), "lower_bound" (only
    #: ragged drafts' lower-bound curves: a what-if for an unmeasured k is a lower bound of its
    #: acceptance, labelled so), "none" (no model could be made: ``predicted`` is the measurement) or
    #: "beyond_curve" (a measured k larger than the curve it would be predicted from — e.g. an exact
    #: per-request curve of ngram drafts that never exceeded 2 tokens: ``predicted`` is the measurement).
    curve_basis: str = "exact"
    #: The measured throughput's 95 % interval (tok/s, log scale: positive; shown, never decided on) and its
    #: measured batches (None: not run).
    interval: tuple[float, float] | None = None
    batches: int | None = None

    @property
    def relative_error(self) -> float | None:
        """(predicted − measured) / measured; None when not measured or not predicted (basis "none")."""
        if self.measured is None or self.curve_basis in ("none", "beyond_curve"):
            return None
        return (self.predicted - self.measured) / self.measured


def predict_throughputs(
    measurements: Iterable[Measurement], prior: CostModel | None = None, fit_ks: Iterable[int] | None = None,
    acceptance: str = "curve",
) -> tuple[list[ThroughputPrediction], list[StepCostFit]]:
    """Predicted throughput for k = 0 (baseline, if measured) and every k = 1 … K of each
    (workload, concurrency) with a speculative run, plus the step-cost fits used. A cell whose
    speculative runs made no draft at all is predicted with f = 0 (no gain, cost T₀).
    ``fit_ks``: fit the step cost only on the runs at these k (a held-out check: the other k are
    then predicted from the curve and the fit alone); None = every measured k.
    ``acceptance``: "curve" takes τ and x of every k from the largest k's curve; "measured" takes
    them from the run at that k where there is one (the curve only for k not run)."""
    if acceptance not in ("curve", "measured"):
        raise KChoiceError(f"acceptance must be 'curve' or 'measured', got {acceptance!r}")
    keep = None if fit_ks is None else {int(k) for k in fit_ks} | {0}
    preds: list[ThroughputPrediction] = []
    fits: list[StepCostFit] = []
    for (wl, c), runs in _cells(measurements).items():
        cell_preds, fit = _predict_cell(wl, c, runs, prior, keep, acceptance)
        preds.extend(cell_preds)
        if fit is not None:
            fits.append(fit)
    return preds, fits


@dataclass(frozen=True)
class _Curve:
    """The acceptance curve a cell's predictions come from: per-position rates, the fraction of
    request-steps with a draft f, and the mean draft length d̄."""

    rates: Sequence[float]
    f: float
    dbar: float

    def at(self, k: int) -> tuple[float, float]:
        """(τ, x) at k: tokens per request-step 1 + f·Σ rates[:k], draft tokens verified f·min(k, d̄)."""
        return 1.0 + self.f * math.fsum(self.rates[:k]), self.f * min(float(k), self.dbar)


def _predict_cell(wl: str, c: int, runs: Sequence[Measurement], prior: CostModel | None, keep: set[int] | None,
                  acceptance: str) -> tuple[list[ThroughputPrediction], StepCostFit | None]:
    """One (workload, concurrency) cell of :func:`predict_throughputs`: its predictions and the
    step-cost fit they used (None: no model, the runs are the predictions)."""
    by_k: dict[int, Measurement] = {}
    for m in runs:  # one fixed-k run per k (the latest wins if a family ran twice); a dynamic
        if not m.variable_width:  # table is a configuration of its own, never the run at its k
            by_k[m.k] = m
    preds: list[ThroughputPrediction] = []
    if 0 in by_k:
        b = by_k[0]
        preds.append(ThroughputPrediction(wl, c, 0, b.output_throughput, b.output_throughput, 1.0, 0.0, b.step_time_s,
                                          b.noise, "exact", log_throughput_interval(b), len(b.batch_throughputs) or None))
    src = _source(runs)
    basis = "exact"
    if src is None and any(m.curve_basis == "lower_bound" and m.drafts for m in runs):
        # only lower-bound curves (ragged drafts): the measured k keep their measured throughput;
        # the what-if for other k comes from the lower-bound curve, labelled lower_bound
        src, basis = _lower_bound_source(runs), "lower_bound"
        if src is None:  # a dynamic table's ragged run only: nothing at a fixed k to predict from
            return preds + _measured_only(wl, c, by_k, "none"), None
    # a table's step mixes widths: not a point of T(x) beside fixed-k runs (alone, the only one)
    fixed = [m for m in runs if not m.variable_width]
    if not any(m.k > 0 for m in fixed):
        fixed = list(runs)
    fit = fit_step_cost(fixed if keep is None else [m for m in fixed if m.k in keep], prior)
    if fit is None:
        return preds + _measured_only(wl, c, by_k, "none"), None  # no step time: no model, the runs still count
    src, curve = _acceptance_curve(src, basis, fixed)
    ratios = _measured_ratios(by_k, curve) if acceptance == "measured" else {}
    preds.extend(_curve_predictions(wl, c, by_k, curve, ratios, fit, src.effective_concurrency, basis))
    # a measured k beyond the source curve (e.g. a ragged k = 4 beside an exact k = 2): still a measurement
    preds.extend(_measured_only(wl, c, {k: m for k, m in by_k.items() if k > len(curve.rates)}, "beyond_curve"))
    return preds, fit


def _acceptance_curve(src: Measurement | None, basis: str, fixed: Sequence[Measurement]) -> tuple[Measurement, _Curve]:
    """Cell step: the run the curve comes from and the curve (f = 0 when no run drafted at all)."""
    if src is not None and src.draft_fraction is not None:
        rates, f = src.position_rates, src.draft_fraction
        dbar = src.draft_tokens_per_draft or float(src.k)
        if src.ragged_drafts and basis == "exact":
            # an exact per-request curve of a cell whose drafts were ragged (a dynamic table ran
            # shorter drafts): the curve is that of full drafts of j + 1 tokens, so k′ is predicted
            # as a fixed-width server verifying k′ tokens per draft (x = f·k′), not with the
            # cell's mean draft length d̄ (which would pair full-draft tokens with short-draft cost)
            dbar = float(len(rates))
        return src, _Curve(rates, f, dbar)
    # no drafts at all (e.g. ngram never found a match): every k verifies nothing and
    # gains nothing, so each k costs the speculative server's T0
    src = max((m for m in fixed if m.k > 0 and m.step_time_s is not None), key=lambda m: m.k)
    return src, _Curve((0.0,) * src.k, 0.0, float(src.k))


def _measured_ratios(by_k: Mapping[int, Measurement], curve: _Curve) -> dict[int, tuple[float, float]]:
    """Cell step (acceptance "measured"): measured / curve of τ and x at each k that was run with full drafts."""
    ratios: dict[int, tuple[float, float]] = {}
    for k, m in by_k.items():
        if (1 <= k <= len(curve.rates) and m.tokens_per_step is not None and m.verified_per_step is not None
                and not m.ragged_drafts):
            ct, cx = curve.at(k)
            ratios[k] = (m.tokens_per_step / ct, m.verified_per_step / cx if cx > 0 else 1.0)
    return ratios


def _ratio_at(ratios: Mapping[int, tuple[float, float]], k: int) -> tuple[float, float]:
    """Cell step: the measured / curve ratios at k, interpolated in k between the k that were run
    (the nearest one outside them)."""
    if k in ratios:
        return ratios[k]
    lo = max((j for j in ratios if j < k), default=None)
    hi = min((j for j in ratios if j > k), default=None)
    if lo is None or hi is None:
        return ratios[lo if hi is None else hi]
    w = (k - lo) / (hi - lo)
    return (ratios[lo][0] + w * (ratios[hi][0] - ratios[lo][0]),
            ratios[lo][1] + w * (ratios[hi][1] - ratios[lo][1]))


def _curve_predictions(wl: str, c: int, by_k: Mapping[int, Measurement], curve: _Curve,
                       ratios: Mapping[int, tuple[float, float]], fit: StepCostFit, ceff: float,
                       basis: str) -> list[ThroughputPrediction]:
    """Cell step: the predicted throughput of k = 1 … K from the curve (scaled by the measured
    ratios, if any) and the step-cost fit, beside the measurement where k was run."""
    out: list[ThroughputPrediction] = []
    for k in range(1, len(curve.rates) + 1):
        m = by_k.get(k)
        if m is not None and m.variable_width:
            m = None  # a dynamic table ran other widths under this k: not the throughput at k
        tau, x = curve.at(k)
        if ratios:
            # measured mode: ratio measured / curve at the k that were run, interpolated in k for the
            # k that were not (so an unmeasured k is not predicted with the curve's bias alone)
            rt, rx = _ratio_at(ratios, k)
            tau, x = tau * rt, x * rx
        t = fit.step_time(x)
        out.append(ThroughputPrediction(
            wl, c, k, ceff * tau / t, None if m is None else m.output_throughput, tau, x, t,
            None if m is None else m.noise, basis, None if m is None else log_throughput_interval(m),
            None if m is None else (len(m.batch_throughputs) or None),
        ))
    return out


# --------------------------------------------------------------------------------------------
# 4. recommendation
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recommendation:
    """The configuration to run for ``workload`` ("*" = all workloads together) at ``concurrency``,
    decided by the one rule (:func:`specwatch.specdecode.decision.decide`, docs/choosing-k.md#the-decision-rule)
    on paired per-batch ratios over the baseline.

    ``pick``: the :class:`~specwatch.specdecode.decision.Pick` (None when the row cannot be
    scored: ``reason`` says why); ``config``: the pick's name (``off``, ``k=4``, ``table
    [[1,2,4],[3,1024,1]]``); ``k``: its k (0 = speculation off; a table: its largest k);
    ``table``: the pick is a dynamic table; ``best_k``: the k of the best estimate; ``scores``:
    candidate name → speedup over the baseline (the paired geometric-mean ratio of a measured
    configuration, the calibrated prediction of a what-if k); ``speedup``: the pick's;
    ``batches``: candidate name → paired batches; ``tie``: the pick is a smaller k within the
    tolerance of the best estimate; ``notes``: one line per thing the row must say (batches
    that could not be paired, a configuration left out); ``combination``: how "*" combined the
    workloads; ``lower_bound_ks``: what-if k from a lower-bound curve (ragged drafts)."""

    workload: str
    concurrency: int
    k: int | None
    best_k: int | None
    tolerance: float
    scores: dict[str, float]
    speedup: float | None
    measured_ks: tuple[int, ...] = ()
    batches: dict[str, int] = field(default_factory=dict)
    tie: bool = False
    reason: str | None = None
    combination: str | None = None
    lower_bound_ks: tuple[int, ...] = ()
    pick: Pick | None = None
    config: str | None = None
    table: bool = False
    notes: tuple[str, ...] = ()

    @property
    def speculation_off(self) -> bool:
        return self.k == 0

    @property
    def one_batch(self) -> tuple[str, ...]:
        """Measured candidates with a single paired batch (a value, no interval)."""
        return tuple(n for n, b in self.batches.items() if b == 1)

    @property
    def verdict(self) -> str | None:
        """Speculation against the baseline (pays, loses, cannot_tell); None when not scored."""
        return None if self.pick is None else self.pick.verdict

    @property
    def interval(self) -> tuple[float, float] | None:
        """The pick's speedup interval (positive; None: one batch or speculation off)."""
        p = self.pick
        if p is None or p.pick.off or not p.pick.has_interval:
            return None
        return (p.pick.lower, p.pick.upper)

    def to_json(self) -> dict[str, Any]:
        """The row as JSON: workload, concurrency, k, config, table, reason, scores, batches,
        notes, combination and ``pick`` (:meth:`specwatch.specdecode.decision.Pick.to_json`)."""
        return {"workload": self.workload, "concurrency": self.concurrency, "k": self.k, "config": self.config,
                "table": self.table, "best_k": self.best_k, "speedup": self.speedup, "verdict": self.verdict,
                "tie": self.tie, "reason": self.reason, "scores": dict(self.scores), "batches": dict(self.batches),
                "measured_ks": list(self.measured_ks), "notes": list(self.notes), "combination": self.combination,
                "lower_bound_ks": list(self.lower_bound_ks), "tolerance": self.tolerance,
                "pick": None if self.pick is None else self.pick.to_json()}


def parse_mix(text: str, workloads: Iterable[str]) -> dict[str, float]:
    """``--mix copy=3,random-output=1`` → {workload: weight}: each workload's share of the work
    (output tokens). Raises KChoiceError (one line) for a malformed item, a workload not in
    ``workloads`` or a weight that is not a positive finite number."""
    known = list(dict.fromkeys(workloads))
    out: dict[str, float] = {}
    for item in (x.strip() for x in text.split(",") if text.strip()):
        if not item:
            raise KChoiceError(f"--mix: an empty item in {text!r} (a comma too many?); give WORKLOAD=WEIGHT items, "
                               "e.g. copy=3,random-output=1")
        name, eq, val = item.partition("=")
        name = name.strip()
        if not eq or not name:
            raise KChoiceError(f"--mix: {item!r} is not WORKLOAD=WEIGHT (e.g. copy=3,random-output=1)")
        if name not in known:
            raise KChoiceError(f"--mix: unknown workload {name!r} (the sweep measured {', '.join(known) or 'none'})")
        try:
            w = float(val)
        except ValueError:
            raise KChoiceError(f"--mix: weight of {name} is not a number: {val!r}") from None
        if not (math.isfinite(w) and w > 0):
            raise KChoiceError(f"--mix: weight of {name} must be a positive number, got {val!r}")
        if name in out:
            raise KChoiceError(f"--mix: {name} given twice")
        out[name] = w
    if not out:
        raise KChoiceError("--mix is empty (give WORKLOAD=WEIGHT items, e.g. copy=3,random-output=1)")
    if not math.isfinite(sum(out.values())):  # (fsum raises OverflowError instead)
        raise KChoiceError("--mix: the weights add up to more than a float holds; only their ratios count, so give "
                           "smaller numbers (e.g. copy=3,random-output=1)")
    return out


def combine_by_time(throughputs: Mapping[str, float], weights: Mapping[str, float],
                    half_widths: Mapping[str, float] | None = None) -> tuple[float, float | None]:
    """Combined throughput (tok/s) of a mix in which workload i brings the share w_i of the output
    tokens, served at throughput x_i: the time per token is Σ w_i / x_i (w normalised to sum 1),
    so the combined throughput is 1 / Σ (w_i / x_i) — a weighted harmonic mean. Ratios of two
    such throughputs (k against the baseline) are the weighted harmonic mean of the per-workload
    speedups, weighted by each workload's share of the baseline's time (the plain harmonic mean
    when the baseline serves every workload equally fast). ``half_widths``: 95 % half widths of
    the x_i; the second value is the combined throughput's half width (first-order propagation,
    None when a workload has none). Raises KChoiceError for a non-positive throughput or weight."""
    total = math.fsum(weights.values())
    if total <= 0 or any(w <= 0 for w in weights.values()):
        raise KChoiceError("mix weights must be positive")
    if any(throughputs[wl] <= 0 for wl in weights):
        raise KChoiceError("throughputs must be positive to combine them through time")
    t = math.fsum(weights[wl] / total / throughputs[wl] for wl in weights)
    comb = 1.0 / t
    if half_widths is None or any(half_widths.get(wl) is None for wl in weights):
        return comb, None
    ht = math.sqrt(math.fsum((weights[wl] / total * half_widths[wl] / throughputs[wl] ** 2) ** 2 for wl in weights))
    return comb, ht * comb * comb


def combine_ratios_by_time(ratios: Mapping[str, Candidate], time_shares: Mapping[str, float], name: str,
                           k: int, *, table: bool = False) -> Candidate:
    """One candidate's speedup over the baseline for a mix of workloads (:func:`combine_by_time`'s
    semantics on speedups: S = 1 / Σ v_w / r_w, v_w the workload's share of the baseline's time,
    normalised here), on the log scale so the interval stays positive: when every workload has
    per-batch log ratios of the same length n, batch i's speedups combine into S_i and the
    candidate is the paired ratio of the log S_i (kept as its ``log_ratios``); otherwise S from
    the values with the log half-width Σ-propagated (∂log S/∂log r_w = (v_w / r_w) / Σ v / r,
    in quadrature), no interval when a workload has none. ``ratios``: workload → candidate;
    the basis is the weakest among them; never accepted only when it is in every workload.
    Raises KChoiceError for a missing workload or a non-positive share."""
    if set(ratios) != set(time_shares) or not ratios:
        raise KChoiceError(f"{name}: ratios for {sorted(ratios)} but shares for {sorted(time_shares)}")
    total = math.fsum(time_shares.values())
    if total <= 0 or any(v <= 0 for v in time_shares.values()):
        raise KChoiceError("time shares must be positive")
    v = {w: s / total for w, s in time_shares.items()}
    parts = list(ratios.values())
    if all(c.off for c in parts):
        return Candidate.speculation_off()
    basis = max((c.basis for c in parts), key=BASES.index)
    never = all(c.never_accepted for c in parts)
    logs = [c.log_ratios for c in parts]
    if all(lr for lr in logs) and len({len(lr) for lr in logs}) == 1:
        n = len(logs[0])
        per_batch = [-math.log(math.fsum(v[w] / math.exp(ratios[w].log_ratios[i]) for w in ratios)) for i in range(n)]
        return Candidate.from_ratio(name, k, ratio_from_logs(per_batch), basis=basis, log_ratios=per_batch,
                                    never_accepted=never, table=table)
    inv = {w: v[w] / ratios[w].value for w in ratios}
    s = 1.0 / math.fsum(inv.values())
    if not all(c.has_interval for c in parts):
        return Candidate(name, k, s, None, None, basis, None, never, table, None)
    h = math.sqrt(math.fsum((inv[w] * s * max(math.log(ratios[w].upper / ratios[w].value),
                                              math.log(ratios[w].value / ratios[w].lower))) ** 2 for w in ratios))
    return Candidate(name, k, s, min(s, s * math.exp(-h)), max(s, s * math.exp(h)), basis, None, never, table, None)


def cell_scores(ps: Mapping[int, ThroughputPrediction], basis: str = "measured") -> dict[int, float]:
    """Score (output tokens/s) of every k of one (workload, concurrency) cell.

    ``basis="model"``: the prediction. ``basis="measured"``: the measured throughput of a k that
    was run; for a k that was not, the prediction times the measured / predicted ratio of the
    measured k > 0 around it (linear in k between the nearest measured neighbours, the nearest
    one's ratio beyond them; the plain prediction when no k > 0 was measured).
    """
    if basis == "model":
        return {k: p.predicted for k, p in ps.items()}
    ratios = {k: p.measured / p.predicted for k, p in ps.items()
              if k > 0 and p.measured is not None and p.predicted > 0}
    out: dict[int, float] = {}
    for k, p in ps.items():
        if p.measured is not None:
            out[k] = p.measured
            continue
        lo = max((j for j in ratios if j < k), default=None)
        hi = min((j for j in ratios if j > k), default=None)
        if lo is None and hi is None:
            r = 1.0
        elif lo is None or hi is None:
            r = ratios[hi if lo is None else lo]
        else:
            r = ratios[lo] + (k - lo) / (hi - lo) * (ratios[hi] - ratios[lo])
        out[k] = p.predicted * r
    return out


def candidate_name(m: Measurement) -> str:
    """How a configuration is shown and keyed in the advice: ``off`` (the baseline), ``k=4`` (a
    fixed k), ``table [[1,2,4],[3,1024,1]]`` (a dynamic table: a configuration of its own)."""
    if m.k == 0:
        return OFF
    if m.variable_width:
        rows = [list(r) for r in m.table] if m.table else None
        return "table " + (json.dumps(rows, separators=(",", ":")) if rows else f"(k ≤ {m.k})")
    return f"k={m.k}"


def paired_logs(spec: Measurement, base: Measurement) -> tuple[list[float], list[int]]:
    """The per-batch log(spec_i / base_i) of the batches both served with the same seeded prompts
    (:meth:`specwatch.choosek.measurement.BatchPoint.pairs_with`: same batch index, seed and
    number of prompts), in batch order, and the indices of ``spec``'s batches that have no such
    partner (another seed, another number of prompts, a batch the baseline did not run). A paired
    sweep cell pairs with the baseline batches measured beside it (``spec.paired_baseline``, issue
    #37), a sequential one with the baseline's own cell."""
    by_index = {b.index: b for b in (spec.paired_baseline or base.batch_points)}
    logs, unpaired = [], []
    for b in sorted(spec.batch_points, key=lambda b: b.index):
        o = by_index.get(b.index)
        if o is not None and b.pairs_with(o) and b.throughput > 0 and o.throughput > 0:
            logs.append(math.log(b.throughput / o.throughput))
        else:
            unpaired.append(b.index)
    return logs, unpaired


def log_throughput_interval(m: Measurement) -> tuple[float, float] | None:
    """The 95 % interval (tok/s) of a cell's throughput on the log scale (exp(mean log x ± t·sd/√n)
    over its measured batches: always positive; shown, never decided on); None with one batch."""
    xs = [x for x in m.batch_throughputs if x > 0]
    if len(xs) < 2:
        return None
    r = ratio_from_logs([math.log(x) for x in xs])
    return (r.lower, r.upper)


def _halfwidth(c: Candidate) -> float | None:
    return c.log_halfwidth


#: The tail of a note on batches that could not be paired (:func:`unpaired_line` gathers them).
UNPAIRED_NOTE = (" not paired with the baseline's (another seed, number of prompts or batch): "
                 "left out of the ratio")


def unpaired_line(notes: Iterable[str]) -> str | None:
    """One line naming every cell whose batches could not be paired (from the rows' ``notes``),
    e.g. ``not paired with the baseline's batches (…): ngram-k4/copy/c=2 batch 1, 2``; None
    when every batch was paired."""
    cells = list(dict.fromkeys(n[:-len(UNPAIRED_NOTE)].replace(": batch", " batch") for n in notes
                               if n.endswith(UNPAIRED_NOTE)))
    if not cells:
        return None
    return ("not paired with the baseline's batches (another seed, number of prompts or batch; left out of the "
            "ratios): " + "; ".join(cells))


def cell_candidates(runs: Sequence[Measurement], ps: Mapping[int, ThroughputPrediction], *,
                    candidates: str = "measured", basis: str = "measured",
                    start_spread: StartSpread | None = None) -> tuple[list[Candidate], list[str]]:
    """The decision's candidates in one (workload, concurrency) cell and the lines the row must
    say: off, every measured configuration (fixed k and dynamic tables alike) with its paired
    ratio over the baseline (``log_ratios`` kept; never accepted from the counters), and with
    ``candidates="all"`` every what-if k′ from the curve and the measured costs (basis
    calibrated, the interval of the nearest measured k's paired ratio, no log ratios).
    ``basis="model"``: a measured fixed k is scored by its prediction (calibrated) instead.
    ``start_spread``: the between-server-starts term (A/A, :class:`StartSpread`) added to every
    measured candidate's interval (each configuration is its own start); a what-if k′ takes the
    interval of the measured k it is anchored on, that start's term included.
    Returns ([], [reason]) when the cell has no baseline run."""
    base = next((m for m in runs if m.k == 0), None)
    if base is None:
        return [], ["no baseline (k = 0) run here: a speedup needs the baseline's batches to pair with"]
    out: list[Candidate] = [Candidate.speculation_off()]
    notes: list[str] = []
    seen: set[str] = {OFF}
    fixed_iv: dict[int, float] = {}
    fixed_start: dict[int, str] = {}
    for m in sorted((m for m in runs if m.k > 0), key=lambda m: (m.variable_width, m.k, m.config)):
        name = candidate_name(m)
        if name in seen:
            name = f"{name} ({m.config})"
        seen.add(name)
        logs, unpaired = paired_logs(m, base)
        where = f"{m.config}/{m.workload}/c={m.concurrency}"
        if unpaired:
            notes.append(f"{where}: batch {', '.join(map(str, unpaired))}{UNPAIRED_NOTE}")
        if not logs:
            cand = Candidate(name, m.k, m.output_throughput / base.output_throughput, None, None, "measured",
                             None, m.never_accepted, m.variable_width, None)
        else:
            cand = Candidate.from_ratio(name, m.k, ratio_from_logs(logs), log_ratios=logs,
                                        never_accepted=m.never_accepted, table=m.variable_width)
        cand = cand.with_start_spread(start_spread, m.config)
        if not m.variable_width and cand.has_interval:
            fixed_iv[m.k] = _halfwidth(cand) or 0.0
            fixed_start[m.k] = m.config
        p = ps.get(m.k)
        if basis == "model" and not m.variable_width and p is not None and p.curve_basis not in ("none", "beyond_curve"):
            v = p.predicted / base.output_throughput
            h = _halfwidth(cand)
            cand = Candidate(name, m.k, v, None if h is None else v * math.exp(-h), None if h is None else v * math.exp(h),
                             "calibrated", None, m.never_accepted, False, cand.batches,
                             start_log_halfwidth=cand.start_log_halfwidth, start=cand.start)
        out.append(cand)
    if candidates == "all" and ps:
        scores = cell_scores(ps, basis)
        measured_fixed = {m.k for m in runs if m.k > 0 and not m.variable_width}
        # physics: a what-if from a curve of drafts never accepted cannot pay either
        never = bool(measured_fixed) and all(m.never_accepted for m in runs if m.k > 0 and not m.variable_width)
        for k in sorted(scores):
            if k == 0 or k in measured_fixed or ps[k].measured is not None:
                continue
            v = scores[k] / base.output_throughput
            near = min(fixed_iv, key=lambda j: (abs(j - k), j), default=None)
            h = None if near is None else fixed_iv[near]
            out.append(Candidate(f"k={k}", k, v, None if h is None else v * math.exp(-h),
                                 None if h is None else v * math.exp(h), "calibrated", never_accepted=never,
                                 start_log_halfwidth=0.0 if start_spread is None or near is None
                                 else start_spread.log_halfwidth,
                                 start=None if near is None else fixed_start.get(near)))
    return out, notes


def recommend(
    predictions: Iterable[ThroughputPrediction],
    tolerance: float = DEFAULT_TOLERANCE,
    candidates: str = "measured",
    basis: str = "model",
    *,
    mix: Mapping[str, float] | None = None,
    expected: Mapping[tuple[str, int], str] | None = None,
    measurements: Sequence[Measurement] | None = None,
    start_spread: StartSpread | None = None,
) -> list[Recommendation]:
    """Per (workload, concurrency) and per concurrency over all workloads ("*"): the pick of the
    one decision rule (:func:`specwatch.specdecode.decision.decide`) among
    :func:`cell_candidates` (off, every measured configuration with its paired ratio over the
    baseline, and with ``candidates="all"`` the what-if k′). ``measurements``: the cells' runs
    (their batches are the paired evidence); without them each measured k of ``predictions``
    is a candidate with its throughput ratio and no interval (nothing to pair). "*" combines
    the workloads through time on the log scale (:func:`combine_ratios_by_time`): ``mix`` =
    workload → share of the work (default: the same work from every workload). ``expected``:
    every (workload, concurrency) that must get a row, with the reason to give when it cannot
    be scored; "*" is not scored at a concurrency where a workload of the mix has no scored row.
    ``start_spread``: the between-server-starts term (:func:`cell_candidates`); over all
    workloads it is taken whole (one start serves every workload: its offsets are not assumed to
    average out). Raises KChoiceError for a bad tolerance, candidates, basis or mix."""
    if not (0.0 <= tolerance < 1.0):
        raise KChoiceError(f"tolerance must be in [0, 1), got {tolerance!r}")
    if candidates not in ("measured", "all"):
        raise KChoiceError(f"candidates must be 'measured' or 'all', got {candidates!r}")
    if basis not in ("measured", "model"):
        raise KChoiceError(f"basis must be 'measured' or 'model', got {basis!r}")
    if mix is not None and (not mix or any(not (w > 0) for w in mix.values())):
        raise KChoiceError(f"mix weights must be positive, got {dict(mix)!r}")
    cells: dict[tuple[str, int], dict[int, ThroughputPrediction]] = defaultdict(dict)
    for p in predictions:
        cells[(p.workload, p.concurrency)][p.k] = p
    runs_by_cell = _cells(measurements or [])
    if measurements is None:  # predictions only: their measured throughputs, one "batch" each
        runs_by_cell = {key: [Measurement(f"k{k}", k, key[0], key[1], p.measured, batch_throughputs=(p.measured,))
                              for k, p in ps.items() if p.measured is not None and p.measured > 0]
                        for key, ps in cells.items()}
    keys = sorted(set(cells) | set(runs_by_cell) | set(expected or {}))
    out: list[Recommendation] = []
    per_conc: dict[int, dict[str, tuple[Recommendation, list[Candidate], float]]] = defaultdict(dict)
    unscored: dict[int, dict[str, str]] = defaultdict(dict)
    for wl, c in keys:
        ps = cells.get((wl, c), {})
        runs = runs_by_cell.get((wl, c), [])
        cands, notes = cell_candidates(runs, ps, candidates=candidates, basis=basis, start_spread=start_spread)
        measured_ks = tuple(sorted({m.k for m in runs}))
        if not any(not x.off for x in cands):
            reason = notes[0] if not cands and runs else (expected or {}).get((wl, c)) or (
                "no speculative run with a measured throughput" if cands else "no finished run")
            out.append(Recommendation(wl, c, None, None, tolerance, {}, None, measured_ks, reason=reason,
                                      notes=tuple(notes)))
            unscored[c][wl] = reason
            continue
        r = _recommendation(wl, c, cands, tolerance, measured_ks, notes,
                            lower_bound=tuple(sorted(k for k, p in ps.items() if k > 0 and p.curve_basis == "lower_bound"
                                                     and p.measured is None)) if candidates == "all" else ())
        out.append(r)
        base = next(m for m in runs if m.k == 0)
        per_conc[c][wl] = (r, cands, base.output_throughput)
    for c in sorted(set(per_conc) | set(unscored)):
        rows = per_conc.get(c, {})
        present = sorted(set(rows) | set(unscored.get(c, {})))
        weights = {wl: 1.0 for wl in present} if mix is None else {wl: w for wl, w in mix.items()}
        how = ("time, equal work: " + ", ".join(weights)) if mix is None else (
            "time, mix " + ", ".join(f"{wl}={w:g}" for wl, w in weights.items()))
        missing = [wl for wl in weights if wl not in rows]
        if missing:
            why = "; ".join(f"{wl}: {unscored[c][wl]}" if wl in unscored.get(c, {}) else f"{wl}: not measured at c={c}"
                            for wl in missing)
            out.append(Recommendation("*", c, None, None, tolerance, {}, None, reason=f"not every workload is scored ({why})",
                                      combination=how))
            continue
        by_name = {wl: {x.name: x for x in rows[wl][1]} for wl in weights}
        common = [n for n in by_name[next(iter(weights))] if all(n in by_name[wl] for wl in weights)]
        left = sorted({n for wl in weights for n in by_name[wl]} - set(common))
        if not any(n != OFF for n in common):
            out.append(Recommendation("*", c, None, None, tolerance, {}, None, combination=how,
                                      reason="no configuration was measured for every workload of the mix"
                                      + (f" ({', '.join(left)} only for some)" if left else "")))
            continue
        shares = {wl: weights[wl] / rows[wl][2] for wl in weights}  # the baseline's time per unit of work
        cands = [_with_start(combine_ratios_by_time({wl: by_name[wl][n].without_start() for wl in weights}, shares, n,
                                                    by_name[next(iter(weights))][n].k,
                                                    table=by_name[next(iter(weights))][n].table),
                             [by_name[wl][n] for wl in weights], start_spread) for n in common]
        notes = [f"{n}: not measured for every workload of the mix, left out of all workloads" for n in left]
        lb = tuple(sorted({k for wl in weights for k in rows[wl][0].lower_bound_ks}))
        out.append(_recommendation("*", c, cands, tolerance, tuple(sorted({k for wl in weights for k in rows[wl][0].measured_ks})),
                                   notes, lower_bound=lb, combination=how))
    return out


def _with_start(comb: Candidate, parts: Sequence[Candidate], spread: StartSpread | None) -> Candidate:
    """A candidate combined over workloads (from its parts with their start term taken out,
    :meth:`Candidate.without_start`) with the start term added back whole, once: one start serves
    every workload, so its offsets are not assumed to average out (whether the combination was
    rebuilt from per-batch log ratios or propagated from the parts' intervals)."""
    if comb.off or spread is None:
        return comb
    start = next((p.start for p in parts if p.start is not None), None)
    if any(p.start_log_halfwidth > 0.0 for p in parts) or comb.log_ratios is not None:
        return comb.with_start_spread(spread, start)
    return dataclasses.replace(comb, start=start)


def _recommendation(wl: str, c: int, cands: Sequence[Candidate], tolerance: float, measured_ks: tuple[int, ...],
                    notes: Sequence[str], *, lower_bound: tuple[int, ...] = (), combination: str | None = None) -> Recommendation:
    p = decide(cands, tolerance)
    return Recommendation(wl, c, p.pick.k, p.best.k, tolerance, {x.name: x.value for x in p.candidates},
                          p.pick.value, measured_ks,
                          batches={x.name: x.batches for x in p.candidates if x.batches and not x.off},
                          tie=p.tie, combination=combination, lower_bound_ks=lower_bound, pick=p, config=p.pick.name,
                          table=p.pick.table, notes=tuple(notes))


# --------------------------------------------------------------------------------------------
# 5. vLLM configuration
# --------------------------------------------------------------------------------------------


def dynamic_schedule(k_by_concurrency: Mapping[int, int]) -> list[list[int]]:
    """vLLM's ``num_speculative_tokens_per_batch_size`` from the k chosen at measured
    concurrencies: inclusive ranges ``[start_bs, end_bs, k]`` starting at 1; the boundary between
    neighbouring concurrencies c₁ < c₂ is ⌊√(c₁ c₂)⌋ (geometric midpoint, at least c₁); the last
    range ends at the largest concurrency (vLLM carries its k forward to max_num_seqs); adjacent
    ranges with the same k are merged. Raises KChoiceError for an empty mapping or bad values.
    """
    if not k_by_concurrency:
        raise KChoiceError("no concurrencies to build a schedule from")
    items = sorted((int(c), int(k)) for c, k in k_by_concurrency.items())
    if items[0][0] < 1 or any(k < 0 for _, k in items):
        raise KChoiceError(f"concurrencies must be >= 1 and k >= 0, got {items}")
    ranges: list[list[int]] = []
    start = 1
    for i, (c, k) in enumerate(items):
        end = c if i == len(items) - 1 else max(c, math.isqrt(c * items[i + 1][0]))
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = end
        else:
            ranges.append([start, end, k])
        start = end + 1
    return ranges


def speculative_config_advice(base_config: Mapping[str, Any] | None, k_by_concurrency: Mapping[int, int]) -> dict[str, Any] | None:
    """The ``--speculative-config`` to paste: ``base_config`` (e.g. the sweep's ngram settings)
    with ``num_speculative_tokens`` = the largest chosen k and, when the choice differs across
    concurrencies, ``num_speculative_tokens_per_batch_size``. None when every choice is k = 0
    (run without ``--speculative-config``)."""
    kmax = max(k_by_concurrency.values(), default=0)
    if kmax == 0:
        return None
    cfg = dict(base_config or {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 5})
    cfg.pop("num_speculative_tokens_per_batch_size", None)
    cfg["num_speculative_tokens"] = kmax
    if len(set(k_by_concurrency.values())) > 1:
        cfg["num_speculative_tokens_per_batch_size"] = dynamic_schedule(k_by_concurrency)
    return cfg


# --------------------------------------------------------------------------------------------
# 6. accuracy of the choice against the measurements
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AccuracyCell:
    """Measured throughput of the picked configuration against the best measured configuration
    of one cell (fixed k, dynamic table or off: mean output tokens/s of the measured batches).
    ``shortfall`` = 1 − picked / best (0 when the best was picked; None when the pick is a
    what-if that was not measured)."""

    workload: str
    concurrency: int
    picked_k: int
    best_k: int
    picked_throughput: float | None
    best_throughput: float
    #: 95 % intervals (tok/s, log scale: positive) of the picked and the best configurations'
    #: throughputs (None: 1 batch). Shown, never decided on.
    picked_interval: tuple[float, float] | None = None
    best_interval: tuple[float, float] | None = None
    #: The pick is a smaller k within the tolerance of the best estimate.
    tie: bool = False
    picked: str = ""
    best: str = ""

    @property
    def shortfall(self) -> float | None:
        if self.picked_throughput is None:
            return None
        return 1.0 - self.picked_throughput / self.best_throughput


def evaluate_choices(recs: Iterable[Recommendation], measurements: Iterable[Measurement]) -> list[AccuracyCell]:
    """For every scored per-workload recommendation, the measured throughput of the picked
    configuration against the best measured configuration of the cell (off = the baseline; a
    dynamic table is a configuration of its own)."""
    measured: dict[tuple[str, int], dict[str, Measurement]] = defaultdict(dict)
    for m in measurements:
        measured[(m.workload, m.concurrency)][candidate_name(m)] = m
    out = []
    for r in recs:
        if r.workload == "*" or r.k is None or r.config is None:
            continue
        ms = measured.get((r.workload, r.concurrency))
        if not ms:
            continue
        best = max(ms, key=lambda n: ms[n].output_throughput)
        picked = ms.get(r.config)
        out.append(AccuracyCell(r.workload, r.concurrency, r.k, ms[best].k,
                                None if picked is None else picked.output_throughput, ms[best].output_throughput,
                                None if picked is None else log_throughput_interval(picked), log_throughput_interval(ms[best]),
                                r.tie, r.config, best))
    return out


@dataclass(frozen=True)
class AcceptanceError:
    """How far the acceptance-length predictions E(k) fall from the measured k < K
    (:meth:`Advice.acceptance_error_over`): ``n`` runs that made at least ``min_drafts`` drafts,
    the mean and max |relative error| (fractions; None without a run)."""

    n: int
    min_drafts: float
    mean_abs_relative: float | None
    max_abs_relative: float | None

    def to_json(self) -> dict[str, Any]:
        """``{"n", "min_drafts", "mean_abs_relative", "max_abs_relative"}``."""
        return {"n": self.n, "min_drafts": self.min_drafts, "mean_abs_relative": self.mean_abs_relative,
                "max_abs_relative": self.max_abs_relative}


@dataclass(frozen=True)
class ThroughputError:
    """How far the throughput predictions fall from the measured k > 0 (:attr:`Advice.throughput_error`):
    ``n`` runs, the mean and max |relative error| (fractions; None without a run). ``exact_fit``:
    every measured run was one of ≤ 2 points its step-cost fit passes through (zero error by
    construction, no error estimate); then ``max_points`` (the most points of a fit) and
    ``parameters`` (2 for a least-squares line, else 1), else both None."""

    n: int
    mean_abs_relative: float | None
    max_abs_relative: float | None
    exact_fit: bool
    max_points: int | None = None
    parameters: int | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"n", "mean_abs_relative", "max_abs_relative", "exact_fit"}``, then ``max_points`` and
        ``parameters`` for an exact fit."""
        out: dict[str, Any] = {"n": self.n, "mean_abs_relative": self.mean_abs_relative,
                               "max_abs_relative": self.max_abs_relative, "exact_fit": self.exact_fit}
        if self.exact_fit:
            out["max_points"] = self.max_points
            out["parameters"] = self.parameters
        return out


# --------------------------------------------------------------------------------------------
# Everything together
# --------------------------------------------------------------------------------------------


@dataclass
class Advice:
    """All advice for one speculative family (``family``: its config without k and without a
    dynamic table, JSON; its fixed k and its tables are configurations of their own).

    ``config_by_concurrency``: the all-workloads pick's name per concurrency;
    ``k_by_concurrency``: its k; ``speculative_config``: the config to paste when one
    configuration is the pick at every measured concurrency (None: speculation off everywhere,
    or no single answer); ``answer``: ``off``, ``one`` (one configuration everywhere),
    ``per_concurrency`` (different picks) or None (nothing scored); ``config_of``: each picked
    name → its speculative config (None for off); ``candidate_config``: a table composed from the
    per-concurrency fixed-k picks — a candidate to measure (``measure_command``), never the
    answer."""

    family: str
    tolerance: float
    acceptance: list[AcceptancePrediction]
    throughput: list[ThroughputPrediction]
    fits: list[StepCostFit]
    recommendations: list[Recommendation]
    accuracy: list[AccuracyCell]
    k_by_concurrency: dict[int, int] = field(default_factory=dict)
    speculative_config: dict[str, Any] | None = None
    noise: float | None = None
    basis: str = "measured"
    #: --mix: workload → share of the work for "all workloads" (None: the same work from each).
    mix: dict[str, float] | None = None
    config_by_concurrency: dict[int, str] = field(default_factory=dict)
    answer: str | None = None
    config_of: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    candidate_config: dict[str, Any] | None = None
    measure_command: str | None = None
    #: The measured dynamic tables: name → (workload, concurrency) → (throughput tok/s, its 95 %
    #: interval on the log scale or None, measured batches). Shown beside the fixed k.
    table_throughputs: dict[str, dict[tuple[str, int], tuple[float, tuple[float, float] | None, int]]] = \
        field(default_factory=dict)
    #: The between-server-starts term every interval holds (the sweep's A/A cells), None when
    #: the sweep measured none (then the intervals hold one start of each server only).
    start_spread: StartSpread | None = None
    #: The sweep's A/A configurations (``--aa-starts``), whether or not their cells were usable.
    aa_starts: tuple[str, ...] = ()

    def acceptance_error_over(self, min_drafts: float = 0.0) -> AcceptanceError:
        """Mean and max |relative error| of E(k) over the measured k < K whose run made at least
        ``min_drafts`` drafts (a run with a handful of drafts measures its length poorly)."""
        errs = [abs(p.relative_error) for p in self.acceptance
                if p.k < p.source_k and p.relative_error is not None and (p.measured_drafts or 0) >= min_drafts]
        return AcceptanceError(n=len(errs), min_drafts=min_drafts, mean_abs_relative=statistics.fmean(errs) if errs else None,
                               max_abs_relative=max(errs) if errs else None)

    @property
    def acceptance_error(self) -> AcceptanceError:
        """Mean and max |relative error| of E(k) over every measured k < K."""
        return self.acceptance_error_over(0.0)

    @property
    def throughput_error(self) -> ThroughputError:
        """Mean and max |relative error| of the throughput prediction over the measured k > 0
        (:class:`ThroughputError`); ``exact_fit`` when every measured run was one of ≤ 2 points its
        step-cost fit passes through (zero error by construction, no error estimate), then with
        ``max_points`` and ``parameters``."""
        errs = [abs(p.relative_error) for p in self.throughput if p.k > 0 and p.relative_error is not None]
        # T0 + β·x fitted on 2 runs (or the cost model on 1) passes through them: the error at the
        # fitted runs is zero by construction and says nothing about the model
        fitted = {(f.workload, f.concurrency, k) for f in self.fits for k, _, _ in f.points}
        measured = [p for p in self.throughput if p.k > 0 and p.relative_error is not None]
        exact = bool(measured) and all((p.workload, p.concurrency, p.k) in fitted for p in measured) \
            and all(len(f.points) <= 2 for f in self.fits) and max(errs) < 1e-9
        return ThroughputError(
            n=len(errs), mean_abs_relative=statistics.fmean(errs) if errs else None,
            max_abs_relative=max(errs) if errs else None, exact_fit=exact,
            max_points=max(len(f.points) for f in self.fits) if exact else None,
            parameters=(2 if any(f.method == "least-squares" for f in self.fits) else 1) if exact else None)

    @property
    def worst_shortfall(self) -> float | None:
        """The largest shortfall of a pick against the best measured configuration of its cell."""
        vals = [a.shortfall for a in self.accuracy if a.shortfall is not None]
        return max(vals) if vals else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (dict keys as strings); each recommendation carries its pick
        (:meth:`Recommendation.to_json`)."""
        return {
            "family": self.family,
            "tolerance": self.tolerance,
            "noise": self.noise,
            "acceptance_predictions": [dict(asdict(p), error=p.error, relative_error=p.relative_error) for p in self.acceptance],
            "acceptance_error": self.acceptance_error.to_json(),
            "acceptance_error_min_100_drafts": self.acceptance_error_over(100.0).to_json(),
            "throughput_predictions": [dict(asdict(p), relative_error=p.relative_error) for p in self.throughput],
            "throughput_error": self.throughput_error.to_json(),
            "step_cost_fits": [dict(asdict(f), max_residual=f.max_residual) for f in self.fits],
            "recommendations": [r.to_json() for r in self.recommendations],
            "basis": self.basis,
            "mix": self.mix,
            "accuracy": [dict(asdict(a), shortfall=a.shortfall) for a in self.accuracy],
            "worst_shortfall": self.worst_shortfall,
            "k_by_concurrency": {str(c): k for c, k in self.k_by_concurrency.items()},
            "config_by_concurrency": {str(c): n for c, n in self.config_by_concurrency.items()},
            "answer": self.answer,
            "speculative_config": self.speculative_config,
            "config_of": self.config_of,
            "num_speculative_tokens_per_batch_size": None if not self.speculative_config
            else self.speculative_config.get("num_speculative_tokens_per_batch_size"),
            "table_throughputs": {n: [{"workload": wl, "concurrency": c, "throughput": v[0],
                                       "interval": None if v[1] is None else list(v[1]), "batches": v[2]}
                                      for (wl, c), v in sorted(cells.items())]
                                  for n, cells in self.table_throughputs.items()},
            "candidate_to_measure": None if self.candidate_config is None
            else {"speculative_config": self.candidate_config, "command": self.measure_command},
            "start_spread": None if self.start_spread is None else self.start_spread.to_json(),
        }


def configuration_advice(recs: Sequence[Recommendation], base_config: Mapping[str, Any] | None,
                         table_configs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """What to run from the all-workloads picks ("*" rows of ``recs``): ``{"answer",
    "config_by_concurrency", "k_by_concurrency", "speculative_config", "config_of",
    "candidate_config"}``. One configuration picked at every measured concurrency is the answer
    (its config: ``base_config`` with its k, or the measured table's own config from
    ``table_configs``, name → config); off everywhere: run without speculation; different picks:
    no single answer — each concurrency's config is given, and when every pick is a fixed k or off
    a table composed from them (:func:`speculative_config_advice`) is a candidate to measure."""
    stars = {r.concurrency: r for r in recs if r.workload == "*" and r.k is not None and r.config is not None}
    by_c = {c: r.config for c, r in sorted(stars.items())}
    k_by_c = {c: r.k for c, r in sorted(stars.items())}

    def cfg_of(name: str) -> dict[str, Any] | None:
        if name == OFF:
            return None
        if name in table_configs:
            return dict(table_configs[name])
        return speculative_config_advice(base_config, {0: int(name.split("=", 1)[1].split()[0])})

    config_of = {n: cfg_of(n) for n in dict.fromkeys(by_c.values())}
    out: dict[str, Any] = {"config_by_concurrency": by_c, "k_by_concurrency": k_by_c, "config_of": config_of,
                           "speculative_config": None, "candidate_config": None, "answer": None}
    if not by_c:
        return out
    names = set(by_c.values())
    if names == {OFF}:
        out["answer"] = "off"
    elif len(names) == 1:
        out["answer"] = "one"
        out["speculative_config"] = config_of[next(iter(names))]
    else:
        out["answer"] = "per_concurrency"
        if not any(stars[c].table for c in stars):
            out["candidate_config"] = speculative_config_advice(base_config, k_by_c)
    return out


def advise(
    measurements: Sequence[Measurement],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    prior: CostModel | None = None,
    candidates: str = "measured",
    base_config: Mapping[str, Any] | None = None,
    family: str = "",
    fit_ks: Iterable[int] | None = None,
    acceptance: str = "curve",
    basis: str = "measured",
    mix: Mapping[str, float] | None = None,
    expected: Mapping[tuple[str, int], str] | None = None,
    table_configs: Mapping[str, Mapping[str, Any]] | None = None,
    start_spread: StartSpread | None = None,
) -> Advice:
    """Run steps 1–6 on the baseline runs and the speculative runs of one family (``fit_ks``,
    ``acceptance``: see :func:`predict_throughputs`; ``basis``, ``mix``, ``expected``: see
    :func:`recommend`; ``table_configs``: candidate name → speculative config of the family's
    dynamic tables, for :func:`configuration_advice`; ``start_spread``: the between-server-starts
    term of the sweep's A/A cells, :func:`recommend`; kept on the advice as ``start_spread``).

    Raises KChoiceError if there is no speculative run or an argument is out of range.
    """
    ms = list(measurements)
    if not any(m.k > 0 for m in ms):
        raise KChoiceError("no speculative run to advise from")
    acc = predict_acceptance_lengths(ms)
    preds, fits = predict_throughputs(ms, prior, fit_ks, acceptance)
    recs = recommend(preds, tolerance, candidates, basis, mix=mix, expected=expected, measurements=ms,
                     start_spread=start_spread)
    ca = configuration_advice(recs, base_config, table_configs or {})
    noises = [m.noise for m in ms if m.noise is not None]
    return Advice(
        family=family,
        tolerance=tolerance,
        acceptance=acc,
        throughput=preds,
        fits=fits,
        recommendations=recs,
        accuracy=evaluate_choices(recs, ms),
        k_by_concurrency=ca["k_by_concurrency"],
        speculative_config=ca["speculative_config"],
        noise=statistics.median(noises) if noises else None,
        basis=basis,
        mix=None if mix is None else dict(mix),
        config_by_concurrency=ca["config_by_concurrency"],
        answer=ca["answer"],
        config_of=ca["config_of"],
        candidate_config=ca["candidate_config"],
        table_throughputs=_table_throughputs(ms),
        start_spread=start_spread,
    )


def _table_throughputs(ms: Sequence[Measurement]) -> dict[str, dict[tuple[str, int], tuple[float, tuple[float, float] | None, int]]]:
    out: dict[str, dict[tuple[str, int], tuple[float, tuple[float, float] | None, int]]] = defaultdict(dict)
    for m in ms:
        if m.variable_width and m.k > 0:
            out[candidate_name(m)][(m.workload, m.concurrency)] = (m.output_throughput, log_throughput_interval(m),
                                                                  len(m.batch_throughputs))
    return dict(out)


def advise_from_curve(
    rates: Sequence[float],
    concurrencies: Iterable[int],
    cost: CostModel | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
) -> dict[int, dict[int, float]]:
    """Live advice without a sweep: estimated speedup E(k) / c(k, b) for every k ≤ len(rates) at
    each concurrency b (:func:`specwatch.specdecode.cost.estimated_speedups`, the configured cost model),
    as ``{b: {k: speedup}}``. Use :func:`specwatch.specdecode.cost.recommend_k` on each inner dict."""
    cost = cost or CostModel()
    return {int(b): estimated_speedups(tuple(rates), float(b), cost) for b in concurrencies}


def family_of(speculative_config: Mapping[str, Any] | None) -> str:
    """The family key of a speculative config: its JSON without num_speculative_tokens (and
    without a dynamic table); "" for no speculation."""
    if not speculative_config:
        return ""
    d = {k: v for k, v in speculative_config.items()
         if k not in ("num_speculative_tokens", "num_speculative_tokens_per_batch_size")}
    return json.dumps(d, sort_keys=True, separators=(",", ":"))
