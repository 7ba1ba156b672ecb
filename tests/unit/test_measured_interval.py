"""The ``measured`` speedup's interval covers the movement between the two servers' rounds
(issue #37, item 3), on the real vLLM 0.32 captures of tests/fixtures/metrics/.

Before, the interval counted only the sampling noise of the live counters (a CV over the engine
steps), so a host that slowed down between the baseline's rounds left it as narrow as a steady one:
on an H200 it held the client ratio in 3 of 6 cells although every point was within 8.2 %. Now each
server's decode speed is taken in batch means over the window's fetches
(:func:`specwatch.specdecode.steptime.speed_spread`) and their standard errors widen the interval
(:func:`specwatch.specdecode.speedup.between_rounds_halfwidth`).
"""

from __future__ import annotations

import math

import pytest

from exporter_helpers import decode_phase, fixture, make_exporter, scrape, series
from specwatch.exporter.windows import WindowEngine
from specwatch.specdecode.decision import t975
from specwatch.specdecode.metrics import parse_metrics
from specwatch.specdecode.speedup import between_rounds_halfwidth
from specwatch.specdecode.steptime import MAX_SPREAD_BATCHES, MIN_SPREAD_BATCHES, SpeedSpread, StepTimes, speed_spread

K4 = "vllm-0.32-ngram-k4-after-traffic.txt"
NOSPEC = "vllm-0.32-nospec-after-traffic.txt"
KEY = ("smollm2", "0")


def test_speed_spread_is_batch_means_of_the_log_speed():
    assert speed_spread([(10.0, 1.0)]) is None  # one interval: no spread can be told
    steady = speed_spread([(30.0, 1.0)] * 6)
    assert steady is not None and steady.batches == 6 and steady.log_standard_error == pytest.approx(0.0, abs=1e-12)
    # three groups at 30, 30 and 15 tok/s: x = ln 30, ln 30, ln 15; SE = sd(x) / sqrt 3
    moved = speed_spread([(30.0, 1.0), (30.0, 1.0), (15.0, 1.0)])
    xs = [math.log(30), math.log(30), math.log(15)]
    mean = sum(xs) / 3
    assert moved.batches == 3
    assert moved.log_standard_error == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in xs) / 2 / 3))
    # two groups tell no spread (t(1) = 12.7 would make the interval useless)
    assert MIN_SPREAD_BATCHES == 3 and speed_spread([(30.0, 1.0), (15.0, 1.0)]) is None
    # unusable groups (nothing decoded, no ITL time, not finite) are skipped
    assert speed_spread([(0.0, 1.0), (30.0, 0.0), (math.inf, 1.0), (30.0, 1.0)]) is None


def test_between_rounds_halfwidth_is_t_times_the_combined_standard_error():
    st = StepTimes(0.03, 1.0, 30.0, 100.0, 100.0, speed_spread=SpeedSpread(4, 0.05, 12))
    base = StepTimes(0.03, 1.0, 30.0, 100.0, 100.0, speed_spread=SpeedSpread(4, 0.05, 12))
    # equal sides: Welch-Satterthwaite df = (2v)^2 / (2 v^2 / 3) = 6
    assert between_rounds_halfwidth(st, base) == pytest.approx(t975(6) * math.sqrt(2 * 0.05 ** 2))
    assert between_rounds_halfwidth(st, None) == pytest.approx(t975(3) * 0.05)
    assert between_rounds_halfwidth(StepTimes(0.03, 1.0, 30.0, 100.0, 100.0), None) == 0.0


def test_the_window_engine_reads_the_speed_of_each_fetch_interval():
    """A server that decoded at 30 tok/s over four fetch intervals, then at 15 tok/s over four: the
    window's spread has 8 batches and the standard error of that move; the steady server's is 0."""
    text = fixture(NOSPEC)
    steady, moved = WindowEngine("a", (("1m", 60.0),)), WindowEngine("b", (("1m", 60.0),))
    t_steady = t_moved = text
    for eng, body in ((steady, t_steady), (moved, t_moved)):
        eng.observe(0.0, parse_metrics(body))
    for i in range(8):
        t_steady = decode_phase(t_steady, 100, 1 / 30)
        t_moved = decode_phase(t_moved, 100, 1 / 30 if i < 4 else 1 / 15)
        steady.observe(5.0 * (i + 1), parse_metrics(t_steady))
        moved.observe(5.0 * (i + 1), parse_metrics(t_moved))
    a = steady.values(KEY, "1m", 60.0, spec=False, steps=True, spread=True).step.times
    b = moved.values(KEY, "1m", 60.0, spec=False, steps=True, spread=True).step.times
    assert a.speed_spread.batches == 8 and a.speed_spread.log_standard_error == pytest.approx(0.0, abs=1e-9)
    xs = [math.log(30)] * 4 + [math.log(15)] * 4
    mean = sum(xs) / 8
    se = math.sqrt(sum((x - mean) ** 2 for x in xs) / 7 / 8)
    assert b.speed_spread.batches == 8 and b.speed_spread.log_standard_error == pytest.approx(se)
    # without spread=True the engine does not compute it
    assert moved.values(KEY, "1m", 60.0, spec=False, steps=True).step.times.speed_spread is None


def test_the_window_groups_its_fetch_intervals_into_batches_of_equal_engine_steps():
    """40 fetch intervals (20 at 30 tok/s, then 20 at 15 tok/s, 100 steps each), an idle interval
    after every fourth: 8 groups of 5 busy intervals each (idle ones add nothing); all the steps
    taken between two fetches: one group, no spread."""
    text = fixture(NOSPEC)
    eng = WindowEngine("a", (("15s", 15.0), ("5m", 300.0)))  # a record every 1.25 s (shortest / 12)
    eng.observe(0.0, parse_metrics(text))
    t = 0.0
    for n in range(40):
        text = decode_phase(text, 100, 1 / 30 if n < 20 else 1 / 15)
        t += 2.0
        eng.observe(t, parse_metrics(text))
        if n % 4 == 3:
            t += 2.0
            eng.observe(t, parse_metrics(text))  # idle: nothing moved
    sp = eng.values(KEY, "5m", 300.0, spec=False, steps=True, spread=True).step.times.speed_spread
    assert sp.batches == MAX_SPREAD_BATCHES and sp.intervals == 50
    xs = [math.log(30)] * 4 + [math.log(15)] * 4
    mean = sum(xs) / 8
    assert sp.log_standard_error == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in xs) / 7 / 8))
    burst = WindowEngine("b", (("15s", 15.0), ("5m", 300.0)))
    body = fixture(NOSPEC)
    burst.observe(0.0, parse_metrics(body))
    burst.observe(5.0, parse_metrics(body))
    burst.observe(10.0, parse_metrics(decode_phase(body, 800, 1 / 30)))
    burst.observe(15.0, parse_metrics(decode_phase(body, 800, 1 / 30)))
    assert burst.values(KEY, "5m", 300.0, spec=False, steps=True, spread=True).step.times.speed_spread is None


def _rounds(base_slowdown: float) -> tuple[float, float, float]:
    """An exporter reading a speculative server (the real k = 4 capture) and a baseline (the real
    no-speculation capture), fetched every 5 s while the client runs ABBA rounds: baseline,
    speculative, speculative, baseline; each round two fetch intervals. The baseline decodes at
    30 tok/s in its first round and 30 / ``base_slowdown`` in its second (the host slowed down);
    the speculative server at 60 tok/s. Returns the 1m window's measured (value, lower, upper)."""
    spec, base = fixture(K4), fixture(NOSPEC)
    reg, fetcher, clock = make_exporter({"spec": spec, "baseline": base}, windows=("1m",), baseline_upstream="baseline")
    scrape(reg)
    for rnd, role in enumerate(("baseline", "spec", "spec", "baseline")):
        for _ in range(2):
            if role == "baseline":
                slow = 1.0 if rnd == 0 else base_slowdown
                base = decode_phase(base, 100, slow / 30)
            else:
                spec = decode_phase(spec, 100, 1 / 30, tokens_per_step=2)
            fetcher.bodies.update(spec=spec, baseline=base)
            clock.t += 5
            samples = scrape(reg)
    sel = {"upstream": "spec", "window": "1m", "basis": "measured"}
    (v,) = series(samples, "specwatch_speedup", **sel).values()
    (lo,) = series(samples, "specwatch_speedup_lower", **sel).values()
    (hi,) = series(samples, "specwatch_speedup_upper", **sel).values()
    return v, lo, hi


def test_a_baseline_that_moved_between_its_rounds_widens_the_measured_interval():
    v0, lo0, hi0 = _rounds(1.0)
    v1, lo1, hi1 = _rounds(1.5)
    # steady: 60 / 30 tok/s (prefill of the window is the same on both sides)
    assert lo0 < v0 < hi0 and v0 == pytest.approx(2.0, rel=0.05)
    # the baseline's second round at 20 tok/s: the point moves up, and the interval widens to hold
    # what each round alone would say (2.0 from the first, 3.0 from the second)
    assert v1 > v0
    assert math.log(hi1 / lo1) > 2 * math.log(hi0 / lo0)
    assert lo1 < 2.0 * 1.02 and hi1 > 3.0 * 0.98
