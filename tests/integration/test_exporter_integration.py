"""The exporter against the real vLLM (ngram k=4) with a real Prometheus scraping it.

vLLM's counters are read from its own /metrics once they have settled after the traffic (vLLM
folds a step's stats in after the client has its last token), bracketing the exporter's fetch,
so vLLM's formulas applied to vLLM's counters must give exactly what the exporter serves
(relative 1e-9: both are the same float divisions of the same printed values).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from exporter_helpers import raw_samples, raw_value
import realstack
from realstack import free_port
from specwatch.common.processes import stop_process_group

pytestmark = [pytest.mark.realvllm, pytest.mark.prometheus]
P = "vllm:spec_decode_num_"
NAMES = ("drafts_total", "draft_tokens_total", "accepted_tokens_total")


def _exporter_values(port: int) -> list[tuple[str, dict, float]]:
    return raw_samples(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text)


def _one(samples, name, **labels) -> float:
    vals = [v for n, l, v in samples if n == name and all(l.get(k) == str(x) for k, x in labels.items())]
    assert len(vals) == 1, (name, labels, vals)
    return vals[0]


@pytest.fixture(scope="module")
def exporter(real_vllm):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "specwatch", "serve", "--upstream", f"spec={real_vllm.base_url}",
                             "--window", "30s", "--listen-address", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    realstack.wait_http(f"http://127.0.0.1:{port}/metrics", 60, proc)  # the project's readiness wait
    yield port
    stop_process_group(proc, 10)


def test_exporter_on_real_vllm(real_vllm, copy_traffic, exporter, prometheus_server, tmp_path):
    k = real_vllm.k
    cfg = tmp_path / "prometheus.yml"
    realstack.write_prometheus_config(cfg, {"specwatch": [(f"127.0.0.1:{exporter}", {})]}, interval="2s")
    prom = prometheus_server(cfg)

    _exporter_values(exporter)  # a first fetch: the window's baseline
    copy_traffic(n=4, concurrency=2, max_tokens=96)

    def same_moment():
        # vLLM's counters settled, the exporter's fetch, and vLLM's counters unchanged after it:
        # both sides read the same printed values
        before = realstack.settled_metrics(real_vllm.metrics_url)
        exp = _exporter_values(exporter)
        after = requests.get(real_vllm.metrics_url, timeout=30).text
        same = [raw_value(before, P + n) for n in NAMES] == [raw_value(after, P + n) for n in NAMES]
        return (before, exp) if same else None

    vllm_text, exp = realstack.wait_for("one reading of vLLM's counters and the exporter's", same_moment, 120)

    drafts = raw_value(vllm_text, P + "drafts_total")
    draft_tokens = raw_value(vllm_text, P + "draft_tokens_total")
    accepted = raw_value(vllm_text, P + "accepted_tokens_total")
    per_pos = [raw_value(vllm_text, P + "accepted_tokens_per_pos_total", position=i) for i in range(k)]
    assert drafts > 0 and accepted > 0, "copy traffic must produce accepted drafts"
    life = dict(upstream="spec", window="lifetime")
    assert _one(exp, "specwatch_draft_acceptance_rate", **life) == pytest.approx(accepted / draft_tokens, rel=1e-9)
    mean_len = _one(exp, "specwatch_mean_acceptance_length", **life)
    assert mean_len == pytest.approx(1 + accepted / drafts, rel=1e-9)
    rates = [_one(exp, "specwatch_position_acceptance_rate", position=i, **life) for i in range(k)]
    assert rates == pytest.approx([p / drafts for p in per_pos], rel=1e-9)
    assert sum(rates) == pytest.approx(mean_len - 1, rel=1e-9)
    assert _one(exp, "specwatch_num_speculative_tokens", upstream="spec") == k
    assert _one(exp, "specwatch_up", upstream="spec") == 1

    # the 30s window saw the burst; once no traffic came for longer than the window it empties
    assert _one(exp, "specwatch_draft_acceptance_rate", upstream="spec", window="30s") > 0
    def window_emptied():
        samples = _exporter_values(exporter)
        gone = not [s for s in samples if s[0] == "specwatch_draft_acceptance_rate" and s[1].get("window") == "30s"]
        return samples if gone else None

    quiet = realstack.wait_for("the 30s window to empty after the burst", window_emptied, 75, interval=1.0)
    assert _one(quiet, "specwatch_draft_acceptance_rate", **life) == pytest.approx(accepted / draft_tokens)

    # Prometheus scraped and stored the exporter's series
    r = requests.get(f"{prom}/api/v1/query", params={
        "query": 'specwatch_mean_acceptance_length{upstream="spec",window="lifetime"}'}, timeout=10).json()
    assert r["status"] == "success"
    stored = [float(x["value"][1]) for x in r["data"]["result"]]
    assert stored == [pytest.approx(mean_len, rel=1e-9)]
    r = requests.get(f"{prom}/api/v1/query", params={"query": 'up{job="specwatch"}'}, timeout=10).json()
    assert [x["value"][1] for x in r["data"]["result"]] == ["1"]
