"""specwatch / Choosing k: speedup with its 95 % interval and basis (measured, calibrated, profile,
extrapolated, default), the verdict (pays / loses / cannot tell), step time against the cost
profile and its drift, per-position acceptance (bars by position and over time), the expected
acceptance length and speedup per k, acceptance by workload (when the load generator labels it)
and the recommended k or why it is withheld.

Data: the specwatch exporter's windowed gauges (window label, variable ``$window``) and advice
gauges, its recording rules (prometheus/rules/), and the load generator (specwatch bench).
"""

from specwatch.mixin.config import DRIFT_MEASURED_BASIS, MixinConfig

from .lib import (
    DRIFT_BAND, RATIO_GOOD_HIGH, SPEEDUP, VERDICT, VERDICT_MAPPINGS, WINDOW, WORKLOAD, Section, Sel, bargauge, dashboard,
    q, stat, timeseries, variables,
)


def build(cfg: MixinConfig):
    """The Choosing k dashboard for ``cfg``, a grafanalib Dashboard.

    Selectors, windows and thresholds come from ``cfg``: the same MixinConfig the recording rules
    and alerts are generated from (``python -m specwatch.mixin.generate --config``)."""
    S = Sel(cfg)
    W = cfg.rate_window

    K = f"specwatch_num_speculative_tokens{S.exporter()}"
    SPEEDUP_K = f"specwatch_speedup{S.exporter(WINDOW)}"
    LOWER_K = f"specwatch_speedup_lower{S.exporter(WINDOW)}"
    UPPER_K = f"specwatch_speedup_upper{S.exporter(WINDOW)}"
    DRIFT = f"specwatch_cost_profile_error_ratio{S.exporter(WINDOW)}"
    STEP = f"specwatch_step_duration_seconds{S.exporter(WINDOW)}"
    PREDICTED = f"specwatch_cost_profile_predicted_step_duration_seconds{S.exporter(WINDOW)}"
    RUNNING_PER_STEP = f"specwatch_running_requests_per_step{S.exporter(WINDOW)}"
    BASIS_LEGEND = "{{upstream}} · engine {{engine}} · basis {{basis}}"
    SPEEDUP_LEGEND = "k={{k}} · {{basis}} · {{upstream}} · engine {{engine}}"
    # the interval's ends are drawn dashed (their legends start with lower / upper)
    INTERVAL_ENDS = "^(lower|upper) · "
    # The profile's own step times are exporter-wide (no upstream/model/engine labels).
    PROFILE_SEL = "{" + cfg.exporter_selector + ', job=~"$job", instance=~"$instance"}'
    RECOMMENDED = f"specwatch_recommended_num_speculative_tokens{S.exporter(WINDOW)}"
    BY_UE = "{{upstream}} · engine {{engine}}"
    POS_LEGEND = "position {{position}} · {{upstream}} · engine {{engine}} · {{basis}}"
    K_LEGEND = "k={{k}} · {{upstream}} · engine {{engine}} · {{basis}}"
    WITHHELD = f"specwatch_recommendation_withheld{S.exporter(WINDOW)}"
    CERTAIN = f"specwatch_recommendation_certain{S.exporter(WINDOW)}"
    RAGGED = f"specwatch_ragged_drafts{S.exporter(WINDOW)}"
    MISSING = f"specwatch_missing_draft_tokens_ratio{S.exporter(WINDOW)}"
    BASIS_NOTE = (" Legends carry basis: exact when every draft carried k tokens, lower_bound when drafts were "
                  "ragged (dynamic k, short ngram matches, drafts clipped at the end of an output): undrafted positions "
                  "then count as rejected, so the value is only a lower bound.")
    # count_values turns the inferred k (a value) into a label k, to pick the speedup at the current k.
    CURRENT_K_AS_LABEL = f'count_values without () ("k", {K})'

    def at_current_k(series: str) -> str:
        """``series`` (labels upstream, model_name, engine, k, ...) at the server's current k only."""
        return f"{series} and on (upstream, model_name, engine, k) {CURRENT_K_AS_LABEL}"

    # The verdict as one number per (upstream, engine, window, basis): 1 pays, 0 cannot tell, -1 loses
    # (VERDICT_MAPPINGS turns it back into words); one query, so the stat always has its one series.
    VERDICT_NUMBER = " or ".join(
        f"{factor}specwatch_speculation_verdict{S.exporter(WINDOW, matcher)}"
        for factor, matcher in (("", 'verdict="pays"'), ("0 * ", 'verdict="cannot_tell"'), ("-1 * ", 'verdict="loses"')))
    WITHHELD_NOTE = (
        " Withheld (specwatch_recommendation_withheld{reason}) with reason no_cost_curve: the profile has no curve for "
        "this method and drafter; "
        "default_contradicted: no profile applies and the built-in guess contradicts the live speedup; "
        "insufficient_data: too few steps or drafts in the window for an interval.")

    recommendation = Section("Does speculation pay? (with how sure, and how each number was obtained)", [
        stat("Speedup at the current k",
             "specwatch_speedup at the server's k over the exporter window $window, with the ends of its 95 % interval "
             "(specwatch_speedup_lower, specwatch_speedup_upper) and its basis: measured = the server's live decode speed "
             "against a baseline server's (--baseline-upstream); calibrated = the server's live step against the cost "
             "profile's relative cost c = t / t0 (no baseline); default = no cost profile, a built-in guess. "
             "Below 1, speculation costs throughput; it is only known to when the upper end is below 1.",
             "none", [q(at_current_k(SPEEDUP_K), "value · " + BASIS_LEGEND),
                      q(at_current_k(LOWER_K), "lower · " + BASIS_LEGEND),
                      q(at_current_k(UPPER_K), "upper · " + BASIS_LEGEND)],
             thresholds=SPEEDUP, decimals=2, w=6, graph=False),
        stat("Does speculation pay at the current k?",
             "specwatch_speculation_verdict over the exporter window $window: pays when the lower end of the current "
             "k's 95 % speedup interval is above 1, loses when its upper end is below 1 (SpecwatchSpeculationNetNegative "
             "fires after a while), cannot tell when the interval holds 1. The legend names the basis of the interval.",
             "none", [q(VERDICT_NUMBER, BASIS_LEGEND)], thresholds=VERDICT, mappings=VERDICT_MAPPINGS,
             graph=False, color_mode="background", text_mode="value_and_name", w=5),
        stat("Recommended k",
             "specwatch_recommended_num_speculative_tokens over the exporter window $window: the k with the best "
             "speedup estimate (ties within 2 % go to the smaller k; docs/choosing-k.md), 0 = turn speculation off "
             "(always when no draft token was accepted in the window); its basis is the weaker of the pick's and its "
             "runner-up's. It is served with how sure it is: certain (specwatch_recommendation_certain 1) when the "
             "95 % interval of pick / runner-up (specwatch_recommendation_over_runner_up) lies above 1, else "
             "the better estimate only (more traffic, a baseline upstream or a profile calibrated on this server "
             "narrows it)." + WITHHELD_NOTE,
             "none", [q(RECOMMENDED, BASIS_LEGEND), q(WITHHELD, "withheld: {{reason}} · " + BY_UE),
                      q(CERTAIN, "certain (1) or not (0) · " + BY_UE)], graph=False, w=5),
        stat("Cost-profile drift",
             "specwatch_cost_profile_error_ratio over $window: the live step time / the cost profile's prediction at "
             "the live running requests per step, drafted tokens per step and context. basis " + DRIFT_MEASURED_BASIS + ": a k the "
             "profile measured (SpecwatchCostProfileDrift reads only these); basis extrapolated: the k or b was interpolated "
             "or extrapolated between the profile's points. Outside 0.8-1.25 the profile does not describe this "
             "server (the speedup intervals widen): recalibrate (specwatch calibrate). Empty without a cost profile.",
             "none", [q(DRIFT, BASIS_LEGEND)], thresholds=DRIFT_BAND, decimals=2, w=4),
        stat("Current k (inferred)",
             "num_speculative_tokens the server runs with, inferred from the position labels of "
             "vllm:spec_decode_num_accepted_tokens_per_pos_total.",
             "none", [q(K, BY_UE)], graph=False, w=4),
        timeseries("Speedup at the current k over time (95 % interval)",
                   "specwatch_speedup at the server's k over the exporter window $window (basis measured, calibrated, or "
                   "default without a profile), with the ends of its 95 % interval dashed. The line at 1 is break-even.",
                   "none", [q(at_current_k(SPEEDUP_K), "value · " + SPEEDUP_LEGEND),
                            q(at_current_k(LOWER_K), "lower · " + SPEEDUP_LEGEND),
                            q(at_current_k(UPPER_K), "upper · " + SPEEDUP_LEGEND)],
                   thresholds=SPEEDUP, show_thresholds=True, decimals=2, dashed=INTERVAL_ENDS),
        timeseries("Step time: live against the cost profile",
                   "specwatch_step_duration_seconds (live: Δ ITL sum / Δ ITL count over $window, drafter, verify, "
                   "sampling and scheduling inside) beside specwatch_cost_profile_predicted_step_duration_seconds (the "
                   "profile's t(b, k) at the same live running requests per step b and k).",
                   "s", [q(STEP, "live · " + BY_UE), q(PREDICTED, "profile · " + BY_UE)], minimum=0),
        timeseries("Running requests per step (live b)",
                   "specwatch_running_requests_per_step over $window: Δ ITL count / Δ iteration count, the batch a decode step "
                   "served; the b at which the profile's step times are read.",
                   "short", [q(RUNNING_PER_STEP, BY_UE)], minimum=0),
        bargauge("Cost profile: step time by running requests",
                 "specwatch_cost_profile_step_seconds: the profile's measured step times (plain, k = 0, and per k) at "
                 "each running-request count it was calibrated at; the live points above are read against this curve.",
                 "s", [q(f"specwatch_cost_profile_step_seconds{PROFILE_SEL}",
                         "k={{k}} · b={{running_requests}} · {{method}} · {{workload}}", instant=True)], minimum=0),
    ])

    positions = Section("Per-position acceptance", [
        timeseries("Ragged drafts (curves are lower bounds)",
                   "specwatch_ragged_drafts over the exporter window $window: 1 when drafts carried fewer than k tokens "
                   "beyond rounding (k x drafts - draft tokens > max(1, 0.5 % of drafts)), and the share of draft "
                   "positions never drafted. While 1, per-position, conditional and what-if values are lower bounds: "
                   "the undrafted share widens the what-if speedups' intervals, and a k is still recommended when the "
                   "choice is the same across them." + BASIS_NOTE,
                   "percentunit", [q(RAGGED, "ragged · " + BY_UE), q(MISSING, "undrafted share · " + BY_UE)],
                   minimum=0, maximum=1),
        bargauge("Per-position acceptance rate by position",
                 f"r_i = P(the first i+1 draft tokens are all accepted), one bar per position, over {W} "
                 "(vllm:spec_decode_num_accepted_tokens_per_pos_total / vllm:spec_decode_num_drafts_total). "
                 "Non-increasing in the position." + BASIS_NOTE,
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
        bargauge("Speedup per k (with basis)",
                 "specwatch_speedup per k over the exporter window $window: the current k live (basis measured against "
                 "a baseline server, or calibrated against the profile's relative cost), every other k from E(k) on the "
                 "per-position curve over the cost profile's relative step cost at k (basis profile, extrapolated "
                 "outside its range, default without a profile). Red below 1; the 95 % interval of each is in the "
                 "time series below.",
                 "none", [q(SPEEDUP_K, "k={{k}} · {{basis}} · {{upstream}} · engine {{engine}}", instant=True)],
                 thresholds=SPEEDUP, decimals=2, minimum=0),
        timeseries("Expected acceptance length per k over time",
                   f"E(k) per k over {W}, as a time series.",
                   "short", [q(S.up_ratio("specwatch_expected_acceptance_length"), K_LEGEND)], minimum=1),
        timeseries("Speedup per k over time (with basis and 95 % interval)",
                   "specwatch_speedup per k over the exporter window $window, with the ends of its 95 % interval "
                   "(specwatch_speedup_lower, specwatch_speedup_upper) dashed; the legend names each k and basis. The line "
                   "at 1 is break-even.",
                   "none", [q(SPEEDUP_K, "value · " + SPEEDUP_LEGEND), q(LOWER_K, "lower · " + SPEEDUP_LEGEND),
                            q(UPPER_K, "upper · " + SPEEDUP_LEGEND)], thresholds=SPEEDUP,
                   show_thresholds=True, dashed=INTERVAL_ENDS),
        timeseries("Recommended k over time",
                   "specwatch_recommended_num_speculative_tokens over time beside the current k: the advice moves "
                   "with the workload and the batch size. Gaps are windows where it was withheld (see Recommended k).",
                   "none", [q(RECOMMENDED, "recommended · " + BY_UE), q(K, "current · " + BY_UE)], minimum=0),
        timeseries("Running requests",
                   "vllm:num_requests_running: a larger batch makes each draft token dearer (the cost profile's "
                   "step times are read at the live running requests per step).",
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

    return dashboard(
        uid="specwatch-choosing-k",
        title="specwatch / Choosing k",
        description="Choosing num_speculative_tokens (k): speedup with its 95 % interval and basis, the verdict, step time "
                    "against the cost profile, per-position acceptance, what-if per k, recommended k, acceptance by workload. "
                    "Generated by dashboards/generate.py; do not edit.",
        sections=[recommendation, positions, what_if, by_workload],
        templates=variables(cfg, window=True, workload=True),
    )
