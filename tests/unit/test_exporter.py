"""Exporter tests on real /metrics captured from the real vLLM (tests/fixtures/metrics/).

Expected values are computed here from the raw vLLM samples with vLLM's formulas, independently
of specwatch's parser, and compared with what the collector exposes.
"""

from __future__ import annotations

import math
import re

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter_helpers import (FetchError, fixture, make_exporter, raw_value,
                              real_fixtures, scrape, series, FIXTURES)
from specwatch.specdecode.metrics import MetricsParseError, parse_metrics

P = "vllm:spec_decode_num_"
REAL = real_fixtures()


def _k_of(path) -> int | None:
    m = re.search(r"-k(\d+)-", path.name)
    return int(m.group(1)) if m else None


def _after_traffic(k: int) -> str:
    return fixture(f"vllm-0.32-ngram-k{k}-after-traffic.txt")


def test_real_fixtures_present():
    names = {p.name for p in REAL}
    for k in (2, 4, 8):
        assert f"vllm-0.32-ngram-k{k}-fresh.txt" in names
        assert f"vllm-0.32-ngram-k{k}-after-traffic.txt" in names
    assert any("nospec" in n for n in names)
    assert any("restart" in n for n in names)


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_every_real_capture_parses(path):
    text = path.read_text()
    snap = parse_metrics(text)
    k = _k_of(path)
    if "nospec" in path.name:
        assert snap.schema == "none" and not snap.counters
        return
    assert snap.schema == "v1"
    assert snap.counters, "a speculative server exports its counters from start-up"
    for c in snap.counters.values():
        assert c.num_speculative_tokens == k
        assert c.drafts == raw_value(text, P + "drafts_total", model_name=c.model_name, engine=c.engine)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_lifetime_values_equal_vllm_formulas(k):
    text = _after_traffic(k)
    reg, _, _ = make_exporter({"spec": text})
    drafts = raw_value(text, P + "drafts_total")
    draft_tokens = raw_value(text, P + "draft_tokens_total")
    accepted = raw_value(text, P + "accepted_tokens_total")
    gen = raw_value(text, "vllm:generation_tokens_total")
    per_pos = [raw_value(text, P + "accepted_tokens_per_pos_total", position=i) for i in range(k)]
    assert drafts > 0 and accepted > 0, "the after-traffic capture must hold traffic"
    sel = dict(upstream="spec", window="lifetime")

    def one(name, **extra):
        vals = list(series(reg, name, **sel, **extra).values())
        assert len(vals) == 1, f"{name} {extra}: {vals}"
        return vals[0]

    assert one("specwatch_draft_acceptance_rate") == pytest.approx(accepted / draft_tokens)
    assert one("specwatch_mean_acceptance_length") == pytest.approx(1 + accepted / drafts)
    assert one("specwatch_draft_tokens_per_draft") == pytest.approx(draft_tokens / drafts)
    assert one("specwatch_output_from_drafts_ratio") == pytest.approx(accepted / gen)
    rates = [one("specwatch_position_acceptance_rate", position=i) for i in range(k)]
    assert rates == pytest.approx([p / drafts for p in per_pos])
    # per-position rates sum to the mean acceptance length minus one (Σ per_pos == accepted)
    assert sum(rates) == pytest.approx(one("specwatch_mean_acceptance_length") - 1)
    prev = 1.0
    for i, r in enumerate(rates):
        if prev > 0:
            assert one("specwatch_position_conditional_acceptance_rate", position=i) == pytest.approx(r / prev)
        prev = r
    for kk in range(1, k + 1):
        assert one("specwatch_expected_acceptance_length", k=kk) == pytest.approx(1 + sum(rates[:kk]))
    assert not series(reg, "specwatch_expected_acceptance_length", k=k + 1)
    assert list(series(reg, "specwatch_num_speculative_tokens", upstream="spec").values()) == [k]
    assert list(series(reg, "specwatch_accepted_tokens_total", upstream="spec").values()) == [accepted]
    # ragged drafts (k x drafts - draft_tokens beyond max(1, 0.5 % of drafts)) make the curve a lower bound
    missing = k * drafts - draft_tokens
    ragged = missing > max(1.0, 0.005 * drafts)
    basis = "lower_bound" if ragged else "exact"
    for name in ("specwatch_position_acceptance_rate", "specwatch_position_conditional_acceptance_rate",
                 "specwatch_expected_acceptance_length"):
        assert {dict(key)["basis"] for key in series(reg, name, **sel)} == {basis}, name
    assert one("specwatch_ragged_drafts") == (1.0 if ragged else 0.0)
    assert one("specwatch_missing_draft_tokens_ratio") == pytest.approx(missing / (k * drafts))
    speed = series(reg, "specwatch_speedup", **sel)
    # k' = 1 .. k, ragged curve or not (a lower-bound curve widens the what-if intervals upwards);
    # without a cost profile every one is the built-in guess, with a factor-2 interval
    assert len(speed) == k
    assert {dict(key)["basis"] for key in speed} == {"default"}
    lower = series(reg, "specwatch_speedup_lower", **sel)
    upper = series(reg, "specwatch_speedup_upper", **sel)
    assert set(lower) == set(upper) == set(speed)
    for key, v in speed.items():
        assert lower[key] < v < upper[key]
        assert upper[key] / lower[key] >= 3.9  # ln 2 either way: a guess cannot decide
    # a guess that wide tells no k apart: the best estimate is served, and says it is not certain (#36)
    rec = one("specwatch_recommended_num_speculative_tokens")
    best = max([1.0] + list(speed.values()))
    assert speed.get(next((key for key in speed if dict(key)["k"] == str(int(rec))), None), 1.0) >= best * 0.98
    assert one("specwatch_recommendation_certain") == 0.0
    assert not series(reg, "specwatch_recommendation_withheld", **sel)
    assert not series(reg, "specwatch_speculation_verdict", **sel), "no verdict from a guess"


@pytest.mark.parametrize("k", [2, 4, 8])
def test_fresh_server_has_counters_but_no_derived_values(k):
    reg, _, _ = make_exporter({"spec": fixture(f"vllm-0.32-ngram-k{k}-fresh.txt")})
    assert series(reg, "specwatch_up", upstream="spec") == {(("upstream", "spec"),): 1.0}
    assert len(series(reg, "specwatch_accepted_tokens_per_position_total")) == k
    for name in ("specwatch_draft_acceptance_rate", "specwatch_mean_acceptance_length",
                 "specwatch_position_acceptance_rate", "specwatch_expected_acceptance_length"):
        assert series(reg, name) == {}, f"{name} must be absent when its denominator is 0"


def test_server_without_speculation_is_reported_not_an_error():
    nospec = next(p for p in REAL if "nospec" in p.name and "after" in p.name)
    reg, _, _ = make_exporter({"plain": nospec.read_text()})
    assert list(series(reg, "specwatch_up").values()) == [1.0]
    assert list(series(reg, "specwatch_spec_decode_enabled").values()) == [0.0]
    assert list(series(reg, "specwatch_upstream_info", schema="none").values()) == [1.0]
    assert series(reg, "specwatch_drafts_total") == {}


def _constructed(name):
    text = fixture(name)
    assert text.startswith("# CONSTRUCTED")
    return text


def test_v0_uses_gauges_and_counter_ratio_never_counter_rates():
    text = _constructed("vllm-0.6-v0-ngram-k4-constructed.txt")
    reg, _, _ = make_exporter({"old": text}, windows=("1m",))
    assert list(series(reg, "specwatch_upstream_info").keys())[0][0] == ("schema", "v0")
    rate = raw_value(text, "vllm:spec_decode_draft_acceptance_rate")
    assert list(series(reg, "specwatch_v0_draft_acceptance_rate").values()) == [pytest.approx(rate)]
    assert list(series(reg, "specwatch_v0_spec_decode_efficiency").values()) == [
        pytest.approx(raw_value(text, "vllm:spec_decode_efficiency"))]
    ratio = raw_value(text, P + "accepted_tokens_total") / raw_value(text, P + "draft_tokens_total")
    assert list(series(reg, "specwatch_draft_acceptance_rate", window="lifetime").values()) == [pytest.approx(ratio)]
    assert series(reg, "specwatch_draft_tokens_total") == {}, "V0 counters are broken: not normalized"
    assert series(reg, "specwatch_draft_acceptance_rate", window="1m") == {}


def test_vllm_083_serves_what_can_be_derived():
    text = _constructed("vllm-0.8.3-v1-early-constructed.txt")
    reg, _, _ = make_exporter({"s": text})
    ratio = raw_value(text, P + "accepted_tokens_total") / raw_value(text, P + "draft_tokens_total")
    assert list(series(reg, "specwatch_draft_acceptance_rate").values()) == [pytest.approx(ratio)]
    assert series(reg, "specwatch_mean_acceptance_length") == {}
    assert series(reg, "specwatch_position_acceptance_rate") == {}
    assert series(reg, "specwatch_drafts_total") == {}
    assert list(series(reg, "specwatch_upstream_info").keys())[0][0] == ("schema", "v1-early")


def test_llamacpp_schema():
    text = _constructed("llamacpp-ngram-k4-constructed.txt")
    reg, _, _ = make_exporter({"l": text})
    drafts = raw_value(text, "llamacpp:spec_decode_num_drafts_total")
    acc = raw_value(text, "llamacpp:spec_decode_num_accepted_tokens_total")
    assert list(series(reg, "specwatch_mean_acceptance_length").values()) == [pytest.approx(1 + acc / drafts)]
    assert list(series(reg, "specwatch_upstream_info").keys())[0][0] == ("schema", "llamacpp")


def test_two_engines_are_kept_apart():
    text = _constructed("vllm-0.32-v1-dp2-ngram-k4-constructed.txt")
    reg, _, _ = make_exporter({"dp": text})
    by_engine = series(reg, "specwatch_draft_acceptance_rate", window="lifetime")
    engines = sorted(dict(k)["engine"] for k in by_engine)
    assert engines == ["0", "1"]
    for key, v in by_engine.items():
        e = dict(key)["engine"]
        expected = raw_value(text, P + "accepted_tokens_total", engine=e) / raw_value(text, P + "draft_tokens_total", engine=e)
        assert v == pytest.approx(expected)


# ---- windows -----------------------------------------------------------------------------------

def test_window_follows_traffic_between_real_captures():
    fresh, after = fixture("vllm-0.32-ngram-k4-fresh.txt"), _after_traffic(4)
    reg, fetcher, clock = make_exporter({"s": fresh}, windows=("1m",))
    series(reg, "specwatch_up")  # first scrape at t=1000: fresh counters
    clock.t += 30
    fetcher.bodies["s"] = after
    got = series(reg, "specwatch_draft_acceptance_rate", window="1m")
    # the window's increase is after - fresh (fresh is all zeros, so it equals the lifetime value)
    inc = raw_value(after, P + "accepted_tokens_total") - raw_value(fresh, P + "accepted_tokens_total")
    den = raw_value(after, P + "draft_tokens_total") - raw_value(fresh, P + "draft_tokens_total")
    assert list(got.values()) == [pytest.approx(inc / den)]
    # no new traffic for longer than the window: the window empties, the lifetime value stays
    clock.t += 61
    series(reg, "specwatch_up")
    clock.t += 10
    assert series(reg, "specwatch_draft_acceptance_rate", window="1m") == {}
    assert series(reg, "specwatch_draft_acceptance_rate", window="lifetime")


def test_window_handles_a_restart_like_prometheus_increase():
    after = _after_traffic(4)
    restart = next(p for p in REAL if "restart" in p.name).read_text()
    reg, fetcher, clock = make_exporter({"s": after}, windows=("5m",))
    series(reg, "specwatch_up")
    clock.t += 20
    fetcher.bodies["s"] = restart  # counters fell: the server restarted
    got = series(reg, "specwatch_draft_tokens_per_draft", window="5m")
    d_tokens = raw_value(restart, P + "draft_tokens_total")
    d_drafts = raw_value(restart, P + "drafts_total")
    if d_drafts:
        assert list(got.values()) == [pytest.approx(d_tokens / d_drafts)]
    else:
        assert got == {}
    life = series(reg, "specwatch_drafts_total")
    assert list(life.values()) == [d_drafts]


def test_history_is_bounded():
    text = _after_traffic(4)
    reg, fetcher, clock = make_exporter({"s": text}, windows=("30s",))
    coll = reg.specwatch_collector
    for _ in range(50):
        clock.t += 5
        series(reg, "specwatch_up")
    state = coll._states["s"]
    assert len(state.history) <= 30 / 5 + 2


# ---- bad input ---------------------------------------------------------------------------------

def _bad_bodies():
    good = _after_traffic(4)
    lines = good.splitlines(keepends=True)
    drop_accepted = "".join(l for l in lines if "num_accepted_tokens_total{" not in l)
    nan = re.sub(r"(vllm:spec_decode_num_drafts_total\{[^}]*\}) \S+", r"\1 NaN", good)
    inf = re.sub(r"(vllm:spec_decode_num_draft_tokens_total\{[^}]*\}) \S+", r"\1 +Inf", good)
    broken_label = good.replace('model_name="', 'model_name="a\nb', 1)
    return {
        "truncated": good[: len(good) // 2] + 'vllm:spec_decode_num_drafts_total{engine="0",model',
        "garbage": "\x00\x01 this is not { exposition ] text\n" * 20,
        "html": "<!doctype html><html><body><h1>Welcome</h1></body></html>\n",
        "empty": "",
        "missing-family": drop_accepted,
        "nan-counter": nan,
        "inf-counter": inf,
        "newline-in-label": broken_label,
        "unrelated-exporter": "# TYPE node_load1 gauge\nnode_load1 0.5\n",
        "too-large": good * 40,
    }


@pytest.mark.parametrize("case", sorted(_bad_bodies()))
def test_bad_body_gives_up_0_and_spares_the_other_upstream(case, caplog):
    body = _bad_bodies()[case]
    good = _after_traffic(4)
    reg, _, _ = make_exporter({"bad": body, "good": good}, max_body_bytes=len(good) * 4)
    with caplog.at_level("WARNING", logger="specwatch.exporter"):
        samples = scrape(reg)
    up = {dict(k)["upstream"]: v for k, v in series(samples, "specwatch_up").items()}
    assert up == {"bad": 0.0, "good": 1.0}
    for s in samples:
        if s.labels.get("upstream") == "bad":
            assert s.name in {"specwatch_up", "specwatch_scrape_duration_seconds",
                              "specwatch_upstream_fetch_errors_total", "specwatch_upstream_fetches_total",
                              "specwatch_invariant_violations_total"}, s
    assert series(samples, "specwatch_draft_acceptance_rate", upstream="good")
    msgs = [r.getMessage() for r in caplog.records if "upstream bad" in r.getMessage()]
    assert len(msgs) == 1, msgs


def test_escaped_quotes_in_label_values_are_fine():
    good = _after_traffic(4)
    text = good.replace('model_name="', 'model_name="a \\"quoted\\" ')
    reg, _, _ = make_exporter({"q": text})
    names = {dict(k)["model_name"] for k in series(reg, "specwatch_draft_acceptance_rate")}
    assert len(names) == 1 and '"quoted"' in names.pop()
    # and the rendering escapes them back so Prometheus can read it
    list(text_string_to_metric_families(generate_latest(reg).decode()))


def test_fetch_error_is_one_log_line_per_scrape(caplog):
    reg, _, _ = make_exporter({"down": FetchError("connect", "connection refused")})
    with caplog.at_level("WARNING", logger="specwatch.exporter"):
        samples = scrape(reg)
    assert [r.getMessage() for r in caplog.records] == ["upstream down: connect: connection refused"]
    assert list(series(samples, "specwatch_upstream_fetch_errors_total", reason="connect").values()) == [1.0]


def test_invariant_violation_is_counted_and_withholds_derived_values():
    good = _after_traffic(4)
    # make per_pos increase with position: position 3 gets a huge value
    bad = re.sub(r'(per_pos_total\{[^}]*position="3"[^}]*\}) \S+', r"\1 1e9", good)
    assert bad != good
    reg, _, _ = make_exporter({"s": bad})
    v = series(reg, "specwatch_invariant_violations_total", invariant="per_position_non_increasing")
    assert list(v.values()) == [1.0]
    assert series(reg, "specwatch_draft_acceptance_rate") == {}
    assert list(series(reg, "specwatch_up").values()) == [1.0]


def test_rendered_exposition_is_valid_and_has_no_nan():
    reg, _, _ = make_exporter({"a": _after_traffic(4), "b": _after_traffic(8), "c": fixture("vllm-0.32-ngram-k2-fresh.txt")},
                              windows=("1m",))
    text = generate_latest(reg).decode()
    fams = list(text_string_to_metric_families(text))
    assert fams
    for f in fams:
        assert ":" not in f.name
        for s in f.samples:
            assert math.isfinite(s.value), s
            if f.type == "gauge":
                assert not s.name.endswith("_total"), s.name
    ratios = [s for f in fams for s in f.samples if s.name.endswith(("_rate", "_ratio"))]
    assert ratios and all(0 <= s.value <= 1 for s in ratios)


def test_parse_metrics_errors_are_metrics_parse_errors():
    with pytest.raises(MetricsParseError):
        parse_metrics("<html></html>")
    with pytest.raises(MetricsParseError, match="cap"):
        parse_metrics(_after_traffic(4), max_bytes=100)


def test_v0_server_without_speculation_registers_empty_families():
    text = _constructed("vllm-0.6-v0-nospec-constructed.txt")
    reg, _, _ = make_exporter({"old": text})
    assert list(series(reg, "specwatch_spec_decode_enabled").values()) == [0.0]


# ---- golden exposition -------------------------------------------------------------------------

GOLDEN = FIXTURES.parent / "golden" / "exporter-k4-after-traffic.prom"


def _golden_text() -> str:
    # with the shipped CPU profile and the baseline capture as baseline upstream: measured (both sides
    # live), profile what-ifs with intervals, the verdict, the drift and the decision all appear
    from specwatch.specdecode.costprofile import EMBEDDED_CPU_PROFILE

    reg, _, _ = make_exporter({"spec": _after_traffic(4), "baseline": next(p for p in REAL if "nospec-after" in p.name).read_text()},
                              cost_profile=str(EMBEDDED_CPU_PROFILE), baseline_upstream="baseline", speculative_method="ngram")
    text = generate_latest(reg).decode()
    # the only value that differs from run to run
    return re.sub(r"(specwatch_scrape_duration_seconds\{[^}]*\}) \S+", r"\1 0.0", text)


def test_golden_exposition(request):
    """The full exposition for a real capture; regenerate with SPECWATCH_UPDATE_GOLDEN=1."""
    import os

    text = _golden_text()
    if os.environ.get("SPECWATCH_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


