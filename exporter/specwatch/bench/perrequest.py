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

vLLM omits the two arrays when the request had no verify step (``to_dict`` adds them only when
populated: ngram finding no match, a one-token output); such a payload with ``num_spec_steps`` = 0
and zero draft and accepted tokens is a valid request with zero steps, not ``summary_only``.

Bad input is counted per cell by reason and never averaged in (:data:`PROBLEMS`);
:func:`parse_payload` never raises (NaN, infinities, booleans, strings or values above
:data:`MAX_NUM_SPEC_TOKENS` in the arrays or totals make a request ``inconsistent``).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from specwatch.bench.records import PerRequest, format_problems
from specwatch.specdecode.derive import expected_lengths

#: Reasons a request contributes nothing to the exact curve, as counted per cell.
PROBLEMS = {
    "missing": "successful request without metrics.speculative_decoding (server without per-request metrics)",
    "summary_only": "payload without per_step_accepted / per_step_drafted (server at --per-request-spec-decode-metrics summary)",
    "truncated": "request failed or its stream ended before [DONE] (no complete payload)",
    "unequal_lengths": "per_step_accepted and per_step_drafted of different lengths",
    "accepted_gt_drafted": "a step accepted more tokens than it drafted",
    "inconsistent": ("arrays disagree with the payload's totals, values negative / not integers / not finite / above "
                     "num_spec_tokens, num_spec_tokens above MAX_NUM_SPEC_TOKENS, or a payload that is not a JSON object"),
    "n_gt_1": "response with more than one choice (n > 1; vLLM reports per-request metrics for n = 1 only)",
}

#: Largest ``num_spec_tokens`` accepted (draft positions). vLLM's methods run k ≤ a few dozen (EAGLE
#: and draft models single digits, ngram and suffix decoding tens); a payload claiming more is
#: ``inconsistent``. Per-position arrays are sized by the longest draft of the cell (≤ this cap),
#: never by ``num_spec_tokens`` alone.
MAX_NUM_SPEC_TOKENS = 128

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
    #: The batch the request ran in (request indexes restart at 0 in every batch).
    batch_index: int | None = None

    @property
    def acceptance(self) -> float | None:
        """Draft acceptance of the request, Σa / Σd (0–1); None without draft tokens."""
        d = sum(self.drafted)
        return sum(self.accepted) / d if d else None


def _count(x: Any, limit: int) -> int | None:
    """``x`` as a count 0 … ``limit``: an int, or a float holding a whole number (JSON may print
    either); None for booleans, strings, NaN, ±Infinity, fractions, negatives and values above
    ``limit``. Never raises."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x if 0 <= x <= limit else None
    if isinstance(x, float) and math.isfinite(x) and x.is_integer() and 0 <= x <= limit:
        return int(x)
    return None


def _int_list(v: Any, limit: int) -> list[int] | None:
    if not isinstance(v, list):
        return None
    out = []
    for x in v:
        c = _count(x, limit)
        if c is None:
            return None
        out.append(c)
    return out


#: Bound of a payload's totals (tokens, steps): far above any real request, below what would make
#: arithmetic on them costly.
_MAX_TOTAL = 10**12


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """One-line prompt excerpt of at most ``limit`` characters."""
    t = " ".join(str(text).split())
    return t if len(t) <= limit else t[: limit - 1] + "…"


def parse_payload(payload: Any, *, index: int, success: bool = True, n: int = 1, output_tokens: int = 0,
                  prompt_excerpt: str = "", batch_index: int | None = None) -> RequestSpecDecode | str:
    """Validate one request's ``metrics.speculative_decoding`` object (None when absent).

    ``n``: the number of choices the response carried (> 1: ``n_gt_1``); ``success``: the request
    completed (False: ``truncated``). Returns a :class:`RequestSpecDecode` (zero steps when vLLM
    omitted the arrays of a request that had no verify step), or the problem (a key of
    :data:`PROBLEMS`). Never raises: values that are not counts (NaN, Infinity, booleans, strings,
    fractions, negatives), ``num_spec_tokens`` outside 1 … :data:`MAX_NUM_SPEC_TOKENS` or a draft
    longer than it give ``inconsistent``.
    """
    try:
        return _parse(payload, index=index, success=success, n=n, output_tokens=output_tokens,
                      prompt_excerpt=prompt_excerpt, batch_index=batch_index)
    except (TypeError, ValueError, OverflowError, RecursionError):  # defensive: _parse checks every type first
        return "inconsistent"


def _parse(payload: Any, *, index: int, success: bool, n: Any, output_tokens: Any, prompt_excerpt: Any,
           batch_index: Any) -> RequestSpecDecode | str:
    if isinstance(n, int) and n > 1:
        return "n_gt_1"
    if not success:
        return "truncated"
    if payload is None:
        return "missing"
    if not isinstance(payload, Mapping):
        return "inconsistent"
    k = _count(payload.get("num_spec_tokens"), MAX_NUM_SPEC_TOKENS)
    if k is None or k < 1:
        return "inconsistent"
    totals = {}
    for key in ("num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens"):
        if key in payload:
            totals[key] = _count(payload[key], _MAX_TOTAL)
            if totals[key] is None:
                return "inconsistent"
    has_acc, has_dra = "per_step_accepted" in payload, "per_step_drafted" in payload
    if not has_acc and not has_dra:
        # vLLM adds the arrays only when populated: zero verify steps (and zero tokens) is a valid
        # request without steps; any step without the arrays means the server runs at "summary"
        if totals.get("num_spec_steps") != 0:
            return "summary_only"
        if totals.get("num_accepted_draft_tokens") or totals.get("num_draft_tokens"):
            return "inconsistent"  # tokens without a step
        acc, dra = [], []
    else:
        acc = _int_list(payload.get("per_step_accepted"), MAX_NUM_SPEC_TOKENS)
        dra = _int_list(payload.get("per_step_drafted"), MAX_NUM_SPEC_TOKENS)
        if acc is None or dra is None:
            return "inconsistent"
    if len(acc) != len(dra):
        return "unequal_lengths"
    if any(a > d for a, d in zip(acc, dra, strict=True)):
        return "accepted_gt_drafted"
    if any(d > k for d in dra):
        return "inconsistent"
    for key, want in (("num_spec_steps", len(acc)), ("num_accepted_draft_tokens", sum(acc)),
                      ("num_draft_tokens", sum(dra))):
        if key in totals and totals[key] != want:
            return "inconsistent"
    out_tok = _count(output_tokens, _MAX_TOTAL) or 0
    bi = batch_index if isinstance(batch_index, int) and not isinstance(batch_index, bool) else None
    return RequestSpecDecode(index=index, accepted=tuple(acc), drafted=tuple(dra), k=k,
                             output_tokens=out_tok, prompt_excerpt=excerpt(prompt_excerpt), batch_index=bi)


def exact_curve(reqs: Sequence[RequestSpecDecode]) -> dict[str, Any]:
    """Per-position values over all verify steps of ``reqs`` (module doc): ``num_spec_tokens``
    (the largest of the requests, ≤ :data:`MAX_NUM_SPEC_TOKENS`), ``max_draft_length`` (the longest
    draft, max d_t), ``drafted_steps_per_position`` D_j, ``conditional_per_position_acceptance_rates``
    c_j (None where undefined), ``per_position_acceptance_rates`` r_j, ``expected_acceptance_lengths``
    {k′: E(k′)} (up to the last position with a defined c_j). The per-position lists have
    ``max_draft_length`` entries: a position no step drafted has no value to show."""
    k = max((d for r in reqs for d in r.drafted), default=0)
    drafted = [0] * k
    reached = [0] * k  # steps with a >= j and d > j
    passed = [0] * k   # steps with a > j
    for r in reqs:
        for a, d in zip(r.accepted, r.drafted, strict=True):
            for j in range(d):
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
    exp = {str(i): e for i, e in enumerate(expected_lengths(tuple(rates)), start=1)}
    return {"num_spec_tokens": max((r.k for r in reqs), default=0), "max_draft_length": k,
            "drafted_steps_per_position": drafted,
            "conditional_per_position_acceptance_rates": cond, "per_position_acceptance_rates": rates,
            "expected_acceptance_lengths": exp}


def _pct(sorted_vals: Sequence[float], p: float) -> float:
    pos = (len(sorted_vals) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def outliers(reqs: Sequence[RequestSpecDecode]) -> list[dict[str, Any]]:
    """Requests far from the cell's norm, by batch and request index (``batch_index``, ``index``):

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
            out.append({"batch_index": r.batch_index, "index": r.index, "kind": kind, "acceptance": a, "cell_median_acceptance": med,
                        "verify_steps": len(r.drafted), "output_tokens": r.output_tokens,
                        "prompt_excerpt": r.prompt_excerpt})
    return out


def cell_status(n_usable: int, problems: Mapping[str, int], verify_steps: int) -> str:
    """The status of a batch's or cell's per-request record, from its usable requests and problems:

    - ``not_offered``: no usable request and every request ``missing`` (a server without
      ``--per-request-spec-decode-metrics``);
    - ``unusable``: no usable request for other reasons (truncated, summary_only, inconsistent…:
      ``problems`` says which), or no request at all;
    - ``no_drafts``: usable requests, but none had a verify step;
    - ``measured``: every request usable; ``partial``: some requests counted in ``problems``.
    """
    probs = {k: v for k, v in problems.items() if v}
    if n_usable == 0:
        return "not_offered" if probs and set(probs) == {"missing"} else "unusable"
    if verify_steps == 0:
        return "no_drafts"
    return "partial" if probs else "measured"


#: Where a cell's exact curve comes from (the ``source`` of its summary).
SOURCE = "vLLM per-request metrics (metrics.speculative_decoding, --per-request-spec-decode-metrics detailed)"


def summarize(reqs: Sequence[RequestSpecDecode], problems: Mapping[str, int]) -> PerRequest:
    """The cell's ``spec_decode_per_request`` record (:class:`specwatch.bench.records.PerRequest`):
    the exact curve (:func:`exact_curve`), totals, the per-request acceptance distribution
    (p5/p50/p95, mean, 10 bins over 0–1; requests with draft tokens only), the draft-length
    distribution {d: steps}, :func:`outliers` (at most MAX_OUTLIERS listed, ``num_outliers``
    exact), ``problems`` {reason: requests} and ``requests_without_verify_steps``. ``status``:
    :func:`cell_status`; a status without a curve keeps only
    :data:`specwatch.bench.records.PerRequest.UNMEASURED_KEYS`."""
    probs = {k: int(v) for k, v in problems.items() if v}
    total_steps = sum(len(r.drafted) for r in reqs)
    status = cell_status(len(reqs), probs, total_steps)
    no_steps = sum(1 for r in reqs if not r.drafted)
    if status in ("not_offered", "unusable", "no_drafts"):
        return PerRequest(status=status, requests=len(reqs), requests_without_verify_steps=no_steps, problems=probs,
                          source=SOURCE, keys=PerRequest.UNMEASURED_KEYS)
    acc = sum(sum(r.accepted) for r in reqs)
    dra = sum(sum(r.drafted) for r in reqs)
    accs = sorted(a for a in (r.acceptance for r in reqs) if a is not None)
    hist = [0] * 10
    for a in accs:
        hist[min(9, int(a * 10))] += 1
    lengths = Counter(d for r in reqs for d in r.drafted)
    outs = outliers(reqs)
    curve = exact_curve(reqs)
    return PerRequest(
        status=status,
        source=SOURCE,
        requests=len(reqs),
        requests_without_verify_steps=no_steps,
        problems=probs,
        verify_steps=total_steps,
        draft_tokens=dra,
        accepted_tokens=acc,
        draft_acceptance_rate=acc / dra if dra else None,
        mean_acceptance_length=1.0 + acc / total_steps,
        num_spec_tokens=curve["num_spec_tokens"],
        max_draft_length=curve["max_draft_length"],
        drafted_steps_per_position=tuple(curve["drafted_steps_per_position"]),
        conditional_per_position_acceptance_rates=tuple(curve["conditional_per_position_acceptance_rates"]),
        per_position_acceptance_rates=tuple(curve["per_position_acceptance_rates"]),
        expected_acceptance_lengths=curve["expected_acceptance_lengths"],
        draft_length_histogram={str(d): lengths[d] for d in sorted(lengths)},
        request_acceptance={
            "p5": _pct(accs, 5), "p50": _pct(accs, 50), "p95": _pct(accs, 95), "mean": statistics.fmean(accs),
            "histogram_bins": [round(i / 10, 1) for i in range(11)], "histogram": hist,
        } if accs else None,
        num_outliers=len(outs),
        outliers=tuple(outs[:MAX_OUTLIERS]),
    )


def format_outlier(o: Mapping[str, Any]) -> str:
    """One outlier record (:func:`outliers`) as text: "batch 1 #3 low 0.12 “prompt…”" (the batch is
    left out when unknown: records written before it was recorded)."""
    where = (f"batch {o['batch_index']} " if o.get("batch_index") is not None else "") + f"#{o.get('index')}"
    try:
        acc = f"{float(o.get('acceptance')):.2f}"
    except (TypeError, ValueError):
        acc = "–"
    return f"{where} {o.get('kind')} {acc} “{o.get('prompt_excerpt', '')}”"


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


__all__ = ["MAX_NUM_SPEC_TOKENS", "PROBLEMS", "SOURCE", "RequestSpecDecode", "cell_status", "collect", "format_outlier", "format_problems",
           "exact_curve", "excerpt", "outliers", "parse_payload", "summarize"]
