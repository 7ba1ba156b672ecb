"""Does speculation pay, and with which k: speedups with an interval, that say how they were obtained.

Inputs, per upstream × model × engine × window (:class:`LiveCost`):

- the per-position acceptance curve r_i = Δ``…_num_accepted_tokens_per_pos_total{position=i}`` /
  Δ``…_num_drafts_total`` at the server's k, so E(k′) = 1 + Σ_{i<k′} r_i tokens per draft (a lower
  bound when drafts were ragged: ``missing_ratio`` of the k × drafts positions were never drafted);
- the live step values (:class:`specwatch.specdecode.steptime.StepTimes`, from vLLM's histograms):
  step duration t, running requests per step b, decode tokens D = Δ(generation − first tokens),
  ITL seconds I, TTFT seconds P, engine steps, request-steps, context per running request;
- the draft share s = Δdrafts / Δ request-steps and the drafted tokens per request-step
  x = Δdraft_tokens / Δ request-steps;
- optionally a baseline server's live step values (a server without speculation beside this one);
- optionally a :class:`specwatch.specdecode.costprofile.CostProfile` (relative costs c = t / t0).

**The speedup is a ratio of request time for the same output**, prefill included, so that it is
comparable with a client's output-throughput ratio: S = (P_b + D·t0) / (P + I), where t0 is the
plain step and P_b the plain server's TTFT time for the same requests. Its bases:

- ``measured`` — the server's current k with both sides live: t0 = 1 / the baseline server's
  decode speed, P_b = the baseline's mean TTFT × this window's first tokens;
- ``calibrated`` — the server's current k without a baseline: t0 = t / c(b, k, x, context) with
  the profile's relative cost at the live b, k and x (a uniformly slower machine cancels),
  P_b = P / the profile's prefill ratio;
- ``profile`` — a what-if k′: S(k′) = A · M(k′), M(k) = (p + 1) / (p·ρ(k) + c(k) / τ(k)) with
  p = P_b / (D·t0), ρ the prefill ratio, τ(k′) = 1 + s (E(k′) − 1) tokens per request-step and c
  at x′ = x k′ / k; A = S(k_now) / M(k_now) anchors it on the server's own k (its measured or
  calibrated live speedup; 1 without one), as the demo's what-ifs are, so what the model gets wrong
  about the server's own k cancels between k′ and k_now; the interval adds the anchor's;
- ``extrapolated`` — as ``profile`` where b, x or k′ lies outside what the profile measured;
- ``default`` — no profile: τ(k′) / c(k′, b) with the built-in guess
  :func:`~specwatch.specdecode.costprofile.default_step_cost_ratio`, shown as a guess.

**Every value has a 95 % interval** (:class:`specwatch.specdecode.decision.Estimate`), a log
half-width h combined in quadrature from (:func:`interval_parts`):

- the live sample: 1.96 × CV / sqrt(engine steps), CV = :data:`CV_SPECULATIVE` for a speculative
  server's per-step speed (tokens per step vary) and :data:`CV_PLAIN` for a plain one, both sides
  for ``measured``;
- ``measured`` only: the movement between the two servers' rounds, t(df) × sqrt(SE_s² + SE_b²)
  from each server's batch means of its decode speed over the window's fetches
  (:func:`between_rounds_halfwidth`; a host that slows down between rounds widens it);
- the profile's recorded spread of c (1.96 × spread);
- the drift (live step / the profile's prediction): κ |ln drift| with κ = :data:`DRIFT_WEIGHT`: a
  profile measured on another machine describes this one less well, whatever cancels;
- a profile for another served model: :data:`MODEL_MISMATCH_HALFWIDTH`; an extrapolated lookup:
  :data:`EXTRAPOLATION_HALFWIDTH` plus the distance it was carried beyond the measured k
  (|ln(c / c at the nearest measured k)|: wider the farther from what was measured); the built-in
  guess: ln 2;
- a forward-pass-only profile is a lower bound on the cost: its speedups are upper bounds, and the
  interval reaches down by :data:`FORWARD_ONLY_FACTOR` (the largest real / forward-only step-cost
  ratio measured on an H200 with vLLM 0.26: docs/cost.md, "On a GPU");
- a lower-bound (ragged) curve: the what-if upper end uses r_i + k × missing_ratio (every position
  never drafted accepted), capped at r_(i−1) and 1.

A window with fewer than :data:`MIN_ENGINE_STEPS` engine steps (or a what-if with fewer than
:data:`MIN_DRAFTS` drafts) gets no speedup, with reason ``insufficient_data``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specwatch.specdecode.costprofile import (
    CALIBRATED,
    DEFAULT,
    EXTRAPOLATED,
    MEASURED,
    PROFILE,
    CostProfile,
    default_step_cost_ratio,
)
from specwatch.specdecode.decision import (LOSES, TOLERANCE, Z95, Candidate, Estimate, Pick, combine_log_halfwidths, decide,
                                           t975)
from specwatch.specdecode.derive import expected_lengths
from specwatch.specdecode.steptime import StepTimes

#: Coefficient of variation of one engine step's per-request speed (tokens / step time): a plain
#: server's step times vary by about 30 % on the CPU build (ITL std / mean in the sweep fixture); a
#: speculative server's tokens per step also vary (1 … k + 1), taken as 60 %. Modelled, not fitted.
CV_PLAIN = 0.3
CV_SPECULATIVE = 0.6
#: Weight of |ln drift| in the log half-width: a 2× drift adds 0.28 (about ×/÷ 1.3). Measured: on
#: this 2-core machine with a CPU hog beside vLLM (drift 2.3), ngram k = 4 copy's relative cost fell
#: from the profile's 1.27 to about 1.0 (contention slows the plain step more than the extra verify
#: tokens), so the calibrated speedup read 21-24 % low (docs/results.md, 2026-12-01): relative
#: costs cancel a uniform slowdown, not contention.
DRIFT_WEIGHT = 0.4
#: Log half-width added when the profile was measured for another served model (about ×/÷ 1.65).
MODEL_MISMATCH_HALFWIDTH = 0.5
#: Log half-width added for a lookup outside the profile's measured b, x or k.
EXTRAPOLATION_HALFWIDTH = 0.10
#: Log half-width of the built-in guess (basis default): a factor 2 either way.
DEFAULT_HALFWIDTH = math.log(2.0)
#: A forward-only profile's speedups are upper bounds; the interval reaches down by this factor
#: (draft model k = 3 on an H200: real step cost 11.2 against about 1.0 forward-only).
FORWARD_ONLY_FACTOR = 11.2
#: Fewest engine steps in a window for any speedup, fewest drafts for a what-if.
MIN_ENGINE_STEPS = 20
MIN_DRAFTS = 10

REASON_INSUFFICIENT_DATA = "insufficient_data"


@dataclass(frozen=True)
class Speedup:
    """A speedup (ratio, > 0) over running without speculation and its basis (see module doc);
    ``lower``/``upper``: its 95 % interval (None: not computed)."""

    value: float
    basis: str
    lower: float | None = None
    upper: float | None = None

    @property
    def estimate(self) -> Estimate:
        """As an :class:`~specwatch.specdecode.decision.Estimate` (a point interval when none)."""
        return Estimate(self.value, self.lower if self.lower is not None else self.value,
                        self.upper if self.upper is not None else self.value, self.basis)


@dataclass(frozen=True)
class LiveCost:
    """The cost side of one window (see the module doc). ``step``: live step values (None when the
    server exports none); ``draft_share`` s and ``drafted_tokens_per_step`` x (None: unknown, taken
    as 1 and k); ``baseline``: a baseline server's live step values, or only its decode speed in
    ``baseline_decode_tokens_per_second`` (tok/s per running request); ``profile``, ``method``,
    ``drafter``: the cost profile and what to look up in it; ``profile_model_mismatch``: the profile
    was measured for another served model; ``missing_ratio``: share of k × drafts positions never
    drafted (ragged drafts); ``drafts``: Δdrafts (None: unknown)."""

    step: StepTimes | None = None
    draft_share: float | None = None
    baseline_decode_tokens_per_second: float | None = None
    profile: CostProfile | None = None
    method: str | None = None
    drafter: str | None = None
    running_requests_fallback: float | None = None
    drafted_tokens_per_step: float | None = None
    baseline: StepTimes | None = None
    profile_model_mismatch: bool = False
    missing_ratio: float = 0.0
    drafts: float | None = None

    @property
    def running_requests(self) -> float:
        """b: running requests per step (live, step-weighted), else the fallback (the gauge), else 1."""
        if self.step is not None and self.step.running_requests_per_step is not None:
            return self.step.running_requests_per_step
        if self.running_requests_fallback is not None and self.running_requests_fallback > 0:
            return self.running_requests_fallback
        return 1.0

    @property
    def share(self) -> float:
        """s, clipped to [0, 1] (1 when unknown)."""
        s = self.draft_share
        return s if s is not None and 0 <= s <= 1 else 1.0

    @property
    def context_tokens(self) -> float | None:
        return self.step.context_tokens if self.step is not None else None

    @property
    def baseline_speed(self) -> float | None:
        """The baseline server's live decode speed (tok/s per running request), if known."""
        if self.baseline is not None and _pos(self.baseline.request_decode_tokens_per_second):
            return self.baseline.request_decode_tokens_per_second
        return self.baseline_decode_tokens_per_second if _pos(self.baseline_decode_tokens_per_second) else None


def _pos(v: float | None) -> bool:
    return v is not None and math.isfinite(v) and v > 0


def _enough(step: StepTimes | None) -> bool:
    return step is not None and step.engine_steps >= MIN_ENGINE_STEPS and _pos(step.request_decode_tokens_per_second)


# ------------------------------------------------------------------------------------------------
# Drift
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Drift:
    """Live step duration / the profile's predicted step at the live b, k, x and context (k = 0:
    the plain step): 1 = the profile describes this server; ``basis`` profile (a k the profile
    measured, b inside its range) or extrapolated."""

    ratio: float
    predicted_seconds: float
    basis: str


def drift(cost: LiveCost, k: int) -> Drift | None:
    """:class:`Drift` of the server's k; None without a profile, live step time, or a curve for
    the method."""
    p, st = cost.profile, cost.step
    if p is None or st is None or not _pos(st.step_duration_seconds):
        return None
    b, ctx = cost.running_requests, cost.context_tokens
    if k == 0:
        pred = p.plain_step(b, ctx)
        basis = pred.basis
    else:
        pred = p.speculative_step(b, k, cost.method, cost.drafter, drafted_tokens_per_step=cost.drafted_tokens_per_step,
                                  context_tokens=ctx)
        if pred is None:
            return None
        basis = pred.basis if k in p.measured_ks(cost.method, cost.drafter) else EXTRAPOLATED
    return Drift(st.step_duration_seconds / pred.seconds, pred.seconds, basis)


def profile_error_ratio(cost: LiveCost, k: int) -> float | None:
    """Drift ratio only (see :func:`drift`)."""
    d = drift(cost, k)
    return None if d is None else d.ratio


# ------------------------------------------------------------------------------------------------
# The server's own k
# ------------------------------------------------------------------------------------------------


def _request_time_ratio(st: StepTimes, t0: float, prefill_ratio: float | None, baseline: StepTimes | None) -> float:
    """S = (P_b + D·t0) / (P + I) (module doc); the decode-only v·t0 when TTFT or D is missing."""
    d, i, p = st.decode_tokens, st.itl_seconds, st.prefill_seconds
    if d is None or i is None or p is None or d <= 0 or i <= 0:
        return st.request_decode_tokens_per_second * t0  # type: ignore[operator]
    if baseline is not None and baseline.prefill_seconds is not None and baseline.first_tokens and st.first_tokens:
        p_b = baseline.prefill_seconds / baseline.first_tokens * st.first_tokens
    else:
        p_b = p / prefill_ratio if prefill_ratio else p
    return (p_b + d * t0) / (p + i)


def between_rounds_halfwidth(st: StepTimes, baseline: StepTimes | None) -> float:
    """The log half-width of the movement between the two servers' rounds (``measured``): t975(df)
    × sqrt(SE_s² + SE_b²), SE the batch-means standard error of each server's mean log decode speed
    over the window (:class:`~specwatch.specdecode.steptime.SpeedSpread`), df by Welch-Satterthwaite
    from their batches. A side without a spread (fewer than two active fetch intervals) adds
    nothing; 0 when neither has one."""
    sides = [sp for sp in (st.speed_spread, baseline.speed_spread if baseline is not None else None)
             if sp is not None and sp.batches >= 2]
    if not sides:
        return 0.0
    v = [sp.log_standard_error ** 2 for sp in sides]
    total = sum(v)
    if total <= 0:
        return 0.0
    den = sum(vi * vi / (sp.batches - 1) for vi, sp in zip(v, sides, strict=True))
    df = max(1, int(total * total / den)) if den > 0 else sum(sp.batches - 1 for sp in sides)
    return t975(df) * math.sqrt(total)


def _sample_halfwidth(st: StepTimes, baseline: StepTimes | None, speculative: bool = True) -> float:
    cv = CV_SPECULATIVE if speculative else CV_PLAIN
    var = cv * cv / max(st.engine_steps, 1.0)
    if baseline is not None:
        var += CV_PLAIN * CV_PLAIN / max(baseline.engine_steps, 1.0)
    return Z95 * math.sqrt(var)


def interval_parts(cost: LiveCost, spread: float | None, lookup_basis: str, drift_ratio: float | None,
                   extrapolation: float = 0.0) -> list[float]:
    """The profile's log half-widths for one value (module doc): spread, drift, model mismatch,
    extrapolation (:data:`EXTRAPOLATION_HALFWIDTH` plus how far the lookup was carried beyond the
    measured k, ``extrapolation`` = |ln(value / nearest measured value)|: the interval widens with
    the distance from what was measured)."""
    parts = [Z95 * (spread or 0.0)]
    if drift_ratio is not None and drift_ratio > 0:
        parts.append(DRIFT_WEIGHT * abs(math.log(drift_ratio)))
    if cost.profile_model_mismatch:
        parts.append(MODEL_MISMATCH_HALFWIDTH)
    if lookup_basis == EXTRAPOLATED:
        parts.append(EXTRAPOLATION_HALFWIDTH + max(0.0, extrapolation))
    return parts


def current_speedup(cost: LiveCost, k: int) -> Speedup | None:
    """The server's own k (no acceptance curve needed: a window in which nothing was drafted
    still has a measured decode speed): ``measured`` with a live baseline, else ``calibrated``
    with a profile curve for the method; None without enough live steps (:data:`MIN_ENGINE_STEPS`)
    or without either."""
    st = cost.step
    if not _enough(st):
        return None
    assert st is not None
    vb = cost.baseline_speed
    if vb is not None:
        value = _request_time_ratio(st, 1.0 / vb, None, cost.baseline)
        base = cost.baseline if cost.baseline is not None else StepTimes(None, None, vb, float(MIN_ENGINE_STEPS * 10), 0.0)
        h = combine_log_halfwidths([_sample_halfwidth(st, base, speculative=k > 0), between_rounds_halfwidth(st, base)])
        e = Estimate.around(value, h, MEASURED)
        return Speedup(e.value, MEASURED, e.lower, e.upper)
    p = cost.profile
    if p is None or k <= 0:
        return None
    b = cost.running_requests
    c = p.cost_ratio(b, k, cost.method, cost.drafter, drafted_tokens_per_step=cost.drafted_tokens_per_step,
                     context_tokens=cost.context_tokens)
    if c is None:
        return None
    t0 = st.step_duration_seconds / c.seconds if _pos(st.step_duration_seconds) else 1.0 / st.request_decode_tokens_per_second  # type: ignore[operator]
    value = _request_time_ratio(st, t0, p.prefill_ratio(b, k, cost.method, cost.drafter), None)
    dr = drift(cost, k)
    h = combine_log_halfwidths([_sample_halfwidth(st, None), *interval_parts(cost, c.spread, c.basis,
                                                                                dr.ratio if dr else None,
                                                                                c.extrapolation)])
    lower_factor = 1.0 / FORWARD_ONLY_FACTOR if p.forward_only else 1.0
    e = Estimate.around(value, h, CALIBRATED, lower_factor=lower_factor)
    upper = min(e.upper, value) if p.forward_only else e.upper
    return Speedup(e.value, CALIBRATED if c.basis != EXTRAPOLATED else EXTRAPOLATED, e.lower, max(upper, e.value))


def measured_speedup(cost: LiveCost, k: int = 1) -> Speedup | None:
    """Alias of :func:`current_speedup` (the server's k)."""
    return current_speedup(cost, k)


# ------------------------------------------------------------------------------------------------
# What-if k′
# ------------------------------------------------------------------------------------------------


def upper_rates(rates: Sequence[float], k: int, missing_ratio: float) -> tuple[float, ...]:
    """Upper bounds on a ragged curve: r_i + k × missing_ratio (every never-drafted position
    accepted), capped at the previous position's bound and at 1. ``rates`` themselves when nothing
    was missing."""
    if missing_ratio <= 0:
        return tuple(rates)
    extra = k * missing_ratio
    out, prev = [], 1.0
    for r in rates:
        prev = min(prev, 1.0, r + extra)
        out.append(prev)
    return tuple(out)


def _prefill_share(cost: LiveCost, k_now: int) -> tuple[float, float | None]:
    """(p, t0): P_b / (D·t0) and the plain step estimated from this window (module doc); (0, None)
    when the window lacks TTFT or decode counts."""
    st, p = cost.step, cost.profile
    if st is None or not _pos(st.step_duration_seconds) or not st.decode_tokens or st.prefill_seconds is None:
        return 0.0, None
    b = cost.running_requests
    if cost.baseline_speed is not None:
        t0 = 1.0 / cost.baseline_speed
        bl = cost.baseline
        if bl is not None and bl.prefill_seconds is not None and bl.first_tokens and st.first_tokens:
            p_b = bl.prefill_seconds / bl.first_tokens * st.first_tokens
        else:
            p_b = st.prefill_seconds
        return p_b / (st.decode_tokens * t0), t0
    if p is None:
        return 0.0, None
    if k_now > 0:
        c = p.cost_ratio(b, k_now, cost.method, cost.drafter, drafted_tokens_per_step=cost.drafted_tokens_per_step,
                         context_tokens=cost.context_tokens)
        if c is None:
            return 0.0, None
        t0 = st.step_duration_seconds / c.seconds
        pr = p.prefill_ratio(b, k_now, cost.method, cost.drafter) or 1.0
    else:
        t0, pr = st.step_duration_seconds, 1.0
    return (st.prefill_seconds / pr) / (st.decode_tokens * t0), t0


def _anchor(cost: LiveCost, current: Speedup | None, lo_e: Sequence[float], k_now: int,
            p_share: float) -> tuple[float, float]:
    """(A, h): the what-ifs' anchor on the server's own k, A = its live speedup (measured or
    calibrated) / the profile's model of it, (p + 1) / (p ρ + c(k_now) / τ(k_now)), with the
    live speedup's log half-width h; (1, 0) when there is no live speedup or no profile curve at
    k_now. So every k′ is the live k times the modelled ratio k′ / k_now, as the demo's what-ifs
    are (issue #36: one answer on every surface); what the model gets wrong about the server's own
    k (drift, prefill, scheduling) cancels between k′ and k_now."""
    profile = cost.profile
    if current is None or profile is None or not 1 <= k_now <= len(lo_e):
        return 1.0, 0.0
    c = profile.cost_ratio(cost.running_requests, k_now, cost.method, cost.drafter,
                           drafted_tokens_per_step=cost.drafted_tokens_per_step, context_tokens=cost.context_tokens)
    if c is None:
        return 1.0, 0.0
    tau = 1.0 + cost.share * (lo_e[k_now - 1] - 1.0)
    rho = profile.prefill_ratio(cost.running_requests, k_now, cost.method, cost.drafter) or 1.0
    model = (p_share + 1.0) / (p_share * rho + c.seconds / tau)
    if not (math.isfinite(model) and model > 0 and math.isfinite(current.value) and current.value > 0):
        return 1.0, 0.0
    h = 0.0 if current.lower is None or current.upper is None else \
        max(math.log(current.upper / current.value), math.log(current.value / current.lower))
    return current.value / model, h


def speedups(rates: Sequence[float], cost: LiveCost, current_k: int | None = None) -> dict[int, Speedup]:
    """Speedup with its interval for every k′ = 1 … len(``rates``) (module doc). ``current_k`` is
    the k the server runs (default: len(rates)); only it can be ``measured`` or ``calibrated``.
    Empty when ``rates`` is empty."""
    if not rates:
        return {}
    k_now = len(rates) if current_k is None else current_k
    b = cost.running_requests
    s = cost.share
    lo_e = expected_lengths(tuple(rates))
    hi_e = expected_lengths(upper_rates(rates, len(rates), cost.missing_ratio))
    x_now = cost.drafted_tokens_per_step
    profile = cost.profile
    p_share, _ = _prefill_share(cost, k_now)
    dr = drift(cost, k_now) if profile is not None else None
    sample = _sample_halfwidth(cost.step, None) if cost.step is not None and cost.step.engine_steps else 0.0
    out: dict[int, Speedup] = {}
    current = current_speedup(cost, k_now)
    anchor, h_anchor = _anchor(cost, current, lo_e, k_now, p_share)
    for k, (e, e_hi) in enumerate(zip(lo_e, hi_e, strict=True), start=1):
        if k == k_now and current is not None:
            out[k] = current
            continue
        tau, tau_hi = 1.0 + s * (e - 1.0), 1.0 + s * (e_hi - 1.0)
        x = None if x_now is None else x_now * k / max(k_now, 1)
        if profile is not None:
            c = profile.cost_ratio(b, k, cost.method, cost.drafter, drafted_tokens_per_step=x, context_tokens=cost.context_tokens)
            if c is not None:
                rho = profile.prefill_ratio(b, k, cost.method, cost.drafter) or 1.0
                # anchored on the server's own k: its live speedup × the modelled k' / k_now (module doc)
                value = anchor * (p_share + 1.0) / (p_share * rho + c.seconds / tau)
                hi_value = anchor * (p_share + 1.0) / (p_share * rho + c.seconds / tau_hi)
                basis = c.basis
                h = combine_log_halfwidths([sample, h_anchor, *interval_parts(cost, c.spread, basis, dr.ratio if dr else None,
                                                                              c.extrapolation)])
                est = Estimate.around(value, h, basis, upper_factor=hi_value / value,
                                      lower_factor=1.0 / FORWARD_ONLY_FACTOR if profile.forward_only else 1.0)
                upper = max(value, min(est.upper, hi_value)) if profile.forward_only else est.upper
                out[k] = Speedup(value, basis, est.lower, upper)
                continue
        value = tau / default_step_cost_ratio(k, b)
        est = Estimate.around(value, DEFAULT_HALFWIDTH, DEFAULT, upper_factor=tau_hi / tau)
        out[k] = Speedup(value, DEFAULT, est.lower, est.upper)
    return out


#: How far (relative, either way) the built-in guess may lie from the live speedup at the server's
#: own k before its what-if values are not served.
DEFAULT_CONTRADICTION_TOLERANCE = 0.25


def default_contradicted(rates: Sequence[float], cost: LiveCost, current_k: int,
                         tolerance: float = DEFAULT_CONTRADICTION_TOLERANCE) -> tuple[float, float] | None:
    """``(guess, live)`` when the built-in guess (basis default) at the server's own k lies outside
    [live / (1 + tolerance), live × (1 + tolerance)], so its values at the other k must not drive
    a recommendation; else None. ``live`` = :func:`current_speedup`. None too when nothing was
    measured, or ``current_k`` is outside 1 … len(``rates``)."""
    live = current_speedup(cost, current_k)
    if live is None or not 1 <= current_k <= len(rates):
        return None
    e = expected_lengths(tuple(rates))[current_k - 1]
    guess = (1.0 + cost.share * (e - 1.0)) / default_step_cost_ratio(current_k, cost.running_requests)
    ratio = guess / live.value
    if 1.0 / (1.0 + tolerance) <= ratio <= 1.0 + tolerance:
        return None
    return guess, live.value


def candidates(values: dict[int, Speedup], *, never_accepted: bool = False) -> list[Candidate]:
    """The :class:`~specwatch.specdecode.decision.Candidate` of every k′ (named ``k=<k′>``, its
    interval and basis; off is added by :func:`~specwatch.specdecode.decision.decide`).
    ``never_accepted``: drafts were proposed in the window and none was accepted (physics: no k
    can pay)."""
    out = []
    for k, v in sorted(values.items()):
        e = v.estimate
        out.append(Candidate(f"k={k}", k, e.value, e.lower, e.upper, e.basis, never_accepted=never_accepted))
    return out


def pick(values: dict[int, Speedup], tolerance: float = TOLERANCE, *, never_accepted: bool = False) -> Pick:
    """Which k, by the one decision rule (:func:`specwatch.specdecode.decision.decide`, see
    docs/choosing-k.md) over the window's per-k estimates: the best estimate (off = k 0 included;
    ties within ``tolerance`` to the smaller k), always with its confidence (the pick / runner-up
    ratio and whether it separates them: :attr:`~specwatch.specdecode.decision.Pick.certain`).
    The estimates of one window share their errors, so they carry no per-batch log ratios: pick /
    runner-up is the unpaired ratio (labelled so). ``never_accepted``: see :func:`candidates`.
    Raises ValueError when ``values`` is empty."""
    if not values:
        raise ValueError("no speedups to choose from")
    return decide(candidates(values, never_accepted=never_accepted), tolerance)


# ------------------------------------------------------------------------------------------------
# One window's answer: the cost policy (the exporter only renders it)
# ------------------------------------------------------------------------------------------------

#: Reasons of specwatch_recommendation_withheld (with REASON_INSUFFICIENT_DATA). The earlier
#: ``uncertain`` is gone: an uncertain pick is served with its confidence (issue #36).
REASON_NO_COST_CURVE = "no_cost_curve"
REASON_DEFAULT_CONTRADICTED = "default_contradicted"


@dataclass(frozen=True)
class WindowAnswer:
    """Everything the cost side says about one (upstream, model, engine, window):
    ``speedups`` per k (the server's own k alone when the what-ifs are withheld), ``verdict`` of
    the server's k (pays / loses / cannot_tell, None without an interval or from a guess) with its
    ``verdict_basis``, the recommended ``k`` with its ``k_basis`` or the ``withheld`` reason, the
    ``drift``, the :class:`~specwatch.specdecode.decision.Pick` the k came from (``decision``:
    its confidence, runner-up and pick / runner-up ratio; None when withheld) and
    ``never_accepted`` (drafts proposed, none accepted: the k is 0 and the verdict loses whatever
    the speedups' noise says)."""

    speedups: dict[int, Speedup]
    verdict: str | None
    verdict_basis: str | None
    k: int | None
    k_basis: str | None
    withheld: str | None
    drift: Drift | None
    decision: Pick | None = None
    never_accepted: bool = False


def never_accepted(rates: Sequence[float], drafts: float | None) -> bool:
    """True when the window proposed at least :data:`MIN_DRAFTS` drafts and accepted none of their
    tokens (every per-position rate 0): speculation cannot pay there, whatever the speedups say."""
    return bool(rates) and drafts is not None and drafts >= MIN_DRAFTS and not any(r > 0 for r in rates)


def answer(rates: Sequence[float], cost: LiveCost, current_k: int) -> WindowAnswer:
    """The cost policy for one window (see the module doc):

    - no k (no speculation): only the drift;
    - too few drafts for a curve (:data:`MIN_DRAFTS`, e.g. ngram on output it cannot predict): the
      server's own k's live speedup, no what-if, withheld ``insufficient_data``;
    - physics first: drafts proposed (at least :data:`MIN_DRAFTS`) and none accepted: recommended
      k 0 (off) and verdict ``loses``, whatever the speedups' noise or the cost side says;
    - a profile without a curve for the method/drafter: withheld ``no_cost_curve`` (the built-in
      guess must not stand in for a drafter's cost), the server's k only where a baseline gives it;
    - no profile and the built-in guess at the server's k more than 25 % off its live speedup:
      withheld ``default_contradicted``;
    - else every k′ with its interval, and the pick by the one rule (:func:`pick`): the best
      estimate, served with its confidence (never withheld as uncertain).

    A lower-bound (ragged) curve is no reason by itself: its upper ends are raised instead."""
    dr = drift(cost, current_k) if cost.profile is not None else None
    if not current_k:
        return WindowAnswer({}, None, None, None, None, None, dr)
    never = never_accepted(rates, cost.drafts)

    def only(reason: str) -> WindowAnswer:
        live = current_speedup(cost, current_k)
        sp = {current_k: live} if live is not None else {}
        if never:
            p = pick(sp, never_accepted=True) if sp else None
            return WindowAnswer(sp, LOSES, live.basis if live is not None else None, 0,
                                p.basis if p is not None else MEASURED, None, dr, p, True)
        v = live.estimate.verdict if live is not None and live.lower is not None else None
        return WindowAnswer(sp, v, live.basis if v else None, None, None, reason, dr)

    if not rates or (cost.drafts is not None and cost.drafts < MIN_DRAFTS):
        return only(REASON_INSUFFICIENT_DATA)
    if cost.profile is not None and not cost.profile.has_curve(cost.method, cost.drafter):
        return only(REASON_NO_COST_CURVE)
    values = speedups(rates, cost, current_k=current_k)
    if (not never and any(v.basis == DEFAULT for kk, v in values.items() if kk != current_k)
            and default_contradicted(rates, cost, current_k)):
        return only(REASON_DEFAULT_CONTRADICTED)
    own = values.get(current_k)
    if never:  # noqa: SIM108  a nested ternary would read worse
        verdict = LOSES
    else:
        verdict = own.estimate.verdict if own is not None and own.basis != DEFAULT and own.lower is not None else None
    p = pick(values, never_accepted=never)
    return WindowAnswer(values, verdict, own.basis if verdict and own is not None else None, p.k, p.basis, None, dr,
                        p, never)


__all__ = ["CALIBRATED", "DEFAULT", "EXTRAPOLATED", "MEASURED", "PROFILE", "Drift", "LiveCost", "Speedup",
           "REASON_DEFAULT_CONTRADICTED", "REASON_INSUFFICIENT_DATA", "REASON_NO_COST_CURVE", "WindowAnswer",
           "answer", "candidates", "never_accepted", "pick",
           "between_rounds_halfwidth", "current_speedup", "default_contradicted", "drift", "measured_speedup",
           "profile_error_ratio", "speedups",
           "upper_rates"]
