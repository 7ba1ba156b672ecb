"""specwatch / Choosing k: per-position acceptance (bars by position and over time), the expected
acceptance length and estimated speedup per k, acceptance by workload (when the load generator
labels it) and the advisor's recommended k.

Data: the specwatch exporter's windowed gauges (window label, variable ``$window``) and advice
gauges, its recording rules (prometheus/rules/), and the load generator (specwatch bench).
"""

from lib import (
    RATIO_GOOD_HIGH, SPEEDUP, WINDOW, WORKLOAD, Section, Sel, bargauge, dashboard, q, stat, timeseries,
    variables,
)
from specwatch.mixin.config import DEFAULT_CONFIG

# The mixin config (dashboards/generate.py --config injects it; the defaults otherwise), the same one
# the recording rules and alerts are generated from.
cfg = globals().get("MIXIN_CONFIG", DEFAULT_CONFIG)
S = Sel(cfg)
W = cfg.rate_window

K = f"specwatch_num_speculative_tokens{S.exporter()}"
SPEEDUP_K = f"specwatch_estimated_speedup{S.exporter(WINDOW)}"
RECOMMENDED = f"specwatch_recommended_num_speculative_tokens{S.exporter(WINDOW)}"
BY_UE = "{{upstream}} · engine {{engine}}"
POS_LEGEND = "position {{position}} · {{upstream}} · engine {{engine}}"
K_LEGEND = "k={{k}} · {{upstream}} · engine {{engine}}"
# count_values turns the inferred k (a value) into a label k, to pick the speedup at the current k.
CURRENT_K_AS_LABEL = f'count_values without () ("k", {K})'

recommendation = Section("Recommendation", [
    stat("Recommended k",
         "specwatch_recommended_num_speculative_tokens over the exporter window $window: the k with the best "
         "estimated speedup (the smallest within 2 % of the best); 0 means turn speculation off. From the "
         "per-position acceptance curve and the verify-step cost model at the current batch size.",
         "none", [q(RECOMMENDED, BY_UE)], graph=False, w=6),
    stat("Current k (inferred)",
         "num_speculative_tokens the server runs with, inferred from the position labels of "
         "vllm:spec_decode_num_accepted_tokens_per_pos_total.",
         "none", [q(K, BY_UE)], graph=False, w=6),
    stat("Estimated speedup at the current k",
         "specwatch_estimated_speedup at k = the current k, over the exporter window $window: expected "
         "acceptance length / verify-step cost factor. Below 1, speculation costs throughput.",
         "none", [q(f"{SPEEDUP_K} and on (upstream, model_name, engine, k) {CURRENT_K_AS_LABEL}", BY_UE)],
         thresholds=SPEEDUP, decimals=2, w=6),
    stat("Best estimated speedup (any k)",
         "The highest specwatch_estimated_speedup over k = 1..current k, over the exporter window $window: "
         "the speedup the recommended k is expected to give.",
         "none", [q(f"max by (upstream, model_name, engine) ({SPEEDUP_K})", BY_UE)],
         thresholds=SPEEDUP, decimals=2, w=6),
])

positions = Section("Per-position acceptance", [
    bargauge("Per-position acceptance rate by position",
             f"r_i = P(the first i+1 draft tokens are all accepted), one bar per position, over {W} "
             "(vllm:spec_decode_num_accepted_tokens_per_pos_total / vllm:spec_decode_num_drafts_total). "
             "Non-increasing in the position.",
             "percentunit", [q(S.up_ratio("specwatch_position_acceptance_rate"), POS_LEGEND, instant=True)],
             minimum=0, maximum=1, thresholds=RATIO_GOOD_HIGH),
    bargauge("Conditional acceptance rate by position",
             f"P(position i accepted | positions before i accepted) = r_i / r_(i-1), one bar per position, over "
             f"{W}. A position whose bar is low is where extra draft tokens stop paying.",
             "percentunit", [q(S.up_ratio("specwatch_position_conditional_acceptance_rate"), POS_LEGEND,
                               instant=True)],
             minimum=0, maximum=1, thresholds=RATIO_GOOD_HIGH),
    timeseries("Per-position acceptance rate over time",
               f"r_i per position over {W}, as a time series.",
               "percentunit", [q(S.up_ratio("specwatch_position_acceptance_rate"), POS_LEGEND)],
               minimum=0, maximum=1),
    timeseries("Conditional acceptance rate over time",
               f"r_i / r_(i-1) per position over {W}, as a time series.",
               "percentunit", [q(S.up_ratio("specwatch_position_conditional_acceptance_rate"), POS_LEGEND)],
               minimum=0, maximum=1),
])

what_if = Section("What-if per k", [
    bargauge("Expected acceptance length per k",
             f"E(k) = 1 + sum of r_i for i < k over {W}: tokens per verify step had num_speculative_tokens "
             "been k (exact for chain drafters). Flat bars at high k mean extra draft tokens are rarely "
             "accepted.",
             "short", [q(S.up_ratio("specwatch_expected_acceptance_length"), K_LEGEND, instant=True)],
             minimum=1, decimals=2),
    bargauge("Estimated speedup per k",
             "specwatch_estimated_speedup per k over the exporter window $window: E(k) / (1 + k × (a + s × "
             "running requests)), the cost model of MixinConfig. Red below 1 (slower than no speculation).",
             "none", [q(SPEEDUP_K, K_LEGEND, instant=True)], thresholds=SPEEDUP, decimals=2, minimum=0),
    timeseries("Expected acceptance length per k over time",
               f"E(k) per k over {W}, as a time series.",
               "short", [q(S.up_ratio("specwatch_expected_acceptance_length"), K_LEGEND)], minimum=1),
    timeseries("Estimated speedup per k over time",
               "specwatch_estimated_speedup per k over the exporter window $window, with the recommended k. "
               "The line at 1 is break-even.",
               "none", [q(SPEEDUP_K, K_LEGEND)], thresholds=SPEEDUP, show_thresholds=True),
    timeseries("Recommended k over time",
               "specwatch_recommended_num_speculative_tokens over time beside the current k: the advice moves "
               "with the workload and the batch size.",
               "none", [q(RECOMMENDED, "recommended · " + BY_UE), q(K, "current · " + BY_UE)], minimum=0),
    timeseries("Running requests (cost model input)",
               "vllm:num_requests_running, the batch size that enters the verify-step cost model: a larger "
               "batch makes each draft token dearer.",
               "none", [q(f"sum by (instance, engine) ({S.running_by_instance()})", "{{instance}} · engine {{engine}}")],
               minimum=0),
])

ACTIVE = f"specwatch_bench_active{S.bench()}"
SPECULATIVE = 'role="speculative"'
BENCH_ACCEPTANCE = f"specwatch_bench_spec_decode_acceptance_rate{S.bench(SPECULATIVE, WORKLOAD)}"
by_workload = Section("By workload (load generator)", [
    bargauge("Draft acceptance rate by workload",
             "specwatch_bench_spec_decode_acceptance_rate: the draft acceptance rate the load generator measured "
             "over its last finished batch of each (workload, concurrency) cell on the speculative server. "
             "Empty until the load generator has run.",
             "percentunit", [q(BENCH_ACCEPTANCE,
                               "{{workload}} · concurrency {{concurrency}}")],
             minimum=0, maximum=1, thresholds=RATIO_GOOD_HIGH),
    timeseries("Live acceptance rate, labelled with the running workload",
               f"The draft acceptance rate over {W} per upstream, labelled with the workload and concurrency the "
               "load generator is running at that moment (joined on specwatch_bench_active == 1). Empty "
               "when no load generator runs.",
               "percentunit", [q(f"sum by (upstream) ({S.up_rate('specwatch_accepted_tokens')}) / sum by (upstream) "
                                 f"({S.up_rate('specwatch_draft_tokens')}) * on () group_left (workload, concurrency) "
                                 f"topk(1, {ACTIVE} == 1)",
                                 "{{upstream}} · {{workload}} · concurrency {{concurrency}}")],
               minimum=0, maximum=1),
])

dashboard = dashboard(
    uid="specwatch-choosing-k",
    title="specwatch / Choosing k",
    description="Choosing num_speculative_tokens (k): per-position acceptance, what-if per k, estimated speedup, "
                "recommended k, acceptance by workload. Generated by dashboards/generate.py; do not edit.",
    sections=[recommendation, positions, what_if, by_workload],
    templates=variables(cfg, window=True, workload=True),
)
