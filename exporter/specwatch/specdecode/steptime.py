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

Values with a zero denominator are None. Upstreams without these families (vLLM before V1's
histograms, llama.cpp) give no :class:`StepCounters`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

#: The sample names read, vLLM V1 (0.10.2+; the ITL histogram was ``time_per_output_token`` before).
ITL_SUM = "vllm:inter_token_latency_seconds_sum"
ITL_COUNT = "vllm:inter_token_latency_seconds_count"
STEPS = "vllm:iteration_tokens_total_count"
FIRST_TOKENS = "vllm:time_to_first_token_seconds_count"
GENERATION = "vllm:generation_tokens_total"
RUNNING = "vllm:num_requests_running"
_NAMES = {ITL_SUM: "itl_sum", ITL_COUNT: "itl_count", STEPS: "steps", FIRST_TOKENS: "first_tokens",
          GENERATION: "generation_tokens", RUNNING: "running"}
_FAMILIES = ("vllm:inter_token_latency_seconds", "vllm:iteration_tokens_total", "vllm:time_to_first_token_seconds",
             "vllm:generation_tokens", "vllm:num_requests_running")


@dataclass(frozen=True)
class StepCounters:
    """Cumulative step counters of one (model_name, engine), or their increase over an interval.

    Fields (floats, counts or seconds since the server started): ``itl_sum`` (s) and ``itl_count``
    (request-steps) of ``vllm:inter_token_latency_seconds``; ``steps`` (engine steps, the count of
    ``vllm:iteration_tokens_total``); ``first_tokens`` (count of
    ``vllm:time_to_first_token_seconds``); ``generation_tokens`` (``vllm:generation_tokens_total``);
    ``running`` (``vllm:num_requests_running`` at the reading; for a delta, the reading at the end).
    """

    model_name: str
    engine: str
    itl_sum: float
    itl_count: float
    steps: float
    first_tokens: float
    generation_tokens: float
    running: float = 0.0

    def minus(self, before: StepCounters) -> StepCounters | None:
        """The increase since ``before``; None when any counter went down (a restart in between:
        the interval cannot be measured)."""
        d = StepCounters(self.model_name, self.engine, self.itl_sum - before.itl_sum, self.itl_count - before.itl_count,
                         self.steps - before.steps, self.first_tokens - before.first_tokens,
                         self.generation_tokens - before.generation_tokens, self.running)
        if min(d.itl_sum, d.itl_count, d.steps, d.first_tokens, d.generation_tokens) < 0:
            return None
        return d


def parse_step_counters(text: str) -> dict[tuple[str, str], StepCounters]:
    """The step counters of every (model_name, engine) in a vLLM /metrics body.

    Only the families above are kept; an engine missing any of the five samples, or with a
    negative or non-finite value, is left out (older vLLM, llama.cpp: an empty dict).
    Raises ValueError when the body is not the Prometheus text format (prometheus_client.parser).
    """
    seen: dict[tuple[str, str], dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name not in _FAMILIES:
            continue
        for s in fam.samples:
            field = _NAMES.get(s.name)
            if field is None:
                continue
            key = (s.labels.get("model_name", ""), s.labels.get("engine", "0"))
            seen.setdefault(key, {})[field] = s.value
    out = {}
    for key, vals in seen.items():
        if len(vals) == len(_NAMES) and all(math.isfinite(v) and v >= 0 for v in vals.values()):
            out[key] = StepCounters(key[0], key[1], **vals)
    return out


def sum_step_counters(items: Iterable[StepCounters], model_name: str | None = None) -> StepCounters | None:
    """Sum over engines (of ``model_name`` when given); None when there is nothing to sum."""
    items = [c for c in items if model_name is None or c.model_name == model_name]
    if not items:
        return None
    return StepCounters(model_name or items[0].model_name, "*", *(sum(getattr(c, f) for c in items) for f in
                        ("itl_sum", "itl_count", "steps", "first_tokens", "generation_tokens", "running")))


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 and math.isfinite(num / den) else None


@dataclass(frozen=True)
class StepTimes:
    """Step-time values over one interval (see the module doc for the formulas). None = no data."""

    step_duration_seconds: float | None
    running_requests: float | None
    request_decode_tokens_per_second: float | None
    engine_steps: float
    request_steps: float


def step_times(delta: StepCounters) -> StepTimes:
    """:class:`StepTimes` from a counter increase (:meth:`StepCounters.minus`, summed over engines
    or per engine)."""
    return StepTimes(
        step_duration_seconds=_ratio(delta.itl_sum, delta.itl_count),
        running_requests=_ratio(delta.itl_count, delta.steps),
        request_decode_tokens_per_second=_ratio(delta.generation_tokens - delta.first_tokens, delta.itl_sum),
        engine_steps=delta.steps,
        request_steps=delta.itl_count,
    )


def step_record(delta: StepCounters | None) -> dict[str, float | None]:
    """The result-file fields of a step-counter increase (``server_*``, measured by vLLM)."""
    if delta is None:
        return {"server_step_duration_ms": None, "server_running_requests": None,
                "server_request_decode_tokens_per_second": None, "server_engine_steps": None,
                "server_request_steps": None, "server_itl_sum_seconds": None}
    t = step_times(delta)
    return {
        "server_step_duration_ms": None if t.step_duration_seconds is None else t.step_duration_seconds * 1000,
        "server_running_requests": t.running_requests,
        "server_request_decode_tokens_per_second": t.request_decode_tokens_per_second,
        "server_engine_steps": delta.steps,
        "server_request_steps": delta.itl_count,
        "server_itl_sum_seconds": delta.itl_sum,
    }


def delta_between(before: Mapping[tuple[str, str], StepCounters] | None,
                  after: Mapping[tuple[str, str], StepCounters] | None, model_name: str | None = None) -> StepCounters | None:
    """Increase of the engines' summed step counters between two parsed bodies (None if either is
    missing or a counter went down)."""
    if not before or not after:
        return None
    b = sum_step_counters(before.values(), model_name if any(k[0] == model_name for k in before) else None)
    a = sum_step_counters(after.values(), model_name if any(k[0] == model_name for k in after) else None)
    if a is None or b is None:
        return None
    return a.minus(b)
