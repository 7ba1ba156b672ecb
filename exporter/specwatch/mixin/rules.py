"""Recording rules of the specwatch mixin, built from one MixinConfig.

Every spec-decode rule is built on the exporter's *normalized* counters (specwatch_drafts_total,
specwatch_draft_tokens_total, specwatch_accepted_tokens_total,
specwatch_accepted_tokens_per_position_total{position}, specwatch_generation_tokens_total), which
the exporter writes for vLLM V1, vLLM 0.8.3-0.8.4 and llama.cpp alike, so the rules hold for every
engine it supports. Ratios are ratios of sums: numerator and denominator are summed over the
level's labels first, then divided (never an average of per-engine ratios). A ratio whose
denominator is zero is absent (``/ (denominator > 0)``), as in the exporter.

Formulas (over the rate window, Δ = increase of the counter; see docs/metrics.md):
  draft acceptance rate        = Δaccepted / Δdraft_tokens
  mean acceptance length       = 1 + Δaccepted / Δdrafts
  per-position rate r_i        = Δper_pos[i] / Δdrafts
  conditional rate at i        = r_i / r_{i-1}  (r_{-1} = 1)
  expected acceptance length   = 1 + Σ_{i<k'} r_i for each k' = 1..max_k, only where position k'-1 exists
  output from drafts           = Δaccepted / Δgeneration_tokens
  draft tokens per draft       = Δdraft_tokens / Δdrafts  (effective k)
  missing draft tokens         = k × Δdrafts − Δdraft_tokens  (k = number of position series)
  ragged drafts                = 1 when missing > max(0.5 % × Δdrafts, 1 token per window), else 0
  The per-position rate (and the conditional and what-if rules built on it) carries
  basis="exact" when the window's drafts were full, basis="lower_bound" when they were ragged
  (specwatch.specdecode.ragged; the exporter labels its own series the same way).
  (speedup, its 95 % interval, the verdict, the recommended k and the cost-profile drift are the
  exporter's: specwatch_speedup{,_lower,_upper}{k,basis}, specwatch_speculation_verdict,
  specwatch_cost_profile_error_ratio{basis}; one series per upstream, engine, window and k, so no
  rule aggregates them: see docs/mixin.md and docs/architecture.md)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specwatch.common.params import parse_duration
from specwatch.mixin.config import INSTANCE_ENGINE, LEVEL_LABELS, MODEL, UPSTREAM_ENGINE, MixinConfig
from specwatch.specdecode.ragged import RAGGED_ABSOLUTE_TOLERANCE, RAGGED_RELATIVE_TOLERANCE

# The exporter's normalized counters (names as the exporter serves them, see docs/metrics.md).
DRAFTS = "specwatch_drafts_total"
DRAFT_TOKENS = "specwatch_draft_tokens_total"
ACCEPTED = "specwatch_accepted_tokens_total"
PER_POSITION = "specwatch_accepted_tokens_per_position_total"
GENERATION = "specwatch_generation_tokens_total"
# vLLM's own metrics, scraped directly by the vllm job.
VLLM_RUNNING = "vllm:num_requests_running"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_TPOT = "vllm:request_time_per_output_token_seconds"
VLLM_ITL = "vllm:inter_token_latency_seconds"
VLLM_SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_STEPS = "vllm:iteration_tokens_total"
VLLM_GENERATION = "vllm:generation_tokens_total"
VLLM_TTFT = "vllm:time_to_first_token_seconds"


@dataclass(frozen=True)
class RecordingRule:
    """One Prometheus recording rule; ``comment`` is written as a YAML comment line above it."""

    record: str
    expr: str
    comment: str
    labels: tuple[tuple[str, str], ...] = field(default=())

    def as_dict(self) -> dict:
        """The rule as Prometheus' rule-file mapping (record, expr[, labels])."""
        out: dict = {"record": self.record, "expr": self.expr}
        if self.labels:
            out["labels"] = dict(self.labels)
        return out


@dataclass(frozen=True)
class RuleGroup:
    """A rule group; rules of one group are evaluated in order, so later rules may use earlier ones."""

    name: str
    rules: tuple
    comment: str = ""


def selector(matchers: str, *extra: str) -> str:
    """``{matchers, extra...}`` for a metric selector; ``matchers`` is a MixinConfig selector."""
    return "{" + ", ".join(m for m in (matchers, *extra) if m) + "}"


def _by(labels) -> str:
    return ", ".join(labels)


def spec_decode_rules(cfg: MixinConfig, level: str) -> tuple[RecordingRule, ...]:
    """The spec-decode recording rules of one level (MODEL or UPSTREAM_ENGINE), in evaluation order.

    Output labels: LEVEL_LABELS[level] (+ position, + k). Source: the exporter's normalized
    counters selected by cfg.exporter_selector.
    """
    if level not in (MODEL, UPSTREAM_ENGINE):
        raise ValueError(f"spec-decode rules exist for levels {MODEL!r} and {UPSTREAM_ENGINE!r}, not {level!r}")
    labels = LEVEL_LABELS[level]
    g = _by(labels)
    w = cfg.rate_window
    sel = selector(cfg.exporter_selector)

    def summed_rate(metric: str, extra_by: str = "") -> str:
        by = f"{g}, {extra_by}" if extra_by else g
        return f"sum by ({by}) (rate({metric}{sel}[{w}]))"

    drafts = cfg.rate_rule(level, "specwatch_drafts")
    draft_tokens = cfg.rate_rule(level, "specwatch_draft_tokens")
    accepted = cfg.rate_rule(level, "specwatch_accepted_tokens")
    rejected = cfg.rate_rule(level, "specwatch_rejected_tokens")
    acceptance = cfg.ratio_rule(level, "specwatch_draft_acceptance_rate")
    mean_len = cfg.ratio_rule(level, "specwatch_mean_acceptance_length")
    per_draft = cfg.ratio_rule(level, "specwatch_draft_tokens_per_draft")
    pos_rate = cfg.ratio_rule(level, "specwatch_position_acceptance_rate")
    cond_rate = cfg.ratio_rule(level, "specwatch_position_conditional_acceptance_rate")
    expected = cfg.ratio_rule(level, "specwatch_expected_acceptance_length")
    from_drafts = cfg.ratio_rule(level, "specwatch_output_from_drafts_ratio")
    kmax = cfg.sum_rule(level, "specwatch_num_speculative_tokens").removesuffix(":sum") + ":max"
    missing = cfg.rate_rule(level, "specwatch_missing_draft_tokens")
    ragged = cfg.ratio_rule(level, "specwatch_ragged_drafts")
    per_second_floor = RAGGED_ABSOLUTE_TOLERANCE / parse_duration(w)  # one token per window, per second
    pos_expr = f"{summed_rate(PER_POSITION, 'position')}\n/ ignoring (position) group_left ()\n({drafts} > 0)"
    who = "per model" if level == MODEL else "per upstream and engine"

    rules: list[RecordingRule] = [
        RecordingRule(drafts, summed_rate(DRAFTS),
                      f"Drafts (verify steps carrying draft tokens) per second, {who}."),
        RecordingRule(draft_tokens, summed_rate(DRAFT_TOKENS),
                      f"Draft tokens proposed per second, {who} (token flow: proposed)."),
        RecordingRule(accepted, summed_rate(ACCEPTED),
                      f"Draft tokens accepted per second, {who} (token flow: accepted)."),
        RecordingRule(rejected, f"{draft_tokens} - {accepted}",
                      f"Draft tokens rejected per second = proposed - accepted, {who} (token flow: rejected)."),
        RecordingRule(acceptance, f"{accepted} / ({draft_tokens} > 0)",
                      f"Draft acceptance rate = Δaccepted / Δdraft_tokens (0-1), {who}; absent without drafts."),
        RecordingRule(mean_len, f"1 + {accepted} / ({drafts} > 0)",
                      f"Mean acceptance length = 1 + Δaccepted / Δdrafts (tokens per verify step, bonus included), {who}."),
        RecordingRule(per_draft, f"{draft_tokens} / ({drafts} > 0)",
                      f"Draft tokens per draft = Δdraft_tokens / Δdrafts: the effective k, {who}."),
        RecordingRule(kmax, f"max by ({g}) (count without (position) ({PER_POSITION}{sel}))",
                      f"k (num_speculative_tokens; the maximum under dynamic k): the number of position series, {who}."),
        RecordingRule(missing, f"{kmax} * {drafts} - {draft_tokens}",
                      f"Draft positions never drafted per second = k × Δdrafts − Δdraft_tokens, {who} "
                      "(> 0 when drafts were shorter than k: dynamic k, short ngram matches, clipped drafts)."),
        RecordingRule(
            ragged,
            f"({missing} > bool clamp_min({RAGGED_RELATIVE_TOLERANCE:g} * {drafts}, {per_second_floor:.6g}))\n"
            f"and\n({drafts} > 0)",
            f"1 when the window's drafts were ragged (missing draft tokens > max({RAGGED_RELATIVE_TOLERANCE:.1%} of drafts, "
            f"one token per {w})), else 0, {who}: the per-position rules are then lower bounds."),
        RecordingRule(
            pos_rate,
            f'label_replace(\n({pos_expr})\nand ignoring (position) ({ragged} == 0),\n"basis", "exact", "", "")\nor\n'
            f'label_replace(\n({pos_expr})\nand ignoring (position) ({ragged} == 1),\n"basis", "lower_bound", "", "")',
            f"Per-position acceptance rate r_i = Δper_pos[i] / Δdrafts (P(positions 0..i all accepted)), {who}; "
            "basis=exact when the drafts were full, lower_bound when ragged (undrafted positions count as rejected)."),
        RecordingRule(
            from_drafts,
            f"{accepted}\n/\n({summed_rate(GENERATION)} > 0)",
            f"Share of output tokens that were accepted drafts = Δaccepted / Δgeneration_tokens, {who}."),
    ]
    # Conditional per-position rate: r_0 at position 0, r_i / r_(i-1) above. PromQL has no label
    # arithmetic, so one rule per position (positions 0..max_k-1). The static position label
    # repeats the series' own; it keeps the rules distinct for promtool's duplicate-rule lint.
    rules.append(RecordingRule(
        cond_rate, f'{pos_rate}{{position="0"}}',
        f"Conditional acceptance rate at position 0 = r_0 (r_-1 = 1), {who}.",
        labels=(("position", "0"),)))
    for i in range(1, cfg.max_k):
        rules.append(RecordingRule(
            cond_rate,
            f'{pos_rate}{{position="{i}"}}\n/ ignoring (position) group_left ()\n'
            f'({pos_rate}{{position="{i - 1}"}} > 0)',
            f"Conditional acceptance rate at position {i} = r_{i} / r_{i - 1} "
            f"(P(accepted at {i} | accepted up to {i - 1})), {who}.",
            labels=(("position", str(i)),)))
    # What-if for every smaller k': E(k') = 1 + Σ_{i<k'} r_i, only where position k'-1 exists.
    for k in range(1, cfg.max_k + 1):
        positions = "|".join(str(i) for i in range(k))
        rules.append(RecordingRule(
            expected,
            f'1 + sum without (position) ({pos_rate}{{position=~"{positions}"}})\n'
            f'and ignoring (position)\n{pos_rate}{{position="{k - 1}"}}',
            f"Expected acceptance length if k were {k}: 1 + Σ r_i for i < {k} "
            f"(exact for chain drafters), {who}; only where k >= {k}.",
            labels=(("k", str(k)),)))
    return tuple(rules)


def _indent(text: str, n: int) -> str:
    return "\n".join(" " * n + line if line else line for line in text.splitlines())


def vllm_rules(cfg: MixinConfig, level: str) -> tuple[RecordingRule, ...]:
    """Rules on vLLM's own /metrics (job cfg.vllm_selector) for MODEL or INSTANCE_ENGINE.

    Per-token TPOT from the vllm:request_time_per_output_token_seconds histogram (per request,
    per token: the one to compare across k), inter-token latency (per engine step), running and
    waiting requests. Histogram means and quantiles are absent when no request finished in the window.
    """
    if level not in (MODEL, INSTANCE_ENGINE):
        raise ValueError(f"vLLM rules exist for levels {MODEL!r} and {INSTANCE_ENGINE!r}, not {level!r}")
    g = _by(LEVEL_LABELS[level])
    w = cfg.rate_window
    sel = selector(cfg.vllm_selector)
    who = "per model" if level == MODEL else "per instance and engine"
    rules: list[RecordingRule] = []
    for metric, short, quantiles, what in (
        (VLLM_TPOT, "vllm_request_time_per_output_token_seconds", (0.5, 0.95),
         "Per-request time per output token (TPOT)"),
        (VLLM_ITL, "vllm_inter_token_latency_seconds", (0.5, 0.95, 0.99),
         "Inter-token latency (per engine step; rises with k even when throughput improves)"),
    ):
        count = f"sum by ({g}) (rate({metric}_count{sel}[{w}]))"
        rules.append(RecordingRule(
            cfg.mean_rule(level, short),
            f"sum by ({g}) (rate({metric}_sum{sel}[{w}]))\n/\n({count} > 0)",
            f"{what}, mean in seconds = Δ{metric}_sum / Δ{metric}_count, {who}."))
        for q in quantiles:
            rules.append(RecordingRule(
                cfg.quantile_rule(level, short, q),
                f"histogram_quantile({q}, sum by ({g}, le) (rate({metric}_bucket{sel}[{w}])))\n"
                f"and\n({count} > 0)",
                f"{what}, p{round(q * 100)} in seconds (histogram_quantile over the {w} bucket rates), {who}."))
    # Step time from vLLM's own histograms (specwatch.specdecode.steptime has the same formulas).
    itl_count = f"sum by ({g}) (rate({VLLM_ITL}_count{sel}[{w}]))"
    rules.append(RecordingRule(
        cfg.ratio_rule(level, "vllm_running_requests_per_step"),
        f"{itl_count}\n/\n(sum by ({g}) (rate({VLLM_STEPS}_count{sel}[{w}])) > 0)",
        f"Running requests per engine step b = Δ{VLLM_ITL}_count / Δ{VLLM_STEPS}_count "
        f"(step-weighted: idle time does not dilute it), {who}."))
    rules.append(RecordingRule(
        cfg.ratio_rule(level, "vllm_request_decode_tokens_per_second"),
        f"(\n  sum by ({g}) (rate({VLLM_GENERATION}{sel}[{w}]))\n  - sum by ({g}) (rate({VLLM_TTFT}_count{sel}[{w}]))\n)\n"
        f"/\n(sum by ({g}) (rate({VLLM_ITL}_sum{sel}[{w}])) > 0)",
        f"Decode speed of a running request, tokens/s = Δ(generation tokens - first tokens) / Δ{VLLM_ITL}_sum "
        f"(steps without a draft count too: the speed users feel), {who}."))
    for metric, short, what in ((VLLM_RUNNING, "vllm_num_requests_running", "Running requests"),
                                (VLLM_WAITING, "vllm_num_requests_waiting", "Waiting (queued) requests")):
        rules.append(RecordingRule(cfg.sum_rule(level, short), f"sum by ({g}) ({metric}{sel})",
                                   f"{what} now, summed {who}."))
    return tuple(rules)


def sglang_rules(cfg: MixinConfig) -> tuple[RecordingRule, ...]:
    """SGLang's mean acceptance length per model from the exporter's copies of its request-finish
    counters, summed over instances before dividing:
    (Σ rate(generation_tokens) − Σ rate(finished_requests)) / Σ rate(verify_calls)."""
    g = _by(LEVEL_LABELS[MODEL])
    w = cfg.rate_window
    sel = selector(cfg.exporter_selector)

    def summed(metric: str) -> str:
        return f"sum by ({g}) (rate({metric}{sel}[{w}]))"

    gen, fin, ver = (summed(m) for m in ("specwatch_sglang_generation_tokens_total", "specwatch_sglang_finished_requests_total",
                                         "specwatch_sglang_verify_calls_total"))
    return (RecordingRule(cfg.ratio_rule(MODEL, "specwatch_sglang_mean_acceptance_length"),
                          f"({gen} - {fin})\n/ ({ver} > 0)",
                          "SGLang mean acceptance length = (Δgeneration_tokens − Δfinished_requests) / Δverify_calls "
                          "(tokens per verify step, bonus included), per model, summed over instances before dividing."),)


def rule_groups(cfg: MixinConfig) -> tuple[RuleGroup, ...]:
    """All recording-rule groups, in the order written to prometheus/rules/specwatch-rules.yml."""
    return (
        RuleGroup("specwatch-spec-decode.model_name", spec_decode_rules(cfg, MODEL),
                  "Spec-decode rates and ratios per model, from the exporter's normalized counters."),
        RuleGroup("specwatch-spec-decode.upstream_engine", spec_decode_rules(cfg, UPSTREAM_ENGINE),
                  "The same per upstream (vLLM server) and engine."),
        RuleGroup("specwatch-vllm.model_name", vllm_rules(cfg, MODEL),
                  "Latency and load from vLLM's own /metrics, per model."),
        RuleGroup("specwatch-vllm.instance_engine", vllm_rules(cfg, INSTANCE_ENGINE),
                  "Latency and load from vLLM's own /metrics, per instance and engine."),
        RuleGroup("specwatch-sglang.model_name", sglang_rules(cfg),
                  "SGLang upstreams (schema sglang): mean acceptance length from request-finish counters, per model."),
    )
