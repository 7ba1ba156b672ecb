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


SERVER_INFO = {"vllm_config": {"speculative_config": {"method": "draft_model", "model": "/m/close", "num_speculative_tokens": 3},
                               "model_config": {"model": "/m/target"}}}


def _sources(reg) -> set[str]:
    return {dict(k)["source"] for k in series(reg, "specwatch_speculative_method_info")}


def test_server_info_url_is_the_configured_upstreams_own():
    from specwatch.exporter.config import parse_upstream

    assert parse_upstream("s=http://h:8000,server_info=on").server_info_url == "http://h:8000/server_info?config_format=json"
    up = parse_upstream("s=https://h/vllm/a/metrics?x=1,server_info=on")
    assert up.read_server_info and up.server_info_url == "https://h/vllm/a/server_info?config_format=json"
    assert not parse_upstream("s=http://h:8000").read_server_info
    assert not parse_upstream("s=http://h:8000,server_info=off").read_server_info


def test_opt_in_server_info_labels_the_method_and_feeds_the_cost_lookup():
    """With ,server_info=on the exporter reads the upstream's own dev-mode /server_info once (then every
    5 minutes): specwatch_speculative_method_info{source="server_info"} says what the server runs, and with no
    method/drafter stated it picks the cost curve; the CPU profile has none for drafter /m/close, so the
    recommendation is withheld (no_cost_curve) instead of a guess. Without the option it is never fetched."""
    import json

    from specwatch.specdecode.costprofile import EMBEDDED_CPU_PROFILE

    close = fixture("vllm-0.32-draft-close-k3-after-traffic.txt")
    reg, fetcher, clock = make_exporter({"spec": close, "other": close}, cost_profile=str(EMBEDDED_CPU_PROFILE),
                                        upstreams_options={"spec": ",server_info=on"})
    fetcher.bodies["spec#server_info"] = json.dumps(SERVER_INFO)
    info = series(reg, "specwatch_speculative_method_info")
    assert info == {(("drafter", "/m/close"), ("method", "draft_model"), ("source", "server_info"), ("upstream", "spec")): 1.0}
    withheld = {dict(k)["upstream"]: dict(k)["reason"] for k in series(reg, "specwatch_recommendation_withheld", window="lifetime")}
    assert withheld == {"spec": "no_cost_curve"}  # "other": not stated, not read: the profile's first curve (ngram)
    clock.t += 30
    series(reg, "specwatch_up")
    assert fetcher.calls.count("spec#server_info") == 1 and "other#server_info" not in fetcher.calls
    assert _sources(reg) == {"server_info"}  # kept between reads


def test_a_failing_server_info_never_fails_the_upstream():
    reg, fetcher, _ = make_exporter({"spec": fixture("vllm-0.32-draft-close-k3-after-traffic.txt")},
                                    upstreams_options={"spec": ",server_info=on,method=draft_model"})
    fetcher.bodies["spec#server_info"] = "<html>not json</html>"
    assert series(reg, "specwatch_up") == {(("upstream", "spec"),): 1.0}
    assert _sources(reg) == {"upstream_flag"}


def test_serve_reads_server_info_over_http_from_the_configured_host_only():
    """The real fetch path (aiohttp, `specwatch serve --once`): /metrics and /server_info?config_format=json
    of the configured upstream, nothing else."""
    import json

    from click.testing import CliRunner

    from httpstub import QuietHandler, base_url, send, serve_in_thread
    from specwatch.exporter.server import serve

    seen = []
    bodies = {"/metrics": fixture("vllm-0.32-draft-close-k3-after-traffic.txt").encode(),
              "/server_info?config_format=json": json.dumps(SERVER_INFO).encode()}

    class H(QuietHandler):
        def do_GET(self):  # http.server API
            seen.append(self.path)
            body = bodies.get(self.path)
            send(self, body or b"", code=200 if body else 404)

    with serve_in_thread(H) as srv:
        r = CliRunner().invoke(serve, ["--once", "--upstream", f"s={base_url(srv)},server_info=on"])
    assert r.exit_code == 0, r.output
    assert sorted(seen) == ["/metrics", "/server_info?config_format=json"]
    assert ('specwatch_speculative_method_info{drafter="/m/close",method="draft_model",source="server_info",upstream="s"} 1.0'
            in r.output)
