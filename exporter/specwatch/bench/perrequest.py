"""Exact acceptance curves from vLLM's per-request speculative-decoding metrics.

Source: a vLLM server started with ``--per-request-spec-decode-metrics detailed`` (vLLM 0.32+,
``vllm/v1/metrics/stats.py`` ``RequestSpecDecodeMetrics``) adds to the final usage chunk of a
streamed response (``stream_options.include_usage``), for requests with n = 1, the object
``metrics.speculative_decoding``::

    {"mean_acceptance_length", "draft_acceptance_rate", "acceptance_histogram": [steps accepting j],
     "num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_tokens",
     "per_step_accepted": [a_t], "per_step_drafted": [d_t]}

One entry per verify step t that carried draft tokens (the same steps vLLM's
``…num_drafts_total`` counts): d_t tokens drafted, the first a_t of them accepted (a_t ≤ d_t).
``summary`` omits the two arrays; without the flag the object is absent.

Unlike the counters, the arrays say which positions were drafted, so the curve is exact even when
drafts vary in length (dynamic ``num_speculative_tokens_per_batch_size``, short ngram matches,
drafts clipped at the end of an output). Over the steps of a cell, for position j (0-based):

- drafted steps D_j = #{t : d_t > j};
- conditional acceptance c_j = #{t : a_t > j} / #{t : a_t ≥ j and d_t > j} — position j accepted,
  given positions 0..j-1 were accepted *and* position j was drafted (None when no such step);
- per-position acceptance r_j = c_0 × … × c_j — P(positions 0..j accepted) for a drafter that
  always drafts j+1 tokens (the product-limit estimate over censored steps; equal to the counters'
  Δper_pos[j] / Δdrafts when every draft is full);
- expected acceptance length E(k′) = 1 + Σ_(j<k′) r_j (tokens per verify step, bonus included).

Per request: draft acceptance Σa / Σd; the cell's p5 / p50 / p95 and a 10-bin histogram of it; the
draft-length distribution (steps per d); outliers (see :func:`outliers`).

Bad input is counted per cell by reason and never averaged in (:data:`PROBLEMS`).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

#: Reasons a request contributes nothing to the exact curve, as counted per cell.
PROBLEMS = {
    "missing": "successful request without metrics.speculative_decoding (server without per-request metrics)",
    "summary_only": "payload without per_step_accepted / per_step_drafted (server at --per-request-spec-decode-metrics summary)",
    "truncated": "request failed or its stream ended before [DONE] (no complete payload)",
    "unequal_lengths": "per_step_accepted and per_step_drafted of different lengths",
    "accepted_gt_drafted": "a step accepted more tokens than it drafted",
    "inconsistent": "arrays disagree with the payload's totals, or values negative / not integers / above num_spec_tokens",
    "n_gt_1": "request with n > 1 (vLLM reports per-request metrics for n = 1 only)",
}

#: Low outlier: request acceptance below LOW_FRACTION × the cell median (and the median ≥ 0.2).
LOW_FRACTION = 0.5
#: Loop outlier: acceptance ≥ LOOP_ACCEPTANCE over ≥ LOOP_MIN_STEPS verify steps, in a cell whose
#: median acceptance is ≤ LOOP_MEDIAN_MAX (where everything is at the ceiling, as in copying, the
#: ceiling is the norm).
LOOP_ACCEPTANCE = 0.98
LOOP_MIN_STEPS = 24
LOOP_MEDIAN_MAX = 0.9
#: Outliers listed per cell (the count is exact).
MAX_OUTLIERS = 10
EXCERPT_CHARS = 80


@dataclass(frozen=True)
class RequestSpecDecode:
    """One request's verify steps: ``accepted[t]`` of ``drafted[t]`` draft tokens, ``k`` =
    ``num_spec_tokens`` (the server's maximum k)."""

    index: int
    accepted: tuple[int, ...]
    drafted: tuple[int, ...]
    k: int
    output_tokens: int = 0
    prompt_excerpt: str = ""

    @property
    def acceptance(self) -> float | None:
        """Draft acceptance of the request, Σa / Σd (0–1); None without draft tokens."""
        d = sum(self.drafted)
        return sum(self.accepted) / d if d else None


def _int_list(v: Any) -> list[int] | None:
    if not isinstance(v, list):
        return None
    out = []
    for x in v:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or x != int(x) or x < 0:
            return None
        out.append(int(x))
    return out


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """One-line prompt excerpt of at most ``limit`` characters."""
    t = " ".join(str(text).split())
    return t if len(t) <= limit else t[: limit - 1] + "…"


def parse_payload(payload: Any, *, index: int, success: bool = True, n: int = 1, output_tokens: int = 0,
                  prompt_excerpt: str = "") -> RequestSpecDecode | str:
    """Validate one request's ``metrics.speculative_decoding`` object (None when absent).

    Returns a :class:`RequestSpecDecode`, or the problem (a key of :data:`PROBLEMS`). Never raises.
    """
    if n > 1:
        return "n_gt_1"
    if not success:
        return "truncated"
    if payload is None:
        return "missing"
    if not isinstance(payload, Mapping):
        return "inconsistent"
    if "per_step_accepted" not in payload and "per_step_drafted" not in payload:
        return "summary_only"
    acc, dra = _int_list(payload.get("per_step_accepted")), _int_list(payload.get("per_step_drafted"))
    if acc is None or dra is None:
        return "inconsistent"
    if len(acc) != len(dra):
        return "unequal_lengths"
    if any(a > d for a, d in zip(acc, dra)):
        return "accepted_gt_drafted"
    k = payload.get("num_spec_tokens")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1 or any(d > k for d in dra):
        return "inconsistent"
    for key, want in (("num_spec_steps", len(acc)), ("num_accepted_draft_tokens", sum(acc)),
                      ("num_draft_tokens", sum(dra))):
        if key in payload and payload[key] != want:
            return "inconsistent"
    return RequestSpecDecode(index=index, accepted=tuple(acc), drafted=tuple(dra), k=k,
                             output_tokens=int(output_tokens), prompt_excerpt=excerpt(prompt_excerpt))


def exact_curve(reqs: Sequence[RequestSpecDecode]) -> dict[str, Any]:
    """Per-position values over all verify steps of ``reqs`` (module doc): ``num_spec_tokens``,
    ``drafted_steps_per_position`` D_j, ``conditional_per_position_acceptance_rates`` c_j (None
    where undefined), ``per_position_acceptance_rates`` r_j, ``expected_acceptance_lengths``
    {k′: E(k′)} (up to the last position with a defined c_j)."""
    k = max((r.k for r in reqs), default=0)
    drafted = [0] * k
    reached = [0] * k  # steps with a >= j and d > j
    passed = [0] * k   # steps with a > j
    for r in reqs:
        for a, d in zip(r.accepted, r.drafted):
            for j in range(min(d, k)):
                drafted[j] += 1
                if a >= j:
                    reached[j] += 1
                if a > j:
                    passed[j] += 1
    cond: list[float | None] = [passed[j] / reached[j] if reached[j] else None for j in range(k)]
    rates: list[float] = []
    prod = 1.0
    for c in cond:
        if c is None:
            break
        prod *= c
        rates.append(prod)
    exp, acc = {}, 1.0
    for i, r in enumerate(rates, start=1):
        acc += r
        exp[str(i)] = acc
    return {"num_spec_tokens": k, "drafted_steps_per_position": drafted,
            "conditional_per_position_acceptance_rates": cond, "per_position_acceptance_rates": rates,
            "expected_acceptance_lengths": exp}


def _pct(sorted_vals: Sequence[float], p: float) -> float:
    pos = (len(sorted_vals) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def outliers(reqs: Sequence[RequestSpecDecode]) -> list[dict[str, Any]]:
    """Requests far from the cell's norm, by request index:

    - ``low``: acceptance < 0.5 × the cell median (median ≥ 0.2) — garbled or off-distribution output;
    - ``loop``: acceptance ≥ 0.98 over ≥ 24 verify steps while the cell median is ≤ 0.9 — the output
      most likely repeats itself.
    """
    accs = sorted(a for a in (r.acceptance for r in reqs) if a is not None)
    if len(accs) < 3:
        return []
    med = statistics.median(accs)
    out = []
    for r in reqs:
        a = r.acceptance
        if a is None:
            continue
        kind = None
        if med >= 0.2 and a < LOW_FRACTION * med:
            kind = "low"
        elif med <= LOOP_MEDIAN_MAX and a >= LOOP_ACCEPTANCE and len(r.drafted) >= LOOP_MIN_STEPS:
            kind = "loop"
        if kind:
            out.append({"index": r.index, "kind": kind, "acceptance": a, "cell_median_acceptance": med,
                        "verify_steps": len(r.drafted), "output_tokens": r.output_tokens,
                        "prompt_excerpt": r.prompt_excerpt})
    return out


def summarize(reqs: Sequence[RequestSpecDecode], problems: Mapping[str, int]) -> dict[str, Any]:
    """The cell's ``spec_decode_per_request`` record: the exact curve (:func:`exact_curve`),
    totals, the per-request acceptance distribution (p5/p50/p95, mean, 10 bins over 0–1), the
    draft-length distribution {d: steps}, :func:`outliers` (at most MAX_OUTLIERS listed,
    ``num_outliers`` exact) and ``problems`` {reason: requests}. ``status``: ``measured`` (every
    request usable), ``partial``, or ``not_offered`` (no request carried a per-step payload)."""
    probs = {k: int(v) for k, v in problems.items() if v}
    total_steps = sum(len(r.drafted) for r in reqs)
    if not reqs or total_steps == 0:
        status = "not_offered" if not reqs else "no_drafts"
        return {"status": status, "requests": len(reqs), "problems": probs,
                "source": "vLLM per-request metrics (metrics.speculative_decoding, --per-request-spec-decode-metrics detailed)"}
    acc = sum(sum(r.accepted) for r in reqs)
    dra = sum(sum(r.drafted) for r in reqs)
    accs = sorted(a for a in (r.acceptance for r in reqs) if a is not None)
    hist = [0] * 10
    for a in accs:
        hist[min(9, int(a * 10))] += 1
    lengths = Counter(d for r in reqs for d in r.drafted)
    outs = outliers(reqs)
    rec: dict[str, Any] = {
        "status": "partial" if probs else "measured",
        "source": "vLLM per-request metrics (metrics.speculative_decoding, --per-request-spec-decode-metrics detailed)",
        "requests": len(reqs),
        "problems": probs,
        "verify_steps": total_steps,
        "draft_tokens": dra,
        "accepted_tokens": acc,
        "draft_acceptance_rate": acc / dra if dra else None,
        "mean_acceptance_length": 1.0 + acc / total_steps,
        **exact_curve(reqs),
        "draft_length_histogram": {str(d): lengths[d] for d in sorted(lengths)},
        "request_acceptance": {
            "p5": _pct(accs, 5), "p50": _pct(accs, 50), "p95": _pct(accs, 95), "mean": statistics.fmean(accs),
            "histogram_bins": [round(i / 10, 1) for i in range(11)], "histogram": hist,
        } if accs else None,
        "num_outliers": len(outs),
        "outliers": outs[:MAX_OUTLIERS],
    }
    return rec


def collect(items: Iterable[tuple[Any, dict[str, Any]]]) -> tuple[list[RequestSpecDecode], Counter]:
    """Parse ``(payload, context)`` pairs (context: keyword arguments of :func:`parse_payload`) into
    usable requests and a Counter of problems."""
    good: list[RequestSpecDecode] = []
    bad: Counter = Counter()
    for payload, ctx in items:
        r = parse_payload(payload, **ctx)
        if isinstance(r, str):
            bad[r] += 1
        else:
            good.append(r)
    return good, bad


__all__ = ["PROBLEMS", "RequestSpecDecode", "collect", "exact_curve", "excerpt", "outliers", "parse_payload",
           "summarize"]
