"""The exporter's live decision (issue #36, items 2 and 5) and its per-upstream isolation (issue #38,
items 1, 3, 9, 13), on the real vLLM 0.32 captures of tests/fixtures/metrics/.

- the recommended k is the one rule's pick (specwatch.specdecode.decision.decide) over the window's
  per-k estimates, served with its confidence, never withheld as "uncertain";
- a window whose drafts were proposed and never accepted recommends k 0 (off) with verdict loses;
- short windows (15 s, 30 s) are served by default beside 1 m and 5 m, and follow the load where the
  long ones still mix phases; ``top --window 15s`` shows them;
- a window label has one spelling;
- one upstream's extreme values leave out only its own derived series.
"""

from __future__ import annotations

import logging
import math
import re

import pytest
from click.testing import CliRunner
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter_helpers import FIXTURES, bump, fixture, make_exporter, scrape, serve_pages, series
from specwatch.exporter.config import ConfigError, build_config, parse_window
from specwatch.specdecode.costprofile import EMBEDDED_CPU_PROFILE
from specwatch.specdecode.decision import Candidate, decide

K4 = "vllm-0.32-ngram-k4-after-traffic.txt"
K4_FRESH = "vllm-0.32-ngram-k4-fresh.txt"
NOSPEC = "vllm-0.32-nospec-after-traffic.txt"
L = '{engine="0",model_name="smollm2"}'


_bump = bump  # tests/support/exporter_helpers.py


def _set(text: str, name: str, value: str, labels: str = L) -> str:
    pat = re.compile(rf"^({re.escape(name + labels)}) \S+$", re.M)
    assert pat.search(text), name
    return pat.sub(lambda m: f"{m.group(1)} {value}", text, count=1)


def _no_acceptance_phase(text: str, drafts: int = 200, steps: int = 400) -> str:
    """The k = 4 capture after a phase of ``drafts`` drafts of 4 tokens, none accepted (random
    output): drafts and draft tokens move, accepted and per-position counters do not; every engine
    step emits one token at 30 ms a step."""
    k = 4
    out = _bump(text, "vllm:spec_decode_num_drafts_total", drafts)
    out = _bump(out, "vllm:spec_decode_num_draft_tokens_total", drafts * k)
    out = _bump(out, "vllm:generation_tokens_total", steps)
    out = _bump(out, "vllm:iteration_tokens_total_count", steps)
    out = _bump(out, "vllm:inter_token_latency_seconds_count", steps)
    out = _bump(out, "vllm:inter_token_latency_seconds_sum", 0.03 * steps)
    for name in ("vllm:inter_token_latency_seconds_bucket", "vllm:iteration_tokens_total_bucket"):
        out = _bump(out, name, steps, labels='{engine="0",le="+Inf",model_name="smollm2"}')
    return out


def _one(samples, name, **labels):
    got = series(samples, name, **labels)
    assert len(got) == 1, (name, labels, got)
    return next(iter(got.values()))


# ---- 1. the pick, served with its confidence ---------------------------------------------------


def test_an_uncertain_pick_is_served_with_its_confidence_and_is_decides_pick():
    """The real k = 4 capture and the shipped CPU profile (no baseline: the server's k is
    calibrated): the k = 4 speedup and the k = 3 what-if overlap. The old rule withheld the k
    ("uncertain"); now the best estimate is served, specwatch_recommendation_certain 0, and pick /
    runner-up with its interval (containing 1); the k is decide()'s over the served speedups."""
    reg, _, _ = make_exporter({"spec": fixture(K4)}, cost_profile=str(EMBEDDED_CPU_PROFILE), speculative_method="ngram")
    s = scrape(reg)
    sel = {"upstream": "spec", "window": "lifetime"}
    assert series(s, "specwatch_recommendation_withheld", **sel) == {}
    rec = _one(s, "specwatch_recommended_num_speculative_tokens", **sel)
    assert _one(s, "specwatch_recommendation_certain", **sel) == 0.0
    [(key, ratio)] = series(s, "specwatch_recommendation_over_runner_up", **sel).items()
    lower = _one(s, "specwatch_recommendation_over_runner_up_lower", **dict(key))
    upper = _one(s, "specwatch_recommendation_over_runner_up_upper", **dict(key))
    assert 0 < lower < 1 < upper and lower < ratio < upper
    # the same decision from the served numbers, through the one rule
    cands = []
    for k, v in series(s, "specwatch_speedup", **sel).items():
        lab = dict(k)
        lo = _one(s, "specwatch_speedup_lower", **lab)
        hi = _one(s, "specwatch_speedup_upper", **lab)
        cands.append(Candidate(f"k={lab['k']}", int(lab["k"]), v, lo, hi, lab["basis"]))
    p = decide(cands)
    assert p.k == rec == 4 and not p.certain
    assert dict(key)["runner_up_k"] == str(p.runner_up.k) and ratio == pytest.approx(p.versus_runner_up.value)


def test_live_what_ifs_are_anchored_on_the_servers_own_k():
    """With a baseline upstream the k = 4 speedup is measured (1.44x on the real captures); every
    what-if k' is that live value times the profile's modelled k' / k = 4 (as the demo's what-ifs
    are), so the answer is the same on every surface: k = 4 ahead of k = 3 here, as the demo's
    table reads, where the unanchored model put k = 3 above the measured k = 4 in top."""
    from specwatch.specdecode.speedup import LiveCost, speedups  # noqa: F401 (the documented entry points)

    common = dict(cost_profile=str(EMBEDDED_CPU_PROFILE), speculative_method="ngram")
    reg, _, _ = make_exporter({"spec": fixture(K4), "baseline": fixture(NOSPEC)}, baseline_upstream="baseline", **common)
    alone, _, _ = make_exporter({"spec": fixture(K4)}, **common)
    sel = {"upstream": "spec", "window": "lifetime"}
    paired = {dict(k)["k"]: (v, dict(k)["basis"]) for k, v in series(scrape(reg), "specwatch_speedup", **sel).items()}
    calib = {dict(k)["k"]: v for k, v in series(scrape(alone), "specwatch_speedup", **sel).items()}
    assert paired["4"][1] == "measured" and paired["3"][1] == "profile"
    # the ratio k' / k = 4 is the model's either way (up to the prefill share, estimated from the
    # baseline's t0 or the profile's); only the anchor (measured or calibrated) differs
    for k in ("1", "2", "3"):
        assert paired[k][0] / paired["4"][0] == pytest.approx(calib[k] / calib["4"], rel=0.05)
    assert paired["3"][0] < paired["4"][0]
    assert _one(scrape(reg), "specwatch_recommended_num_speculative_tokens", **sel) == 4.0


# ---- 2. physics: drafts proposed, none accepted -> off, loses ----------------------------------


def test_a_window_whose_drafts_were_never_accepted_recommends_off_and_loses():
    """Drafts proposed in the window, none accepted: speculation cannot pay, whatever the built-in
    guess's factor-2 interval says. The old rule withheld the k as uncertain and gave no verdict."""
    k4 = fixture(K4)
    reg, fetcher, clock = make_exporter({"spec": k4}, windows=("1m",))
    scrape(reg)
    clock.t += 30
    fetcher.bodies["spec"] = _no_acceptance_phase(k4)
    s = scrape(reg)
    sel = {"upstream": "spec", "window": "1m"}
    assert _one(s, "specwatch_draft_acceptance_rate", **sel) == 0.0
    assert _one(s, "specwatch_recommended_num_speculative_tokens", **sel) == 0.0
    assert _one(s, "specwatch_recommendation_certain", **sel) == 1.0
    verdicts = {dict(k)["verdict"] for k in series(s, "specwatch_speculation_verdict", **sel)}
    assert verdicts == {"loses"}
    assert series(s, "specwatch_recommendation_withheld", **sel) == {}
    # the lifetime window (the capture's accepted drafts included) is not physics' case
    life = {"upstream": "spec", "window": "lifetime"}
    assert _one(s, "specwatch_recommended_num_speculative_tokens", **life) > 0


# ---- 3. short windows follow the load -----------------------------------------------------------


def test_serve_serves_15s_and_30s_beside_1m_and_5m_by_default():
    from specwatch.exporter.config import DEFAULT_WINDOWS
    from specwatch.exporter.server import serve

    [opt] = [p for p in serve.params if p.name == "windows"]
    assert tuple(opt.default) == DEFAULT_WINDOWS == ("15s", "30s", "1m", "5m")
    r = CliRunner().invoke(serve, ["--help"])
    assert r.exit_code == 0 and "15s" in r.output and "30s" in r.output


def _phases():
    """(registry, exposition) after: fresh (t = 0), a copy phase (t = 100, 105), then 15 s of random
    output whose drafts are never accepted (t = 120), with the default windows."""
    from specwatch.exporter.config import DEFAULT_WINDOWS

    fresh, k4 = fixture(K4_FRESH), fixture(K4)
    reg, fetcher, clock = make_exporter({"spec": fresh}, windows=DEFAULT_WINDOWS)
    scrape(reg)
    for t, body in ((100, k4), (105, k4), (120, _no_acceptance_phase(k4))):
        clock.t = 1000.0 + t
        fetcher.bodies["spec"] = body
        text = generate_latest(reg).decode()
    return reg, text


def test_the_15s_window_follows_a_phase_the_long_windows_still_mix():
    """The demo's case: random output runs after copy. The 15 s window holds only the random-output
    phase (acceptance 0: off, loses); 5 m still mixes in the copy phase (acceptance > 0)."""
    _, text = _phases()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    windows = {s.labels["window"] for s in samples if s.name == "specwatch_draft_acceptance_rate"}
    assert windows == {"15s", "30s", "1m", "5m", "lifetime"}
    acc = {w: _one(samples, "specwatch_draft_acceptance_rate", upstream="spec", window=w) for w in windows}
    assert acc["15s"] == 0.0 and acc["5m"] > 0.5
    assert _one(samples, "specwatch_recommended_num_speculative_tokens", upstream="spec", window="15s") == 0.0
    assert {dict(k)["verdict"] for k in series(samples, "specwatch_speculation_verdict", upstream="spec", window="15s")} == {
        "loses"}
    # output throughput over the 15 s window: the phase's 400 tokens in its 15 s span
    assert _one(samples, "specwatch_output_tokens_per_second", upstream="spec", window="15s") == pytest.approx(400 / 15)


def test_top_window_15s_shows_the_short_window():
    from specwatch.top.cli import top

    _, text = _phases()
    with serve_pages({"/metrics": (200, "text/plain; version=0.0.4", text.encode())}) as base:
        r = CliRunner().invoke(top, ["--exporter", base + "/metrics", "--once", "--window", "15s"])
        r5 = CliRunner().invoke(top, ["--exporter", base + "/metrics", "--once", "--window", "5m"])
    assert r.exit_code == 0, r.output
    assert "window 15s (served: 15s, 30s, 1m, 5m, lifetime)" in r.output
    assert "(window 15s)" in r.output and "showing lifetime" not in r.output
    assert re.search(r"draft acceptance rate: +0\.0 %", r.output), r.output
    assert re.search(r"recommended k: +0 \(speculation off\)", r.output), r.output
    assert "no draft token was accepted in this window: speculation cannot pay" in r.output
    assert re.search(r"verdict at k = 4: +speculation loses", r.output), r.output
    assert r5.exit_code == 0 and not re.search(r"draft acceptance rate: +0\.0 %", r5.output), r5.output


# ---- 4. window labels: one spelling ------------------------------------------------------------


@pytest.mark.parametrize("spec, label", [("01m", "1m"), ("60s", "1m"), ("1m", "1m"), (" 15s ", "15s"), ("90s", "1m30s"),
                                         ("0h5m", "5m"), ("300s", "5m"), ("24h", "1d")])
def test_a_window_is_served_under_one_spelling(spec, label):
    assert parse_window(spec).label == label


@pytest.mark.parametrize("spec", ["\u0661m", "1\uff4d", "1m\u200b", "", "1 m", "-1m", "nan", "1M"])
def test_a_window_outside_ascii_durations_is_refused(spec):
    with pytest.raises(ConfigError, match="window"):
        parse_window(spec)


def test_two_spellings_of_one_window_are_refused_and_serve_labels_the_normalised_one():
    with pytest.raises(ConfigError, match="1m given twice"):
        build_config(["http://127.0.0.1:9"], ["1m", "01m"], "127.0.0.1:1")
    reg, fetcher, clock = make_exporter({"spec": fixture(K4_FRESH)}, windows=("01m",))
    scrape(reg)
    clock.t += 30
    fetcher.bodies["spec"] = fixture(K4)
    got = {dict(k)["window"] for k in series(reg, "specwatch_draft_acceptance_rate", upstream="spec")}
    assert got == {"1m", "lifetime"}


def test_serve_refuses_an_arabic_indic_window_in_one_line():
    from specwatch.exporter.server import serve

    r = CliRunner().invoke(serve, ["--once", "--upstream", "http://127.0.0.1:9", "--window", "\u0661m"])
    assert r.exit_code == 2 and "window" in r.output and "ASCII" in r.output
    assert len(r.output.strip().splitlines()) == 1


# ---- 5. one upstream's extreme values never blank the others ----------------------------------


def _extreme(text: str) -> str:
    out = _set(text, "vllm:inter_token_latency_seconds_sum", "1.7e308")
    return _set(out, "vllm:time_to_first_token_seconds_sum", "1.7e308")


def test_one_upstreams_extreme_values_leave_out_only_its_own_derived_series(caplog):
    """Issue #38 item 1: a real ngram capture with ITL and TTFT sums at 1.7e308 (finite: the parser
    takes them) and the shipped CPU profile, beside a healthy upstream. Before, the speedup raised,
    the round failed and every scrape carried only specwatch_build_info."""
    caplog.set_level(logging.WARNING, "specwatch.exporter")
    healthy = fixture(K4)
    reg, _, _ = make_exporter({"bad": _extreme(healthy), "good": healthy}, windows=("1m",),
                              cost_profile=str(EMBEDDED_CPU_PROFILE), speculative_method="ngram")
    s = scrape(reg)
    assert {dict(k)["upstream"]: v for k, v in series(s, "specwatch_up").items()} == {"bad": 0.0, "good": 1.0}
    assert series(s, "specwatch_upstream_fetch_errors_total", upstream="bad", reason="invalid_value")
    for name in ("specwatch_speedup", "specwatch_draft_acceptance_rate", "specwatch_step_duration_seconds",
                 "specwatch_recommended_num_speculative_tokens"):
        assert series(s, name, upstream="bad") == {}, name
        assert series(s, name, upstream="good"), name
    assert any("upstream bad: invalid_value" in r.getMessage() for r in caplog.records)
    text = generate_latest(reg).decode()
    assert all(math.isfinite(x.value) for f in text_string_to_metric_families(text) for x in f.samples)


def test_a_baseline_with_impossible_values_is_no_denominator_and_blanks_nothing():
    """Issue #38 item 1 through --baseline-upstream: the real baseline capture with ITL and TTFT
    sums of 1e-304 made the measured speedup 3.7e-306 (or 0.0). The speculative upstream keeps its
    series, its server's k calibrated instead, and says why measured is missing."""
    base = _set(_set(fixture(NOSPEC), "vllm:inter_token_latency_seconds_sum", "1e-304"),
                "vllm:time_to_first_token_seconds_sum", "1e-304")
    reg, _, _ = make_exporter({"spec": fixture(K4), "baseline": base}, cost_profile=str(EMBEDDED_CPU_PROFILE),
                              baseline_upstream="baseline", speculative_method="ngram")
    s = scrape(reg)
    assert {dict(k)["upstream"]: v for k, v in series(s, "specwatch_up").items()} == {"spec": 1.0, "baseline": 1.0}
    bases = {dict(k)["basis"] for k in series(s, "specwatch_speedup", upstream="spec")}
    assert "measured" not in bases and "calibrated" in bases
    assert series(s, "specwatch_not_derivable", upstream="spec", reason="baseline_invalid_value")
    assert series(s, "specwatch_recommended_num_speculative_tokens", upstream="spec")


def test_a_profile_that_cannot_give_a_finite_speedup_is_refused_at_start(tmp_path):
    """Issue #38 item 1: a cost profile that passes the loader with every cost_ratio at 1.0e+300
    (lower ends 0.0) is refused at start, exit 2, naming the field."""
    from specwatch.exporter.server import serve

    bad = tmp_path / "huge.yaml"
    bad.write_text(re.sub(r"cost_ratio: \S+", "cost_ratio: 1.0e+300", EMBEDDED_CPU_PROFILE.read_text()))
    with pytest.raises(ConfigError, match=r"speculative\[0\]\.points\[0\]\.cost_ratio: 1e\+300"):
        build_config(["http://127.0.0.1:9"], (), "127.0.0.1:1", cost_profile=str(bad))
    r = CliRunner().invoke(serve, ["--once", "--upstream", "http://127.0.0.1:9", "--cost-profile", str(bad)])
    assert r.exit_code == 2 and "cost_ratio" in r.output and str(bad) in r.output
    # specwatch advise --exporter/--prometheus applies the same check (one line, exit 2)
    from specwatch.choosek.cli import advise
    r = CliRunner().invoke(advise, ["--exporter", "http://127.0.0.1:9/metrics", "--cost-profile", str(bad)])
    assert r.exit_code == 2 and "cost_ratio" in r.output and "Traceback" not in r.output
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(re.sub(r"step_seconds: \S+", "step_seconds: 1.0e-300", EMBEDDED_CPU_PROFILE.read_text(), count=1))
    with pytest.raises(ConfigError, match=r"plain\[0\]\.step_seconds"):
        build_config(["http://127.0.0.1:9"], (), "127.0.0.1:1", cost_profile=str(tiny))


def test_a_round_that_fails_still_carries_specwatch_up_of_every_upstream(monkeypatch):
    from specwatch.exporter.collector import SpecwatchCollector

    reg, _, _ = make_exporter({"a": fixture(K4), "b": fixture(NOSPEC)})

    def boom(self, r):
        raise RuntimeError("a bug")

    monkeypatch.setattr(SpecwatchCollector, "_run_round", boom)
    s = scrape(reg)
    assert {dict(k)["upstream"]: v for k, v in series(s, "specwatch_up").items()} == {"a": 0.0, "b": 0.0}


# ---- 6. a baseline that speculates is no denominator ------------------------------------------


def test_a_speculating_baseline_is_refused_as_denominator_and_logged_once(caplog):
    """Issue #38 item 3: --baseline-upstream pointing at a server whose vllm:spec_decode_* counters
    move. Before, it was silently the denominator of `measured`."""
    caplog.set_level(logging.WARNING, "specwatch.exporter")
    reg, fetcher, clock = make_exporter({"spec": fixture(K4_FRESH), "baseline": fixture(K4_FRESH)}, windows=("1m",),
                                        cost_profile=str(EMBEDDED_CPU_PROFILE), baseline_upstream="baseline",
                                        speculative_method="ngram")
    scrape(reg)
    for _ in range(3):
        clock.t += 20
        fetcher.bodies = {"spec": fixture(K4), "baseline": fixture(K4)}
        s = scrape(reg)
    assert "measured" not in {dict(k)["basis"] for k in series(s, "specwatch_speedup", upstream="spec")}
    assert series(s, "specwatch_not_derivable", upstream="spec", reason="baseline_speculates")
    said = [r for r in caplog.records if "runs speculative decoding itself" in r.getMessage()]
    assert len(said) == 1


# ---- 7. every golden exposition publishes each label set once ---------------------------------


@pytest.mark.parametrize("path", sorted((FIXTURES.parent / "golden").glob("*.prom")), ids=lambda p: p.name)
def test_no_golden_exposition_publishes_a_label_set_twice(path):
    seen: dict[tuple, float] = {}
    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in seen, f"{s.name}{dict(key[1])} twice: {seen[key]} and {s.value}"
            seen[key] = s.value
    assert seen
