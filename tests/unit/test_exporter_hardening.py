"""Issue #14: the exporter under faults and load (each test failed on the code before the fix).

Bodies are the real vLLM 0.32 captures (tests/fixtures/metrics/) with single values changed;
expected values are computed here from the raw samples, independently of specwatch's parser.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
import tracemalloc

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter_helpers import FakeClock, fixture, make_exporter, raw_value, scrape, series
from exporter_helpers import fetch_errors_by_reason as _errors
from exporter_helpers import k4_capture as _k4
from exporter_helpers import position_labels as _pos
from exporter_helpers import up_by_upstream as _up
from polling import wait_until

P = "vllm:spec_decode_num_"
L = '{engine="0",model_name="smollm2"}'


def add_to(body: str, deltas: dict[str, float]) -> str:
    """``body`` with ``deltas[series]`` added to the value of each named series (exact text
    ``name{labels}`` as printed); every named series must exist."""
    out, seen = [], set()
    for line in body.splitlines(keepends=True):
        if not line.startswith("#") and " " in line:
            head, value = line.rstrip("\n").rsplit(" ", 1)
            if head in deltas:
                seen.add(head)
                line = f"{head} {float(value) + deltas[head]!r}\n"
        out.append(line)
    assert seen == set(deltas), set(deltas) - seen
    return "".join(out)


def drop_lines(body: str, pattern: str) -> str:
    return "".join(l for l in body.splitlines(keepends=True) if not re.search(pattern, l))


# ---- 1. one upstream's bad value fails only that upstream -----------------------------------

def _bad_value_bodies() -> dict[str, str]:
    good = _k4()
    running = f"vllm:num_requests_running{L}"
    return {
        "negative-running-gauge": good.replace(f"{running} 0.0", f"{running} -3.0"),
        "duplicated-running-gauge-overflowing": good.replace(
            f"{running} 0.0", f"{running} 1.7e308\n{running} 1.7e308"),
        "same-key-running-overflowing": good.replace(
            f"{running} 0.0", f'{running} 1.7e308\nvllm:num_requests_running{{engine="0",extra="x",model_name="smollm2"}} 1.7e308'),
        "duplicated-generation-tokens": good.replace(
            f"vllm:generation_tokens_total{L} 3072.0", f"vllm:generation_tokens_total{L} 3072.0\nvllm:generation_tokens_total{L} 3072.0"),
        "negative-generation-tokens": good.replace(f"vllm:generation_tokens_total{L} 3072.0", f"vllm:generation_tokens_total{L} -1.0"),
        "duplicated-drafts-counter": good.replace(f"{P}drafts_total{L} 500.0", f"{P}drafts_total{L} 500.0\n{P}drafts_total{L} 500.0"),
        "negative-per-position": good.replace(f"{P}accepted_tokens_per_pos_total{_pos(3)} 346.0",
                                              f"{P}accepted_tokens_per_pos_total{_pos(3)} -346.0"),
        "nan-itl-histogram-sum": re.sub(r"(vllm:inter_token_latency_seconds_sum\{[^}]*\}) \S+", r"\1 NaN", good),
        "inf-iteration-histogram-count": re.sub(r"(vllm:iteration_tokens_total_count\{[^}]*\}) \S+", r"\1 +Inf", good),
        "negative-ttft-count": re.sub(r"(vllm:time_to_first_token_seconds_count\{[^}]*\}) \S+", r"\1 -12.0", good),
        "duplicated-process-start-time": good.replace("process_start_time_seconds 1.79593846475e+09",
                                                      "process_start_time_seconds 1.79593846475e+09\nprocess_start_time_seconds 1.0"),
    }


@pytest.mark.parametrize("case", sorted(_bad_value_bodies()))
def test_bad_value_in_any_family_read_fails_only_that_upstream(case):
    reg, _, _ = make_exporter({"bad": _bad_value_bodies()[case], "good": _k4()}, windows=("1m",))
    text = generate_latest(reg).decode()  # never an exception (HTTP 500) for the scrape
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert _up(samples) == {"bad": 0.0, "good": 1.0}
    assert _errors(samples, "bad") == {"invalid_value": 1.0}
    assert series(samples, "specwatch_draft_acceptance_rate", upstream="good")
    assert all(math.isfinite(s.value) for s in samples)


def test_values_near_the_float_maximum_never_expose_a_non_finite_value():
    good = _k4()
    gen = f"vllm:generation_tokens_total{L}"
    huge = good.replace(f"{gen} 3072.0",  # two label sets of one (model_name, engine): their sum overflows
                        f'{gen} 1.7e308\nvllm:generation_tokens_total{{engine="0",extra="x",model_name="smollm2"}} 1.7e308')
    reg, _, _ = make_exporter({"huge": huge, "good": good}, windows=("1m",))
    text = generate_latest(reg).decode()
    values = [s.value for f in text_string_to_metric_families(text) for s in f.samples]
    assert values and all(math.isfinite(v) for v in values)
    assert "Inf" not in text and "NaN" not in text


# ---- 2. header trickle / hung upstreams never pin the exporter ------------------------------

class _BlockingFetcher:
    """Fetcher whose upstreams named ``hung*`` block (ignoring the timeout) until released."""

    def __init__(self, body: str):
        self.body = body
        self.release = threading.Event()
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, upstream, timeout, max_bytes):
        with self.lock:
            self.calls[upstream.name] = self.calls.get(upstream.name, 0) + 1
        if upstream.name.startswith("hung"):
            self.release.wait(60)
        return self.body


def _collector(names, fetcher, **kw):
    from prometheus_client import CollectorRegistry

    from specwatch.exporter.collector import SpecwatchCollector
    from specwatch.exporter.config import build_config

    cfg = build_config([f"{n}=http://127.0.0.1:9/{n}" for n in names], kw.pop("windows", ()), "127.0.0.1:1", **kw)
    reg = CollectorRegistry(auto_describe=False)
    coll = SpecwatchCollector(cfg, fetch=fetcher)
    reg.register(coll)
    return reg, coll


def test_hung_upstreams_cannot_fill_a_pool_and_are_never_fetched_twice_at_once():
    """35 hung upstreams (more than the old fixed pool of 32) beside 5 healthy ones."""
    fetcher = _BlockingFetcher(_k4())
    names = [f"hung{i}" for i in range(35)] + [f"ok{i}" for i in range(5)]
    reg, coll = _collector(names, fetcher, timeout_seconds=0.5, min_fetch_interval=0.0)
    try:
        for _ in range(4):
            t0 = time.monotonic()
            samples = scrape(reg)
            assert time.monotonic() - t0 < 3.0
            up = _up(samples)
            assert all(up[f"ok{i}"] == 1.0 for i in range(5)), up
            assert all(up[f"hung{i}"] == 0.0 for i in range(35))
        # the first fetch of each hung upstream is still running: no second one was started
        assert all(fetcher.calls[f"hung{i}"] == 1 for i in range(35)), fetcher.calls
        assert all(fetcher.calls[f"ok{i}"] == 4 for i in range(5))
        fetches = series(samples, "specwatch_upstream_fetches_total", upstream="hung0")
        assert list(fetches.values()) == [1.0]
        # the upstream recovers: its next fetch works
        fetcher.release.set()
        wait_until(lambda: _up(scrape(reg))["hung0"] == 1.0, 10)  # the released fetch ends; a next one starts
        assert _up(scrape(reg))["hung0"] == 1.0
    finally:
        fetcher.release.set()
        coll.close()


# ---- 3. windows per counter family ----------------------------------------------------------

# traffic between two captures whose acceptance differs from the lifetime value (0.772)
DELTA = {f"{P}drafts_total{L}": 100.0, f"{P}draft_tokens_total{L}": 400.0, f"{P}accepted_tokens_total{L}": 60.0,
         f"{P}accepted_tokens_per_pos_total{_pos(0)}": 30.0, f"{P}accepted_tokens_per_pos_total{_pos(1)}": 15.0,
         f"{P}accepted_tokens_per_pos_total{_pos(2)}": 10.0, f"{P}accepted_tokens_per_pos_total{_pos(3)}": 5.0,
         f"vllm:generation_tokens_total{L}": 200.0}


def _window_run(middle: str, a: str | None = None):
    a = a if a is not None else _k4()
    b = add_to(a, DELTA)
    reg, fetcher, clock = make_exporter({"s": a}, windows=("1m",))
    scrape(reg)
    for body in (middle, b):
        clock.t += 10
        fetcher.bodies["s"] = body
        samples = scrape(reg)
    return samples


@pytest.mark.parametrize("start_time", ["with-process-start-time", "without"])
@pytest.mark.parametrize("middle", ["per-position-missing", "positions-2-3-missing", "one-token-dip",
                                    "generation-missing", "cut-mid-number-dip", "only-generation-dipping"])
def test_a_partial_body_or_a_dip_is_not_a_restart(middle, start_time):
    """Also without process_start_time_seconds (vLLM with several API servers serves
    prometheus_client's multiprocess registry, which has none): a partial body holding only
    vllm:generation_tokens_total one token lower was 1 of 1 shared series falling, taken as a
    restart (1m acceptance 0.668 instead of 0.15)."""
    a = _k4() if start_time != "without" else drop_lines(_k4(), r"^process_start_time_seconds")
    bodies = {
        "per-position-missing": drop_lines(a, r"^vllm:spec_decode_num_accepted_tokens_per_pos_total"),
        "positions-2-3-missing": drop_lines(a, r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{.*position="[23]"'),
        "one-token-dip": add_to(a, {f"vllm:generation_tokens_total{L}": -1.0}),
        "generation-missing": drop_lines(a, r"^vllm:generation_tokens_total"),
        "cut-mid-number-dip": a.replace(f"{P}accepted_tokens_per_pos_total{_pos(3)} 346.0",
                                        f"{P}accepted_tokens_per_pos_total{_pos(3)} 34.0"),
        "only-generation-dipping": add_to(drop_lines(a, r"^(?!vllm:generation_tokens_total|process_start|#)"),
                                          {f"vllm:generation_tokens_total{L}": -1.0}),
    }
    samples = _window_run(bodies[middle], a)
    rate = series(samples, "specwatch_draft_acceptance_rate", window="1m")
    assert list(rate.values()) == [pytest.approx(60 / 400)]  # not 0.77 (a restart would count all)
    pos = {dict(k)["position"]: v for k, v in series(samples, "specwatch_position_acceptance_rate", window="1m").items()}
    assert pos == {"0": pytest.approx(0.30), "1": pytest.approx(0.15), "2": pytest.approx(0.10), "3": pytest.approx(0.05)}
    out = series(samples, "specwatch_output_from_drafts_ratio", window="1m")
    assert list(out.values()) == [pytest.approx(60 / 200)]


def test_partial_body_leaves_its_missing_family_absent_for_that_scrape():
    a = _k4()
    reg, fetcher, clock = make_exporter({"s": a}, windows=("1m",))
    scrape(reg)
    clock.t += 10
    fetcher.bodies["s"] = add_to(drop_lines(a, r"^vllm:spec_decode_num_accepted_tokens_per_pos_total"),
                                 {k: v for k, v in DELTA.items() if "per_pos" not in k})
    samples = scrape(reg)
    assert series(samples, "specwatch_position_acceptance_rate", window="1m") == {}
    assert list(series(samples, "specwatch_draft_acceptance_rate", window="1m").values()) == [pytest.approx(0.15)]


def _restarted(before: str, after: str):
    """The registry of an exporter (window 5m) that scraped ``before`` and, 20 s later, will read
    ``after`` on its next scrape."""
    reg, fetcher, clock = make_exporter({"s": before}, windows=("5m",))
    scrape(reg)
    clock.t += 20
    fetcher.bodies["s"] = after
    return reg


def test_a_real_restart_still_counts_from_zero_per_series():
    """process_start_time_seconds changed: every series starts again from 0 (Prometheus'
    increase() per series)."""
    after = _k4()
    restart = fixture("vllm-0.32-ngram-k4-after-restart.txt")
    reg = _restarted(after, restart)
    rate = series(reg, "specwatch_draft_acceptance_rate", window="5m")
    assert list(rate.values()) == [pytest.approx(raw_value(restart, P + "accepted_tokens_total")
                                                 / raw_value(restart, P + "draft_tokens_total"))]


def test_restart_without_process_start_time_is_the_engine_counters_dropping():
    after = drop_lines(_k4(), r"^process_start_time_seconds")
    restart = drop_lines(fixture("vllm-0.32-ngram-k4-after-restart.txt"), r"^process_start_time_seconds")
    reg = _restarted(after, restart)
    rate = series(reg, "specwatch_draft_acceptance_rate", window="5m")
    assert list(rate.values()) == [pytest.approx(raw_value(restart, P + "accepted_tokens_total")
                                                 / raw_value(restart, P + "draft_tokens_total"))]


def test_restart_without_process_start_time_of_a_server_without_speculation():
    """No spec-decode counters to go by: a restart is a majority of at least 3 shared series
    falling (here every step histogram and the token counter)."""
    nospec = fixture("vllm-0.32-nospec-after-traffic.txt")
    before = drop_lines(nospec, r"^process_start_time_seconds")
    after = add_to(before, {f"vllm:generation_tokens_total{L}": -raw_value(before, "vllm:generation_tokens_total") + 10.0})
    after = re.sub(r"^(vllm:(?:inter_token_latency_seconds|iteration_tokens_total|time_to_first_token_seconds)"
                   r"_(?:count|sum)\{[^}]*\}) \S+$",
                   r"\1 1.0", after, flags=re.M)
    reg = _restarted(before, after)
    scrape(reg)
    assert reg.specwatch_collector._states["s"].engine.restarts == 1


# ---- 4. body cap and deadline bound the parse -----------------------------------------------

def _capped_bodies() -> dict[str, str]:
    from specwatch.specdecode import metrics

    # the documented limits (the code before the fix had none)
    MAX_LINE_CHARS, MAX_LABELS_PER_LINE, MAX_READ_CHARS = (getattr(metrics, n, d) for n, d in (
        ("MAX_LINE_CHARS", 8192), ("MAX_LABELS_PER_LINE", 32), ("MAX_READ_CHARS", 1024 * 1024)))
    good, run = _k4(), "vllm:num_requests_running"
    line = f'{run}{{engine="%d",model_name="{"m" * 100}"}} 1.0\n'
    return {
        "line-too-long": good + f'{run}{{engine="1",model_name="{"A" * MAX_LINE_CHARS}"}} 1.0\n',
        "too-many-labels": good + run + "{" + ",".join(f'l{i}="v"' for i in range(MAX_LABELS_PER_LINE + 1)) + "} 1.0\n",
        "too-much-in-all": good + "".join(line % i for i in range(MAX_READ_CHARS // len(line % 0) + 1)),
    }


@pytest.mark.parametrize("case", sorted(_capped_bodies()))
def test_kept_lines_the_parser_would_choke_on_are_a_parse_error(case):
    """prometheus_client's label parser is quadratic in line length x labels (a 1.9 MiB line of
    short labels: 13.5 s): the pre-filter refuses such bodies before it runs, with a clear message."""
    from specwatch.specdecode.metrics import MetricsParseError, parse_metrics

    with pytest.raises(MetricsParseError) as ei:
        parse_metrics(_capped_bodies()[case])
    assert ei.value.reason == "parse" and "accepted" in str(ei.value)
    if case != "too-much-in-all":
        assert "a vllm:num_requests_running line" in str(ei.value)
    reg, _, _ = make_exporter({"bad": _capped_bodies()[case], "good": _k4()})
    samples = scrape(reg)
    assert _up(samples) == {"bad": 0.0, "good": 1.0}
    assert _errors(samples, "bad") == {"parse": 1.0}


def test_lines_within_the_caps_still_parse():
    from specwatch.specdecode.metrics import parse_metrics

    good = _k4()
    labels = ",".join(f'l{i}="v"' for i in range(32 - 2))  # MAX_LABELS_PER_LINE with engine and model_name
    quotes = "\\\"" * 200  # one label value holding 200 escaped quotes: still one label
    body = good.replace(f"vllm:num_requests_running{L} 0.0",
                        f'vllm:num_requests_running{{engine="0",{labels},model_name="smollm2"}} 0.0\n'
                        f'vllm:num_requests_running{{engine="0",model_name="{quotes}"}} 2.0')
    snap = parse_metrics(body)
    assert snap.running_requests[("smollm2", "0")] == 0.0
    assert snap.running_requests[('"' * 200, "0")] == 2.0


def _padded(size: int) -> str:
    good = _k4()
    pad_line = 'http_requests_total{handler="/v1/completions/%07d",method="POST",status="2xx"} 12345.0\n'
    n = (size - len(good)) // len(pad_line % 0)
    return good + "# TYPE http_requests_total counter\n" + "".join(pad_line % i for i in range(n))


def test_a_15_mib_body_is_parsed_within_the_deadline_and_a_memory_bound():
    body = _padded(15 * 1024 * 1024)
    assert len(body) > 15 * 1024 * 1024 - 200
    reg, _, _ = make_exporter({"big": body, "good": _k4()}, timeout_seconds=5.0)
    tracemalloc.start()
    try:
        t0 = time.monotonic()
        samples = scrape(reg)
        elapsed = time.monotonic() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert _up(samples) == {"big": 1.0, "good": 1.0}
    assert elapsed < 5.0
    # the body itself is 15 MiB; parsing it must not multiply it (the old full parse took ~400 MB)
    assert peak < 4 * len(body), peak / 2**20
    dur = series(samples, "specwatch_scrape_duration_seconds", upstream="big")
    assert list(dur.values())[0] < 5.0


def test_three_15_mib_bodies_leave_the_healthy_upstream_up():
    body = _padded(15 * 1024 * 1024)
    reg, _, _ = make_exporter({"a": body, "b": body, "c": body, "good": _k4()}, timeout_seconds=5.0)
    t0 = time.monotonic()
    samples = scrape(reg)
    assert time.monotonic() - t0 < 6.0
    assert _up(samples)["good"] == 1.0


# ---- 5. cost independent of history; coalescing ---------------------------------------------

def test_history_is_bounded_by_time_not_only_by_count():
    """One scrape per second for 2000 s with a 1 h window: the kept records are bounded by the
    record spacing (one per max(1 s, shortest window / 12) = 5 s): 2000 s / 5 s + 2, not by the
    2000-sample cap."""
    a = _k4()
    reg, fetcher, clock = make_exporter({"s": a}, windows=("1m", "1h"))
    coll = reg.specwatch_collector
    for i in range(2000):
        clock.t += 1.0
        fetcher.bodies["s"] = add_to(a, {f"{P}drafts_total{L}": float(i), f"{P}draft_tokens_total{L}": float(4 * i),
                                         f"{P}accepted_tokens_total{L}": 0.0}) if i % 100 == 0 else fetcher.bodies["s"]
        coll.collect().__next__()
    assert len(coll._states["s"].history) <= 2000 / 5 + 2  # spacing = max(1 s, 1m / 12) = 5 s
    assert len(coll._states["s"].history) < 2000 / 2 + 2


def test_window_state_stays_bounded_when_label_values_keep_changing():
    """600 fetches, each with 5 new model_name values (8 series each) beside one steady model:
    series not seen for longer than the longest window are dropped, so the state holds about one
    window's worth (the code before kept all 24,000+ slots, every record a copy of them), and the
    steady model's window values are those of an engine that never saw the churn."""
    from specwatch.exporter.windows import WindowEngine
    from specwatch.specdecode.metrics import SpecDecodeCounters, UpstreamSnapshot

    wins = (("30s", 30.0), ("1m", 60.0))
    churned, plain = WindowEngine("u", wins), WindowEngine("u", wins)
    for i in range(600):
        steady = SpecDecodeCounters(model_name="steady", engine="0", drafts=10.0 * i, draft_tokens=40.0 * i,
                                    accepted_tokens=(15.0 + i % 7) * i, accepted_per_position=(8.0 * i, 4.0 * i, 2.0 * i, 1.0 * i))
        t = 1000.0 + i
        plain.observe(t, UpstreamSnapshot(schema="v1", counters={("steady", "0"): steady}))
        snap_counters = {("steady", "0"): steady}
        snap_counters.update({(f"m{i}-{j}", "0"): SpecDecodeCounters(f"m{i}-{j}", "0", 10.0, 40.0, 20.0, (10.0, 5.0, 3.0, 2.0), 100.0)
                              for j in range(5)})
        churned.observe(t, UpstreamSnapshot(schema="v1", counters=snap_counters))
    per_fetch = 5 * 8
    assert len(churned._adj) <= (60 + churned.spacing + 1) * per_fetch + 8, len(churned._adj)  # one longest window of churn
    assert len(churned._adj) < 600 * per_fetch / 1.5
    assert max(len(rec) for _, rec in churned.history) <= len(churned._adj)  # records compacted too
    for label, seconds in wins:
        assert churned.values(("steady", "0"), label, seconds, spec=True, steps=False) == \
            plain.values(("steady", "0"), label, seconds, spec=True, steps=False)


def test_more_series_than_the_cap_is_a_fetch_error_and_the_state_stays_bounded():
    """50 new model_name values per fetch (10 series each with the running-requests gauge) reach
    MAX_SERIES after a few fetches: later fetches are refused with reason too_many_series and
    change nothing; once the churned series are older than the longest window the upstream is up
    again."""
    from specwatch.exporter import windows

    MAX_SERIES = getattr(windows, "MAX_SERIES", 4096)  # the code before the fix had none
    head = _k4()

    def model_lines(m: str) -> str:
        lab = f'engine="0",model_name="{m}"'
        out = [f"{P}drafts_total{{{lab}}} 10.0", f"{P}draft_tokens_total{{{lab}}} 40.0",
               f"{P}accepted_tokens_total{{{lab}}} 20.0"]
        out += [f'{P}accepted_tokens_per_pos_total{{{lab},position="{p}"}} {v}' for p, v in enumerate((10.0, 5.0, 3.0, 2.0))]
        out += [f"vllm:generation_tokens_total{{{lab}}} 100.0", f"vllm:num_requests_running{{{lab}}} 1.0"]
        return "\n".join(out) + "\n"

    def body(i: int) -> str:
        return head + "".join(model_lines(f"m{i}-{j}") for j in range(50))

    reg, fetcher, clock = make_exporter({"s": body(0), "good": _k4()}, windows=("1m",), min_fetch_interval=0.0)
    engine = reg.specwatch_collector._states["s"].engine
    ups = []
    for i in range(12):
        clock.t += 1
        fetcher.bodies["s"] = body(i)
        samples = scrape(reg)
        ups.append(_up(samples)["s"])
        assert len(engine._adj) <= MAX_SERIES
        assert _up(samples)["good"] == 1.0
    assert ups[0] == 1.0 and ups[-1] == 0.0
    assert _errors(samples, "s") == {"too_many_series": float(ups.count(0.0))}
    clock.t += 120  # the churned series are older than the longest window
    fetcher.bodies["s"] = _k4()
    assert _up(scrape(reg))["s"] == 1.0
    clock.t += 10  # dropped at the next sweep (those of the last accepted fetch one fetch later)
    assert _up(scrape(reg))["s"] == 1.0
    assert len(engine._adj) < 100


def test_concurrent_scrapes_share_one_fetch_round():
    class Slow:
        def __init__(self):
            self.calls = 0
            self.lock = threading.Lock()

        def __call__(self, upstream, timeout, max_bytes):
            with self.lock:
                self.calls += 1
            time.sleep(0.3)
            return _k4()

    fetcher = Slow()
    clock = FakeClock()
    from prometheus_client import CollectorRegistry

    from specwatch.exporter.collector import SpecwatchCollector
    from specwatch.exporter.config import build_config

    cfg = build_config(["s=http://127.0.0.1:9/s"], (), "127.0.0.1:1", min_fetch_interval=1.0)
    coll = SpecwatchCollector(cfg, fetch=fetcher, clock=clock)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(coll)
    outs = []
    threads = [threading.Thread(target=lambda: outs.append(generate_latest(reg))) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fetcher.calls == 1 and len(outs) == 10
    assert all(b'specwatch_up{upstream="s"} 1.0' in o for o in outs)
    clock.t += 0.5  # within the freshness interval: shared
    assert series(reg, "specwatch_upstream_fetches_total") == {(("upstream", "s"),): 1.0}
    clock.t += 1.0  # past it: a new round
    assert series(reg, "specwatch_upstream_fetches_total") == {(("upstream", "s"),): 2.0}
    assert fetcher.calls == 2


def _blocking_exporter(timeout_seconds: float = 5.0):
    """A one-upstream collector whose fetches block while ``gate`` is clear (after the first)."""
    from specwatch.exporter.collector import SpecwatchCollector
    from specwatch.exporter.config import build_config

    gate = threading.Event()
    calls = []

    def fetch(upstream, timeout, max_bytes):
        calls.append(1)
        if len(calls) > 1:
            gate.wait(10)
        return _k4()

    clock = FakeClock()
    cfg = build_config(["s=http://127.0.0.1:9/s"], (), "127.0.0.1:1", min_fetch_interval=1.0,
                       timeout_seconds=timeout_seconds)
    return SpecwatchCollector(cfg, fetch=fetch, clock=clock), clock, gate, calls


def test_a_scrape_joining_a_round_in_flight_gets_the_previous_round_at_once_when_it_is_recent():
    coll, clock, gate, calls = _blocking_exporter()
    first = coll.current_round()  # round 1 (not blocked)
    assert first.done.is_set() and coll.round_age(first) == 0.0
    clock.t += 2.0  # past --min-fetch-interval: the next scrape starts round 2, which blocks
    owner_got = []
    owner = threading.Thread(target=lambda: owner_got.append(coll.current_round()))
    owner.start()
    for _ in range(200):
        if len(calls) == 2:
            break
        time.sleep(0.01)
    t0 = time.monotonic()
    joined = coll.current_round()  # round 2 in flight: round 1 finished 2 s ago (< --timeout 5 s)
    assert joined is first and time.monotonic() - t0 < 1.0
    assert coll.round_age(joined) == 2.0
    assert owner.is_alive()  # the scrape that started round 2 still waits for it
    gate.set()
    owner.join(10)
    assert owner_got and owner_got[0] is not first and owner_got[0].done.is_set()
    assert coll.latest_families() == owner_got[0].families
    assert len(calls) == 2  # no extra fetch for the joiner


def test_a_scrape_joining_a_round_in_flight_waits_for_it_when_the_previous_round_is_old():
    coll, clock, gate, calls = _blocking_exporter(timeout_seconds=1.0)
    first = coll.current_round()
    clock.t += 1.5  # round 1 is older than --timeout (1 s): a joiner must not get it
    owner = threading.Thread(target=coll.current_round)
    owner.start()
    for _ in range(200):
        if len(calls) == 2:
            break
        time.sleep(0.01)
    threading.Timer(0.3, gate.set).start()
    joined = coll.current_round()  # waits for round 2
    owner.join(10)
    assert joined is not first and joined.done.is_set()


def test_each_answer_says_how_old_its_round_is():
    from specwatch.exporter.app import make_app

    reg, _, clock = make_exporter({"s": _k4()}, min_fetch_interval=1.0)
    coll = reg.specwatch_collector
    app = make_app(coll.config, reg)

    def age() -> float:
        got = {}
        body = b"".join(app({"PATH_INFO": "/metrics"}, lambda status, headers: got.update(headers)))
        assert b'specwatch_up{upstream="s"} 1.0' in body
        return float(got["X-Specwatch-Round-Age"])

    assert age() == 0.0  # a new round, this scrape's own
    clock.t += 0.75  # within --min-fetch-interval: the same round, 0.75 s old
    assert age() == 0.75
    clock.t += 0.5  # past it: a new round again
    assert age() == 0.0


def test_a_round_is_rendered_in_the_formats_asked_before_any_scrape_can_get_it():
    from specwatch.exporter.app import make_registry, render_round
    from specwatch.exporter.config import build_config
    from exporter_helpers import DictFetcher

    clock = FakeClock()
    cfg = build_config(["s=http://127.0.0.1:9/s"], (), "127.0.0.1:1", min_fetch_interval=1.0)
    coll = make_registry(cfg, fetch=DictFetcher({"s": _k4()}), clock=clock).specwatch_collector
    status, body, headers = render_round(coll, "", "gzip")  # a scrape asks for gzipped text
    assert status == 200 and ("Content-Encoding", "gzip") in headers
    clock.t += 2.0
    rnd = coll.current_round()  # the next round, as a joiner would get it once published
    assert rnd is not None and len(rnd.rendered) == 1
    (key, (st, pre)), = rnd.rendered.items()
    assert key[1] is True and st == 200 and pre[:2] == b"\x1f\x8b"  # gzip, rendered before publishing


# ---- 7. smaller items ------------------------------------------------------------------------

def test_a_leading_byte_order_mark_is_accepted():
    reg, _, _ = make_exporter({"bom": "\ufeff" + _k4()})
    assert _up(scrape(reg)) == {"bom": 1.0}


def test_upstream_text_in_the_log_is_escaped_and_cut(caplog):
    evil = _k4() + 'vllm:spec_decode_num_drafts_total{engine="0",model_name="\x1b[31m' + "A" * 100000 + '\r\n'
    reg, _, _ = make_exporter({"evil": evil})
    with caplog.at_level(logging.WARNING, logger="specwatch.exporter"):
        scrape(reg)
    msgs = [r.getMessage() for r in caplog.records if "upstream evil" in r.getMessage()]
    assert len(msgs) == 1
    assert len(msgs[0]) < 400 and "\x1b" not in msgs[0] and "\r" not in msgs[0]


def test_upstream_labels_in_the_invariant_warning_are_escaped_and_cut(caplog):
    """The invariant-violation warning names the upstream's (model_name, engine): a long label
    value (within the parser's line cap) is cut there too."""
    model = "\x1b[31mZ\r" + "B" * 7000
    evil = _k4() + "".join(f'{P}{n}{{engine="0",model_name="{model}"}} {v}\n' for n, v in
                           (("drafts_total", 10.0), ("draft_tokens_total", 40.0), ("accepted_tokens_total", 99.0)))
    reg, _, _ = make_exporter({"evil": evil})
    with caplog.at_level(logging.WARNING, logger="specwatch.exporter"):
        samples = scrape(reg)
    assert _up(samples) == {"evil": 1.0}
    msgs = [r.getMessage() for r in caplog.records if "invariants violated" in r.getMessage()]
    assert len(msgs) == 1
    assert len(msgs[0]) < 400 and "\x1b" not in msgs[0] and "\r" not in msgs[0]


def test_a_body_cut_inside_a_line_is_truncated_not_accepted():
    good = _k4()
    cut = good.index(f"{P}accepted_tokens_total{L} 1544.0") + len(f"{P}accepted_tokens_total{L} 15")
    reg, _, _ = make_exporter({"cut": good[:cut]})
    samples = scrape(reg)
    assert _up(samples) == {"cut": 0.0}
    assert _errors(samples, "cut") == {"truncated": 1.0}


def test_openmetrics_body_without_eof_is_truncated():
    from specwatch.exporter.fetching import FetchError, check_complete

    check_complete("a 1\n# EOF\n", "application/openmetrics-text; version=1.0.0")
    with pytest.raises(FetchError) as ei:
        check_complete("a 1\n", "application/openmetrics-text; version=1.0.0")
    assert ei.value.reason == "truncated"
    with pytest.raises(FetchError):
        check_complete("a 1\n# EOF\nb 2\n")


def test_ipv6_upstream_url_without_a_name():
    from specwatch.exporter.config import build_config

    cfg = build_config(["http://[::1]:8000"], (), "[::1]:19337")
    assert cfg.upstreams[0].name == "[::1]:8000" and cfg.upstreams[0].metrics_url == "http://[::1]:8000/metrics"
    assert (cfg.listen_host, cfg.listen_port) == ("::1", 19337)


@pytest.mark.parametrize("bad", ["127.0.0.1:１２３", "127.0.0.1:١٢٣", "::1:80", "h:0"])
def test_port_digits_must_be_ascii(bad):
    from specwatch.exporter.config import ConfigError, parse_listen_address

    with pytest.raises(ConfigError):
        parse_listen_address(bad)
