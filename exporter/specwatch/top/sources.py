"""Where ``specwatch top`` gets its exposition text.

- :class:`ExporterSource`: ``GET`` a running exporter's ``/metrics`` (``specwatch serve``).
- :class:`UpstreamSource`: no exporter running: the exporter's own collector
  (:class:`specwatch.exporter.collector.SpecwatchCollector`) scrapes the vLLM upstreams in this process and
  its registry is rendered with ``generate_latest``, so every number is derived by the same code
  as in ``specwatch serve``, and every body is fetched and classified by serve's own path
  (:class:`specwatch.exporter.fetching.AsyncHttpRunner`, :func:`specwatch.exporter.fetching.parse_body`):
  the same body is up or down, with the same reason, in both. The last error per upstream is
  the collector's (:meth:`~specwatch.exporter.collector.SpecwatchCollector.last_errors`); vLLM's request
  gauges (``vllm:num_requests_running`` / ``vllm:num_requests_waiting``), which the exporter does
  not serve, are read from each accepted body (the collector's ``on_body``).

Each ``fetch()`` returns a :class:`Fetched` or raises :class:`SourceError` (one line for the user).
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest

from specwatch.exporter.collector import SpecwatchCollector
from specwatch.exporter.fetching import FetchError, http_fetch
from specwatch.exporter.config import DEFAULT_WINDOWS, ConfigError, Upstream, build_config, parse_upstream
from specwatch.top.model import ExpositionError, Sample, check_specwatch, parse_exposition

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


class _RequestGauges:
    """vLLM's request gauges of each upstream's last body the collector accepted (its
    ``on_body``; thread-safe: the collector parses upstreams in parallel)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str, str], tuple[float | None, float | None]] = {}

    def __call__(self, upstream: str, body: str) -> None:
        reqs = _request_gauges(upstream, body)
        with self._lock:
            for key in [k for k in self.requests if k[0] == upstream]:
                del self.requests[key]
            self.requests.update(reqs)

    def snapshot(self) -> dict[tuple[str, str, str], tuple[float | None, float | None]]:
        """The request gauges as of now (a copy)."""
        with self._lock:
            return dict(self.requests)


#: The lines of vLLM's request gauges (only these are parsed: the rest of the body is the
#: collector's, which has accepted it already).
_REQUEST_LINE = re.compile(r"^vllm:num_requests_(?:running|waiting)[{ \t][^\n]*", re.M)


def _request_gauges(upstream: str, body: str) -> dict[tuple[str, str, str], tuple[float | None, float | None]]:
    """(upstream, model_name, engine) -> (running, waiting) from ``body``'s
    ``vllm:num_requests_running`` / ``_waiting`` lines ({} when they do not parse)."""
    running: dict[tuple[str, str, str], float] = {}
    waiting: dict[tuple[str, str, str], float] = {}
    try:
        samples = parse_exposition("\n".join(_REQUEST_LINE.findall(body)) + "\n")
    except ExpositionError:
        return {}
    for s in samples:
        if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting") and math.isfinite(s.value):
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
        self.requests = _RequestGauges()
        # serve's own fetch path (AsyncHttpRunner, parse_body): every body is classified as serve does
        self.collector = SpecwatchCollector(self.config, on_body=self.requests)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.description = "upstreams " + ", ".join(f"{u.name}={u.metrics_url}" for u in self.config.upstreams)
        if cost_profile is not None:
            self.description += f"; cost profile {cost_profile}"

    def fetch(self) -> Fetched:
        """One scrape of every upstream through the collector. Never raises for a down upstream
        (that is shown as ``specwatch_up 0``)."""
        text = generate_latest(self.registry).decode()
        return Fetched(parse_exposition(text), self.requests.snapshot(), self.collector.last_errors())

    def close(self) -> None:
        """Stop the collector's fetch loop."""
        self.collector.close()


__all__ = ["ConfigError", "ExporterSource", "Fetched", "SourceError", "UpstreamSource", "exporter_metrics_url"]
