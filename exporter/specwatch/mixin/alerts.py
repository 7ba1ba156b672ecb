"""Alerting rules of the specwatch mixin, built from one MixinConfig.

Every alert has a ``for:``, a ``severity`` label (critical | warning), a static ``summary``, a
templated ``description`` (labels and value) and a ``runbook_url`` pointing at its anchor in
prometheus/runbook.md. Spec-decode alerts work per upstream (vLLM server) and engine, where the
action (change k, fix the draft, restart) is taken.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specwatch.mixin.config import CURRENT_K_BASES, DRIFT_MEASURED_BASIS, UPSTREAM_ENGINE, MixinConfig
from specwatch.mixin.rules import ACCEPTED, DRAFT_TOKENS, RuleGroup, selector

UE = "job, upstream, model_name, engine"
UPSTREAM = "job, instance, upstream"
NOT_V0 = 'schema!="v0"'  # V0 counters are never normalized, by design


@dataclass(frozen=True)
class AlertRule:
    """One Prometheus alerting rule; ``comment`` is written as a YAML comment line above it."""

    alert: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    comment: str
    extra_labels: tuple[tuple[str, str], ...] = field(default=())
    runbook_url: str = ""

    def as_dict(self) -> dict:
        """The alert as Prometheus' rule-file mapping (alert, expr, for, labels, annotations)."""
        return {
            "alert": self.alert,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity, **dict(self.extra_labels)},
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                "runbook_url": self.runbook_url,
            },
        }


def _quoted(value: str) -> str:
    """``value`` as a PromQL string literal (double quotes; ``"`` and ``\\`` escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def alert_rules(cfg: MixinConfig) -> tuple[AlertRule, ...]:
    """The seven Specwatch* alerts, in the order of prometheus/runbook.md."""
    w = cfg.rate_window
    exp = cfg.exporter_selector
    ew = cfg.exporter_window
    live = "|".join(CURRENT_K_BASES)
    in_window = f'window="{ew}"'
    # the upper end of the 95 % interval of the speedup at the server's current k (the only k with
    # basis measured or calibrated); max over exporter instances: every one must say "loses"
    upper = f"max by ({UE}) (specwatch_speedup_upper{selector(exp, 'basis=~' + _quoted(live), in_window)})"
    # drift only where the profile measured the live k (basis extrapolated: interpolated k or b)
    drift = f"specwatch_cost_profile_error_ratio{selector(exp, 'basis=' + _quoted(DRIFT_MEASURED_BASIS), in_window)}"
    drafts = cfg.rate_rule(UPSTREAM_ENGINE, "specwatch_drafts")
    draft_tokens = cfg.rate_rule(UPSTREAM_ENGINE, "specwatch_draft_tokens")
    acceptance = cfg.ratio_rule(UPSTREAM_ENGINE, "specwatch_draft_acceptance_rate")
    h = cfg.acceptance_history_window
    where = ("{{ $labels.upstream }} (model {{ $labels.model_name }}, engine {{ $labels.engine }})")

    history = (f"sum by ({UE}) (rate({ACCEPTED}{selector(exp)}[{h}] offset {w}))\n"
               f"    /\n"
               f"    (sum by ({UE}) (rate({DRAFT_TOKENS}{selector(exp)}[{h}] offset {w})) > 0)")

    alerts = [
        AlertRule(
            alert="SpecwatchSpeculationNetNegative",
            expr=(f"(\n  {upper} < {cfg.net_negative_speedup_threshold:g}\n)\n"
                  f"and on ({UE})\n({drafts} > {cfg.net_negative_min_drafts_per_second:g})"),
            for_=cfg.net_negative_for,
            severity="warning",
            summary="Speculative decoding loses throughput: even the upper end of the speedup's interval is below 1.",
            description=(
                f"On {where} the speedup of speculative decoding at the server's current k is at most "
                "{{ $value | printf \"%.2f\" }}x (the upper end of its 95 % interval, basis measured or calibrated, "
                f"exporter window {ew}), below {cfg.net_negative_speedup_threshold:g} for {cfg.net_negative_for} while drafting. "
                "Speculation is costing throughput at this load: lower num_speculative_tokens or turn it off."),
            comment=(f"Upper end of the speedup's 95 % interval at the current k (specwatch_speedup_upper{{basis=~\"{live}\"}}) "
                     f"< {cfg.net_negative_speedup_threshold:g} for {cfg.net_negative_for} while drafting: speculation loses."),
        ),
        AlertRule(
            alert="SpecwatchCostProfileDrift",
            expr=(f"{drift} > {1 + cfg.cost_profile_error_tolerance:g}\nor\n"
                  f"{drift} < {1 / (1 + cfg.cost_profile_error_tolerance):.6g}"),
            for_=cfg.cost_profile_drift_for,
            severity="warning",
            summary="Live step times no longer match the cost profile: recalibrate.",
            description=(
                f"On {where} the live step time is " + "{{ $value | printf \"%.2f\" }}" + " x what the cost "
                "profile measured at the live batch size, drafted tokens per step and context (exporter window "
                f"{ew}), off by more than {cfg.cost_profile_error_tolerance:.0%} for {cfg.cost_profile_drift_for}. "
                "New hardware, model, drafter, vLLM version or load? Calibrated and what-if speedups assume the "
                "profile's relative costs still hold, and their intervals widen with the drift: run specwatch "
                "calibrate on this server, or add a baseline upstream for a measured speedup."),
            comment=(f"specwatch_cost_profile_error_ratio{{basis=\"{DRIFT_MEASURED_BASIS}\"}} (a k and b the profile measured) "
                     f"outside [1/{1 + cfg.cost_profile_error_tolerance:g}, {1 + cfg.cost_profile_error_tolerance:g}] "
                     f"for {cfg.cost_profile_drift_for}."),
        ),
        AlertRule(
            alert="SpecwatchAcceptanceCollapsed",
            expr=(f"(\n  {acceptance}\n  / on ({UE})\n  (\n    (\n    {history}\n    )\n"
                  f"    >= {cfg.acceptance_collapse_min_history_rate:g}\n  )\n) < {cfg.acceptance_collapse_ratio:g}\n"
                  f"and on ({UE})\n({draft_tokens} > {cfg.acceptance_collapse_min_draft_tokens_per_second:g})"),
            for_=cfg.acceptance_collapse_for,
            severity="warning",
            summary="Draft acceptance rate collapsed against its own recent history.",
            description=(
                f"Draft acceptance rate on {where} over the last {w} is "
                "{{ $value | humanizePercentage }} of its rate over the previous " + h + " (alert below "
                f"{cfg.acceptance_collapse_ratio:.0%}), with traffic. The draft no longer matches the "
                "target (changed draft or target model, changed workload, broken prompt lookup)."),
            comment=(f"Acceptance over {w} < {cfg.acceptance_collapse_ratio:g} × acceptance over the "
                     f"previous {h}, with traffic."),
        ),
        AlertRule(
            alert="SpecwatchUpstreamDown",
            expr=(f"(\n  specwatch_up{selector(exp)} == 0\n  and on (job, instance, upstream)\n"
                  f"  max_over_time(specwatch_up{selector(exp)}[{cfg.upstream_down_lookback}]) == 1\n)\n"
                  f"or on (upstream)\n(\n  up{selector(cfg.vllm_selector)} == 0\n  and on (job, instance)\n"
                  f"  max_over_time(up{selector(cfg.vllm_selector)}[{cfg.upstream_down_lookback}]) == 1\n)"),
            for_=cfg.upstream_down_for,
            severity="critical",
            summary="A vLLM server's /metrics cannot be scraped.",
            description=(
                "{{ $labels.job }} on {{ $labels.instance }} cannot fetch /metrics of vLLM upstream "
                "{{ or $labels.upstream $labels.instance }} (up = {{ $value }}) for "
                f"{cfg.upstream_down_for}: the server is down, restarting or unreachable."),
            comment=(f"The exporter (specwatch_up) or Prometheus (up of the vllm job) cannot scrape a "
                     f"vLLM server for {cfg.upstream_down_for} that was up within {cfg.upstream_down_lookback}."),
        ),
        AlertRule(
            alert="SpecwatchSpecDecodeMetricsMissing",
            expr=(f"(\n  (\n    specwatch_spec_decode_enabled{selector(exp)} == 0\n    and on ({UPSTREAM})\n"
                  f"    max_over_time(specwatch_spec_decode_enabled{selector(exp)}[{cfg.spec_decode_lookback}]) == 1\n"
                  f"  )\n  or\n  (\n    specwatch_spec_decode_enabled{selector(exp)} == 1\n"
                  f"    and on ({UPSTREAM})\n    specwatch_upstream_info{selector(exp, NOT_V0)}\n"
                  f"    unless on ({UPSTREAM})\n    {DRAFT_TOKENS}{selector(exp)}\n  )\n)\n"
                  f"and on ({UPSTREAM})\nspecwatch_up{selector(exp)} == 1"),
            for_=cfg.spec_decode_missing_for,
            severity="warning",
            summary="A vLLM server stopped exporting speculative-decoding metrics.",
            description=(
                "vLLM upstream {{ $labels.upstream }} is up but specwatch gets no usable spec-decode "
                "counters from it (specwatch_spec_decode_enabled = {{ $value }}): either it exported "
                f"vllm:spec_decode_* within the last {cfg.spec_decode_lookback} and no longer does "
                "(restarted without --speculative-config?), or it says speculation is on but the "
                "exporter could not normalize its counters."),
            comment=(f"An up upstream that had spec-decode metrics in the last {cfg.spec_decode_lookback} "
                     "lost them, or reports them without normalized counters."),
        ),
        AlertRule(
            alert="SpecwatchExporterDown",
            expr=f"up{selector(exp)} == 0\nor\nabsent(up{selector(exp)})",
            for_=cfg.exporter_down_for,
            severity="critical",
            summary="The specwatch exporter cannot be scraped.",
            description=(
                "Prometheus cannot scrape the specwatch exporter {{ with $labels.instance }}{{ . }} (up = {{ $value }})"
                "{{ else }}(no target of " + exp.replace('"', "'") + " at all){{ end }} for "
                f"{cfg.exporter_down_for}: every spec-decode rule, alert and dashboard panel is blind."),
            comment=f"The exporter's scrape fails, or it has no target, for {cfg.exporter_down_for}.",
        ),
        AlertRule(
            alert="SpecwatchInvariantViolations",
            expr=(f"increase(specwatch_invariant_violations_total{selector(exp)}[{cfg.invariant_window}]) > 0\n"
                  f"or\n(\n  specwatch_invariant_violations_total{selector(exp)} > 0\n"
                  f"  unless\n  specwatch_invariant_violations_total{selector(exp)} offset {cfg.invariant_window}\n)"),
            for_=cfg.invariant_for,
            severity="warning",
            summary="vLLM's spec-decode counters break their invariants.",
            description=(
                "vLLM upstream {{ $labels.upstream }} broke the spec-decode invariant "
                "{{ $labels.invariant }}: specwatch_invariant_violations_total rose by "
                "{{ $value | printf \"%.0f\" }} in the last " + cfg.invariant_window + ". Its counters "
                "are inconsistent; specwatch serves no derived values for the affected model/engine "
                "while they are."),
            comment=(f"specwatch_invariant_violations_total grew in the last {cfg.invariant_window} "
                     "(or appeared with a positive value)."),
        ),
    ]
    labels = tuple(sorted(cfg.alert_labels().items()))
    return tuple(
        AlertRule(**{**a.__dict__, "extra_labels": labels, "runbook_url": cfg.runbook_anchor_url(a.alert)})
        for a in alerts
    )


def alert_groups(cfg: MixinConfig) -> tuple[RuleGroup, ...]:
    """The alert groups written to prometheus/rules/specwatch-alerts.yml."""
    return (RuleGroup("specwatch-alerts", alert_rules(cfg),
                      "Alerts on speculative decoding, its upstreams and the exporter."),)
