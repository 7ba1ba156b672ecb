"""Engine step time from vLLM's own histograms: what a decode step costs, measured by the server.

vLLM V1 observes, per engine (labels ``model_name``, ``engine``):

- ``vllm:inter_token_latency_seconds`` once per running request per engine step (the time since
  that request's previous output; one observation per step even when the step emits several
  tokens, as a speculative verify step does);
- ``vllm:iteration_tokens_total`` (a histogram whose name ends in ``_total``) once per engine step;
- ``vllm:time_to_first_token_seconds`` once per request (its first token);
- ``vllm:generation_tokens_total`` for every output token (accepted drafts and bonus included);
- ``vllm:num_requests_running``, a gauge.

From the increases Δ of those counters over an interval (:class:`StepCounters` minus
:class:`StepCounters`):

- step duration (s) = Δ ITL sum / Δ ITL count — the mean step time a running request sees, the
  drafter, the verify forward pass, sampling and scheduling all inside it;
- running requests per step b = Δ ITL count / Δ iteration count — the batch a decode step served,
  weighted by steps (idle time does not dilute it, unlike a time average of the gauge);
- request decode speed (tok/s) = Δ(generation tokens − first tokens) / Δ ITL sum — output tokens a
  running request gets per second after its first token; steps that drafted nothing count too, so
  it is the decode speed users feel, with or without speculation;
- draft share = Δ ``vllm:spec_decode_num_drafts_total`` / Δ ITL count — the share of request-steps
  that carried a draft (ngram finds no match on some steps).

Values with a zero denominator are None. The counters are parsed with the rest of /metrics
(:class:`specwatch.specdecode.metrics.StepCounters` in ``UpstreamSnapshot.steps``); upstreams
without these families (vLLM before V1's histograms, llama.cpp) have none.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from specwatch.specdecode.metrics import StepCounters

_FIELDS = ("itl_sum", "itl_count", "iteration_count", "ttft_count", "generation_tokens")
#: Counters read where present (older vLLM lacks none of them, llama.cpp may): TTFT seconds and the
#: finished requests' prompt and output tokens.
_OPTIONAL = ("ttft_sum", "prompt_tokens_sum", "prompt_requests", "output_tokens_sum", "output_requests")


def is_complete(c: StepCounters) -> bool:
    """True when all five step counters are present (vLLM V1 with its histograms)."""
    return all(getattr(c, f) is not None for f in _FIELDS)


def minus(after: StepCounters, before: StepCounters) -> StepCounters | None:
    """The increase ``after − before``; None when either is incomplete or any counter went down
    (a restart in between: the interval cannot be measured)."""
    if not (is_complete(after) and is_complete(before)):
        return None
    d = StepCounters(**{f: getattr(after, f) - getattr(before, f) for f in _FIELDS},
                     **{f: getattr(after, f) - getattr(before, f) for f in _OPTIONAL
                        if getattr(after, f) is not None and getattr(before, f) is not None})
    if min(getattr(d, f) for f in _FIELDS) < 0:
        return None
    if any(v is not None and v < 0 for v in (getattr(d, f) for f in _OPTIONAL)):
        d = StepCounters(**{f: getattr(d, f) for f in _FIELDS})
    return d


def sum_step_counters(items: Iterable[StepCounters | None]) -> StepCounters | None:
    """Sum of complete step counters (over engines, or over intervals); None when there is none
    or one is incomplete."""
    items = list(items)
    if not items or not all(c is not None and is_complete(c) for c in items):
        return None
    opt = {f: sum(getattr(c, f) for c in items) for f in _OPTIONAL if all(getattr(c, f) is not None for c in items)}
    return StepCounters(**{f: sum(getattr(c, f) for c in items) for f in _FIELDS}, **opt)


def _ratio(num: float, den: float) -> float | None:
    """num / den, or None when den is not positive, num is negative (counters that contradict
    each other, e.g. more first tokens than generated tokens) or the quotient is not finite."""
    return num / den if den > 0 and num >= 0 and math.isfinite(num / den) else None


@dataclass(frozen=True)
class StepTimes:
    """Step-time values over one interval (see the module doc for the formulas). None = no data.

    ``running_requests_per_step`` is b, the batch a decode step served (step-weighted).
    Where the server exports them: ``decode_tokens`` = Δ(generation tokens − first tokens),
    ``itl_seconds`` = Δ ITL sum, ``prefill_seconds`` = Δ TTFT sum, ``first_tokens`` = Δ TTFT count
    (requests that got their first token), ``context_tokens`` = mean prompt + half the mean output
    of the requests finished in the interval (Δ request_prompt_tokens_sum / Δ count + Δ
    request_generation_tokens_sum / (2 Δ count))."""

    step_duration_seconds: float | None
    running_requests_per_step: float | None
    request_decode_tokens_per_second: float | None
    engine_steps: float
    request_steps: float
    decode_tokens: float | None = None
    itl_seconds: float | None = None
    prefill_seconds: float | None = None
    first_tokens: float | None = None
    context_tokens: float | None = None
    #: How the decode speed moved inside the interval (:class:`SpeedSpread`, batch means over the
    #: exporter's fetches); set by the exporter's windows where a measured speedup needs it, else None.
    speed_spread: "SpeedSpread | None" = None

    @property
    def tokens_per_request_step(self) -> float | None:
        """τ: output tokens a running request gets per engine step = Δ decode tokens / Δ ITL count."""
        if self.decode_tokens is None or not self.request_steps:
            return None
        return self.decode_tokens / self.request_steps


#: Most batches the exporter's windows group a window's fetch intervals into for
#: :func:`speed_spread` (batch means: a fixed, small number of long batches keeps the standard
#: error honest when the speed drifts slowly).
MAX_SPREAD_BATCHES = 8
#: Fewest groups a server's spread is told from: with two, t(1) = 12.7 turned a 30 s window at
#: Prometheus' 15 s scrapes into an interval of [0.06–15.7] in the demo (2026-12-04); a window
#: with fewer groups adds no between-rounds term (a 1m window at 15 s scrapes has 4).
MIN_SPREAD_BATCHES = 3


@dataclass(frozen=True)
class SpeedSpread:
    """How one server's per-request decode speed moved over a window: the window's fetch intervals
    in time order, grouped into ``batches`` contiguous groups of about equal engine steps (at most
    :data:`MAX_SPREAD_BATCHES`; :meth:`specwatch.exporter.windows.WindowEngine.values`); per group
    x_g = ln(Δ decode tokens / Δ ITL sum); ``log_standard_error`` = sd(x_g) / √batches, the
    standard error of the mean log speed (batch means). It holds the round-to-round movement a
    client sees (a host that slows down between two rounds, the tail of a batch with fewer running
    requests) that the engine-step count alone does not. ``intervals``: the fetch intervals the
    groups span."""

    batches: int
    log_standard_error: float
    intervals: int


def speed_spread(groups: Iterable[tuple[float, float]], intervals: int | None = None) -> SpeedSpread | None:
    """:class:`SpeedSpread` of contiguous groups given as (Δ decode tokens, Δ ITL sum seconds) in
    time order (a group with a non-positive or non-finite value is skipped); None with fewer than
    :data:`MIN_SPREAD_BATCHES` usable groups (too few to tell a spread from). ``intervals``: the
    fetch intervals they span (default: the number of groups)."""
    pts = [(d, i) for d, i in groups if math.isfinite(d) and math.isfinite(i) and d > 0 and i > 0]
    m = len(pts)
    if m < MIN_SPREAD_BATCHES:
        return None
    xs = [math.log(d / i) for d, i in pts]
    mean = sum(xs) / m
    var = sum((x - mean) ** 2 for x in xs) / (m - 1)
    return SpeedSpread(m, math.sqrt(var / m), m if intervals is None else intervals)


def step_times(delta: StepCounters) -> StepTimes:
    """:class:`StepTimes` from a complete counter increase (:func:`minus`, or :func:`sum_step_counters`
    of increases)."""
    times = step_times_of(itl_sum=delta.itl_sum, itl_count=delta.itl_count, iteration_count=delta.iteration_count,
                          ttft_count=delta.ttft_count, generation_tokens=delta.generation_tokens,
                          ttft_sum=delta.ttft_sum, prompt_tokens_sum=delta.prompt_tokens_sum,
                          prompt_requests=delta.prompt_requests, output_tokens_sum=delta.output_tokens_sum,
                          output_requests=delta.output_requests)
    assert times is not None  # a complete increase has an ITL count
    return times


def step_times_of(*, itl_sum: float | None, itl_count: float | None, iteration_count: float | None,
                  ttft_count: float | None, generation_tokens: float | None, ttft_sum: float | None = None,
                  prompt_tokens_sum: float | None = None, prompt_requests: float | None = None,
                  output_tokens_sum: float | None = None, output_requests: float | None = None) -> StepTimes | None:
    """The one implementation of the step-time formulas (module doc) over counter increases Δ, any
    of which may be None (a family the upstream does not export: that value is None). Used by
    :func:`step_times` (complete increases: bench, sweep, calibrate) and by the exporter's windows
    (:mod:`specwatch.exporter.windows`). None when there is no Δ ITL count (no request-steps to
    divide by); ``engine_steps`` is 0 when the iteration histogram is absent."""
    if itl_count is None:
        return None
    decode = None if generation_tokens is None or ttft_count is None else generation_tokens - ttft_count
    return StepTimes(
        step_duration_seconds=_ratio_or_none(itl_sum, itl_count),
        running_requests_per_step=_ratio_or_none(itl_count, iteration_count),
        request_decode_tokens_per_second=_ratio_or_none(decode, itl_sum),
        engine_steps=iteration_count if iteration_count is not None else 0.0,
        request_steps=itl_count,
        decode_tokens=decode,
        itl_seconds=itl_sum,
        prefill_seconds=ttft_sum,
        first_tokens=ttft_count,
        context_tokens=context_tokens(prompt_tokens_sum, prompt_requests, output_tokens_sum, output_requests),
    )


def _ratio_or_none(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None else _ratio(num, den)


def context_tokens(prompt_sum: float | None, prompt_n: float | None, output_sum: float | None,
                   output_n: float | None) -> float | None:
    """Context per running request, tokens: mean prompt + half the mean output of the finished
    requests (``vllm:request_prompt_tokens`` and ``vllm:request_generation_tokens`` histograms).
    Chosen over ``vllm:kv_cache_usage_perc`` × capacity / running requests because the KV usage is
    rounded to blocks (128 tokens on the CPU build) and shared by prefix caching. None without
    finished requests."""
    if not prompt_n or not output_n or prompt_sum is None or output_sum is None:
        return None
    v = prompt_sum / prompt_n + output_sum / (2.0 * output_n)
    return v if math.isfinite(v) and v >= 0 else None


def delta_between(before: Mapping[tuple[str, str], StepCounters] | None,
                  after: Mapping[tuple[str, str], StepCounters] | None, model_name: str | None = None) -> StepCounters | None:
    """Increase of the engines' summed step counters (of ``model_name`` when the server labels it)
    between two parsed bodies (``UpstreamSnapshot.steps``); None if either is missing, incomplete
    or a counter went down."""
    if not before or not after:
        return None

    def total(m: Mapping[tuple[str, str], StepCounters]) -> StepCounters | None:
        keep = model_name if any(k[0] == model_name for k in m) else None
        return sum_step_counters(c for k, c in m.items() if keep is None or k[0] == keep)

    a, b = total(after), total(before)
    return None if a is None or b is None else minus(a, b)
