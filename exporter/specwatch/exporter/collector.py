"""The exporter's custom collector: fetch every upstream on each scrape, derive, expose.

Each :meth:`SpecwatchCollector.collect` builds fresh metric families, so no stale label set
lingers. The only state kept across scrapes is, per upstream, a bounded history of fetched
counters (for the ``window`` values; at most ``history_samples`` entries and no older than the
longest window) and the invariant-violation counters.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Callable, Iterator

import requests
import urllib3
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from specwatch import __version__
from specwatch.specdecode.cost import CostModel, estimated_speedups, recommend_k
from specwatch.exporter.config import ExporterConfig, Upstream
from specwatch.specdecode.derive import INVARIANTS, DerivedValues, add_counters, check_invariants, counters_delta, derive
from specwatch.specdecode.metrics import MetricsParseError, SpecDecodeCounters, UpstreamSnapshot, parse_metrics

log = logging.getLogger("specwatch.exporter")


class FetchError(Exception):
    """An upstream could not be fetched; ``reason`` is a short label (connect, timeout, truncated,
    http_status, too_large, decode, parse) and the message says what was wrong."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


#: ``fetch(upstream, timeout_seconds, max_bytes) -> body text``; raises :class:`FetchError`.
Fetcher = Callable[[Upstream, float, int], str]

_local = threading.local()


def http_fetch(upstream: Upstream, timeout_seconds: float, max_bytes: int) -> str:
    """GET ``upstream.metrics_url`` (plain text format, no OpenMetrics negotiation) with a total
    deadline of ``timeout_seconds`` and a body cap of ``max_bytes``; returns the body as text.

    Raises :class:`FetchError` on connection failure, timeout, non-200 status, an oversized or
    non-UTF-8 body.
    """
    session = getattr(_local, "session", None)
    if session is None:
        session = _local.session = requests.Session()
    deadline = time.monotonic() + timeout_seconds
    try:
        with session.get(
            upstream.metrics_url,
            timeout=(timeout_seconds, timeout_seconds),
            stream=True,
            headers={"Accept": "text/plain;version=0.0.4"},
            allow_redirects=False,
        ) as resp:
            if resp.status_code != 200:
                raise FetchError("http_status", f"HTTP {resp.status_code} from /metrics")
            chunks, size = [], 0
            # read1: whatever has arrived (at most 64 KiB), so a body dripped slowly hits the
            # deadline check after each piece instead of blocking until a full buffer is read
            while True:
                try:
                    chunk = resp.raw.read1(65536, decode_content=True)
                except urllib3.exceptions.ReadTimeoutError:
                    raise FetchError("timeout", f"no data for {timeout_seconds:g} s") from None
                except urllib3.exceptions.ProtocolError:
                    raise FetchError("truncated", "connection closed before the body was complete") from None
                if not chunk:
                    break
                size += len(chunk)
                if size > max_bytes:
                    raise FetchError("too_large", f"body larger than the {max_bytes}-byte cap")
                if time.monotonic() > deadline:
                    raise FetchError("timeout", f"body not complete within {timeout_seconds:g} s")
                chunks.append(chunk)
    except requests.Timeout:
        raise FetchError("timeout", f"no answer within {timeout_seconds:g} s") from None
    except requests.exceptions.ChunkedEncodingError:
        raise FetchError("truncated", "connection closed before the body was complete") from None
    except requests.ConnectionError as exc:
        raise FetchError("connect", f"connection failed: {type(exc).__name__}") from None
    except requests.RequestException as exc:
        raise FetchError("connect", f"request failed: {type(exc).__name__}") from None
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise FetchError("decode", "body is not UTF-8 text") from None


@dataclass
class _Sample:
    t: float
    counters: dict[tuple[str, str], SpecDecodeCounters]


class _UpstreamState:
    """Per-upstream state kept across scrapes (bounded)."""

    def __init__(self, max_samples: int):
        self.history: deque[_Sample] = deque(maxlen=max_samples)
        self.violations: dict[str, int] = {name: 0 for name in INVARIANTS}
        self.fetch_errors: dict[str, int] = {}


def window_delta(history: list[_Sample], now: float, seconds: float, key: tuple[str, str]) -> SpecDecodeCounters | None:
    """Increase of one key's counters over the last ``seconds`` of ``history`` (oldest first).

    The baseline is the newest sample at or before ``now - seconds`` (or the oldest one while the
    history is shorter than the window: the value then covers what has been seen). Increases are
    summed pair by pair so a restart inside the window counts as Prometheus' ``increase()`` does.
    A key absent from a sample counts as a fresh series (starting at 0).
    """
    start = 0
    for i, s in enumerate(history):
        if s.t <= now - seconds:
            start = i
    seq = [s.counters.get(key) for s in history[start:]]
    total: SpecDecodeCounters | None = None
    for before, after in zip(seq, seq[1:]):
        if after is None:
            continue
        step = after if before is None else counters_delta(before, after)
        total = step if total is None else _add(total, step)
    return total


def _add(a: SpecDecodeCounters, b: SpecDecodeCounters) -> SpecDecodeCounters:
    if len(a.accepted_per_position) != len(b.accepted_per_position):
        return b  # k changed inside the window: keep the newest configuration only
    return add_counters(a, b)


class SpecwatchCollector(Collector):
    """prometheus_client collector exposing specwatch's metrics (see README "Metrics").

    ``fetch`` is injected (default :func:`http_fetch`); ``clock`` returns seconds (monotonic).
    Thread-safe: concurrent scrapes are serialised.
    """

    def __init__(
        self,
        config: ExporterConfig,
        fetch: Fetcher = http_fetch,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.config = config
        self._fetch = fetch
        self._clock = clock
        self._lock = threading.Lock()
        self._states = {u.name: _UpstreamState(config.history_samples) for u in config.upstreams}
        self._pool = ThreadPoolExecutor(max_workers=min(32, len(config.upstreams)), thread_name_prefix="fetch")
        self._cost = CostModel(config.cost_per_draft_token, config.cost_per_draft_token_per_running_request)

    def describe(self) -> list[Metric]:
        return []  # collected per scrape; nothing to describe at registration time

    def _fetch_one(self, upstream: Upstream) -> tuple[UpstreamSnapshot | None, float, FetchError | None]:
        t0 = time.perf_counter()
        try:
            body = self._fetch(upstream, self.config.timeout_seconds, self.config.max_body_bytes)
            snap = parse_metrics(body, max_bytes=self.config.max_body_bytes)
            return snap, time.perf_counter() - t0, None
        except FetchError as exc:
            return None, time.perf_counter() - t0, exc
        except MetricsParseError as exc:
            return None, time.perf_counter() - t0, FetchError("parse", str(exc))

    def _result(self, future) -> tuple[UpstreamSnapshot | None, float, FetchError | None]:
        """A fetch's result, waiting at most a little past the deadline :func:`http_fetch` keeps
        itself (an injected fetcher might not keep one): one stuck upstream never holds the scrape."""
        limit = self.config.timeout_seconds + 1.0
        try:
            return future.result(timeout=limit)
        except FutureTimeout:
            return None, limit, FetchError("timeout", f"no result within {limit:g} s")

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield from self._collect_locked()

    def _collect_locked(self) -> Iterator[Metric]:
        cfg = self.config
        futures = [self._pool.submit(self._fetch_one, u) for u in cfg.upstreams]
        results = [self._result(f) for f in futures]
        now = self._clock()

        f = _Families()
        f.build_info.add_metric([__version__], 1.0)
        for upstream, (snap, duration, error) in zip(cfg.upstreams, results):
            name = upstream.name
            state = self._states[name]
            f.duration.add_metric([name], duration)
            if error is not None:
                state.fetch_errors[error.reason] = state.fetch_errors.get(error.reason, 0) + 1
                log.warning("upstream %s: %s: %s", name, error.reason, error)
                f.up.add_metric([name], 0.0)
            else:
                assert snap is not None
                f.up.add_metric([name], 1.0)
                f.enabled.add_metric([name], 1.0 if snap.spec_decode_enabled else 0.0)
                f.info.add_metric([name, snap.schema], 1.0)
                self._add_upstream(f, name, state, snap, now)
            for reason, count in sorted(state.fetch_errors.items()):
                f.fetch_errors.add_metric([name, reason], float(count))
            for inv, count in state.violations.items():
                f.violations.add_metric([name, inv], float(count))
        yield from f.all()

    def _add_upstream(self, f: "_Families", name: str, state: _UpstreamState, snap: UpstreamSnapshot, now: float) -> None:
        for model, g in sorted(snap.v0.items()):
            if g.counter_acceptance_ratio is not None:
                f.acceptance_rate.add_metric([name, model, "", "lifetime"], g.counter_acceptance_ratio)
            if g.draft_acceptance_rate is not None:
                f.v0_rate.add_metric([name, model], g.draft_acceptance_rate)
            if g.efficiency is not None:
                f.v0_efficiency.add_metric([name, model], g.efficiency)

        good: dict[tuple[str, str], SpecDecodeCounters] = {}
        for key, c in sorted(snap.counters.items()):
            bad = check_invariants(c)
            if bad:
                for inv in bad:
                    state.violations[inv] += 1
                log.warning("upstream %s %s: vLLM invariants violated: %s; no derived values served",
                            name, key, ", ".join(bad))
                continue
            good[key] = c
        state.history.append(_Sample(now, dict(snap.counters)))
        self._prune(state, now)
        history = list(state.history)

        for key, c in good.items():
            labels = [name, key[0], key[1]]
            if c.drafts is not None:
                f.drafts.add_metric(labels, c.drafts)
            f.draft_tokens.add_metric(labels, c.draft_tokens)
            f.accepted.add_metric(labels, c.accepted_tokens)
            for pos, v in enumerate(c.accepted_per_position):
                f.accepted_per_pos.add_metric(labels + [str(pos)], v)
            if c.generation_tokens is not None:
                f.generation.add_metric(labels, c.generation_tokens)
            if c.num_speculative_tokens:
                f.k.add_metric(labels, float(c.num_speculative_tokens))
            running = snap.running_requests.get(key, 0.0)
            self._add_derived(f, labels, "lifetime", derive(c), running)
            for w in self.config.windows:
                d = window_delta(history, now, w.seconds, key)
                if d is not None:
                    self._add_derived(f, labels, w.label, derive(d), running)

    def _prune(self, state: _UpstreamState, now: float) -> None:
        longest = max((w.seconds for w in self.config.windows), default=0.0)
        h = state.history
        # keep one sample at or before now - longest (the window's baseline), drop older ones
        while len(h) >= 2 and h[1].t <= now - longest:
            h.popleft()

    def _add_derived(self, f: "_Families", labels: list[str], window: str, d: DerivedValues, running: float) -> None:
        lw = labels + [window]
        if d.draft_acceptance_rate is not None:
            f.acceptance_rate.add_metric(lw, d.draft_acceptance_rate)
        if d.mean_acceptance_length is not None:
            f.mean_length.add_metric(lw, d.mean_acceptance_length)
        for pos, r in enumerate(d.position_acceptance_rates):
            f.pos_rate.add_metric(labels + [str(pos), window], r)
        for pos, r in enumerate(d.position_conditional_acceptance_rates):
            if r is not None:
                f.pos_cond.add_metric(labels + [str(pos), window], r)
        for k, e in enumerate(d.expected_acceptance_lengths, start=1):
            f.expected.add_metric(labels + [str(k), window], e)
        if d.draft_tokens_per_draft is not None:
            f.tokens_per_draft.add_metric(lw, d.draft_tokens_per_draft)
        if d.output_from_drafts_ratio is not None:
            f.from_drafts.add_metric(lw, d.output_from_drafts_ratio)
        if d.position_acceptance_rates:
            speedups = estimated_speedups(d.position_acceptance_rates, running, self._cost)
            for k, s in speedups.items():
                f.speedup.add_metric(labels + [str(k), window], s)
            f.recommended.add_metric(lw, float(recommend_k(speedups)))


class _Families:
    """Fresh metric families for one scrape (names and HELP texts are the exposed contract)."""

    def __init__(self) -> None:
        U, E, W = ["upstream"], ["upstream", "model_name", "engine"], ["window"]
        src = "vllm:spec_decode_num_"
        self.up = GaugeMetricFamily("specwatch_up", "1 if the last fetch and parse of the upstream's /metrics worked, else 0.", labels=U)
        self.duration = GaugeMetricFamily("specwatch_scrape_duration_seconds", "Time to fetch and parse the upstream's /metrics, seconds.", labels=U)
        self.enabled = GaugeMetricFamily("specwatch_spec_decode_enabled", "1 if the upstream exports speculative-decoding metrics, 0 if it runs without speculation.", labels=U)
        self.info = GaugeMetricFamily("specwatch_upstream_info", "Schema of the upstream's spec-decode metrics (v1, v1-early, v0, llamacpp, none); always 1.", labels=U + ["schema"])
        self.build_info = GaugeMetricFamily("specwatch_build_info", "specwatch version; always 1.", labels=["version"])
        self.fetch_errors = CounterMetricFamily("specwatch_upstream_fetch_errors", "Failed fetches of the upstream's /metrics since the exporter started, by reason.", labels=U + ["reason"])
        self.violations = CounterMetricFamily("specwatch_invariant_violations", "Scrapes whose counters broke a vLLM invariant (sum of per-position = accepted, per-position non-increasing, accepted <= draft tokens <= drafts x k); derived values are withheld then.", labels=U + ["invariant"])
        self.drafts = CounterMetricFamily("specwatch_drafts", f"Verify steps that carried draft tokens; copy of {src}drafts_total.", labels=E)
        self.draft_tokens = CounterMetricFamily("specwatch_draft_tokens", f"Draft tokens proposed; copy of {src}draft_tokens_total.", labels=E)
        self.accepted = CounterMetricFamily("specwatch_accepted_tokens", f"Draft tokens accepted (bonus token excluded); copy of {src}accepted_tokens_total.", labels=E)
        self.accepted_per_pos = CounterMetricFamily("specwatch_accepted_tokens_per_position", f"Drafts whose first position+1 tokens were all accepted; copy of {src}accepted_tokens_per_pos_total.", labels=E + ["position"])
        self.generation = CounterMetricFamily("specwatch_generation_tokens", "All output tokens; copy of vllm:generation_tokens_total.", labels=E)
        self.k = GaugeMetricFamily("specwatch_num_speculative_tokens", "num_speculative_tokens (k), inferred from the number of position labels of the per-position counter.", labels=E)
        self.acceptance_rate = GaugeMetricFamily("specwatch_draft_acceptance_rate", "Draft acceptance rate, 0-1: increase(accepted_tokens) / increase(draft_tokens) over the window.", labels=E + W)
        self.mean_length = GaugeMetricFamily("specwatch_mean_acceptance_length", "Mean acceptance length, tokens per verify step (bonus included): 1 + increase(accepted_tokens) / increase(drafts).", labels=E + W)
        self.pos_rate = GaugeMetricFamily("specwatch_position_acceptance_rate", "Per-position acceptance rate r_i, 0-1: increase(accepted_per_pos[i]) / increase(drafts).", labels=E + ["position"] + W)
        self.pos_cond = GaugeMetricFamily("specwatch_position_conditional_acceptance_rate", "Conditional per-position acceptance, 0-1: r_i / r_(i-1), r_(-1) = 1.", labels=E + ["position"] + W)
        self.expected = GaugeMetricFamily("specwatch_expected_acceptance_length", "What-if mean acceptance length at num_speculative_tokens=k: 1 + sum of r_i for i < k (tokens per step).", labels=E + ["k"] + W)
        self.tokens_per_draft = GaugeMetricFamily("specwatch_draft_tokens_per_draft", "Effective k: increase(draft_tokens) / increase(drafts).", labels=E + W)
        self.from_drafts = GaugeMetricFamily("specwatch_output_from_drafts_ratio", "Share of output tokens that came from accepted drafts, 0-1: increase(accepted_tokens) / increase(vllm:generation_tokens_total).", labels=E + W)
        self.speedup = GaugeMetricFamily("specwatch_estimated_speedup", "Estimated speedup at num_speculative_tokens=k vs no speculation: expected acceptance length / verify-step cost factor 1 + k(a + s*running requests).", labels=E + ["k"] + W)
        self.recommended = GaugeMetricFamily("specwatch_recommended_num_speculative_tokens", "k with the best estimated speedup (smallest within 2%); 0 = turn speculation off.", labels=E + W)
        self.v0_rate = GaugeMetricFamily("specwatch_v0_draft_acceptance_rate", "vLLM V0 gauge vllm:spec_decode_draft_acceptance_rate (most recent interval; V0 counts accepted tokens after a rejection too).", labels=["upstream", "model_name"])
        self.v0_efficiency = GaugeMetricFamily("specwatch_v0_spec_decode_efficiency", "vLLM V0 gauge vllm:spec_decode_efficiency = emitted / (draft_tokens / k x (k+1)).", labels=["upstream", "model_name"])

    def all(self) -> Iterator[Metric]:
        for fam in vars(self).values():
            if fam.samples or fam.name in ("specwatch_up", "specwatch_build_info"):
                yield fam
