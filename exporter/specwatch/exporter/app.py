"""The exporter as a library: its registry (:func:`make_registry`), the rendering of one scrape
(:func:`render_metrics`, :func:`render_round`) and the WSGI app with the ``/`` landing page and
``/metrics`` (:func:`make_app`). The command ``specwatch serve`` (:mod:`specwatch.exporter.server`)
only parses flags, binds the listener and runs this; tests and scripts import from here."""

from __future__ import annotations

import gzip
import html
import logging
import threading

from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder

from specwatch import __version__
from specwatch.exporter.collector import SpecwatchCollector, release_memory
from specwatch.exporter.config import ExporterConfig
from specwatch.specdecode.metrics import clip

log = logging.getLogger("specwatch.exporter")



def make_registry(config: ExporterConfig, **collector_kwargs) -> CollectorRegistry:
    """A fresh registry holding only the specwatch collector (no process/platform metrics, whose
    values say nothing about speculation and would differ per host). The collector is also
    reachable as ``registry.specwatch_collector``."""
    registry = CollectorRegistry(auto_describe=False)
    collector = SpecwatchCollector(config, **collector_kwargs)
    collector.asked_formats = _AskedFormats()  # type: ignore[attr-defined]
    collector.before_publish = collector.asked_formats.prerender  # type: ignore[attr-defined]
    registry.register(collector)
    registry.specwatch_collector = collector  # type: ignore[attr-defined]
    return registry


#: The families answered with HTTP 500 when a round cannot be rendered (:func:`render_metrics`).
SELF_METRICS = ("specwatch_up", "specwatch_build_info", "specwatch_scrape_duration_seconds",
                "specwatch_upstream_fetch_errors", "specwatch_upstream_fetches")


class _Families:
    """A registry-like wrapper of a list of families (what the encoders read)."""

    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def _render_self_metrics(rnd, encoder) -> bytes:
    """The :data:`SELF_METRICS` families of ``rnd``, each rendered on its own (one that still fails
    is left out; ``specwatch_build_info`` is rebuilt if need be, so the body is never empty)."""
    parts = []
    for fam in rnd.collect():
        if fam.name in SELF_METRICS:
            try:
                parts.append(encoder(_Families([fam])))
            except Exception:  # leave out what cannot be rendered
                continue
    if not parts:
        info = GaugeMetricFamily("specwatch_build_info", "specwatch version; always 1.", labels=["version"])
        info.add_metric([__version__], 1.0)
        parts.append(encoder(_Families([info])))
    if encoder is not generate_latest:  # OpenMetrics: one # EOF, at the end
        parts = [p.replace(b"# EOF\n", b"") for p in parts] + [b"# EOF\n"]
    return b"".join(parts)


def render_metrics(collector: SpecwatchCollector, accept: str, accept_encoding: str) -> tuple[bytes, list]:
    """The exposition of the current fetch round as ``(body, headers)``, in the format the
    ``Accept`` header asks for (text 0.0.4 by default, OpenMetrics on request) and gzipped when
    ``Accept-Encoding`` allows; rendered once per round and format, shared by every scrape.

    A round that cannot be rendered (a bug: every label is checked where it enters) raises
    :class:`RenderError` carrying the self-metrics body (:data:`SELF_METRICS`) and headers to
    answer with HTTP 500; the failure is logged once per round at warning level."""
    status, body, headers = render_round(collector, accept, accept_encoding)
    if status != 200:
        raise RenderError(body, headers)
    return body, headers


class RenderError(Exception):
    """A round could not be rendered; ``body``/``headers``: the self-metrics to answer 500 with."""

    def __init__(self, body: bytes, headers: list):
        super().__init__("the exposition could not be rendered")
        self.body = body
        self.headers = headers


def _render_into(rnd, key: tuple[str, bool], encoder) -> tuple[int, bytes]:
    """``(status, body)`` of round ``rnd`` in format ``key``, rendered once (under the round's
    render lock) and kept on the round."""
    with rnd.render_lock:
        got = rnd.rendered.get(key)
        if got is None:
            status = 200
            try:
                body = encoder(rnd)
            except Exception as exc:  # answer 500 with the self-metrics, never a silent close
                log.warning("the /metrics exposition could not be rendered (%s: %s); answering HTTP 500 with the "
                            "self-metrics", type(exc).__name__, clip(str(exc), 200))
                status, body = 500, _render_self_metrics(rnd, encoder)
            if key[1]:
                body = gzip.compress(body, compresslevel=5)
            got = rnd.rendered[key] = (status, body)
            release_memory()
    return got


class _AskedFormats:
    """The exposition formats a collector's scrapes asked for, most recent last (``(content type,
    gzip) -> encoder``; at most 4: text or OpenMetrics, gzipped or not)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked: dict[tuple[str, bool], object] = {}

    def note(self, key: tuple[str, bool], encoder) -> None:
        """Remember that a scrape asked for format ``key``."""
        with self._lock:
            self._asked.pop(key, None)
            self._asked[key] = encoder
            while len(self._asked) > 4:
                self._asked.pop(next(iter(self._asked)))

    def prerender(self, rnd) -> None:
        """Render a built round in every format asked for, before it is published (the
        collector's ``before_publish``): the scrape that started the round pays for it, and
        scrapes that come later never wait behind it."""
        with self._lock:
            asked = list(self._asked.items())
        for key, encoder in asked:
            _render_into(rnd, key, encoder)


def render_round(collector: SpecwatchCollector, accept: str, accept_encoding: str) -> tuple[int, bytes, list]:
    """``(HTTP status, body, headers)`` of the current round (see :func:`render_metrics`): 200 and
    the full exposition, or 500 and the self-metrics when the round cannot be rendered. The headers
    carry ``X-Specwatch-Round-Age``: seconds since the round's fetches ended (see
    :meth:`SpecwatchCollector.current_round`)."""
    encoder, content_type = choose_encoder(accept)
    use_gzip = "gzip" in (accept_encoding or "")
    key = (content_type, use_gzip)
    asked = getattr(collector, "asked_formats", None)
    if asked is not None:
        asked.note(key, encoder)
    rnd = collector.current_round()
    status, body = _render_into(rnd, key, encoder)
    headers = [("Content-Type", content_type)]
    if use_gzip:
        headers.append(("Content-Encoding", "gzip"))
    # how old the round's values are (seconds since its fetches ended): above 0 by more than the
    # rendering when this scrape got the previous round while another scrape's round was in flight
    headers.append(("X-Specwatch-Round-Age", f"{collector.round_age(rnd):.3f}"))
    return status, body, headers


def make_app(config: ExporterConfig, registry: CollectorRegistry):
    """WSGI app: ``/`` is a landing page linking ``/metrics``; ``/metrics`` the exposition;
    anything else 404. No request parameter ever selects what is fetched."""
    collector = getattr(registry, "specwatch_collector", None)
    metrics_app = make_wsgi_app(registry) if collector is None else None
    names = "".join(f"<li>{html.escape(u.name)}</li>" for u in config.upstreams)
    head = (
        "<!doctype html><html><head><title>specwatch</title></head><body>"
        f"<h1>specwatch {__version__}</h1><p>Speculative-decoding exporter for vLLM.</p>"
        f'<p><a href="/metrics">/metrics</a></p><p>Upstreams:</p><ul>{names}</ul>'
        "<p>Per-position, conditional and what-if series carry <code>basis=\"exact\"</code> when every "
        "draft in the window carried k tokens and <code>basis=\"lower_bound\"</code> when drafts were ragged "
        "(k &times; drafts &minus; draft tokens &gt; max(1, 0.5 % of drafts)); a lower-bound curve widens the "
        "what-if speedups' intervals upwards, and the recommended k says how sure it is "
        "(<code>specwatch_recommendation_certain</code>).</p>"
    )

    def landing() -> bytes:
        """The landing page, with the windows whose recommendation the latest round withheld, and
        those whose recommended k is the better estimate only (not told apart from its runner-up)."""
        rows, unsure = [], []

        def where(lab) -> str:
            return (f"{html.escape(lab.get('upstream', ''))} / {html.escape(lab.get('model_name', ''))}"
                    f" engine {html.escape(lab.get('engine', ''))}, window {html.escape(lab.get('window', ''))}")

        if collector is not None:
            fams = {fam.name: fam for fam in collector.latest_families()}
            fam = fams.get("specwatch_recommendation_withheld")
            for smp in fam.samples if fam is not None else ():
                rows.append(f"<li>{where(smp.labels)}: {html.escape(smp.labels.get('reason', ''))}</li>")
            ks = {tuple(sorted((k, v) for k, v in smp.labels.items() if k != "basis")): smp.value
                  for smp in (fams["specwatch_recommended_num_speculative_tokens"].samples
                              if "specwatch_recommended_num_speculative_tokens" in fams else ())}
            fam = fams.get("specwatch_recommendation_certain")
            for smp in fam.samples if fam is not None else ():
                k = ks.get(tuple(sorted(smp.labels.items())))
                if smp.value == 0.0 and k is not None:
                    unsure.append(f"<li>{where(smp.labels)}: k = {k:g}, the better estimate only</li>")
        withheld = (f"<p>Recommendation withheld (latest fetch):</p><ul>{''.join(rows)}</ul>" if rows else "")
        if unsure:
            withheld += ("<p>Recommendation not certain (latest fetch; the best estimate, not told apart from its "
                         f"runner-up):</p><ul>{''.join(unsure)}</ul>")
        return (head + withheld + "</body></html>").encode()

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            environ["QUERY_STRING"] = ""  # name[] filters are not offered
            if metrics_app is not None:
                return metrics_app(environ, start_response)
            status, body, headers = render_round(collector, environ.get("HTTP_ACCEPT", ""),
                                                 environ.get("HTTP_ACCEPT_ENCODING", ""))
            start_response("200 OK" if status == 200 else "500 Internal Server Error", headers)
            return [body]
        if path in ("/", ""):
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [landing()]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found; see /metrics\n"]

    return app


