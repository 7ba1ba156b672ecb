"""``specwatch serve``: run the exporter (HTTP server with ``/`` landing page and ``/metrics``)."""

from __future__ import annotations

import gzip
import html
import logging
import signal
import sys
import threading

import click
from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder

from specwatch import __version__
from specwatch.exporter.collector import SpecwatchCollector, limit_malloc_arenas, release_memory
from specwatch.exporter.config import DEFAULT_LISTEN_ADDRESS, ConfigError, ExporterConfig, build_config, split_upstreams
from specwatch.exporter.listener import Listener
from specwatch.exporter.options import cost_options
from specwatch.specdecode.metrics import clip

log = logging.getLogger("specwatch.exporter")

#: ``serve --once`` exit statuses besides 0 (at least one upstream up) and 2 (a bad flag).
ONCE_ALL_DOWN = 3
ONCE_RENDER_FAILED = 4


def make_registry(config: ExporterConfig, **collector_kwargs) -> CollectorRegistry:
    """A fresh registry holding only the specwatch collector (no process/platform metrics, whose
    values say nothing about speculation and would differ per host). The collector is also
    reachable as ``registry.specwatch_collector``."""
    registry = CollectorRegistry(auto_describe=False)
    collector = SpecwatchCollector(config, **collector_kwargs)
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


def render_round(collector: SpecwatchCollector, accept: str, accept_encoding: str) -> tuple[int, bytes, list]:
    """``(HTTP status, body, headers)`` of the current round (see :func:`render_metrics`): 200 and
    the full exposition, or 500 and the self-metrics when the round cannot be rendered."""
    rnd = collector.current_round()
    encoder, content_type = choose_encoder(accept)
    use_gzip = "gzip" in (accept_encoding or "")
    key = (content_type, use_gzip)
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
            if use_gzip:
                body = gzip.compress(body, compresslevel=5)
            got = rnd.rendered[key] = (status, body)
            release_memory()
    status, body = got
    headers = [("Content-Type", content_type)]
    if use_gzip:
        headers.append(("Content-Encoding", "gzip"))
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
        "(k &times; drafts &minus; draft tokens &gt; max(1, 0.5 % of drafts)); no recommended k is derived "
        "from a lower-bound curve (<code>specwatch_recommendation_withheld{reason}</code>).</p>"
    )

    def landing() -> bytes:
        """The landing page, with the windows whose recommendation the latest round withheld."""
        rows = []
        if collector is not None:
            for fam in collector.latest_families():
                if fam.name == "specwatch_recommendation_withheld":
                    for smp in fam.samples:
                        lab = smp.labels
                        rows.append(f"<li>{html.escape(lab.get('upstream', ''))} / {html.escape(lab.get('model_name', ''))}"
                                    f" engine {html.escape(lab.get('engine', ''))}, window "
                                    f"{html.escape(lab.get('window', ''))}: {html.escape(lab.get('reason', ''))}</li>")
        withheld = (f"<p>Recommendation withheld (latest fetch):</p><ul>{''.join(rows)}</ul>" if rows else "")
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


class FlagError(click.ClickException):
    """A bad flag value: one line ``Error: …`` on stderr, exit status 2."""

    exit_code = 2


@click.command("serve")
@click.option("--upstream", "upstreams", multiple=True, envvar="SPECWATCH_UPSTREAMS",
              help="vLLM server to scrape: URL or NAME=URL (base URL or full /metrics URL), optionally followed by "
                   ",method=M and ,drafter=D: what this server runs (overrides --speculative-method/--drafter); "
                   ",server_info=on: also read its vLLM dev-mode /server_info (VLLM_SERVER_DEV_MODE=1). "
                   "Repeatable; env SPECWATCH_UPSTREAMS takes a space-separated list.")
@click.option("--window", "windows", multiple=True, default=("1m", "5m"), show_default=True,
              envvar="SPECWATCH_WINDOWS",
              help="Sliding window for derived values, besides window=\"lifetime\" (e.g. 30s, 1m, 5m). Repeatable.")
@click.option("--listen-address", default=DEFAULT_LISTEN_ADDRESS, show_default=True,
              envvar="SPECWATCH_LISTEN_ADDRESS", help="HOST:PORT to serve / and /metrics on.")
@click.option("--timeout", "timeout_seconds", type=float, default=5.0, show_default=True,
              help="Per-upstream fetch deadline in seconds (keep below the scrape timeout).")
@click.option("--max-body-bytes", type=int, default=16 * 1024 * 1024, show_default=True,
              help="Largest /metrics body accepted from an upstream.")
@cost_options()
@click.option("--cost-per-draft-token", "old_cost_a", default=None, hidden=True)
@click.option("--cost-per-draft-token-per-running-request", "old_cost_b", default=None, hidden=True)
@click.option("--min-fetch-interval", type=float, default=1.0, show_default=True,
              help="Scrapes within this many seconds after a fetch round share it (0: only scrapes "
                   "arriving while a round is in flight share it).")
@click.option("--max-requests", type=int, default=40, show_default=True,
              help="Most /metrics requests served at once; more get 503 (like node_exporter's --web.max-requests).")
@click.option("--max-connections", type=int, default=200, show_default=True,
              help="Most connections still sending their request head; a newcomer beyond it takes the place of the "
                   "one that has waited longest (else 503). Up to --max-requests more serve answered requests.")
@click.option("--request-timeout", type=float, default=10.0, show_default=True,
              help="Seconds a client has to send its request line and headers (in total), and to take the answer.")
@click.option("--once", is_flag=True, help="Scrape once, print the exposition to stdout and exit: status 0 when at "
              "least one upstream is up, 3 when every upstream is down, 4 when the exposition could not be rendered "
              "(the self-metrics are printed then), 2 for a bad flag.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
def serve(upstreams, windows, listen_address, timeout_seconds, max_body_bytes, cost_profile, baseline_upstream,
          speculative_method, drafter, old_cost_a, old_cost_b, min_fetch_interval,
          max_requests, max_connections, request_timeout, once, log_level):
    """Run the exporter: on each scrape, fetch every upstream's /metrics and derive draft
    acceptance rate, mean acceptance length, per-position acceptance (unconditional and
    conditional), the what-if curve for every smaller k and the live k advice."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if old_cost_a is not None or old_cost_b is not None:
        raise FlagError("--cost-per-draft-token(-per-running-request) are gone: step costs are measured now; "
                        "write a cost profile with specwatch calibrate and pass --cost-profile FILE")
    try:
        ups = split_upstreams(upstreams)
        config = build_config(ups, windows, listen_address, timeout_seconds, max_body_bytes,
                              cost_profile=cost_profile, baseline_upstream=baseline_upstream,
                              speculative_method=speculative_method, drafter=drafter,
                              min_fetch_interval=min_fetch_interval, max_requests=max_requests,
                              max_connections=max_connections, request_timeout=request_timeout)
    except ConfigError as exc:
        raise FlagError(str(exc)) from None
    limit_malloc_arenas()
    if once:
        registry = make_registry(config)
        collector = registry.specwatch_collector
        status, body, _ = render_round(collector, "", "")
        sys.stdout.write(body.decode())
        sys.stdout.flush()
        collector.close()
        if status != 200:
            raise SystemExit(ONCE_RENDER_FAILED)
        ups_up = [s.value for f in collector.latest_families() if f.name == "specwatch_up" for s in f.samples]
        if not any(ups_up):
            log.warning("every upstream is down (specwatch_up 0): exit status %d", ONCE_ALL_DOWN)
            raise SystemExit(ONCE_ALL_DOWN)
        return
    try:
        httpd = Listener(config.listen_host, config.listen_port, None, max_requests=config.max_requests,
                         max_connections=config.max_connections, request_timeout=config.request_timeout)
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise FlagError(f"cannot listen on {listen_address}: {reason}") from None
    registry = make_registry(config)
    httpd.app = make_app(config, registry)
    host = f"[{config.listen_host}]" if ":" in config.listen_host else config.listen_host
    log.info("specwatch %s listening on http://%s:%d/metrics for %s", __version__, host,
             config.listen_port, ", ".join(u.name for u in config.upstreams))
    stop = threading.Event()

    def _term(*_):
        stop.set()
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _term)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
