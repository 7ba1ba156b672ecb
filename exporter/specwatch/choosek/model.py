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

4. Recommendation (:func:`recommend`): the k with the highest score, preferring the smallest k
   whose score is within ``tolerance`` (relative) of the best (:func:`specwatch.specdecode.cost.recommend_k`),
   k = 0 included — so speculation is switched off when it does not beat the baseline by more than
   the tolerance. With ``basis="measured"`` (the CLI's default) the score of a k that was run is its
   measured throughput (the model does not overrule a measurement) and the score of a k that was
   not run is its prediction times the measured / predicted ratio interpolated between its nearest
   measured neighbours; ``"model"`` scores every k by its prediction alone. Per concurrency over
   all workloads, the score of k is the geometric mean over workloads of score(k) / score(baseline).
   :func:`cross_validate` checks how well a pick made on half of a sweep's batches holds on the
   other half (the batches are paired: batch b sends the same prompts to every configuration).

5. vLLM's dynamic speculative decoding (:func:`dynamic_schedule`): the per-concurrency choices
   become ``num_speculative_tokens_per_batch_size`` ranges ``[start_bs, end_bs, k]`` (inclusive,
   starting at 1, boundaries at the geometric midpoint of neighbouring concurrencies, the last k
   carried forward by vLLM to max_num_seqs), and ``num_speculative_tokens`` = the largest k.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from specwatch.choosek.measurement import KChoiceError, Measurement
from specwatch.specdecode.cost import estimated_speedups, recommend_k
from specwatch.specdecode.cost import CostModel
from specwatch.specdecode.decision import TOLERANCE
from specwatch.specdecode.derive import expected_lengths

__all__ = [
    "AccuracyCell",
    "AcceptancePrediction",
    "Advice",
    "Measurement",
    "Recommendation",
    "StepCostFit",
    "ThroughputPrediction",
    "advise",
    "advise_from_curve",
    "cell_scores",
    "CrossValidationCell",
    "cross_validate",
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
    return max(spec, key=lambda m: (m.k, len(m.position_rates))) if spec else None


def _lower_bound_source(runs: Sequence[Measurement]) -> Measurement | None:
    """The fixed-k speculative run with the largest k whose only curve is a lower bound (ragged drafts)."""
    spec = [m for m in runs if m.k > 0 and m.position_rates and m.drafts and m.curve_basis == "lower_bound"
            and not m.variable_width]
    return max(spec, key=lambda m: (m.k, len(m.position_rates))) if spec else None


def _measured_only(wl: str, c: int, by_k: Mapping[int, Measurement], basis: str) -> list[ThroughputPrediction]:
    """Predictions that are the measurements (no model): every fixed-k run of a cell."""
    return [ThroughputPrediction(wl, c, k, m.output_throughput, m.output_throughput, m.tokens_per_step or 1.0,
                                 m.verified_per_step or 0.0, m.step_time_s, m.noise, basis, m.interval,
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
        measured = {m.k: m for m in runs if m.k > 0 and not m.ragged_drafts}
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
    #: The measured throughput's 95 % interval (tok/s) and its measured batches (None: not run).
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
        by_k: dict[int, Measurement] = {}
        for m in runs:  # one run per k (the latest wins if a family ran twice)
            by_k[m.k] = m
        if 0 in by_k:
            b = by_k[0]
            preds.append(ThroughputPrediction(wl, c, 0, b.output_throughput, b.output_throughput, 1.0, 0.0, b.step_time_s,
                                              b.noise, "exact", b.interval, len(b.batch_throughputs) or None))
        src = _source(runs)
        basis = "exact"
        if src is None and any(m.curve_basis == "lower_bound" and m.drafts for m in runs):
            # only lower-bound curves (ragged drafts): the measured k keep their measured throughput;
            # the what-if for other k comes from the lower-bound curve, labelled lower_bound
            src, basis = _lower_bound_source(runs), "lower_bound"
            if src is None:  # a dynamic table's ragged run only: nothing at a fixed k to predict from
                preds.extend(_measured_only(wl, c, by_k, "none"))
                continue
        fit = fit_step_cost(runs if keep is None else [m for m in runs if m.k in keep], prior)
        if fit is None:
            preds.extend(_measured_only(wl, c, by_k, "none"))  # no step time: no model, the runs still count
            continue
        if src is not None and src.draft_fraction is not None:
            rates, f = src.position_rates, src.draft_fraction
            dbar = src.draft_tokens_per_draft or float(src.k)
            if src.ragged_drafts and basis == "exact":
                # an exact per-request curve of a cell whose drafts were ragged (a dynamic table ran
                # shorter drafts): the curve is that of full drafts of j + 1 tokens, so k′ is predicted
                # as a fixed-width server verifying k′ tokens per draft (x = f·k′), not with the
                # cell's mean draft length d̄ (which would pair full-draft tokens with short-draft cost)
                dbar = float(len(rates))
        else:
            # no drafts at all (e.g. ngram never found a match): every k verifies nothing and
            # gains nothing, so each k costs the speculative server's T0
            src = max((m for m in runs if m.k > 0 and m.step_time_s is not None), key=lambda m: m.k)
            rates, f, dbar = (0.0,) * src.k, 0.0, float(src.k)
        fits.append(fit)
        ceff = src.effective_concurrency

        def from_curve(k: int, *, f: float = f, rates: Sequence[float] = rates, dbar: float = dbar) -> tuple[float, float]:
            return 1.0 + f * math.fsum(rates[:k]), f * min(float(k), dbar)

        # measured mode: ratio measured / curve at the k that were run, interpolated in k for the
        # k that were not (so an unmeasured k is not predicted with the curve's bias alone)
        ratios: dict[int, tuple[float, float]] = {}
        if acceptance == "measured":
            for k, m in by_k.items():
                if (1 <= k <= len(rates) and m.tokens_per_step is not None and m.verified_per_step is not None
                        and not m.ragged_drafts):
                    ct, cx = from_curve(k)
                    ratios[k] = (m.tokens_per_step / ct, m.verified_per_step / cx if cx > 0 else 1.0)
        for k in range(1, len(rates) + 1):
            m = by_k.get(k)
            if m is not None and m.variable_width:
                m = None  # a dynamic table ran other widths under this k: not the throughput at k
            tau, x = from_curve(k)
            if ratios:
                if k in ratios:
                    rt, rx = ratios[k]
                else:
                    lo = max((j for j in ratios if j < k), default=None)
                    hi = min((j for j in ratios if j > k), default=None)
                    if lo is None or hi is None:
                        rt, rx = ratios[lo if hi is None else hi]
                    else:
                        w = (k - lo) / (hi - lo)
                        rt = ratios[lo][0] + w * (ratios[hi][0] - ratios[lo][0])
                        rx = ratios[lo][1] + w * (ratios[hi][1] - ratios[lo][1])
                tau, x = tau * rt, x * rx
            t = fit.step_time(x)
            preds.append(ThroughputPrediction(
                wl, c, k, ceff * tau / t, None if m is None else m.output_throughput, tau, x, t,
                None if m is None else m.noise, basis, None if m is None else m.interval,
                None if m is None else (len(m.batch_throughputs) or None),
            ))
        # a measured k beyond the source curve (e.g. a ragged k = 4 beside an exact k = 2): still a measurement
        preds.extend(_measured_only(wl, c, {k: m for k, m in by_k.items() if k > len(rates)}, "beyond_curve"))
    return preds, fits


# --------------------------------------------------------------------------------------------
# 4. recommendation
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recommendation:
    """The k to use for ``workload`` ("*" = all workloads together) at ``concurrency``.

    ``scores``: k → throughput (one workload: measured where run, tok/s) or, for "*", the
    combined speedup over the baseline through time (:func:`combine_by_time`; the combined
    throughput relative to the best k when there is no baseline); ``best_k``: argmax of the
    scores; ``k``: the smallest k within ``tolerance`` of the best or whose 95 % interval overlaps
    the best's (a tie: the smaller k wins; 0 = speculation off); None when the row cannot be
    scored (``reason`` says why); ``speedup``: score at k over the baseline's (None without a
    baseline run). ``intervals``: k → 95 % interval of the score (measured k with ≥ 2 batches);
    ``batches``: k → measured batches; ``tied``: the k whose interval overlaps the best's;
    ``tie``: True when ``k`` rests on such a tie (it is not within ``tolerance`` of the best);
    ``combination``: how "*" combined the workloads (e.g. "time, equal work: copy, random-output").
    """

    workload: str
    concurrency: int
    k: int | None
    best_k: int | None
    tolerance: float
    scores: dict[int, float]
    speedup: float | None
    measured_ks: tuple[int, ...] = ()
    intervals: dict[int, tuple[float, float]] = field(default_factory=dict)
    batches: dict[int, int] = field(default_factory=dict)
    tied: tuple[int, ...] = ()
    tie: bool = False
    reason: str | None = None
    combination: str | None = None
    #: Scores of k that rest on a lower-bound curve (ragged drafts; a what-if, not a measurement).
    lower_bound_ks: tuple[int, ...] = ()

    @property
    def speculation_off(self) -> bool:
        return self.k == 0

    @property
    def one_batch_ks(self) -> tuple[int, ...]:
        """Measured k with a single measured batch (no interval: only the tolerance applies)."""
        return tuple(k for k, n in sorted(self.batches.items()) if n == 1)


def _overlap(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def _choose(scores: dict[int, float], tolerance: float,
            intervals: Mapping[int, tuple[float, float]] | None = None) -> tuple[int, int, tuple[int, ...], bool]:
    """(k, best k, k tied with the best by overlapping intervals, whether k rests on a tie)."""
    best = max(scores, key=lambda k: (scores[k], -k))
    by_tol = recommend_k(scores, tolerance)
    iv = intervals or {}
    tied = tuple(sorted(k for k in scores if k != best and _overlap(iv.get(k), iv.get(best))))
    k = min((by_tol, *tied))
    return k, best, tied, k != by_tol


def parse_mix(text: str, workloads: Iterable[str]) -> dict[str, float]:
    """``--mix copy=3,random-output=1`` → {workload: weight}: each workload's share of the work
    (output tokens). Raises KChoiceError (one line) for a malformed item, a workload not in
    ``workloads`` or a weight that is not a positive finite number."""
    known = list(dict.fromkeys(workloads))
    out: dict[str, float] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
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


def recommend(
    predictions: Iterable[ThroughputPrediction],
    tolerance: float = DEFAULT_TOLERANCE,
    candidates: str = "measured",
    basis: str = "model",
    *,
    mix: Mapping[str, float] | None = None,
    expected: Mapping[tuple[str, int], str] | None = None,
) -> list[Recommendation]:
    """Per (workload, concurrency) and per concurrency over all workloads ("*").

    ``candidates``: "measured" (k = 0 and the k that were run) or "all" (every k ≤ K, including
    k that were only predicted). ``basis``: what a k is scored by (:func:`cell_scores`):
    "measured" or "model". Within a cell, k whose 95 % intervals (measured batches) overlap the
    best's are tied with it and the smallest wins (as does the smallest k within ``tolerance``).
    "*" combines the workloads through time (:func:`combine_by_time`): ``mix`` = workload → share
    of the work (default: the same work from every workload; workloads left out of a given mix
    are not in "*"); its interval comes from the workloads' intervals. ``expected``: every
    (workload, concurrency) that must get a row, with the reason to give when it cannot be scored
    (a row with k None); "*" is not scored at a concurrency where a workload of the mix has no
    scored row. Raises KChoiceError for a bad tolerance, candidates, basis or mix.
    """
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
    keys = sorted(set(cells) | set(expected or {}))
    out: list[Recommendation] = []
    per_conc: dict[int, dict[str, Recommendation]] = defaultdict(dict)
    unscored: dict[int, dict[str, str]] = defaultdict(dict)
    for wl, c in keys:
        ps = cells.get((wl, c), {})
        all_scores = cell_scores(ps, basis) if ps else {}
        scores = {k: v for k, v in all_scores.items() if candidates == "all" or ps[k].measured is not None}
        if not any(k > 0 for k in scores):
            reason = (expected or {}).get((wl, c)) or (
                "no speculative run with a measured throughput at a fixed k" if 0 in scores else
                "no finished run")
            r = Recommendation(wl, c, None, None, tolerance, {}, None,
                               tuple(sorted(kk for kk, p in ps.items() if p.measured is not None)), reason=reason)
            out.append(r)
            unscored[c][wl] = reason
            continue
        intervals = {k: ps[k].interval for k in scores if ps[k].interval is not None and ps[k].measured is not None
                     and (basis == "measured" or k == 0)}
        k, best, tied, tie = _choose(scores, tolerance, intervals)
        r = Recommendation(
            wl, c, k, best, tolerance, scores,
            None if 0 not in scores else scores[k] / scores[0],
            tuple(sorted(kk for kk, p in ps.items() if p.measured is not None)),
            intervals=intervals, batches={kk: ps[kk].batches for kk in scores if ps[kk].batches},
            tied=tied, tie=tie,
            lower_bound_ks=tuple(sorted(kk for kk in scores if kk > 0 and ps[kk].curve_basis == "lower_bound"
                                        and ps[kk].measured is None)),
        )
        out.append(r)
        per_conc[c][wl] = r
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
        common = set.intersection(*(set(rows[wl].scores) for wl in weights))
        if not any(k > 0 for k in common):
            out.append(Recommendation("*", c, None, None, tolerance, {}, None, combination=how,
                                      reason="no k > 0 was scored for every workload of the mix"))
            continue
        comb: dict[int, float] = {}
        halves: dict[int, float | None] = {}
        for k in sorted(common):
            hw = {}
            for wl in weights:
                iv = rows[wl].intervals.get(k)
                hw[wl] = None if iv is None else (iv[1] - iv[0]) / 2.0
            comb[k], halves[k] = combine_by_time({wl: rows[wl].scores[k] for wl in weights}, weights, hw)
        ref = comb[0] if 0 in comb else max(comb.values())
        scores = {k: v / ref for k, v in comb.items()}
        intervals = {k: ((comb[k] - h) / ref, (comb[k] + h) / ref) for k, h in halves.items() if h is not None}
        k, best, tied, tie = _choose(scores, tolerance, intervals)
        batches = {kk: min(rows[wl].batches.get(kk, 0) for wl in weights) for kk in common}
        out.append(Recommendation("*", c, k, best, tolerance, scores, scores[k] if 0 in common else None,
                                  tuple(sorted(common)), intervals=intervals,
                                  batches={kk: n for kk, n in batches.items() if n}, tied=tied, tie=tie,
                                  combination=how,
                                  lower_bound_ks=tuple(sorted({kk for wl in weights for kk in rows[wl].lower_bound_ks}
                                                              & common))))
    return out


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
    """Measured throughput at the recommended k against the best measured k of one cell.
    ``shortfall`` = 1 − picked / best (0 when the best was picked)."""

    workload: str
    concurrency: int
    picked_k: int
    best_k: int
    picked_throughput: float | None
    best_throughput: float
    #: 95 % intervals (tok/s) of the picked and the best k's measured throughputs (None: 1 batch).
    picked_interval: tuple[float, float] | None = None
    best_interval: tuple[float, float] | None = None
    #: The pick rests on a tie (its interval overlaps the best's, beyond the tolerance).
    tie: bool = False

    @property
    def shortfall(self) -> float | None:
        if self.picked_throughput is None:
            return None
        return 1.0 - self.picked_throughput / self.best_throughput


def evaluate_choices(recs: Iterable[Recommendation], measurements: Iterable[Measurement]) -> list[AccuracyCell]:
    """For every per-workload recommendation, compare the measured throughput at its k with the
    best measured throughput of the cell (k = 0 is the baseline)."""
    measured: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    ms_list = list(measurements)
    for m in ms_list:
        measured[(m.workload, m.concurrency)][m.k] = m.output_throughput
    intervals: dict[tuple[str, int], dict[int, tuple[float, float] | None]] = defaultdict(dict)
    for m in ms_list:
        intervals[(m.workload, m.concurrency)][m.k] = m.interval
    out = []
    for r in recs:
        if r.workload == "*" or r.k is None:
            continue
        ms = measured.get((r.workload, r.concurrency))
        if not ms:
            continue
        best_k = max(ms, key=lambda k: ms[k])
        iv = intervals[(r.workload, r.concurrency)]
        out.append(AccuracyCell(r.workload, r.concurrency, r.k, best_k, ms.get(r.k), ms[best_k],
                                iv.get(r.k), iv.get(best_k), r.tie))
    return out


@dataclass(frozen=True)
class CrossValidationCell:
    """A pick made on one half of a cell's measured batches (``fold`` "even→odd": chosen on
    batches 0, 2, …, judged on 1, 3, …; "odd→even" the other way), judged on the other half:
    throughputs (output tokens/s) are the judging half's mean per-batch throughputs."""

    workload: str
    concurrency: int
    fold: str
    picked_k: int
    best_k: int
    picked_throughput: float
    best_throughput: float

    @property
    def shortfall(self) -> float:
        """1 − picked / best on the judging half (0 when the pick is the judging half's best)."""
        return 1.0 - self.picked_throughput / self.best_throughput if self.best_throughput > 0 else 0.0


def cross_validate(measurements: Iterable[Measurement], tolerance: float = DEFAULT_TOLERANCE,
                   cells: Iterable[tuple[str, int]] | None = None) -> list[CrossValidationCell]:
    """How well a measured-basis pick holds on batches it did not see.

    For every (workload, concurrency) cell whose runs (baseline and every k) have the same number
    n ≥ 2 of measured batches (``Measurement.batch_throughputs``, from the load generator's
    ``output_throughput_per_batch``), the k is chosen on the even-numbered batches (smallest k
    within ``tolerance`` of the best mean, as :func:`recommend` does) and judged on the
    odd-numbered ones, and the other way round. The load generator sends batch b the same prompts
    on every server, so the halves are paired samples. Cells with unequal batch counts are left
    out, as are cells where a half has no positive throughput. ``cells``: only these
    (workload, concurrency) cells (None: all). Returns two :class:`CrossValidationCell` per
    usable cell.
    """
    keep = None if cells is None else set(cells)
    out: list[CrossValidationCell] = []
    for (wl, c), runs in sorted(_cells(measurements).items()):
        if keep is not None and (wl, c) not in keep:
            continue
        by_k = {m.k: m.batch_throughputs for m in runs}
        ns = {len(b) for b in by_k.values()}
        if len(ns) != 1 or min(ns) < 2 or not any(k > 0 for k in by_k):
            continue
        halves = {"even": {k: statistics.fmean(b[0::2]) for k, b in by_k.items()},
                  "odd": {k: statistics.fmean(b[1::2]) for k, b in by_k.items()}}
        if any(max(h.values()) <= 0 for h in halves.values()):
            continue
        for pick_on, judge_on in (("even", "odd"), ("odd", "even")):
            picked = recommend_k(halves[pick_on], tolerance)
            judge = halves[judge_on]
            best = max(judge, key=lambda k: (judge[k], -k))
            out.append(CrossValidationCell(wl, c, f"{pick_on}→{judge_on}", picked, best, judge[picked], judge[best]))
    return out


# --------------------------------------------------------------------------------------------
# Everything together
# --------------------------------------------------------------------------------------------


@dataclass
class Advice:
    """All advice for one speculative family (``family``: its config without k, JSON)."""

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
    cross_validation: list[CrossValidationCell] = field(default_factory=list)
    #: --mix: workload → share of the work for "all workloads" (None: the same work from each).
    mix: dict[str, float] | None = None

    @property
    def cross_validation_summary(self) -> dict[str, Any]:
        """``{"n", "worst_shortfall", "mean_shortfall", "within_3_percent"}`` over
        :attr:`cross_validation` (None values when it is empty)."""
        vals = [cv.shortfall for cv in self.cross_validation]
        return {"n": len(vals), "worst_shortfall": max(vals) if vals else None,
                "mean_shortfall": statistics.fmean(vals) if vals else None,
                "within_3_percent": sum(1 for v in vals if v <= 0.03)}

    def acceptance_error_over(self, min_drafts: float = 0.0) -> dict[str, float | None]:
        """Mean and max |relative error| of E(k) over the measured k < K whose run made at least
        ``min_drafts`` drafts (a run with a handful of drafts measures its length poorly)."""
        errs = [abs(p.relative_error) for p in self.acceptance
                if p.k < p.source_k and p.relative_error is not None and (p.measured_drafts or 0) >= min_drafts]
        return {"n": len(errs), "min_drafts": min_drafts, "mean_abs_relative": statistics.fmean(errs) if errs else None,
                "max_abs_relative": max(errs) if errs else None}

    @property
    def acceptance_error(self) -> dict[str, float | None]:
        """Mean and max |relative error| of E(k) over every measured k < K."""
        return self.acceptance_error_over(0.0)

    @property
    def throughput_error(self) -> dict[str, float | None]:
        """Mean and max |relative error| of the throughput prediction over the measured k > 0:
        ``{"n", "mean_abs_relative", "max_abs_relative", "exact_fit"}``; ``exact_fit`` is True when
        every measured run was one of ≤ 2 points its step-cost fit passes through (zero error by
        construction, no error estimate), then with ``max_points`` and ``parameters``."""
        errs = [abs(p.relative_error) for p in self.throughput if p.k > 0 and p.relative_error is not None]
        out: dict[str, Any] = {"n": len(errs), "mean_abs_relative": statistics.fmean(errs) if errs else None,
                               "max_abs_relative": max(errs) if errs else None}
        # T0 + β·x fitted on 2 runs (or the cost model on 1) passes through them: the error at the
        # fitted runs is zero by construction and says nothing about the model
        fitted = {(f.workload, f.concurrency, k) for f in self.fits for k, _, _ in f.points}
        measured = [p for p in self.throughput if p.k > 0 and p.relative_error is not None]
        exact = bool(measured) and all((p.workload, p.concurrency, p.k) in fitted for p in measured) \
            and all(len(f.points) <= 2 for f in self.fits) and max(errs) < 1e-9
        out["exact_fit"] = exact
        if exact:
            out["max_points"] = max(len(f.points) for f in self.fits)
            out["parameters"] = 2 if any(f.method == "least-squares" for f in self.fits) else 1
        return out

    @property
    def worst_shortfall(self) -> float | None:
        vals = [a.shortfall for a in self.accuracy if a.shortfall is not None]
        return max(vals) if vals else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (dict keys as strings)."""
        def rec(r: Recommendation) -> dict[str, Any]:
            d = asdict(r)
            d["scores"] = {str(k): v for k, v in r.scores.items()}
            d["intervals"] = {str(k): list(v) for k, v in r.intervals.items()}
            d["batches"] = {str(k): v for k, v in r.batches.items()}
            d["one_batch_ks"] = list(r.one_batch_ks)
            return d

        return {
            "family": self.family,
            "tolerance": self.tolerance,
            "noise": self.noise,
            "acceptance_predictions": [dict(asdict(p), error=p.error, relative_error=p.relative_error) for p in self.acceptance],
            "acceptance_error": self.acceptance_error,
            "acceptance_error_min_100_drafts": self.acceptance_error_over(100.0),
            "throughput_predictions": [dict(asdict(p), relative_error=p.relative_error) for p in self.throughput],
            "throughput_error": self.throughput_error,
            "step_cost_fits": [dict(asdict(f), max_residual=f.max_residual) for f in self.fits],
            "recommendations": [rec(r) for r in self.recommendations],
            "basis": self.basis,
            "mix": self.mix,
            "accuracy": [dict(asdict(a), shortfall=a.shortfall) for a in self.accuracy],
            "worst_shortfall": self.worst_shortfall,
            "cross_validation": [dict(asdict(cv), shortfall=cv.shortfall) for cv in self.cross_validation],
            "cross_validation_summary": self.cross_validation_summary,
            "k_by_concurrency": {str(c): k for c, k in self.k_by_concurrency.items()},
            "speculative_config": self.speculative_config,
            "num_speculative_tokens_per_batch_size": None if not self.speculative_config
            else self.speculative_config.get("num_speculative_tokens_per_batch_size"),
        }


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
) -> Advice:
    """Run steps 1–6 on the baseline runs and the speculative runs of one family (``fit_ks``,
    ``acceptance``: see :func:`predict_throughputs`; ``basis``, ``mix``, ``expected``: see
    :func:`recommend`), with the half-batch cross-validation of :func:`cross_validate`.

    Raises KChoiceError if there is no speculative run or an argument is out of range.
    """
    ms = list(measurements)
    if not any(m.k > 0 for m in ms):
        raise KChoiceError("no speculative run to advise from")
    acc = predict_acceptance_lengths(ms)
    preds, fits = predict_throughputs(ms, prior, fit_ks, acceptance)
    recs = recommend(preds, tolerance, candidates, basis, mix=mix, expected=expected)
    k_by_c = {r.concurrency: r.k for r in recs if r.workload == "*" and r.k is not None}
    noises = [m.noise for m in ms if m.noise is not None]
    return Advice(
        family=family,
        tolerance=tolerance,
        acceptance=acc,
        throughput=preds,
        fits=fits,
        recommendations=recs,
        accuracy=evaluate_choices(recs, ms),
        k_by_concurrency=k_by_c,
        speculative_config=speculative_config_advice(base_config, k_by_c) if k_by_c else None,
        noise=statistics.median(noises) if noises else None,
        basis=basis,
        cross_validation=cross_validate(ms, tolerance, {(r.workload, r.concurrency) for r in recs
                                                        if r.workload != "*" and r.k is not None}),
        mix=None if mix is None else dict(mix),
    )


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
