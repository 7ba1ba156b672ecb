"""The exporter's custom collector: fetch every upstream in coalesced rounds, derive, expose.

A *fetch round* fetches every upstream concurrently against one shared deadline
(``--timeout``; see :mod:`specwatch.exporter.fetching`), feeds each successful fetch to that upstream's
:class:`specwatch.exporter.windows.WindowEngine` and builds the metric families once. Scrapes
within ``--min-fetch-interval`` seconds after a round finished (default 1 s) share it; a later
scrape starts the next round and waits for it. Scrapes that arrive while a round is in flight do
not wait for it when the previous round finished less than ``--timeout`` seconds ago: they get
that one at once (stale while revalidating; its age is the answer's ``X-Specwatch-Round-Age``
header); otherwise they wait for the round in flight. Upstreams see one fetch per interval
whatever the number of scrapers (``specwatch_upstream_fetches_total`` counts them), and with
many scrapers only the one that starts a round waits for it.

Each upstream is isolated: whatever its body holds (garbage, negative, NaN/Inf or duplicated
values in any family read) makes only that upstream ``specwatch_up 0`` with a reason in
``specwatch_upstream_fetch_errors_total{reason}``; no scrape fails, and no non-finite value is
ever exposed. State kept across rounds, per upstream: the window engine's bounded history (see
:mod:`specwatch.exporter.windows`) and the error/violation/fetch counters.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import logging
from dataclasses import dataclass, replace
import math
import threading
import time
import weakref
from typing import Callable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from specwatch import __version__
from specwatch.specdecode.costprofile import CostProfile
from specwatch.specdecode.speedup import LiveCost, answer
from specwatch.specdecode.steptime import StepTimes, is_complete, step_times
from specwatch.exporter.config import ExporterConfig
from specwatch.specdecode.derive import INVARIANTS, DerivedValues, check_invariants, derive
from specwatch.exporter.fetching import (AsyncHttpRunner, BodyObserver, FetchError, Fetcher, FetchResult, FetchRunner,
                                         ServerInfo, ThreadRunner, http_fetch)
from specwatch.specdecode.metrics import SpecDecodeCounters, UpstreamSnapshot, clip
from specwatch.specdecode.ragged import DraftWidth, draft_width
from specwatch.exporter.series import PROFILE_INFO_BY_DRAFTER, SERIES
from specwatch.exporter.windows import WindowEngine, WindowValues

log = logging.getLogger("specwatch.exporter")


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return None


def _load_malloc_trim() -> Callable[[], None]:
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return lambda: None
    return lambda: trim(0)


def limit_malloc_arenas(n: int = 2) -> None:
    """Cap glibc's malloc arenas at ``n`` (``mallopt(M_ARENA_MAX, n)``; a no-op elsewhere): the
    listener's connection threads otherwise each get an arena whose freed memory stays resident.
    Call before starting threads."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is not None:
        mallopt(-8, n)  # M_ARENA_MAX


#: Return freed heap memory to the system (glibc ``malloc_trim(0)``; a no-op elsewhere). Called
#: once per fetch round and per rendering: without it the transient peaks of building and
#: rendering a round (Python's allocator over glibc arenas) keep RSS at their high-water mark.
release_memory = _load_malloc_trim()

__all__ = ["FetchError", "Fetcher", "http_fetch", "SpecwatchCollector"]


class _UpstreamState:
    """Per-upstream state kept across rounds (bounded)."""

    def __init__(self, name: str, config: ExporterConfig):
        self.engine = WindowEngine(name, tuple((w.label, w.seconds) for w in config.windows),
                                   config.history_samples)
        self.violations: dict[str, int] = {name: 0 for name in INVARIANTS}
        self.fetch_errors: dict[str, int] = {}
        self.fetches = 0
        self.last_error: FetchError | None = None  # why the last round left it down (None: up)
        self.server_info: ServerInfo | None = None  # the last good /server_info answer (,server_info=on)

    @property
    def history(self):
        """The window engine's kept records (bounded by time and count)."""
        return self.engine.history


class _Round:
    """One fetch round and the families built from it (shared by coalesced scrapes)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.finished_at: float | None = None  # the collector's clock, seconds
        self.families: list[Metric] = []
        self.window_values: list[WindowValues] = []
        self.rendered: dict[tuple, tuple[int, bytes]] = {}  # (HTTP status, body) per (content type, encoding)
        self.render_lock = threading.Lock()

    def collect(self) -> list[Metric]:
        """The round's families (so a round can be rendered like a registry)."""
        return self.families


class SpecwatchCollector(Collector):
    """prometheus_client collector exposing specwatch's metrics (every series: docs/exporter.md).

    ``fetch``: an injected synchronous :data:`specwatch.exporter.fetching.Fetcher` (tests), or ``None``
    for HTTP on the shared event loop (:class:`specwatch.exporter.fetching.AsyncHttpRunner`).
    ``clock`` returns seconds (monotonic) for the windows and the freshness interval.
    ``on_body``: see :class:`specwatch.exporter.fetching.FetchRunner` (``specwatch top --upstream``).
    Thread-safe: concurrent scrapes share rounds (see the module docstring).
    """

    def __init__(
        self,
        config: ExporterConfig,
        fetch: Fetcher | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_body: BodyObserver | None = None,
    ):
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._round: _Round | None = None  # the latest round started
        self._finished: _Round | None = None  # the latest round finished (what joiners may get)
        self._states = {u.name: _UpstreamState(u.name, config) for u in config.upstreams}
        self._upstreams = {u.name: u for u in config.upstreams}
        self._baseline_refused = False  # the baseline upstream speculates (logged once per episode)
        #: called with a built round before scrapes can get it (the app renders it there, so a
        #: scrape never waits behind another's rendering); an exception is logged, never raised
        self.before_publish: Callable[[_Round], None] | None = None
        self._baseline_speculating: set[tuple[str, str]] = set()
        self._baseline_bad_logged: set[str] = set()  # upstreams told once that the baseline's values are unusable
        n = len(config.upstreams)
        if fetch is None or fetch is http_fetch:
            self._runner: FetchRunner = AsyncHttpRunner(config.timeout_seconds, config.max_body_bytes, n, on_body)
        else:
            self._runner = ThreadRunner(fetch, config.timeout_seconds, config.max_body_bytes, n, on_body)
        weakref.finalize(self, self._runner.close)  # stop the fetch loop when the collector goes

    def describe(self) -> list[Metric]:
        return []  # collected per round; nothing to describe at registration time

    def close(self) -> None:
        """Stop the fetch machinery (the collector is unusable afterwards)."""
        self._runner.close()

    def collect(self) -> Iterator[Metric]:
        yield from self._current_round().families

    def current_round(self) -> _Round:
        """The fetch round this scrape is answered from (see the module docstring: a fresh one,
        a new one it starts and waits for, or, while another scrape's round is in flight, the
        previous one if it finished less than ``--timeout`` seconds ago): its ``families``,
        ``finished_at``, and ``rendered``/``render_lock`` to render it once for all its scrapes."""
        return self._current_round()

    def round_age(self, r: _Round) -> float:
        """Seconds since round ``r`` finished (the collector's clock; 0 for an unfinished round)."""
        return max(0.0, self._clock() - r.finished_at) if r.finished_at is not None else 0.0

    def window_values(self) -> list[WindowValues]:
        """The :class:`WindowValues` of the latest finished round: one per (upstream, model_name,
        engine, window) with spec-decode counters or step histograms (configured windows only)."""
        r = self._finished
        return list(r.window_values) if r is not None else []

    def last_errors(self) -> dict[str, str]:
        """Why each upstream the latest finished round left down is down: name -> "reason: message"
        (the reason as in ``specwatch_upstream_fetch_errors_total``); up upstreams are not listed."""
        return {name: f"{st.last_error.reason}: {st.last_error}" for name, st in self._states.items()
                if st.last_error is not None}

    def latest_families(self) -> list[Metric]:
        """The families of the latest finished round (empty before the first); never fetches."""
        r = self._finished
        return list(r.families) if r is not None else []

    def _current_round(self) -> _Round:
        cfg = self.config
        with self._lock:
            r, last = self._round, self._finished
            now = self._clock()
            if r is None or (r.done.is_set() and (r.finished_at is None or
                                                  now - r.finished_at >= cfg.min_fetch_interval)):
                r = self._round = _Round()
                owner = True
            else:
                owner = False
        if owner:
            self._own_round(r)
            return r
        if r.done.is_set():
            return r  # fresh: finished less than --min-fetch-interval ago
        # another scrape's round is in flight: the previous one if it is recent, else wait
        if last is not None and last.finished_at is not None and now - last.finished_at < cfg.timeout_seconds:
            return last
        r.done.wait(cfg.timeout_seconds + 5.0)
        if not r.done.is_set() and last is not None:
            return last  # never an unfinished (empty) round while a finished one exists
        return r

    def _own_round(self, r: _Round) -> None:
        """Run round ``r`` in this thread (the scrape that started it waits for it)."""
        try:
            self._run_round(r)
        except Exception:  # a bug must not fail every later scrape
            log.exception("fetch round failed")
            fams = _Families()
            fams.build_info.add_metric([__version__], 1.0)
            for u in self.config.upstreams:  # every scrape carries specwatch_up of every upstream
                fams.up.add_metric([u.name], 0.0)
                self._states[u.name].last_error = FetchError("round", "the fetch round failed (a bug; logged)")
            r.families = list(fams.all())
        finally:
            r.finished_at = self._clock()
            if self.before_publish is not None:
                try:
                    self.before_publish(r)
                except Exception:  # the scrape renders it then (and answers 500 if it cannot)
                    log.exception("the round could not be prepared")
            with self._lock:
                self._finished = r
            r.done.set()

    def _fetch_all(self, on_result: Callable[[str, FetchResult], None]) -> None:
        """Fetch every upstream against one shared deadline; ``on_result(name, result)`` is called
        (in this thread) as each result arrives, so the round's work overlaps slow fetches."""
        cfg = self.config
        limit = cfg.timeout_seconds + 1.0
        futures: dict[concurrent.futures.Future, str] = {}
        for u in cfg.upstreams:
            fut = self._runner.submit(u)
            if fut is None:
                on_result(u.name, FetchResult(None, FetchError("timeout", "previous fetch still running"), 0.0))
            else:
                futures[fut] = u.name
                self._states[u.name].fetches += 1
        pending = set(futures)
        try:
            for fut in concurrent.futures.as_completed(futures, timeout=limit):  # one shared deadline
                pending.discard(fut)
                try:
                    res = fut.result()
                except Exception as exc:  # isolate the upstream, never the scrape
                    res = FetchResult(None, FetchError("parse", f"{type(exc).__name__}: {exc}"), 0.0)
                on_result(futures[fut], res)
        except concurrent.futures.TimeoutError:
            pass
        for fut in pending:
            on_result(futures[fut], FetchResult(None, FetchError("timeout", f"no result within {limit:g} s"), limit))

    def _run_round(self, r: _Round) -> None:
        cfg = self.config
        done: dict[str, tuple[FetchResult, "_Families | None", FetchError | None, list[WindowValues], list[_CostInputs]]] = {}

        def process(name: str, res: FetchResult) -> None:
            state = self._states[name]
            error, part, wvs, costs = res.error, None, [], []
            if error is None:
                assert res.snapshot is not None
                if res.server_info is not None:
                    state.server_info = res.server_info
                now = self._clock()
                part = _Families()
                try:
                    state.engine.observe(now, res.snapshot)
                    self._add_upstream(part, name, state, res.snapshot, now, wvs, costs)
                    part.check_finite()
                except FetchError as exc:  # e.g. windows.TooManySeries: its own reason
                    error, part, wvs, costs = exc, None, [], []
                except Exception as exc:  # isolate the upstream, never the scrape
                    error, part, wvs, costs = (FetchError("invalid_value", f"values not usable: {type(exc).__name__}: {exc}"),
                                               None, [], [])
            if error is not None:
                state.fetch_errors[error.reason] = state.fetch_errors.get(error.reason, 0) + 1
                log.warning("upstream %s: %s: %s", name, error.reason, error)
            done[name] = (res, part, error, wvs, costs)

        self._fetch_all(process)
        f = _Families()
        f.build_info.add_metric([__version__], 1.0)
        try:
            _add_profile(f, cfg.cost_profile, tuple((u.speculative_method, u.drafter) for u in cfg.upstreams if u.drafter))
        except Exception:  # never the round (the profile was checked at start)
            log.exception("the cost profile's series could not be built")
        # after every upstream's fetch: a baseline upstream's speed is an input of the others' costs
        try:
            base_step = self._baseline_steps(done)
        except Exception:  # never the round: the measured basis is then missing, logged
            log.exception("the baseline upstream's step values could not be read")
            base_step = {}
        for upstream in cfg.upstreams:
            name = upstream.name
            state = self._states[name]
            res, part, error, wvs, costs = done[name]
            if part is not None and costs:
                part, error, wvs = self._costs_of(name, state, part, costs, base_step, wvs)
            f.duration.add_metric([name], res.seconds)
            f.up.add_metric([name], 0.0 if error is not None else 1.0)
            state.last_error = error
            if part is not None:
                f.merge(part)
            r.window_values.extend(wvs)
            f.fetches.add_metric([name], float(state.fetches))
            for reason, count in sorted(state.fetch_errors.items()):
                f.fetch_errors.add_metric([name, reason], float(count))
            for inv, count in state.violations.items():
                f.violations.add_metric([name, inv], float(count))
        r.families = list(f.all())
        del f
        release_memory()

    def _costs_of(self, name: str, state: _UpstreamState, part: "_Families", costs: list["_CostInputs"],
                  base_step: dict[tuple[str, str], StepTimes], wvs: list[WindowValues]
                  ) -> tuple["_Families | None", FetchError | None, list[WindowValues]]:
        """One upstream's cost series (speedups, verdict, recommended k, drift) added to its
        ``part``, isolated: an exception or a non-finite value while deriving them leaves out that
        upstream's derived series (``specwatch_up 0``, reason ``invalid_value``, one log line),
        never the round. An item whose measured speedup fails only through the baseline upstream's
        values is served without it (calibrated), with ``specwatch_not_derivable`` naming why.
        Returns ``(part or None, error or None, window values)``."""
        cpart = _Families()
        try:
            self._add_costs(cpart, costs, base_step)
            cpart.check_finite()
        except Exception as exc:  # isolate the upstream, never the round
            error = FetchError("invalid_value", f"derived values not usable: {type(exc).__name__}: {exc}")
            state.fetch_errors[error.reason] = state.fetch_errors.get(error.reason, 0) + 1
            log.warning("upstream %s: %s: %s; its derived series are left out", name, error.reason, error)
            return None, error, []
        part.merge(cpart)
        return part, None, wvs

    def _baseline_steps(self, done: dict) -> dict[tuple[str, str], StepTimes]:
        """The baseline upstream's (``--baseline-upstream``) live step values per (model_name,
        window), the denominator of the measured speedups; empty without one, when its fetch
        failed, or when it speculates itself (its ``vllm:spec_decode_*`` counters moved in the
        window: refused as a denominator, logged once per episode)."""
        cfg = self.config
        name = cfg.baseline_upstream
        if not name or name not in done:
            return {}
        _, part, error, _, costs = done[name]
        if error is not None or part is None:
            return {}
        out: dict[tuple[str, str], StepTimes] = {}
        speculating: set[tuple[str, str]] = set()
        for it in costs:
            if (it.drafts or 0) > 0 or (it.draft_tokens or 0) > 0:
                speculating.add((it.key[0], it.window))
        for it in costs:
            if it.step and it.step.request_decode_tokens_per_second and (it.key[0], it.window) not in speculating:
                out.setdefault((it.key[0], it.window), it.step)
        was = self._baseline_refused
        self._baseline_refused = bool(speculating)
        if speculating and not was:
            log.warning("--baseline-upstream %s runs speculative decoding itself (its vllm:spec_decode_* counters move): "
                        "it is not used as the denominator of the measured speedup (%s)", name,
                        ", ".join(f"{clip(m, 60)} {w}" for m, w in sorted(speculating)[:4]))
        self._baseline_speculating = speculating
        return out

    def _add_upstream(self, f: "_Families", name: str, state: _UpstreamState, snap: UpstreamSnapshot,
                      now: float, out: list[WindowValues], costs: list["_CostInputs"]) -> None:
        f.enabled.add_metric([name], 1.0 if snap.spec_decode_enabled else 0.0)
        f.info.add_metric([name, snap.schema], 1.0)
        up = self._upstreams[name]
        if snap.spec_decode_enabled and (up.speculative_method or up.drafter):
            # vLLM publishes neither on /metrics nor on /v1/models (see specwatch.specdecode.serverinfo)
            f.method_info.add_metric([name, up.speculative_method or "", up.drafter or "", up.method_source], 1.0)
        said = state.server_info.info if state.server_info is not None else None
        if said is not None:  # the server's own dev-mode /server_info (,server_info=on)
            f.method_info.add_metric([name, said.method, said.drafter or "", "server_info"], 1.0)
        for model, g in sorted(snap.v0.items()):
            if g.counter_acceptance_ratio is not None:
                f.acceptance_rate.add_metric([name, model, "", "lifetime"], g.counter_acceptance_ratio)
            if g.draft_acceptance_rate is not None:
                f.v0_rate.add_metric([name, model], g.draft_acceptance_rate)
            if g.efficiency is not None:
                f.v0_efficiency.add_metric([name, model], g.efficiency)

        if snap.schema == "sglang":
            self._add_sglang(f, name, state, snap, out)
            return

        good: set[tuple[str, str]] = set()
        for key, c in sorted(snap.counters.items()):
            bad = check_invariants(c)
            if bad:
                for inv in bad:
                    state.violations[inv] += 1
                log.warning("upstream %s %s: vLLM invariants violated: %s; no derived values served",
                            name, clip(str(key)), ", ".join(bad))
                continue
            good.add(key)

        for key, c in sorted(snap.counters.items()):
            if key not in good:
                continue
            labels = [name, key[0], key[1]]
            if c.drafts is not None:
                f.drafts.add_metric(labels, c.drafts)
            f.draft_tokens.add_metric(labels, c.draft_tokens)
            f.accepted.add_metric(labels, c.accepted_tokens)
            for pos, v in enumerate(c.accepted_per_position):
                f.accepted_per_pos.add_metric(labels + [str(pos)], v)
            if c.generation_tokens is not None:
                f.generation.add_metric(labels, c.generation_tokens)
            if c.num_speculative_tokens:
                f.k.add_metric(labels, float(c.num_speculative_tokens))
            running = snap.running_requests.get(key, 0.0)
            der = _Derived.of(c)
            self._add_derived(f, labels, "lifetime", der)
            st = snap.steps.get(key)
            lifetime_step = step_times(st) if st is not None and is_complete(st) else None
            self._add_lifetime_step(f, labels, lifetime_step)
            costs.append(_CostInputs.of(name, key, "lifetime", der, lifetime_step, running, c.num_speculative_tokens or 0))

        stepped = {key for key, st in snap.steps.items()
                   if st.itl_count is not None or st.iteration_count is not None}
        for key in sorted(good | stepped):
            labels = [name, key[0], key[1]]
            running = snap.running_requests.get(key, 0.0)
            if key not in good:  # no spec-decode counters (a baseline): lifetime step values only
                st = snap.steps.get(key)
                lifetime_step = step_times(st) if st is not None and is_complete(st) else None
                self._add_lifetime_step(f, labels, lifetime_step)
                costs.append(_CostInputs.of(name, key, "lifetime", None, lifetime_step, running))
            for w in self.config.windows:
                wv = state.engine.values(key, w.label, w.seconds, spec=key in good, steps=key in stepped,
                                         spread=bool(self.config.baseline_upstream))
                out.append(wv)
                # derived once: the served series and the cost inputs read the same values
                der = _Derived.of(wv.counters) if wv.counters is not None else None
                self._add_window(f, labels, wv, der)
                k_now = snap.counters[key].num_speculative_tokens if key in snap.counters else 0
                costs.append(_CostInputs.of(name, key, wv.window, der, _step_of(wv), running, k_now or 0))

    def _add_sglang(self, f: "_Families", name: str, state: _UpstreamState, snap: UpstreamSnapshot,
                    out: list[WindowValues]) -> None:
        """An SGLang upstream (schema ``sglang``): copies of its request-finish counters, the mean
        acceptance length (Δgeneration − Δfinished) / Δverify calls per window and lifetime, its
        "most recent" gauges passed through per scheduler rank, and the series that cannot be
        derived from SGLang's /metrics with the reason (``specwatch_not_derivable``)."""
        if snap.spec_decode_enabled:
            for series, reason in _SGLANG_NOT_DERIVABLE:
                f.not_derivable.add_metric([name, series, reason], 1.0)
        for (model, rank), g in sorted(snap.sglang_gauges.items()):
            if g.accept_rate is not None:
                f.sgl_rate.add_metric([name, model, rank], g.accept_rate)
            if g.accept_length is not None:
                f.sgl_length.add_metric([name, model, rank], g.accept_length)
            for gauge, v in g.others:
                f.sgl_gauge.add_metric([name, model, rank, gauge], v)
        for model, c in sorted(snap.sglang.items()):
            labels = [name, model, ""]
            f.sgl_gen.add_metric(labels, c.generation_tokens)
            f.sgl_fin.add_metric(labels, c.finished_requests)
            if c.verify_calls is not None:
                f.sgl_verify.add_metric(labels, c.verify_calls)
            if c.mean_acceptance_length is not None:
                f.mean_length.add_metric(labels + ["lifetime"], c.mean_acceptance_length)
            for w in self.config.windows:
                wv = state.engine.values((model, ""), w.label, w.seconds, spec=False, steps=False, sglang=True)
                out.append(wv)
                if wv.sglang is not None and wv.sglang.mean_acceptance_length is not None:
                    f.mean_length.add_metric(labels + [w.label], wv.sglang.mean_acceptance_length)

    def _add_lifetime_step(self, f: "_Families", labels: list[str], step: StepTimes | None) -> None:
        """Step time, b and decode speed since the server started (window="lifetime")."""
        if step is None:
            return
        lw = labels + ["lifetime"]
        for fam, v in ((f.step_duration, step.step_duration_seconds), (f.running_per_step, step.running_requests_per_step),
                       (f.decode_speed, step.request_decode_tokens_per_second)):
            if v is not None:
                fam.add_metric(lw, v)

    def _add_window(self, f: "_Families", labels: list[str], wv: WindowValues, der: "_Derived | None") -> None:
        """Series of one :class:`WindowValues` (extension point for series derived from it); ``der``:
        what its spec-decode counters give (None without them)."""
        if der is not None:
            self._add_derived(f, labels, wv.window, der)
        tps = wv.output_tokens_per_second
        if tps is not None:
            f.output_tps.add_metric(labels + [wv.window], tps)
        if wv.step is not None:
            lw = labels + [wv.window]
            for fam, v in ((f.step_duration, wv.step.step_duration_seconds),
                           (f.steps_per_second, wv.step.engine_steps_per_second),
                           (f.running, wv.step.running_requests),
                           (f.running_per_step, wv.step.running_requests_per_step),
                           (f.decode_speed, wv.step.request_decode_tokens_per_second)):
                if v is not None:
                    fam.add_metric(lw, v)

    def _add_derived(self, f: "_Families", labels: list[str], window: str, der: "_Derived") -> None:
        """The series derived from one (key, window)'s spec-decode counters (rates, lengths, per-position
        and what-if curves with their basis, ragged drafts)."""
        d, width = der.values, der.width
        lw = labels + [window]
        # basis: exact when the drafts were full, lower_bound when ragged (specdecode.ragged)
        basis = width.basis if width is not None else "exact"
        if width is not None:
            f.ragged.add_metric(lw, 1.0 if width.ragged else 0.0)
            f.missing_ratio.add_metric(lw, width.missing_ratio)
        if d.draft_acceptance_rate is not None:
            f.acceptance_rate.add_metric(lw, d.draft_acceptance_rate)
        if d.mean_acceptance_length is not None:
            f.mean_length.add_metric(lw, d.mean_acceptance_length)
        for pos, r in enumerate(d.position_acceptance_rates):
            f.pos_rate.add_metric(labels + [str(pos), window, basis], r)
        for pos, r in enumerate(d.position_conditional_acceptance_rates):
            if r is not None:
                f.pos_cond.add_metric(labels + [str(pos), window, basis], r)
        for k, e in enumerate(d.expected_acceptance_lengths, start=1):
            f.expected.add_metric(labels + [str(k), window, basis], e)
        if d.draft_tokens_per_draft is not None:
            f.tokens_per_draft.add_metric(lw, d.draft_tokens_per_draft)
        if d.output_from_drafts_ratio is not None:
            f.from_drafts.add_metric(lw, d.output_from_drafts_ratio)

    def _add_costs(self, f: "_Families", items: list["_CostInputs"],
                   base_step: dict[tuple[str, str], StepTimes] | None = None) -> None:
        """Speedup per k with its interval and basis, the verdict, the recommended k with its
        confidence (or why it is withheld) and the cost-profile drift of every (model, engine,
        window) of one upstream (:mod:`specwatch.specdecode.speedup`). ``base_step``: the baseline
        upstream's (``--baseline-upstream``) live step values per (model_name, window), the measured
        basis's denominator (:meth:`_baseline_steps`). Raises whatever deriving raises (the caller
        isolates the upstream)."""
        cfg = self.config
        base_step = base_step or {}
        refused_said: set[str] = set()
        for it in items:
            up = self._upstreams[it.upstream]
            method, drafter = up.speculative_method, up.drafter
            said = self._states[it.upstream].server_info
            if method is None and drafter is None and said is not None and said.info is not None:
                method, drafter = said.info.method, said.info.drafter  # not stated: what the server said
            profile = cfg.cost_profile
            mismatch = profile is not None and profile.served_model_name not in (None, it.key[0])
            labels = [it.upstream, it.key[0], it.key[1]]
            lw = labels + [it.window]
            if profile is not None:
                # a profile for another model is still applied, with a wide interval (never a confident number)
                f.profile_applied.add_metric(lw, 0.0 if mismatch else 1.0)
            share = x = None
            if it.step is not None and it.drafts is not None and it.step.request_steps:
                share = min(1.0, it.drafts / it.step.request_steps)
            if it.step is not None and it.draft_tokens is not None and it.step.request_steps:
                x = it.draft_tokens / it.step.request_steps
            is_base = it.upstream == cfg.baseline_upstream
            baseline = None if is_base else base_step.get((it.key[0], it.window))
            if (not is_base and cfg.baseline_upstream and (it.key[0], it.window) in self._baseline_speculating
                    and "baseline_speculates" not in refused_said):
                refused_said.add("baseline_speculates")
                f.not_derivable.add_metric([it.upstream, 'specwatch_speedup{basis="measured"}',
                                            "baseline_speculates"], 1.0)
            k = len(it.rates) or it.k
            if is_base:
                k = 0

            cost = LiveCost(step=it.step, draft_share=share, drafted_tokens_per_step=x, baseline=baseline,
                            profile=profile, method=method, drafter=drafter, running_requests_fallback=it.running,
                            profile_model_mismatch=mismatch, missing_ratio=it.missing_ratio, drafts=it.drafts)
            try:
                ans = _checked_answer(it.rates, cost, k)
            except (ValueError, ArithmeticError) as exc:
                if baseline is None:
                    raise
                # the baseline's values give no finite measured speedup: served without it
                ans = _checked_answer(it.rates, replace(cost, baseline=None), k)
                if "baseline_invalid_value" not in refused_said:
                    refused_said.add("baseline_invalid_value")
                    f.not_derivable.add_metric([it.upstream, 'specwatch_speedup{basis="measured"}',
                                                "baseline_invalid_value"], 1.0)
                    first = it.upstream not in self._baseline_bad_logged
                    self._baseline_bad_logged.add(it.upstream)
                    (log.warning if first else log.debug)(
                                "upstream %s %s window %s: the baseline upstream %s gives no finite measured speedup "
                                "(%s); served without it", it.upstream, clip(it.key[0], 60), it.window,
                                cfg.baseline_upstream, clip(str(exc), 120))
            if ans.drift is not None and it.step is not None:
                f.drift.add_metric(lw + [ans.drift.basis], ans.drift.ratio)
                f.predicted_step.add_metric(lw, ans.drift.predicted_seconds)
            for kk, v in ans.speedups.items():
                self._add_speedup(f, labels + [str(kk), it.window, v.basis], v)
            if ans.verdict is not None:
                f.verdict.add_metric(lw + [ans.verdict_basis or "", ans.verdict], 1.0)
            if ans.k is not None:
                f.recommended.add_metric(lw + [ans.k_basis or ""], float(ans.k))
                p = ans.decision
                f.certain.add_metric(lw, 1.0 if ans.never_accepted or p is None or p.certain else 0.0)
                vs = None if p is None else p.versus_runner_up
                if p is not None and p.runner_up is not None and vs is not None:
                    rl = lw + [str(p.runner_up.k)]
                    f.runner_up.add_metric(rl, vs.value)
                    if vs.lower is not None and vs.upper is not None:
                        f.runner_up_lower.add_metric(rl, vs.lower)
                        f.runner_up_upper.add_metric(rl, vs.upper)
            elif ans.withheld is not None:
                f.withheld.add_metric(lw + [ans.withheld], 1.0)

    @staticmethod
    def _add_speedup(f: "_Families", labels: list[str], v) -> None:
        f.speedup.add_metric(labels, v.value)
        if v.lower is not None and v.upper is not None:
            f.speedup_lower.add_metric(labels, v.lower)
            f.speedup_upper.add_metric(labels, v.upper)


@dataclass(frozen=True)
class _Derived:
    """One (key, window)'s spec-decode counters and what derives from them, computed once per round:
    the served derived series (:meth:`SpecwatchCollector._add_derived`) and the cost inputs
    (:meth:`_CostInputs.of`) both read it."""

    counters: SpecDecodeCounters  # lifetime counters, or the window's increase (WindowValues.counters)
    values: DerivedValues  # specdecode.derive.derive(counters)
    width: DraftWidth | None  # specdecode.ragged.draft_width(counters); None without drafts or per-position counters

    @classmethod
    def of(cls, counters: SpecDecodeCounters) -> "_Derived":
        return cls(counters, derive(counters), draft_width(counters))


@dataclass(frozen=True)
class _CostInputs:
    """What the speedup of one (upstream, key, window) needs, gathered while the round runs."""

    upstream: str
    key: tuple[str, str]
    window: str
    rates: tuple[float, ...]
    drafts: float | None
    step: StepTimes | None
    running: float
    k: int = 0  # the server's num_speculative_tokens (0: no speculation)
    curve_basis: str | None = None  # exact / lower_bound (specdecode.ragged); None: no drafts
    draft_tokens: float | None = None  # Δ draft tokens (x = draft_tokens / request-steps)
    missing_ratio: float = 0.0  # share of k x drafts positions never drafted (specdecode.ragged)

    @classmethod
    def of(cls, upstream: str, key: tuple[str, str], window: str, der: _Derived | None, step: StepTimes | None,
           running: float, k: int = 0) -> "_CostInputs":
        """The inputs of one (upstream, key, window) from its derivation (``der`` None: no
        spec-decode counters, so no curve and no drafts); ``k``: the server's num_speculative_tokens."""
        if der is None:
            return cls(upstream, key, window, (), None, step, running, k)
        c, w = der.counters, der.width
        return cls(upstream, key, window, der.values.position_acceptance_rates, c.drafts, step, running, k,
                   w.basis if w else None, c.draft_tokens, w.missing_ratio if w else 0.0)


#: The speedups (and their interval ends) a server can show: one outside came from values no server
#: gives (an ITL sum of 1.7e308, a baseline's of 1e-304), and the upstream's derived series are left out.
SPEEDUP_RANGE = (1e-6, 1e6)


def _checked_answer(rates: tuple[float, ...], cost: LiveCost, k: int):
    """:func:`specwatch.specdecode.speedup.answer`; raises ValueError when one of its numbers is not
    finite (the upstream's derived series are then left out: :meth:`SpecwatchCollector._costs_of`)."""
    ans = answer(rates, cost, k)
    nums: list[float | None] = []
    for v in ans.speedups.values():
        nums += [v.value, v.lower, v.upper]
    if ans.drift is not None:
        nums += [ans.drift.ratio, ans.drift.predicted_seconds]
    p = ans.decision
    if p is not None and p.versus_runner_up is not None:
        nums += [p.versus_runner_up.value, p.versus_runner_up.lower, p.versus_runner_up.upper]
    bad = [x for x in nums if x is not None and not math.isfinite(x)]
    if bad:
        raise ValueError(f"a derived value is not finite ({bad[0]!r})")
    lo, hi = SPEEDUP_RANGE
    odd = [x for v in ans.speedups.values() for x in (v.value, v.lower, v.upper) if x is not None and not lo <= x <= hi]
    if odd:
        raise ValueError(f"a speedup of {odd[0]:.3g} is outside {lo:g}-{hi:g}: the values it came from are not a server's")
    return ans


def _step_of(wv: WindowValues) -> StepTimes | None:
    """The window's :class:`StepTimes` (computed once, by :func:`specwatch.specdecode.steptime.step_times_of`)."""
    return None if wv.step is None else wv.step.times


def _add_profile(f: "_Families", profile: CostProfile | None, drafters: tuple[tuple[str | None, str], ...] = ()) -> None:
    """The configured cost profile: its provenance (info) and its measured step times. With
    ``drafters`` ((method, drafter) the upstreams state), the info has one series per drafter with
    ``drafter`` (as stated) and ``drafter_match``: how the profile's curve was found for it
    (:meth:`specwatch.specdecode.costprofile.CostProfile.match_drafter`: exact,
    last_path_component, none)."""
    if profile is None:
        return
    p = profile.provenance
    info = [profile.name, str(p.get("source", "")), str(p.get("hardware", "")), str(p.get("model", "")),
            str(p.get("served_model_name") or ""), str(p.get("vllm_version") or ""),
            "true" if profile.forward_only else "false"]
    if drafters:
        f.profile_info = PROFILE_INFO_BY_DRAFTER.family()
        for d in dict.fromkeys((d, profile.match_drafter(m, d)[1]) for m, d in drafters):
            f.profile_info.add_metric(info + list(d), 1.0)
    else:
        f.profile_info.add_metric(info, 1.0)
    seen: set[tuple[str, ...]] = set()

    def step(labels: list[str], seconds: float) -> None:
        # one sample per label set: points that differ only in context or drafted tokens keep the first
        key = tuple(labels)
        if key not in seen:
            seen.add(key)
            f.profile_step.add_metric(labels, seconds)

    for pt in profile.plain:
        step(["none", "", "0", f"{pt.running_requests:g}", pt.workload or ""], pt.step_seconds)
    for c in profile.speculative:
        for pt in c.points:
            step([c.method, c.drafter or "", str(c.k), f"{pt.running_requests:g}", pt.workload or ""], pt.step_seconds)


#: What SGLang's /metrics cannot give, with the reason (specwatch_not_derivable).
_SGLANG_NOT_DERIVABLE = (
    ("specwatch_position_acceptance_rate", "sglang exports no per-position counters"),
    ("specwatch_expected_acceptance_length", "what-if E(k) needs per-position counters; sglang exports none"),
    ("specwatch_recommended_num_speculative_tokens", "needs the what-if E(k); sglang exports no per-position counters"),
    ("specwatch_speedup", "needs the what-if E(k); sglang exports no per-position counters"),
    ("specwatch_draft_acceptance_rate", "sglang exports no draft-token counter; see specwatch_sglang_spec_accept_rate (a gauge)"),
)


class _Families:
    """Fresh metric families for one scrape: one per row of :data:`specwatch.exporter.series.SERIES`
    (the attribute is the row's ``attr``; names and HELP texts are the exposed contract)."""

    def __init__(self) -> None:
        for row in SERIES:
            setattr(self, row.attr, row.family())

    def check_finite(self) -> None:
        """Raise ValueError naming the first sample whose value is not a finite number (one
        upstream's derived values: the caller leaves them all out)."""
        for fam in vars(self).values():
            for smp in fam.samples:
                if not math.isfinite(smp.value):
                    raise ValueError(f"{fam.name} is not finite ({smp.value!r})")

    def merge(self, other: "_Families") -> None:
        """Append ``other``'s samples (one upstream's, built apart so a failure drops them all);
        non-finite values are dropped: they are never exposed."""
        mine = vars(self)
        for attr, fam in vars(other).items():
            mine[attr].samples.extend(s for s in fam.samples if math.isfinite(s.value))

    def all(self) -> Iterator[Metric]:
        """Every family with samples (``specwatch_up`` and ``specwatch_build_info`` always); values
        that are non-finite or outside their family's range (the ``valid`` of its
        :data:`specwatch.exporter.series.SERIES` row) are not served (a value within 1e-6 relative
        of a bound is set to it: rounding in the upstream's text); what was dropped is logged, one
        line per upstream."""
        dropped: dict[str, list[str]] = {}
        for row in SERIES:
            fam, rng = getattr(self, row.attr), row.valid
            if rng is None:
                fam.samples = [s for s in fam.samples if math.isfinite(s.value)]
            else:
                fam.samples = _in_range(fam, rng, dropped)
            if fam.samples or fam.name in ("specwatch_up", "specwatch_build_info"):
                yield fam
        for upstream, what in dropped.items():
            log.warning("upstream %s: %d derived values outside their range not served (%s%s)", clip(upstream, 100),
                        len(what), "; ".join(what[:3]), "; …" if len(what) > 3 else "")


def _in_range(fam: Metric, rng: tuple[float, float], dropped: dict[str, list[str]]) -> list:
    lo, hi = rng
    keep = []
    for s in fam.samples:
        v = s.value
        if lo <= v <= hi:
            keep.append(s)
            continue
        if math.isfinite(v):
            tol = 1e-6 * max(1.0, abs(v))
            if lo - tol <= v < lo or hi < v <= hi + tol:
                keep.append(s._replace(value=lo if v < lo else hi))
                continue
            labels = ",".join(f"{k}={clip(x, 60)}" for k, x in sorted(s.labels.items()) if k != "upstream")
            dropped.setdefault(s.labels.get("upstream", ""), []).append(f"{fam.name}{{{labels}}} {v:g}")
    return keep
