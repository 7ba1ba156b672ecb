"""The exporter's series as data: one row per metric family the collector serves.

Each :class:`Series` row is one family of ``/metrics``: its name, kind (gauge or counter), labels,
the range its values must lie in to be served, and its HELP text (which names the source metric
and the formula). Names and HELP texts are the exposed contract (every series: docs/exporter.md).
:data:`SERIES` is the exposition's order; the collector
(:class:`specwatch.exporter.collector.SpecwatchCollector`) builds one fresh family per row for
every fetch round (``_Families``), fills it by the row's ``attr``, and serves only the values inside
the row's ``valid`` range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from specwatch.specdecode.decision import TOLERANCE

__all__ = ["Series", "SERIES", "PROFILE_INFO_BY_DRAFTER", "GAUGE", "COUNTER", "UNIT", "LENGTH", "NONNEG"]

GAUGE, COUNTER = "gauge", "counter"

#: The range (inclusive) of every served ratio, length and speed; a value outside it is not served
#: (a row without one: only non-finite values are dropped).
UNIT, LENGTH, NONNEG = (0.0, 1.0), (1.0, math.inf), (0.0, math.inf)

#: Label sets: per upstream; per upstream, model and engine; the window; per SGLang scheduler rank.
U, E, W = ("upstream",), ("upstream", "model_name", "engine"), ("window",)
R = ("upstream", "model_name", "rank")
_PROFILE = ("profile", "source", "hardware", "model", "served_model_name", "vllm_version", "forward_only")

#: Source metric names the HELP texts cite.
_SRC = "vllm:spec_decode_num_"
_ITL, _IT = "vllm:inter_token_latency_seconds", "vllm:iteration_tokens_total"
_SGL = "SGLang"


@dataclass(frozen=True)
class Series:
    """One exported metric family.

    ``attr``: the collector's handle for it (``_Families.<attr>``); ``name``: the exposed name (a
    counter's without ``_total``, which the exposition adds); ``kind``: :data:`GAUGE` or
    :data:`COUNTER`; ``labels``: label names in the order the collector gives their values;
    ``valid``: the inclusive range a value must lie in to be served (:data:`UNIT`, :data:`LENGTH`,
    :data:`NONNEG`; ``None``: any finite value); ``help``: the HELP text."""

    attr: str
    name: str
    kind: str
    labels: tuple[str, ...]
    valid: tuple[float, float] | None
    help: str

    def family(self) -> Metric:
        """A fresh, empty family of this series."""
        cls = GaugeMetricFamily if self.kind == GAUGE else CounterMetricFamily
        return cls(self.name, self.help, labels=self.labels)


#: Every series the collector serves, in the exposition's order.
SERIES: tuple[Series, ...] = (
    Series("up", "specwatch_up", GAUGE, U, UNIT,
           "1 if the last fetch and parse of the upstream's /metrics worked, else 0."),
    Series("duration", "specwatch_scrape_duration_seconds", GAUGE, U, NONNEG,
           "Time to fetch and parse the upstream's /metrics, seconds."),
    Series("enabled", "specwatch_spec_decode_enabled", GAUGE, U, UNIT,
           "1 if the upstream exports speculative-decoding metrics, 0 if it runs without speculation."),
    Series("info", "specwatch_upstream_info", GAUGE, U + ("schema",), None,
           "Schema of the upstream's spec-decode metrics (v1, v1-early, v0, llamacpp, sglang, none); always 1."),
    Series("build_info", "specwatch_build_info", GAUGE, ("version",), None,
           "specwatch version; always 1."),
    Series("fetch_errors", "specwatch_upstream_fetch_errors", COUNTER, U + ("reason",), None,
           "Failed fetches of the upstream's /metrics since the exporter started, by reason."),
    Series("violations", "specwatch_invariant_violations", COUNTER, U + ("invariant",), None,
           "Scrapes whose counters broke a vLLM invariant (sum of per-position = accepted, per-position non-increasing, accepted <= "
           "draft tokens <= drafts x k); derived values are withheld then."),
    Series("drafts", "specwatch_drafts", COUNTER, E, None,
           f"Verify steps that carried draft tokens; copy of {_SRC}drafts_total."),
    Series("draft_tokens", "specwatch_draft_tokens", COUNTER, E, None,
           f"Draft tokens proposed; copy of {_SRC}draft_tokens_total."),
    Series("accepted", "specwatch_accepted_tokens", COUNTER, E, None,
           f"Draft tokens accepted (bonus token excluded); copy of {_SRC}accepted_tokens_total."),
    Series("accepted_per_pos", "specwatch_accepted_tokens_per_position", COUNTER, E + ("position",), None,
           f"Drafts whose first position+1 tokens were all accepted; copy of {_SRC}accepted_tokens_per_pos_total."),
    Series("generation", "specwatch_generation_tokens", COUNTER, E, None,
           "All output tokens; copy of vllm:generation_tokens_total."),
    Series("k", "specwatch_num_speculative_tokens", GAUGE, E, NONNEG,
           "num_speculative_tokens (k), inferred from the number of position labels of the per-position counter."),
    Series("acceptance_rate", "specwatch_draft_acceptance_rate", GAUGE, E + W, UNIT,
           "Draft acceptance rate, a fraction 0-1 (vllm bench serve's spec_decode_acceptance_rate is the same in percent): "
           "increase(accepted_tokens) / increase(draft_tokens) over the window."),
    Series("mean_length", "specwatch_mean_acceptance_length", GAUGE, E + W, LENGTH,
           "Mean acceptance length, tokens per verify step (bonus included): 1 + increase(accepted_tokens) / increase(drafts); SGLang: "
           "(increase(sglang:generation_tokens_total) - increase(sglang:num_requests_total)) / increase(sglang:spec_verify_calls_total)."),
    Series("pos_rate", "specwatch_position_acceptance_rate", GAUGE, E + ("position",) + W + ("basis",), UNIT,
           "Per-position acceptance rate r_i, 0-1: increase(accepted_per_pos[i]) / increase(drafts), vLLM's own unconditional "
           "per-position rate (vllm bench serve's spec_decode_per_position_acceptance_rates); basis=exact when every draft "
           "carried k tokens (k x drafts - draft_tokens <= max(1, 0.5% of drafts)), lower_bound when drafts were ragged (undrafted "
           "positions count as rejected, so the rate given that position i was drafted is at least this value)."),
    Series("pos_cond", "specwatch_position_conditional_acceptance_rate", GAUGE, E + ("position",) + W + ("basis",), UNIT,
           "Conditional per-position acceptance, 0-1: r_i / r_(i-1), r_(-1) = 1; basis as for specwatch_position_acceptance_rate."),
    Series("expected", "specwatch_expected_acceptance_length", GAUGE, E + ("k",) + W + ("basis",), LENGTH,
           "What-if mean acceptance length at num_speculative_tokens=k: 1 + sum of r_i for i < k (tokens per step); basis as for "
           "specwatch_position_acceptance_rate."),
    Series("tokens_per_draft", "specwatch_draft_tokens_per_draft", GAUGE, E + W, NONNEG,
           "Effective k: increase(draft_tokens) / increase(drafts)."),
    Series("from_drafts", "specwatch_output_from_drafts_ratio", GAUGE, E + W, UNIT,
           "Share of output tokens that came from accepted drafts, 0-1: increase(accepted_tokens) / "
           "increase(vllm:generation_tokens_total)."),
    Series("speedup", "specwatch_speedup", GAUGE, E + ("k",) + W + ("basis",), NONNEG,
           "Speedup at num_speculative_tokens=k vs no speculation, as a ratio of request time for the same output (prefill included), "
           "with how it was obtained: basis=measured (the server's k, both sides live: a baseline upstream's decode speed and TTFT), "
           "calibrated (the server's k: its live step over the cost profile's relative cost c = t/t0 at the live running requests, "
           "drafted tokens per step and context), profile (what-if k: tau(k) and c(k) from the profile), extrapolated (outside the "
           "profile's b, x or k), default (no profile: a built-in guess). Interval: specwatch_speedup_lower/upper."),
    Series("speedup_lower", "specwatch_speedup_lower", GAUGE, E + ("k",) + W + ("basis",), None,
           "Lower end of the 95% interval of specwatch_speedup (same labels): from the live sample (engine steps), the cost profile's "
           "recorded spread, its drift, a model mismatch, extrapolation; a forward-only profile reaches down 11.2x (docs/cost.md)."),
    Series("speedup_upper", "specwatch_speedup_upper", GAUGE, E + ("k",) + W + ("basis",), None,
           "Upper end of the 95% interval of specwatch_speedup (same labels); for a lower-bound (ragged) curve every never-drafted "
           "position counted as accepted."),
    Series("verdict", "specwatch_speculation_verdict", GAUGE, E + W + ("basis", "verdict"), None,
           "Does speculation pay at the server's k, decided on the interval: verdict=pays (specwatch_speedup_lower > 1), loses "
           "(specwatch_speedup_upper < 1), cannot_tell; basis of the speedup; always 1."),
    Series("recommended", "specwatch_recommended_num_speculative_tokens", GAUGE, E + W + ("basis",), NONNEG,
           f"k with the best specwatch_speedup estimate (ties within {TOLERANCE * 100:g}% go to the smaller k; docs/choosing-k.md); 0 = "
           "turn speculation off (also whenever drafts were proposed in the window and none was accepted); served with its confidence "
           "(specwatch_recommendation_certain, specwatch_recommendation_over_runner_up), never withheld as uncertain; basis = the weaker "
           "basis of the pick and its runner-up."),
    Series("certain", "specwatch_recommendation_certain", GAUGE, E + W, UNIT,
           "1 when the recommended k is told apart from its runner-up (the lower end of the 95% interval of pick / runner-up is above 1, "
           "there is no runner-up, or no draft token was accepted in the window), 0 when it is only the better estimate."),
    Series("runner_up", "specwatch_recommendation_over_runner_up", GAUGE, E + W + ("runner_up_k",), NONNEG,
           "specwatch_speedup of the recommended k / that of the runner-up (the next best candidate, runner_up_k 0 = off); the "
           "estimates of one window are compared unpaired. Interval: specwatch_recommendation_over_runner_up_lower/upper."),
    Series("runner_up_lower", "specwatch_recommendation_over_runner_up_lower", GAUGE, E + W + ("runner_up_k",), NONNEG,
           "Lower end of the 95% interval of specwatch_recommendation_over_runner_up (same labels); above 1: certain."),
    Series("runner_up_upper", "specwatch_recommendation_over_runner_up_upper", GAUGE, E + W + ("runner_up_k",), NONNEG,
           "Upper end of the 95% interval of specwatch_recommendation_over_runner_up (same labels)."),
    Series("ragged", "specwatch_ragged_drafts", GAUGE, E + W, UNIT,
           "1 when drafts in the window carried fewer than k tokens beyond rounding (k x increase(drafts) - increase(draft_tokens) > "
           "max(1, 0.5% of increase(drafts))): per-position, conditional and what-if series are then lower bounds; else 0."),
    Series("missing_ratio", "specwatch_missing_draft_tokens_ratio", GAUGE, E + W, UNIT,
           "Share of the k x drafts draft positions never drafted, 0-1: (k x increase(drafts) - increase(draft_tokens)) / (k x "
           "increase(drafts))."),
    Series("withheld", "specwatch_recommendation_withheld", GAUGE, E + W + ("reason",), None,
           "1 when no recommended k is served for the window, with the reason: insufficient_data (too few engine steps or drafts), "
           "no_cost_curve (the cost profile has no curve for the "
           "upstream's method and drafter; no what-if speedups either), default_contradicted (no profile and the built-in guess at the "
           "server's k is more than 25% off its live speedup; no what-if speedups either)."),
    Series("drift", "specwatch_cost_profile_error_ratio", GAUGE, E + W + ("basis",), NONNEG,
           "Drift: live step duration / the cost profile's step time t0(b, context) x c(b, k, x) at the live running requests per step, "
           "context, drafted tokens per step x and the server's k (k = 0: the plain step); 1 = the profile describes this machine, 2 = "
           "this machine is 2x slower; basis=profile for a k the profile measured inside its range, else extrapolated."),
    Series("predicted_step", "specwatch_cost_profile_predicted_step_duration_seconds", GAUGE, E + W, NONNEG,
           "The cost profile's step time t(b, k) at the live running requests per step b and the server's k, seconds."),
    Series("profile_applied", "specwatch_cost_profile_applied", GAUGE, E + W, UNIT,
           "1 if the cost profile was measured for this model (its served_model_name matches or is unset), else 0 (it is still applied, "
           "with a much wider interval)."),
    Series("profile_info", "specwatch_cost_profile_info", GAUGE, _PROFILE, None,
           "The configured cost profile and its provenance; always 1."),
    Series("profile_step", "specwatch_cost_profile_step_seconds", GAUGE, ("method", "drafter", "k", "running_requests", "workload"), None,
           "Step times of the configured cost profile, seconds: method none, k 0 = the plain step t0(b); else t(b, k) of that method and "
           "drafter; workload: the workload the point was measured with (empty in a format-1 profile)."),
    Series("v0_rate", "specwatch_v0_draft_acceptance_rate", GAUGE, ("upstream", "model_name"), UNIT,
           "vLLM V0 gauge vllm:spec_decode_draft_acceptance_rate (most recent interval; V0 counts accepted tokens after a rejection too)."),
    Series("fetches", "specwatch_upstream_fetches", COUNTER, U, None,
           "Fetches of the upstream's /metrics started since the exporter started (concurrent scrapes share one fetch per "
           "--min-fetch-interval)."),
    Series("step_duration", "specwatch_step_duration_seconds", GAUGE, E + W, NONNEG,
           f"Mean engine-step time a running request sees, seconds (drafting, verify, sampling, scheduling): increase({_ITL}_sum) / "
           f"increase({_ITL}_count) over the window."),
    Series("steps_per_second", "specwatch_engine_steps_per_second", GAUGE, E + W, NONNEG,
           f"Engine steps per second: increase({_IT}_count) / window span (exporter clock)."),
    Series("running", "specwatch_running_requests", GAUGE, E + W, NONNEG,
           "Mean of vllm:num_requests_running over the exporter's fetches in the window."),
    Series("running_per_step", "specwatch_running_requests_per_step", GAUGE, E + W, NONNEG,
           f"Running requests an engine step served, b: increase({_ITL}_count) / increase({_IT}_count) over the window (step-weighted; the "
           "b at which cost profiles are read)."),
    Series("output_tps", "specwatch_output_tokens_per_second", GAUGE, E + W, NONNEG,
           "Output throughput of the server, tokens per second of all requests together: increase(vllm:generation_tokens_total) / "
           "window span (exporter clock); vllm bench serve's and AIPerf's output token throughput (docs/metrics.md)."),
    Series("decode_speed", "specwatch_request_decode_tokens_per_second", GAUGE, E + W, NONNEG,
           "Output tokens per second a running request gets after its first token: increase(vllm:generation_tokens_total - "
           f"vllm:time_to_first_token_seconds_count) / increase({_ITL}_sum)."),
    Series("sgl_gen", "specwatch_sglang_generation_tokens", COUNTER, E, None,
           f"{_SGL}: output tokens of finished requests; copy of sglang:generation_tokens_total summed over is_streaming and other "
           "labels."),
    Series("sgl_fin", "specwatch_sglang_finished_requests", COUNTER, E, None,
           f"{_SGL}: finished requests; copy of sglang:num_requests_total summed over is_streaming and other labels."),
    Series("sgl_verify", "specwatch_sglang_verify_calls", COUNTER, E, None,
           f"{_SGL}: verify steps of finished requests; copy of sglang:spec_verify_calls_total. Mean acceptance length across instances = "
           "sum(increase(generation_tokens) - increase(finished_requests)) / sum(increase(verify_calls))."),
    Series("sgl_rate", "specwatch_sglang_spec_accept_rate", GAUGE, R, UNIT,
           f"{_SGL} gauge sglang:spec_accept_rate passed through: accepted drafts / (verify steps x the configured draft width) of the "
           "last logged batch; wrong under adaptive speculation (the width varies); a most-recent value: cannot be windowed or summed."),
    Series("sgl_length", "specwatch_sglang_spec_accept_length", GAUGE, R, NONNEG,
           f"{_SGL} gauge sglang:spec_accept_length passed through: tokens per verify step (bonus included) of the last logged batch; "
           "cannot be windowed or summed (specwatch_mean_acceptance_length is the windowed one)."),
    Series("sgl_gauge", "specwatch_sglang_spec_value", GAUGE, R + ("gauge",), NONNEG,
           f"{_SGL} speculative gauges passed through (spec_num_steps, spec_num_draft_tokens: the active configuration; spec_cap_length, "
           "spec_block_accept_length); most-recent values."),
    Series("method_info", "specwatch_speculative_method_info", GAUGE, U + ("method", "drafter", "source"), None,
           "Speculative method and drafter of the upstream as the operator stated them, with where: source=upstream_flag (the upstream's "
           "own ,method=/,drafter= options of --upstream) or flag (the exporter-wide --speculative-method/--drafter), server_info (the "
           "server's own dev-mode /server_info, read with ,server_info=on); vLLM publishes neither on /metrics nor on /v1/models; always "
           "1."),
    Series("not_derivable", "specwatch_not_derivable", GAUGE, U + ("series", "reason"), None,
           "A specwatch series this upstream's /metrics cannot give, with the reason (baseline_speculates: the --baseline-upstream's "
           "vllm:spec_decode_* counters move, so it is no denominator of the measured speedup; baseline_invalid_value: its values give "
           "no finite measured speedup); always 1."),
    Series("v0_efficiency", "specwatch_v0_spec_decode_efficiency", GAUGE, ("upstream", "model_name"), UNIT,
           "vLLM V0 gauge vllm:spec_decode_efficiency = emitted / (draft_tokens / k x (k+1))."),
)

_PROFILE_INFO = next(s for s in SERIES if s.attr == "profile_info")

#: specwatch_cost_profile_info when upstreams state a drafter (``--drafter`` or ``,drafter=``): one
#: series per drafter, with how the profile's curve was found for it.
PROFILE_INFO_BY_DRAFTER = replace(
    _PROFILE_INFO, labels=_PROFILE_INFO.labels + ("drafter", "drafter_match"),
    help=_PROFILE_INFO.help + " With a --drafter (or ,drafter=): one series per drafter, drafter as stated and drafter_match: exact, "
    "last_path_component (the drafter's path and its last component name one drafter) or none (no curve for it: what-if speedups "
    "withheld, no_cost_curve).")
