"""``specwatch top``: the click command, the refresh loop and the keys.

The source is read by a background thread every ``--interval`` seconds (a slow upstream never
freezes the keys); the main thread redraws on new data, a key or a resize. Keys are read with the
terminal in cbreak mode (no echo, no line buffering, Ctrl-C still a signal); the terminal's
previous mode and screen are restored on every way out (q, Ctrl-C, SIGTERM/SIGHUP, an error).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import sys
import threading
import time
from collections.abc import Iterator

import click
from rich.console import Console
from rich.live import Live

from specwatch.common.params import FloatRange
from specwatch.common.processes import install_stop_signals
from specwatch.common.defaults import EXPORTER_PORT
from specwatch.exporter.config import ConfigError, parse_window
from specwatch.exporter.options import COST_OPTION_NAMES, cost_options
from specwatch.top.model import LIFETIME, TopView, build_view
from specwatch.top.render import render_live, render_plain
from specwatch.top.sources import ExporterSource, Fetched, SourceError, UpstreamSource, exporter_metrics_url

DEFAULT_EXPORTER = f"http://127.0.0.1:{EXPORTER_PORT}/metrics"
KEY_WINDOWS = {"1": "1m", "5": "5m", "l": LIFETIME, "L": LIFETIME}
#: ``--window`` when not given (the view follows one minute of load; ``--window 15s`` follows a
#: benchmark cell of 15-60 s, if the exporter serves it: ``specwatch serve`` does by default).
DEFAULT_WINDOW = "1m"
#: ``specwatch serve`` options that change what ``top --upstream`` shows (the collector runs in this
#: process with them): speedups with basis calibrated/profile instead of the built-in guess
#: (basis=default), the baseline server's decode speed, the cost-profile curve that applies.
#: Defined once in :mod:`specwatch.exporter.options` for both commands.
SERVE_FLAGS = COST_OPTION_NAMES
serve_options = cost_options(envvars=False, help_prefix="With --upstream only, as for serve: ")


@contextlib.contextmanager
def quiet_exporter_log() -> Iterator[None]:
    """The in-process collector's log lines (logger ``specwatch.exporter``: failed fetches,
    invariant violations) are off while ``top`` runs: the screen and ``--once`` show the same
    facts, and a line on stderr would repeat them or stay on the terminal after the live view."""
    log = logging.getLogger("specwatch.exporter")
    old = log.disabled
    log.disabled = True
    try:
        yield
    finally:
        log.disabled = old


class TopError(click.ClickException):
    """One-line failure of ``specwatch top`` (``exit_code`` 1, or 2 for usage problems)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class ErrorTracker:
    """Per upstream, the reason of the most recent failed fetch, from the increase of
    ``specwatch_upstream_fetch_errors_total{reason}`` between two reads (exporter mode, where the
    error message itself is not served)."""

    def __init__(self) -> None:
        self._prev: dict[tuple[str, str], float] | None = None
        self.last: dict[str, str] = {}

    def update(self, fetched: Fetched) -> dict[str, str]:
        """Known messages (``fetched.errors``) win; otherwise the reason whose count went up
        since the previous read (nothing is inferred on the first read)."""
        cur = {(s.labels.get("upstream", ""), s.labels.get("reason", "?")): s.value
               for s in fetched.samples if s.name == "specwatch_upstream_fetch_errors_total"}
        if self._prev is not None:
            for (upstream, reason), v in cur.items():
                if v > self._prev.get((upstream, reason), 0.0):
                    self.last[upstream] = f"fetch failed: {reason}"
        self._prev = cur
        return {**self.last, **fetched.errors}


def make_view(fetched: Fetched, window: str, tracker: ErrorTracker) -> TopView:
    """The screen's :class:`TopView` for one read."""
    return build_view(fetched.samples, window, fetched.requests, tracker.update(fetched))


class Poller(threading.Thread):
    """Reads ``source`` now and then every ``interval`` seconds; ``latest`` is (Fetched or None,
    error message or None, wall-clock time), ``changed`` is set after each read."""

    def __init__(self, source, interval: float):
        super().__init__(daemon=True, name="top-poller")
        self.source, self.interval = source, interval
        self.latest: tuple[Fetched | None, str | None, float] | None = None
        self.changed = threading.Event()
        self.stopped = threading.Event()

    def run(self) -> None:
        if self.latest is not None:  # a first read was made before the thread started
            self.stopped.wait(self.interval)
        while not self.stopped.is_set():
            t0 = time.monotonic()
            try:
                self.latest = (self.source.fetch(), None, time.time())
            except SourceError as exc:
                self.latest = (None, str(exc), time.time())
            except Exception as exc:  # keep the screen alive and say what broke
                self.latest = (None, f"{type(exc).__name__}: {exc}", time.time())
            self.changed.set()
            self.stopped.wait(max(0.0, self.interval - (time.monotonic() - t0)))


@contextlib.contextmanager
def cbreak(fd: int) -> Iterator[None]:
    """Terminal ``fd`` in cbreak mode (keys one at a time, no echo); the old mode is restored on
    exit, whatever the exit."""
    # POSIX-only modules: imported where a terminal is put in cbreak mode, so `--once` runs anywhere.
    import termios
    import tty

    old = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)


def read_key(fd: int, timeout: float) -> str | None:
    """One key from ``fd`` within ``timeout`` seconds, or None."""
    r, _, _ = select.select([fd], [], [], timeout)
    if not r:
        return None
    data = os.read(fd, 32)
    return data.decode("utf-8", "replace")[:1] if data else None


def _validate_window(value: str) -> str:
    if value == LIFETIME:
        return value
    try:
        return parse_window(value).label
    except ConfigError as exc:
        raise click.BadParameter(f"{exc} (or lifetime)", param_hint="'--window'") from None


@click.command("top")
@click.option("--exporter", "exporter_url", default=DEFAULT_EXPORTER, show_default=True, envvar="SPECWATCH_EXPORTER",
              help="The specwatch exporter to read (base URL or its /metrics URL).")
@click.option("--upstream", "upstreams", multiple=True,
              help="Read vLLM servers directly instead (no exporter running): URL or NAME=URL, as for "
                   "`specwatch serve --upstream`; the exporter's collector runs in this process with windows "
                   "15s, 30s, 1m and 5m and the serve flags below (no other serve flag). Repeatable. (Not read from "
                   "SPECWATCH_UPSTREAMS: inside the exporter's container `specwatch top` still reads the exporter.)")
@click.option("--window", default=DEFAULT_WINDOW, show_default=True,
              help="Window shown first: 15s, 30s, 1m, 5m, lifetime (any window the exporter serves; 01m reads as 1m). "
                   "A short window follows the load: use one shorter than a benchmark's cells.")
@click.option("--interval", type=FloatRange(0.5, 60), default=2.0, show_default=True,
              help="Seconds between refreshes.")
@click.option("--timeout", type=FloatRange(0.1, 60), default=10.0, show_default=True,
              help="Per-fetch deadline in seconds (the exporter itself waits up to its own --timeout, 5 s, "
                   "per upstream).")
@click.option("--once", is_flag=True,
              help="Print one plain-text snapshot and exit (for scripts; no terminal needed). Exit status 1 "
                   "if the source cannot be read or an upstream is down.")
@serve_options
@click.pass_context
def top(ctx: click.Context, exporter_url: str, upstreams: tuple[str, ...], window: str, interval: float,
        timeout: float, once: bool, **serve_flags: str | None) -> None:
    """Live terminal view of speculative decoding: per upstream and engine the draft acceptance
    rate, mean acceptance length against k+1, per-position and conditional acceptance, effective
    k, requests, step time and speedup with their basis, the recommended k (or why it is
    withheld) and up/errors.

    Keys: 1 / 5 / l show the 1m / 5m / lifetime window, w cycles through the windows served, q quits.

    Exit status: 0 after q (or --once with every upstream up); 1 when the source cannot be read
    or (--once) an upstream is down; 2 for bad flags, or without a terminal and without --once;
    130 after Ctrl-C."""
    window = _validate_window(window)
    ups = [u for spec in upstreams for u in spec.split()]
    exporter_given = ctx.get_parameter_source("exporter_url") not in (
        click.core.ParameterSource.DEFAULT, None)
    if ups and exporter_given:
        raise click.BadParameter("give either --exporter or --upstream, not both", param_hint="'--upstream'")
    given = {k: v for k, v in serve_flags.items() if v is not None}
    if ups:
        try:
            source = UpstreamSource(ups, timeout=timeout, **given)
        except ConfigError as exc:
            msg = str(exc)
            if msg.startswith("--"):  # names its own flag (--cost-profile: …, --baseline-upstream …)
                raise click.UsageError(msg) from None
            raise click.BadParameter(msg, param_hint="'--upstream'") from None
    else:
        if given:
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            raise click.UsageError(f"{flags}: only with --upstream (an exporter applies its own: "
                                   f"specwatch serve {flags.split(', ')[0]} …)")
        try:
            source = ExporterSource(exporter_metrics_url(exporter_url), timeout=timeout)
        except ConfigError as exc:
            raise click.BadParameter(str(exc).replace("upstream", "exporter", 1), param_hint="'--exporter'") from None

    with quiet_exporter_log():
        if once:
            _run_once(source, window)
            return
        if not (sys.stdout.isatty() and sys.stdin.isatty()):
            raise TopError("not a terminal (stdin/stdout is not a TTY): run it in a terminal, or use --once for plain "
                           "output", exit_code=2)
        _run_live(source, window, interval)


def _run_once(source, window: str) -> None:
    try:
        fetched = source.fetch()
    except SourceError as exc:
        raise TopError(str(exc)) from None
    view = make_view(fetched, window, ErrorTracker())
    sys.stdout.write(render_plain(view, source.description))
    sys.stdout.flush()
    if view.any_down:
        sys.exit(1)


#: Failure kinds of a first read that the live view waits out (the exporter may still be starting,
#: e.g. ``specwatch demo`` takes its first half-minute to start it): the screen says so and polls.
WAIT_FOR = ("connect", "timeout")


def _run_live(source, window: str, interval: float) -> None:
    first_error = None
    try:  # fail fast, before taking over the screen, when the address answers with something else
        first = source.fetch()
    except SourceError as exc:
        if getattr(exc, "reason", None) not in WAIT_FOR:
            raise TopError(str(exc)) from None
        first, first_error = None, f"{exc} (waiting for it: q quits)"
    install_stop_signals()  # SIGTERM/SIGHUP act like Ctrl-C: the finally blocks restore the terminal
    console = Console()
    tracker = ErrorTracker()
    poller = Poller(source, interval)
    poller.latest = (first, first_error, time.time())
    fd = sys.stdin.fileno()
    view: TopView | None = None
    try:
        with cbreak(fd), Live(console=console, screen=True, auto_refresh=False, redirect_stdout=False,
                              redirect_stderr=False, vertical_overflow="crop") as live:
            last_size = None
            dirty = True
            poller.changed.set()
            started = False
            while True:
                if poller.changed.is_set():
                    poller.changed.clear()
                    dirty = True
                size = console.size
                if size != last_size:
                    last_size, dirty = size, True
                if dirty:
                    fetched, error, when = poller.latest or (None, None, 0.0)
                    view = make_view(fetched, window, tracker) if fetched is not None else None
                    live.update(render_live(view, source.description, size.width, error=error,
                                            refreshed=time.strftime("%H:%M:%S", time.localtime(when)),
                                            interval=interval, window=window, height=size.height), refresh=True)
                    dirty = False
                if not started:
                    poller.start()  # after the first paint: its first read is the second one
                    started = True
                key = read_key(fd, 0.2)
                if key is None:
                    continue
                if key in ("q", "Q"):
                    break
                if key in KEY_WINDOWS:
                    window, dirty = KEY_WINDOWS[key], True
                elif key in ("w", "\t") and view is not None and view.windows:
                    ws = list(view.windows)
                    window = ws[(ws.index(window) + 1) % len(ws)] if window in ws else ws[0]
                    dirty = True
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        poller.stopped.set()
        source.close()
