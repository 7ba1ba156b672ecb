"""What the server publishes about its speculative method and drafter (specwatch.specdecode.serverinfo)
and the exporter's specwatch_speculative_method_info."""

from __future__ import annotations

import pytest

from exporter_helpers import fixture, make_exporter, series
from specwatch.specdecode.serverinfo import SpeculativeInfo, speculative_info


def test_server_info_speculative_config():
    body = {"vllm_config": {"speculative_config": {"method": "draft_model", "model": "/m/close", "num_speculative_tokens": 3}}}
    assert speculative_info(body) == SpeculativeInfo("draft_model", "/m/close", 3)
    ngram = {"vllm_config": {"speculative_config": {"method": "ngram", "model": "/m/target", "num_speculative_tokens": 4}}}
    assert speculative_info(ngram) == SpeculativeInfo("ngram", None, 4)
    assert speculative_info({"vllm_config": {"speculative_config": None}}) is None
    for bad in ({}, {"vllm_config": "x"}, {"vllm_config": {"speculative_config": [1]}}):
        with pytest.raises(ValueError):
            speculative_info(bad)


def test_cache_config_info_says_nothing_about_speculation():
    """Real captures: the label names of vllm:cache_config_info are the same with and without speculation."""
    from prometheus_client.parser import text_string_to_metric_families

    def labels(name):
        return {k for f in text_string_to_metric_families(fixture(name)) if f.name == "vllm:cache_config_info"
                for s in f.samples for k in s.labels}
    spec, plain = labels("vllm-0.32-ngram-k4-fresh.txt"), labels("vllm-0.32-nospec-fresh.txt")
    assert spec == plain and spec and not any("specul" in k or "draft" in k for k in spec)


def test_exporter_reports_the_configured_method_and_drafter_only_where_speculation_runs():
    reg, _, _ = make_exporter({"spec": fixture("vllm-0.32-ngram-k4-after-traffic.txt"),
                               "plain": fixture("vllm-0.32-nospec-after-traffic.txt")},
                              speculative_method="draft_model", drafter="close")
    got = series(reg, "specwatch_speculative_method_info")
    assert got == {(("drafter", "close"), ("method", "draft_model"), ("source", "configured"), ("upstream", "spec")): 1.0}
    reg2, _, _ = make_exporter({"spec": fixture("vllm-0.32-ngram-k4-after-traffic.txt")})
    assert series(reg2, "specwatch_speculative_method_info") == {}
