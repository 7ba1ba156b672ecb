"""vLLM's speculative-decoding formulas, applied to counter differences.

Over an interval with Δ = increase of each counter (the same formulas as the recording rules:
``docs/metrics.md``, "The formulas in one place"):

- draft acceptance rate            = Δaccepted / Δdraft_tokens
- mean acceptance length           = 1 + Δaccepted / Δdrafts   (tokens per verify step, bonus included)
- per-position acceptance rate r_i = Δper_pos[i] / Δdrafts      (P(positions 0..i all accepted))
- conditional acceptance at i      = r_i / r_(i-1), with r_(-1) = 1
- expected acceptance length E(k') = 1 + Σ_(i<k') r_i             (what-if for every k' ≤ k)
- draft tokens per draft            = Δdraft_tokens / Δdrafts     (effective k)
- output from drafts               = Δaccepted / Δgeneration_tokens

A value whose denominator is zero (or unknown) is ``None``: never NaN, never a made-up 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from specwatch.specdecode.metrics import SpecDecodeCounters


def _fields(c: SpecDecodeCounters) -> list[float | None]:
    return [c.drafts, c.draft_tokens, c.accepted_tokens, c.generation_tokens, *c.accepted_per_position]


def is_reset(before: SpecDecodeCounters, after: SpecDecodeCounters) -> bool:
    """True when any counter of ``after`` is below ``before`` or k changed: the server restarted.

    Prometheus treats any decrease of a counter as a reset; here the counters of one
    (model_name, engine) are taken together so the derived ratios stay consistent.
    """
    if len(before.accepted_per_position) != len(after.accepted_per_position):
        return True
    return any(
        a is not None and b is not None and a < b for a, b in zip(_fields(after), _fields(before), strict=True)
    )


def counters_delta(before: SpecDecodeCounters, after: SpecDecodeCounters) -> SpecDecodeCounters:
    """Increase of each counter from ``before`` to ``after`` (same model_name and engine).

    When the server restarted in between (:func:`is_reset`), the increase is ``after`` itself,
    as Prometheus' ``increase()`` assumes. A field unknown on either side is ``None``.
    """
    if is_reset(before, after):
        return after

    def sub(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a - b

    return SpecDecodeCounters(
        model_name=after.model_name,
        engine=after.engine,
        drafts=sub(after.drafts, before.drafts),
        draft_tokens=after.draft_tokens - before.draft_tokens,
        accepted_tokens=after.accepted_tokens - before.accepted_tokens,
        accepted_per_position=tuple(
            a - b for a, b in zip(after.accepted_per_position, before.accepted_per_position, strict=True)
        ),
        generation_tokens=sub(after.generation_tokens, before.generation_tokens),
    )


def add_counters(a: SpecDecodeCounters, b: SpecDecodeCounters) -> SpecDecodeCounters:
    """Field-wise sum of two counter sets (labels of ``a``). Per-position lists of different
    lengths are summed position by position (the shorter one counts 0 beyond its k)."""

    def plus(x: float | None, y: float | None) -> float | None:
        return None if x is None or y is None else x + y

    n = max(len(a.accepted_per_position), len(b.accepted_per_position))
    pa = a.accepted_per_position + (0.0,) * (n - len(a.accepted_per_position))
    pb = b.accepted_per_position + (0.0,) * (n - len(b.accepted_per_position))
    return SpecDecodeCounters(
        model_name=a.model_name,
        engine=a.engine,
        drafts=plus(a.drafts, b.drafts),
        draft_tokens=a.draft_tokens + b.draft_tokens,
        accepted_tokens=a.accepted_tokens + b.accepted_tokens,
        accepted_per_position=tuple(x + y for x, y in zip(pa, pb, strict=True)),
        generation_tokens=plus(a.generation_tokens, b.generation_tokens),
    )


def sum_counters(items: Iterable[SpecDecodeCounters], model_name: str | None = None) -> SpecDecodeCounters | None:
    """Sum counters over engines (as ``vllm bench serve`` does), optionally of one model only.

    Returns ``None`` when nothing matches. The result's ``engine`` is ``""``.
    """
    total: SpecDecodeCounters | None = None
    for c in items:
        if model_name is not None and c.model_name != model_name:
            continue
        total = c if total is None else add_counters(total, c)
    if total is None:
        return None
    return SpecDecodeCounters(
        model_name=model_name if model_name is not None else total.model_name,
        engine="",
        drafts=total.drafts,
        draft_tokens=total.draft_tokens,
        accepted_tokens=total.accepted_tokens,
        accepted_per_position=total.accepted_per_position,
        generation_tokens=total.generation_tokens,
    )


@dataclass(frozen=True)
class DerivedValues:
    """vLLM's derived speculative-decoding values over one interval (module docstring formulas).

    Rates are 0–1 ratios; lengths are tokens per verify step. Tuples are indexed by position
    (0 … k-1) or, for ``expected_acceptance_lengths``, by k-1 (k = 1 … K). ``None`` (or an
    empty tuple) where the denominator is zero or unknown.
    """

    draft_acceptance_rate: float | None
    mean_acceptance_length: float | None
    position_acceptance_rates: tuple[float, ...]
    position_conditional_acceptance_rates: tuple[float | None, ...]
    expected_acceptance_lengths: tuple[float, ...]
    draft_tokens_per_draft: float | None
    output_from_drafts_ratio: float | None


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def position_rates(c: SpecDecodeCounters) -> tuple[float, ...]:
    """Unconditional per-position acceptance rates r_i = per_pos[i] / drafts; () if unknown."""
    if not c.drafts or c.drafts <= 0:
        return ()
    return tuple(p / c.drafts for p in c.accepted_per_position)


def conditional_rates(rates: tuple[float, ...]) -> tuple[float | None, ...]:
    """Conditional acceptance r_i / r_(i-1) (r_(-1) = 1); None where r_(i-1) is 0."""
    out: list[float | None] = []
    prev = 1.0
    for r in rates:
        out.append(r / prev if prev > 0 else None)
        prev = r
    return tuple(out)


def expected_lengths(rates: tuple[float, ...]) -> tuple[float, ...]:
    """What-if curve E(k') = 1 + Σ_(i<k') r_i for k' = 1 … len(rates) (exact for chain drafters)."""
    out, acc = [], 1.0
    for r in rates:
        acc += r
        out.append(acc)
    return tuple(out)


def derive(c: SpecDecodeCounters) -> DerivedValues:
    """Apply vLLM's formulas to ``c`` (usually a :func:`counters_delta`; lifetime counters also work).

    Never raises on zero denominators: the affected values are ``None``.
    """
    rates = position_rates(c)
    mean_len = _ratio(c.accepted_tokens, c.drafts)
    return DerivedValues(
        draft_acceptance_rate=_ratio(c.accepted_tokens, c.draft_tokens),
        mean_acceptance_length=None if mean_len is None else 1.0 + mean_len,
        position_acceptance_rates=rates,
        position_conditional_acceptance_rates=conditional_rates(rates),
        expected_acceptance_lengths=expected_lengths(rates),
        draft_tokens_per_draft=_ratio(c.draft_tokens, c.drafts),
        output_from_drafts_ratio=_ratio(c.accepted_tokens, c.generation_tokens),
    )


#: Invariant names as exposed in ``specwatch_invariant_violations_total{invariant}``.
INVARIANTS = (
    "per_position_sum_equals_accepted",
    "per_position_non_increasing",
    "first_position_at_most_drafts",
    "accepted_at_most_draft_tokens",
    "draft_tokens_at_most_drafts_times_k",
)


def check_invariants(c: SpecDecodeCounters, k: int | None = None) -> list[str]:
    """vLLM's invariants on one engine's lifetime counters; returns the names of those violated.

    Σ per_pos == accepted; per_pos non-increasing; per_pos[0] ≤ drafts; accepted ≤ draft_tokens ≤
    drafts × k (k defaults to the number of positions). Values in the text format may be printed
    with 7 significant digits (``6.491797e+06``), so comparisons allow a relative error of 1e-6.
    """

    def le(a: float, b: float) -> bool:
        return a <= b + 1e-6 * max(abs(a), abs(b), 1.0)

    bad = []
    pp = c.accepted_per_position
    k = k or len(pp) or None
    if pp:
        if not (le(sum(pp), c.accepted_tokens) and le(c.accepted_tokens, sum(pp))):
            bad.append("per_position_sum_equals_accepted")
        if any(not le(b, a) for a, b in zip(pp, pp[1:], strict=False)):
            bad.append("per_position_non_increasing")
        if c.drafts is not None and not le(pp[0], c.drafts):
            bad.append("first_position_at_most_drafts")
    if not le(c.accepted_tokens, c.draft_tokens):
        bad.append("accepted_at_most_draft_tokens")
    if c.drafts is not None and k and not le(c.draft_tokens, c.drafts * k):
        bad.append("draft_tokens_at_most_drafts_times_k")
    return bad
