"""specwatch / Speculative decoding: everything vLLM's own "Speculative Decoding" dashboard shows,
plus conditional per-position acceptance, the what-if curve per k, the estimated speedup, the
inferred k, KV-cache usage, running/waiting requests, per-request TPOT beside ITL, and the load
generator's current cell as context.

Data: the specwatch exporter (job of MixinConfig.exporter_selector) and its recording rules
(prometheus/rules/), vLLM's own /metrics (vllm_selector) and the load generator (bench_selector).
"""

from specwatch.mixin.config import CURRENT_K_BASES, MixinConfig

from .lib import (
    KV_CACHE, MODEL_NAME, NEUTRAL, QUEUE, RATIO_GOOD_HIGH, SPEEDUP, UP, Section, Sel, bargauge, dashboard, q, stat,
    timeseries, variables,
)


def build(cfg: MixinConfig):
    """The Speculative decoding dashboard for ``cfg``, a grafanalib Dashboard.

    Selectors, windows and thresholds come from ``cfg``: the same MixinConfig the recording rules
    and alerts are generated from (``python -m specwatch.mixin.generate --config``)."""
    S = Sel(cfg)
    EXPORTER_WINDOW = f'window="{cfg.exporter_window}"'
    # the server's current k is the only k with a live basis (measured: against a baseline server;
    # calibrated: its live step against the cost profile's relative cost)
    LIVE_BASIS = 'basis=~"' + "|".join(CURRENT_K_BASES) + '"'
    LIVE_SPEEDUP = f"specwatch_speedup{S.exporter(EXPORTER_WINDOW, LIVE_BASIS)}"
    LIVE_LOWER = f"specwatch_speedup_lower{S.exporter(EXPORTER_WINDOW, LIVE_BASIS)}"
    LIVE_UPPER = f"specwatch_speedup_upper{S.exporter(EXPORTER_WINDOW, LIVE_BASIS)}"
    W = cfg.rate_window

    ACCEPTED = S.up_rate("specwatch_accepted_tokens")
    DRAFT_TOKENS = S.up_rate("specwatch_draft_tokens")
    DRAFTS = S.up_rate("specwatch_drafts")
    REJECTED = S.up_rate("specwatch_rejected_tokens")
    K = f"specwatch_num_speculative_tokens{S.exporter()}"
    RUNNING = S.running_by_instance()
    WAITING = S.waiting_by_instance()
    KV = f"vllm:kv_cache_usage_perc{S.vllm()}"
    BY_UE = "{{upstream}} · engine {{engine}}"
    BY_IE = "{{instance}} · engine {{engine}}"

    overview = Section("Overview (last value; windows of %s)" % W, [
        stat("Draft acceptance rate",
             f"Accepted draft tokens / proposed draft tokens over {W}, summed over the selected upstreams and "
             "engines (ratio of sums). Source: vllm:spec_decode_num_accepted_tokens_total / "
             "vllm:spec_decode_num_draft_tokens_total via the exporter's copies and the rate rules.",
             "percentunit", [q(f"sum({ACCEPTED}) / sum({DRAFT_TOKENS})", "acceptance rate")],
             thresholds=RATIO_GOOD_HIGH, minimum=0, maximum=1),
        stat("Mean acceptance length",
             f"Tokens emitted per verify step, bonus token included: 1 + accepted tokens / drafts over {W} "
             "(vLLM's 'Mean acceptance length'). 1 means no draft token is ever accepted; the ceiling is k + 1.",
             "short", [q(f"1 + sum({ACCEPTED}) / sum({DRAFTS})", "mean acceptance length")], decimals=2),
        stat("Accepted tokens/s", f"Draft tokens accepted per second (rate over {W}).", "cps",
             [q(f"sum({ACCEPTED})", "accepted/s")]),
        stat("Draft tokens/s", f"Draft tokens proposed per second (rate over {W}).", "cps",
             [q(f"sum({DRAFT_TOKENS})", "drafted/s")]),
        stat("Drafts/s", f"Verify steps that carried at least one draft token, per second (rate over {W}).",
             "cps", [q(f"sum({DRAFTS})", "drafts/s")]),
        stat("Output from drafts",
             f"Share of all output tokens that were accepted draft tokens over {W}: accepted tokens / "
             "vllm:generation_tokens_total, per upstream and engine.",
             "percentunit", [q(S.up_ratio("specwatch_output_from_drafts_ratio"), BY_UE)],
             minimum=0, maximum=1, thresholds=RATIO_GOOD_HIGH),
        stat("Inferred k",
             "num_speculative_tokens (k) as the exporter infers it from the number of position labels of "
             "vllm:spec_decode_num_accepted_tokens_per_pos_total (vLLM does not export k itself).",
             "none", [q(f"max by (upstream) ({K})", "{{upstream}}")], graph=False),
        stat("Effective k",
             f"Draft tokens per draft over {W}: how many tokens the proposer really drafted per verify step. "
             "ngram drafts fewer than k when the prompt has no long enough match.",
             "short", [q(f"sum({DRAFT_TOKENS}) / sum({DRAFTS})", "draft tokens per draft")], decimals=2),
        stat("Live speedup at the current k",
             f"specwatch_speedup at the server's k over the exporter's {cfg.exporter_window} window, with the ends of its "
             "95 % interval (specwatch_speedup_lower / _upper) and its basis: measured = the live decode speed (vLLM's "
             "ITL histogram) against a baseline server's; calibrated = the live step against the cost profile's relative "
             "cost c = t / t0. Empty without a cost profile or baseline. Speculation pays when the lower end is above 1 "
             "and loses when the upper end is below 1.",
             "none", [q(LIVE_SPEEDUP, "value · " + BY_UE + " · {{basis}}"),
                      q(LIVE_LOWER, "lower · " + BY_UE + " · {{basis}}"),
                      q(LIVE_UPPER, "upper · " + BY_UE + " · {{basis}}")],
             thresholds=SPEEDUP, decimals=2, w=8, graph=False),
        stat("Running requests", "Requests in vLLM's running batch (vllm:num_requests_running), summed.",
             "none", [q(f"sum({RUNNING})", "running")]),
        stat("Waiting requests", "Requests queued in vLLM, waiting for a batch slot (vllm:num_requests_waiting), summed.",
             "none", [q(f"sum({WAITING})", "waiting")], thresholds=QUEUE),
        stat("KV-cache usage",
             "Fraction of the KV cache in use (vllm:kv_cache_usage_perc, 0-1), highest over the selected "
             "instances and engines. Near 1, requests wait or are preempted.",
             "percentunit", [q(f"max({KV})", "KV cache")], thresholds=KV_CACHE, minimum=0, maximum=1),
        stat("Load generator: running cell",
             "The cell the load generator (specwatch bench) is running now: role, workload and concurrency "
             "(specwatch_bench_active == 1). Empty when no load generator runs.",
             "none", [q(f"max by (role, workload, concurrency) ({'specwatch_bench_active' + S.bench()} == 1)",
                        "{{role}} · {{workload}} · concurrency {{concurrency}}")],
             w=8, graph=False, text_mode="name"),
        stat("Load generator: in-flight requests",
             "Requests the load generator has sent and not yet finished (specwatch_bench_in_flight_requests).",
             "none", [q(f"sum by (role) (specwatch_bench_in_flight_requests{S.bench()})", "{{role}}")]),
        stat("Upstreams up",
             "specwatch_up: 1 if the exporter's last fetch and parse of the upstream's /metrics worked.",
             "none", [q(f"specwatch_up{S.exporter_self()}", "{{upstream}}")], thresholds=UP, graph=False),
        stat("Spec decode enabled",
             "specwatch_spec_decode_enabled: 1 if the upstream exports speculative-decoding metrics, 0 if "
             "it runs without speculation.",
             "none", [q(f"specwatch_spec_decode_enabled{S.exporter_self()}", "{{upstream}}")],
             thresholds=UP, graph=False),
        stat("Method and drafter",
             "specwatch_speculative_method_info: the speculative method and drafter of each upstream and where they "
             "come from (source=upstream_flag: the upstream's own ,method=/,drafter= options of the exporter's --upstream; "
             "source=flag: the exporter-wide --speculative-method/--drafter; source=server_info: the server's own dev-mode "
             "/server_info, read with ,server_info=on). vLLM's /metrics and /v1/models publish neither. Empty when the "
             "exporter was not told.",
             "none", [q(f"specwatch_speculative_method_info{S.exporter_self()}",
                        "{{upstream}}: {{method}} {{drafter}} ({{source}})")],
             w=8, graph=False, text_mode="name"),
    ])

    acceptance = Section("Acceptance", [
        timeseries("Draft acceptance rate by model",
                   f"Accepted / proposed draft tokens over {W} per model (recorded series "
                   f"{S.ratio('model_name', 'specwatch_draft_acceptance_rate')}).",
                   "percentunit", [q(S.model_ratio("specwatch_draft_acceptance_rate"), "{{model_name}}")],
                   minimum=0, maximum=1),
        timeseries("Mean acceptance length by model",
                   f"1 + accepted tokens / drafts over {W} per model: tokens per verify step, bonus included.",
                   "short", [q(S.model_ratio("specwatch_mean_acceptance_length"), "{{model_name}}")], minimum=1),
        timeseries("Draft acceptance rate by upstream and engine",
                   f"Accepted / proposed draft tokens over {W} per upstream (vLLM server) and engine "
                   "(data-parallel rank).",
                   "percentunit", [q(S.up_ratio("specwatch_draft_acceptance_rate"), BY_UE)], minimum=0, maximum=1),
        timeseries("Mean acceptance length and its ceiling (k + 1)",
                   f"Mean acceptance length over {W} per upstream and engine, beside k + 1, the most a verify "
                   "step can emit. The gap is what rejected drafts cost.",
                   "short", [q(S.up_ratio("specwatch_mean_acceptance_length"), BY_UE),
                             q(f"max by (upstream, engine) ({K}) + 1", "ceiling k+1 · {{upstream}} · engine {{engine}}")],
                   minimum=1),
        timeseries("Per-position acceptance rate (unconditional)",
                   f"r_i = drafts whose first i+1 draft tokens were all accepted / drafts, over {W} "
                   "(vllm:spec_decode_num_accepted_tokens_per_pos_total{position=i} / num_drafts). "
                   "Non-increasing in the position. basis=lower_bound when drafts were ragged (shorter than k): "
                   "undrafted positions then count as rejected.",
                   "percentunit", [q(S.up_ratio("specwatch_position_acceptance_rate"),
                                     "position {{position}} · {{upstream}} · engine {{engine}} · {{basis}}")],
                   minimum=0, maximum=1),
        timeseries("Conditional per-position acceptance rate",
                   f"P(position i accepted | positions before i accepted) = r_i / r_(i-1), r_(-1) = 1, over {W}. "
                   "vLLM does not export it; a drop at one position shows where drafts go wrong.",
                   "percentunit", [q(S.up_ratio("specwatch_position_conditional_acceptance_rate"),
                                     "position {{position}} · {{upstream}} · engine {{engine}} · {{basis}}")],
                   minimum=0, maximum=1),
        bargauge("What-if: expected acceptance length for every k",
                 f"Expected mean acceptance length had num_speculative_tokens been k: E(k) = 1 + sum of r_i for "
                 f"i < k, over {W} (exact for chain drafters such as ngram, draft models, EAGLE chains). "
                 "Only k up to the running k can be computed.",
                 "short", [q(S.up_ratio("specwatch_expected_acceptance_length"),
                             "k={{k}} · {{upstream}} · engine {{engine}} · {{basis}}", instant=True)],
                 minimum=1, decimals=2),
        timeseries("Live speedup at the current k over time",
                   f"specwatch_speedup at the server's k (basis measured or calibrated) over the exporter's "
                   f"{cfg.exporter_window} window, with the ends of its 95 % interval dashed. The line at 1 is break-even.",
                   "none", [q(LIVE_SPEEDUP, "value · " + BY_UE + " · {{basis}}"),
                            q(LIVE_LOWER, "lower · " + BY_UE + " · {{basis}}"),
                            q(LIVE_UPPER, "upper · " + BY_UE + " · {{basis}}")],
                   thresholds=SPEEDUP, show_thresholds=True, decimals=2, dashed="^(lower|upper) · "),
    ])

    token_flow = Section("Token flow", [
        timeseries("Token flow: proposed, accepted, rejected",
                   f"Draft tokens per second over {W}: proposed by the drafter, accepted by the target model, "
                   "rejected (proposed - accepted).",
                   "cps", [q(f"sum by (upstream) ({DRAFT_TOKENS})", "proposed · {{upstream}}"),
                           q(f"sum by (upstream) ({ACCEPTED})", "accepted · {{upstream}}"),
                           q(f"sum by (upstream) ({REJECTED})", "rejected · {{upstream}}")]),
        timeseries("Drafts per second",
                   f"Verify steps that carried draft tokens, per second over {W}.",
                   "cps", [q(f"sum by (upstream, engine) ({DRAFTS})", BY_UE)]),
        timeseries("Effective k vs inferred k",
                   f"Draft tokens per draft over {W} (effective k) beside the configured k the exporter infers. "
                   "An effective k well below k means the proposer often finds nothing to propose.",
                   "short", [q(S.up_ratio("specwatch_draft_tokens_per_draft"), "effective · " + BY_UE),
                             q(K, "inferred k · " + BY_UE)], minimum=0),
        timeseries("Output from drafts over time",
                   f"Share of output tokens that were accepted draft tokens, over {W}.",
                   "percentunit", [q(S.up_ratio("specwatch_output_from_drafts_ratio"), BY_UE)],
                   minimum=0, maximum=1),
    ])

    ITL = "vllm_inter_token_latency_seconds"
    TPOT = "vllm_request_time_per_output_token_seconds"
    latency = Section("Latency", [
        timeseries("Inter-token latency (per engine step)",
                   f"vllm:inter_token_latency_seconds per instance and engine over {W}: p50, p95, p99 and mean. It is measured per engine "
                   "step, so it rises with k even when throughput improves: compare TPOT across k instead.",
                   "s", [q(S.vllm_inst_quantile(ITL, 0.5), "p50 · " + BY_IE),
                         q(S.vllm_inst_quantile(ITL, 0.95), "p95 · " + BY_IE),
                         q(S.vllm_inst_quantile(ITL, 0.99), "p99 · " + BY_IE),
                         q(S.vllm_inst_mean(ITL), "mean · " + BY_IE)], minimum=0),
        timeseries("Per-token TPOT vs ITL",
                   f"vllm:request_time_per_output_token_seconds (per request: decode time / output tokens; the one "
                   f"to compare across k) beside the per-step inter-token latency, over {W}. With speculation, "
                   "TPOT below ITL means verify steps emit more than one token.",
                   "s", [q(S.vllm_inst_mean(TPOT), "TPOT mean · " + BY_IE),
                         q(S.vllm_inst_quantile(TPOT, 0.95), "TPOT p95 · " + BY_IE),
                         q(S.vllm_inst_mean(ITL), "ITL mean · " + BY_IE),
                         q(S.vllm_inst_quantile(ITL, 0.95), "ITL p95 · " + BY_IE)], minimum=0),
        timeseries("Time to first token",
                   "vllm:time_to_first_token_seconds: p50 and p95 over $__rate_interval.",
                   "s", [q("histogram_quantile(0.5, sum by (le, model_name) "
                           f"(rate(vllm:time_to_first_token_seconds_bucket{S.vllm()}[$__rate_interval])))",
                           "p50 · {{model_name}}"),
                         q("histogram_quantile(0.95, sum by (le, model_name) "
                           f"(rate(vllm:time_to_first_token_seconds_bucket{S.vllm()}[$__rate_interval])))",
                           "p95 · {{model_name}}")], minimum=0),
        timeseries("Output throughput (server side)",
                   "All output tokens per second, accepted drafts and bonus tokens included "
                   "(rate of vllm:generation_tokens_total over $__rate_interval).",
                   "cps", [q(f"sum by (model_name) (rate(vllm:generation_tokens_total{S.vllm()}[$__rate_interval]))",
                             "{{model_name}}")], minimum=0),
    ])

    load = Section("Load", [
        timeseries("Running and waiting requests",
                   "vLLM's running batch (vllm:num_requests_running, recorded per instance and engine) and its "
                   "queue (vllm:num_requests_waiting). The cost of a verify step grows with the batch.",
                   "none", [q(f"sum by (instance, engine) ({RUNNING})", "running · {{instance}} · engine {{engine}}"),
                            q(f"sum by (instance, engine) ({WAITING})", "waiting · {{instance}} · engine {{engine}}")],
                   minimum=0),
        timeseries("KV-cache usage by instance and engine",
                   "vllm:kv_cache_usage_perc (0-1) per instance and engine.",
                   "percentunit", [q(KV, "{{instance}} · engine {{engine}}")], minimum=0, maximum=1,
                   thresholds=KV_CACHE, show_thresholds=True),
        timeseries("Load generator: in-flight requests by role",
                   "specwatch_bench_in_flight_requests: requests in flight from the load generator, baseline or "
                   "speculative server. Empty when no load generator runs.",
                   "none", [q(f"sum by (role) (specwatch_bench_in_flight_requests{S.bench()})", "{{role}}")], minimum=0),
        timeseries("Load generator: workload and concurrency",
                   "The load generator's running cell over time (specwatch_bench_active == 1); the series name "
                   "gives role, workload and concurrency. Empty when no load generator runs.",
                   "none", [q(f"max by (role, workload, concurrency) (specwatch_bench_active{S.bench()} == 1)",
                              "{{role}} · {{workload}} · concurrency {{concurrency}}")], bars=True, minimum=0),
    ])

    SGL_RANK = S.exporter_self(MODEL_NAME)
    sglang = Section("SGLang upstreams (schema sglang; empty for vLLM)", [
        timeseries("SGLang: mean acceptance length by model",
                   f"Tokens per verify step, bonus included, over {W} per model, from SGLang's request-finish counters: "
                   "(increase(sglang:generation_tokens_total) - increase(sglang:num_requests_total)) / "
                   "increase(sglang:spec_verify_calls_total), numerators and denominators summed over ranks and instances "
                   f"before dividing (recorded series {S.ratio('model_name', 'specwatch_sglang_mean_acceptance_length')}). "
                   "Counts finished requests only, so it lags long generations. Empty for vLLM upstreams; SGLang exports no "
                   "per-position counters, so no what-if, speedup or recommended k exists for it (specwatch_not_derivable).",
                   "short", [q(S.model_ratio("specwatch_sglang_mean_acceptance_length"), "{{model_name}}")], minimum=1),
        timeseries("SGLang: spec_accept_rate gauge (per rank)",
                   "SGLang's gauge sglang:spec_accept_rate passed through per scheduler rank (specwatch_sglang_spec_accept_rate): "
                   "accepted draft tokens / (verify steps x the configured draft width) of the last logged batch. Caveats: "
                   "its denominator is the configured width, so it is wrong under adaptive speculation (the width varies); it "
                   "is a most-recent value, so it cannot be windowed, averaged over time or summed across ranks and "
                   "instances. Prefer the mean acceptance length beside it. Empty for vLLM upstreams.",
                   "percentunit", [q(f"specwatch_sglang_spec_accept_rate{SGL_RANK}", "{{upstream}} · {{model_name}} · rank {{rank}}")],
                   minimum=0, maximum=1),
    ])

    health = Section("Exporter health", [
        timeseries("Upstream up and spec decode enabled",
                   "specwatch_up (the last fetch and parse of the upstream's /metrics worked) and "
                   "specwatch_spec_decode_enabled (the upstream exports speculative-decoding metrics).",
                   "none", [q(f"specwatch_up{S.exporter_self()}", "up · {{upstream}}"),
                            q(f"specwatch_spec_decode_enabled{S.exporter_self()}", "spec decode · {{upstream}}")],
                   minimum=0, maximum=1, w=8),
        timeseries("Exporter fetch duration",
                   "specwatch_scrape_duration_seconds: time to fetch and parse the upstream's /metrics.",
                   "s", [q(f"specwatch_scrape_duration_seconds{S.exporter_self()}", "{{upstream}}")], minimum=0, w=8),
        timeseries("Invariant violations",
                   "Scrapes per second whose counters broke a vLLM invariant (per-position sum = accepted, "
                   "non-increasing per position, accepted <= draft tokens <= drafts x k); derived values are "
                   "withheld then. 0 on a healthy vLLM.",
                   "cps", [q("sum by (upstream, invariant) (rate(specwatch_invariant_violations_total"
                             f"{S.exporter_self()}[$__rate_interval]))", "{{upstream}} · {{invariant}}")],
                   minimum=0, w=8, thresholds=NEUTRAL),
    ])

    return dashboard(
        uid="specwatch-spec-decode",
        title="specwatch / Speculative decoding",
        description="Speculative decoding on vLLM: acceptance, per-position and conditional acceptance, what-if "
                    "per k, estimated speedup, latency and load. Generated by dashboards/generate.py; do not edit.",
        sections=[overview, acceptance, token_flow, latency, load, sglang, health],
        templates=variables(cfg),
    )
