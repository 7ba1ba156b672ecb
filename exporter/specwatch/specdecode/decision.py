"""Decisions on uncertain speedups: "pays", "loses", "cannot tell", and which k to run.

A speedup (ratio over running without speculation) is only useful with how sure it is. An
:class:`Estimate` carries a point value and a 95 % interval ``[lower, upper]`` together with its
basis (how it was obtained: :mod:`specwatch.specdecode.costprofile`'s ``BASES``). Two decisions
are made on the interval, never on the point value alone:

- **verdict** of one k: ``pays`` when ``lower > 1``, ``loses`` when ``upper < 1``, else
  ``cannot_tell`` (:func:`verdict`);
- **which k** (:func:`choose_k`): the k with the best speedup, k = 0 (speculation off, exactly 1)
  included, the smallest within :data:`TOLERANCE` of the best winning (noise must not buy draft
  tokens). The choice is served only when it is the same at the lower ends, at the point values
  and at the upper ends of every interval (the errors of one window's estimates are correlated:
  one cost profile, one drift, one acceptance curve, so the three scenarios bracket the choice);
  otherwise it is withheld with reason ``uncertain``.

Used by the exporter (live), ``specwatch advise --exporter``, ``specwatch top`` and the demo.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Relative tolerance: a smaller k within 2 % of the best speedup wins (the one constant; the
#: exporter's HELP text and the k-choice model read it from here).
TOLERANCE = 0.02

PAYS = "pays"
LOSES = "loses"
CANNOT_TELL = "cannot_tell"
VERDICTS = (PAYS, LOSES, CANNOT_TELL)

#: z of a two-sided 95 % normal interval.
Z95 = 1.959963984540054


@dataclass(frozen=True)
class Estimate:
    """A speedup over running without speculation (ratio, > 0) with its 95 % interval
    (``lower`` ≤ ``value`` ≤ ``upper``, all > 0) and ``basis`` (measured, calibrated, profile,
    extrapolated, default). ``lower == upper == value`` only where the value is exact (k = 0).

    Raises ValueError for a non-finite or non-positive number or an interval not around the value.
    """

    value: float
    lower: float
    upper: float
    basis: str

    def __post_init__(self) -> None:
        for name in ("value", "lower", "upper"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        if not self.lower <= self.value <= self.upper:
            raise ValueError(f"interval [{self.lower}, {self.upper}] does not contain {self.value}")

    @property
    def verdict(self) -> str:
        """:func:`verdict` of this estimate's interval."""
        return verdict(self.lower, self.upper)

    @property
    def width_ratio(self) -> float:
        """upper / lower (1 = exact)."""
        return self.upper / self.lower

    @classmethod
    def around(cls, value: float, log_halfwidth: float, basis: str, *, lower_factor: float = 1.0,
               upper_factor: float = 1.0) -> "Estimate":
        """``value`` with the interval ``value × exp(±log_halfwidth)``, the lower end further
        multiplied by ``lower_factor`` (≤ 1) and the upper by ``upper_factor`` (≥ 1), e.g. for a
        lower-bound acceptance curve. Raises ValueError as the class does, or for a negative
        half-width."""
        if not math.isfinite(log_halfwidth) or log_halfwidth < 0:
            raise ValueError(f"log_halfwidth must be a finite number >= 0, got {log_halfwidth!r}")
        return cls(value, value * math.exp(-log_halfwidth) * min(1.0, lower_factor),
                   value * math.exp(log_halfwidth) * max(1.0, upper_factor), basis)


def verdict(lower: float, upper: float) -> str:
    """``pays`` when ``lower > 1``, ``loses`` when ``upper < 1``, else ``cannot_tell``."""
    if lower > 1.0:
        return PAYS
    if upper < 1.0:
        return LOSES
    return CANNOT_TELL


def combine_log_halfwidths(parts: Sequence[float]) -> float:
    """Independent relative errors combined in quadrature: sqrt(Σ h_i²) (each h a log half-width)."""
    return math.sqrt(sum(h * h for h in parts))


def best_of(values: Mapping[int, float], tolerance: float = TOLERANCE) -> int:
    """The k with the highest value among ``values`` only (no implicit "off"), the smallest k
    within ``tolerance`` (relative) of the best winning: the one tie rule of every k choice.
    Raises ValueError when ``values`` is empty or a tolerance is outside [0, 1)."""
    if not values:
        raise ValueError("no speedups to choose from")
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
    top = max(values.values())
    return min(k for k, v in values.items() if v >= top * (1.0 - tolerance))


def best_k(values: Mapping[int, float], tolerance: float = TOLERANCE) -> int:
    """The k with the highest value, k = 0 (off, exactly 1) included, the smallest k within
    ``tolerance`` (relative) of the best winning (:func:`best_of` over ``{0: 1.0, **values}``).
    Raises ValueError when ``values`` is empty or a tolerance is outside [0, 1)."""
    if not values:
        raise ValueError("no speedups to choose from")
    return best_of({0: 1.0, **dict(values)}, tolerance)


@dataclass(frozen=True)
class Choice:
    """The outcome of :func:`choose_k`: ``k`` (0 = speculation off) or None when withheld,
    ``reason`` (``uncertain``) when withheld, the k of the three scenarios (``at_lower``,
    ``at_value``, ``at_upper``) and ``basis``, the weakest basis among the estimates compared."""

    k: int | None
    reason: str | None
    at_lower: int
    at_value: int
    at_upper: int
    basis: str


REASON_UNCERTAIN = "uncertain"


def choose_k(estimates: Mapping[int, Estimate], *, weakest: str, tolerance: float = TOLERANCE) -> Choice:
    """Which k to run from per-k estimates (k ≥ 1; k = 0 is exactly 1), see the module doc.

    ``weakest``: the basis the choice carries (the caller's weakest basis among ``estimates``).
    Raises ValueError when ``estimates`` is empty."""
    if not estimates:
        raise ValueError("no speedups to choose from")
    lo = best_k({k: e.lower for k, e in estimates.items()}, tolerance)
    mid = best_k({k: e.value for k, e in estimates.items()}, tolerance)
    hi = best_k({k: e.upper for k, e in estimates.items()}, tolerance)
    if lo == mid == hi:
        return Choice(mid, None, lo, mid, hi, weakest)
    return Choice(None, REASON_UNCERTAIN, lo, mid, hi, weakest)


__all__ = ["CANNOT_TELL", "Choice", "Estimate", "LOSES", "PAYS", "REASON_UNCERTAIN", "TOLERANCE", "VERDICTS", "Z95",
           "best_k", "best_of", "choose_k", "combine_log_halfwidths", "verdict"]
