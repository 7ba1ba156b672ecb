"""The exporter's configuration: parsed once from the CLI into one frozen, validated object."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from specwatch.common.defaults import EXPORTER_PORT
from specwatch.common.labels import MAX_METHOD_CHARS, BadLabelValue, check_label_value
from specwatch.common.params import parse_duration
from specwatch.specdecode.costprofile import CostProfile, CostProfileError, load_profile

#: Default listen port (one value for the whole project: :data:`specwatch.common.defaults.EXPORTER_PORT`).
DEFAULT_PORT = EXPORTER_PORT
DEFAULT_LISTEN_ADDRESS = f"0.0.0.0:{DEFAULT_PORT}"


class ConfigError(ValueError):
    """A configuration value is invalid; the message says which and why."""


@dataclass(frozen=True)
class Upstream:
    """One vLLM (or llama.cpp, SGLang) server to scrape: ``name`` becomes the ``upstream`` label.

    ``speculative_method``/``drafter``: what this server runs, as the operator stated it (its own
    ``,method=``/``,drafter=`` options, else the exporter-wide ``--speculative-method``/``--drafter``;
    None: not stated). vLLM's /metrics does not publish them (:mod:`specwatch.specdecode.serverinfo`);
    they pick the cost profile's curve and label ``specwatch_speculative_method_info``.
    ``options_source``: ``upstream`` when stated in this upstream's options, ``default`` when taken
    from the exporter-wide flags, None when neither states them. ``read_server_info``
    (``,server_info=on``): also read the upstream's dev-mode ``/server_info`` (:attr:`server_info_url`)."""

    name: str
    metrics_url: str
    speculative_method: str | None = None
    drafter: str | None = None
    options_source: str | None = None
    read_server_info: bool = False

    @property
    def server_info_url(self) -> str:
        """vLLM's dev-mode ``/server_info?config_format=json`` on this upstream's own host and port:
        the configured /metrics URL with ``/metrics`` replaced (read only with ``,server_info=on``)."""
        parts = urlsplit(self.metrics_url)
        base = parts.path[: -len("/metrics")] if parts.path.endswith("/metrics") else parts.path.rstrip("/")
        return urlunsplit((parts.scheme, parts.netloc, base + "/server_info", "config_format=json", ""))

    @property
    def method_source(self) -> str:
        """The ``source`` label of ``specwatch_speculative_method_info``: ``upstream_flag`` (this
        upstream's options) or ``flag`` (the exporter-wide flags)."""
        return "upstream_flag" if self.options_source == "upstream" else "flag"


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
    fetch history kept for the windows; ``cost_profile`` holds the measured step times the
    speedups are computed with (:mod:`specwatch.specdecode.costprofile`; None: basis default),
    ``baseline_upstream`` names an upstream that runs without speculation (its live decode speed
    is the measured speedup's denominator), ``speculative_method``/``drafter`` are the exporter-wide
    defaults of every upstream's method and drafter (each :class:`Upstream` carries the resolved
    pair; they pick the profile's curve, default: its first). ``min_fetch_interval``: scrapes within this many
    seconds after a fetch round share it. Listener limits (:mod:`specwatch.exporter.listener`):
    ``max_requests`` /metrics requests served at once (more get 503), ``max_connections``
    connections still sending their request head (a newcomer beyond evicts the longest-waiting
    one; ``max_requests`` more for connections being answered), ``request_timeout`` seconds to receive a request's
    line and headers, and to send the answer.
    """

    upstreams: tuple[Upstream, ...]
    windows: tuple[Window, ...] = ()
    listen_host: str = "0.0.0.0"
    listen_port: int = DEFAULT_PORT
    timeout_seconds: float = 5.0
    max_body_bytes: int = 16 * 1024 * 1024
    history_samples: int = 2000
    cost_profile: CostProfile | None = None
    baseline_upstream: str | None = None
    speculative_method: str | None = None
    drafter: str | None = None
    min_fetch_interval: float = 1.0
    max_requests: int = 40
    max_connections: int = 200
    request_timeout: float = 10.0


_NAME_RE = re.compile(r"^[A-Za-z0-9_.:\[\]-]{1,100}$")
_PORT_RE = re.compile(r"^[0-9]{1,5}$")


#: Per-upstream options after the URL (``NAME=URL,method=M,drafter=D``).
UPSTREAM_OPTIONS = ("method", "drafter", "server_info")
_OPTION_VALUE_RE = re.compile(r"^[^\s,=]{1,300}$")


def parse_upstream(spec: str) -> Upstream:
    """Parse ``NAME=URL`` or ``URL``, optionally followed by ``,method=M`` and ``,drafter=D`` (this
    upstream's speculative method and drafter, overriding ``--speculative-method``/``--drafter``)
    and ``,server_info=on`` (also read its dev-mode ``/server_info``); a base URL gets ``/metrics``
    appended.

    The default name is the URL's ``host:port`` (``[::1]:8000`` for an IPv6 address). Raises
    :class:`ConfigError` for a URL that is not http(s) with a host, a port that is not 1-65535 in
    ASCII digits, a name with characters other than letters, digits and ``_.:-`` (and ``[]``), an
    unknown or repeated option, or an empty option value (a URL holding a comma reads as options).
    """
    head, *opts = spec.split(",")
    options: dict[str, str] = {}
    for opt in opts:
        key, sep, value = opt.strip().partition("=")
        if not sep or key not in UPSTREAM_OPTIONS:
            raise ConfigError(f"upstream {spec!r}: unknown option {opt.strip()!r} (after the URL: "
                              f"{', '.join(o + '=VALUE' for o in UPSTREAM_OPTIONS)}, comma-separated)")
        if key in options:
            raise ConfigError(f"upstream {spec!r}: option {key} given twice")
        if not _OPTION_VALUE_RE.match(value):
            raise ConfigError(f"upstream {spec!r}: option {key}: expected a non-empty value without spaces, commas or '='")
        if key in ("method", "drafter"):
            try:
                check_label_value(value, what=f"upstream {spec!r}: option {key}", max_len=MAX_METHOD_CHARS)
            except BadLabelValue as exc:
                raise ConfigError(str(exc)) from None
        if key == "server_info" and value not in ("on", "off"):
            raise ConfigError(f"upstream {spec!r}: option server_info: expected on or off, got {value!r}")
        options[key] = value
    up = _parse_upstream_url(spec, head)
    read = options.pop("server_info", "off") == "on"
    if not options:
        return Upstream(up.name, up.metrics_url, read_server_info=read)
    return Upstream(up.name, up.metrics_url, options.get("method"), options.get("drafter"), "upstream", read)


def _parse_upstream_url(spec: str, head: str) -> Upstream:
    name, sep, url = head.partition("=")
    if not sep or "://" in name:
        name, url = "", head
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"upstream {spec!r}: expected http(s)://HOST[:PORT][/metrics], optionally NAME=URL")
    try:
        parts.port  # noqa: B018  the access validates the port
    except ValueError as exc:
        raise ConfigError(f"upstream {spec!r}: {exc}") from None
    hostport = parts.netloc.rsplit("@", 1)[-1]
    tail = hostport.rpartition("]")[2] if hostport.startswith("[") else hostport
    port_text = tail.rpartition(":")[2] if ":" in tail else ""
    if port_text and (not _PORT_RE.match(port_text) or not 0 < int(port_text) < 65536):
        raise ConfigError(f"upstream {spec!r}: port must be 1-65535 in ASCII digits")
    path = parts.path.rstrip("/")
    if not path.endswith("/metrics"):
        path = path + "/metrics"
    metrics_url = urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))
    name = name.strip() or parts.netloc.rsplit("@", 1)[-1]
    if not _NAME_RE.match(name):
        raise ConfigError(f"upstream name {name!r}: use 1-100 letters, digits or _.:-")
    return Upstream(name=name, metrics_url=metrics_url)


_SPACED_NAME_RE = re.compile(r"^\s*([^\s=,:/]+(?:\s+[^\s=,:/]+)+)\s*=")


def split_upstreams(values: list[str] | tuple[str, ...]) -> list[str]:
    """The ``--upstream`` values, each split on whitespace (one value may list several upstreams,
    as ``SPECWATCH_UPSTREAMS`` does). Raises :class:`ConfigError` naming the whole name when a
    value reads as ``NAME=URL`` with spaces in NAME (``'my spec=http://…'``), instead of an error
    about its first word."""
    out: list[str] = []
    for value in values:
        m = _SPACED_NAME_RE.match(value)
        if m is not None:
            raise ConfigError(f"upstream name {m.group(1)!r}: use 1-100 letters, digits or _.:- (no spaces)")
        out.extend(value.split())
    return out


#: The windows ``specwatch serve`` serves by default (besides ``lifetime``): short ones that follow
#: the load (a benchmark cell of 15-60 s) beside the minutes Prometheus rules read.
DEFAULT_WINDOWS: tuple[str, ...] = ("15s", "30s", "1m", "5m")

_ASCII_DURATION_RE = re.compile(r"^[0-9a-z]+$")


def window_label(seconds: float) -> str:
    """The one label of a window of ``seconds``: Prometheus' own spelling of the duration
    (``15s``, ``1m``, ``1m30s``, ``1h``, ``1d``, ``5s500ms``), so ``01m``, ``60s`` and ``1m`` are one
    window labelled ``1m``."""
    ms = round(seconds * 1000)
    out = []
    for unit, size in (("y", 365 * 86400000), ("w", 7 * 86400000), ("d", 86400000), ("h", 3600000), ("m", 60000),
                       ("s", 1000), ("ms", 1)):
        n, ms = divmod(ms, size)
        if n:
            out.append(f"{n}{unit}")
    return "".join(out) or "0s"


def parse_window(spec: str) -> Window:
    """Parse a window, a Prometheus duration such as ``30s``, ``1m``, ``5m``, ``1h`` or ``1h30m``
    (5 s … 24 h) in ASCII digits; the label served is its normalised spelling
    (:func:`window_label`: ``01m`` and ``60s`` are served as ``1m``), so no spelling makes a new
    label that no rule matches.

    Raises :class:`ConfigError` otherwise (``'١m'``: digits other than ASCII); ``lifetime`` is
    reserved (always served).
    """
    text = spec.strip()
    if not _ASCII_DURATION_RE.match(text):
        raise ConfigError(f"window {spec!r}: expected a duration like 15s, 30s, 1m, 5m or 1h (ASCII digits and units)")
    try:
        seconds = parse_duration(text)
    except ValueError:
        raise ConfigError(f"window {spec!r}: expected a duration like 15s, 30s, 1m, 5m or 1h") from None
    if not 5 <= seconds <= 86400:
        raise ConfigError(f"window {spec!r}: must be between 5s and 24h")
    return Window(label=window_label(seconds), seconds=float(seconds))


#: The range in which a cost profile's numbers can give a finite speedup with a finite interval
#: (ratios: relative cost c and prefill ratio; a step in seconds): outside it the speedups under-
#: or overflow (a cost_ratio of 1e300 gives a lower end of 0.0), so the profile is refused at start.
PROFILE_RATIO_RANGE = (1e-3, 1e3)
PROFILE_STEP_SECONDS_RANGE = (1e-9, 1e4)
PROFILE_TOKENS_RANGE = (0.0, 1e9)


def check_profile_estimates(profile: CostProfile) -> None:
    """Raise :class:`ConfigError` naming the file and the field when a number of ``profile`` lies
    outside what can give a finite estimate (:data:`PROFILE_RATIO_RANGE`,
    :data:`PROFILE_STEP_SECONDS_RANGE`; running requests, context and drafted tokens within
    :data:`PROFILE_TOKENS_RANGE`)."""
    def check(where: str, name: str, v: float | None, rng: tuple[float, float]) -> None:
        if v is None:
            return
        lo, hi = rng
        if not (isinstance(v, (int, float)) and math.isfinite(v) and lo <= v <= hi):
            raise ConfigError(f"--cost-profile: {profile.source}: {where}.{name}: {v!r} cannot give a finite speedup "
                              f"(expected {lo:g} to {hi:g})")

    def point(where: str, pt) -> None:
        check(where, "step_seconds", pt.step_seconds, PROFILE_STEP_SECONDS_RANGE)
        check(where, "cost_ratio", pt.cost_ratio, PROFILE_RATIO_RANGE)
        check(where, "prefill_ratio", pt.prefill_ratio, PROFILE_RATIO_RANGE)
        for name in ("running_requests", "context_tokens", "drafted_tokens_per_step"):
            check(where, name, getattr(pt, name, None), PROFILE_TOKENS_RANGE)

    for i, pt in enumerate(profile.plain):
        point(f"plain[{i}]", pt)
    for j, c in enumerate(profile.speculative):
        for i, pt in enumerate(c.points):
            point(f"speculative[{j}].points[{i}]", pt)


def parse_listen_address(spec: str) -> tuple[str, int]:
    """Parse ``HOST:PORT`` (``[::1]:PORT`` or ``[::]:PORT`` for IPv6, ``:PORT`` for all IPv4
    interfaces); the port in ASCII digits 1-65535. Raises :class:`ConfigError`."""
    host, sep, port = spec.strip().rpartition(":")
    if not sep or not _PORT_RE.match(port) or not 0 < int(port) < 65536:
        raise ConfigError(f"listen address {spec!r}: expected HOST:PORT with a port 1-65535")
    if host.startswith("[") != host.endswith("]") or (":" in host and not host.startswith("[")):
        raise ConfigError(f"listen address {spec!r}: write an IPv6 address in brackets, e.g. [::1]:{port}")
    host = host[1:-1] if host.startswith("[") else host
    return host or "0.0.0.0", int(port)


def _with_defaults(up: Upstream, method: str | None, drafter: str | None) -> Upstream:
    """``up`` with the exporter-wide method/drafter where its own options state neither."""
    if up.options_source == "upstream" or (method is None and drafter is None):
        return up
    return Upstream(up.name, up.metrics_url, method, drafter, "default", up.read_server_info)


def _check_method_flags(speculative_method: str | None, drafter: str | None) -> None:
    """Config step: ``--speculative-method`` and ``--drafter``, when given, are non-empty label values."""
    for flag, value in (("--speculative-method", speculative_method), ("--drafter", drafter)):
        if value is not None and not value.strip():  # as ,method= with nothing after it
            raise ConfigError(f"{flag}: expected a non-empty value")
        if value is not None:
            try:
                check_label_value(value, what=flag, max_len=MAX_METHOD_CHARS)
            except BadLabelValue as exc:
                raise ConfigError(str(exc)) from None


def _upstreams(upstreams: list[str] | tuple[str, ...], speculative_method: str | None,
               drafter: str | None) -> tuple[Upstream, ...]:
    """Config step: the parsed upstreams with the exporter-wide method/drafter, their names unique."""
    ups = tuple(_with_defaults(parse_upstream(u), speculative_method, drafter) for u in upstreams)
    names = [u.name for u in ups]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(f"duplicate upstream names: {', '.join(sorted(dup))} (use NAME=URL)")
    return ups


def _windows(windows: list[str] | tuple[str, ...]) -> tuple[Window, ...]:
    """Config step: the parsed ``--window`` values, no length given twice."""
    wins = tuple(parse_window(w) for w in windows)
    if len({w.seconds for w in wins}) != len(wins):
        raise ConfigError("duplicate --window values (" + ", ".join(sorted({w.label for w in wins
                                                                             if [x.seconds for x in wins].count(w.seconds) > 1}))
                          + " given twice, maybe spelled differently)")
    return wins


def _cost_profile(path: str, ups: tuple[Upstream, ...], speculative_method: str | None) -> CostProfile:
    """Config step: load the cost profile and check it has a curve for every method the upstreams name."""
    try:
        profile = load_profile(path)
    except CostProfileError as exc:
        raise ConfigError(f"--cost-profile: {exc}") from None
    check_profile_estimates(profile)
    for u in ups:
        m = u.speculative_method if u.options_source == "upstream" else speculative_method
        if m is not None and all(pm != m for pm, _ in profile.methods()):
            flag = f"--upstream {u.name} method" if u.options_source == "upstream" else "--speculative-method"
            raise ConfigError(f"{flag} {m!r}: {profile.source} has no curve for it "
                              f"(it has {', '.join(pm for pm, _ in profile.methods()) or 'none'})")
    return profile


def _check_limits(timeout_seconds: float, min_fetch_interval: float, max_requests: int, max_connections: int,
                  request_timeout: float) -> None:
    """Config step: the fetch timeout, the fetch interval and the listener's request limits are in range."""
    if not math.isfinite(timeout_seconds):
        raise ConfigError("timeout must be a finite number of seconds")
    if not (math.isfinite(min_fetch_interval) and 0 <= min_fetch_interval <= 60):
        raise ConfigError("min fetch interval must be between 0 and 60 seconds")
    if not 1 <= max_requests <= 10000:
        raise ConfigError("max requests must be between 1 and 10000")
    if not max_requests <= max_connections <= 10000:
        raise ConfigError("max connections must be between max requests and 10000")
    if not (math.isfinite(request_timeout) and 0.5 <= request_timeout <= 300):
        raise ConfigError("request timeout must be between 0.5 and 300 seconds")


def build_config(
    upstreams: list[str] | tuple[str, ...],
    windows: list[str] | tuple[str, ...] = (),
    listen_address: str = DEFAULT_LISTEN_ADDRESS,
    timeout_seconds: float = 5.0,
    max_body_bytes: int = 16 * 1024 * 1024,
    cost_profile: str | None = None,
    baseline_upstream: str | None = None,
    speculative_method: str | None = None,
    drafter: str | None = None,
    min_fetch_interval: float = 1.0,
    max_requests: int = 40,
    max_connections: int = 200,
    request_timeout: float = 10.0,
) -> ExporterConfig:
    """Validate raw CLI values into an :class:`ExporterConfig`; raises :class:`ConfigError`."""
    if not upstreams:
        raise ConfigError("at least one --upstream is required")
    _check_method_flags(speculative_method, drafter)
    ups = _upstreams(upstreams, speculative_method, drafter)
    wins = _windows(windows)
    if not 0.1 <= timeout_seconds <= 60:
        raise ConfigError("timeout must be between 0.1 and 60 seconds")
    if max_body_bytes < 1024:
        raise ConfigError("max body bytes must be at least 1024")
    profile = None if cost_profile is None else _cost_profile(cost_profile, ups, speculative_method)
    names = [u.name for u in ups]
    if baseline_upstream is not None and baseline_upstream not in names:
        raise ConfigError(f"--baseline-upstream {baseline_upstream!r} is not one of the upstreams ({', '.join(names)})")
    _check_limits(timeout_seconds, min_fetch_interval, max_requests, max_connections, request_timeout)
    host, port = parse_listen_address(listen_address)
    return ExporterConfig(
        upstreams=ups,
        windows=tuple(sorted(wins, key=lambda w: w.seconds)),
        listen_host=host,
        listen_port=port,
        timeout_seconds=timeout_seconds,
        max_body_bytes=max_body_bytes,
        cost_profile=profile,
        baseline_upstream=baseline_upstream,
        speculative_method=speculative_method,
        drafter=drafter,
        min_fetch_interval=min_fetch_interval,
        max_requests=max_requests,
        max_connections=max_connections,
        request_timeout=request_timeout,
    )
