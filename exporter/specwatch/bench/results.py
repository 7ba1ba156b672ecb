"""Metrics of a benchmark run: per-batch and per-cell results, JSON/CSV files, console tables.

The values are computed here and handed to the records of :mod:`specwatch.bench.records`
(:meth:`BatchResult.to_record`, :meth:`CellSummary.to_record`, :func:`compare`), which alone know
the files' keys and units; :class:`ResultWriter` writes a :class:`~specwatch.bench.records.BenchResult`'s
``to_json`` and the CSV rows of :func:`specwatch.bench.records.csv_row`. The file's field names
follow ``vllm bench serve``'s result JSON where the meaning is the same
(``completed``, ``failed``, ``duration``, ``total_input_tokens``, ``total_output_tokens``,
``request_throughput``, ``output_throughput``, ``total_token_throughput``,
``mean_ttft_ms`` / ``median_ttft_ms`` / ``std_ttft_ms`` / ``p90_ttft_ms`` / ``p99_ttft_ms`` and the
same for ``tpot``, ``itl``, ``e2el``; ``spec_decode_acceptance_rate`` (percent, as vLLM reports it),
``spec_decode_acceptance_length``, ``spec_decode_num_drafts``, ``spec_decode_draft_tokens``,
``spec_decode_accepted_tokens``, ``spec_decode_per_position_acceptance_rates`` (0–1 each)).
Spec-decode values are computed from the difference of the server's ``vllm:spec_decode_*``
counters read before and after the batch (:mod:`specwatch.specdecode.metrics`,
:mod:`specwatch.specdecode.derive`); a value whose denominator is zero is ``null``. Latency statistics of a
batch with no successful request are ``null`` (vLLM prints 0).

specwatch's extras: ``spec_decode_curve_basis`` (``exact`` / ``lower_bound``: were the drafts full?
:mod:`specwatch.specdecode.ragged`) with ``spec_decode_missing_draft_tokens_ratio``, and
``spec_decode_per_request``: from vLLM's per-request ``metrics.speculative_decoding`` (a server
started with ``--per-request-spec-decode-metrics detailed``), the exact per-position curve, the
per-request acceptance distribution, draft lengths, outliers and bad payloads per reason
(:mod:`specwatch.bench.perrequest`; per batch only status, requests and problems). The CSV (one
row per batch) adds ``spec_decode_per_request_status``, ``spec_decode_per_request_problems``
("none" or "reason: n, …") and ``spec_decode_exact_per_position_acceptance_rates`` (the batch's
exact curve; curves are written as values joined by ``;``).

Files are rewritten atomically (temporary file + ``os.replace``) after every batch, so an
interrupted or crashed run leaves valid files holding every finished batch.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from rich.table import Table

from specwatch.bench import perrequest
from specwatch.bench.records import (BatchError, BenchBatch, BenchCell, BenchResult, ComparisonRow, Equivalence, PerRequest,
                                     ThroughputInterval, csv_row, csv_text, finite_or_none)
from specwatch.common.files import atomic_write_text
from specwatch.specdecode.decision import format_interval, format_ratio, paired_ratio, t975
from specwatch.specdecode.derive import derive, sum_counters
from specwatch.specdecode.metrics import SpecDecodeCounters, StepCounters
from specwatch.specdecode.ragged import draft_width
from specwatch.specdecode.steptime import step_times, sum_step_counters

#: Percentiles reported for every latency (besides mean, median and std).
PERCENTILES = (90, 99)
LATENCY_KINDS = ("ttft", "tpot", "itl", "e2el")
#: Errors kept per batch in the JSON (the count is always exact).
MAX_ERRORS_KEPT = 20


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile of an ascending sequence (numpy's default method, which
    ``vllm bench serve`` uses). Raises ValueError on an empty sequence."""
    if not sorted_values:
        raise ValueError("percentile of an empty sequence")
    pos = (len(sorted_values) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def latency_stats(kind: str, seconds: Iterable[float]) -> dict[str, float | None]:
    """``mean_<kind>_ms``, ``median_…``, ``std_…`` (population, as numpy), ``p90_…``, ``p99_…`` in
    milliseconds from values in seconds; all None when there are no values."""
    vals = sorted(seconds)
    keys = [f"mean_{kind}_ms", f"median_{kind}_ms", f"std_{kind}_ms"] + [f"p{p}_{kind}_ms" for p in PERCENTILES]
    if not vals:
        return dict.fromkeys(keys)
    out = {
        f"mean_{kind}_ms": statistics.fmean(vals) * 1000,
        f"median_{kind}_ms": percentile(vals, 50) * 1000,
        f"std_{kind}_ms": statistics.pstdev(vals) * 1000,
    }
    for p in PERCENTILES:
        out[f"p{p}_{kind}_ms"] = percentile(vals, p) * 1000
    return out


def _latency_fields(ttfts: Iterable[float], tpots: Iterable[float], itls: Iterable[float],
                    e2els: Iterable[float]) -> dict[str, float | None]:
    """:func:`latency_stats` of the four latencies (seconds) as record fields (ms)."""
    out: dict[str, float | None] = {}
    for kind, vals in zip(LATENCY_KINDS, (ttfts, tpots, itls, e2els), strict=True):
        out.update(latency_stats(kind, vals))
    return out


@dataclass(frozen=True)
class SpecDecodeStats:
    """Spec-decode values over one interval, from a counter delta (summed over engines).

    ``delta`` is None when the server exports no spec-decode counters (``schema`` "none", e.g. a
    baseline) or /metrics could not be read (``metrics_error`` says why).
    """

    schema: str | None
    delta: SpecDecodeCounters | None
    metrics_error: str | None = None
    #: Increase of the server's engine step counters over the interval (vLLM's ITL, iteration and
    #: first-token histograms; :mod:`specwatch.specdecode.steptime`), None when not exported.
    steps: StepCounters | None = None

    def fields(self) -> dict[str, Any]:
        """The spec-decode and server step values of the interval as record fields (field names of
        :class:`specwatch.bench.records.BenchBatch` / ``BenchCell``; the acceptance rate 0–1, the
        server step time in ms); every field None that the counters do not give."""
        t = None if self.steps is None else step_times(self.steps)
        f: dict[str, Any] = {
            "server_metrics_schema": self.schema, "metrics_error": self.metrics_error,
            "acceptance_rate": None, "acceptance_length": None, "num_drafts": None, "draft_tokens": None,
            "accepted_tokens": None, "per_position_acceptance_rates": None, "conditional_per_position_acceptance_rates": None,
            "num_speculative_tokens": None, "generation_tokens": None, "output_from_drafts_ratio": None,
            "curve_basis": None, "missing_draft_tokens_ratio": None,
            "server_step_duration_ms": None if t is None or t.step_duration_seconds is None else t.step_duration_seconds * 1000,
            "server_running_requests": None if t is None else t.running_requests_per_step,
            "server_request_decode_tokens_per_second": None if t is None else t.request_decode_tokens_per_second,
            "server_engine_steps": None if self.steps is None else self.steps.iteration_count,
            "server_request_steps": None if self.steps is None else self.steps.itl_count,
            "server_itl_sum_seconds": None if self.steps is None else self.steps.itl_sum,
        }
        d = self.delta
        if d is None:
            return f
        v = derive(d)
        f.update(
            acceptance_rate=v.draft_acceptance_rate,
            acceptance_length=v.mean_acceptance_length,
            num_drafts=None if d.drafts is None else int(round(d.drafts)),
            draft_tokens=int(round(d.draft_tokens)),
            accepted_tokens=int(round(d.accepted_tokens)),
            per_position_acceptance_rates=tuple(v.position_acceptance_rates),
            conditional_per_position_acceptance_rates=tuple(v.position_conditional_acceptance_rates),
            num_speculative_tokens=d.num_speculative_tokens,
            generation_tokens=None if d.generation_tokens is None else int(round(d.generation_tokens)),
            output_from_drafts_ratio=v.output_from_drafts_ratio,
        )
        width = draft_width(d)  # counter-based curve: exact, or a lower bound when drafts were ragged
        if width is not None:
            f.update(curve_basis=width.basis, missing_draft_tokens_ratio=width.missing_ratio)
        return f

    @property
    def acceptance_rate(self) -> float | None:
        """Draft acceptance rate 0–1 (Δaccepted / Δdraft_tokens), None if unknown."""
        return None if self.delta is None else derive(self.delta).draft_acceptance_rate

    @property
    def acceptance_length(self) -> float | None:
        """Mean acceptance length (1 + Δaccepted / Δdrafts), None if unknown."""
        return None if self.delta is None else derive(self.delta).mean_acceptance_length


@dataclass
class BatchResult:
    """One batch: requests of one workload at one concurrency against one server (role).

    Throughputs divide by ``duration`` (seconds from the first send to the last request's end).
    ``ttfts``/``tpots``/``itls``/``e2els`` (seconds, successful requests) are kept in memory for
    the pooled cell summary and not written per batch.
    """

    role: str
    workload: str
    max_concurrency: int
    batch_index: int
    warmup: bool
    started_at: str
    duration: float
    num_prompts: int
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    output_tokens_from_usage: bool
    request_rate: float | None
    spec: SpecDecodeStats
    errors: list[dict[str, Any]] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list, repr=False)
    tpots: list[float] = field(default_factory=list, repr=False)
    itls: list[float] = field(default_factory=list, repr=False)
    e2els: list[float] = field(default_factory=list, repr=False)
    #: (payload, context) per request for :mod:`specwatch.bench.perrequest` (vLLM's per-request
    #: ``metrics.speculative_decoding``; payload None when absent).
    spec_requests: list[tuple[Any, dict[str, Any]]] = field(default_factory=list, repr=False)

    @property
    def output_throughput(self) -> float:
        """Output tokens per second of the batch (``total_output_tokens / duration``)."""
        return self.total_output_tokens / self.duration if self.duration > 0 else 0.0

    def to_record(self) -> BenchBatch:
        """The batch's record (:class:`specwatch.bench.records.BenchBatch`: the JSON and CSV of the batch)."""
        d = self.duration
        pr = self.per_request()
        return BenchBatch(
            role=self.role, workload=self.workload, max_concurrency=self.max_concurrency, batch_index=self.batch_index,
            warmup=self.warmup, started_at=self.started_at,
            request_rate="inf" if self.request_rate is None else self.request_rate, num_prompts=self.num_prompts,
            duration=d, completed=self.completed, failed=self.failed, total_input_tokens=self.total_input_tokens,
            total_output_tokens=self.total_output_tokens, output_tokens_from_usage=self.output_tokens_from_usage,
            request_throughput=self.completed / d if d > 0 else 0.0, output_throughput=self.output_throughput,
            total_token_throughput=(self.total_input_tokens + self.total_output_tokens) / d if d > 0 else 0.0,
            **_latency_fields(self.ttfts, self.tpots, self.itls, self.e2els), **self.spec.fields(),
            per_request=None if pr is None else pr.for_batch(),
            errors=tuple(BatchError(**e) for e in self.errors[:MAX_ERRORS_KEPT]),
        )

    def per_request(self) -> PerRequest | None:
        """The batch's full per-request summary (:func:`per_request_record`; the JSON keeps only its
        status, requests and problems per batch, the CSV its exact curve)."""
        return per_request_record(self.spec, self.spec_requests)


#: Student's t 0.975 quantiles for 1 … 30 degrees of freedom (two-sided 95 % intervals).
def throughput_interval(per_batch: Sequence[float]) -> ThroughputInterval:
    """The 95 % interval of a cell's throughput (the mean of its measured batches' throughputs,
    tok/s): mean ± t₀.₉₇₅(n − 1) × stdev / √n over the n batches (Student's t; the batches are
    independent repeats of the same prompts' sizes), the lower end at least 0 (a throughput is never
    negative). Returns its record (:class:`specwatch.bench.records.ThroughputInterval`: ``batches``
    n, ``mean``, ``low``, ``high``, ``relative_half_width``: half width / mean, from the unclipped
    half width); with fewer than 2 batches (or a mean ≤ 0) ``low``/``high``/``relative_half_width``
    are None: one batch gives no interval."""
    xs = [float(x) for x in per_batch if x is not None and math.isfinite(float(x))]
    n = len(xs)
    mean = statistics.fmean(xs) if xs else None
    if n < 2 or mean <= 0:
        return ThroughputInterval(batches=n, mean=mean)
    half = t975(n - 1) * statistics.stdev(xs) / math.sqrt(n)
    # a throughput is never negative: with few, scattered batches the lower end stops at 0
    return ThroughputInterval(batches=n, mean=mean, low=max(0.0, mean - half), high=mean + half,
                              relative_half_width=half / mean)


@dataclass
class CellSummary:
    """Measured (non-warm-up) batches of one (role, workload, concurrency), pooled.

    ``output_throughput`` is the mean of the batches' throughputs (tok/s); latency statistics pool
    all successful requests; spec-decode values use the summed counter deltas.
    """

    role: str
    workload: str
    max_concurrency: int
    batches: list[BatchResult]

    @property
    def output_throughput(self) -> float | None:
        return statistics.fmean(b.output_throughput for b in self.batches) if self.batches else None

    @property
    def spec(self) -> SpecDecodeStats:
        deltas = [b.spec.delta for b in self.batches if b.spec.delta is not None]
        schema = next((b.spec.schema for b in self.batches if b.spec.schema), None)
        errs = [b.spec.metrics_error for b in self.batches if b.spec.metrics_error]
        pooled = sum_step_counters(b.spec.steps for b in self.batches)
        return SpecDecodeStats(schema, sum_counters(deltas) if deltas else None, errs[0] if errs else None, pooled)

    def to_record(self) -> BenchCell:
        """The cell's summary record (:class:`specwatch.bench.records.BenchCell`)."""
        bs = self.batches
        dur = sum(b.duration for b in bs)
        completed = sum(b.completed for b in bs)
        out = sum(b.total_output_tokens for b in bs)
        spec = self.spec
        return BenchCell(
            role=self.role, workload=self.workload, max_concurrency=self.max_concurrency, num_batches=len(bs),
            duration=dur, completed=completed, failed=sum(b.failed for b in bs),
            total_input_tokens=sum(b.total_input_tokens for b in bs), total_output_tokens=out,
            request_throughput=completed / dur if dur > 0 else None, output_throughput=self.output_throughput,
            output_throughput_pooled=out / dur if dur > 0 else None,
            output_throughput_per_batch=tuple(b.output_throughput for b in bs),
            output_throughput_ci95=throughput_interval([b.output_throughput for b in bs]),
            **_latency_fields(*([v for b in bs for v in getattr(b, attr)] for attr in ("ttfts", "tpots", "itls", "e2els"))),
            **spec.fields(),
            per_request=per_request_record(spec, [x for b in bs for x in b.spec_requests]),
        )


def per_request_record(spec: SpecDecodeStats, items: Sequence[tuple[Any, dict[str, Any]]]) -> PerRequest | None:
    """The exact per-request summary (:func:`specwatch.bench.perrequest.summarize`) of a batch or
    cell; None for a server without speculative-decoding counters (a baseline) and no payloads."""
    if spec.delta is None and not any(p is not None for p, _ in items):
        return None
    good, bad = perrequest.collect(items)
    return perrequest.summarize(good, bad)


def summarize(batches: Iterable[BatchResult]) -> list[CellSummary]:
    """Group measured batches by (role, workload, concurrency), in first-seen order."""
    cells: dict[tuple[str, str, int], CellSummary] = {}
    for b in batches:
        if b.warmup:
            continue
        key = (b.role, b.workload, b.max_concurrency)
        if key not in cells:
            cells[key] = CellSummary(*key, [])
        cells[key].batches.append(b)
    return list(cells.values())


def _paired(base: CellSummary, spec: CellSummary) -> tuple[float, float, float, int] | None:
    """(value, lower, upper, pairs) of the per-batch paired ratio speculative / baseline output
    throughput over the batch indexes both roles measured with a positive throughput
    (:func:`specwatch.specdecode.decision.paired_ratio`); None with fewer than two pairs."""
    b = {x.batch_index: x.output_throughput for x in base.batches}
    s = {x.batch_index: x.output_throughput for x in spec.batches}
    idx = sorted(i for i in s if i in b and s[i] > 0 and b[i] > 0)
    if len(idx) < 2:
        return None
    r = paired_ratio([s[i] for i in idx], [b[i] for i in idx])
    return r.value, r.lower, r.upper, len(idx)


def compare(cells: Iterable[CellSummary]) -> list[ComparisonRow]:
    """The baseline-vs-speculative rows (:class:`specwatch.bench.records.ComparisonRow`):
    workload | concurrency | baseline tok/s | spec tok/s | ratio | per-batch paired ratio [95 %]
    | acceptance, for every (workload, concurrency) measured on both roles. ``ratio`` =
    speculative / baseline mean output throughput; the paired ratio and its interval: batch i of
    both roles (the same prompts), :func:`_paired`; the acceptance rate 0–1 (percent in the file)."""
    by_key: dict[tuple[str, int], dict[str, CellSummary]] = {}
    for c in cells:
        by_key.setdefault((c.workload, c.max_concurrency), {})[c.role] = c
    rows = []
    for (wl, conc), roles in by_key.items():
        if "baseline" not in roles or "speculative" not in roles:
            continue
        base, spec = roles["baseline"], roles["speculative"]
        bt, st = base.output_throughput, spec.output_throughput
        s = spec.spec
        pr = _paired(base, spec)
        rows.append(ComparisonRow(
            workload=wl, max_concurrency=conc, baseline_output_throughput=bt, speculative_output_throughput=st,
            ratio=st / bt if bt and st is not None else None,
            paired_ratio=None if pr is None else pr[0], paired_ratio_lower=None if pr is None else pr[1],
            paired_ratio_upper=None if pr is None else pr[2], paired_batches=None if pr is None else pr[3],
            acceptance_rate=s.acceptance_rate,
            acceptance_length=s.acceptance_length, baseline_failed=sum(b.failed for b in base.batches),
            speculative_failed=sum(b.failed for b in spec.batches)))
    return rows


# --------------------------------------------------------------------------------------------
# Files.

def _json_default(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


class ResultWriter:
    """Writes ``<stem>.json`` (one document: config, batches, summary, comparison, equivalence,
    status) and ``<stem>.csv`` (one row per batch), both rewritten atomically on every
    :meth:`write`. ``config`` must already be free of secrets."""

    def __init__(self, json_path: str | Path, csv_path: str | Path | None, config: dict[str, Any]) -> None:
        self.json_path = Path(json_path)
        self.csv_path = Path(csv_path) if csv_path is not None else None
        self.config = config

    def write(self, batches: Sequence[BatchResult], status: str, equivalence: Equivalence | None = None,
              started_at: str | None = None, error: str | None = None) -> None:
        """Rewrite both files. ``status``: "running" | "complete" | "interrupted" | "failed";
        ``error``: why a "failed" run stopped (None otherwise); ``equivalence``: the greedy-output
        check's record (:func:`specwatch.bench.equivalence.check_equivalence`), or None. Raises
        OSError if unwritable."""
        cells = summarize(batches)
        doc = BenchResult(status=status, error=error, started_at=started_at, config=self.config,
                          batches=tuple(b.to_record() for b in batches), cells=tuple(c.to_record() for c in cells),
                          comparison=tuple(compare(cells)),
                          equivalence=equivalence)
        atomic_write_text(self.json_path, json.dumps(finite_or_none(doc.to_json()), indent=1, default=_json_default) + "\n")
        if self.csv_path is not None:
            atomic_write_text(self.csv_path, csv_text([csv_row(r, b.per_request()) for b, r in zip(batches, doc.batches, strict=True)]))


# --------------------------------------------------------------------------------------------
# Console.


def _percent(rate: float | None) -> float | None:
    return None if rate is None else rate * 100


def _fmt(v: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "–" if v is None else f"{v:{spec}}{suffix}"


#: Why a cell has no exact curve, by per-request status (:func:`specwatch.bench.perrequest.cell_status`).
_NO_EXACT = {"not_offered": "not returned by the server",
             "unusable": "no usable per-request payload",
             "no_drafts": "no verify step with draft tokens"}


def render_tables(batches: Sequence[BatchResult], equivalence: Equivalence | None = None) -> list[Any]:
    """rich Tables for the console: the per-cell summary, the baseline/speculative comparison
    (when both roles ran) and the equivalence check (when it ran)."""
    cells = summarize(batches)
    tables: list[Any] = []
    t = Table(title="specwatch bench: measured batches (warm-up excluded)")
    for col in ("role", "workload", "concurrency", "batches", "ok/failed", "tok/s",
                "TTFT med ms", "TPOT med ms", "ITL p99 ms", "E2E p90 s", "acceptance", "acc. length"):
        t.add_column(col, justify="left" if col in ("role", "workload") else "right")
    records = [c.to_record() for c in cells]
    for c, r in zip(cells, records, strict=True):
        t.add_row(
            c.role, c.workload, str(c.max_concurrency), str(r.num_batches),
            f"{r.completed}/{r.failed}", _fmt(r.output_throughput),
            _fmt(r.median_ttft_ms), _fmt(r.median_tpot_ms, ".2f"), _fmt(r.p99_itl_ms),
            _fmt(None if r.p90_e2el_ms is None else r.p90_e2el_ms / 1000, ".2f"),
            _fmt(_percent(r.acceptance_rate), ".1f", " %"), _fmt(r.acceptance_length, ".2f"),
        )
    tables.append(t)
    rows = compare(cells)
    if rows:
        ct = Table(title="baseline vs speculative")
        for col in ("workload", "concurrency", "baseline tok/s", "spec tok/s", "ratio",
                    "per-batch ratio [95 %]", "acceptance", "acc. length"):
            ct.add_column(col, justify="left" if col == "workload" else "right")
        for r in rows:
            per_batch = ("–" if r.paired_ratio is None else
                         f"{format_ratio(r.paired_ratio)}× {format_interval(r.paired_ratio_lower, r.paired_ratio_upper)}")
            ct.add_row(r.workload, str(r.max_concurrency), _fmt(r.baseline_output_throughput),
                       _fmt(r.speculative_output_throughput), _fmt(r.ratio, ".2f", "×"), per_batch,
                       _fmt(_percent(r.acceptance_rate), ".1f", " %"), _fmt(r.acceptance_length, ".2f"))
        tables.append(ct)
    exact_rows = []
    for c, r in zip(cells, records, strict=True):
        pr = r.per_request
        if r.per_position_acceptance_rates is None and pr is None:
            continue
        curve = lambda v: "–" if not v else " / ".join("–" if x is None else f"{x:.2f}" for x in v)
        if pr is not None and pr.has_exact_curve:
            ra = pr.request_acceptance or {}
            exact = curve(pr.per_position_acceptance_rates)
            dist = " / ".join(f"{ra[p]:.2f}" for p in ("p5", "p50", "p95")) if ra else "–"
            outs = pr.outliers or ()
            extra = (f"{pr.num_outliers or 0} outliers" + (": " + "; ".join(perrequest.format_outlier(o) for o in outs[:3])
                                                          if outs else "")
                     + f"; problems: {perrequest.format_problems(pr.problems)}")
        else:
            exact, dist = _NO_EXACT.get(None if pr is None else pr.status, "not returned by the server"), "–"
            extra = f"problems: {perrequest.format_problems(pr.problems)}" if pr is not None else ""
        exact_rows.append((c.role, c.workload, str(c.max_concurrency), curve(r.per_position_acceptance_rates),
                           str(r.curve_basis or "–"), exact, dist, extra))
    if exact_rows:
        xt = Table(title="per-position acceptance: counters vs exact per-request (vLLM --per-request-spec-decode-metrics detailed)")
        for col in ("role", "workload", "concurrency", "counters", "basis", "exact (drafted positions)",
                    "request acceptance p5/p50/p95", "notes"):
            xt.add_column(col)
        for row in exact_rows:
            xt.add_row(*row)
        tables.append(xt)
    eq = equivalence
    if eq is not None and eq.prompts:
        et = Table(title=f"greedy-output equivalence: {eq.matched}/{eq.total} identical")
        for col in ("prompt", "identical", "first difference at", "baseline chars", "spec chars", "error"):
            et.add_column(col)
        for p in eq.prompts:
            et.add_row(p.name, "yes" if p.identical else "no",
                       "" if p.first_difference is None else str(p.first_difference),
                       str(p.baseline_chars), str(p.speculative_chars), (p.error or "")[:80])
        tables.append(et)
    for table in tables:
        keep_names_whole(table)
    return tables


#: Columns holding names (never cut to "random-…" on a narrow console, issue 25).
NAME_COLUMNS = ("role", "workload", "prompt")


def keep_names_whole(table: Table, names: Sequence[str] = NAME_COLUMNS) -> Table:
    """Give the ``names`` columns of a filled rich ``table`` the width of their longest value and
    no wrapping, so rich shrinks the other columns (their headers wrap) instead of cutting a
    workload name such as ``random-output`` to ``random-…``. Returns the table."""
    for col in table.columns:
        if str(col.header) in names:
            col.no_wrap = True
            col.min_width = max([len(str(c)) for c in col.cells] + [col.min_width or 0])
    return table
