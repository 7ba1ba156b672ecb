"""Cross-reference: every metric named in a dashboard panel or variable, a recording rule or an alert
exists somewhere real, so that a rename in one artifact cannot silently empty another.

Known names come from:
- real captured vLLM /metrics (tests/fixtures/metrics/vllm-0.32-*.txt without the CONSTRUCTED marker),
- the exporter's output: one ``specwatch serve --once`` with each of those captures as its own upstream,
  served over loopback (one run per capture gave the same names in 11 processes),
- the load generator's registry (``specwatch.bench.metrics.BenchMetrics``; sample names derived from
  each family's type, as the client library exposes them),
- the recorded series of prometheus/rules/*.yml,
- ``up`` (Prometheus adds it to every target).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from httpstub import QuietHandler, base_url, send, serve_in_thread
from specwatch.mixin.dashboards import load_module

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
FIXTURES = ROOT / "tests" / "fixtures" / "metrics"
RULES = sorted((ROOT / "prometheus" / "rules").glob("*.yml"))
promql = load_module(DASHBOARDS, "promql")  # dashboards/promql.py, imported as the generator imports it

SPECWATCH = Path(sys.executable).parent / "specwatch"


def real_captures() -> list[Path]:
    return sorted(p for p in FIXTURES.glob("vllm-0.32-*.txt") if not p.read_text().startswith("# CONSTRUCTED"))


def sample_names(text: str, upstreams: set[str] | None = None) -> set[str]:
    """Sample names (and family names) of an exposition body, via prometheus_client's parser. With
    ``upstreams`` (the exporter's output), only those of the samples of these upstreams (their
    ``upstream`` label) and of the exporter's own samples (no ``upstream`` label: build and cost
    profile info)."""
    names = set()
    for fam in text_string_to_metric_families(text):
        kept = [s for s in fam.samples if upstreams is None or s.labels.get("upstream") in (None, *upstreams)]
        if kept or not fam.samples:
            names.add(fam.name)
        names.update(s.name for s in kept)
    return names


def names_in(expr: str) -> set[str]:
    """Metric names an expression selects, including alternations in ``__name__=~"a|b"``."""
    out = set()
    for s in promql.selectors(expr):
        if s.name:
            out.add(s.name)
        for m in s.matchers_for("__name__"):
            if m.op == "=~" and all(part.replace(":", "").replace("_", "").isalnum() for part in m.value.split("|")):
                out.update(m.value.split("|"))
    return out


# ------------------------------------------------------------------------------------------------
# the names in use
# ------------------------------------------------------------------------------------------------
def dashboard_refs() -> dict[str, set[str]]:
    """metric -> {"dashboard <file>: <panel title>", ...} for panels and variables."""
    refs: dict[str, set[str]] = {}
    for path in sorted((DASHBOARDS / "generated").glob("*.json")):
        d = json.loads(path.read_text())
        for p in d["panels"]:
            for t in p.get("targets") or []:
                for n in names_in(t["expr"]):
                    refs.setdefault(n, set()).add(f"{path.name}: {p['title']}")
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                arg = v["query"][v["query"].index("(") + 1: v["query"].rindex(",")]
                for n in names_in(arg):
                    refs.setdefault(n, set()).add(f"{path.name}: variable {v['name']}")
    return refs


def rule_refs() -> tuple[dict[str, set[str]], set[str]]:
    """(metric -> {rule or alert names using it}, recorded series names)."""
    refs: dict[str, set[str]] = {}
    recorded = set()
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                who = rule.get("record") or rule.get("alert")
                if "record" in rule:
                    recorded.add(rule["record"])
                for n in names_in(rule["expr"]):
                    refs.setdefault(n, set()).add(f"{path.name}: {who}")
    return refs, recorded


# ------------------------------------------------------------------------------------------------
# the names that exist
# ------------------------------------------------------------------------------------------------
class _Bodies(QuietHandler):
    bodies: dict[str, bytes] = {}  # /NAME/metrics answers bodies[NAME]

    def do_GET(self):  # http.server API
        send(self, self.bodies[self.path.split("/")[1]], "text/plain; version=0.0.4")


# the shipped CPU profile (the captures' own model and machine kind): its decisions are not all withheld
PROFILE = Path(__file__).resolve().parents[2] / "exporter/specwatch/data/cost-profiles/cpu-2core-smollm2-135m-vllm0.32.yaml"


def exporter_output(captures: list[Path]) -> str:
    """``specwatch serve --once --cost-profile …`` with each capture as its own upstream (named by
    its file's stem), served from 127.0.0.1 (the exporter's real CLI; with a profile, so that its
    cost-profile series exist). Every upstream must be up, as one run per capture required."""
    handler = type("Handler", (_Bodies,), {"bodies": {c.stem: c.read_bytes() for c in captures}})
    with serve_in_thread(handler) as server:
        upstreams = [arg for c in captures for arg in ("--upstream", f"{c.stem}={base_url(server)}/{c.stem}/metrics")]
        res = subprocess.run([str(SPECWATCH), "serve", "--once", *upstreams, "--cost-profile", str(PROFILE),
                              "--speculative-method", "ngram",  # so specwatch_speculative_method_info exists
                              "--timeout", "60"],  # the fetches run at once: room for a busy machine
                             capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    up = {s.labels["upstream"]: s.value for f in text_string_to_metric_families(res.stdout) if f.name == "specwatch_up"
          for s in f.samples}
    assert up == {c.stem: 1.0 for c in captures}, (up, res.stderr)
    return res.stdout


def bench_names() -> set[str]:
    """Sample names of the load generator's registry (counter -> _total, histogram -> _bucket/_sum/_count)."""
    from specwatch.bench.metrics import BenchMetrics

    names = set()
    for fam in BenchMetrics().registry.collect():
        names.add(fam.name)
        if fam.type == "counter":
            names.add(fam.name + "_total")
        elif fam.type == "histogram":
            names.update(fam.name + s for s in ("_bucket", "_sum", "_count"))
    return names


@pytest.fixture(scope="module")
def captures() -> list[Path]:
    found = real_captures()
    if not found:
        pytest.fail("no real vLLM capture in tests/fixtures/metrics/ (vllm-0.32-*.txt)")
    return found


@pytest.fixture(scope="module")
def known(captures) -> dict[str, set[str]]:
    vllm = set().union(*(sample_names(c.read_text()) for c in captures))
    # SGLang: no real server here; the exporter's output on the constructed SGLang 0.5.23 body
    sglang_body = captures[0].parent / "sglang-0.5.23-eagle-tp2-dp2-after-traffic-constructed.txt"
    served = exporter_output([*captures, sglang_body])
    exporter = sample_names(served, {c.stem for c in captures})
    sglang = sample_names(served, {sglang_body.stem})
    _, recorded = rule_refs()
    return {"capture": vllm, "exporter": exporter, "bench": bench_names(), "recorded": recorded, "prometheus": {"up"},
            "sglang (constructed)": sglang}


# ------------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------------
def test_sources_are_not_empty(known):
    """Guard against a vacuous pass: each source really contributed names."""
    assert "vllm:spec_decode_num_drafts_total" in known["capture"]
    assert "specwatch_accepted_tokens_per_position_total" in known["exporter"]
    assert "specwatch_bench_ttft_seconds_bucket" in known["bench"]
    assert any(n.startswith("upstream_engine:") for n in known["recorded"])


def test_dashboard_metrics_exist(known):
    everything = set().union(*known.values())
    refs = dashboard_refs()
    assert len(refs) >= 30
    missing = {n: sorted(where) for n, where in refs.items() if n not in everything}
    assert not missing, f"metrics used by dashboards but found nowhere: {json.dumps(missing, indent=1)}"


def test_rule_and_alert_metrics_exist(known):
    everything = set().union(*known.values())
    refs, recorded = rule_refs()
    assert recorded and refs
    missing = {n: sorted(where) for n, where in refs.items() if n not in everything}
    assert not missing, f"metrics used by rules/alerts but found nowhere: {json.dumps(missing, indent=1)}"


def test_dashboards_use_only_recorded_series_that_are_defined():
    """A recorded-series name (level:metric:op) in a dashboard must be a rule's `record`."""
    _, recorded = rule_refs()
    used = {n for n in dashboard_refs() if n.count(":") == 2 and not n.startswith("vllm:")}
    assert used, "the dashboards should use recorded series"
    assert used <= recorded, sorted(used - recorded)


def test_names_in_detects_a_rename():
    """The extraction this test relies on sees a renamed metric (constructed expression)."""
    expr = 'sum(rate(specwatch_acepted_tokens_total{job=~"$job"}[$__rate_interval]))'
    assert names_in(expr) == {"specwatch_acepted_tokens_total"}
    assert names_in('{__name__=~"a_total|b:c", job="x"}') == {"a_total", "b:c"}


def test_every_exported_series_is_documented(known):
    """Every specwatch_* sample name the exporter serves (real vLLM captures and the constructed SGLang body)
    is named in docs/exporter.md, and docs/metrics.md points at every group (SGLang's included); every
    recorded series of an SGLang rule is named in docs/mixin.md and docs/metrics.md."""
    docs = ROOT / "docs"
    exporter_md, metrics_md, mixin_md = ((docs / n).read_text() for n in ("exporter.md", "metrics.md", "mixin.md"))
    served = {n for n in known["exporter"] | known["sglang (constructed)"] if n.startswith("specwatch_")}
    assert "specwatch_sglang_spec_accept_rate" in served and "specwatch_not_derivable" in served
    missing = sorted(n for n in served if n not in exporter_md)
    assert not missing, f"served by the exporter but not named in docs/exporter.md: {missing}"
    for name in ("specwatch_sglang_", "specwatch_not_derivable", "specwatch_speculative_method_info",
                 "specwatch_recommendation_withheld"):
        assert name in metrics_md, name
    sglang_rules = {r for r in known["recorded"] if "sglang" in r}
    assert sglang_rules
    for r in sglang_rules:
        assert r in mixin_md and r in metrics_md, r
