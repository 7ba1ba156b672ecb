"""``specwatch serve``: the command that runs the exporter (HTTP server with ``/`` landing page and
``/metrics``). It parses flags, binds the listener and serves the app of
:mod:`specwatch.exporter.app` (the library: registry, rendering, WSGI app)."""

from __future__ import annotations

import logging
import signal
import sys
import threading

import click

from specwatch import __version__
from specwatch.exporter.app import make_app, make_registry, render_round
from specwatch.exporter.collector import limit_malloc_arenas
from specwatch.exporter.config import DEFAULT_LISTEN_ADDRESS, DEFAULT_WINDOWS, ConfigError, build_config, split_upstreams
from specwatch.exporter.listener import Listener
from specwatch.exporter.options import cost_options

log = logging.getLogger("specwatch.exporter")

#: ``serve --once`` exit statuses besides 0 (at least one upstream up) and 2 (a bad flag).
ONCE_ALL_DOWN = 3
ONCE_RENDER_FAILED = 4


class FlagError(click.ClickException):
    """A bad flag value: one line ``Error: …`` on stderr, exit status 2."""

    exit_code = 2


@click.command("serve")
@click.option("--upstream", "upstreams", multiple=True, envvar="SPECWATCH_UPSTREAMS",
              help="vLLM server to scrape: URL or NAME=URL (base URL or full /metrics URL), optionally followed by "
                   ",method=M and ,drafter=D: what this server runs (overrides --speculative-method/--drafter); "
                   ",server_info=on: also read its vLLM dev-mode /server_info (VLLM_SERVER_DEV_MODE=1). "
                   "Repeatable; env SPECWATCH_UPSTREAMS takes a space-separated list.")
@click.option("--window", "windows", multiple=True, default=DEFAULT_WINDOWS, show_default=True,
              envvar="SPECWATCH_WINDOWS",
              help="Sliding window for derived values, besides window=\"lifetime\" (e.g. 15s, 30s, 1m, 5m): the short ones "
                   "follow the load (a benchmark cell), the long ones feed the rules. Served under its normalised spelling "
                   "(01m and 60s as 1m). Repeatable; giving one replaces the defaults.")
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
              help="Scrapes within this many seconds after a fetch round finished share it; a scrape "
                   "arriving while another's round is in flight gets the previous round if it is younger "
                   "than --timeout (header X-Specwatch-Round-Age), else waits for the round.")
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
