"""The one decision rule of specwatch, and its evidence: "pays", "loses", "cannot tell", and
which k to run (docs/choosing-k.md#the-decision-rule).

A speedup (ratio over running without speculation) is only useful with how sure it is. An
:class:`Estimate` carries a point value and a 95 % interval ``[lower, upper]`` together with its
basis (how it was obtained: measured, calibrated, profile, extrapolated, default).

- **evidence**: paired per-batch ratios (batch i of two configurations served the same seeded
  prompts) on the log scale, :func:`paired_ratio` / :class:`PairedRatio`, with the project's one
  t quantile :func:`t975`;
- **verdict** of one configuration: ``pays`` when ``lower > 1``, ``loses`` when ``upper < 1``,
  else ``cannot_tell`` (:func:`verdict`);
- **which k** (:func:`decide`): the :class:`Candidate` with the best estimate, off (k = 0,
  exactly 1) included, the smallest k within :data:`TOLERANCE` of the best winning (noise must
  not buy draft tokens), physics first (drafts never accepted cannot pay), served with its
  confidence against the runner-up (:class:`Pick`); uncertainty never turns into a smaller k.

Used by ``specwatch advise`` (sweep, demo folder, live), ``specwatch report``, the demo,
``specwatch top`` and the exporter; nothing else decides.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

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


# ------------------------------------------------------------------------------------------------
# The one t quantile of the project
# ------------------------------------------------------------------------------------------------

#: Student's t at 0.975 (two-sided 95 %) for 1 … 30 degrees of freedom.
_T975 = (12.706204736, 4.302652730, 3.182446305, 2.776445105, 2.570581836, 2.446911851, 2.364624252,
         2.306004135, 2.262157163, 2.228138852, 2.200985160, 2.178812830, 2.160368656, 2.144786688,
         2.131449546, 2.119905299, 2.109815578, 2.100922040, 2.093024054, 2.085963447, 2.079613845,
         2.073873068, 2.068657610, 2.063898562, 2.059538553, 2.055529439, 2.051830516, 2.048407142,
         2.045229642, 2.042272456)


def t975(df: int) -> float:
    """Student's t quantile at 0.975 for ``df`` ≥ 1 degrees of freedom: the table to 30, beyond it
    the Cornish-Fisher expansion to the df⁻³ term (within 1e-5 of the exact value for
    df > 30). The one t quantile of the project: every interval
    (throughputs, paired ratios, the demo's estimates) uses it. Raises ValueError for df < 1."""
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"degrees of freedom must be an integer >= 1, got {df!r}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = Z95
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


# ------------------------------------------------------------------------------------------------
# Paired ratios: the evidence
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairedRatio:
    """A ratio of two configurations (``a / b``) from ``n`` paired observations (batch i of both
    served the same seeded prompts): ``value`` = exp(mean log r_i), the geometric mean of the
    per-batch ratios r_i = a_i / b_i; its 95 % interval ``[lower, upper]`` = exp(mean ± t(n−1) ·
    sd / √n) with sd the sample standard deviation of log r_i (never negative, never straddling
    zero). One pair (``n == 1``) gives a value and no interval (``lower``/``upper`` None).

    ``paired`` is False for an unpaired comparison (the ratio of two independent estimates, its
    log half-width the two in quadrature), which may be shown and is labelled so, never decided
    on as paired evidence. ``log_sd`` is the spread of the log ratios (None with one pair)."""

    value: float
    lower: float | None
    upper: float | None
    n: int
    log_sd: float | None
    paired: bool = True

    @property
    def has_interval(self) -> bool:
        """True when the ratio has a 95 % interval (two or more pairs, or an unpaired interval)."""
        return self.lower is not None and self.upper is not None

    @property
    def verdict(self) -> str:
        """``pays`` when lower > 1 (a over b), ``loses`` when upper < 1, else ``cannot_tell``
        (always with one pair: no interval)."""
        if not self.has_interval:
            return CANNOT_TELL
        return verdict(self.lower, self.upper)

    def more_batches(self, cap: int = 1000, extra: float = 0.0) -> int | None:
        """About how many more paired batches, at this spread and this mean, the interval needs to
        exclude 1 (the smallest n with √((t(n−1) · sd / √n)² + extra²) < |mean log r|, minus
        ``n``; ``extra``: a log half-width batches cannot shrink, e.g. the between-starts term);
        0 when it already does; None when it cannot be said (one pair, a ratio of exactly 1,
        ``extra`` at least the gap, or more than ``cap`` batches)."""
        if self.log_sd is None or self.n < 2:
            return None
        m = abs(math.log(self.value))
        if m == 0.0 or extra >= m:
            return None
        if self.log_sd == 0.0:
            return 0
        for n in range(2, cap + 1):
            if math.hypot(t975(n - 1) * self.log_sd / math.sqrt(n), extra) < m:
                return max(0, n - self.n)
        return None

    def estimate(self, basis: str) -> Estimate | None:
        """As an :class:`Estimate` with ``basis`` (None without an interval)."""
        if not self.has_interval:
            return None
        return Estimate(self.value, min(self.lower, self.value), max(self.upper, self.value), basis)

    def to_json(self) -> dict[str, Any]:
        """``{"value", "lower", "upper", "n", "log_sd", "paired"}``."""
        return {"value": self.value, "lower": self.lower, "upper": self.upper, "n": self.n, "log_sd": self.log_sd,
                "paired": self.paired}


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def ratio_from_logs(logs: Sequence[float]) -> PairedRatio:
    """The :class:`PairedRatio` of per-pair log ratios (``log(a_i / b_i)``). Raises ValueError
    for no pairs or a non-finite log ratio."""
    xs = [float(x) for x in logs]
    if not xs:
        raise ValueError("no pairs to compare")
    if not all(math.isfinite(x) for x in xs):
        raise ValueError(f"log ratios must be finite, got {xs!r}")
    n = len(xs)
    mean = math.fsum(xs) / n
    value = math.exp(mean)
    if n < 2:
        return PairedRatio(value, None, None, 1, None)
    sd = statistics.stdev(xs)
    h = t975(n - 1) * sd / math.sqrt(n)
    return PairedRatio(value, math.exp(mean - h), math.exp(mean + h), n, sd)


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> PairedRatio:
    """The paired ratio a / b of two equally long sequences of positive measurements in pair
    order (e.g. output throughput, tok/s, of batch i of a speculative and of the baseline server,
    both having served the same seeded prompts). Raises ValueError for sequences of different
    lengths, no pairs, or a value that is not a finite number > 0."""
    if len(a) != len(b):
        raise ValueError(f"paired sequences differ in length: {len(a)} and {len(b)}")
    bad = [v for v in (*a, *b) if not _positive(v)]
    if bad:
        raise ValueError(f"paired values must be finite numbers > 0, got {bad[0]!r}")
    return ratio_from_logs([math.log(x / y) for x, y in zip(a, b, strict=True)])


def unpaired_ratio(a: Estimate, b: Estimate) -> PairedRatio:
    """a / b of two independent estimates (not paired: labelled ``paired=False``): the value
    a.value / b.value, its log half-width the two log half-widths (the larger side of each) in
    quadrature. Shown, never decided on as paired evidence."""
    ha = max(math.log(a.upper / a.value), math.log(a.value / a.lower))
    hb = max(math.log(b.upper / b.value), math.log(b.value / b.lower))
    h = combine_log_halfwidths([ha, hb])
    v = a.value / b.value
    return PairedRatio(v, v * math.exp(-h), v * math.exp(h), 0, None, paired=False)


# ------------------------------------------------------------------------------------------------
# Between server starts: what a paired interval does not contain
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StartSpread:
    """The spread of a ratio between two *starts* of servers, beyond its paired interval
    (docs/choosing-k.md#what-a-paired-interval-does-not-contain-the-server-start).

    A paired ratio compares one start of a speculative server with one start of the baseline;
    its interval holds the batch-to-batch noise of those two processes, not the offset a new
    start of either would bring (measured on the 2-core VM: ≈ 6 % sd per cell). An A/A check
    measures it: a second start of the *same* server (no speculation) measured beside the running
    baseline exactly as a speculative configuration is (``specwatch sweep --aa-starts N``), whose
    true ratio is 1. Per A/A cell i (≥ 2 paired batches) m_i = mean log ratio and se_i² = its
    sample variance / n_i; the between-starts variance is the excess τ² = max(0, mean m_i² −
    mean se_i²) (method of moments, the true log ratio being 0), ``cells`` = the number of A/A
    cells (its degrees of freedom).

    ``log_sd``: τ (log scale, ≥ 0); ``cells``: A/A cells it rests on (≥ 1); ``covered``: of those,
    how many had a paired 95 % interval holding 1; ``source``: where it was measured (the A/A
    configurations and the file). :attr:`log_halfwidth` = t975(cells) · τ is added in quadrature
    to every measured ratio over the baseline and to every comparison of two configurations
    measured on different starts (:class:`Candidate` ``start_log_halfwidth``). Raises ValueError
    for a negative or non-finite τ or fewer than one cell."""

    log_sd: float
    cells: int
    covered: int
    source: str
    #: A/A cells of the source left out (fewer than two paired batches, no baseline beside them).
    left_out: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.log_sd, (int, float)) and math.isfinite(self.log_sd) and self.log_sd >= 0):
            raise ValueError(f"log_sd must be a finite number >= 0, got {self.log_sd!r}")
        if isinstance(self.cells, bool) or not isinstance(self.cells, int) or self.cells < 1:
            raise ValueError(f"cells must be an integer >= 1, got {self.cells!r}")
        if not 0 <= self.covered <= self.cells:
            raise ValueError(f"covered must be in [0, {self.cells}], got {self.covered!r}")

    @property
    def log_halfwidth(self) -> float:
        """The 95 % half-width it adds (log scale): t975(cells) · τ."""
        return t975(self.cells) * self.log_sd

    def percent_text(self) -> str:
        """``±9.8 % (sd 3.5 % over 4 A/A cells; their paired 95 % intervals held 1 in 2 of 4)``;
        with τ = 0, that the A/A cells showed no spread beyond their own intervals (not a measured
        zero: too small to see at that noise)."""
        cells = f"{self.cells} A/A cell{'s' if self.cells != 1 else ''}"
        held = (f"their paired 95 % intervals held 1 in {self.covered} of {self.cells}"
                + (f"; {self.left_out} more left out: fewer than two paired batches" if self.left_out else ""))
        if self.log_sd == 0.0:
            return f"none seen beyond the paired intervals over {cells} ({held}): nothing added"
        return (f"±{(math.exp(self.log_halfwidth) - 1) * 100:.1f} % (sd {(math.exp(self.log_sd) - 1) * 100:.1f} % "
                f"over {cells}; {held})")

    def to_json(self) -> dict[str, Any]:
        """``{"log_sd", "cells", "covered", "left_out", "log_halfwidth", "source"}``."""
        return {"log_sd": self.log_sd, "cells": self.cells, "covered": self.covered, "left_out": self.left_out,
                "log_halfwidth": self.log_halfwidth, "source": self.source}

    @classmethod
    def from_cells(cls, cells: Sequence[Sequence[float]], source: str) -> "StartSpread | None":
        """From the per-batch log ratios of each A/A cell (a second start over the first, batch i
        of both on the same prompts); cells with fewer than two pairs are left out; None when no
        cell is left. Raises ValueError for a non-finite log ratio."""
        used = [[float(x) for x in c] for c in cells if len(c) >= 2]
        if not used:
            return None
        left_out = len(cells) - len(used)
        ms, se2, covered = [], [], 0
        for logs in used:
            r = ratio_from_logs(logs)
            ms.append(math.fsum(logs) / len(logs))
            se2.append(statistics.variance(logs) / len(logs))
            covered += int(r.lower <= 1.0 <= r.upper)
        excess = math.fsum(m * m for m in ms) / len(ms) - math.fsum(se2) / len(se2)
        return cls(math.sqrt(max(0.0, excess)), len(used), covered, source, left_out)


NO_START_SPREAD = ("between-start spread not measured: each interval holds one start of each server only "
                   "(a new start moved a ratio by ≈ 6 % sd on a 2-core VM; measure yours with "
                   "specwatch sweep --aa-starts 2)")


# ------------------------------------------------------------------------------------------------
# The one decision rule
# ------------------------------------------------------------------------------------------------

#: Bases, strongest first (how an estimate was obtained; see docs/choosing-k.md).
BASES = ("measured", "calibrated", "profile", "extrapolated", "default")

OFF = "off"


@dataclass(frozen=True)
class Candidate:
    """One configuration the rule can pick, with its speedup over the baseline.

    ``name``: as shown (``off``, ``k=4``, ``table [[1,2,4],[3,1024,1]]``, ``ngram k=4``);
    ``k``: num_speculative_tokens (0 = speculation off; a dynamic table: its largest k, for the tie
    order); ``value``: the speedup over the baseline (> 0; 1 for off); ``lower``/``upper``: its
    95 % interval (None: one batch, no interval); ``basis``: measured, calibrated, profile,
    extrapolated or default; ``log_ratios``: the per-batch log(config_i / baseline_i) in pair order
    when measured paired (lets two candidates be compared batch by batch); ``never_accepted``:
    the configuration proposed drafts and none was accepted in any batch, or proposed none
    (physics: it cannot pay); ``table``: a dynamic ``num_speculative_tokens_per_batch_size``
    table (a candidate of its own, never merged with a fixed k); ``batches``: measured batches."""

    name: str
    k: int
    value: float
    lower: float | None = None
    upper: float | None = None
    basis: str = "measured"
    log_ratios: tuple[float, ...] | None = None
    never_accepted: bool = False
    table: bool = False
    batches: int | None = None
    #: A modelled candidate (a what-if k′ = a measured anchor × a modelled factor R): the log
    #: half-width of R's own error (e.g. the fitted cost slope's), independent of the batches.
    #: Its ``log_ratios`` are then the anchor's shifted by log R, so a comparison with the anchor
    #: is paired and this error is added to it in quadrature. 0 for a measured candidate.
    model_log_halfwidth: float = 0.0
    #: The between-server-starts term (:class:`StartSpread` ``log_halfwidth``) already in this
    #: candidate's interval over the baseline; 0 when none was measured. ``start``: the server
    #: start it was measured on (its configuration; a what-if k′ carries its anchor's), so two
    #: candidates of one start are compared without it and two of different starts with it.
    start_log_halfwidth: float = 0.0
    start: str | None = None

    def __post_init__(self) -> None:
        for name in ("model_log_halfwidth", "start_log_halfwidth"):
            h = getattr(self, name)
            if not (isinstance(h, (int, float)) and math.isfinite(h) and h >= 0):
                raise ValueError(f"{self.name}: {name} must be a finite number >= 0, got {h!r}")
        if not _positive(self.value):
            raise ValueError(f"{self.name}: value must be a finite number > 0, got {self.value!r}")
        for end in (self.lower, self.upper):
            if end is not None and not _positive(end):
                raise ValueError(f"{self.name}: interval ends must be finite numbers > 0, got {end!r}")
        if self.basis not in BASES:
            raise ValueError(f"{self.name}: unknown basis {self.basis!r} (one of {', '.join(BASES)})")

    @property
    def off(self) -> bool:
        """True for speculation off (k = 0)."""
        return self.k == 0 and not self.table

    @property
    def has_interval(self) -> bool:
        return self.lower is not None and self.upper is not None

    @property
    def log_halfwidth(self) -> float | None:
        """The larger side of its interval on the log scale, None without an interval."""
        if not self.has_interval:
            return None
        return max(math.log(self.upper / self.value), math.log(self.value / self.lower))

    @property
    def verdict(self) -> str:
        """Against the baseline: ``pays`` (lower > 1), ``loses`` (upper < 1, or drafts never
        accepted), else ``cannot_tell`` (also without an interval)."""
        if self.never_accepted and not self.off:
            return LOSES
        if not self.has_interval:
            return CANNOT_TELL
        return verdict(self.lower, self.upper)

    @classmethod
    def speculation_off(cls) -> "Candidate":
        """k = 0: the baseline itself, exactly 1."""
        return cls(OFF, 0, 1.0, 1.0, 1.0, "measured")

    @classmethod
    def from_ratio(cls, name: str, k: int, ratio: PairedRatio, *, basis: str = "measured",
                   log_ratios: Sequence[float] | None = None, never_accepted: bool = False,
                   table: bool = False) -> "Candidate":
        """A candidate from its paired ratio over the baseline (``ratio.n`` batches)."""
        return cls(name, k, ratio.value, ratio.lower, ratio.upper, basis,
                   None if log_ratios is None else tuple(float(x) for x in log_ratios),
                   never_accepted, table, ratio.n if ratio.paired else None)

    def with_start_spread(self, spread: "StartSpread | None", start: str | None = None) -> "Candidate":
        """This candidate with the between-starts term of ``spread`` added in quadrature to its
        interval over the baseline (log scale; the batch spread ``log_ratios`` is kept), measured
        on ``start`` (default: its name). Unchanged for off and for ``spread`` None; with a term of
        0 or without an interval (one batch: nothing to widen) only ``start`` is set."""
        if self.off or spread is None:
            return self
        h = spread.log_halfwidth
        where = start if start is not None else self.name
        if h <= 0.0 or not self.has_interval:
            return replace(self, start=where)
        hw = combine_log_halfwidths([self.log_halfwidth, h])
        return replace(self, lower=self.value * math.exp(-hw), upper=self.value * math.exp(hw),
                       start_log_halfwidth=h, start=where)

    def without_start(self) -> "Candidate":
        """This candidate with its between-starts term taken out of its interval again (log
        half-width √(h² − h_start²), symmetric), for arithmetic that must add it once itself
        (a combination over workloads, an unpaired comparison). Unchanged without a term."""
        h_start = self.start_log_halfwidth
        if h_start <= 0.0 or not self.has_interval:
            return self
        h = self.log_halfwidth
        rest = math.sqrt(max(0.0, h * h - h_start * h_start))
        return replace(self, lower=self.value * math.exp(-rest), upper=self.value * math.exp(rest),
                       start_log_halfwidth=0.0)

    @classmethod
    def from_estimate(cls, name: str, k: int, e: Estimate, **kw: Any) -> "Candidate":
        """A candidate from an :class:`Estimate` (its basis and interval)."""
        return cls(name, k, e.value, e.lower, e.upper, e.basis, **kw)


@dataclass(frozen=True)
class Pick:
    """The outcome of :func:`decide`.

    ``pick``: the candidate with the best estimate (ties within ``tolerance`` at the estimates go
    to the smaller k; off is k = 0); ``verdict``: speculation against the baseline — the pick's
    verdict when it speculates; when the pick is off, ``loses`` if every speculative candidate
    loses (or cannot pay: drafts never accepted), else ``cannot_tell``; ``runner_up``: the next
    best candidate (None when there is only one); ``versus_runner_up``: pick / runner-up, paired
    where both have per-batch log ratios of the same length, else unpaired (labelled), else None
    (no intervals); ``separated``: that ratio's lower end > 1 (or the gap is exact: off against a
    never-accepted configuration); ``more_batches``: about how many more paired batches at this
    spread would separate them (None: cannot be said); ``tie``: the pick is a smaller k within
    the tolerance of the best estimate; ``excluded``: the candidates that cannot pay (drafts
    never accepted), each with its reason; ``candidates``: every candidate considered."""

    pick: Candidate
    verdict: str
    runner_up: Candidate | None
    versus_runner_up: PairedRatio | None
    separated: bool
    more_batches: int | None
    tie: bool
    best: Candidate
    excluded: tuple[tuple[str, str], ...]
    candidates: tuple[Candidate, ...]
    tolerance: float
    #: Not separated, and the between-starts term alone (with any model error) is as large as the
    #: gap between pick and runner-up: more batches cannot separate them, new server starts can.
    start_limited: bool = False

    @property
    def certain(self) -> bool:
        """True when the pick is separated from its runner-up (or has none)."""
        return self.separated

    @property
    def k(self) -> int:
        """The pick's k (0 = off)."""
        return self.pick.k

    @property
    def basis(self) -> str:
        """The weakest basis among the pick and its runner-up (what the answer rests on)."""
        bs = [self.pick.basis] + ([self.runner_up.basis] if self.runner_up is not None else [])
        return max(bs, key=BASES.index)

    def confidence_text(self) -> str:
        """One line: how sure the pick is against its runner-up, e.g. ``k=2 within 0.98–1.35×:
        cannot tell them apart; about 6 more paired batches at this spread``."""
        return confidence_text(self)

    def to_json(self) -> dict[str, Any]:
        """The pick as a JSON object (names, k, verdict, runner-up ratio, tie, excluded)."""
        v = self.versus_runner_up
        return {"pick": self.pick.name, "k": self.pick.k, "table": self.pick.table, "value": self.pick.value,
                "lower": self.pick.lower, "upper": self.pick.upper, "basis": self.pick.basis,
                "verdict": self.verdict, "certain": self.certain, "tie": self.tie, "best": self.best.name,
                "runner_up": None if self.runner_up is None else self.runner_up.name,
                "versus_runner_up": None if v is None else v.to_json(), "more_batches": self.more_batches,
                "excluded": [{"name": n, "reason": r} for n, r in self.excluded], "tolerance": self.tolerance,
                "start_limited": self.start_limited,
                "text": self.confidence_text()}


NEVER_ACCEPTED = "no draft token was accepted in any batch: it cannot pay"


def _order(c: Candidate) -> tuple[int, int, str]:
    # The tie order: the smaller k first, a fixed k before a table of the same largest k.
    return (c.k, int(c.table), c.name)


def _widened(r: PairedRatio, model_h: float) -> PairedRatio:
    """``r`` with a model error (log half-width) added to its interval in quadrature; the batch
    spread (``log_sd``) is kept, so :meth:`PairedRatio.more_batches` still speaks of batches."""
    if model_h <= 0.0:
        return r
    h_batches = 0.0 if not r.has_interval else math.log(r.upper / r.value)
    h = combine_log_halfwidths([h_batches, model_h])
    return PairedRatio(r.value, r.value * math.exp(-h), r.value * math.exp(h), r.n, r.log_sd, r.paired)


def _start_term(a: Candidate, b: Candidate) -> float:
    """The between-starts half-width of a / b: the other's term against off (the baseline is one
    start, the candidate another); none between two candidates of one start; else the larger term
    (two starts against each other: the same A/A offset)."""
    if a.off or b.off:
        return b.start_log_halfwidth if a.off else a.start_log_halfwidth
    if a.start is not None and a.start == b.start:
        return 0.0
    return max(a.start_log_halfwidth, b.start_log_halfwidth)


def _extra_halfwidth(a: Candidate, b: Candidate) -> float:
    """What more batches cannot remove from a / b: the model errors and the between-starts term."""
    return combine_log_halfwidths([a.model_log_halfwidth, b.model_log_halfwidth, _start_term(a, b)])


def _versus(a: Candidate, b: Candidate) -> PairedRatio | None:
    if a.log_ratios is not None and b.log_ratios is not None and len(a.log_ratios) == len(b.log_ratios) \
            and a.log_ratios:
        r = ratio_from_logs([x - y for x, y in zip(a.log_ratios, b.log_ratios, strict=True)])
        return _widened(r, _extra_halfwidth(a, b))
    if b.off and a.log_ratios:
        return _widened(ratio_from_logs(a.log_ratios), _extra_halfwidth(a, b))
    if a.off and b.log_ratios:
        return _widened(ratio_from_logs([-x for x in b.log_ratios]), _extra_halfwidth(a, b))
    if a.has_interval and b.has_interval:
        # each interval holds its start term: take it out of both and add the comparison's once
        sa, sb = a.without_start(), b.without_start()
        r = unpaired_ratio(Estimate(sa.value, min(sa.lower, sa.value), max(sa.upper, sa.value), sa.basis),
                           Estimate(sb.value, min(sb.lower, sb.value), max(sb.upper, sb.value), sb.basis))
        return _widened(r, _start_term(a, b))
    return None


def decide(candidates: Sequence[Candidate], tolerance: float = TOLERANCE) -> Pick:
    """THE decision rule of specwatch (docs/choosing-k.md), used by ``specwatch advise``,
    ``specwatch report``, the demo, ``specwatch top`` and the exporter:

    1. physics first: a speculative candidate whose drafts were never accepted (or that proposed
       none) cannot pay; it is excluded, whatever its ratio's noise says;
    2. off (k = 0, exactly 1) is always a candidate (added when missing);
    3. the pick is the candidate with the best estimate; candidates within ``tolerance``
       (relative, 2 %) of the best estimate tie and the smallest k wins (off is the smallest;
       a fixed k before a table of the same largest k);
    4. its confidence: the verdict against the baseline, and pick / runner-up (the best other
       candidate) with its interval (paired where both have per-batch ratios). Where that
       interval does not separate them the pick stays the better estimate and says so
       (:attr:`Pick.more_batches`); uncertainty never turns into a smaller k or into off.

    Raises ValueError for a tolerance outside [0, 1) or two candidates with the same name."""
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise ValueError(f"candidates must have distinct names, got {names!r}")
    cands = list(candidates)
    if not any(c.off for c in cands):
        cands.append(Candidate.speculation_off())
    excluded = tuple((c.name, NEVER_ACCEPTED) for c in cands if c.never_accepted and not c.off)
    live = [c for c in cands if not (c.never_accepted and not c.off)]
    best = max(live, key=lambda c: (c.value, [-x for x in _order(c)[:2]]))
    within = [c for c in live if c.value >= best.value * (1.0 - tolerance)]
    pick = min(within, key=_order)
    others = sorted((c for c in live if c is not pick), key=lambda c: (-c.value, _order(c)))
    runner = others[0] if others else None
    vs = None if runner is None else _versus(pick, runner)
    more = None
    start_limited = False
    if runner is None:
        separated = True
    elif vs is None:
        separated = False
    else:
        separated = vs.has_interval and vs.lower > 1.0
        extra = _extra_halfwidth(pick, runner)
        if not separated and vs.paired and extra < abs(math.log(vs.value)):
            more = vs.more_batches(extra=extra)  # batches cannot remove a model error or a start offset
        start_limited = (not separated and _start_term(pick, runner) > 0.0 and extra >= abs(math.log(vs.value)))
    if pick.off:
        spec = [c for c in cands if not c.off]
        if spec and all(c.verdict == LOSES for c in spec):
            v = LOSES
        elif not spec:
            v = CANNOT_TELL
        else:
            v = LOSES if all(c.verdict == LOSES for c in spec) else CANNOT_TELL
    else:
        v = pick.verdict
    return Pick(pick, v, runner, vs, separated, more, pick is not best, best, excluded, tuple(cands), tolerance,
                start_limited)


def format_ratio(x: float | None, *, against: float = 1.0) -> str:
    """A ratio at two decimals, with more where two decimals would round it onto ``against``
    (1: the verdict's threshold) from the side it is on: 0.9989 → ``0.999``, 1.0004 →
    ``1.0004``, 1.2345 → ``1.23``; a positive ratio never prints as zero (0.0007 → ``0.0007``,
    1.6e-07 → ``1.6e-07``); ``–`` for None. The precision that decided a verdict is the one printed."""
    if x is None:
        return "–"
    for d in range(2, 7):
        s = f"{x:.{d}f}"
        if float(s) == 0.0 and x != 0.0:
            return f"{x:.2g}"
        if x == against or float(s) != against:
            return s
    return f"{x:.6g}"


def format_interval(lower: float | None, upper: float | None) -> str:
    """``[0.98–1.35]`` with :func:`format_ratio`'s precision; ``(1 batch: no interval)`` without."""
    if lower is None or upper is None:
        return "(1 batch: no interval)"
    return f"[{format_ratio(lower)}–{format_ratio(upper)}]"


def confidence_text(p: Pick) -> str:
    """The one-line confidence of a :class:`Pick` (every surface prints this text)."""
    if p.runner_up is None and p.excluded:  # physics left nothing to compare with (off, or the one left)
        names = sorted((n for n, _ in p.excluded), key=lambda n: (len(n), n))
        return f"{', '.join(names)} excluded: {p.excluded[0][1]}"
    if p.runner_up is None:
        return "the only candidate"
    r = p.runner_up.name
    vs = p.versus_runner_up
    if vs is None:
        return f"{r} close: no interval to tell them apart (1 batch)"
    label = "" if vs.paired else ", unpaired"
    iv = format_interval(vs.lower, vs.upper) if vs.has_interval else "(1 batch: no interval)"
    if p.separated:
        return f"ahead of {r} by {format_ratio(vs.value)}× {iv}{label}"
    more = ("" if p.more_batches is None
            else f"; about {p.more_batches} more paired batch{'es' if p.more_batches > 1 else ''} at this spread"
            if p.more_batches > 0 else "")
    if p.start_limited:
        more = "; the server-start spread is as large as the gap: more batches cannot separate them"
    tie = f" (within {p.tolerance * 100:g} %: the smaller k wins)" if p.tie else ""
    return f"{r} within {iv}{label}: cannot tell them apart{tie}{more}"


def disagreement(measured: Estimate | None, calibrated: Estimate | None) -> str | None:
    """Where two bases give different verdicts for one configuration, the line that says so and
    which rules (measured: both servers live), with bounds at the precision that decided them;
    None when they agree or one is missing."""
    if measured is None or calibrated is None or measured.verdict == calibrated.verdict:
        return None
    return (f"measured {measured.verdict.replace('_', ' ')} {format_interval(measured.lower, measured.upper)}, "
            f"calibrated {calibrated.verdict.replace('_', ' ')} {format_interval(calibrated.lower, calibrated.upper)}: "
            "measured rules (both servers live)")


__all__ = ["BASES", "CANNOT_TELL", "Candidate", "Estimate", "LOSES", "NO_START_SPREAD", "OFF", "PAYS", "Pick",
           "PairedRatio", "StartSpread", "TOLERANCE", "VERDICTS", "Z95", "combine_log_halfwidths", "confidence_text",
           "decide", "disagreement", "format_interval", "format_ratio", "paired_ratio", "ratio_from_logs", "t975",
           "unpaired_ratio", "verdict"]
