"""The load generator against real vLLM data: captured /metrics of vLLM 0.32 (tests/fixtures/metrics,
real) and, with the ``real_vllm`` session fixture, a live server."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.bench.records import BenchBatch
from specwatch.bench.runner import BenchConfig, run_bench, spec_stats
from specwatch.bench.workloads import WorkloadOptions
from specwatch.specdecode.metrics import parse_metrics

FIX = Path(__file__).parents[1] / "fixtures" / "metrics"


def totals(text: str) -> dict[str, float]:
    """Sum of each vllm:spec_decode_*_total / generation counter over its samples (``_created`` excluded),
    per position for the per-position counter — read with prometheus_client's parser."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.endswith("_total") or not (s.name.startswith("vllm:spec_decode") or s.name == "vllm:generation_tokens_total"):
                continue
            key = s.name + (f"[{s.labels['position']}]" if "position" in s.labels else "")
            out[key] = out.get(key, 0.0) + s.value
    return out


@pytest.mark.parametrize("k", [2, 4])
def test_deltas_from_real_captures(k):
    fresh = FIX / f"vllm-0.32-ngram-k{k}-fresh.txt"
    after = FIX / f"vllm-0.32-ngram-k{k}-after-traffic.txt"
    if not (fresh.exists() and after.exists()):
        pytest.skip("real captures not present")
    a_text, b_text = fresh.read_text(), after.read_text()
    st = spec_stats(parse_metrics(a_text), parse_metrics(b_text), "smollm2")
    ta, tb = totals(a_text), totals(b_text)
    d = {key: tb[key] - ta.get(key, 0.0) for key in tb}
    p = "vllm:spec_decode_num_"
    rec = BenchBatch.json_of_fields(**st.fields())
    assert rec["spec_decode_num_drafts"] == d[p + "drafts_total"] > 0
    assert rec["spec_decode_draft_tokens"] == d[p + "draft_tokens_total"]
    assert rec["spec_decode_accepted_tokens"] == d[p + "accepted_tokens_total"]
    assert rec["spec_decode_acceptance_rate"] == pytest.approx(100 * d[p + "accepted_tokens_total"] / d[p + "draft_tokens_total"])
    assert rec["spec_decode_acceptance_length"] == pytest.approx(1 + d[p + "accepted_tokens_total"] / d[p + "drafts_total"])
    per = [d[f"{p}accepted_tokens_per_pos_total[{i}]"] / d[p + "drafts_total"] for i in range(k)]
    assert rec["spec_decode_per_position_acceptance_rates"] == pytest.approx(per)
    assert rec["spec_decode_num_speculative_tokens"] == k
    assert rec["spec_decode_generation_tokens"] == d["vllm:generation_tokens_total"]


def _metrics(url: str) -> str:
    return urllib.request.urlopen(url, timeout=30).read().decode()


@pytest.mark.realvllm
def test_copy_batch_on_real_vllm(real_vllm, tmp_path):
    srv = real_vllm
    base_url, metrics_url, name, k = srv.base_url, srv.metrics_url, srv.served_model_name, srv.k
    assert k and k > 0, "the real_vllm fixture must run speculative decoding"
    before = totals(_metrics(metrics_url))
    cfg = BenchConfig(base_url=base_url, served_model_name=name, workloads=("copy",), concurrencies=(2,),
                      num_prompts=2, num_batches=1, warmup_batches=0, options=WorkloadOptions(output_len=48),
                      metrics_url=metrics_url, result_dir=str(tmp_path), progress=False, equivalence=False)
    res = run_bench(cfg)
    after = totals(_metrics(metrics_url))
    (b,) = res.batches
    assert b.failed == 0, b.errors
    assert b.completed == 2 and b.total_output_tokens == 96 and b.output_tokens_from_usage
    rec = b.to_record().to_json()
    p = "vllm:spec_decode_num_"
    # nothing else talks to the fixture's server during the test: run delta = batch delta
    assert rec["spec_decode_accepted_tokens"] == after[p + "accepted_tokens_total"] - before[p + "accepted_tokens_total"]
    assert rec["spec_decode_draft_tokens"] == after[p + "draft_tokens_total"] - before[p + "draft_tokens_total"]
    assert rec["spec_decode_num_drafts"] == after[p + "drafts_total"] - before[p + "drafts_total"]
    assert rec["spec_decode_generation_tokens"] == 96
    assert rec["spec_decode_acceptance_rate"] > 50.0
    assert len(rec["spec_decode_per_position_acceptance_rates"]) == k
    doc = json.loads(res.json_path.read_text())
    assert doc["batches"][0]["spec_decode_acceptance_rate"] == pytest.approx(rec["spec_decode_acceptance_rate"])
