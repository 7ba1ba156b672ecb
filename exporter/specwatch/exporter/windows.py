"""The exporter's window engine: per-series increases over sliding windows of its own fetches.

Reference semantics: Prometheus' ``increase()`` per series, with two deliberate differences that
keep one bad body from looking like a restart:

- **A restart is the engine's counters dropping as vLLM restarts them.** When the upstream exports
  ``process_start_time_seconds``, a restart is a change of it (all series of the upstream start
  again from 0). vLLM with several API servers (``--api-server-count`` > 1) serves /metrics from
  prometheus_client's multiprocess mode, whose registry has no process collector, so no
  ``process_start_time_seconds``. Without it, a (model_name, engine) restarted when every one of
  its core speculative-decoding counters (``…_num_drafts_total``, ``…_num_draft_tokens_total``,
  ``…_num_accepted_tokens_total``) present in both fetches, non-zero before and at least two of
  them, fell; where there are not two such counters (no speculation, SGLang, a partial body), when
  at least 3 of its series are present in both fetches and more than half of them fell. Any
  other drop (a one-token dip of ``vllm:generation_tokens_total``, a body cut mid-number, a
  partial body holding one dipping series) is *not* a reset: it adds nothing, and the series'
  highest value stays the reference, so the recovery is not counted twice.
- **A partial body is never a reset.** A family missing from a fetch (e.g. the per-position
  counters, or positions 2–3 of k=4 without a restart) is absent from that scrape's values; when
  it comes back its increase is measured from its last value seen.

A series first seen after the upstream's first fetch counts from 0 when its (model_name, engine)
is new or has just restarted (vLLM creates its series at 0), else from its first value.

**Cost independent of history.** Each fetch turns every series into a reset-adjusted cumulative
value ``adj`` (sum of its increases since the exporter first saw it). A window's increase is
``adj(now) − adj(baseline)``, where the baseline is the newest kept record at or before
``now − window`` (the oldest one while the history is shorter): one binary search and one
subtraction per series, whatever the uptime. Records (a time and one float per series) are kept
at most one per ``spacing`` seconds (``max(1 s, shortest window / 12)``), none older than the
longest window plus one record, and at most ``max_records``; so memory per upstream is bounded by
``min(max_records, longest / spacing + 2) × series × 8 bytes``, with series at most
:data:`MAX_SERIES`. A window's span therefore starts
within ``spacing`` of ``now − window``; every value divides increases over that same span, and
rates per second use its exact length.

**Series that stop appearing are dropped.** A series not seen in any fetch for longer than the
longest window is dropped (checked once per ``spacing``; its slot is compacted out of the current
values and of every kept record), so label values that keep changing (a new ``model_name`` per
fetch) cost memory for one longest window, not for the uptime. A (model_name, engine) whose
series were all dropped and that comes back counts from its first value again (as after a gap
longer than Prometheus' range; only a key never seen before counts from 0). A fetch that would
make the upstream's state hold more than :data:`MAX_SERIES` series is refused with
:class:`TooManySeries` (the collector reports reason ``too_many_series``) and changes nothing.

Gauges (``vllm:num_requests_running``) are averaged over the window's fetches with two cumulative
series (sum of values, number of fetches).

:class:`WindowValues` is the typed per-(upstream, model_name, engine, window) result other code
builds on (e.g. the speedup from a cost profile).
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass, replace

from specwatch.exporter.fetching import FetchError
from specwatch.specdecode.steptime import MAX_SPREAD_BATCHES, SpeedSpread, StepTimes, speed_spread, step_times_of
from specwatch.specdecode.metrics import SglangCounters, SpecDecodeCounters, UpstreamSnapshot

Key = tuple[str, str]  # (model_name, engine)

#: Most series one upstream's window state holds (every counter, position, histogram sum/count
#: and the two running-request series count one; live ones plus those not yet dropped). vLLM
#: 0.32 at k = 8 has 18 per (model_name, engine), so this allows about 220 engines; at the cap a
#: kept record is 32 KiB. A fetch beyond it is refused (:class:`TooManySeries`).
MAX_SERIES = 4096
#: The core speculative-decoding counters (flattened names): they fall together on a restart.
_CORE = ("drafts", "draft_tokens", "accepted")


class TooManySeries(FetchError):
    """A fetch would make the upstream's window state hold more than :data:`MAX_SERIES` series
    (label values that keep changing); reason ``too_many_series``. The state is left unchanged."""

    def __init__(self, message: str):
        super().__init__("too_many_series", message)


def _from_times(name: str, doc: str) -> property:
    """A :class:`StepValues` property: ``times.<name>``, None without ``times``."""

    def get(self: StepValues) -> float | None:
        return None if self.times is None else getattr(self.times, name)

    return property(get, doc=f"``times.{name}`` (None without ``times``): {doc}")


@dataclass(frozen=True)
class StepValues:
    """Live engine-step values of one (upstream, model_name, engine) over one window (vLLM V1
    histograms; each ``None`` when its denominator is zero or its families are absent).

    ``times``: the :class:`~specwatch.specdecode.steptime.StepTimes` of the window's counter
    increases, computed by :func:`specwatch.specdecode.steptime.step_times_of` (the one
    implementation of the step-time formulas: step duration = Δ ITL sum / Δ ITL count, b = Δ ITL
    count / Δ iteration count, decode speed, request-steps, context per request, …); None without
    an ITL count. Each of its fields is also a property here (``values.step_duration_seconds`` is
    ``values.times.step_duration_seconds``, None without ``times``). Two values only a window has:

    - ``engine_steps_per_second`` = Δ ``vllm:iteration_tokens_total_count`` / Δt (exporter clock);
    - ``running_requests`` = mean of ``vllm:num_requests_running`` over the window's fetches.
    """

    times: StepTimes | None = None
    engine_steps_per_second: float | None = None
    running_requests: float | None = None

    step_duration_seconds = _from_times("step_duration_seconds", "Δ ITL sum / Δ ITL count (seconds).")
    running_requests_per_step = _from_times("running_requests_per_step", "b: Δ ITL count / Δ iteration count.")
    request_decode_tokens_per_second = _from_times("request_decode_tokens_per_second", "Decode speed of one request.")
    engine_steps = _from_times("engine_steps", "Δ iteration count (engine steps).")
    request_steps = _from_times("request_steps", "Δ ITL count (request-steps).")
    decode_tokens = _from_times("decode_tokens", "Δ (generation tokens − first tokens).")
    itl_seconds = _from_times("itl_seconds", "Δ ITL sum (seconds).")
    prefill_seconds = _from_times("prefill_seconds", "Δ TTFT sum (seconds).")
    first_tokens = _from_times("first_tokens", "Δ TTFT count (requests that got their first token).")
    context_tokens = _from_times("context_tokens", "Context per request of the requests finished in the window.")


@dataclass(frozen=True)
class WindowValues:
    """Everything the window engine knows about one (upstream, model_name, engine) over one window.

    ``counters``: spec-decode counter increases (a :class:`SpecDecodeCounters` of deltas, fed to
    :func:`specwatch.specdecode.derive.derive`), ``None`` when the upstream exports no spec-decode counters
    for the key; families missing from the current fetch are ``None``/``()`` in it.
    ``step``: :class:`StepValues`, ``None`` when the upstream exports neither the ITL nor the
    iteration histogram for the key (older vLLM, llama.cpp). ``sglang``: increases of SGLang's
    request-finish counters (key ``(model_name, "")``; ``verify_calls`` None while absent), None
    for other schemas; its mean acceptance length is
    :attr:`specwatch.specdecode.metrics.SglangCounters.mean_acceptance_length`. ``span_seconds``: exporter-clock
    time from the baseline fetch to now (0 with one fetch); ``fetches``: fetches after the baseline;
    ``generation_tokens``: Δ ``vllm:generation_tokens_total`` (None: not exported).
    """

    upstream: str
    model_name: str
    engine: str
    window: str
    span_seconds: float
    fetches: int
    counters: SpecDecodeCounters | None
    step: StepValues | None
    sglang: SglangCounters | None = None
    generation_tokens: float | None = None

    @property
    def output_tokens_per_second(self) -> float | None:
        """Output throughput over the window: Δ ``vllm:generation_tokens_total`` / the window's span
        (exporter clock), tokens per second of all requests together, as ``vllm bench serve``'s and
        AIPerf's output token throughput; None without the counter or before a second fetch."""
        if self.generation_tokens is None or self.span_seconds <= 0 or self.generation_tokens < 0:
            return None
        return self.generation_tokens / self.span_seconds


class _Series:
    __slots__ = ("slot", "last", "seen")

    def __init__(self, slot: int, last: float, seen: float):
        self.slot = slot
        self.last = last
        self.seen = seen  # time of the last fetch that held the series


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0 or num < 0:
        return None
    return num / den


class WindowEngine:
    """Per-upstream window state. Call :meth:`observe` once per successful fetch (time in seconds,
    monotonic), then :meth:`values` for each key and window. ``max_series``: see
    :data:`MAX_SERIES`."""

    def __init__(self, upstream: str, windows: tuple[tuple[str, float], ...], max_records: int = 2000,
                 max_series: int = MAX_SERIES):
        self.upstream = upstream
        self.windows = windows
        self.longest = max((s for _, s in windows), default=0.0)
        shortest = min((s for _, s in windows), default=0.0)
        self.spacing = max(1.0, shortest / 12.0)
        self.max_records = max(2, max_records)
        self._series: dict[tuple[Key, str], _Series] = {}
        self._adj = array("d")  # current reset-adjusted cumulative value per slot
        self.history: deque[tuple[float, array]] = deque()  # kept records: (t, adj copy)
        self._times: deque[float] = deque()
        self._present: set[tuple[Key, str]] = set()
        self._keys: set[Key] = set()
        self._kpos: dict[Key, int] = {}
        # keys whose series were all dropped (bounded): they count from their first value if back
        self._forgotten: OrderedDict[Key, None] = OrderedDict()
        self.max_series = max(1, max_series)
        self._swept = float("-inf")
        self._start: float | None = None
        self._now = 0.0
        self._fetches = 0
        self.restarts = 0

    # ---- update -----------------------------------------------------------------------------

    @staticmethod
    def _flatten(snap: UpstreamSnapshot) -> dict[tuple[Key, str], float]:
        out: dict[tuple[Key, str], float] = {}
        for key, c in snap.counters.items():
            if c.drafts is not None:
                out[(key, "drafts")] = c.drafts
            out[(key, "draft_tokens")] = c.draft_tokens
            out[(key, "accepted")] = c.accepted_tokens
            for i, v in enumerate(c.accepted_per_position):
                out[(key, f"pos{i}")] = v
            if c.generation_tokens is not None:
                out[(key, "gen")] = c.generation_tokens
        for model, sc in snap.sglang.items():
            key = (model, "")
            out[(key, "sgl_gen")] = sc.generation_tokens
            out[(key, "sgl_fin")] = sc.finished_requests
            if sc.verify_calls is not None:
                out[(key, "sgl_verify")] = sc.verify_calls
        for key, st in snap.steps.items():
            for name, v in (("itl_sum", st.itl_sum), ("itl_count", st.itl_count),
                            ("iter_count", st.iteration_count), ("ttft_count", st.ttft_count),
                            ("gen", st.generation_tokens), ("ttft_sum", st.ttft_sum),
                            ("prompt_sum", st.prompt_tokens_sum), ("prompt_n", st.prompt_requests),
                            ("out_sum", st.output_tokens_sum), ("out_n", st.output_requests)):
                if v is not None:
                    out[(key, name)] = v
        return out

    def _slot(self, sid: tuple[Key, str], last: float, t: float) -> _Series:
        s = _Series(len(self._adj), last, t)
        self._adj.append(0.0)
        self._series[sid] = s
        return s

    @property
    def n_series(self) -> int:
        """Series (slots) held now; at most :attr:`max_series`."""
        return len(self._adj)

    def _sweep(self, t: float, force: bool) -> None:
        """Drop series not seen for longer than the longest window (at most once per ``spacing``
        unless ``force``), compacting their slots out of the current values and every record."""
        if not force and t - self._swept < self.spacing:
            return
        self._swept = t
        # absent from the previous fetch too: series fetched less often than the longest window
        # (a slow scraper) keep their continuity
        cutoff = min(t - self.longest, self._now)
        stale = [sid for sid, s in self._series.items() if s.seen < cutoff]
        if not stale:
            return
        for sid in stale:
            del self._series[sid]
        live = sorted(self._series.values(), key=lambda s: s.slot)
        kept = [s.slot for s in live]
        adj = self._adj
        self._adj = array("d", [adj[i] for i in kept])
        # kept is ascending, so the slots a shorter (older) record holds stay a prefix of it
        self.history = deque((rt, array("d", [rec[i] for i in kept if i < len(rec)])) for rt, rec in self.history)
        for new, s in enumerate(live):
            s.slot = new
        keys = {sid[0] for sid in self._series}
        for key in self._keys - keys:
            self._keys.discard(key)
            self._kpos.pop(key, None)
            self._forgotten[key] = None
            self._forgotten.move_to_end(key)
        while len(self._forgotten) > self.max_series:
            self._forgotten.popitem(last=False)

    def _restarted(self, common: list[tuple[str, float, float]]) -> bool:
        """Whether one (model_name, engine) restarted, from its series present in this fetch and
        the previous ones: ``(name, value, last)`` each (see the module docstring)."""
        core = [v < last for name, v, last in common if name in _CORE and last > 0]
        if len(core) >= 2:
            return all(core)
        drops = sum(1 for _, v, last in common if v < last)
        return len(common) >= 3 and 2 * drops > len(common)

    def observe(self, t: float, snap: UpstreamSnapshot) -> None:
        """Take one successful fetch at time ``t`` (seconds; non-decreasing).

        Raises :class:`TooManySeries` (state unchanged) when the fetch would make the state hold
        more than ``max_series`` series."""
        values = self._flatten(snap)
        self._make_room(t, snap, values)
        first = self._fetches == 0
        restarted, keys = self._restarts(snap, values)
        self._trim_positions(snap, values, restarted)
        if restarted:
            self.restarts += 1
            for sid, s in self._series.items():
                if sid[0] in restarted:
                    s.last = 0.0  # vLLM starts its series again at 0
        self._add_increases(t, values, first, restarted)
        self._add_running(t, snap)
        self._remember(t, snap, values, keys | set(snap.running_requests))
        self._record(t)

    def _make_room(self, t: float, snap: UpstreamSnapshot, values: dict[tuple[Key, str], float]) -> None:
        """Update step: drop stale series (forced when the fetch brings new ones past ``max_series``);
        raises :class:`TooManySeries` when that is still too many."""
        series = self._series

        def n_new() -> int:
            return (sum(1 for sid in values if sid not in series)
                    + sum(1 for key in snap.running_requests for n in ("running_sum", "running_n") if (key, n) not in series))

        new = n_new()
        if new and len(self._adj) + new > self.max_series:
            self._sweep(t, force=True)
            new = n_new()
            if len(self._adj) + new > self.max_series:
                raise TooManySeries(f"{len(self._adj) + new} window series (counters, positions, histograms per "
                                    f"model_name/engine): more than the {self.max_series} kept per upstream "
                                    f"(label values that keep changing?)")
        else:
            self._sweep(t, force=False)

    def _restarts(self, snap: UpstreamSnapshot, values: dict[tuple[Key, str], float]) -> tuple[set[Key], set[Key]]:
        """Update step: the keys that restarted with this fetch (a new process start time, or their
        counters falling; see the module docstring), and every key the fetch's counters hold."""
        restart_all = (self._start is not None and snap.process_start_time is not None
                       and snap.process_start_time != self._start)
        start_known = self._start is not None and snap.process_start_time is not None
        if snap.process_start_time is not None:
            self._start = snap.process_start_time
        restarted: set[Key] = set()
        by_key: dict[Key, list[tuple[str, float, float]]] = {}
        for sid, v in values.items():
            common = by_key.setdefault(sid[0], [])
            s = self._series.get(sid)
            if s is not None:
                common.append((sid[1], v, s.last))
        for key, common in by_key.items():
            # a new start time, or none known and a drop (a known, unchanged one: same process, drops are dips)
            if restart_all or (not start_known and self._restarted(common)):
                restarted.add(key)
        if restart_all:
            restarted |= self._keys
        return restarted, set(by_key)

    def _trim_positions(self, snap: UpstreamSnapshot, values: dict[tuple[Key, str], float], restarted: set[Key]) -> None:
        """Update step: positions fewer than known without a restart are a partial body (the family
        is absent): drop them from ``values``; otherwise the fetch sets the known number."""
        for key, c in snap.counters.items():
            n = len(c.accepted_per_position)
            if key in restarted or key not in self._kpos:
                self._kpos[key] = n
            elif n < self._kpos[key]:
                for i in range(self._kpos[key]):
                    values.pop((key, f"pos{i}"), None)
            else:
                self._kpos[key] = n

    def _add_increases(self, t: float, values: dict[tuple[Key, str], float], first: bool, restarted: set[Key]) -> None:
        """Update step: each counter's increase since its last value into its adjusted value (a new
        series gets a slot, counting from 0 when its key is new or restarted)."""
        adj = self._adj
        forgotten = self._forgotten
        for sid, v in values.items():
            key = sid[0]
            s = self._series.get(sid)
            if s is None:
                from_zero = not first and ((key not in self._keys and key not in forgotten) or key in restarted)
                s = self._slot(sid, v, t)
                if from_zero:
                    adj[s.slot] = v
                continue
            s.seen = t
            if v >= s.last:
                adj[s.slot] += v - s.last
                s.last = v
            # else: a dip without a restart: no increase, the highest value stays the reference

    def _add_running(self, t: float, snap: UpstreamSnapshot) -> None:
        """Update step: the running-requests gauge into its two cumulative series (sum, fetches)."""
        adj = self._adj
        for key, r in snap.running_requests.items():
            for name, inc in (("running_sum", r), ("running_n", 1.0)):
                s = self._series.get((key, name)) or self._slot((key, name), 0.0, t)
                s.seen = t
                adj[s.slot] += inc

    def _remember(self, t: float, snap: UpstreamSnapshot, values: dict[tuple[Key, str], float],
                  seen_keys: set[Key]) -> None:
        """Update step: the keys and series this fetch held, its time, and one more fetch."""
        forgotten = self._forgotten
        if forgotten:
            for key in seen_keys:
                forgotten.pop(key, None)
        self._keys |= seen_keys
        self._present = set(values) | {(k, n) for k in snap.running_requests for n in ("running_sum", "running_n")}
        self._now = t
        self._fetches += 1

    def _record(self, t: float) -> None:
        h, times = self.history, self._times
        if not times or t - times[-1] >= self.spacing:
            h.append((t, array("d", self._adj)))
            times.append(t)
        # keep one record at or before t - longest (the longest window's baseline), drop older ones
        while len(times) >= 2 and times[1] <= t - self.longest:
            h.popleft()
            times.popleft()
        while len(h) > self.max_records:
            h.popleft()
            times.popleft()

    # ---- read --------------------------------------------------------------------------------

    def _baseline(self, seconds: float) -> tuple[float, array]:
        times = self._times
        i = bisect.bisect_right(times, self._now - seconds) - 1
        return self.history[max(i, 0)]

    def _speed_spread(self, key: Key, t0: float) -> SpeedSpread | None:
        """:func:`specwatch.specdecode.steptime.speed_spread` of ``key`` over the kept records from
        ``t0`` (the window's baseline) to now, in at most :data:`MAX_SPREAD_BATCHES` contiguous
        groups of about equal engine steps: group j ends at the first kept record whose Δ iteration
        count reaches j/m of the window's (one pass reading each kept record's iteration count,
        then binary searches; idle intervals add nothing to a group's decode tokens or ITL
        seconds). Groups that collapse onto the same record (the steps were taken between
        two fetches) count once; None with fewer than two groups."""
        slots = []
        for name in ("gen", "ttft_count", "itl_sum", "iter_count"):
            sr = self._series.get((key, name))
            if sr is None or (key, name) not in self._present:
                return None
            slots.append(sr.slot)
        g, f, i, it = slots
        times = self._times
        start = max(bisect.bisect_right(times, t0) - 1, 0)
        recs = [r for _, r in itertools.islice(self.history, start, None)]
        if not times or times[-1] < self._now:
            recs.append(self._adj)  # now, when the last fetch made no record
        n = len(recs)
        if n < 2:
            return None
        steps = [r[it] if it < len(r) else 0.0 for r in recs]  # non-decreasing: reset-adjusted
        s0, s1 = steps[0], steps[-1]
        if s1 - s0 < 2:
            return None
        m = MAX_SPREAD_BATCHES
        bounds = [0]
        for j in range(1, m):  # the first record whose steps reach j/m of the window's
            bounds.append(bisect.bisect_left(steps, s0 + (s1 - s0) * j / m, bounds[-1], n - 1))
        bounds.append(n - 1)

        def at(r: array, slot: int) -> float:
            return r[slot] if slot < len(r) else 0.0

        groups = []
        for ja, jb in itertools.pairwise(dict.fromkeys(bounds)):
            ra, rb = recs[ja], recs[jb]
            groups.append(((at(rb, g) - at(ra, g)) - (at(rb, f) - at(ra, f)), at(rb, i) - at(ra, i)))
        return speed_spread(groups, intervals=n - 1)

    def values(self, key: Key, label: str, seconds: float, spec: bool, steps: bool, sglang: bool = False,
               spread: bool = False) -> WindowValues:
        """The :class:`WindowValues` of ``key`` over the last ``seconds`` (window ``label``).
        ``spec``/``steps``/``sglang``: whether the current fetch has spec-decode counters / step
        histograms / SGLang request-finish counters for the key. ``spread``: also how the decode
        speed moved between the window's fetches (``step.times.speed_spread``, the measured
        speedup's between-round term; a few binary searches over the window's kept records)."""
        t0, base = self._baseline(seconds)
        cur, present = self._adj, self._present
        n_base = len(base)

        def d(name: str) -> float | None:
            sid = (key, name)
            if sid not in present:
                return None
            slot = self._series[sid].slot
            return cur[slot] - (base[slot] if slot < n_base else 0.0)

        span = self._now - t0
        fetches_d = d("running_n")
        counters = None
        if spec:
            n = self._kpos.get(key, 0)
            pos = [d(f"pos{i}") for i in range(n)]
            counters = SpecDecodeCounters(
                model_name=key[0], engine=key[1], drafts=d("drafts"),
                draft_tokens=d("draft_tokens") or 0.0, accepted_tokens=d("accepted") or 0.0,
                accepted_per_position=tuple(pos) if pos and all(p is not None for p in pos) else (),  # type: ignore[arg-type]
                generation_tokens=d("gen"),
            )
        step = None
        if steps:
            iters = d("iter_count")
            times = step_times_of(itl_sum=d("itl_sum"), itl_count=d("itl_count"), iteration_count=iters,
                                  ttft_count=d("ttft_count"), generation_tokens=d("gen"), ttft_sum=d("ttft_sum"),
                                  prompt_tokens_sum=d("prompt_sum"), prompt_requests=d("prompt_n"),
                                  output_tokens_sum=d("out_sum"), output_requests=d("out_n"))
            if spread and times is not None:
                times = replace(times, speed_spread=self._speed_spread(key, t0))
            step = StepValues(
                times=times,
                engine_steps_per_second=_ratio(iters, span),
                running_requests=_ratio(d("running_sum"), fetches_d),
            )
        sgl = None
        if sglang:
            gen, fin = d("sgl_gen"), d("sgl_fin")
            if gen is not None and fin is not None:
                sgl = SglangCounters(key[0], gen, fin, d("sgl_verify"))
        return WindowValues(self.upstream, key[0], key[1], label, span,
                            int(fetches_d) if fetches_d is not None else 0, counters, step, sgl, d("gen"))
