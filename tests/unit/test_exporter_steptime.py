"""Issue #12 item 1: live step time from vLLM's own histograms, per window, on real captures.

Expected values are computed here from the raw samples of the real vLLM 0.32 captures (which
hold ``vllm:inter_token_latency_seconds``, ``vllm:iteration_tokens_total`` and
``vllm:time_to_first_token_seconds``), independently of specwatch's parser. The fresh and
after-traffic captures of one configuration come from the same server process, so their
difference is exactly the copy traffic sent in between.
"""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter_helpers import fixture, make_exporter, raw_value, scrape, series
from specwatch.exporter.windows import StepValues, WindowValues

ITL = "vllm:inter_token_latency_seconds"
STEP_SERIES = ("specwatch_step_duration_seconds", "specwatch_engine_steps_per_second",
               "specwatch_running_requests", "specwatch_request_decode_tokens_per_second")
L = '{engine="0",model_name="smollm2"}'


def _pair(tag: str) -> tuple[str, str]:
    return fixture(f"vllm-0.32-{tag}-fresh.txt"), fixture(f"vllm-0.32-{tag}-after-traffic.txt")


def _v(text, name):
    return raw_value(text, name, model_name="smollm2", engine="0")


def _d(before: str, after: str, name: str) -> float:
    return raw_value(after, name) - raw_value(before, name)


@pytest.mark.parametrize("tag", ["ngram-k2", "ngram-k4", "ngram-k8", "nospec"])
def test_step_series_equal_the_histogram_increases(tag):
    fresh, after = _pair(tag)
    # a fetch in the middle with 3 running requests (the captures were taken idle)
    middle = fresh.replace(f"vllm:num_requests_running{L} 0.0", f"vllm:num_requests_running{L} 3.0")
    assert middle != fresh
    reg, fetcher, clock = make_exporter({"s": fresh}, windows=("1m",))
    scrape(reg)
    clock.t += 15
    fetcher.bodies["s"] = middle
    scrape(reg)
    clock.t += 15
    fetcher.bodies["s"] = after
    samples = scrape(reg)

    def one(name):
        got = series(samples, name, window="1m", model_name="smollm2", engine="0")
        assert len(got) == 1, (name, got)
        return next(iter(got.values()))

    step = _d(fresh, after, ITL + "_sum") / _d(fresh, after, ITL + "_count")
    assert one("specwatch_step_duration_seconds") == pytest.approx(step, rel=1e-12)
    assert one("specwatch_engine_steps_per_second") == pytest.approx(
        _d(fresh, after, "vllm:iteration_tokens_total_count") / 30.0, rel=1e-12)
    assert one("specwatch_running_requests") == pytest.approx((3.0 + 0.0) / 2)
    decode = (_d(fresh, after, "vllm:generation_tokens_total") - _d(fresh, after, "vllm:time_to_first_token_seconds_count")) \
        / _d(fresh, after, ITL + "_sum")
    assert one("specwatch_request_decode_tokens_per_second") == pytest.approx(decode, rel=1e-12)
    # plausibility of the real numbers: a 135M model on 2 CPU cores steps in 10-200 ms
    assert 0.01 < step < 0.2
    # b per step: Δ ITL count / Δ iteration count
    assert one("specwatch_running_requests_per_step") == pytest.approx(
        _d(fresh, after, ITL + "_count") / _d(fresh, after, "vllm:iteration_tokens_total_count"), rel=1e-12)
    # lifetime: ratios of the cumulative counters since the server started; no per-second rate of
    # steps (that needs the exporter's own time span)
    life = series(samples, "specwatch_step_duration_seconds", window="lifetime")
    assert list(life.values()) == [pytest.approx(_v(after, ITL + "_sum") / _v(after, ITL + "_count"), rel=1e-12)]
    assert series(samples, "specwatch_engine_steps_per_second", window="lifetime") == {}


def test_speculation_shows_in_step_time_and_decode_speed():
    """Same traffic with and without ngram k=4: a speculative step is slower (drafting + verify
    of 5 positions) yet a request gets more tokens per second."""
    out = {}
    for tag in ("ngram-k4", "nospec"):
        fresh, after = _pair(tag)
        reg, fetcher, clock = make_exporter({"s": fresh}, windows=("1m",))
        scrape(reg)
        clock.t += 30
        fetcher.bodies["s"] = after
        samples = scrape(reg)
        out[tag] = {n: next(iter(series(samples, n, window="1m").values())) for n in STEP_SERIES}
    assert out["ngram-k4"]["specwatch_step_duration_seconds"] > out["nospec"]["specwatch_step_duration_seconds"]
    assert out["ngram-k4"]["specwatch_request_decode_tokens_per_second"] > out["nospec"]["specwatch_request_decode_tokens_per_second"]


def test_zero_denominators_are_absent_not_zero():
    fresh, _ = _pair("ngram-k4")
    reg, fetcher, clock = make_exporter({"s": fresh}, windows=("1m",))
    scrape(reg)
    clock.t += 10
    samples = scrape(reg)  # no traffic: ITL count and sum did not move
    assert series(samples, "specwatch_step_duration_seconds") == {}
    assert series(samples, "specwatch_request_decode_tokens_per_second") == {}
    # a measured zero is a value: no engine steps in 10 s, no running requests
    assert list(series(samples, "specwatch_engine_steps_per_second").values()) == [0.0]
    assert list(series(samples, "specwatch_running_requests").values()) == [0.0]
    # one fetch only: no span yet, nothing at all
    reg2, _, _ = make_exporter({"s": fresh}, windows=("1m",))
    assert not any(series(reg2, n) for n in STEP_SERIES)


@pytest.mark.parametrize("name", ["vllm-0.6-v0-ngram-k4-constructed.txt", "vllm-0.8.3-v1-early-constructed.txt",
                                  "llamacpp-ngram-k4-constructed.txt", "vllm-0.32-v1-dp2-ngram-k4-constructed.txt"])
def test_upstreams_without_the_histograms_serve_acceptance_as_before_and_no_step_series(name):
    text = fixture(name)
    reg, fetcher, clock = make_exporter({"s": text}, windows=("1m",))
    first = scrape(reg)
    clock.t += 30
    samples = scrape(reg)
    assert list(series(samples, "specwatch_up").values()) == [1.0]
    assert not any(series(samples, n) for n in STEP_SERIES)
    assert series(first, "specwatch_draft_acceptance_rate", window="lifetime")


def test_window_values_api_for_derived_series():
    """The typed per-(upstream, model_name, engine, window) object the speedup builds on."""
    fresh, after = _pair("ngram-k4")
    reg, fetcher, clock = make_exporter({"spec": fresh, "base": _pair("nospec")[0]}, windows=("1m", "5m"))
    scrape(reg)
    clock.t += 30
    fetcher.bodies["spec"] = after
    fetcher.bodies["base"] = _pair("nospec")[1]
    scrape(reg)
    wvs = reg.specwatch_collector.window_values()
    assert {(w.upstream, w.window) for w in wvs} == {("spec", "1m"), ("spec", "5m"), ("base", "1m"), ("base", "5m")}
    spec = next(w for w in wvs if w.upstream == "spec" and w.window == "1m")
    assert isinstance(spec, WindowValues) and isinstance(spec.step, StepValues)
    assert (spec.model_name, spec.engine, spec.span_seconds, spec.fetches) == ("smollm2", "0", 30.0, 1)
    assert spec.counters.drafts == _d(fresh, after, "vllm:spec_decode_num_drafts_total")
    assert spec.counters.accepted_per_position == tuple(
        raw_value(after, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=i)
        - raw_value(fresh, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=i) for i in range(4))
    assert spec.step.step_duration_seconds == pytest.approx(_d(fresh, after, ITL + "_sum") / _d(fresh, after, ITL + "_count"))
    base = next(w for w in wvs if w.upstream == "base" and w.window == "1m")
    assert base.counters is None and base.step is not None and base.step.step_duration_seconds > 0


def test_help_texts_name_the_source_metric_and_formula():
    fresh, after = _pair("ngram-k4")
    reg, fetcher, clock = make_exporter({"s": fresh}, windows=("1m",))
    scrape(reg)
    clock.t += 30
    fetcher.bodies["s"] = after
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    assert "vllm:inter_token_latency_seconds_sum" in fams["specwatch_step_duration_seconds"].documentation
    assert "vllm:iteration_tokens_total_count" in fams["specwatch_engine_steps_per_second"].documentation
    assert "vllm:num_requests_running" in fams["specwatch_running_requests"].documentation
    doc = fams["specwatch_request_decode_tokens_per_second"].documentation
    assert "vllm:generation_tokens_total" in doc and "vllm:time_to_first_token_seconds_count" in doc
