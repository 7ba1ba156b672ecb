"""The exporter's configuration: parsed once from the CLI into one frozen, validated object."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

#: Default listen port. Prometheus' default-port allocation list has no free port left in the
#: exporter range 9100–9999, so specwatch uses one outside it that no well-known exporter claims.
DEFAULT_PORT = 19337
DEFAULT_LISTEN_ADDRESS = f"0.0.0.0:{DEFAULT_PORT}"


class ConfigError(ValueError):
    """A configuration value is invalid; the message says which and why."""


@dataclass(frozen=True)
class Upstream:
    """One vLLM (or llama.cpp) server to scrape: ``name`` becomes the ``upstream`` label."""

    name: str
    metrics_url: str


@dataclass(frozen=True)
class Window:
    """A sliding window over the exporter's own fetch history; ``label`` is its ``window`` label."""

    label: str
    seconds: float


@dataclass(frozen=True)
class ExporterConfig:
    """Validated exporter configuration (built by :func:`build_config`).

    ``timeout_seconds`` bounds each upstream fetch (below Prometheus' default 10 s scrape
    timeout); ``max_body_bytes`` caps a /metrics body; ``history_samples`` bounds the per-upstream
    fetch history kept for the windows; ``cost_*`` parametrise the verify-step cost model of the
    live advice (see :mod:`specwatch.specdecode.cost`).
    """

    upstreams: tuple[Upstream, ...]
    windows: tuple[Window, ...] = ()
    listen_host: str = "0.0.0.0"
    listen_port: int = DEFAULT_PORT
    timeout_seconds: float = 5.0
    max_body_bytes: int = 16 * 1024 * 1024
    history_samples: int = 2000
    cost_per_draft_token: float = 0.05
    cost_per_draft_token_per_running_request: float = 0.02


_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
_DURATION_RE = re.compile(r"^(\d+)(s|m|h)$")


def parse_upstream(spec: str) -> Upstream:
    """Parse ``NAME=URL`` or ``URL``; a base URL gets ``/metrics`` appended.

    The default name is the URL's ``host:port``. Raises :class:`ConfigError` for a URL that is not
    http(s) with a host, or a name with characters other than letters, digits and ``_.:-``.
    """
    name, sep, url = spec.partition("=")
    if not sep or "://" in name:
        name, url = "", spec
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"upstream {spec!r}: expected http(s)://HOST[:PORT][/metrics], optionally NAME=URL")
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError as exc:
        raise ConfigError(f"upstream {spec!r}: {exc}") from None
    path = parts.path.rstrip("/")
    if not path.endswith("/metrics"):
        path = path + "/metrics"
    metrics_url = urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))
    name = name.strip() or parts.netloc.rsplit("@", 1)[-1]
    if not _NAME_RE.match(name):
        raise ConfigError(f"upstream name {name!r}: use 1-100 letters, digits or _.:-")
    return Upstream(name=name, metrics_url=metrics_url)


def parse_window(spec: str) -> Window:
    """Parse a window such as ``30s``, ``1m``, ``5m``, ``1h`` (5 s … 24 h).

    Raises :class:`ConfigError` otherwise; ``lifetime`` is reserved (always served).
    """
    m = _DURATION_RE.match(spec.strip())
    if not m:
        raise ConfigError(f"window {spec!r}: expected a duration like 30s, 1m, 5m or 1h")
    seconds = int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]
    if not 5 <= seconds <= 86400:
        raise ConfigError(f"window {spec!r}: must be between 5s and 24h")
    return Window(label=spec.strip(), seconds=float(seconds))


def parse_listen_address(spec: str) -> tuple[str, int]:
    """Parse ``HOST:PORT`` (``[::1]:PORT`` for IPv6, ``:PORT`` for all interfaces)."""
    host, sep, port = spec.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"listen address {spec!r}: expected HOST:PORT with a port 1-65535")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def build_config(
    upstreams: list[str] | tuple[str, ...],
    windows: list[str] | tuple[str, ...] = (),
    listen_address: str = DEFAULT_LISTEN_ADDRESS,
    timeout_seconds: float = 5.0,
    max_body_bytes: int = 16 * 1024 * 1024,
    cost_per_draft_token: float = 0.05,
    cost_per_draft_token_per_running_request: float = 0.02,
) -> ExporterConfig:
    """Validate raw CLI values into an :class:`ExporterConfig`; raises :class:`ConfigError`."""
    if not upstreams:
        raise ConfigError("at least one --upstream is required")
    ups = tuple(parse_upstream(u) for u in upstreams)
    names = [u.name for u in ups]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(f"duplicate upstream names: {', '.join(sorted(dup))} (use NAME=URL)")
    wins = tuple(parse_window(w) for w in windows)
    if len({w.seconds for w in wins}) != len(wins):
        raise ConfigError("duplicate --window values")
    if not 0.1 <= timeout_seconds <= 60:
        raise ConfigError("timeout must be between 0.1 and 60 seconds")
    if max_body_bytes < 1024:
        raise ConfigError("max body bytes must be at least 1024")
    for name, v in (("cost per draft token", cost_per_draft_token),
                    ("cost per draft token per running request", cost_per_draft_token_per_running_request)):
        if not math.isfinite(v) or v < 0:
            raise ConfigError(f"{name} must be a finite number >= 0, got {v!r}")
    if not math.isfinite(timeout_seconds):
        raise ConfigError("timeout must be a finite number of seconds")
    host, port = parse_listen_address(listen_address)
    return ExporterConfig(
        upstreams=ups,
        windows=tuple(sorted(wins, key=lambda w: w.seconds)),
        listen_host=host,
        listen_port=port,
        timeout_seconds=timeout_seconds,
        max_body_bytes=max_body_bytes,
        cost_per_draft_token=cost_per_draft_token,
        cost_per_draft_token_per_running_request=cost_per_draft_token_per_running_request,
    )
