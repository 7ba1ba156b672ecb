"""Panel factories, template variables, selectors and the automatic grid of specwatch's dashboards.

Every ``dashboards/*.dashboard.py`` builds its panels with these factories, so that grafanalib's
defaults are overridden in one place:

- every panel and every query variable uses the ``datasource`` template variable
  (``{"type": "prometheus", "uid": "${datasource}"}``);
- every panel has a title, a description and a unit (``fieldConfig.defaults.unit``, a unit id
  from Grafana's list, e.g. ``percentunit`` for 0-1 ratios, ``s`` for seconds, ``cps`` for
  tokens or steps per second, ``short``/``none`` for plain numbers);
- queries select with the dashboard variables (``job=~"$job"``, ``instance=~"$instance"``, ...)
  added to the MixinConfig selectors (``specwatch.mixin.config``: ``job="vllm"`` etc.), and use
  ``$__rate_interval`` in every ``rate()``/``increase()``;
- recorded series from ``prometheus/rules/`` (names from MixinConfig's helpers) are preferred;
- the dashboard is uneditable, has a fixed uid, and its panels are placed by :func:`grid`.

Recorded series aggregated above the instance level (``model_name:*``, ``upstream_engine:*``)
carry no ``instance`` label; the queries on them cannot honour ``$instance``.
:func:`lint_exclusions` lists those targets in grafana/dashboard-linter's ``.lint`` format.

This directory is imported as one package (``specwatch.mixin.dashboards.load_package``): sources
use ``from .lib import ...``, and this module imports ``.promql``.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Iterable, Sequence

import attr
import grafanalib.core as G

from specwatch.mixin.config import (
    DEFAULT_CONFIG,
    INSTANCE_ENGINE,
    LEVEL_LABELS,
    MODEL,
    UPSTREAM_ENGINE,
    MixinConfig,
)

__all__ = [
    "DATASOURCE", "DRIFT_BAND", "GRID_WIDTH", "Mappings", "Sel", "Section", "Thresholds", "VERDICT", "VERDICT_MAPPINGS",
    "bargauge", "dashboard", "grid",
    "q", "stat", "timeseries", "variables", "lint_exclusions", "INSTANCELESS_LEVELS",
]

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24
SCHEMA_VERSION = 39  # Grafana 10.4 / 11; grafanalib's default (12) would trigger legacy migrations

# Recorded-series levels without an instance label (from the MixinConfig's LEVEL_LABELS).
INSTANCELESS_LEVELS = tuple(lvl for lvl, labels in LEVEL_LABELS.items() if "instance" not in labels)

_REGEX_META = set(".+*?()[]{}|^$\\")

# The matchers a query adds for each dashboard variable.
JOB = 'job=~"$job"'
INSTANCE = 'instance=~"$instance"'
MODEL_NAME = 'model_name=~"$model_name"'
ENGINE = 'engine=~"$engine"'
UPSTREAM = 'upstream=~"$upstream"'
WINDOW = 'window=~"$window"'
WORKLOAD = 'workload=~"$workload"'

INSTANCE_EXCLUSION_REASON = (
    "Recorded series aggregated above the instance level (levels {levels} of prometheus/rules, "
    "labels job, [upstream,] model_name[, engine]) have no instance label; filter them with "
    "$upstream / $model_name / $engine instead."
)


# ----------------------------------------------------------------------------------------------
# selectors
# ----------------------------------------------------------------------------------------------
def _braces(*parts: str) -> str:
    return "{" + ", ".join(p for p in parts if p) + "}"


@dataclass(frozen=True)
class Sel:
    """Label-matcher lists (``{...}``) and recorded-series names for one MixinConfig.

    Each method returns the braces of a selector; ``extra`` matchers are appended verbatim.
    """

    cfg: MixinConfig = DEFAULT_CONFIG

    # raw series ------------------------------------------------------------------------------
    def vllm(self, *extra: str) -> str:
        """vLLM's own series (``vllm:*``; labels job, instance, model_name, engine)."""
        return _braces(self.cfg.vllm_selector, JOB, INSTANCE, MODEL_NAME, ENGINE, *extra)

    def exporter(self, *extra: str) -> str:
        """The exporter's per-engine series (labels job, instance, upstream, model_name, engine)."""
        return _braces(self.cfg.exporter_selector, JOB, INSTANCE, UPSTREAM, MODEL_NAME, ENGINE, *extra)

    def exporter_self(self, *extra: str) -> str:
        """The exporter's self metrics (labels job, instance, upstream)."""
        return _braces(self.cfg.exporter_selector, JOB, INSTANCE, UPSTREAM, *extra)

    def bench(self, *extra: str) -> str:
        """The load generator's series (labels job, instance, role, workload, concurrency)."""
        return _braces(self.cfg.bench_selector, JOB, INSTANCE, *extra)

    # recorded series ---------------------------------------------------------------------------
    def by_model(self) -> str:
        """Recorded ``model_name:specwatch_*`` (labels job, model_name; job is the exporter's)."""
        return _braces(self.cfg.exporter_selector, JOB, MODEL_NAME)

    def by_upstream(self, *extra: str) -> str:
        """Recorded ``upstream_engine:specwatch_*`` (labels job, upstream, model_name, engine)."""
        return _braces(self.cfg.exporter_selector, JOB, UPSTREAM, MODEL_NAME, ENGINE, *extra)

    def vllm_by_model(self) -> str:
        """Recorded ``model_name:vllm_*`` (labels job, model_name; job is vLLM's)."""
        return _braces(self.cfg.vllm_selector, JOB, MODEL_NAME)

    def vllm_by_instance(self) -> str:
        """Recorded ``instance_engine:vllm_*`` (labels job, instance, model_name, engine)."""
        return _braces(self.cfg.vllm_selector, JOB, INSTANCE, MODEL_NAME, ENGINE)

    def ratio(self, level: str, metric: str) -> str:
        """Name of a ratio rule, e.g. ``upstream_engine:specwatch_draft_acceptance_rate:ratio_rate5m``."""
        return self.cfg.ratio_rule(level, metric)

    def rate(self, level: str, metric: str) -> str:
        """Name of a rate rule, e.g. ``upstream_engine:specwatch_drafts:rate5m``."""
        return self.cfg.rate_rule(level, metric)

    def up_ratio(self, metric: str, *extra: str) -> str:
        """``upstream_engine:<metric>:ratio_rate5m{job, upstream, model_name, engine}``."""
        return self.ratio(UPSTREAM_ENGINE, metric) + self.by_upstream(*extra)

    def up_rate(self, metric: str) -> str:
        """``upstream_engine:<metric>:rate5m{job, upstream, model_name, engine}``."""
        return self.rate(UPSTREAM_ENGINE, metric) + self.by_upstream()

    def model_ratio(self, metric: str) -> str:
        """``model_name:<metric>:ratio_rate5m{job, model_name}``."""
        return self.ratio(MODEL, metric) + self.by_model()

    def vllm_mean(self, metric: str) -> str:
        """``model_name:<metric>:mean5m{job, model_name}`` (histogram mean)."""
        return self.cfg.mean_rule(MODEL, metric) + self.vllm_by_model()

    def vllm_quantile(self, metric: str, quantile: float) -> str:
        """``model_name:<metric>:p95_5m{job, model_name}`` (histogram_quantile)."""
        return self.cfg.quantile_rule(MODEL, metric, quantile) + self.vllm_by_model()

    def vllm_inst_mean(self, metric: str) -> str:
        """``instance_engine:<metric>:mean5m{job, instance, model_name, engine}`` (histogram mean)."""
        return self.cfg.mean_rule(INSTANCE_ENGINE, metric) + self.vllm_by_instance()

    def vllm_inst_quantile(self, metric: str, quantile: float) -> str:
        """``instance_engine:<metric>:p95_5m{job, instance, model_name, engine}``."""
        return self.cfg.quantile_rule(INSTANCE_ENGINE, metric, quantile) + self.vllm_by_instance()

    def running_by_instance(self) -> str:
        """``instance_engine:vllm_num_requests_running:sum{job, instance, model_name, engine}``."""
        return self.cfg.sum_rule(INSTANCE_ENGINE, "vllm_num_requests_running") + self.vllm_by_instance()

    def waiting_by_instance(self) -> str:
        """``instance_engine:vllm_num_requests_waiting:sum{job, instance, model_name, engine}``."""
        return self.cfg.sum_rule(INSTANCE_ENGINE, "vllm_num_requests_waiting") + self.vllm_by_instance()


# ----------------------------------------------------------------------------------------------
# targets, thresholds, panels
# ----------------------------------------------------------------------------------------------
def q(expr: str, legend: str = "", *, instant: bool = False, table: bool = False) -> G.Target:
    """One Prometheus query (refId is assigned by the panel factory)."""
    return G.Target(
        expr=expr,
        legendFormat=legend,
        instant=instant,
        format="table" if table else "time_series",
        datasource=DATASOURCE,
        intervalFactor=1,
    )


Thresholds = Sequence[tuple[str, float | None]]
"""Threshold steps ``[(color, None), (color, from_value), ...]`` (the first step has no value)."""

NEUTRAL: Thresholds = (("green", None),)
RATIO_GOOD_HIGH: Thresholds = (("red", None), ("orange", 0.3), ("green", 0.6))
SPEEDUP: Thresholds = (("red", None), ("orange", 1.0), ("green", 1.1))
KV_CACHE: Thresholds = (("green", None), ("orange", 0.8), ("red", 0.95))
#: Cost-profile drift (live / predicted step time): green within 0.8-1.25, as SpecwatchCostProfileDrift.
DRIFT_BAND: Thresholds = (("red", None), ("green", 0.8), ("red", 1.25))
QUEUE: Thresholds = (("green", None), ("orange", 1), ("red", 10))
#: The verdict of a speedup's interval as a number: 1 pays (lower > 1), 0 cannot tell, -1 loses (upper < 1).
VERDICT: Thresholds = (("red", None), ("orange", 0), ("green", 1))
UP: Thresholds = (("red", None), ("green", 1))


def _steps(th: Thresholds) -> list[dict]:
    return [{"color": color, "value": value} for color, value in th]


def _with_refids(targets: Sequence[G.Target]) -> list[G.Target]:
    if not targets:
        raise ValueError("a panel needs at least one query")
    letters = string.ascii_uppercase
    return [attr.evolve(t, refId=letters[i]) for i, t in enumerate(targets)]


def _common(title: str, description: str, unit: str) -> None:
    if not title or not description or not unit:
        raise ValueError(f"panel {title!r}: title, description and unit are all required")


def _field_defaults(unit: str, thresholds: Thresholds, minimum, maximum, decimals) -> dict:
    defaults: dict = {"unit": unit, "thresholds": {"mode": "absolute", "steps": _steps(thresholds)}}
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    if decimals is not None:
        defaults["decimals"] = decimals
    return defaults


def timeseries(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[G.Target],
    *,
    w: int = 12,
    h: int = 8,
    minimum: float | None = None,
    maximum: float | None = None,
    decimals: int | None = None,
    thresholds: Thresholds = NEUTRAL,
    show_thresholds: bool = False,
    stack: bool = False,
    bars: bool = False,
    dashed: str | None = None,
) -> G.TimeSeries:
    """A time-series panel; ``unit`` is a Grafana unit id. Raises ValueError if a field is empty.

    ``dashed``: a regular expression on the series' display names (legends); those series are
    drawn as dashed lines without fill (e.g. the ends of an interval beside its value)."""
    _common(title, description, unit)
    return G.TimeSeries(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=_with_refids(targets),
        unit=unit,
        editable=False,
        gridPos=G.GridPos(h=h, w=w, x=0, y=0),
        drawStyle="bars" if bars else "line",
        fillOpacity=60 if bars else (25 if stack else 10),
        stacking={"mode": "normal", "group": "A"} if stack else {"mode": "none", "group": "A"},
        legendDisplayMode="table",
        legendCalcs=["lastNotNull", "mean", "max"],
        tooltipMode="multi",
        thresholdsStyleMode="line" if show_thresholds else "off",
        maxDataPoints=None,
        overrides=[] if dashed is None else [_dashed_override(dashed)],
        extraJson={"fieldConfig": {"defaults": _field_defaults(unit, thresholds, minimum, maximum, decimals)}},
    )


def _dashed_override(pattern: str) -> dict:
    re.compile(pattern)  # raises re.error on a bad pattern
    return {
        "matcher": {"id": "byRegexp", "options": pattern},
        "properties": [
            {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
            {"id": "custom.fillOpacity", "value": 0},
        ],
    }


Mappings = Sequence[tuple[float, str, str]]
"""Value mappings ``[(value, text, color), ...]``: a stat shows ``text`` in ``color`` for ``value``."""


#: The texts of VERDICT's numbers (specwatch_speculation_verdict's verdict label, spelled for people).
VERDICT_MAPPINGS: Mappings = ((1, "pays", "green"), (0, "cannot tell", "orange"), (-1, "loses", "red"))


def _mappings(mappings: Mappings) -> list[dict]:
    if not mappings:
        return []
    return [{"type": "value", "options": {
        f"{value:g}": {"text": text, "color": color, "index": i} for i, (value, text, color) in enumerate(mappings)}}]


def stat(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[G.Target],
    *,
    w: int = 4,
    h: int = 4,
    thresholds: Thresholds = NEUTRAL,
    decimals: int | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    text_mode: str = "auto",
    graph: bool = True,
    color_mode: str = "value",
    mappings: Mappings = (),
) -> G.Stat:
    """A stat tile showing the last value of each series (``mappings``: value -> text and colour)."""
    _common(title, description, unit)
    return G.Stat(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=_with_refids(targets),
        format=unit,
        editable=False,
        gridPos=G.GridPos(h=h, w=w, x=0, y=0),
        reduceCalc="lastNotNull",
        graphMode="area" if graph else "none",
        textMode=text_mode,
        colorMode=color_mode,
        decimals=decimals,
        noValue="no data",
        mappings=_mappings(mappings),
        maxDataPoints=None,
        extraJson={"fieldConfig": {"defaults": _field_defaults(unit, thresholds, minimum, maximum, decimals)}},
    )


@attr.s
class _BarGauge(G.Panel):
    """Grafana's current bar gauge (grafanalib's BarGauge emits the pre-7.0 ``fieldOptions``)."""

    orientation = attr.ib(default="horizontal")
    displayMode = attr.ib(default="gradient")
    calc = attr.ib(default="lastNotNull")

    def to_json_data(self):
        return self.panel_json(
            {
                "type": G.BARGAUGE_TYPE,
                "options": {
                    "displayMode": self.displayMode,
                    "orientation": self.orientation,
                    "showUnfilled": True,
                    "minVizHeight": 10,
                    "minVizWidth": 0,
                    "valueMode": "color",
                    "namePlacement": "auto",
                    "sizing": "auto",
                    "reduceOptions": {"calcs": [self.calc], "fields": "", "values": False},
                },
            }
        )


def bargauge(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[G.Target],
    *,
    w: int = 12,
    h: int = 8,
    minimum: float | None = None,
    maximum: float | None = None,
    decimals: int | None = None,
    thresholds: Thresholds = NEUTRAL,
    orientation: str = "horizontal",
    calc: str = "lastNotNull",
) -> _BarGauge:
    """A bar gauge: one bar per series (per position, per k, per workload...).

    ``calc`` reduces each series over the time range (``lastNotNull``: the latest value).
    """
    _common(title, description, unit)
    return _BarGauge(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=_with_refids(targets),
        editable=False,
        gridPos=G.GridPos(h=h, w=w, x=0, y=0),
        orientation=orientation,
        calc=calc,
        maxDataPoints=None,
        extraJson={"fieldConfig": {"defaults": _field_defaults(unit, thresholds, minimum, maximum, decimals)}},
    )


# ----------------------------------------------------------------------------------------------
# layout
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Section:
    """A titled row of panels; the panels flow left to right and wrap at 24 grid columns."""

    title: str
    panels: Sequence[G.Panel]
    collapsed: bool = False


def grid(sections: Iterable[Section]) -> list[G.Panel]:
    """Place panels: a row header per section, panels flowing left to right, wrapping at 24.

    Each panel's width and height come from its ``gridPos`` (set by the factories); x, y and ids
    are assigned here (ids 1, 2, ... in reading order). Raises ValueError if a panel is wider
    than the grid.
    """
    out: list[G.Panel] = []
    y = 0
    next_id = 1
    for section in sections:
        out.append(
            G.RowPanel(title=section.title, gridPos=G.GridPos(h=1, w=GRID_WIDTH, x=0, y=y), id=next_id,
                       collapsed=False, editable=False)
        )
        next_id += 1
        y += 1
        x = 0
        row_h = 0
        for panel in section.panels:
            w, h = panel.gridPos.w, panel.gridPos.h
            if w > GRID_WIDTH:
                raise ValueError(f"panel {panel.title!r} is {w} wide; the grid is {GRID_WIDTH}")
            if x + w > GRID_WIDTH:
                y += row_h
                x = 0
                row_h = 0
            out.append(attr.evolve(panel, gridPos=G.GridPos(h=h, w=w, x=x, y=y), id=next_id))
            next_id += 1
            x += w
            row_h = max(row_h, h)
        y += row_h
    return out


# ----------------------------------------------------------------------------------------------
# variables and the dashboard
# ----------------------------------------------------------------------------------------------
@attr.s
class _Var(G.Template):
    """grafanalib's Template, with the All option's current text shown as "All"."""

    def to_json_data(self):
        data = super().to_json_data()
        if data["current"].get("value") == "$__all":
            data["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
        return data


def _query_var(name: str, label: str, query: str, *, multi: bool = True) -> G.Template:
    tpl = _Var(
        name=name,
        label=label,
        query=query,
        dataSource=DATASOURCE,
        multi=multi,
        includeAll=multi,
        allValue=".+" if multi else None,
        default="$__all" if multi else None,
        refresh=G.REFRESH_ON_TIME_RANGE_CHANGE,
        sort=G.SORT_ALPHA_ASC,
        type="query",
    )
    return tpl


def _job_regex(cfg: MixinConfig) -> str:
    """An alternation of the jobs named by the config's selectors, for the job variable's query."""
    jobs = []
    for sel in (cfg.vllm_selector, cfg.exporter_selector, cfg.bench_selector):
        m = re.search(r'\bjob\s*(=~|=)\s*"((?:[^"\\]|\\.)*)"', sel)
        if not m:
            return ".+"  # a selector without a job matcher: offer every job
        value = m.group(2)
        if m.group(1) == "=":  # a literal: escape regex metacharacters (doubled: inside a PromQL string)
            value = "".join("\\\\" + c if c in _REGEX_META else c for c in value)
        jobs.append(value)
    return "|".join(jobs)


def variables(cfg: MixinConfig, *, upstream: bool = True, engine: bool = True, window: bool = False,
              workload: bool = False) -> list[G.Template]:
    """The template variables: datasource, job, instance, model_name, engine, upstream (+ extras).

    Query variables refresh on time-range change (refresh=2), use ``$datasource``, and (except
    ``window``) are multi-select with All = ``.+`` as grafana/dashboard-linter requires.
    """
    out = [
        G.Template(name="datasource", label="Data source", query="prometheus", type="datasource",
                   refresh=G.REFRESH_ON_DASHBOARD_LOAD, hide=0),
        _query_var("job", "Job", f'label_values(up{{job=~"{_job_regex(cfg)}"}}, job)'),
        _query_var("instance", "Instance", 'label_values(up{job=~"$job"}, instance)'),
        _query_var(
            "model_name", "Model",
            'label_values({__name__=~"vllm:num_requests_running|specwatch_generation_tokens_total", '
            'job=~"$job"}, model_name)',
        ),
    ]
    if engine:
        out.append(_query_var(
            "engine", "Engine",
            'label_values({__name__=~"vllm:num_requests_running|specwatch_generation_tokens_total", '
            'job=~"$job", model_name=~"$model_name"}, engine)',
        ))
    if upstream:
        out.append(_query_var("upstream", "Upstream", 'label_values(specwatch_up{job=~"$job"}, upstream)'))
    if window:
        out.append(_query_var(
            "window", "Exporter window",
            'label_values(specwatch_draft_acceptance_rate{job=~"$job", upstream=~"$upstream"}, window)',
            multi=False,
        ))
    if workload:
        out.append(_query_var("workload", "Workload", 'label_values(specwatch_bench_active{job=~"$job"}, workload)'))
    return out


def dashboard(
    *,
    uid: str,
    title: str,
    description: str,
    sections: Iterable[Section],
    templates: list[G.Template],
    tags: Sequence[str] = ("specwatch", "vllm", "speculative-decoding"),
    time_from: str = "now-1h",
    refresh: str = "30s",
) -> G.Dashboard:
    """A specwatch dashboard: fixed ``uid``, uneditable, shared crosshair, grid-placed panels."""
    if not uid or len(uid) > 40:
        raise ValueError(f"uid must be 1-40 characters, got {uid!r}")
    return G.Dashboard(
        title=title,
        uid=uid,
        description=description,
        editable=False,
        tags=list(tags),
        panels=grid(sections),
        templating=G.Templating(list=templates),
        time=G.Time(time_from, "now"),
        timezone="browser",
        refresh=refresh,
        schemaVersion=SCHEMA_VERSION,
        graphTooltip=G.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
        links=[
            G.DashboardLink(title="specwatch", type="dashboards", tags=["specwatch"], asDropdown=True,
                            includeVars=True, keepTime=True)
        ],
    )


def lint_exclusions(rendered: Sequence[dict], cfg: MixinConfig = DEFAULT_CONFIG) -> dict:
    """grafana/dashboard-linter ``.lint`` content for the generated dashboards.

    Excludes target-instance-rule for each panel whose queries select a recorded series of a
    level without an ``instance`` label (``INSTANCELESS_LEVELS``); shapes: ``{"exclusions":
    {"target-instance-rule": {"reason": str, "entries": [{"dashboard", "panel", "reason"}]}}}``.
    """
    from .promql import selectors  # dashboards/promql.py (sibling module)

    entries = []
    prefixes = tuple(f"{lvl}:" for lvl in INSTANCELESS_LEVELS)
    for dash in rendered:
        for panel in dash["panels"]:
            names = set()
            for target in panel.get("targets") or []:
                for s in selectors(target["expr"]):
                    if s.name and s.name.startswith(prefixes) and not s.matchers_for("instance"):
                        names.add(s.name)
            if names:
                entries.append({
                    "dashboard": dash["title"],
                    "panel": panel["title"],
                    "reason": "selects " + ", ".join(sorted(names)),
                })
    return {
        "exclusions": {
            "target-instance-rule": {
                "reason": INSTANCE_EXCLUSION_REASON.format(levels=", ".join(INSTANCELESS_LEVELS)),
                "entries": entries,
            }
        }
    }
