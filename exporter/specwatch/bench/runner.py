"""Scheduling of a benchmark run and its Python API :func:`run_bench`.

A run is roles × workloads × concurrencies × batches. Roles: with ``baseline_url`` the whole run
is done against the baseline server first, then against the speculative one (never both at once:
on one machine they would share the CPU/GPU), or, with ``paired``, cell by cell in alternating
rounds (batch i on the baseline and on the speculative server back to back, the same seeded
prompts, ABBA order; both servers stay up, only one is loaded at a time); without it only ``base_url`` is run, with the role
``config.role`` (so a baseline and a speculative run made at different times — e.g. when only one
server fits at a time — can be compared with :func:`specwatch.bench.results.compare`).

Each (role, workload, concurrency) runs ``warmup_batches`` warm-up batches (recorded, flagged
``warmup``, excluded from summaries) then ``num_batches`` measured ones — or, with
``target_ci``, at least ``num_batches`` and more until the 95 % interval of the cell's throughput
(:func:`specwatch.bench.results.throughput_interval`) is within ``target_ci`` of its mean
(relative half width) or ``max_batches`` measured batches ran. A batch sends
``num_prompts`` requests (default: the concurrency) with at most ``concurrency`` in flight, all
at once or, with ``request_rate``, at Poisson arrival times (seeded). Around every batch the
server's ``/metrics`` is read and the spec-decode counter deltas are attached
(:mod:`specwatch.specdecode.metrics`, :mod:`specwatch.specdecode.derive`). Files are rewritten after every batch;
the optional greedy-output equivalence check runs at the end when both servers are given.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as _dt
import errno
import gc
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specwatch.bench.backend import DEFAULT_MAX_RESPONSE_BYTES, OpenAIBackend, RequestOutcome, normalize_base_url
from specwatch.bench.equivalence import check_equivalence
from specwatch.bench.metrics import BenchMetrics
from specwatch.bench.records import Equivalence
from specwatch.bench.results import BatchResult, CellSummary, ResultWriter, SpecDecodeStats, compare, summarize, throughput_interval
from specwatch.bench.workloads import (
    WORKLOADS,
    BenchRequest,
    ShareGPTItem,
    WorkloadError,
    WorkloadOptions,
    build_requests,
    load_sharegpt,
)
from specwatch.specdecode.decision import paired_ratio
from specwatch.specdecode.derive import counters_delta, sum_counters
from specwatch.specdecode.metrics import MetricsParseError, StepCounters, UpstreamSnapshot, parse_metrics
from specwatch.specdecode.steptime import delta_between

ROLES = ("baseline", "speculative")


class BenchConfigError(ValueError):
    """The run configuration is invalid (the message names the field)."""


@dataclass(frozen=True)
class BenchConfig:
    """Everything a run needs; validated on construction (raises :class:`BenchConfigError`).

    URLs are server roots (``/v1`` tolerated). ``model`` / ``served_model_name``: the request's
    ``model`` field is ``served_model_name or model``; when both are None the first id of the
    server's ``/v1/models`` is used. ``num_prompts``: requests per batch (None = concurrency).
    ``request_rate``: requests/s (``inf`` = all at once). ``api_key`` is never written anywhere.
    ``result_dir`` / ``result_filename``: JSON path (the CSV sits beside it, ``.csv``); default
    name ``specwatch-bench-<YYYYmmdd-HHMMSS>.json``, made unique (``-2``, ``-3``, … suffixes,
    reserved by exclusive creation) so runs started in the same second never overwrite each
    other; an explicit ``result_filename`` that exists is overwritten. ``metrics_port``: serve
    ``specwatch_bench_*`` there; ``metrics_linger``: seconds to keep serving them after a
    completed run, so a scraper with a long interval still reads the last batch's values (a short
    run can otherwise end between two scrapes). ``timeout``: seconds a whole request may take (total);
    ``read_timeout``: seconds without any byte from the server before a request fails (stall
    detector); ``max_response_bytes``: bytes one streamed response may have before the request
    is failed (memory cap).
    """

    base_url: str
    baseline_url: str | None = None
    role: str = "speculative"
    model: str | None = None
    served_model_name: str | None = None
    workloads: tuple[str, ...] = ("copy",)
    concurrencies: tuple[int, ...] = (1,)
    num_prompts: int | None = None
    num_batches: int = 3
    warmup_batches: int = 1
    request_rate: float = math.inf
    options: WorkloadOptions = field(default_factory=WorkloadOptions)
    api_key: str | None = field(default=None, repr=False)
    metrics_port: int | None = None
    metrics_linger: float = 0.0
    equivalence: bool = True
    equivalence_output_len: int = 128
    save_result: bool = True
    result_dir: str = "."
    result_filename: str | None = None
    metrics_url: str | None = None
    baseline_metrics_url: str | None = None
    timeout: float = 3600.0
    read_timeout: float = 300.0
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    progress: bool = True
    #: Noise-aware cells: repeat measured batches (beyond num_batches) until the 95 % interval of
    #: the cell's throughput has a relative half width <= target_ci, or max_batches ran. None: fixed.
    target_ci: float | None = None
    max_batches: int | None = None
    #: Paired rounds (needs ``baseline_url``, both servers up): every cell alternates the two
    #: servers batch by batch on the same prompts (warm-ups baseline first, then measured pairs in
    #: ABBA order: baseline, speculative, speculative, baseline, …); ``target_ci`` applies to the
    #: paired ratio's interval. False: the whole run on the baseline, then on the speculative server.
    paired: bool = False
    #: vLLM's ``cache_salt`` (1-1024 printable characters) sent with every request of the run, or
    #: None: its prefix-cache blocks are hashed apart from every other salt's, so prompts a server
    #: served under another salt (an earlier sweep configuration's cells) are not prefix-cache hits.
    #: The paired sweep gives each speculative configuration its own salt on both servers.
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        self._check_servers()
        self._check_workloads()
        self._check_batches()
        self._check_limits()

    def _check_servers(self) -> None:
        """Validation step: the server URLs, the role, and a baseline for a paired run."""
        for name in ("base_url", "baseline_url"):
            url = getattr(self, name)
            if url is None:
                continue
            try:
                normalize_base_url(url)
            except ValueError as exc:
                raise BenchConfigError(f"{name}: {exc}") from None
        if self.role not in ROLES:
            raise BenchConfigError(f"role must be one of {ROLES}, got {self.role!r}")
        if self.paired and not self.baseline_url:
            raise BenchConfigError("paired: needs a baseline server beside the speculative one (--baseline-url)")
        salt = self.cache_salt
        if salt is not None and not (0 < len(salt) <= 1024 and salt.isprintable()):
            raise BenchConfigError("cache_salt must be 1-1024 printable characters")

    def _check_workloads(self) -> None:
        """Validation step: the workloads (known, with a dataset for sharegpt) and the concurrencies."""
        if not self.workloads:
            raise BenchConfigError("at least one workload is needed")
        unknown = [w for w in self.workloads if w not in WORKLOADS]
        if unknown:
            raise BenchConfigError(f"unknown workload(s) {unknown}; choose from {', '.join(WORKLOADS)}")
        if "sharegpt" in self.workloads and not self.options.dataset_path:
            raise BenchConfigError("the sharegpt workload needs a dataset path (--dataset-path)")
        if not self.concurrencies or any(c < 1 for c in self.concurrencies):
            raise BenchConfigError(f"concurrencies must be >= 1, got {self.concurrencies}")

    def _check_batches(self) -> None:
        """Validation step: prompts per batch, batch counts, the interval target and the warm-ups."""
        if self.num_prompts is not None and self.num_prompts < 1:
            raise BenchConfigError(f"num_prompts must be >= 1, got {self.num_prompts}")
        if self.num_batches < 1:
            raise BenchConfigError(f"num_batches must be >= 1, got {self.num_batches}")
        if self.target_ci is not None and not (0.0 < self.target_ci < 1.0):
            raise BenchConfigError(f"target_ci must be in (0, 1), got {self.target_ci}")
        if self.max_batches is not None and self.max_batches < self.num_batches:
            raise BenchConfigError(f"max_batches ({self.max_batches}) must be >= num_batches ({self.num_batches})")
        if self.warmup_batches < 0:
            raise BenchConfigError(f"warmup_batches must be >= 0, got {self.warmup_batches}")

    def _check_limits(self) -> None:
        """Validation step: request rate, equivalence length, time limits and the response cap."""
        if not (self.request_rate > 0):
            raise BenchConfigError(f"request_rate must be > 0 (or inf), got {self.request_rate}")
        if self.equivalence_output_len < 1:
            raise BenchConfigError(f"equivalence_output_len must be >= 1, got {self.equivalence_output_len}")
        if not (self.timeout > 0):
            raise BenchConfigError(f"timeout must be > 0, got {self.timeout}")
        if not (self.read_timeout > 0):
            raise BenchConfigError(f"read_timeout must be > 0, got {self.read_timeout}")
        if self.max_response_bytes < 1:
            raise BenchConfigError(f"max_response_bytes must be >= 1, got {self.max_response_bytes}")

    @property
    def targets(self) -> list[tuple[str, str, str | None]]:
        """(role, base_url, metrics_url) in run order: baseline first."""
        if self.baseline_url:
            return [("baseline", self.baseline_url, self.baseline_metrics_url),
                    ("speculative", self.base_url, self.metrics_url)]
        return [(self.role, self.base_url, self.metrics_url)]

    def public_dict(self) -> dict[str, Any]:
        """The config as written to result files: no API key (only whether one was set)."""
        d = asdict(self)
        d.pop("api_key", None)
        if not d["paired"]:  # written only for a paired run: files of other runs keep their bytes
            d.pop("paired")
        d["api_key_set"] = self.api_key is not None
        d["request_rate"] = "inf" if math.isinf(self.request_rate) else self.request_rate
        d["workloads"] = list(self.workloads)
        d["concurrencies"] = list(self.concurrencies)
        return d

    def result_paths(self, date: str) -> tuple[Path, Path]:
        """(json_path, csv_path) for a run started at ``date`` (``YYYYmmdd-HHMMSS``), before
        de-duplication (see :meth:`claim_result_paths`)."""
        name = self.result_filename or f"specwatch-bench-{date}.json"
        p = Path(self.result_dir) / name
        if p.suffix != ".json":
            p = p.with_name(p.name + ".json")
        return p, p.with_suffix(".csv")

    def claim_result_paths(self, date: str) -> tuple[Path, Path]:
        """(json_path, csv_path) to write this run's results to.

        With an explicit ``result_filename`` that is :meth:`result_paths` (an existing file is
        overwritten). Otherwise the default name gets a ``-2``, ``-3``, … suffix until neither
        the JSON nor the CSV exists, and the JSON is created empty with exclusive creation
        (``open(..., "x")``), so two runs started in the same second (even in two processes)
        get different files. The result directory is created when missing (like
        ``vllm bench serve --result-dir``). Raises OSError when it cannot be created or written.
        """
        json_path, csv_path = self.result_paths(date)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(json_path.parent, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "directory not writable", str(json_path.parent))
        if self.result_filename:
            return json_path, csv_path
        stem = json_path.stem
        for n in range(1, 10_000):
            p = json_path if n == 1 else json_path.with_name(f"{stem}-{n}.json")
            if p.with_suffix(".csv").exists():
                continue
            try:
                with open(p, "x"):
                    pass
            except FileExistsError:
                continue
            return p, p.with_suffix(".csv")
        raise OSError(f"no free result file name for {json_path} in {self.result_dir}")


@dataclass
class RunResult:
    """What a run produced so far. ``status``: "complete" | "interrupted" | "running" |
    "failed" (``error`` then says why, e.g. the server was unreachable at start).
    ``batches`` in run order (warm-ups included, flagged); ``equivalence``: the greedy-output
    check's record (:func:`specwatch.bench.equivalence.check_equivalence`), or None."""

    config: BenchConfig
    status: str = "running"
    batches: list[BatchResult] = field(default_factory=list)
    equivalence: Equivalence | None = None
    json_path: Path | None = None
    csv_path: Path | None = None
    started_at: str = ""
    error: str | None = None

    def summary(self) -> list[CellSummary]:
        """Measured batches pooled per (role, workload, concurrency)."""
        return summarize(self.batches)

    def comparison(self) -> list[dict[str, Any]]:
        """Baseline-vs-speculative rows as the result file holds them (:class:`specwatch.bench.records.ComparisonRow`'s
        ``to_json``; empty unless both roles ran)."""
        return [r.to_json() for r in compare(self.summary())]

    def request_counts(self) -> tuple[int, int]:
        """(failed, total) requests of the measured (non-warm-up) batches."""
        measured = [b for b in self.batches if not b.warmup]
        return sum(b.failed for b in measured), sum(b.num_prompts for b in measured)

    def batch_counts(self) -> tuple[int, int]:
        """(measured, warm-up) batches finished so far."""
        warm = sum(1 for b in self.batches if b.warmup)
        return len(self.batches) - warm, warm


class BenchInterrupted(KeyboardInterrupt):
    """Raised by :func:`run_bench` on Ctrl-C after the files were updated; ``.result`` holds
    every finished batch (status "interrupted")."""

    def __init__(self, result: RunResult) -> None:
        super().__init__("benchmark interrupted")
        self.result = result


# ------------------------------------------------------------------------------------------


def _model_filter(snap: UpstreamSnapshot, model: str | None) -> str | None:
    names = {k[0] for k in snap.counters}
    return model if model in names else None


@dataclass(frozen=True)
class _Scrape:
    """One read of a server's /metrics: spec-decode snapshot and engine step counters."""

    snapshot: UpstreamSnapshot | None
    error: str | None

    @property
    def steps(self) -> dict[tuple[str, str], StepCounters] | None:
        return None if self.snapshot is None else self.snapshot.steps


async def _scrape(backend: OpenAIBackend) -> _Scrape:
    try:
        return _Scrape(parse_metrics(await backend.fetch_metrics()), None)
    except (RuntimeError, MetricsParseError) as exc:
        return _Scrape(None, str(exc))


def spec_stats(before: UpstreamSnapshot | None, after: UpstreamSnapshot | None, model: str | None,
               error: str | None = None) -> SpecDecodeStats:
    """Spec-decode counter delta between two /metrics snapshots of one server, summed over
    engines (of ``model`` when the server labels it, else of all models), as
    ``vllm bench serve`` does. V0 counters are not differenced (they are broken upstream)."""
    if before is None or after is None:
        return SpecDecodeStats(None if after is None else after.schema, None, error or "metrics not read")
    schema = after.schema
    if schema not in ("v1", "v1-early", "llamacpp") or before.schema != schema:
        return SpecDecodeStats(schema, None, None)
    b = sum_counters(before.counters.values(), _model_filter(before, model))
    a = sum_counters(after.counters.values(), _model_filter(after, model))
    if a is None or b is None:
        return SpecDecodeStats(schema, None, "no spec-decode counters for the model")
    return SpecDecodeStats(schema, counters_delta(b, a), None)


async def _dispatch(backend: OpenAIBackend, requests: Sequence[BenchRequest], concurrency: int,
                    request_rate: float, arrival_seed: str,
                    on_start: Callable[[], None], on_done: Callable[[RequestOutcome], None]) -> list[RequestOutcome]:
    outcomes: list[RequestOutcome | None] = [None] * len(requests)

    async def one(i: int) -> None:
        on_start()
        o = await backend.send(requests[i])
        outcomes[i] = o
        on_done(o)

    if math.isinf(request_rate):
        it = iter(range(len(requests)))

        async def worker() -> None:
            for i in it:  # shared iterator: each index taken by exactly one worker
                await one(i)

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
    else:
        rng = random.Random(arrival_seed)
        sem = asyncio.Semaphore(concurrency)

        async def limited(i: int) -> None:
            async with sem:
                await one(i)

        tasks = []
        for i in range(len(requests)):
            if i:
                await asyncio.sleep(rng.expovariate(request_rate))
            tasks.append(asyncio.ensure_future(limited(i)))
        await asyncio.gather(*tasks)
    return [o for o in outcomes if o is not None]


def _aggregate(role: str, workload: str, concurrency: int, index: int, warmup: bool, started_at: str,
               duration: float, outcomes: Sequence[RequestOutcome], request_rate: float,
               spec: SpecDecodeStats) -> BatchResult:
    ok = [o for o in outcomes if o.success]
    bad = [o for o in outcomes if not o.success]
    return BatchResult(
        role=role, workload=workload, max_concurrency=concurrency, batch_index=index, warmup=warmup,
        started_at=started_at, duration=duration, num_prompts=len(outcomes),
        completed=len(ok), failed=len(bad),
        total_input_tokens=sum(o.prompt_tokens or 0 for o in ok),
        total_output_tokens=sum(o.output_tokens for o in ok),
        output_tokens_from_usage=bool(ok) and all(o.tokens_from_usage for o in ok),
        request_rate=None if math.isinf(request_rate) else request_rate,
        spec=spec,
        errors=[{"index": o.index, "error": o.error} for o in bad],
        ttfts=[o.ttft for o in ok if o.ttft is not None],
        tpots=[t for t in (o.tpot for o in ok) if t is not None],
        itls=[g for o in ok for g in o.itl],
        e2els=[o.latency for o in ok],
        spec_requests=[(o.spec_decode, {"index": o.index, "batch_index": index, "success": o.success,
                                        "n": o.num_choices, "output_tokens": o.output_tokens,
                                        "prompt_excerpt": o.prompt_excerpt}) for o in outcomes],
    )


def paired_relative_half_width(base: Sequence[float], spec: Sequence[float]) -> float:
    """The relative half width of the 95 % interval of the paired ratio spec / baseline of
    per-batch throughputs (tok/s, pair order): exp(t(n−1) · sd(log r) / √n) − 1
    (:func:`specwatch.specdecode.decision.paired_ratio`); ``inf`` with fewer than two usable
    pairs (a batch with no output throughput cannot be paired)."""
    pairs = [(s_, b_) for s_, b_ in zip(spec, base, strict=False) if s_ > 0 and b_ > 0]
    if len(pairs) < 2:
        return math.inf
    r = paired_ratio([p[0] for p in pairs], [p[1] for p in pairs])
    return r.upper / r.value - 1.0


#: The settle batches serve this workload's prompts of batch :data:`SETTLE_BATCH`: seeded random
#: words, which share no prefix with any workload's measured prompts (copy rotates six texts: a
#: settle batch of copy prompts would put a measured batch's texts in vLLM's prefix cache, as it
#: did in the 2026-12-04 23:47 sweep, batches 3 and 4 at c = 1: TTFT 100 against 370 ms).
SETTLE_WORKLOAD = "random-output"
SETTLE_BATCH = 1_000_000


def settle_requests(n: int, options: WorkloadOptions) -> list[BenchRequest]:
    """The unmeasured batch that settles a server before a measured batch in the paired schedule:
    ``n`` requests (the batch's size) of :data:`SETTLE_WORKLOAD` batch :data:`SETTLE_BATCH` with
    the run's output length, prompts that no measured batch serves nor shares a prefix with (so
    each measured batch's prompts stay as fresh as in a sequential cell), sent at the batch's
    concurrency and recorded nowhere."""
    return build_requests(SETTLE_WORKLOAD, n, options, batch=SETTLE_BATCH)


async def _run_paired(config: BenchConfig, one_batch, batch_label, need_more_paired, settle=None) -> None:
    """The paired schedule (``config.paired``): per (workload, concurrency), the warm-up batches on
    the baseline then on the speculative server, then measured pairs, batch i of both serving the
    same seeded prompts, in ABBA order (pair 0: baseline first; pair 1: speculative first; …) so a
    drift of the host weighs on both sides alike, until :func:`need_more_paired` is satisfied.

    ``settle(role, wl, conc)``: awaited before a measured batch on a server that did not serve
    the batch before it (:func:`settle_requests`: a batch of load, unmeasured). A server that sat
    idle while the other one ran is slower on its next batch than one that just ran, for the
    whole batch (its steps too, not just the first request): in the paired sweeps of 2026-12-04
    (docs/results.md) the speculative server's batches right after its own ran 7-9 % faster on
    average, up to 30 % on copy at k = 4 (step 36.7 against 46.8 ms), and an 8-token request
    before the batch did not remove it. ABBA leaves one side warm in 2 pairs of 4 and the other
    in 1, an alternating term in the per-pair ratio (an interval wider than its noise) and a
    bias; sequential cells never idle between their batches. With the settle batch every
    measured batch follows a batch on its own server, as in a sequential cell.
    """
    last: str | None = None
    for wl in config.workloads:
        for conc in config.concurrencies:
            for b in range(config.warmup_batches):
                for role in ("baseline", "speculative"):
                    await one_batch(role, wl, conc, b, True, batch_label(role, wl, conc, b, True))
                    last = role
            base: list[float] = []
            spec: list[float] = []
            failed = False
            b = config.warmup_batches - 1
            while need_more_paired(base, spec, failed):
                b += 1
                pair = b - config.warmup_batches
                order = ("baseline", "speculative") if pair % 2 == 0 else ("speculative", "baseline")
                got = {}
                for role in order:
                    if settle is not None and last != role:
                        await settle(role, wl, conc)
                    got[role] = await one_batch(role, wl, conc, b, False, batch_label(role, wl, conc, b, False))
                    last = role
                base.append(got["baseline"].output_throughput)
                spec.append(got["speculative"].output_throughput)
                failed = failed or bool(got["baseline"].failed or got["speculative"].failed)


def _batch_line(label: str, b: BatchResult) -> str:
    rate = b.spec.acceptance_rate
    acc = "" if rate is None else f", acceptance {rate * 100:.1f} %"
    fail = f", [red]{b.failed} failed[/red]" if b.failed else ""
    return f"{label}: {b.output_throughput:.1f} tok/s, {b.completed} ok{fail}{acc}"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _open_writer(config: BenchConfig, res: RunResult) -> ResultWriter | None:
    """Step 1 of a run: claim the result files' paths and open their writer (None without ``save_result``)."""
    if not config.save_result:
        return None
    date = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        res.json_path, res.csv_path = config.claim_result_paths(date)
        return ResultWriter(res.json_path, res.csv_path, config.public_dict())
    except OSError as exc:
        raise RuntimeError(f"cannot write result files in {config.result_dir!r} (--result-dir / --result-filename): "
                           f"{exc.strerror or exc}") from None


class _BenchRun:
    """One run while it runs: its result and files, the load generator's metrics, the progress
    bar, the servers' backends; the steps of :func:`run_bench_async` are its methods."""

    def __init__(self, config: BenchConfig, res: RunResult, writer: ResultWriter | None) -> None:
        self.config = config
        self.res = res
        self.writer = writer
        self.sharegpt: list[ShareGPTItem] | None = None
        self.bm: BenchMetrics | None = None
        self.served_here = False
        self.progress: Progress | None = None
        self.backends: dict[str, OpenAIBackend] = {}
        self.froze = False
        self.max_measured = (config.num_batches if config.target_ci is None
                             else (config.max_batches or config.num_batches))

    def save(self) -> None:
        """Rewrite the result files with every batch so far (nothing without a writer)."""
        if self.writer is not None:
            res = self.res
            self.writer.write(res.batches, res.status, res.equivalence, res.started_at, error=res.error)

    def fail(self, exc: BaseException) -> None:
        """Record a failed run (status and error) in the files, keeping ``exc`` the error raised."""
        self.res.status = "failed"
        self.res.error = str(exc) or type(exc).__name__
        with contextlib.suppress(OSError):  # the original error matters more
            self.save()

    def prepare(self, metrics: BenchMetrics | None) -> None:
        """Step 2: load the ShareGPT dataset when a workload needs it, and the metrics to update
        (``metrics``, or new ones served on ``metrics_port``); a failure is recorded, then raised."""
        config = self.config
        self.bm = metrics
        try:
            if "sharegpt" in config.workloads:
                self.sharegpt = load_sharegpt(config.options.dataset_path or "")
            if self.bm is None:
                self.bm = BenchMetrics()
                if config.metrics_port is not None:
                    try:
                        self.bm.serve(config.metrics_port)
                    except OSError as exc:
                        raise RuntimeError(f"--metrics-port {config.metrics_port}: cannot listen: "
                                           f"{exc.strerror or exc}") from None
                    self.served_here = True
        except Exception as exc:
            self.fail(exc)
            raise

    def start_progress(self) -> None:
        """Step 3: start the progress bar (with ``config.progress``)."""
        if self.config.progress:
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), transient=False)
            self.progress.start()

    async def connect(self) -> None:
        """Step 4: open a backend per server, in run order, and settle the model id each request names."""
        config = self.config
        for role, url, murl in config.targets:
            backend = OpenAIBackend(url, None, api_key=config.api_key, timeout=config.timeout,
                                    read_timeout=config.read_timeout, metrics_url=murl,
                                    max_response_bytes=config.max_response_bytes, cache_salt=config.cache_salt)
            await backend.__aenter__()
            self.backends[role] = backend
            backend.model = config.served_model_name or config.model or await backend.first_model()

    def need_more(self, measured: list[float], failed: bool) -> bool:
        """True while a noise-aware cell must run another measured batch (never beyond the minimum
        once a measured batch had failed requests: the cell is not a measurement then)."""
        config = self.config
        if len(measured) < config.num_batches:
            return True
        if config.target_ci is None or len(measured) >= self.max_measured or failed:
            return False
        rel = throughput_interval(measured).relative_half_width
        return rel is None or rel > config.target_ci

    def need_more_paired(self, base: list[float], spec: list[float], failed: bool) -> bool:
        """As :meth:`need_more`, on the paired ratio spec / baseline of the measured pairs: its 95 %
        interval's relative half width, exp(t(n−1) · sd(log r) / √n) − 1, against ``target_ci``."""
        config = self.config
        if len(spec) < config.num_batches:
            return True
        if config.target_ci is None or len(spec) >= self.max_measured or failed:
            return False
        return paired_relative_half_width(base, spec) > config.target_ci

    def batch_label(self, role: str, wl: str, conc: int, b: int, warm: bool) -> str:
        """The progress bar's and console's name of batch ``b`` of (wl, conc) on ``role``."""
        config = self.config
        return f"{role} {wl} c={conc} " + (f"warm-up {b + 1}" if warm else
                                             f"batch {b - config.warmup_batches + 1}/"
                                             + (str(config.num_batches) if config.target_ci is None
                                                else f"{config.num_batches}-{self.max_measured}"))

    async def one_batch(self, role: str, wl: str, conc: int, b: int, warm: bool, label: str) -> BatchResult:
        """Run batch ``b`` of (wl, conc) on ``role``'s server: build its seeded requests, scrape
        /metrics around it, record and save it."""
        config, bm, progress = self.config, self.bm, self.progress
        assert bm is not None
        n = config.num_prompts or conc
        backend = self.backends[role]
        bm.set_active(role, wl, conc)
        cell = bm.cell(role, wl, conc)
        reqs = build_requests(wl, n, config.options, batch=b, sharegpt_items=self.sharegpt)
        task_id = None
        if progress is not None:
            task_id = progress.add_task(label, total=len(reqs))

        def on_done(o: RequestOutcome, _cell=cell, _tid=task_id) -> None:
            bm.request_finished(_cell, o)
            if progress is not None:
                progress.advance(_tid)

        before = await _scrape(backend)
        # As vllm bench serve does: no GC pauses over long-lived objects. What an
        # earlier batch froze stays frozen until the run ends, so this collect
        # walks only what is new since then, not the whole heap every batch.
        gc.collect()
        gc.freeze()
        self.froze = True
        started = _now()
        t0 = time.perf_counter()
        outcomes = await _dispatch(backend, reqs, conc, config.request_rate,
                                   f"{config.options.seed}:{wl}:{conc}:{b}:arrivals",
                                   lambda _c=cell: bm.request_started(_c), on_done)
        duration = time.perf_counter() - t0
        after = await _scrape(backend)
        spec = spec_stats(before.snapshot, after.snapshot, backend.model, before.error or after.error)
        spec = dataclasses.replace(spec, steps=delta_between(before.steps, after.steps, backend.model))
        batch = _aggregate(role, wl, conc, b, warm, started, duration, outcomes, config.request_rate, spec)
        bm.observe_itls(cell, batch.itls)
        self.res.batches.append(batch)
        self.save()
        if progress is not None:
            progress.remove_task(task_id)
            progress.console.print(_batch_line(label, batch))
        if not warm:
            bm.batch_finished(role, wl, conc, batch.output_throughput, spec.acceptance_rate)
        return batch

    async def settle(self, role: str, wl: str, conc: int) -> None:
        """One unmeasured batch on ``role``'s server before a measured batch of ``wl``
        (:func:`settle_requests`: the same size and concurrency, other prompts)."""
        reqs = settle_requests(self.config.num_prompts or conc, self.config.options)
        await _dispatch(self.backends[role], reqs, conc, math.inf, "settle", lambda: None, lambda _o: None)

    async def run_cell(self, role: str, wl: str, conc: int) -> None:
        """One cell of the sequential schedule: its warm-up batches, then measured ones until
        :meth:`need_more` is satisfied."""
        config = self.config
        measured_thr: list[float] = []
        measured_failed = False
        b = -1
        while b + 1 < config.warmup_batches or self.need_more(measured_thr, measured_failed):
            b += 1
            warm = b < config.warmup_batches
            batch = await self.one_batch(role, wl, conc, b, warm, self.batch_label(role, wl, conc, b, warm))
            if not warm:
                measured_thr.append(batch.output_throughput)
                measured_failed = measured_failed or bool(batch.failed)

    async def run_batches(self) -> None:
        """Step 5: the measured batches, paired (:func:`_run_paired`) or the whole run on each
        server in turn, cell by cell."""
        config = self.config
        if config.paired:
            await _run_paired(config, self.one_batch, self.batch_label, self.need_more_paired, self.settle)
            return
        for role, _url, _murl in config.targets:
            for wl in config.workloads:
                for conc in config.concurrencies:
                    await self.run_cell(role, wl, conc)

    async def check_equivalence(self) -> None:
        """Step 6: the greedy-output equivalence check, when asked for and both servers ran."""
        config = self.config
        if config.equivalence and config.baseline_url:
            self.res.equivalence = await check_equivalence(
                self.backends["baseline"], self.backends["speculative"], output_len=config.equivalence_output_len,
                seed=config.options.seed)

    async def close(self) -> None:
        """Last step, always: unfreeze the heap, stop the progress bar, close the backends, and stop
        serving the metrics (after ``metrics_linger`` when the run completed)."""
        if self.froze:
            gc.unfreeze()
        assert self.bm is not None
        self.bm.clear_active()
        if self.progress is not None:
            self.progress.stop()
        for be in self.backends.values():
            await be.__aexit__(None, None, None)
        if self.served_here:
            try:
                if self.res.status == "complete" and self.config.metrics_linger > 0:
                    await asyncio.sleep(self.config.metrics_linger)  # results are saved; Ctrl-C here only cuts the wait
            finally:
                self.bm.shutdown()


async def run_bench_async(config: BenchConfig, *, metrics: BenchMetrics | None = None,
                          result: RunResult | None = None) -> RunResult:
    """Run the benchmark on the current event loop; see the module docstring.

    ``metrics``: an existing :class:`BenchMetrics` to update (else one is created and, if
    ``config.metrics_port`` is set, served for the run's duration). ``result``: a RunResult to fill
    (lets a caller keep the partial result when the run is cancelled). Request failures are
    recorded in the batches; raises only for problems found at start (unreadable dataset, no
    model id obtainable — server unreachable, HTTP error on ``/v1/models`` —, metrics port taken),
    after writing the files with status "failed" and the error, and re-raises cancellation
    after writing the files with status "interrupted".
    """
    res = result if result is not None else RunResult(config)
    res.config = config
    res.started_at = _now()
    run = _BenchRun(config, res, _open_writer(config, res))
    run.prepare(metrics)
    run.start_progress()
    try:
        run.save()
        await run.connect()
        await run.run_batches()
        await run.check_equivalence()
        res.status = "complete"
        run.save()
        return res
    except asyncio.CancelledError:
        res.status = "interrupted"
        run.save()
        raise
    except Exception as exc:
        run.fail(exc)
        raise
    finally:
        await run.close()


def _run(coro: Any) -> Any:
    try:
        # Optional: uvloop is not a dependency; the default asyncio loop is used without it.
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def run_bench(config: BenchConfig, *, metrics: BenchMetrics | None = None, result: RunResult | None = None) -> RunResult:
    """Run a benchmark to completion (blocking; starts its own event loop) and return the result.
    ``result``: a RunResult to fill (its ``json_path`` names the files written, also when the run
    fails at start).

    Raises :class:`BenchInterrupted` (a KeyboardInterrupt carrying the partial result) on Ctrl-C,
    after the result files were rewritten with status "interrupted";
    :class:`BenchConfigError`/:class:`specwatch.bench.workloads.WorkloadError`/RuntimeError for
    start-up problems (see :func:`run_bench_async`).
    """
    res = result if result is not None else RunResult(config)
    try:
        return _run(run_bench_async(config, metrics=metrics, result=res))
    except (KeyboardInterrupt, asyncio.CancelledError):
        if res.status != "complete":  # a Ctrl-C during --metrics-linger leaves a complete run complete
            res.status = "interrupted"
        raise BenchInterrupted(res) from None


__all__ = [
    "BenchConfig", "BenchConfigError", "BenchInterrupted", "RunResult", "run_bench", "run_bench_async",
    "spec_stats", "WorkloadError",
]
