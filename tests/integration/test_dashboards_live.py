"""Every dashboard query, run on a real Prometheus fed by the real exporter, the real vLLM and the
real load generator after some traffic, returns data.

Stack (all on loopback, ephemeral ports; fixtures from tests/conftest.py): the session's real vLLM
(``real_vllm``, SmolLM2-135M with ngram speculation), ``specwatch serve --window 1m`` scraping it,
copy traffic (``copy_traffic``), ``specwatch bench`` (speculative role only) with its metrics
endpoint on, and a Prometheus (``prometheus_server``, Debian's binary) scraping vLLM, the
exporter and the load generator every 2 s with the repository's rule files (group intervals
shortened to 2 s; rule names and expressions unchanged; job names from MixinConfig's selectors,
so the rules' ``job="..."`` match).

Each target of each panel is run as a range query over the test's time span with Grafana's
variables substituted (every multi-value variable at All = ``.+``, ``$window`` = ``1m``,
``$__rate_interval`` = 1m); it must succeed (this is target-promql-rule, checked by the real
parser) and return at least one finite value. Template variables' ``label_values`` queries must
list values. Panels that legitimately stay empty are in ``EXPECTED_EMPTY`` with the reason.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
import yaml

import composestack  # tests/support/composestack.py: Prometheus' scrape/evaluation freshness
import realstack  # tests/support/realstack.py: the shared real-stack helpers
from specwatch.common.processes import stop_process_group
from specwatch.specdecode.costprofile import EMBEDDED_CPU_PROFILE

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
GENERATED = DASHBOARDS / "generated"
RULES = sorted((ROOT / "prometheus" / "rules").glob("*.yml"))
SPECWATCH = Path(sys.executable).parent / "specwatch"
SCRAPE = "2s"
RATE_INTERVAL = "1m"  # Grafana: max(4 x scrape interval, step + scrape interval) -> >= 8s; 1m is safe
EXPORTER_WINDOW = "1m"

pytestmark = [
    pytest.mark.realvllm,
    pytest.mark.prometheus,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian prometheus not installed"),
]

# (dashboard file, panel title) -> why it may stay empty in this test.
EXPECTED_EMPTY = {
    ("load-test.json", "Measured speedup by concurrency"):
        "needs a baseline (no speculation) server run besides the speculative one; this machine runs "
        "one vLLM at a time and the test starts only the speculative server",
    ("speculative-decoding.json", "SGLang: mean acceptance length by model"):
        "reads SGLang's request-finish counters (specwatch_sglang_*, schema sglang); the upstream here is vLLM",
    ("speculative-decoding.json", "SGLang: spec_accept_rate gauge (per rank)"):
        "passes through SGLang's sglang:spec_accept_rate gauge (schema sglang); the upstream here is vLLM",
}


def _job(selector: str) -> str:
    m = re.fullmatch(r'\s*job\s*=\s*"([^"]+)"\s*', selector)
    assert m, f"the live test needs a plain job=\"...\" selector, got {selector!r}"
    return m.group(1)


def _short_interval_rules(dest: Path) -> list[str]:
    """Copies of the repository's rule files with every group interval set to SCRAPE."""
    names = []
    for path in RULES:
        data = yaml.safe_load(path.read_text())
        for group in data["groups"]:
            group["interval"] = SCRAPE
        (dest / path.name).write_text(yaml.safe_dump(data, sort_keys=False))
        names.append(path.name)
    return names


def substitute(expr: str) -> str:
    """Grafana's variables -> values: All (``.+``) for multi-value variables, 1m for the window."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    expr = expr.replace('window=~"$window"', f'window=~"{EXPORTER_WINDOW}"')
    return re.sub(r'=~"\$[a-z_]+"', '=~".+"', expr)


@pytest.fixture(scope="module")
def stack(real_vllm, copy_traffic, prometheus_server, tmp_path_factory):
    """Start exporter, Prometheus and a load-generator run; yield (prometheus URL, start, end)."""
    from specwatch.mixin.config import DEFAULT_CONFIG as cfg

    work = tmp_path_factory.mktemp("live-dashboards")
    procs: list[subprocess.Popen] = []

    def spawn(name, args):
        with open(work / f"{name}.log", "w") as log:  # the child holds its own copy of the descriptor
            p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=work)
        procs.append(p)
        return p

    try:
        upstream = "spec"
        exp_port, bench_port = realstack.free_port(), realstack.free_port()
        exporter = spawn("exporter", [str(SPECWATCH), "serve", "--upstream", f"{upstream}={real_vllm.metrics_url}",
                                      # this machine's measured step times (the embedded default's profile)
                                      "--cost-profile", str(EMBEDDED_CPU_PROFILE), "--speculative-method", "ngram",
                                      "--listen-address", f"127.0.0.1:{exp_port}", "--window", EXPORTER_WINDOW,
                                      # the window the speedup panels and alerts read (MixinConfig.exporter_window)
                                      "--window", cfg.exporter_window])
        realstack.wait_http(f"http://127.0.0.1:{exp_port}/metrics", 60, exporter)

        rules_dir = work / "rules"
        rules_dir.mkdir()
        rule_files = _short_interval_rules(rules_dir)
        vllm_hostport = real_vllm.base_url.split("://", 1)[1].rstrip("/")
        realstack.write_prometheus_config(work / "prometheus.yml", {
            _job(cfg.vllm_selector): [(vllm_hostport, {"upstream": upstream})],
            _job(cfg.exporter_selector): [(f"127.0.0.1:{exp_port}", {})],
            _job(cfg.bench_selector): [(f"127.0.0.1:{bench_port}", {})],
        }, interval=SCRAPE, rule_files=[f"rules/{n}" for n in rule_files])
        prom_url = prometheus_server(work / "prometheus.yml")  # waits for /-/ready; stopped at session end

        start = time.time()
        # a few scrapes of the idle counters first (rates need two samples before the traffic)
        realstack.wait_for("3 scrapes of vLLM and the exporter", lambda: realstack.prometheus_has_samples(
            prom_url, f'min(count_over_time(up{{job=~"{_job(cfg.vllm_selector)}|{_job(cfg.exporter_selector)}"}}[1m]))', 3), 60)
        copy_traffic(n=4, concurrency=2, max_tokens=64)
        # The load generator: speculative cells at concurrency 1 and 2, scraped while it runs.
        bench = subprocess.run(
            [str(SPECWATCH), "bench", "--base-url", real_vllm.base_url, "--role", "speculative",
             "--dataset-name", "copy", "--max-concurrency", "1,2", "--num-batches", "3", "--warmup-batches", "1",
             "--output-len", "128", "--metrics-port", str(bench_port), "--no-save-result", "--no-progress",
             # stay scrapeable for 4 scrape intervals after the run: a fast machine finishes it in a few seconds
             "--metrics-linger", "8"],
            cwd=work, capture_output=True, text=True, timeout=900)
        assert bench.returncode == 0, bench.stdout[-2000:] + bench.stderr[-2000:]
        seen = _query_range(prom_url, f'up{{job="{_job(cfg.bench_selector)}"}} == 1', start, time.time())
        assert seen and len(seen[0]["values"]) >= 3, (
            "Prometheus scraped the load generator fewer than 3 times while it ran; bench output:\n"
            + bench.stdout[-2000:])
        copy_traffic(n=4, concurrency=2, max_tokens=64)
        # let the scrapes and the rule evaluations catch up: the exporter's lifetime counter in
        # Prometheus equals vLLM's, and a rule group evaluated after that scrape
        final = realstack.wait_for("vLLM idle", lambda: requests.get(real_vllm.metrics_url, timeout=5).text, 10)
        accepted = sum(s.value for f in text_string_to_metric_families(final) for s in f.samples
                       if s.name == "vllm:spec_decode_num_accepted_tokens_total")
        realstack.wait_for("Prometheus to scrape the final counters", lambda: realstack.prometheus_has_samples(
            prom_url, f'sum(specwatch_accepted_tokens_total{{upstream="{upstream}"}}) >= {accepted}'), 60)
        # every rule group evaluated after the final scrape (the shared wait also used by the compose test)
        groups = [g["name"] for n in rule_files for g in yaml.safe_load((rules_dir / n).read_text())["groups"]]
        composestack.wait_for_fresh_scrape_and_eval(prom_url, time.time(), groups=groups, timeout=60)
        end = time.time()
        yield prom_url, start, end
    finally:
        for p in reversed(procs):
            stop_process_group(p, 20)


def _query_range(prom_url: str, expr: str, start: float, end: float) -> list[dict]:
    r = requests.get(prom_url + "/api/v1/query_range",
                     params={"query": expr, "start": start, "end": end, "step": "2s"}, timeout=30)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{expr}\n-> {r.status_code} {body.get('error')}"
    return body["data"]["result"]


def _finite(result: list[dict]) -> bool:
    return any(math.isfinite(float(v)) for series in result for _, v in series["values"])


def _all_targets():
    for path in sorted(GENERATED.glob("*.json")):
        d = json.loads(path.read_text())
        for p in d["panels"]:
            if p["type"] == "row":
                continue
            yield path.name, d, p


PANELS = [(name, p["title"]) for name, d, p in _all_targets()]


@pytest.mark.parametrize("dashboard,title", PANELS, ids=[f"{d}:{t}" for d, t in PANELS])
def test_panel_returns_data(stack, dashboard, title):
    prom_url, start, end = stack
    panel = next(p for name, d, p in _all_targets() if name == dashboard and p["title"] == title)
    results = []
    for t in panel["targets"]:
        results.append(_query_range(prom_url, substitute(t["expr"]), start, end))  # must parse and run
    has_data = any(_finite(r) for r in results)
    if (dashboard, title) in EXPECTED_EMPTY:
        assert not has_data, f"{title} has data now: drop it from EXPECTED_EMPTY"
        return
    assert has_data, f"{dashboard}: panel {title!r} returned no data: {[t['expr'] for t in panel['targets']]}"
    for t, r in zip(panel["targets"], results, strict=True):  # and each target on its own, unless it is a baseline one
        # (or the withheld-recommendation target, which has samples only while the recommended k is withheld:
        # an uncertain choice, too little data in the window)
        if 'role="baseline"' not in t["expr"] and "specwatch_recommendation_withheld" not in t["expr"]:
            assert _finite(r), f"{dashboard}: {title!r} target {t['refId']} returned no data: {t['expr']}"


def test_expected_empty_panels_exist():
    assert set(EXPECTED_EMPTY) <= set(PANELS)


@pytest.mark.parametrize("dashboard", sorted(p.name for p in GENERATED.glob("*.json")))
def test_template_variables_list_values(stack, dashboard):
    """label_values(selector, label) as Grafana runs it (/api/v1/series), variables at All."""
    prom_url, start, end = stack
    d = json.loads((GENERATED / dashboard).read_text())
    for v in d["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+),\s*([a-zA-Z_]+)\)", v["query"])
        assert m, v["query"]
        r = requests.get(prom_url + "/api/v1/series",
                         params={"match[]": substitute(m.group(1)), "start": start, "end": end}, timeout=30)
        assert r.status_code == 200, r.text
        values = {s.get(m.group(2)) for s in r.json()["data"]} - {None}
        assert values, f"variable {v['name']} lists nothing: {v['query']}"
        if v["name"] == "window":
            assert EXPORTER_WINDOW in values
