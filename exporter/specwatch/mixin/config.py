"""The ONE configuration source of the specwatch monitoring mixin.

Recording rules (rules.py), alerts (alerts.py), the Prometheus configurations (generate.py), the
Kubernetes objects (kubernetes.py) and the Grafana dashboards (the repository's
``dashboards/*.dashboard.py``, each a ``build(cfg)``, loaded and rendered by dashboards.py) are
made in one run of ``python -m specwatch.mixin.generate`` from one in-memory MixinConfig: their
selectors, rate window, scrape interval and thresholds all come from it. (Cost figures come from
the exporter's cost profile, never from here: see specwatch.specdecode.costprofile.) Nothing else
spells ``job="..."`` or a window.

Recorded series names follow ``level:metric:operations`` and the window suffix follows
``rate_window`` (``ratio_rate5m`` for the default 5m); use the helpers below instead of spelling
names, e.g. ``cfg.ratio_rule(MODEL, "specwatch_draft_acceptance_rate")``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from specwatch.common.params import parse_duration

# Aggregation levels of the recording rules: level name -> the labels kept by `sum by (...)`.
MODEL = "model_name"
UPSTREAM_ENGINE = "upstream_engine"
INSTANCE_ENGINE = "instance_engine"
LEVEL_LABELS: dict[str, tuple[str, ...]] = {
    MODEL: ("job", "model_name"),
    UPSTREAM_ENGINE: ("job", "upstream", "model_name", "engine"),
    INSTANCE_ENGINE: ("job", "instance", "model_name", "engine"),
}

# Bases of the exporter's specwatch_speedup* series (specwatch.specdecode.costprofile): the server's
# current k carries one of CURRENT_K_BASES (measured: against a baseline server's live decode
# speed; calibrated: its live step against the profile's relative cost c = t / t0), every other k
# profile, extrapolated or default. specwatch_cost_profile_error_ratio carries DRIFT_MEASURED_BASIS
# where the profile measured the live k (extrapolated where it was interpolated or extrapolated).
CURRENT_K_BASES: tuple[str, ...] = ("measured", "calibrated")
DRIFT_MEASURED_BASIS = "profile"
# Reasons of specwatch_recommendation_withheld (the exporter's), as the dashboards describe them. An
# uncertain pick is no longer withheld (issue #36): it is served with specwatch_recommendation_certain 0.
WITHHELD_REASONS: tuple[str, ...] = ("no_cost_curve", "default_contradicted", "insufficient_data")

_SELECTOR_RE = re.compile(r'^\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*'
                          r'(,\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*)*$')


@dataclass(frozen=True)
class MixinConfig:
    """Selectors, windows, thresholds and the cost model for rules, alerts and dashboards.

    Selectors are PromQL label-matcher lists without braces (``'job="vllm"'``). Durations are
    Prometheus durations (``"5m"``). Raises ValueError from __post_init__ on an invalid value,
    naming the field.
    """

    # --- selectors (the Prometheus jobs of prometheus/prometheus.yml) ---
    vllm_selector: str = 'job="vllm"'            # vLLM's own /metrics
    exporter_selector: str = 'job="specwatch"'   # `specwatch serve`
    bench_selector: str = 'job="specwatch-bench"'  # `specwatch bench --metrics-port`
    # --- windows ---
    rate_window: str = "5m"        # every rate()/ratio rule; names end in rate5m / mean5m / p95_5m
    scrape_interval: str = "15s"   # Prometheus scrape and rule-evaluation interval
    max_k: int = 16                # expected-acceptance-length rules for k = 1..max_k, conditional rates for positions < max_k
    # --- the exporter's window that the speedup and cost-profile alerts read (a --window of specwatch serve) ---
    exporter_window: str = "5m"
    # --- SpecwatchSpeculationNetNegative (on the exporter's specwatch_speedup_upper at the server's
    # current k, basis measured or calibrated: the upper end of the speedup's 95 % interval) ---
    net_negative_speedup_threshold: float = 1.0   # fire when the interval's upper end < this ("loses")
    net_negative_min_drafts_per_second: float = 0.1  # ...and there is traffic (drafts/s per engine)
    net_negative_for: str = "15m"
    # --- SpecwatchCostProfileDrift (on the exporter's specwatch_cost_profile_error_ratio{basis="profile"}:
    # only where the profile measured the live k; an interpolated or extrapolated drift never fires) ---
    cost_profile_error_tolerance: float = 0.25    # fire when live step time / profile is off by more than this
    cost_profile_drift_for: str = "15m"
    # --- SpecwatchAcceptanceCollapsed ---
    acceptance_collapse_ratio: float = 0.5        # current rate < ratio × rate over the history window
    acceptance_history_window: str = "6h"         # history = rate over this window, ending rate_window ago
    acceptance_collapse_min_history_rate: float = 0.1  # ignore engines whose history is already below this
    acceptance_collapse_min_draft_tokens_per_second: float = 1.0  # only with traffic
    acceptance_collapse_for: str = "10m"
    # --- SpecwatchUpstreamDown / SpecwatchSpecDecodeMetricsMissing / SpecwatchExporterDown ---
    upstream_down_for: str = "2m"
    # "down" means it was up within this lookback: a configured server that never ran (the
    # baseline outside its compose profile, the embedded default's idle server) is not an outage
    upstream_down_lookback: str = "24h"
    spec_decode_lookback: str = "1h"   # "stopped exporting": enabled within this lookback, 0 now
    spec_decode_missing_for: str = "5m"
    exporter_down_for: str = "2m"
    # --- SpecwatchInvariantViolations ---
    invariant_window: str = "10m"
    invariant_for: str = "1m"
    # --- runbook ---
    runbook_url: str = "https://github.com/specwatch/specwatch/blob/main/prometheus/runbook.md"
    # free-form labels added to every alert (e.g. {"team": "inference"})
    extra_alert_labels: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("vllm_selector", "exporter_selector", "bench_selector"):
            value = getattr(self, name)
            if not isinstance(value, str) or not _SELECTOR_RE.match(value):
                raise ValueError(f"{name} must be label matchers like 'job=\"vllm\"', got {value!r}")
        durations = {}
        for name in ("rate_window", "scrape_interval", "net_negative_for", "exporter_window", "cost_profile_drift_for",
                     "acceptance_history_window", "acceptance_collapse_for", "upstream_down_for", "upstream_down_lookback",
                     "spec_decode_lookback", "spec_decode_missing_for", "exporter_down_for", "invariant_window", "invariant_for"):
            try:
                durations[name] = parse_duration(getattr(self, name))
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        if durations["scrape_interval"] <= 0:
            raise ValueError("scrape_interval must be > 0")
        if durations["rate_window"] < 4 * durations["scrape_interval"]:
            raise ValueError(
                f"rate_window {self.rate_window} must be at least 4 × scrape_interval "
                f"{self.scrape_interval} so that rate() always sees several samples")
        if durations["acceptance_history_window"] <= durations["rate_window"]:
            raise ValueError("acceptance_history_window must be longer than rate_window")
        if durations["invariant_window"] < 2 * durations["scrape_interval"]:
            raise ValueError("invariant_window must be at least 2 × scrape_interval")
        if not isinstance(self.max_k, int) or isinstance(self.max_k, bool) or not 1 <= self.max_k <= 64:
            raise ValueError(f"max_k must be an integer in 1..64, got {self.max_k!r}")
        for name in ("net_negative_speedup_threshold", "net_negative_min_drafts_per_second", "cost_profile_error_tolerance",
                     "acceptance_collapse_min_history_rate",
                     "acceptance_collapse_min_draft_tokens_per_second"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if not 0 < self.acceptance_collapse_ratio < 1:
            raise ValueError(f"acceptance_collapse_ratio must be in (0, 1), got {self.acceptance_collapse_ratio!r}")
        if not self.runbook_url or "#" in self.runbook_url:
            raise ValueError("runbook_url must be the runbook's URL without an #anchor")

    # ----- names of recorded series -----
    @property
    def window_suffix(self) -> str:
        """The rate window as it appears in rule names: ``"5m"``."""
        return self.rate_window

    def rate_rule(self, level: str, metric: str) -> str:
        """``level:metric:rate5m`` (a per-second rate summed over the level's labels)."""
        return f"{_level(level)}:{metric}:rate{self.window_suffix}"

    def ratio_rule(self, level: str, metric: str) -> str:
        """``level:metric:ratio_rate5m`` (a ratio of summed rates)."""
        return f"{_level(level)}:{metric}:ratio_rate{self.window_suffix}"

    def mean_rule(self, level: str, metric: str) -> str:
        """``level:metric:mean5m`` (histogram mean: rate(_sum) / rate(_count))."""
        return f"{_level(level)}:{metric}:mean{self.window_suffix}"

    def quantile_rule(self, level: str, metric: str, quantile: float) -> str:
        """``level:metric:p95_5m`` for quantile 0.95 (histogram_quantile over rate(_bucket))."""
        pct = round(quantile * 100)
        if not 0 < pct < 100 or abs(pct - quantile * 100) > 1e-9:
            raise ValueError(f"quantile must be a whole percentage in (0, 1), got {quantile!r}")
        return f"{_level(level)}:{metric}:p{pct}_{self.window_suffix}"

    def sum_rule(self, level: str, metric: str) -> str:
        """``level:metric:sum`` (a gauge summed over the level's labels)."""
        return f"{_level(level)}:{metric}:sum"

    def alert_labels(self) -> dict[str, str]:
        """The extra labels added to every alert, as a dict."""
        return dict(self.extra_alert_labels)

    def runbook_anchor_url(self, alert_name: str) -> str:
        """The runbook URL of one alert: ``<runbook_url>#<alertname lower-cased>``.

        The anchor is what GitHub and most Markdown renderers derive from a ``## AlertName`` heading.
        """
        return f"{self.runbook_url}#{alert_name.lower()}"


def _level(level: str) -> str:
    if level not in LEVEL_LABELS:
        raise ValueError(f"unknown aggregation level {level!r}; one of {sorted(LEVEL_LABELS)}")
    return level


DEFAULT_CONFIG = MixinConfig()


def load_config(path: Path | None) -> MixinConfig:
    """MixinConfig from a YAML mapping of field names (None: defaults).

    Raises ValueError naming the file and the bad key/value."""
    if path is None:
        return MixinConfig()
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of MixinConfig fields")
    names = {f.name for f in dataclasses.fields(MixinConfig)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{path}: unknown MixinConfig field(s) {unknown}; known: {sorted(names)}")
    if "extra_alert_labels" in data and isinstance(data["extra_alert_labels"], dict):
        data["extra_alert_labels"] = tuple(sorted((str(k), str(v)) for k, v in data["extra_alert_labels"].items()))
    try:
        return MixinConfig(**data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None


def job_name(selector: str) -> str:
    """The job name of a ``job="name"`` selector; ValueError for any other selector (the scrape
    config can only be generated when the selectors are plain job matchers)."""
    key, _, value = selector.partition("=")
    if key.strip() != "job" or not (value.startswith('"') and value.endswith('"')) or "," in value:
        raise ValueError(f"cannot derive a scrape job from selector {selector!r}; expected job=\"NAME\"")
    return value[1:-1]
