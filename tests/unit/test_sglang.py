"""SGLang as an upstream (schema ``sglang``), on the CONSTRUCTED SGLang 0.5.23 fixtures
(scripts/construct_sglang_fixtures.py; names/labels from the 0.5.23 wheel's metrics_collector.py).

Hand-computed expectations (the fixture values are in that script):
- after-traffic: gen 1200 + 300 = 1500, finished 10 + 2 = 12, verify 496
  → lifetime mean acceptance length (1500 − 12) / 496 = 3.0
- later: gen 1800 + 500 = 2300, finished 20, verify 896
  → lifetime (2300 − 20) / 896 = 2.544642857…; window after-traffic → later:
    (800 − 8) / 400 = 1.98
- after-restart: gen 400, finished 4, verify 132 → counters restarted; window from 0:
  (400 − 4) / 132 = 3.0
"""

from __future__ import annotations

import math

import pytest

from exporter_helpers import fixture, make_exporter, series
from specwatch.specdecode.metrics import InvalidValueError, MetricsParseError, parse_metrics

PRE = "sglang-0.5.23-eagle-tp2-dp2-"
MODEL = "Qwen/Qwen3-32B"


def body(name: str) -> str:
    return fixture(PRE + name + "-constructed.txt")


def test_parser_sums_counters_over_streaming_and_keeps_gauges_per_rank():
    snap = parse_metrics(body("after-traffic"))
    assert snap.schema == "sglang" and snap.spec_decode_enabled
    c = snap.sglang[MODEL]
    assert (c.generation_tokens, c.finished_requests, c.verify_calls) == (1500, 12, 496)
    assert c.mean_acceptance_length == pytest.approx((1500 - 12) / 496)
    assert set(snap.sglang_gauges) == {(MODEL, "tp0 pp0 dp0 ep0"), (MODEL, "tp0 pp0 dp1 ep0")}
    g1 = snap.sglang_gauges[(MODEL, "tp0 pp0 dp1 ep0")]
    assert (g1.accept_rate, g1.accept_length) == (0.69, 3.1)
    assert dict(g1.others)["spec_num_draft_tokens"] == 4
    assert snap.running_requests == {(MODEL, ""): 8.0}  # 5 + 3 over the dp ranks
    assert snap.counters == {}  # no vLLM-style counters: no per-position, no what-if


def test_fresh_and_nospec_bodies():
    fresh = parse_metrics(body("fresh"))
    assert fresh.schema == "sglang" and fresh.sglang == {}
    assert fresh.spec_decode_enabled  # spec_num_steps 3 says speculation is configured
    off = parse_metrics(fixture("sglang-0.5.23-nospec-constructed.txt"))
    assert off.schema == "sglang" and not off.spec_decode_enabled
    assert off.sglang[MODEL].verify_calls is None and off.sglang[MODEL].mean_acceptance_length is None


def test_nan_gauge_is_dropped_nan_counter_is_invalid():
    snap = parse_metrics(body("nan-gauge"))
    assert snap.sglang_gauges[(MODEL, "tp0 pp0 dp1 ep0")].accept_rate is None
    assert snap.sglang_gauges[(MODEL, "tp0 pp0 dp0 ep0")].accept_rate == 0.61
    bad = body("after-traffic").replace("spec_verify_calls_total{engine_type=\"unified\",model_name=\"Qwen/Qwen3-32B\"} 496.0",
                                        "spec_verify_calls_total{engine_type=\"unified\",model_name=\"Qwen/Qwen3-32B\"} NaN")
    assert bad != body("after-traffic")
    with pytest.raises(InvalidValueError):
        parse_metrics(bad)


def test_verify_calls_without_generation_tokens_is_a_partial_body():
    text = "\n".join(line for line in body("after-traffic").splitlines() if not line.startswith("sglang:generation_tokens_total"))
    with pytest.raises(MetricsParseError, match="lack sglang:generation_tokens_total"):
        parse_metrics(text + "\n")


def _mean(reg, window):
    s = series(reg, "specwatch_mean_acceptance_length", upstream="s", model_name=MODEL, window=window)
    assert len(s) <= 1
    return next(iter(s.values()), None)


def test_exporter_windows_sum_before_dividing_and_survive_a_restart():
    reg, fetcher, clock = make_exporter({"s": body("after-traffic")}, windows=("1m",))
    first = series(reg, "specwatch_upstream_info", upstream="s")
    assert list(first.values()) == [1.0] and dict(next(iter(first)))["schema"] == "sglang"
    assert _mean(reg, "lifetime") == pytest.approx(3.0)
    clock.t += 30
    fetcher.bodies["s"] = body("later")
    assert _mean(reg, "lifetime") == pytest.approx((2300 - 20) / 896)
    assert _mean(reg, "1m") == pytest.approx((800 - 8) / 400)  # 1.98, not a ratio of ratios
    assert series(reg, "specwatch_sglang_verify_calls_total", upstream="s") == {
        (("engine", ""), ("model_name", MODEL), ("upstream", "s")): 896.0}
    clock.t += 30
    fetcher.bodies["s"] = body("after-restart")
    got = _mean(reg, "1m")
    # restart: the engine counts the new process from 0, so the last minute holds
    # nothing of the old process after its baseline (after-traffic→later = 800/8/400) plus the new 400/4/132
    assert got == pytest.approx((800 - 8 + 400 - 4) / (400 + 132))
    assert series(reg, "specwatch_up", upstream="s") == {(("upstream", "s"),): 1.0}


def test_gauges_passed_through_per_rank_and_nothing_stale():
    reg, fetcher, clock = make_exporter({"s": body("after-traffic")}, windows=("1m",))
    rates = series(reg, "specwatch_sglang_spec_accept_rate", upstream="s")
    assert sorted(rates.values()) == [0.61, 0.69]
    assert {dict(k)["rank"] for k in rates} == {"tp0 pp0 dp0 ep0", "tp0 pp0 dp1 ep0"}
    fetcher.bodies["s"] = body("nan-gauge")
    clock.t += 5
    rates = series(reg, "specwatch_sglang_spec_accept_rate", upstream="s")
    assert list(rates.values()) == [0.61]  # dp1 NaN: absent, not the old 0.69
    assert all(math.isfinite(v) for v in rates.values())


def test_what_if_and_recommended_k_absent_with_a_reason():
    reg, _, _ = make_exporter({"s": body("after-traffic")}, windows=("1m",))
    for name in ("specwatch_position_acceptance_rate", "specwatch_expected_acceptance_length",
                 "specwatch_recommended_num_speculative_tokens", "specwatch_speedup", "specwatch_draft_acceptance_rate"):
        assert series(reg, name, upstream="s") == {}
        reasons = series(reg, "specwatch_not_derivable", upstream="s", series=name)
        assert len(reasons) == 1 and "sglang" in dict(next(iter(reasons)))["reason"]


def test_bad_bodies_make_only_that_upstream_down():
    missing = "\n".join(line for line in body("after-traffic").splitlines() if "num_requests_total{" not in line) + "\n"
    reg, fetcher, clock = make_exporter({"bad": missing, "ok": body("after-traffic")}, windows=("1m",))
    up = {dict(k)["upstream"]: v for k, v in series(reg, "specwatch_up").items()}
    assert up == {"bad": 0.0, "ok": 1.0}
    errs = series(reg, "specwatch_upstream_fetch_errors_total", upstream="bad")
    assert {dict(k)["reason"] for k in errs} == {"parse"}
    assert series(reg, "specwatch_mean_acceptance_length", upstream="bad") == {}
