"""Prometheus configuration, recording rules and alerts of the specwatch mixin.

Runs the real promtool (Debian's prometheus package): ``check config``, ``check rules``, and
``test rules`` on prometheus/tests/*.yml (expected values for every recording rule, firing and
must-not-fire cases for every alert); checks that the committed files are what
``python -m specwatch.mixin.generate`` produces, that the MixinConfig is the one source of
selectors, windows and the cost model, and that the must-not-fire cases really depend on the
guards they are written for.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specwatch.mixin import generate
from specwatch.common.params import parse_duration
from specwatch.mixin.config import LEVEL_LABELS, MixinConfig
from specwatch.mixin.rules import rule_groups

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "prometheus"
RULES = PROM / "rules" / "specwatch-rules.yml"
ALERTS = PROM / "rules" / "specwatch-alerts.yml"
UNIT_TESTS = sorted((PROM / "tests").glob("*.yml"))
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (apt-get install prometheus; scripts/setup.sh does it)")
pytestmark = pytest.mark.prometheus


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def _alert_rules_by_name(text: str) -> dict[str, dict]:
    """Alert name -> its rule (a dict as parsed) in a rendered alerts file."""
    doc = yaml.safe_load(text)
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def _mutated_alert_tests(out: Path, committed: str) -> Path:
    """The committed alert tests, keeping only the test groups that exercise an alert whose rule in
    ``out``'s alerts file differs from ``committed`` (the committed alerts file's text); returns the
    path of that test file, written beside the committed one in ``out``'s copy.

    Why this is the same check as running every group: alerts do not read one another, so a group
    whose alerts are unchanged evaluates exactly what the committed run evaluates, and that run
    passes (``test_promtool_test_rules``). Skipping those groups (the acceptance-collapse one spans
    380 minutes of evaluation, most of promtool's CPU) leaves the failing set unchanged. A group with
    a ``promql_expr_test`` is always kept (it may read ``ALERTS`` for any alert). Raises
    AssertionError if no alert changed (a mutation that changes nothing proves nothing)."""
    before = _alert_rules_by_name(committed)
    after = _alert_rules_by_name((out / "rules" / "specwatch-alerts.yml").read_text())
    changed = {n for n in before.keys() | after.keys() if before.get(n) != after.get(n)}
    assert changed, "the mutation changed no alert rule"
    src = out / "tests" / "specwatch-alerts.test.yml"
    doc = yaml.safe_load(src.read_text())
    doc["tests"] = [t for t in doc["tests"]
                    if t.get("promql_expr_test") or {a["alertname"] for a in t.get("alert_rule_test", [])} & changed]
    dst = out / "tests" / "specwatch-alerts.mutated.test.yml"
    dst.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dst


# ----------------------------------------------------------------------------- promtool
@needs_promtool
@pytest.mark.parametrize("config", ["prometheus.yml", "compose/prometheus.yml"])
def test_promtool_check_config(config):
    r = promtool("check", "config", str(PROM / config))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 rule files found" in r.stdout + r.stderr


@needs_promtool
def test_promtool_check_rules():
    r = promtool("check", "rules", str(RULES), str(ALERTS))
    assert r.returncode == 0, r.stdout + r.stderr
    n_rules = sum(len(g.rules) for g in rule_groups(MixinConfig()))
    assert f"SUCCESS: {n_rules} rules found" in r.stdout
    assert "SUCCESS: 7 rules found" in r.stdout


@needs_promtool
@pytest.mark.parametrize("unit_test", UNIT_TESTS, ids=lambda p: p.name)
def test_promtool_test_rules(unit_test):
    r = promtool("test", "rules", str(unit_test))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_unit_tests_exist():
    assert {p.name for p in UNIT_TESTS} >= {"specwatch-rules.test.yml", "specwatch-alerts.test.yml"}


# ----------------------------------------------------------------------------- generated files
def test_committed_files_are_generated():
    r = subprocess.run([sys.executable, "-m", "specwatch.mixin.generate", "--check"], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_generate_check_detects_a_hand_edit(tmp_path, mixin_root):
    """Also through the deprecated --out-dir (the prometheus/ files in another directory)."""
    out = tmp_path / "prometheus-elsewhere"
    shutil.copytree(PROM, out)
    rules = out / "rules" / "specwatch-rules.yml"
    rules.write_text(rules.read_text().replace("ratio_rate5m", "ratio_rate5m_edited", 1))
    under_root = mixin_root / "prometheus" / "rules" / "specwatch-rules.yml"
    under_root.write_text("# not looked at with --out-dir\n")
    cmd = [sys.executable, "-m", "specwatch.mixin.generate", "--root", str(mixin_root), "--out-dir", str(out)]
    r = subprocess.run([*cmd, "--check"], capture_output=True, text=True)
    assert r.returncode == 1
    assert "rules/specwatch-rules.yml" in r.stderr and "--out-dir is deprecated" in r.stderr
    assert "ratio_rate5m_edited" in r.stdout  # the diff
    # regenerating repairs it, there and not under the root
    subprocess.run(cmd, check=True, capture_output=True)
    assert rules.read_text() == RULES.read_text()
    assert under_root.read_text() == "# not looked at with --out-dir\n"


def test_generated_header_and_one_comment_per_rule():
    for path in (RULES, ALERTS):
        text = path.read_text()
        assert text.startswith("# GENERATED by `python -m specwatch.mixin.generate`")
        assert "DO NOT EDIT" in text.splitlines()[0]
        lines = text.splitlines()
        starts = [i for i, line in enumerate(lines) if re.match(r"\s+- (record|alert): ", line)]
        assert starts
        for i in starts:
            above = lines[i - 1].strip()
            assert above.startswith("# ") and len(above) > 10, f"{path.name}:{i + 1} has no comment line above it"


def test_config_file_overrides_and_rejects_unknown_keys(tmp_path):
    good = tmp_path / "mixin.yml"
    good.write_text("rate_window: 2m\nexporter_window: 1m\nextra_alert_labels: {team: inference}\n")
    cfg = generate.load_config(good)
    assert cfg.rate_window == "2m" and cfg.exporter_window == "1m"
    assert cfg.alert_labels() == {"team": "inference"}
    bad = tmp_path / "bad.yml"
    bad.write_text("rate_windw: 2m\n")
    with pytest.raises(Exception, match="unknown MixinConfig field"):
        generate.load_config(bad)
    worse = tmp_path / "worse.yml"
    worse.write_text("rate_window: 10s\n")
    with pytest.raises(Exception, match="4 × scrape_interval"):
        generate.load_config(worse)


# ----------------------------------------------------------------------------- conventions
def _load(path):
    return yaml.safe_load(path.read_text())["groups"]


def test_recording_rule_names_follow_level_metric_operations():
    cfg = MixinConfig()
    for group in _load(RULES):
        for rule in group["rules"]:
            level, metric, ops = rule["record"].split(":")
            assert level in LEVEL_LABELS, rule["record"]
            assert metric.startswith(("specwatch_", "vllm_")), rule["record"]
            assert ops in ("rate5m", "ratio_rate5m", "mean5m", "p50_5m", "p95_5m", "p99_5m", "sum", "max"), rule["record"]
            # a level's rules aggregate by exactly that level's labels
            for by in re.findall(r"sum by \(([^)]*)\)", rule["expr"]):
                labels = [x.strip() for x in by.split(",")]
                assert labels[: len(LEVEL_LABELS[level])] == list(LEVEL_LABELS[level]), rule["record"]
            assert "avg by" not in rule["expr"] or "num_requests_running" in rule["expr"], \
                f"{rule['record']}: averages only for the batch size, ratios are ratios of sums"
    assert cfg.rate_window == "5m"


def test_contract_rule_names_present():
    names = {r["record"] for g in _load(RULES) for r in g["rules"]}
    for level in ("model_name", "upstream_engine"):
        for m in ("draft_acceptance_rate", "mean_acceptance_length", "position_acceptance_rate",
                  "position_conditional_acceptance_rate", "expected_acceptance_length",
                  "output_from_drafts_ratio", "draft_tokens_per_draft"):
            assert f"{level}:specwatch_{m}:ratio_rate5m" in names
        for m in ("drafts", "draft_tokens", "accepted_tokens", "rejected_tokens"):
            assert f"{level}:specwatch_{m}:rate5m" in names
    for n in ("model_name:vllm_request_time_per_output_token_seconds:mean5m",
              "model_name:vllm_request_time_per_output_token_seconds:p50_5m",
              "model_name:vllm_request_time_per_output_token_seconds:p95_5m",
              "model_name:vllm_inter_token_latency_seconds:mean5m",
              "model_name:vllm_inter_token_latency_seconds:p99_5m",
              "model_name:vllm_num_requests_running:sum", "model_name:vllm_num_requests_waiting:sum",
              "instance_engine:vllm_num_requests_running:sum",
              "instance_engine:vllm_running_requests_per_step:ratio_rate5m",
              "instance_engine:vllm_request_decode_tokens_per_second:ratio_rate5m",
              "model_name:vllm_running_requests_per_step:ratio_rate5m",
              "model_name:vllm_request_decode_tokens_per_second:ratio_rate5m"):
        assert n in names
    # speedup is the exporter's (it needs the cost profile): no recording rule computes another one
    assert not [n for n in names if "speedup" in n]
    ks = sorted(int(r["labels"]["k"]) for g in _load(RULES) for r in g["rules"]
                if r["record"] == "model_name:specwatch_expected_acceptance_length:ratio_rate5m")
    assert ks == list(range(1, MixinConfig().max_k + 1))


def _runbook_anchors() -> set[str]:
    return {line[3:].strip().lower() for line in (PROM / "runbook.md").read_text().splitlines() if line.startswith("## ")}


def test_alerts_have_for_severity_summary_description_runbook():
    alerts = [r for g in _load(ALERTS) for r in g["rules"]]
    assert {a["alert"] for a in alerts} == {
        "SpecwatchSpeculationNetNegative", "SpecwatchAcceptanceCollapsed", "SpecwatchUpstreamDown",
        "SpecwatchSpecDecodeMetricsMissing", "SpecwatchExporterDown", "SpecwatchInvariantViolations",
        "SpecwatchCostProfileDrift"}
    anchors = _runbook_anchors()
    for a in alerts:
        assert parse_duration(a["for"]) > 0, a["alert"]
        assert a["labels"]["severity"] in ("critical", "warning", "info")
        ann = a["annotations"]
        assert ann["summary"] and "{{" not in ann["summary"], "summary is static"
        assert "$labels." in ann["description"] and "$value" in ann["description"], a["alert"]
        url, _, anchor = ann["runbook_url"].partition("#")
        assert url.endswith("prometheus/runbook.md") and anchor == a["alert"].lower() and anchor in anchors


def test_every_rule_and_alert_has_unit_tests():
    """Every recorded name is queried in a promql_expr_test with expected samples; every alert has
    a firing case and a must-not-fire (empty) case."""
    tested_exprs, firing, quiet = set(), set(), set()
    for path in UNIT_TESTS:
        for t in yaml.safe_load(path.read_text())["tests"]:
            for e in t.get("promql_expr_test", []):
                if e.get("exp_samples"):
                    tested_exprs.add(e["expr"].strip())
            for a in t.get("alert_rule_test", []):
                (firing if a.get("exp_alerts") else quiet).add(a["alertname"])
    names = {r["record"] for g in _load(RULES) for r in g["rules"]}
    assert names - tested_exprs == set()
    alerts = {r["alert"] for g in _load(ALERTS) for r in g["rules"]}
    assert alerts - firing == set()
    assert alerts - quiet == set()


# ----------------------------------------------------------------------------- one config source
def test_one_config_source_for_selectors_and_windows():
    cfg = MixinConfig(vllm_selector='job="vllm-prod"', exporter_selector='job="sw", env="prod"',
                      rate_window="2m", scrape_interval="30s", max_k=3, net_negative_for="1h")
    text = generate.render_rules(cfg) + generate.render_alerts(cfg)
    # no default rate window left anywhere (5m stays only as the default `for:` of other alerts)
    assert re.search(r"\[5m\]|rate5m|mean5m|_5m\b|offset 5m|last 5m", text) is None
    assert 'job="specwatch"' not in text and 'job="vllm"}' not in text
    assert "model_name:specwatch_draft_acceptance_rate:ratio_rate2m" in text
    assert 'specwatch_drafts_total{job="sw", env="prod"}' in text
    assert 'vllm:num_requests_running{job="vllm-prod"}' in text
    assert "for: 1h" in text and "interval: 30s" in text
    assert 'k: \'4\'' not in text and "k: '3'" in text
    conf = generate.render_prometheus_config(MixinConfig(scrape_interval="30s", rate_window="2m"),
                                             generate.EMBEDDED_TARGETS, "rules", "test")
    parsed = yaml.safe_load(conf)
    assert parsed["global"]["scrape_interval"] == "30s" == parsed["global"]["evaluation_interval"]


@needs_promtool
def test_other_config_renders_valid_rules(tmp_path):
    cfg = MixinConfig(rate_window="1m", scrape_interval="2s", max_k=8, exporter_selector='job="sw"')
    (tmp_path / "r.yml").write_text(generate.render_rules(cfg))
    (tmp_path / "a.yml").write_text(generate.render_alerts(cfg))
    r = promtool("check", "rules", str(tmp_path / "r.yml"), str(tmp_path / "a.yml"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_embedded_and_compose_configs_scrape_the_three_jobs_with_upstream_labels():
    for rel, vllm_targets in (("prometheus.yml", {"localhost:8000": "spec", "localhost:8001": "baseline"}),
                              ("compose/prometheus.yml", {"vllm:8000": "spec", "vllm-baseline:8001": "baseline"})):
        conf = yaml.safe_load((PROM / rel).read_text())
        jobs = {j["job_name"]: j for j in conf["scrape_configs"]}
        assert set(jobs) == {"vllm", "specwatch", "specwatch-bench"}
        got = {t: sc["labels"]["upstream"] for sc in jobs["vllm"]["static_configs"] for t in sc["targets"]}
        assert got == vllm_targets
        for f in conf["rule_files"]:
            assert (PROM / rel).parent.joinpath(f).resolve() in (RULES.resolve(), ALERTS.resolve())
        # rate window holds at least 4 scrapes
        assert parse_duration(MixinConfig().rate_window) >= 4 * parse_duration(conf["global"]["scrape_interval"])


# ----------------------------------------------------------------------------- the cost model
def test_the_mixin_holds_no_cost_figures():
    """Cost figures come from the exporter's cost profile only: the mixin config has no coefficient,
    and the exporter window it reads is validated like every duration."""
    fields = {f.name for f in dataclasses.fields(MixinConfig)}
    assert not [f for f in fields if "cost_per" in f or "step_cost" in f]
    with pytest.raises(ValueError, match="exporter_window"):
        MixinConfig(exporter_window="five minutes")
    with pytest.raises(ValueError, match="cost_profile_error_tolerance"):
        MixinConfig(cost_profile_error_tolerance=-0.1)


def test_mixin_config_rejects_bad_values():
    for kwargs, match in (({"rate_window": "5 minutes"}, "rate_window"),
                          ({"vllm_selector": "vllm"}, "vllm_selector"),
                          ({"max_k": 0}, "max_k"),
                          ({"acceptance_collapse_ratio": 1.5}, "acceptance_collapse_ratio"),
                          ({"acceptance_history_window": "5m"}, "acceptance_history_window"),
                          ({"runbook_url": "https://x/runbook.md#a"}, "runbook_url")):
        with pytest.raises(ValueError, match=match):
            MixinConfig(**kwargs)
    assert parse_duration("1h30m") == 5400 and parse_duration("500ms") == 0.5
    for bad in ("", "5", "5x", "m5", "5m1h"):
        with pytest.raises(ValueError):
            parse_duration(bad)


@needs_promtool
def test_speedup_alerts_read_the_configured_exporter_window(tmp_path):
    """With exporter_window 1m the net-negative and drift alerts read the exporter's 1m series and
    ignore its 5m ones (which say the opposite here): the upper end of the current k's speedup
    interval (basis calibrated) and the drift at a k the profile measured (basis profile)."""
    cfg = MixinConfig(exporter_window="1m")
    (tmp_path / "a.yml").write_text(generate.render_alerts(cfg))
    (tmp_path / "r.yml").write_text(generate.render_rules(cfg))
    lab = 'job="specwatch", instance="e:1", upstream="u", model_name="m", engine="0"'
    test = {
        "rule_files": ["r.yml", "a.yml"], "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": f"specwatch_drafts_total{{{lab}}}", "values": "0+120x40"},
                {"series": f'specwatch_speedup_upper{{{lab}, window="1m", k="4", basis="calibrated"}}', "values": "0.7x40"},
                {"series": f'specwatch_speedup_upper{{{lab}, window="5m", k="4", basis="calibrated"}}', "values": "1.5x40"},
                {"series": f'specwatch_cost_profile_error_ratio{{{lab}, window="1m", basis="profile"}}', "values": "2x40"},
                {"series": f'specwatch_cost_profile_error_ratio{{{lab}, window="5m", basis="profile"}}', "values": "1x40"},
            ],
            "promql_expr_test": [
                {"expr": 'ALERTS{alertstate="firing", alertname=~"SpecwatchSpeculationNetNegative|SpecwatchCostProfileDrift"}',
                 "eval_time": "30m",
                 "exp_samples": [
                     {"labels": 'ALERTS{alertname="SpecwatchSpeculationNetNegative", alertstate="firing", severity="warning", '
                                'job="specwatch", upstream="u", model_name="m", engine="0"}', "value": 1},
                     {"labels": 'ALERTS{alertname="SpecwatchCostProfileDrift", alertstate="firing", severity="warning", '
                                'job="specwatch", instance="e:1", upstream="u", model_name="m", engine="0", window="1m", '
                                'basis="profile"}',
                      "value": 1}]},
            ],
        }],
    }
    (tmp_path / "t.yml").write_text(yaml.safe_dump(test))
    r = promtool("test", "rules", str(tmp_path / "t.yml"))
    assert r.returncode == 0, r.stdout + r.stderr


# ----------------------------------------------------------------------------- the tests test something
@needs_promtool
@pytest.mark.parametrize("change, alert", [
    ({"net_negative_min_drafts_per_second": 0.0}, "SpecwatchSpeculationNetNegative"),
    ({"acceptance_collapse_min_draft_tokens_per_second": 0.0}, "SpecwatchAcceptanceCollapsed"),
    ({"acceptance_collapse_min_history_rate": 0.0}, "SpecwatchAcceptanceCollapsed"),
    ({"net_negative_for": "5m"}, "SpecwatchSpeculationNetNegative"),
    ({"upstream_down_for": "30s"}, "SpecwatchUpstreamDown"),
])
def test_must_not_fire_cases_depend_on_their_guard(tmp_path, change, alert):
    """Removing one guard (traffic floor, history floor, for:) makes the committed alert tests fail
    on that alert: the must-not-fire cases are not vacuous."""
    out = tmp_path / "prometheus"
    shutil.copytree(PROM, out)
    cfg = dataclasses.replace(MixinConfig(), **change)
    (out / "rules" / "specwatch-alerts.yml").write_text(generate.render_alerts(cfg))
    r = promtool("test", "rules", str(_mutated_alert_tests(out, ALERTS.read_text())))
    assert r.returncode == 1
    failed = set(re.findall(r"alertname: (\w+)", r.stdout + r.stderr))
    assert failed == {alert}, r.stdout + r.stderr


@needs_promtool
@pytest.mark.parametrize("old, new, alert", [
    # the point value instead of the interval's upper end: "unsure" (0.85, upper 1.05) would fire
    ("specwatch_speedup_upper{", "specwatch_speedup{", "SpecwatchSpeculationNetNegative"),
    # every basis instead of the current k's live ones: "guess" (basis default, upper 0.8) would fire
    ('basis=~"measured|calibrated", ', "", "SpecwatchSpeculationNetNegative"),
    # drift at any basis: "interp" (2.0 at basis extrapolated) would fire
    ('basis="profile", ', "", "SpecwatchCostProfileDrift"),
])
def test_must_not_fire_cases_depend_on_the_interval_and_basis(tmp_path, old, new, alert):
    """Reading the point value, or dropping a basis matcher, makes the committed alert tests fail on
    that alert: the interval and basis cases are not vacuous."""
    out = tmp_path / "prometheus"
    shutil.copytree(PROM, out)
    alerts = out / "rules" / "specwatch-alerts.yml"
    text = alerts.read_text()
    assert old in text, old
    alerts.write_text(text.replace(old, new))
    r = promtool("test", "rules", str(_mutated_alert_tests(out, text)))
    assert r.returncode == 1
    failed = set(re.findall(r"alertname: (\w+)", r.stdout + r.stderr))
    assert failed == {alert}, r.stdout + r.stderr


@needs_promtool
def test_rule_tests_catch_an_average_of_ratios(tmp_path):
    """Replacing the ratio of sums by an average of per-engine ratios fails the rule tests."""
    out = tmp_path / "prometheus"
    shutil.copytree(PROM, out)
    rules = out / "rules" / "specwatch-rules.yml"
    text = rules.read_text()
    old = ("expr: model_name:specwatch_accepted_tokens:rate5m / (model_name:specwatch_draft_tokens:rate5m > 0)")
    assert old in text
    rules.write_text(text.replace(old, "expr: avg by (job, model_name) (upstream_engine:specwatch_draft_acceptance_rate:ratio_rate5m)"))
    r = promtool("test", "rules", str(out / "tests" / "specwatch-rules.test.yml"))
    assert r.returncode == 1
    assert "model_name:specwatch_draft_acceptance_rate:ratio_rate5m" in r.stdout + r.stderr
