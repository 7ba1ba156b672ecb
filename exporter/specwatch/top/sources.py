"""Where ``specwatch top`` gets its exposition text.

- :class:`ExporterSource`: ``GET`` a running exporter's ``/metrics`` (``specwatch serve``).
- :class:`UpstreamSource`: no exporter running: the exporter's own collector
  (:class:`specwatch.exporter.collector.SpecwatchCollector`) scrapes the vLLM upstreams in this process and
  its registry is rendered with ``generate_latest``, so every number is derived by the same code
  as in ``specwatch serve``. The fetcher handed to the collector is :func:`specwatch.exporter.fetching.
  http_fetch`, wrapped to keep the last error message per upstream and vLLM's request gauges
  (``vllm:num_requests_running`` / ``vllm:num_requests_waiting``), which the exporter does not
  serve.

Each ``fetch()`` returns a :class:`Fetched` or raises :class:`SourceError` (one line for the user).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest

from specwatch.exporter.collector import SpecwatchCollector
from specwatch.exporter.fetching import FetchError, http_fetch
from specwatch.exporter.config import DEFAULT_WINDOWS, ConfigError, Upstream, build_config, parse_upstream
from specwatch.top.model import ExpositionError, Sample, check_specwatch, parse_exposition
from specwatch.specdecode.metrics import MetricsParseError, parse_metrics

#: Largest exporter body accepted (an exporter with a few upstreams serves tens of KiB).
MAX_BODY_BYTES = 16 * 1024 * 1024


class SourceError(Exception):
    """The source could not be read; ``str()`` is one line saying what and where. ``reason``: the
    fetch's failure kind (:class:`specwatch.exporter.collector.FetchError`'s, e.g. ``connect``:
    nothing answers at the address yet) or None when the answer itself was wrong."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Fetched:
    """One read of a source: parsed ``samples`` of the exposition, ``requests`` (upstream,
    model_name, engine) -> (running, waiting) when read from the upstreams themselves, and
    ``errors`` upstream -> last fetch error message when known."""

    samples: list[Sample]
    requests: dict[tuple[str, str, str], tuple[float | None, float | None]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def exporter_metrics_url(url: str) -> str:
    """Validate an exporter URL (http(s), host, optional port; ``/metrics`` appended to a base
    URL). Raises :class:`specwatch.exporter.config.ConfigError`."""
    return parse_upstream(url).metrics_url


class ExporterSource:
    """A running specwatch exporter at ``metrics_url`` (see :func:`exporter_metrics_url`)."""

    def __init__(self, metrics_url: str, timeout: float = 10.0):
        self.metrics_url = metrics_url
        self.timeout = timeout
        self.description = f"exporter {metrics_url}"
        self._upstream = Upstream("exporter", metrics_url)

    def fetch(self) -> Fetched:
        """GET the exporter's /metrics and parse it. Raises :class:`SourceError` when it cannot
        be reached, answers with an HTTP error, or is not a specwatch exporter."""
        try:
            text = http_fetch(self._upstream, self.timeout, MAX_BODY_BYTES)
        except FetchError as exc:
            raise SourceError(f"cannot read the exporter at {self.metrics_url}: {exc.reason}: {exc}",
                              reason=exc.reason) from None
        try:
            samples = parse_exposition(text)
            check_specwatch(samples)
        except ExpositionError as exc:
            raise SourceError(f"{self.metrics_url}: {exc}") from None
        return Fetched(samples)

    def close(self) -> None:
        """Nothing to release (each fetch is one request)."""


class _RecordingFetcher:
    """:func:`http_fetch` that remembers, per upstream, the last error message and vLLM's request
    gauges of the last good body (thread-safe: the collector fetches upstreams in parallel)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.errors: dict[str, str] = {}
        self.requests: dict[tuple[str, str, str], tuple[float | None, float | None]] = {}

    def __call__(self, upstream: Upstream, timeout: float, max_bytes: int) -> str:
        try:
            body = http_fetch(upstream, timeout, max_bytes)
        except FetchError as exc:
            with self._lock:
                self.errors[upstream.name] = f"{exc.reason}: {exc}"
            raise
        try:
            parse_metrics(body, max_bytes=max_bytes)  # the collector parses again; here for the message
        except MetricsParseError as exc:
            with self._lock:
                self.errors[upstream.name] = f"parse: {exc}"
            return body
        reqs = _request_gauges(upstream.name, body)
        with self._lock:
            self.errors.pop(upstream.name, None)
            for key in [k for k in self.requests if k[0] == upstream.name]:
                del self.requests[key]
            self.requests.update(reqs)
        return body

    def snapshot(self) -> tuple[dict, dict[str, str]]:
        """(request gauges, last error messages) as of now (copies)."""
        with self._lock:
            return dict(self.requests), dict(self.errors)


def _request_gauges(upstream: str, body: str) -> dict[tuple[str, str, str], tuple[float | None, float | None]]:
    running: dict[tuple[str, str, str], float] = {}
    waiting: dict[tuple[str, str, str], float] = {}
    for s in parse_exposition(body):
        if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            key = (upstream, s.labels.get("model_name", ""), s.labels.get("engine", ""))
            target = running if s.name.endswith("running") else waiting
            target[key] = target.get(key, 0.0) + s.value
    return {k: (running.get(k), waiting.get(k)) for k in set(running) | set(waiting)}


class UpstreamSource:
    """vLLM upstreams scraped in-process by the exporter's collector (windows 15s, 30s, 1m and 5m,
    the ``serve`` defaults; the windows fill as the view keeps refreshing).

    ``upstreams`` are ``URL`` or ``NAME=URL`` as for ``specwatch serve --upstream``;
    ``cost_profile`` (a path), ``baseline_upstream``, ``speculative_method`` and ``drafter`` mean
    what they mean for ``specwatch serve`` (without a cost profile every speedup is the built-in
    guess, basis=default). Raises :class:`specwatch.exporter.config.ConfigError` for a bad value
    (the cost profile is read here, once).
    """

    def __init__(self, upstreams: list[str], windows: tuple[str, ...] = DEFAULT_WINDOWS, timeout: float = 5.0,
                 cost_profile: str | None = None, baseline_upstream: str | None = None,
                 speculative_method: str | None = None, drafter: str | None = None):
        # the exporter's own range for its per-upstream deadline is 0.1-60 s; keep it within
        timeout = min(max(timeout, 0.1), 60.0)
        self.config = build_config(upstreams, windows, "127.0.0.1:1", timeout_seconds=timeout,
                                   cost_profile=cost_profile, baseline_upstream=baseline_upstream,
                                   speculative_method=speculative_method, drafter=drafter)
        self.fetcher = _RecordingFetcher()
        self.collector = SpecwatchCollector(self.config, fetch=self.fetcher)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.description = "upstreams " + ", ".join(f"{u.name}={u.metrics_url}" for u in self.config.upstreams)
        if cost_profile is not None:
            self.description += f"; cost profile {cost_profile}"

    def fetch(self) -> Fetched:
        """One scrape of every upstream through the collector. Never raises for a down upstream
        (that is shown as ``specwatch_up 0``)."""
        text = generate_latest(self.registry).decode()
        reqs, errs = self.fetcher.snapshot()
        return Fetched(parse_exposition(text), reqs, errs)

    def close(self) -> None:
        """Nothing to release (the collector's fetch threads end with the process)."""


__all__ = ["ConfigError", "ExporterSource", "Fetched", "SourceError", "UpstreamSource", "exporter_metrics_url"]
