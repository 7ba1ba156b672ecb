"""What ``specwatch top`` shows, read from the exporter's exposition (pure code, no I/O).

The text is parsed with :func:`prometheus_client.parser.text_string_to_metric_families`; nothing
is derived here. Each value is one series the exporter serves (named in the field docs below), so
``top`` shows what Prometheus would scrape and the exporter stays the one owner of every number.

Labels other than the ones that address a series (``upstream``, ``model_name``, ``engine``,
``window``, ``position``, ``k``) are kept with the value and shown beside it: a ``basis`` label
(e.g. ``specwatch_speedup{basis="measured"}``, ``specwatch_position_acceptance_rate{basis=
"lower_bound"}``) is displayed whatever its values are, and its absence is not an error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from specwatch.common.params import parse_duration

#: Labels that address a series; any other label is shown beside the value.
ADDRESS_LABELS = frozenset({"upstream", "model_name", "engine", "window", "position", "k"})
LIFETIME = "lifetime"
#: Speedup series, newest name first: ``specwatch_speedup{k,window,basis}`` and the older
#: ``specwatch_estimated_speedup{k,window}`` of specwatch before the cost profile (a coefficient guess).
SPEEDUP_NAMES = ("specwatch_speedup", "specwatch_estimated_speedup")
#: The interval of ``specwatch_speedup`` (same labels: upstream, model_name, engine, k, window, basis).
SPEEDUP_LOWER_NAME = "specwatch_speedup_lower"
SPEEDUP_UPPER_NAME = "specwatch_speedup_upper"
#: Drift: how far the cost profile's step times are off this machine's (a ratio, 1 = fits;
#: labels upstream, model_name, engine, window, basis).
DRIFT_NAME = "specwatch_cost_profile_error_ratio"
#: Outside this range of the drift ratio top says the profile does not fit (intervals widened).
DRIFT_FITS = (0.8, 1.25)
#: 1 with ``verdict`` pays | loses | cannot_tell (and ``basis``) for the server's current k.
VERDICT_NAME = "specwatch_speculation_verdict"
STEP_TIME_NAME = "specwatch_step_duration_seconds"
#: Request gauges, if an exporter serves them (from vLLM's vllm:num_requests_running / _waiting;
#: ``specwatch_running_requests{window}`` is the mean over the window's fetches).
RUNNING_NAMES = ("specwatch_running_requests", "specwatch_num_requests_running", "specwatch_requests_running")
WAITING_NAMES = ("specwatch_waiting_requests", "specwatch_num_requests_waiting", "specwatch_requests_waiting")
#: The exporter's verdict on the window's drafts (specdecode.ragged): 1 when drafts carried fewer
#: than k tokens beyond rounding, and the share of the k x drafts positions never drafted.
RAGGED_NAME = "specwatch_ragged_drafts"
MISSING_RATIO_NAME = "specwatch_missing_draft_tokens_ratio"
#: 1 with a ``reason`` label when the exporter derives no recommended k for the window.
WITHHELD_NAME = "specwatch_recommendation_withheld"
#: The confidence of the recommended k (issue #36): 1 when it is told apart from its runner-up, and
#: pick / runner-up (label ``runner_up_k``, 0 = off) with its interval.
CERTAIN_NAME = "specwatch_recommendation_certain"
OVER_RUNNER_UP_NAME = "specwatch_recommendation_over_runner_up"
#: ``basis`` value of the per-position series when the curve is only a lower bound (ragged drafts).
LOWER_BOUND = "lower_bound"


class ExpositionError(ValueError):
    """The text is not a usable specwatch exposition; the message is one line for the user."""


@dataclass(frozen=True)
class Sample:
    """One parsed sample: metric ``name`` (counters with their ``_total``), ``labels``, ``value``."""

    name: str
    labels: Mapping[str, str]
    value: float


def parse_exposition(text: str) -> list[Sample]:
    """All samples of a Prometheus text exposition. Raises :class:`ExpositionError` when the text
    does not parse (an HTML page, a truncated body)."""
    try:
        return [Sample(s.name, dict(s.labels), float(s.value))
                for fam in text_string_to_metric_families(text) for s in fam.samples]
    except Exception as exc:  # the parser raises ValueError, IndexError, TypeError… on garbage
        raise ExpositionError(f"not Prometheus exposition text ({type(exc).__name__})") from None


def check_specwatch(samples: list[Sample]) -> None:
    """Raise :class:`ExpositionError` unless ``samples`` come from a specwatch exporter (it always
    serves ``specwatch_build_info``); a vLLM /metrics page gets a hint to use ``--upstream``."""
    if any(s.name == "specwatch_build_info" for s in samples):
        return
    if any(s.name.startswith(("vllm:", "llamacpp:")) for s in samples):
        raise ExpositionError("this is a vLLM /metrics page, not the specwatch exporter: use --upstream URL")
    raise ExpositionError("no specwatch_build_info series: not a specwatch exporter")


@dataclass(frozen=True)
class Value:
    """A served value with its non-address labels (``extra``, e.g. ``(("basis", "measured"),)``)."""

    value: float
    extra: tuple[tuple[str, str], ...] = ()

    @property
    def label_text(self) -> str:
        """``basis=measured`` style text of the extra labels ("" when there are none)."""
        return " ".join(f"{k}={v}" for k, v in self.extra)


@dataclass(frozen=True)
class PositionRow:
    """Position i (0-based) of the draft: ``rate`` from specwatch_position_acceptance_rate
    (P(positions 0..i all accepted), 0-1) and ``conditional`` from
    specwatch_position_conditional_acceptance_rate (r_i / r_(i-1), 0-1)."""

    position: int
    rate: Value | None
    conditional: Value | None


@dataclass(frozen=True)
class Speedup:
    """Speedup vs no speculation at ``k``: ``metric`` is the series it came from (see
    :data:`SPEEDUP_NAMES`); ``value`` carries its basis label when the exporter serves one."""

    k: int
    metric: str
    value: Value
    #: specwatch_speedup_lower / _upper with the same labels (None: not served).
    lower: float | None = None
    upper: float | None = None

    @property
    def interval_text(self) -> str:
        """``[2.05-2.60]`` when both bounds are served, else ""."""
        if self.lower is None or self.upper is None:
            return ""
        return f"[{self.lower:.2f}-{self.upper:.2f}]"

    @property
    def basis_text(self) -> str:
        """The basis label, or for the cost-model series without one, ``modelled``."""
        if self.value.extra:
            return self.value.label_text
        return "modelled (cost model)" if self.metric == "specwatch_estimated_speedup" else ""


@dataclass(frozen=True)
class RunnerUp:
    """The recommended k against its runner-up (the next best candidate, ``k`` 0 = off): ``ratio``
    = pick / runner-up from specwatch_recommendation_over_runner_up, with its interval (None: not
    served)."""

    k: int
    ratio: float
    lower: float | None = None
    upper: float | None = None


@dataclass(frozen=True)
class EngineView:
    """One (model_name, engine) of one upstream, for one window.

    ``window`` is the window the values are for: the requested one, or ``lifetime`` when the
    exporter serves nothing for the requested window yet (``fell_back``). Sources:
    ``num_speculative_tokens`` specwatch_num_speculative_tokens (k); ``draft_acceptance_rate``
    specwatch_draft_acceptance_rate (0-1); ``mean_acceptance_length``
    specwatch_mean_acceptance_length (tokens per verify step, ceiling k + 1); ``effective_k``
    specwatch_draft_tokens_per_draft; ``output_from_drafts`` specwatch_output_from_drafts_ratio;
    ``positions`` the per-position series; ``recommended_k``
    specwatch_recommended_num_speculative_tokens; ``withheld`` the ``reason`` labels of
    specwatch_recommendation_withheld == 1 (no recommended k for the window, e.g. ``ragged_drafts``);
    ``ragged_drafts`` specwatch_ragged_drafts (1 or 0) and ``missing_ratio``
    specwatch_missing_draft_tokens_ratio (0-1); ``speedups`` :data:`SPEEDUP_NAMES`;
    ``step_time`` specwatch_step_duration_seconds (seconds); ``running``/``waiting`` request
    counts (vLLM's gauges, from the exporter if it serves them or from the upstream itself),
    ``requests_source`` where they came from (``exporter``: specwatch_running_requests, the mean
    over the window; ``upstream``: vLLM's gauges read by ``top --upstream``; None: not served);
    ``drift`` specwatch_cost_profile_error_ratio (its ``basis`` in ``extra``); ``verdicts``
    (verdict, basis) of specwatch_speculation_verdict == 1 for the current k; ``certain``
    specwatch_recommendation_certain (1: the recommended k is told apart from its runner-up; 0:
    only the better estimate; None: not served) and ``runner_up`` (:class:`RunnerUp`).
    """

    model_name: str
    engine: str
    window: str
    fell_back: bool = False
    num_speculative_tokens: int | None = None
    draft_acceptance_rate: Value | None = None
    mean_acceptance_length: Value | None = None
    effective_k: Value | None = None
    output_from_drafts: Value | None = None
    positions: tuple[PositionRow, ...] = ()
    recommended_k: Value | None = None
    withheld: tuple[str, ...] = ()
    ragged_drafts: Value | None = None
    missing_ratio: Value | None = None
    speedups: tuple[Speedup, ...] = ()
    step_time: tuple[Value, ...] = ()
    running: float | None = None
    waiting: float | None = None
    v0_draft_acceptance_rate: Value | None = None
    requests_source: str | None = None
    drift: Value | None = None
    verdicts: tuple[tuple[str, str], ...] = ()
    certain: bool | None = None
    runner_up: RunnerUp | None = None

    @property
    def ceiling(self) -> int | None:
        """k + 1: the mean acceptance length when every draft token is accepted."""
        return None if self.num_speculative_tokens is None else self.num_speculative_tokens + 1

    @property
    def ragged(self) -> bool:
        """True when the exporter says the window's drafts were ragged (fewer than k tokens beyond
        its rounding tolerance, :mod:`specwatch.specdecode.ragged`): then r_i = accepted_per_pos[i]
        / drafts counts drafts that never proposed position i as rejections, a lower bound of
        acceptance given the position was drafted.

        Read, not derived: ``specwatch_ragged_drafts{window}`` when served, else (an exporter without
        that series) a ``basis="lower_bound"`` label on a per-position series. False when neither
        is served (no drafts in the window: no curve to label)."""
        if self.ragged_drafts is not None:
            return self.ragged_drafts.value == 1.0
        return any(("basis", LOWER_BOUND) in v.extra for p in self.positions
                   for v in (p.rate, p.conditional) if v is not None)

    @property
    def has_data(self) -> bool:
        """True when any acceptance value is served for this window."""
        return bool(self.draft_acceptance_rate or self.mean_acceptance_length or self.positions
                    or self.v0_draft_acceptance_rate)

    def speedup_at(self, k: int | None) -> list[Speedup]:
        """The speedups served for ``k`` (one per metric/basis), [] if none."""
        return [s for s in self.speedups if k is not None and s.k == k]


@dataclass(frozen=True)
class UpstreamView:
    """One upstream: ``up`` (specwatch_up), ``spec_decode_enabled``, ``schema``
    (specwatch_upstream_info), ``scrape_seconds`` (specwatch_scrape_duration_seconds),
    ``fetch_errors`` (specwatch_upstream_fetch_errors_total by reason, since the exporter
    started), ``violations`` (non-zero specwatch_invariant_violations_total), ``last_error``
    (what the last failed fetch said, when known) and its engines."""

    name: str
    up: bool | None
    spec_decode_enabled: bool | None = None
    schema: str | None = None
    scrape_seconds: float | None = None
    fetch_errors: Mapping[str, float] = field(default_factory=dict)
    violations: Mapping[str, float] = field(default_factory=dict)
    last_error: str | None = None
    engines: tuple[EngineView, ...] = ()


@dataclass(frozen=True)
class TopView:
    """Everything one screen shows: ``windows`` served (lifetime last), the ``window`` asked for,
    the exporter ``version`` (specwatch_build_info) and the upstreams in the exporter's order."""

    upstreams: tuple[UpstreamView, ...]
    windows: tuple[str, ...]
    window: str
    version: str | None = None

    @property
    def any_down(self) -> bool:
        """True when an upstream's last fetch failed."""
        return any(u.up is False for u in self.upstreams)


def _extra(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in ADDRESS_LABELS))


def _matches(labels: Mapping[str, str], want: Mapping[str, str]) -> bool:
    """True when every address label present in ``labels`` equals ``want``'s (a label the series
    does not carry matches anything: a per-exporter step time applies to every engine)."""
    return all(labels[k] == v for k, v in want.items() if k in labels)


def _window_key(w: str) -> tuple[int, float, str]:
    if w == LIFETIME:
        return (1, 0.0, w)
    try:
        return (0, float(parse_duration(w)), w)
    except ValueError:
        return (0, math.inf, w)


def build_view(samples: list[Sample], window: str,
               requests: Mapping[tuple[str, str, str], tuple[float | None, float | None]] | None = None,
               errors: Mapping[str, str] | None = None) -> TopView:
    """Arrange ``samples`` (of one exporter scrape) into a :class:`TopView` for ``window``.

    Args:
        samples: from :func:`parse_exposition`.
        window: ``1m``, ``5m``, ``lifetime``… An engine with nothing served for it shows lifetime.
        requests: (upstream, model_name, engine) -> (running, waiting) read from the upstreams
            themselves (``--upstream`` mode); series the exporter serves take precedence.
        errors: upstream -> the last fetch error's message, when the caller knows it.
    """
    by_name: dict[str, list[Sample]] = {}
    for s in samples:
        by_name.setdefault(s.name, []).append(s)

    def get(name: str) -> list[Sample]:
        return by_name.get(name, [])

    upstream_names: list[str] = []
    for s in get("specwatch_up"):
        if s.labels.get("upstream") not in upstream_names:
            upstream_names.append(s.labels.get("upstream", ""))
    windows = sorted({s.labels["window"] for s in samples if s.name.startswith("specwatch_") and "window" in s.labels}
                     | {LIFETIME}, key=_window_key)
    version = next((s.labels.get("version") for s in get("specwatch_build_info")), None)

    def one(name: str, want: Mapping[str, str]) -> Value | None:
        for s in get(name):
            if _matches(s.labels, want) and math.isfinite(s.value):
                return Value(s.value, _extra(s.labels))
        return None

    ups = []
    for up_name in upstream_names:
        u = {"upstream": up_name}
        up = one("specwatch_up", u)
        enabled = one("specwatch_spec_decode_enabled", u)
        schema = next((s.labels.get("schema") for s in get("specwatch_upstream_info")
                       if s.labels.get("upstream") == up_name), None)
        dur = one("specwatch_scrape_duration_seconds", u)
        fetch_errors = {s.labels.get("reason", "?"): s.value for s in get("specwatch_upstream_fetch_errors_total")
                        if s.labels.get("upstream") == up_name and s.value > 0}
        violations = {s.labels.get("invariant", "?"): s.value for s in get("specwatch_invariant_violations_total")
                      if s.labels.get("upstream") == up_name and s.value > 0}
        keys: list[tuple[str, str]] = []
        for s in samples:
            if (s.labels.get("upstream") == up_name and "model_name" in s.labels
                    and s.name.startswith("specwatch_")):
                key = (s.labels["model_name"], s.labels.get("engine", ""))
                if key not in keys:
                    keys.append(key)
        engines = tuple(_engine_view(get, one, up_name, model, engine, window, windows, requests or {})
                        for model, engine in sorted(keys))
        ups.append(UpstreamView(
            name=up_name, up=None if up is None else up.value == 1.0,
            spec_decode_enabled=None if enabled is None else enabled.value == 1.0, schema=schema,
            scrape_seconds=None if dur is None else dur.value, fetch_errors=fetch_errors, violations=violations,
            last_error=(errors or {}).get(up_name) if up is not None and up.value != 1.0 else None,
            engines=engines))
    return TopView(upstreams=tuple(ups), windows=tuple(windows), window=window, version=version)


def _engine_view(get, one, up_name: str, model: str, engine: str, window: str, windows: list[str],
                 requests: Mapping[tuple[str, str, str], tuple[float | None, float | None]]) -> EngineView:
    base = {"upstream": up_name, "model_name": model, "engine": engine}

    def served(w: str) -> bool:
        return any(_matches(s.labels, base) and s.labels.get("window") == w
                   for name in ("specwatch_draft_acceptance_rate", "specwatch_mean_acceptance_length",
                                "specwatch_position_acceptance_rate")
                   for s in get(name))

    use = window
    if not served(window) and window != LIFETIME:
        use = LIFETIME
    w = {**base, "window": use}

    def strict(name: str, want: Mapping[str, str]) -> list[Sample]:
        # window-addressed series must carry the window label (a lifetime value is not a 1m value)
        return [s for s in get(name) if _matches(s.labels, want) and s.labels.get("window", use) == use
                and math.isfinite(s.value)]

    rates = {int(s.labels["position"]): Value(s.value, _extra(s.labels))
             for s in strict("specwatch_position_acceptance_rate", w) if s.labels.get("position", "").isdigit()}
    conds = {int(s.labels["position"]): Value(s.value, _extra(s.labels))
             for s in strict("specwatch_position_conditional_acceptance_rate", w)
             if s.labels.get("position", "").isdigit()}
    positions = tuple(PositionRow(p, rates.get(p), conds.get(p)) for p in sorted(set(rates) | set(conds)))
    def bound(name: str, labels: Mapping[str, str]) -> float | None:
        # the interval of one speedup sample: same labels exactly (k, basis, window, …)
        for b in get(name):
            if dict(b.labels) == dict(labels) and math.isfinite(b.value):
                return b.value
        return None

    speedups = tuple(
        Speedup(int(s.labels["k"]), name, Value(s.value, _extra(s.labels)),
                lower=bound(SPEEDUP_LOWER_NAME, s.labels), upper=bound(SPEEDUP_UPPER_NAME, s.labels))
        for name in SPEEDUP_NAMES for s in strict(name, w) if s.labels.get("k", "").isdigit())
    step = tuple(Value(s.value, _extra(s.labels)) for s in strict(STEP_TIME_NAME, w))
    k = one("specwatch_num_speculative_tokens", base)

    def first(names: tuple[str, ...]) -> float | None:
        for n in names:  # a windowed series must carry this window; an unwindowed one is the current value
            got = strict(n, w)
            if got:
                return got[0].value
        return None

    running, waiting = first(RUNNING_NAMES), first(WAITING_NAMES)
    r2, w2 = requests.get((up_name, model, engine), (None, None))
    v0 = one("specwatch_v0_draft_acceptance_rate", {"upstream": up_name, "model_name": model})

    def windowed(name: str) -> Value | None:
        s = strict(name, w)
        return Value(s[0].value, _extra(s[0].labels)) if s else None

    withheld = tuple(sorted({s.labels.get("reason", "") for s in strict(WITHHELD_NAME, w) if s.value == 1.0}))
    verdicts = tuple(sorted({(s.labels.get("verdict", ""), s.labels.get("basis", "")) for s in strict(VERDICT_NAME, w)
                             if s.value == 1.0}))
    cert = windowed(CERTAIN_NAME)
    runner = None
    for s in strict(OVER_RUNNER_UP_NAME, w):
        if s.labels.get("runner_up_k", "").isdigit():
            runner = RunnerUp(int(s.labels["runner_up_k"]), s.value,
                              bound(OVER_RUNNER_UP_NAME + "_lower", s.labels), bound(OVER_RUNNER_UP_NAME + "_upper", s.labels))
            break
    if running is not None or waiting is not None:
        source = "exporter"
    elif r2 is not None or w2 is not None:
        source = "upstream"
    else:
        source = None

    return EngineView(
        model_name=model, engine=engine, window=use, fell_back=use != window,
        num_speculative_tokens=None if k is None else int(k.value),
        draft_acceptance_rate=windowed("specwatch_draft_acceptance_rate"),
        mean_acceptance_length=windowed("specwatch_mean_acceptance_length"),
        effective_k=windowed("specwatch_draft_tokens_per_draft"),
        output_from_drafts=windowed("specwatch_output_from_drafts_ratio"),
        positions=positions,
        recommended_k=windowed("specwatch_recommended_num_speculative_tokens"),
        withheld=withheld,
        ragged_drafts=windowed(RAGGED_NAME),
        missing_ratio=windowed(MISSING_RATIO_NAME),
        speedups=speedups, step_time=step,
        running=running if running is not None else r2,
        waiting=waiting if waiting is not None else w2,
        v0_draft_acceptance_rate=v0,
        requests_source=source,
        drift=windowed(DRIFT_NAME),
        verdicts=verdicts,
        certain=None if cert is None else cert.value == 1.0,
        runner_up=runner,
    )
