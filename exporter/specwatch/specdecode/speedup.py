"""Does speculation pay, and with which k: speedups that say how they were obtained.

Inputs, per upstream × model × engine × window:

- the per-position acceptance curve r_i = Δ``…_num_accepted_tokens_per_pos_total{position=i}`` /
  Δ``…_num_drafts_total`` at the server's k, so E(k′) = 1 + Σ_{i<k′} r_i tokens per draft;
- the live step times (:class:`specwatch.specdecode.steptime.StepTimes`): the running request's
  decode speed, the step duration, the running requests per step b, and the draft share
  s = Δdrafts / Δ request-steps (a step without a draft emits one token);
- optionally a baseline server's live decode speed (a server without speculation beside this one);
- optionally a :class:`specwatch.specdecode.costprofile.CostProfile` (measured t0(b) and t(b, k)).

Speedup over running without speculation, with its basis:

- ``measured`` — the server's current k, from its live decode speed v (Δ(generation − first
  tokens) / Δ ITL sum): v / v_baseline when a baseline server's live speed is known, else
  v × t0(b) with the profile's plain step time at the live b (the plain server's decode speed is
  1 / t0(b));
- ``profile`` — a what-if k′: τ(k′) × t0(b) / t(b, k′) with τ(k′) = 1 + s (E(k′) − 1) tokens per
  request-step and both step times from the profile at the live b;
- ``extrapolated`` — as ``profile`` (or ``measured`` with t0) where b or k′ lies outside what the
  profile measured;
- ``default`` — no profile: τ(k′) / c(k′, b) with the built-in guess
  :func:`~specwatch.specdecode.costprofile.default_step_cost_ratio`, shown as a guess.

The recommended k compares these with k = 0 (speculation off, exactly 1) and carries the weakest
basis among them. Below 1 speculation is a net loss.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specwatch.specdecode.costprofile import (
    DEFAULT,
    EXTRAPOLATED,
    MEASURED,
    PROFILE,
    CostProfile,
    default_step_cost_ratio,
    weakest_basis,
)
from specwatch.specdecode.derive import expected_lengths
from specwatch.specdecode.steptime import StepTimes


@dataclass(frozen=True)
class Speedup:
    """A speedup (ratio, > 0) over running without speculation and its basis (see module doc)."""

    value: float
    basis: str


@dataclass(frozen=True)
class LiveCost:
    """The cost side of one window: live step times (None when the server does not export them),
    the draft share s (None: unknown, taken as 1), a baseline server's live decode speed (tok/s per
    running request, None when no baseline is configured or it had no traffic), the profile and the
    speculative method/drafter to look up (None: the profile's default)."""

    step: StepTimes | None = None
    draft_share: float | None = None
    baseline_decode_tokens_per_second: float | None = None
    profile: CostProfile | None = None
    method: str | None = None
    drafter: str | None = None
    running_requests_fallback: float | None = None

    @property
    def running_requests(self) -> float:
        """b: running requests per step (live, step-weighted), else the fallback (the gauge), else 1."""
        if self.step is not None and self.step.running_requests_per_step is not None:
            return self.step.running_requests_per_step
        if self.running_requests_fallback is not None and self.running_requests_fallback > 0:
            return self.running_requests_fallback
        return 1.0


def _finite_positive(v: float | None) -> bool:
    return v is not None and math.isfinite(v) and v > 0


def speedups(rates: Sequence[float], cost: LiveCost, current_k: int | None = None) -> dict[int, Speedup]:
    """Speedup for every k′ = 1 … len(``rates``) (module doc). ``current_k`` is the k the server
    runs (default: len(rates)); only it can be ``measured``. Empty when ``rates`` is empty."""
    if not rates:
        return {}
    current_k = len(rates) if current_k is None else current_k
    b = cost.running_requests
    s = cost.draft_share if cost.draft_share is not None and 0 <= cost.draft_share <= 1 else 1.0
    profile = cost.profile
    t0 = profile.plain_step(b) if profile is not None else None
    out: dict[int, Speedup] = {}
    measured = measured_speedup(cost)
    for k, e in enumerate(expected_lengths(tuple(rates)), start=1):
        tau = 1.0 + s * (e - 1.0)
        if k == current_k and measured is not None:
            out[k] = measured
            continue
        if profile is not None and t0 is not None:
            tk = profile.speculative_step(b, k, cost.method, cost.drafter)
            if tk is not None:
                out[k] = Speedup(tau * t0.seconds / tk.seconds, weakest_basis([t0.basis, tk.basis]))
                continue
        out[k] = Speedup(tau / default_step_cost_ratio(k, b), DEFAULT)
    return out


def measured_speedup(cost: LiveCost) -> Speedup | None:
    """The current k's speedup from live step time alone (no acceptance curve needed: a window in
    which nothing was drafted still has a measured decode speed). None without live decode speed,
    or without both a baseline speed and a profile."""
    live = cost.step.request_decode_tokens_per_second if cost.step is not None else None
    if not _finite_positive(live):
        return None
    if _finite_positive(cost.baseline_decode_tokens_per_second):
        return Speedup(live / cost.baseline_decode_tokens_per_second, MEASURED)
    if cost.profile is not None:
        t0 = cost.profile.plain_step(cost.running_requests)
        return Speedup(live * t0.seconds, MEASURED if t0.basis == PROFILE else EXTRAPOLATED)
    return None


#: How far (relative, either way) the built-in guess may lie from the measured speedup at the
#: server's own k before its what-if values are not served: the drift alert's default tolerance
#: (``cost_profile_error_tolerance``), the band a profile is held to.
DEFAULT_CONTRADICTION_TOLERANCE = 0.25


def default_contradicted(rates: Sequence[float], cost: LiveCost, current_k: int,
                         tolerance: float = DEFAULT_CONTRADICTION_TOLERANCE) -> tuple[float, float] | None:
    """``(guess, measured)`` when the built-in guess (basis default) at the server's own k lies
    outside [measured / (1 + tolerance), measured × (1 + tolerance)], so the guess is shown wrong
    for this server and its values at the other k must not drive a recommendation; else None.

    ``guess`` = τ(k) / c(k, b) (:func:`~specwatch.specdecode.costprofile.default_step_cost_ratio`),
    ``measured`` = :func:`measured_speedup` (live decode speed over a baseline's or × t0(b)). None
    too when nothing was measured, or ``current_k`` is outside 1 … len(``rates``)."""
    measured = measured_speedup(cost)
    if measured is None or not 1 <= current_k <= len(rates):
        return None
    s = cost.draft_share if cost.draft_share is not None and 0 <= cost.draft_share <= 1 else 1.0
    e = expected_lengths(tuple(rates))[current_k - 1]
    guess = (1.0 + s * (e - 1.0)) / default_step_cost_ratio(current_k, cost.running_requests)
    ratio = guess / measured.value
    if 1.0 / (1.0 + tolerance) <= ratio <= 1.0 + tolerance:
        return None
    return guess, measured.value


def recommend(values: dict[int, Speedup], tolerance: float = 0.02) -> tuple[int, str]:
    """(k, basis): the k with the highest speedup, k = 0 (off, exactly 1) included; the smallest k
    within ``tolerance`` (relative) of the best wins, so noise does not buy draft tokens. The basis
    is the weakest among the values compared. Raises ValueError when ``values`` is empty."""
    if not values:
        raise ValueError("no speedups to choose from")
    cands = {0: 1.0, **{k: v.value for k, v in values.items()}}
    best = max(cands.values())
    k = min(k for k, v in cands.items() if v >= best * (1.0 - tolerance))
    return k, weakest_basis([v.basis for v in values.values()])


def profile_error_ratio(cost: LiveCost, k: int) -> float | None:
    """Drift: live step duration / the profile's prediction at the live b and the server's k
    (k = 0: the plain step t0(b)). None without a profile, live step time, or a curve for the method."""
    if cost.profile is None or cost.step is None or not _finite_positive(cost.step.step_duration_seconds):
        return None
    b = cost.running_requests
    pred = cost.profile.plain_step(b) if k == 0 else cost.profile.speculative_step(b, k, cost.method, cost.drafter)
    if pred is None:
        return None
    return cost.step.step_duration_seconds / pred.seconds


__all__ = ["DEFAULT", "EXTRAPOLATED", "MEASURED", "PROFILE", "LiveCost", "Speedup", "default_contradicted",
           "profile_error_ratio", "recommend", "speedups", "measured_speedup"]
