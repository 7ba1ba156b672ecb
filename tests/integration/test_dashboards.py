"""Offline checks of the generated Grafana dashboards (dashboards/generated/*.json).

- CI check: the JSON regenerated from dashboards/*.dashboard.py equals the committed JSON.
- grafana/dashboard-linter's rules, implemented here on the generated JSON (the linter itself is a
  Go binary we do not ship): template-datasource-rule, template-job-rule, template-instance-rule,
  template-label-promql-rule, template-on-time-change-reload-rule, panel-datasource-rule,
  panel-title-description-rule, panel-units-rule, panel-no-targets-rule, target-promql-rule
  (structure here, and promtool's PromQL parser; the live test runs every query on Prometheus),
  target-rate-interval-rule, target-job-rule, target-instance-rule, target-counter-agg-rule,
  uneditable-dashboard-rule. Rule semantics follow the linter's lint/rule_*.go; exclusions come
  from dashboards/generated/.lint (the linter's own configuration format) and each is checked to
  be justified. Each rule is also run on a deliberately broken copy (constructed, marked as such)
  to show it can fail.
- specwatch's own conventions: fixed uids, variables, grid without overlaps, unique titles,
  recorded series preferred, provisioning files consistent with MixinConfig and prometheus.yml.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specwatch.mixin.config import DEFAULT_CONFIG
from specwatch.mixin.dashboards import load_module, render_dashboards

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
GENERATED = DASHBOARDS / "generated"
SHIM = DASHBOARDS / "generate.py"

promql = load_module(DASHBOARDS, "promql")  # dashboards/promql.py, imported as the generator imports it

EXPECTED_UIDS = {
    "speculative-decoding.json": "specwatch-spec-decode",
    "choosing-k.json": "specwatch-choosing-k",
    "load-test.json": "specwatch-load-test",
}
REQUIRED_VARIABLES = ("datasource", "job", "instance", "model_name", "engine", "upstream")
DS_VARS = {"$datasource", "${datasource}"}

# grafana/dashboard-linter lint/rule_panel_units.go: Grafana's unit ids.
VALID_UNITS = set("""
none string short percent percentunit humidity dB hex0x hex sci locale pixel accMS2 accFS2 accG degree
radian grad arcmin arcsec areaM2 areaF2 areaMI2 flops mflops gflops tflops pflops eflops zflops yflops ppm
conppb conngm3 conngNm3 conμgm3 conμgNm3 conmgm3 conmgNm3 congm3 congNm3 conmgdL conmmolL currencyUSD
currencyGBP currencyEUR currencyJPY currencyRUB currencyUAH currencyBRL currencyDKK currencyISK currencyNOK
currencySEK currencyCZK currencyCHF currencyPLN currencyBTC currencymBTC currencyμBTC currencyZAR currencyINR
currencyKRW currencyIDR currencyPHP currencyVND bytes decbytes bits decbits kbytes deckbytes mbytes decmbytes
gbytes decgbytes tbytes dectbytes pbytes decpbytes pps binBps Bps binbps bps KiBs Kibits KBs Kbits MiBs
Mibits MBs Mbits GiBs Gibits GBs Gbits TiBs Tibits TBs Tbits PiBs Pibits PBs Pbits dateTimeAsIso
dateTimeAsIsoNoDateIfToday dateTimeAsUS dateTimeAsUSNoDateIfToday dateTimeAsLocal dateTimeAsLocalNoDateIfToday
dateTimeAsSystem dateTimeFromNow watt kwatt megwatt gwatt mwatt Wm2 voltamp kvoltamp voltampreact
kvoltampreact watth watthperkg kwatth kwattm amph kamph mamph joule ev amp kamp mamp volt kvolt mvolt dBm ohm
kohm Mohm farad µfarad nfarad pfarad ffarad henry mhenry µhenry lumens flowgpm flowcms flowcfs flowcfm litreh
flowlpm flowmlpm lux forceNm forcekNm forceN forcekN Hs KHs MHs GHs THs PHs EHs massmg massg masslb masskg
masst lengthmm lengthin lengthft lengthm lengthkm lengthmi pressurembar pressurebar pressurekbar pressurepa
pressurehpa pressurekpa pressurehg pressurepsi radbq radci radgy radrad radsv radmsv radusv radrem radexpckg
radr radsvh radmsvh radusvh rotrpm rothz rotrads rotdegs celsius fahrenheit kelvin hertz ns µs ms s m h d
dtdurationms dtdurations dthms dtdhms timeticks clockms clocks cps ops reqps rps wps iops cpm opm rpm wpm
velocityms velocitykmh velocitymph velocityknot mlitre litre m3 Nm3 dm3 gallons bool bool_yes_no bool_on_off
""".split())  # noqa: SIM905  the linter's unit list as one block, not 300 literals
LABEL_FUNCTIONS = ("label_names", "label_values", "metrics", "query_result")


# ------------------------------------------------------------------------------------------------
# fixtures
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return render_dashboards(DEFAULT_CONFIG, DASHBOARDS)


@pytest.fixture(scope="module")
def dashboards(rendered) -> dict[str, dict]:
    return {name: json.loads(text) for name, text in rendered.items() if name.endswith(".json")}


@pytest.fixture(scope="module")
def lint_config(rendered) -> dict:
    return yaml.safe_load(rendered[".lint"])


def panels(dash: dict) -> list[dict]:
    """Every panel that is not a row."""
    return [p for p in dash["panels"] if p["type"] != "row"]


def targets(dash: dict):
    for p in panels(dash):
        for idx, t in enumerate(p.get("targets") or []):
            yield p, idx, t


def query_variables(dash: dict) -> list[dict]:
    return [v for v in dash["templating"]["list"] if v["type"] == "query"]


def _ds_uid(ds) -> str | None:
    if isinstance(ds, dict):
        return ds.get("uid")
    return ds


def _excluded(config: dict, rule: str, dash: dict, panel: dict, idx: int) -> bool:
    """grafana/dashboard-linter's ConfigurationEntry.IsMatch (exact dashboard/panel titles, optional idx)."""
    rule_cfg = (config.get("exclusions") or {}).get(rule)
    if rule_cfg is None:
        return rule in (config.get("exclusions") or {})
    entries = rule_cfg.get("entries") or []
    if not entries:
        return True
    for e in entries:
        if e.get("dashboard") != dash["title"] or e.get("panel") != panel["title"]:
            continue
        tidx = str(e.get("targetIdx", e.get("targetidx", "")))
        if tidx == "" or int(tidx) == idx:
            return True
    return False


# ------------------------------------------------------------------------------------------------
# the rules (each returns a list of problems; [] = pass)
# ------------------------------------------------------------------------------------------------
def rule_template_datasource(d: dict) -> list[str]:
    ds = [v for v in d["templating"]["list"] if v["type"] == "datasource"]
    if not ds:
        return [f"{d['title']}: no templated data source"]
    out = []
    for v in ds:
        allowed_names = {f"{v['query'].lower()}_datasource"} | ({"datasource"} if len(ds) == 1 else set())
        allowed_labels = {f"{v['query'].title()} data source"} | ({"Data source"} if len(ds) == 1 else set())
        if v["name"] not in allowed_names:
            out.append(f"{d['title']}: datasource variable named {v['name']!r}")
        if v.get("label") not in allowed_labels:
            out.append(f"{d['title']}: datasource variable labelled {v.get('label')!r}")
    return out


def _check_template(d: dict, name: str) -> list[str]:
    """lint/template_utils.go checkTemplate."""
    t = next((v for v in d["templating"]["list"] if v["name"] == name), None)
    if t is None:
        return [f"{d['title']}: missing the {name} template"]
    out = []
    if _ds_uid(t.get("datasource")) not in DS_VARS:
        out.append(f"{name} template should use datasource '$datasource', is {t.get('datasource')!r}")
    if t["type"] != "query":
        out.append(f"{name} template should be a Prometheus query")
    if t.get("label") != name.title():
        out.append(f"{name} template should be labelled {name.title()!r}, is {t.get('label')!r}")
    if not t.get("multi"):
        out.append(f"{name} template should be a multi select")
    if t.get("allValue") != ".+":
        out.append(f"{name} template allValue should be '.+', is {t.get('allValue')!r}")
    return out


def _prometheus_dashboard(d: dict) -> bool:
    ds = next((v for v in d["templating"]["list"] if v["type"] == "datasource"), None)
    return ds is not None and ds["query"] == "prometheus"


def rule_template_job(d: dict) -> list[str]:
    return _check_template(d, "job") if _prometheus_dashboard(d) else []


def rule_template_instance(d: dict) -> list[str]:
    return _check_template(d, "instance") if _prometheus_dashboard(d) else []


def _split_label_query(query: str) -> tuple[str, str] | None:
    m = re.fullmatch(r"([a-z_]+)\((.+)\)", query.strip(), re.S)
    if not m:
        return None
    func, arg = m.group(1), m.group(2)
    if func == "label_values" and "," in arg:
        arg = arg[: arg.rindex(",")]  # the metric selector; the last argument is the label name
    return func, arg


def rule_template_label_promql(d: dict) -> list[str]:
    if not _prometheus_dashboard(d):
        return []
    out = []
    for v in query_variables(d):
        parts = _split_label_query(v["query"])
        if parts is None:
            out.append(f"template {v['name']}: invalid query {v['query']!r}")
            continue
        func, arg = parts
        if func not in LABEL_FUNCTIONS:
            out.append(f"template {v['name']}: invalid function {func!r}")
            continue
        try:
            if not promql.selectors(arg):
                out.append(f"template {v['name']}: {arg!r} selects nothing")
        except promql.PromQLSyntaxError as exc:
            out.append(f"template {v['name']}: {exc}")
    return out


def rule_template_on_time_change_reload(d: dict) -> list[str]:
    return [f"template {v['name']}: refresh is {v.get('refresh')}, should be 2"
            for v in query_variables(d) if v.get("refresh") != 2]


def rule_panel_datasource(d: dict) -> list[str]:
    ds_names = {f"${v['name']}" for v in d["templating"]["list"] if v["type"] == "datasource"}
    ds_names |= {f"${{{v['name']}}}" for v in d["templating"]["list"] if v["type"] == "datasource"}
    out = []
    for p in panels(d):
        if _ds_uid(p.get("datasource")) not in ds_names:
            out.append(f"panel {p['title']!r} uses datasource {p.get('datasource')!r}")
        for t in p.get("targets") or []:  # stricter than the linter: targets too
            if _ds_uid(t.get("datasource")) not in ds_names:
                out.append(f"panel {p['title']!r} target {t.get('refId')} uses datasource {t.get('datasource')!r}")
    return out


def rule_panel_title_description(d: dict) -> list[str]:
    return [f"panel id {p['id']}: title {p.get('title')!r}, description {p.get('description')!r}"
            for p in panels(d) if not p.get("title") or not p.get("description")]


def rule_panel_units(d: dict) -> list[str]:
    out = []
    for p in panels(d):
        fc = p.get("fieldConfig") or {}
        unit = ""
        for o in fc.get("overrides") or []:
            for prop in o.get("properties") or []:
                if prop.get("id") == "unit":
                    unit = prop.get("value")
        unit = unit or (fc.get("defaults") or {}).get("unit") or ""
        if unit not in VALID_UNITS:
            out.append(f"panel {p['title']!r}: no or invalid unit {unit!r}")
    return out


def rule_panel_no_targets(d: dict) -> list[str]:
    return [f"panel {p['title']!r} has no targets" for p in panels(d) if not p.get("targets")]


def rule_target_promql(d: dict) -> list[str]:
    out = []
    for p, idx, t in targets(d):
        expr = t.get("expr") or ""
        if not expr.strip():
            out.append(f"panel {p['title']!r} target {idx}: empty query")
            continue
        try:
            if not promql.selectors(expr):
                out.append(f"panel {p['title']!r} target {idx}: selects no series")
        except promql.PromQLSyntaxError as exc:
            out.append(f"panel {p['title']!r} target {idx}: {exc}")
    return out


def rule_target_rate_interval(d: dict) -> list[str]:
    """Stricter than the linter: EVERY range selector uses $__rate_interval (rate, increase, ...)."""
    out = []
    for p, idx, t in targets(d):
        for s in promql.selectors(t["expr"]):
            if s.range is not None and s.range != "$__rate_interval":
                out.append(f"panel {p['title']!r} target {idx}: {s.func}(...[{s.range}]) should use $__rate_interval")
    return out


def _rule_required_matcher(d: dict, label: str, config: dict) -> list[str]:
    out = []
    rule = f"target-{label}-rule"
    for p, idx, t in targets(d):
        if _excluded(config, rule, d, p, idx):
            continue
        for s in promql.selectors(t["expr"]):
            ms = s.matchers_for(label)
            if not any(m.op == "=~" and m.value == f"${label}" for m in ms):
                out.append(f"panel {p['title']!r} target {idx}: {s.name or '{...}'} has no {label}=~\"${label}\"")
    return out


def rule_target_job(d: dict, config: dict) -> list[str]:
    return _rule_required_matcher(d, "job", config)


def rule_target_instance(d: dict, config: dict) -> list[str]:
    return _rule_required_matcher(d, "instance", config)


def rule_target_counter_agg(d: dict) -> list[str]:
    out = []
    for p, idx, t in targets(d):
        for s in promql.selectors(t["expr"]):
            if s.name and s.name.endswith("_total") and (
                    s.range is None or s.func not in ("rate", "irate", "increase") or not s.direct_arg):
                out.append(f"panel {p['title']!r} target {idx}: counter {s.name} not in rate/irate/increase")
    return out


def rule_uneditable(d: dict) -> list[str]:
    return [f"{d['title']} is editable"] if d.get("editable", True) else []


DASHBOARD_RULES = {
    "template-datasource-rule": rule_template_datasource,
    "template-job-rule": rule_template_job,
    "template-instance-rule": rule_template_instance,
    "template-label-promql-rule": rule_template_label_promql,
    "template-on-time-change-reload-rule": rule_template_on_time_change_reload,
    "panel-datasource-rule": rule_panel_datasource,
    "panel-title-description-rule": rule_panel_title_description,
    "panel-units-rule": rule_panel_units,
    "panel-no-targets-rule": rule_panel_no_targets,
    "target-promql-rule": rule_target_promql,
    "target-rate-interval-rule": rule_target_rate_interval,
    "target-counter-agg-rule": rule_target_counter_agg,
    "uneditable-dashboard-rule": rule_uneditable,
}
CONFIGURED_RULES = {"target-job-rule": rule_target_job, "target-instance-rule": rule_target_instance}


# ------------------------------------------------------------------------------------------------
# CI: generated == committed
# ------------------------------------------------------------------------------------------------
def _shim(*args: str) -> subprocess.CompletedProcess:
    """``python dashboards/generate.py ARGS`` (the shim of the mixin's generator), from elsewhere
    than the repository root (the shim finds it from its own path)."""
    return subprocess.run([sys.executable, str(SHIM), *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT / "tests")


def test_generated_json_is_up_to_date(tmp_path):
    """Render into a temp dir (the shim's ``--out``: the dashboards only) and compare with
    dashboards/generated/ byte for byte."""
    r = _shim("--out", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    produced = sorted(p.name for p in tmp_path.iterdir())
    committed = sorted(p.name for p in GENERATED.iterdir())
    assert produced == committed, "run: python -m specwatch.mixin.generate"
    for name in produced:
        assert (tmp_path / name).read_text() == (GENERATED / name).read_text(), (
            f"dashboards/generated/{name} differs from its source; run: python -m specwatch.mixin.generate")
    r = _shim("--check", "--out", str(GENERATED))
    assert r.returncode == 0 and "up to date" in r.stdout, r.stdout + r.stderr


def test_check_reports_a_stale_and_a_stray_file(tmp_path):
    """The shim's ``--check --out DIR`` names a hand-edited file (with its diff) and a JSON no
    source renders; writing repairs the one and removes the other."""
    assert _shim("--out", str(tmp_path)).returncode == 0
    victim = tmp_path / "load-test.json"
    victim.write_text(victim.read_text().replace("specwatch-load-test", "edited-by-hand"))
    (tmp_path / "gone.json").write_text("{}\n")
    r = _shim("--check", "--out", str(tmp_path))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "out of date: dashboards/generated/load-test.json" in r.stderr
    assert "not generated: dashboards/generated/gone.json" in r.stderr
    assert "edited-by-hand" in r.stdout  # the diff
    assert _shim("--out", str(tmp_path)).returncode == 0
    assert victim.read_text() == (GENERATED / "load-test.json").read_text() and not (tmp_path / "gone.json").exists()


def test_every_source_has_generated_json():
    sources = {p.name[: -len(".dashboard.py")] for p in DASHBOARDS.glob("*.dashboard.py")}
    assert sources == {p.stem for p in GENERATED.glob("*.json")} == {n[:-5] for n in EXPECTED_UIDS}


# ------------------------------------------------------------------------------------------------
# dashboard-linter rules on the generated JSON
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rule", sorted(DASHBOARD_RULES))
@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_linter_rule(dashboards, name, rule):
    assert DASHBOARD_RULES[rule](dashboards[name]) == []


@pytest.mark.parametrize("rule", sorted(CONFIGURED_RULES))
@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_linter_rule_with_exclusions(dashboards, lint_config, name, rule):
    assert CONFIGURED_RULES[rule](dashboards[name], lint_config) == []


def test_lint_exclusions_are_justified(dashboards, lint_config):
    """Only target-instance-rule is excluded, and only for panels that select a recorded series of a
    level without an instance label; every excluded panel exists."""
    lib = load_module(DASHBOARDS, "lib")

    assert set(lint_config["exclusions"]) == {"target-instance-rule"}
    entries = lint_config["exclusions"]["target-instance-rule"]["entries"]
    assert entries, "no exclusions at all: then drop the .lint entry"
    by_title = {d["title"]: d for d in dashboards.values()}
    prefixes = tuple(f"{lvl}:" for lvl in lib.INSTANCELESS_LEVELS)
    for e in entries:
        dash = by_title[e["dashboard"]]
        panel = next(p for p in panels(dash) if p["title"] == e["panel"])
        sels = [s for t in panel["targets"] for s in promql.selectors(t["expr"])]
        lacking = [s for s in sels if not s.matchers_for("instance")]
        assert lacking, f"{e['panel']}: excluded but every selector has an instance matcher"
        for s in lacking:
            assert s.name and s.name.startswith(prefixes), (
                f"{e['panel']}: {s.name} lacks an instance matcher but is not an instance-less recorded series")


def test_most_queries_honour_instance(dashboards, lint_config):
    """The exclusion is not a blanket one: panels on raw series still carry $instance."""
    checked = sum(1 for d in dashboards.values() for p, i, t in targets(d)
                  if not _excluded(lint_config, "target-instance-rule", d, p, i))
    assert checked >= 20


# Constructed (deliberately broken) dashboards: each rule must fail on them.
def _broken(d: dict, rule: str) -> dict:
    b = copy.deepcopy(d)
    first = panels(b)[0]
    expr = first["targets"][0]["expr"]
    if rule == "template-datasource-rule":
        b["templating"]["list"] = [v for v in b["templating"]["list"] if v["type"] != "datasource"]
    elif rule in ("template-job-rule", "template-instance-rule"):
        name = rule.split("-")[1]
        next(v for v in b["templating"]["list"] if v["name"] == name)["allValue"] = ".*"
    elif rule == "template-label-promql-rule":
        query_variables(b)[0]["query"] = "label_values(up{, job)"
    elif rule == "template-on-time-change-reload-rule":
        query_variables(b)[0]["refresh"] = 1
    elif rule == "panel-datasource-rule":
        first["datasource"] = {"type": "prometheus", "uid": "prometheus"}
    elif rule == "panel-title-description-rule":
        first["description"] = ""
    elif rule == "panel-units-rule":
        first["fieldConfig"]["defaults"]["unit"] = "tokens/s"
    elif rule == "panel-no-targets-rule":
        first["targets"] = []
    elif rule == "target-promql-rule":
        first["targets"][0]["expr"] = expr + ")"
    elif rule == "target-rate-interval-rule":
        first["targets"][0]["expr"] = 'rate(vllm:prompt_tokens_total{job=~"$job", instance=~"$instance"}[5m])'
    elif rule == "target-counter-agg-rule":
        first["targets"][0]["expr"] = 'sum(vllm:prompt_tokens_total{job=~"$job", instance=~"$instance"})'
    elif rule == "uneditable-dashboard-rule":
        b["editable"] = True
    elif rule in ("target-job-rule", "target-instance-rule"):
        label = rule.split("-")[1]
        first["targets"][0]["expr"] = re.sub(rf'{label}=~"\${label}"', f'{label}=~".+"', expr)
    return b


@pytest.mark.parametrize("rule", sorted(DASHBOARD_RULES))
def test_rule_catches_a_constructed_violation(dashboards, rule):
    d = _broken(dashboards["speculative-decoding.json"], rule)
    assert DASHBOARD_RULES[rule](d), f"{rule} did not flag a constructed violation"


@pytest.mark.parametrize("rule", sorted(CONFIGURED_RULES))
def test_configured_rule_catches_a_constructed_violation(dashboards, rule):
    d = copy.deepcopy(dashboards["speculative-decoding.json"])
    # a panel on raw vLLM series (never excluded)
    panel = next(p for p in panels(d) if p["title"] == "KV-cache usage")
    label = rule.split("-")[1]
    panel["targets"][0]["expr"] = panel["targets"][0]["expr"].replace(f'{label}=~"${label}"', f'{label}=~".+"')
    assert CONFIGURED_RULES[rule](d, {"exclusions": {}})


# ------------------------------------------------------------------------------------------------
# PromQL validity via promtool's parser (offline binary); the live test runs them on Prometheus
# ------------------------------------------------------------------------------------------------
def substitute(expr: str, rate_interval: str = "1m") -> str:
    """Replace Grafana's variables by values Prometheus accepts (all variables at 'All')."""
    expr = expr.replace("$__rate_interval", rate_interval).replace("$__range", "1h").replace("$__interval", "15s")
    return re.sub(r'=~"\$[a-z_]+"', '=~".+"', expr)


@pytest.mark.prometheus
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus) not installed")
def test_every_query_parses_with_promtool(dashboards, tmp_path):
    rules = []
    for _name, d in sorted(dashboards.items()):
        for _p, _idx, t in targets(d):
            rules.append({"record": f"dashboard:check_{len(rules)}", "expr": substitute(t["expr"])})
        for v in query_variables(d):
            func, arg = _split_label_query(v["query"])
            rules.append({"record": f"dashboard:check_{len(rules)}", "expr": substitute(arg)})
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    res = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(rules)} rules found" in res.stdout


def test_substitute_leaves_no_variables(dashboards):
    for d in dashboards.values():
        for _p, _idx, t in targets(d):
            assert "$" not in substitute(t["expr"]), t["expr"]


# ------------------------------------------------------------------------------------------------
# specwatch conventions
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_fixed_uid_and_schema(dashboards, name):
    d = dashboards[name]
    assert d["uid"] == EXPECTED_UIDS[name]
    assert d["editable"] is False
    assert d["schemaVersion"] >= 36
    assert d["id"] is None
    assert all(p["editable"] is False for p in d["panels"])


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_required_variables(dashboards, name):
    d = dashboards[name]
    names = [v["name"] for v in d["templating"]["list"]]
    for required in REQUIRED_VARIABLES:
        assert required in names
    assert names[0] == "datasource"
    for v in query_variables(d):
        assert _ds_uid(v["datasource"]) in DS_VARS
        assert v["refresh"] == 2
        if v["name"] != "window":
            assert v["multi"] and v["includeAll"] and v["allValue"] == ".+"


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_grid_is_valid(dashboards, name):
    """Panels lie inside the 24-column grid, do not overlap, and have unique ids."""
    d = dashboards[name]
    cells = set()
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps another panel"
                cells.add((x, y))


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_titles_unique(dashboards, name):
    titles = [p["title"] for p in panels(dashboards[name])]
    assert len(titles) == len(set(titles))


def test_units_and_thresholds(dashboards):
    for d in dashboards.values():
        for p in panels(d):
            defaults = p["fieldConfig"]["defaults"]
            steps = defaults["thresholds"]["steps"]
            assert isinstance(steps, list) and steps and steps[0]["value"] is None, p["title"]
            values = [s["value"] for s in steps[1:]]
            assert values == sorted(values), p["title"]
            if defaults["unit"] == "percentunit":  # 0-1 ratios
                assert defaults.get("min", 0) == 0 and defaults.get("max", 1) == 1, p["title"]


def test_recorded_series_preferred(dashboards):
    """Counters and windowed gauges that have recording rules are not queried raw."""
    raw_with_rules = {
        "specwatch_drafts_total", "specwatch_draft_tokens_total", "specwatch_accepted_tokens_total",
        "specwatch_accepted_tokens_per_position_total", "specwatch_draft_acceptance_rate",
        "specwatch_mean_acceptance_length", "specwatch_position_acceptance_rate",
        "specwatch_position_conditional_acceptance_rate", "specwatch_expected_acceptance_length",
        "specwatch_output_from_drafts_ratio", "specwatch_draft_tokens_per_draft",
        "vllm:num_requests_running", "vllm:num_requests_waiting",
        "vllm:inter_token_latency_seconds_bucket", "vllm:request_time_per_output_token_seconds_bucket",
    }
    used = {n for d in dashboards.values() for p, i, t in targets(d) for n in promql.metric_names(t["expr"])}
    assert not used & raw_with_rules
    recorded = {n for n in used if n.count(":") == 2}
    assert len(recorded) >= 15


def test_speculative_decoding_covers_vllm_dashboard_and_more(dashboards):
    """Everything vLLM's own Speculative Decoding dashboard shows, plus specwatch's additions."""
    d = dashboards["speculative-decoding.json"]
    text = json.dumps([t["expr"] for p, i, t in targets(d)])
    titles = {p["title"] for p in panels(d)}
    for title in ("Draft acceptance rate", "Mean acceptance length", "Accepted tokens/s", "Draft tokens/s",
                  "Drafts/s", "Output from drafts", "Draft acceptance rate by model",
                  "Mean acceptance length by model", "Per-position acceptance rate (unconditional)",
                  "Draft acceptance rate by upstream and engine", "Token flow: proposed, accepted, rejected",
                  "Inter-token latency (per engine step)"):
        assert title in titles
    for needle in ("position_conditional_acceptance_rate", "expected_acceptance_length", "specwatch_speedup",
                   "specwatch_speedup_lower", "specwatch_speedup_upper", "basis=~\\\"measured|calibrated\\\"",
                   "kv_cache_usage_perc", "vllm_num_requests_running", "vllm_num_requests_waiting",
                   "request_time_per_output_token_seconds", "specwatch_num_speculative_tokens",
                   "specwatch_bench_active", "specwatch_bench_in_flight_requests", ":p99_"):
        assert needle in text, needle


def test_choosing_k_and_load_test_contents(dashboards):
    ck = dashboards["choosing-k.json"]
    types = {p["title"]: p["type"] for p in panels(ck)}
    assert types["Per-position acceptance rate by position"] == "bargauge"
    assert types["Per-position acceptance rate over time"] == "timeseries"
    text = json.dumps([t["expr"] for p, i, t in targets(ck)])
    for needle in ("specwatch_recommended_num_speculative_tokens", "expected_acceptance_length",
                   "specwatch_bench_spec_decode_acceptance_rate"):
        assert needle in text
    lt = json.dumps([t["expr"] for p, i, t in targets(dashboards["load-test.json"])])
    for needle in ('role=\\"baseline\\"', 'role=\\"speculative\\"', "specwatch_bench_ttft_seconds_bucket",
                   "specwatch_bench_tpot_seconds_bucket", "specwatch_bench_output_throughput_tokens_per_second"):
        assert needle in lt, needle


def test_speedup_panels_show_the_interval_and_basis(dashboards):
    """Every panel that shows specwatch_speedup shows its interval's ends beside it (the bar gauge per k
    excepted: bars cannot), each legend names the basis, and the time series draw the ends dashed."""
    seen = 0
    for name, d in dashboards.items():
        for p in panels(d):
            exprs = [t["expr"] for t in p.get("targets") or []]
            if not any(promql.metric_names(e) & {"specwatch_speedup"} for e in exprs) or p["type"] == "bargauge":
                continue
            seen += 1
            names = set().union(*(promql.metric_names(e) for e in exprs))
            assert {"specwatch_speedup_lower", "specwatch_speedup_upper"} <= names, (name, p["title"])
            for t in p["targets"]:
                assert "{{basis}}" in t["legendFormat"], (name, p["title"], t["legendFormat"])
            if p["type"] == "timeseries":
                [override] = p["fieldConfig"]["overrides"]
                pattern = re.compile(override["matcher"]["options"])
                dashed = {t["refId"] for t in p["targets"] if pattern.search(t["legendFormat"])}
                assert dashed == {t["refId"] for t in p["targets"]
                                  if promql.metric_names(t["expr"]) & {"specwatch_speedup_lower", "specwatch_speedup_upper"}}
    assert seen >= 4


def test_verdict_stat_names_every_verdict(dashboards):
    """The verdict stat maps every verdict the exporter serves (specwatch.specdecode.decision.VERDICTS)
    to a number, and every number back to a word and a colour (pays green, loses red)."""
    from specwatch.specdecode.decision import VERDICTS

    ck = dashboards["choosing-k.json"]
    [p] = [p for p in panels(ck) if p["title"] == "Does speculation pay at the current k?"]
    [t] = p["targets"]
    assert set(re.findall(r'verdict="([a-z_]+)"', t["expr"])) == set(VERDICTS)
    [mapping] = p["fieldConfig"]["defaults"]["mappings"]
    texts = {v["text"]: (k, v["color"]) for k, v in mapping["options"].items()}
    assert texts == {"pays": ("1", "green"), "cannot tell": ("0", "orange"), "loses": ("-1", "red")}
    assert "{{basis}}" in t["legendFormat"]


def test_recommended_k_names_the_withheld_reasons(dashboards):
    """The Recommended k stat explains every reason of specwatch_recommendation_withheld
    (MixinConfig's WITHHELD_REASONS) and no longer the blanket ragged_drafts one."""
    from specwatch.mixin.config import WITHHELD_REASONS

    [p] = [p for p in panels(dashboards["choosing-k.json"]) if p["title"] == "Recommended k"]
    for reason in WITHHELD_REASONS:
        assert f"{reason}:" in p["description"], reason
    assert 'reason=\\"ragged_drafts' not in json.dumps(dashboards) and "ragged_drafts" not in p["description"]
    assert "{{reason}}" in p["targets"][1]["legendFormat"]


def test_selectors_come_from_mixin_config(dashboards):
    """Every query carries one of MixinConfig's selectors (no job spelled twice)."""
    from specwatch.mixin.config import DEFAULT_CONFIG as cfg

    allowed = {cfg.vllm_selector, cfg.exporter_selector, cfg.bench_selector}
    for d in dashboards.values():
        for p, _i, t in targets(d):
            for s in promql.selectors(t["expr"]):
                fixed = {f'{m.name}="{m.value}"' for m in s.matchers if m.name == "job" and m.op == "="}
                assert len(fixed) == 1 and fixed <= allowed, (p["title"], s)


# ------------------------------------------------------------------------------------------------
# provisioning
# ------------------------------------------------------------------------------------------------
def test_datasource_provisioning_matches_scrape_interval():
    from specwatch.mixin.config import DEFAULT_CONFIG as cfg

    data = yaml.safe_load((DASHBOARDS / "provisioning/datasources/specwatch.yml").read_text())
    (ds,) = data["datasources"]
    assert ds["type"] == "prometheus" and ds["uid"] == "specwatch-prometheus"
    assert ds["jsonData"]["timeInterval"] == cfg.scrape_interval
    prom = yaml.safe_load((ROOT / "prometheus/prometheus.yml").read_text())
    assert prom["global"]["scrape_interval"] == cfg.scrape_interval


def test_dashboard_provider_points_at_generated_mount():
    data = yaml.safe_load((DASHBOARDS / "provisioning/dashboards/specwatch.yml").read_text())
    (prov,) = data["providers"]
    assert prov["type"] == "file"
    assert prov["options"]["path"] == "/var/lib/grafana/dashboards/specwatch"
    assert prov["allowUiUpdates"] is False


def test_dashboards_follow_the_mixin_config(tmp_path):
    """One config for rules, alerts and dashboards: a selector and a window set in the YAML given to
    ``python -m specwatch.mixin.generate --config`` reach every dashboard's queries, and the
    defaults' selector is gone from them; the shim refuses a missing config file in one line."""
    from specwatch.mixin.config import load_config

    cfg_file = tmp_path / "mixin.yml"
    cfg_file.write_text("vllm_selector: 'job=\"prod-vllm\"'\nexporter_selector: 'job=\"prod-specwatch\"'\nrate_window: 10m\n")
    cfg = load_config(cfg_file)
    assert cfg.vllm_selector == 'job="prod-vllm"' and cfg != DEFAULT_CONFIG
    files = render_dashboards(cfg, DASHBOARDS)
    default_files = render_dashboards(DEFAULT_CONFIG, DASHBOARDS)
    for name in ("speculative-decoding.json", "load-test.json", "choosing-k.json"):
        assert files[name] != default_files[name], name
        exprs = [t["expr"] for p in json.loads(files[name])["panels"] for t in p.get("targets", []) if "expr" in t]
        assert exprs, name
        text = "\n".join(exprs)
        assert "prod-vllm" in text or "prod-specwatch" in text, name
        assert DEFAULT_CONFIG.vllm_selector not in text and DEFAULT_CONFIG.exporter_selector not in text, name
    r = _shim("--config", str(tmp_path / "missing.yml"))
    assert r.returncode == 2 and "missing.yml" in r.stderr and "Traceback" not in r.stderr
