"""Helpers for the exporter tests: fixtures on disk, an injectable fetcher, a fake clock."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from httpstub import serve_pages  # re-exported: the exporter tests' page server
from specwatch.common.processes import NotReady, wait_http
from specwatch.exporter.collector import FetchError, SpecwatchCollector
from specwatch.exporter.config import build_config

FIXTURES = Path(__file__).parents[1] / "fixtures" / "metrics"


def fixture(name: str) -> str:
    """Text of tests/fixtures/metrics/<name>."""
    return (FIXTURES / name).read_text()


def real_fixtures() -> list[Path]:
    """Real captures from the real vLLM (not the constructed ones)."""
    return sorted(p for p in FIXTURES.glob("vllm-0.32-*.txt") if not p.read_text().startswith("# CONSTRUCTED"))


def raw_samples(text: str) -> list[tuple[str, dict, float]]:
    """All samples of a body, parsed independently of specwatch (prometheus_client's parser)."""
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def raw_value(text: str, name: str, **labels) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels``."""
    return sum(v for n, l, v in raw_samples(text) if n == name and all(l.get(k) == str(x) for k, x in labels.items()))


class FakeClock:
    """A settable monotonic clock (seconds)."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class DictFetcher:
    """Fetcher returning ``bodies[upstream.name]``; an Exception value is raised instead.
    ``bodies`` may be changed between scrapes."""

    def __init__(self, bodies: dict):
        self.bodies = bodies
        self.calls: list[str] = []

    def __call__(self, upstream, timeout, max_bytes):
        self.calls.append(upstream.name)
        body = self.bodies[upstream.name]
        if isinstance(body, Exception):
            raise body
        return body


def make_exporter(bodies: dict, windows=(), clock=None, upstreams_options=None, **kw):
    """(registry, fetcher, clock) for an exporter whose upstreams are the keys of ``bodies``;
    ``upstreams_options``: name -> text appended to that ``--upstream`` (``,method=M,drafter=D``)."""
    fetcher = DictFetcher(bodies)
    clock = clock or FakeClock()
    opts = upstreams_options or {}
    cfg = build_config([f"{n}=http://127.0.0.1:9/{n}{opts.get(n, '')}" for n in bodies], windows, "127.0.0.1:1", **kw)
    reg = CollectorRegistry(auto_describe=False)
    coll = SpecwatchCollector(cfg, fetch=fetcher, clock=clock)
    reg.register(coll)
    reg.specwatch_collector = coll  # for tests that inspect the bounded history
    return reg, fetcher, clock


def scrape(registry: CollectorRegistry) -> list:
    """One scrape: every sample the registry yields now."""
    return [s for fam in registry.collect() for s in fam.samples]


def series(source, name: str, **labels) -> dict[tuple, float]:
    """Samples of ``name`` matching ``labels``: {sorted label items: value}. ``source`` is a
    registry (scraped once now) or the result of :func:`scrape`."""
    samples = scrape(source) if isinstance(source, CollectorRegistry) else source
    out = {}
    for s in samples:
        if s.name == name and all(s.labels.get(k) == str(v) for k, v in labels.items()):
            out[tuple(sorted(s.labels.items()))] = s.value
    return out


#: The real vLLM 0.32 capture (ngram k = 4, after copy traffic) most exporter tests start from.
K4_CAPTURE = "vllm-0.32-ngram-k4-after-traffic.txt"


def k4_capture() -> str:
    """Text of :data:`K4_CAPTURE` (labels ``engine="0",model_name="smollm2"``, positions 0–3)."""
    return fixture(K4_CAPTURE)


def position_labels(i: int) -> str:
    """The label set of position ``i``'s per-position counter in :data:`K4_CAPTURE`, as printed:
    ``{engine="0",model_name="smollm2",position="i"}``."""
    return f'{{engine="0",model_name="smollm2",position="{i}"}}'


def up_by_upstream(samples) -> dict[str, float]:
    """``specwatch_up`` per upstream name, from a registry or a :func:`scrape`."""
    return {dict(k)["upstream"]: v for k, v in series(samples, "specwatch_up").items()}


def fetch_errors_by_reason(samples, upstream: str) -> dict[str, float]:
    """``specwatch_upstream_fetch_errors_total`` of ``upstream`` per reason, from a registry or a :func:`scrape`."""
    return {dict(k)["reason"]: v for k, v in series(samples, "specwatch_upstream_fetch_errors_total",
                                                     upstream=upstream).items()}


__all__ = ["FetchError", "fixture", "real_fixtures", "raw_samples", "raw_value", "FakeClock",
           "DictFetcher", "make_exporter", "scrape", "series", "FIXTURES", "exporter_text", "serve_pages",
           "K4_CAPTURE", "k4_capture", "position_labels", "up_by_upstream", "fetch_errors_by_reason"]


def wait_serve_started(proc, base: str) -> None:
    """Wait until a ``specwatch serve`` process answers on ``base`` (``http://host:port``); kill it
    and fail with its stderr (``proc`` must have been started with ``stderr=PIPE``) if it does not."""
    try:
        wait_http(base + "/", 30, proc, "specwatch serve", interval=0.1)
    except NotReady as exc:
        proc.kill()
        raise AssertionError(f"{exc}: {proc.stderr.read()}") from None


# Moved from tests/unit/test_kchoice.py (shared with the cost-profile and ragged tests).
def exporter_text() -> str:
    """The exporter's real exposition for a real vLLM 0.32 capture (k = 4, after copy traffic)."""
    import pytest
    from prometheus_client import generate_latest

    path = FIXTURES / K4_CAPTURE
    if not path.exists():
        pytest.skip("real capture not present")
    reg, _, _ = make_exporter({"vllm": path.read_text()})
    return generate_latest(reg).decode()


#: The labels of the real vLLM 0.32 captures' series (tests/fixtures/metrics/vllm-0.32-*).
CAPTURE_LABELS = '{engine="0",model_name="smollm2"}'


def bump(text: str, name: str, delta: float, labels: str = CAPTURE_LABELS) -> str:
    """``text`` with the sample ``name{labels}`` raised by ``delta`` (a counter that kept counting)."""
    pat = re.compile(rf"^({re.escape(name + labels)}) (\S+)$", re.M)
    m = pat.search(text)
    assert m, name
    return pat.sub(lambda m: f"{m.group(1)} {float(m.group(2)) + delta!r}", text, count=1)


def decode_phase(text: str, steps: int, seconds_per_step: float, tokens_per_step: float = 1.0) -> str:
    """``text`` (a real capture) after ``steps`` engine steps of one running request, each of
    ``seconds_per_step`` emitting ``tokens_per_step`` tokens (decode speed tokens_per_step /
    seconds_per_step tok/s): generation tokens, the iteration and ITL histograms move; nothing is
    drafted, so the spec-decode counters stay."""
    out = bump(text, "vllm:generation_tokens_total", steps * tokens_per_step)
    out = bump(out, "vllm:iteration_tokens_total_count", steps)
    out = bump(out, "vllm:inter_token_latency_seconds_count", steps)
    out = bump(out, "vllm:inter_token_latency_seconds_sum", seconds_per_step * steps)
    for name in ("vllm:inter_token_latency_seconds_bucket", "vllm:iteration_tokens_total_bucket"):
        out = bump(out, name, steps, labels='{engine="0",le="+Inf",model_name="smollm2"}')
    return out
