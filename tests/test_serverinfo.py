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
    assert got == {(("drafter", "close"), ("method", "draft_model"), ("source", "flag"), ("upstream", "spec")): 1.0}
    reg2, _, _ = make_exporter({"spec": fixture("vllm-0.32-ngram-k4-after-traffic.txt")})
    assert series(reg2, "specwatch_speculative_method_info") == {}


def test_method_and_drafter_per_upstream():
    """Two upstreams running different drafters are told apart: each --upstream's own options label it
    (source upstream_flag) and pick its own cost-profile curve; the exporter-wide flags stay the default of
    the others (source flag). Same real close capture on both, the CPU profile (its draft_model curve is the
    target SmolLM2-135M-Instruct as drafter): only the upstream stated with that drafter gets a recommendation."""
    from specwatch.specdecode.costprofile import EMBEDDED_CPU_PROFILE

    close = fixture("vllm-0.32-draft-close-k3-after-traffic.txt")
    reg, _, _ = make_exporter({"t": close, "c": close, "g": fixture("vllm-0.32-ngram-k4-after-traffic.txt")},
                              cost_profile=str(EMBEDDED_CPU_PROFILE), speculative_method="ngram",
                              upstreams_options={"t": ",method=draft_model,drafter=SmolLM2-135M-Instruct",
                                                 "c": ",drafter=close,method=draft_model"})
    info = {dict(k)["upstream"]: (dict(k)["method"], dict(k)["drafter"], dict(k)["source"])
            for k in series(reg, "specwatch_speculative_method_info")}
    assert info == {"t": ("draft_model", "SmolLM2-135M-Instruct", "upstream_flag"),
                    "c": ("draft_model", "close", "upstream_flag"), "g": ("ngram", "", "flag")}
    rec = {dict(k)["upstream"] for k in series(reg, "specwatch_recommended_num_speculative_tokens", window="lifetime")}
    withheld = {dict(k)["upstream"]: dict(k)["reason"] for k in series(reg, "specwatch_recommendation_withheld",
                                                                        window="lifetime")}
    assert "t" in rec and "c" not in rec and withheld.get("c") == "no_cost_curve" and "t" not in withheld


@pytest.mark.parametrize("spec, message", [
    ("s=http://h:8000,drafter=", "non-empty value"),
    ("s=http://h:8000,method=a,method=b", "given twice"),
    ("s=http://h:8000,k=3", "unknown option"),
    ("s=http://h:8000,method", "unknown option"),
    ("s=http://h:8000/metrics?a=1,2", "unknown option"),
])
def test_bad_upstream_options_are_one_line_errors(spec, message):
    from specwatch.exporter.config import ConfigError, build_config

    with pytest.raises(ConfigError, match=message) as exc:
        build_config([spec])
    assert "\n" not in str(exc.value)


def test_upstream_options_parse_and_default():
    from specwatch.exporter.config import build_config

    cfg = build_config(["a=http://h:1,method=draft_model,drafter=/m/close", "http://h:2", "http://[::1]:3/metrics"],
                       speculative_method="ngram")
    a, b, c = cfg.upstreams
    assert (a.name, a.metrics_url, a.speculative_method, a.drafter, a.method_source) == (
        "a", "http://h:1/metrics", "draft_model", "/m/close", "upstream_flag")
    assert (b.name, b.speculative_method, b.drafter, b.method_source) == ("h:2", "ngram", None, "flag")
    assert (c.name, c.metrics_url) == ("[::1]:3", "http://[::1]:3/metrics")
    plain = build_config(["http://h:2"]).upstreams[0]
    assert (plain.speculative_method, plain.drafter, plain.options_source) == (None, None, None)


def test_the_serve_cli_refuses_a_per_upstream_method_the_profile_lacks():
    from click.testing import CliRunner

    from specwatch.exporter.server import serve
    from specwatch.specdecode.costprofile import EMBEDDED_CPU_PROFILE

    r = CliRunner().invoke(serve, ["--once", "--upstream", "s=http://127.0.0.1:9,method=eagle",
                                   "--cost-profile", str(EMBEDDED_CPU_PROFILE)])
    assert r.exit_code == 2 and "--upstream s method 'eagle'" in r.output and "has no curve" in r.output
