"""The bench result file as typed records: the only module that reads a bench document's fields.

``specwatch bench`` writes ``<stem>.json`` (:class:`specwatch.bench.results.ResultWriter`,
``specwatch_bench_format`` 1; a document without the key is format 1): the run's ``config``,
``status``, ``error``, ``started_at``, every batch (``batches``: :class:`BenchBatch`), the
per-cell summaries (``summary``: :class:`BenchCell`), the baseline/speculative ``comparison``
rows and the ``equivalence`` check. The per-cell summary is also what a sweep stores for each of
its cells (:mod:`specwatch.choosek.records`).

Field names and units are declared here (``vllm bench serve``'s where they exist): the writer
(:class:`specwatch.bench.results.ResultWriter`) builds these records and writes their ``to_json``,
and the CSV beside the JSON is made of :func:`csv_row`. Inside a record the acceptance rate is a fraction 0–1 (``acceptance_rate``); the
file stores it in percent (``spec_decode_acceptance_rate``), converted here and nowhere else.
:meth:`BenchResult.from_json` / :meth:`BenchResult.to_json` round-trip every file a specwatch
version wrote (``from_json(x).to_json() == x``; unknown keys are kept).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from specwatch.common.records import (Anything, Bool, Int, JsonRecord, ListOf, Num, Obj, Percent, Rec, RecordError, Str, jfield,
                                      read_document, read_json_file)

FORMAT = 1
#: Formats this reader accepts.
READABLE_FORMATS = (1,)
FORMAT_KEY = "specwatch_bench_format"

_NUM, _STR, _ANY, _OBJ = Num(), Str(), Anything(), Obj()


class BenchRecordError(RecordError):
    """A bench result file (or document) that cannot be read: the message names it and the field."""


@dataclass(frozen=True, kw_only=True)
class ThroughputInterval(JsonRecord):
    """``output_throughput_ci95``: the 95 % interval of a cell's throughput over its measured
    batches (:func:`specwatch.bench.results.throughput_interval`)."""

    batches: int | None = jfield("batches", Int())
    mean: float | None = jfield("mean", _NUM)
    low: float | None = jfield("low", _NUM)
    high: float | None = jfield("high", _NUM)
    relative_half_width: float | None = jfield("relative_half_width", _NUM)


def format_problems(problems: Mapping[str, int] | None) -> str:
    """A per-request summary's ``problems`` {reason: requests} as text: "none", or "truncated: 2,
    missing: 1" (the reasons of :data:`specwatch.bench.perrequest.PROBLEMS`, most frequent first)."""
    items = sorted(((str(k), v) for k, v in (problems or {}).items() if v), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{k}: {v}" for k, v in items) or "none"


@dataclass(frozen=True, kw_only=True)
class PerRequest(JsonRecord):
    """``spec_decode_per_request``: the exact per-request summary of a cell or batch, built by
    :func:`specwatch.bench.perrequest.summarize` (a batch keeps ``status``, ``requests`` and
    ``problems``). ``problems``, ``request_acceptance``, ``draft_length_histogram`` and
    ``outliers`` are :mod:`specwatch.bench.perrequest`'s own documents, kept verbatim. The fields
    are declared in the order the summary of a measured cell writes them; a summary without a
    curve writes only :data:`UNMEASURED_KEYS`."""

    status: str | None = jfield("status", _STR)
    source: str | None = jfield("source", _STR)
    requests: int | None = jfield("requests", Int())
    requests_without_verify_steps: int | None = jfield("requests_without_verify_steps", Int())
    problems: Mapping[str, Any] | None = jfield("problems", _OBJ)
    verify_steps: int | None = jfield("verify_steps", Int())
    draft_tokens: int | None = jfield("draft_tokens", Int())
    accepted_tokens: int | None = jfield("accepted_tokens", Int())
    draft_acceptance_rate: float | None = jfield("draft_acceptance_rate", _NUM)
    mean_acceptance_length: float | None = jfield("mean_acceptance_length", _NUM)
    num_spec_tokens: int | None = jfield("num_spec_tokens", Int())
    max_draft_length: int | None = jfield("max_draft_length", Int())
    drafted_steps_per_position: tuple[float, ...] | None = jfield("drafted_steps_per_position", ListOf(_NUM))
    conditional_per_position_acceptance_rates: tuple[float | None, ...] | None = jfield(
        "conditional_per_position_acceptance_rates", ListOf(_NUM, nullable_items=True))
    per_position_acceptance_rates: tuple[float | None, ...] | None = jfield(
        "per_position_acceptance_rates", ListOf(_NUM, nullable_items=True))
    #: E(k) by k as text ("1", "2", …), as the file writes it.
    expected_acceptance_lengths: Mapping[str, Any] | None = jfield("expected_acceptance_lengths", _OBJ)
    draft_length_histogram: Mapping[str, Any] | None = jfield("draft_length_histogram", _OBJ)
    request_acceptance: Mapping[str, Any] | None = jfield("request_acceptance", _OBJ)
    num_outliers: int | None = jfield("num_outliers", Int())
    outliers: tuple[Any, ...] | None = jfield("outliers", ListOf(_ANY))

    #: What a batch keeps of its per-request summary (the cell keeps all of it).
    BATCH_KEYS: ClassVar[tuple[str, ...]] = ("status", "requests", "problems")
    #: The keys of a summary without a curve (status not_offered, unusable or no_drafts), in its order.
    UNMEASURED_KEYS: ClassVar[tuple[str, ...]] = ("status", "requests", "requests_without_verify_steps", "problems", "source")

    def for_batch(self) -> PerRequest:
        """The part a batch record stores (:data:`BATCH_KEYS`: status, requests, problems)."""
        return PerRequest(status=self.status, requests=self.requests, problems=self.problems, keys=self.BATCH_KEYS)

    @property
    def has_exact_curve(self) -> bool:
        """The cell's exact curve was measured (status ``measured`` or ``partial``)."""
        return self.status in ("measured", "partial")

    def expected_lengths(self) -> list[float] | None:
        """E(k′) for k′ = 1, 2, … from ``expected_acceptance_lengths`` when the exact curve was
        measured and every value is a number; else None."""
        exp = self.expected_acceptance_lengths
        if not exp or not self.has_exact_curve:
            return None
        vals = [exp.get(str(i)) for i in range(1, len(exp) + 1)]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            return None
        return [float(v) for v in vals]

    def format_expected(self) -> list[tuple[str, float]]:
        """(k as text, E(k)) pairs as stored (for display)."""
        return [(k, float(v)) for k, v in (self.expected_acceptance_lengths or {}).items()]


@dataclass(frozen=True, kw_only=True)
class _Measured(JsonRecord):
    """The fields a batch and a cell summary share: latencies (ms), spec-decode values over the
    interval (counter deltas) and the server's step counters (``server_*``)."""

    role: str | None = jfield("role", _STR)
    workload: str | None = jfield("workload", _STR)
    max_concurrency: int | None = jfield("max_concurrency", Int())
    duration: float | None = jfield("duration", _NUM)
    completed: float | None = jfield("completed", _NUM)
    failed: float | None = jfield("failed", _NUM)
    total_input_tokens: float | None = jfield("total_input_tokens", _NUM)
    total_output_tokens: float | None = jfield("total_output_tokens", _NUM)
    request_throughput: float | None = jfield("request_throughput", _NUM)
    output_throughput: float | None = jfield("output_throughput", _NUM)
    mean_ttft_ms: float | None = jfield("mean_ttft_ms", _NUM)
    median_ttft_ms: float | None = jfield("median_ttft_ms", _NUM)
    std_ttft_ms: float | None = jfield("std_ttft_ms", _NUM)
    p90_ttft_ms: float | None = jfield("p90_ttft_ms", _NUM)
    p99_ttft_ms: float | None = jfield("p99_ttft_ms", _NUM)
    mean_tpot_ms: float | None = jfield("mean_tpot_ms", _NUM)
    median_tpot_ms: float | None = jfield("median_tpot_ms", _NUM)
    std_tpot_ms: float | None = jfield("std_tpot_ms", _NUM)
    p90_tpot_ms: float | None = jfield("p90_tpot_ms", _NUM)
    p99_tpot_ms: float | None = jfield("p99_tpot_ms", _NUM)
    mean_itl_ms: float | None = jfield("mean_itl_ms", _NUM)
    median_itl_ms: float | None = jfield("median_itl_ms", _NUM)
    std_itl_ms: float | None = jfield("std_itl_ms", _NUM)
    p90_itl_ms: float | None = jfield("p90_itl_ms", _NUM)
    p99_itl_ms: float | None = jfield("p99_itl_ms", _NUM)
    mean_e2el_ms: float | None = jfield("mean_e2el_ms", _NUM)
    median_e2el_ms: float | None = jfield("median_e2el_ms", _NUM)
    std_e2el_ms: float | None = jfield("std_e2el_ms", _NUM)
    p90_e2el_ms: float | None = jfield("p90_e2el_ms", _NUM)
    p99_e2el_ms: float | None = jfield("p99_e2el_ms", _NUM)
    server_metrics_schema: str | None = jfield("server_metrics_schema", _STR)
    metrics_error: str | None = jfield("metrics_error", _STR)
    #: Δaccepted / Δdraft_tokens, 0–1 (the file: ``spec_decode_acceptance_rate`` in percent).
    acceptance_rate: float | None = jfield("spec_decode_acceptance_rate", Percent())
    acceptance_length: float | None = jfield("spec_decode_acceptance_length", _NUM)
    num_drafts: float | None = jfield("spec_decode_num_drafts", _NUM)
    draft_tokens: float | None = jfield("spec_decode_draft_tokens", _NUM)
    accepted_tokens: float | None = jfield("spec_decode_accepted_tokens", _NUM)
    per_position_acceptance_rates: tuple[float, ...] | None = jfield("spec_decode_per_position_acceptance_rates", ListOf(_NUM))
    conditional_per_position_acceptance_rates: tuple[float | None, ...] | None = jfield(
        "spec_decode_conditional_per_position_acceptance_rates", ListOf(_NUM, nullable_items=True))
    num_speculative_tokens: float | None = jfield("spec_decode_num_speculative_tokens", _NUM)
    generation_tokens: float | None = jfield("spec_decode_generation_tokens", _NUM)
    output_from_drafts_ratio: float | None = jfield("spec_decode_output_from_drafts_ratio", _NUM)
    #: ``exact`` / ``lower_bound`` (:mod:`specwatch.specdecode.ragged`); None in older files.
    curve_basis: str | None = jfield("spec_decode_curve_basis", _STR)
    missing_draft_tokens_ratio: float | None = jfield("spec_decode_missing_draft_tokens_ratio", _NUM)
    server_step_duration_ms: float | None = jfield("server_step_duration_ms", _NUM)
    server_running_requests: float | None = jfield("server_running_requests", _NUM)
    server_request_decode_tokens_per_second: float | None = jfield("server_request_decode_tokens_per_second", _NUM)
    server_engine_steps: float | None = jfield("server_engine_steps", _NUM)
    server_request_steps: float | None = jfield("server_request_steps", _NUM)
    server_itl_sum_seconds: float | None = jfield("server_itl_sum_seconds", _NUM)
    per_request: PerRequest | None = jfield("spec_decode_per_request", Rec(PerRequest))


@dataclass(frozen=True, kw_only=True)
class BatchError(JsonRecord):
    """One kept error of a batch (``errors[i]``): ``error`` is its one-line text."""

    #: The request's index in its batch.
    index: int | None = jfield("index", Int())
    error: str | None = jfield("error", _STR)


def _order(base: Sequence[str], after: Mapping[str, Sequence[str]], end: Sequence[str] = ()) -> tuple[str, ...]:
    """``base`` with the keys ``after[k]`` inserted after key k, then ``end``."""
    out: list[str] = []
    for k in base:
        out += [k, *after.get(k, ())]
    return (*out, *end)


#: The JSON keys of the fields a batch and a cell share, in the writer's order.
_MEASURED_KEYS = tuple(meta["key"] for _, meta in _Measured._jfields())


@dataclass(frozen=True, kw_only=True)
class BenchBatch(_Measured):
    """One batch (``batches[i]``, :meth:`specwatch.bench.results.BatchResult.to_record`)."""

    write_order: ClassVar[tuple[str, ...]] = _order(
        _MEASURED_KEYS, {"max_concurrency": ("batch_index", "warmup", "started_at", "request_rate", "num_prompts"),
                         "total_output_tokens": ("output_tokens_from_usage",),
                         "output_throughput": ("total_token_throughput",)}, end=("errors",))

    batch_index: int | None = jfield("batch_index", Int())
    warmup: bool | None = jfield("warmup", Bool())
    started_at: str | None = jfield("started_at", _STR)
    #: Requests per second, or the text "inf" (all at once), as the file writes it.
    request_rate: Any = jfield("request_rate", _ANY)
    num_prompts: float | None = jfield("num_prompts", _NUM)
    output_tokens_from_usage: bool | None = jfield("output_tokens_from_usage", Bool())
    total_token_throughput: float | None = jfield("total_token_throughput", _NUM)
    errors: tuple[BatchError, ...] | None = jfield("errors", ListOf(Rec(BatchError)))

    @classmethod
    def from_json(cls, data: Any, where: str | None = None) -> BenchBatch:
        """A batch record alone (as :meth:`specwatch.bench.results.BatchResult.record` gives it)."""
        return read_document(cls, data, where, "bench batch record", BenchRecordError)

    def first_error(self) -> str | None:
        """The text of the batch's first kept error (None without one)."""
        return next((e.error for e in self.errors or () if e.error), None)


@dataclass(frozen=True, kw_only=True)
class BenchCell(_Measured):
    """One cell's summary (``summary[i]``, :meth:`specwatch.bench.results.CellSummary.to_record`):
    the measured (non-warm-up) batches of one (role, workload, concurrency), pooled."""

    write_order: ClassVar[tuple[str, ...]] = _order(
        _MEASURED_KEYS, {"max_concurrency": ("num_batches",),
                         "output_throughput": ("output_throughput_pooled", "output_throughput_per_batch",
                                               "output_throughput_ci95")})

    num_batches: float | None = jfield("num_batches", _NUM)
    output_throughput_pooled: float | None = jfield("output_throughput_pooled", _NUM)
    output_throughput_per_batch: tuple[float | None, ...] | None = jfield(
        "output_throughput_per_batch", ListOf(_NUM, nullable_items=True))
    output_throughput_ci95: ThroughputInterval | None = jfield("output_throughput_ci95", Rec(ThroughputInterval))

    @classmethod
    def from_json(cls, data: Any, where: str | None = None) -> BenchCell:
        """A cell summary alone (as :meth:`specwatch.bench.results.CellSummary.record` gives it)."""
        return read_document(cls, data, where, "bench cell summary", BenchRecordError)


@dataclass(frozen=True, kw_only=True)
class ComparisonRow(JsonRecord):
    """One row of the baseline/speculative comparison (``comparison[i]``,
    :func:`specwatch.bench.results.compare`): one (workload, concurrency) measured on both roles.
    ``ratio`` = speculative / baseline output throughput (tok/s); ``acceptance_rate`` 0–1 (the
    file: ``spec_decode_acceptance_rate`` in percent)."""

    workload: str | None = jfield("workload", _STR)
    max_concurrency: int | None = jfield("max_concurrency", Int())
    baseline_output_throughput: float | None = jfield("baseline_output_throughput", _NUM)
    speculative_output_throughput: float | None = jfield("speculative_output_throughput", _NUM)
    ratio: float | None = jfield("ratio", _NUM)
    #: The per-batch paired ratio (batch i of both roles served the same prompts): the geometric
    #: mean of spec_i / baseline_i and its 95 % interval exp(mean ± t(n−1)·sd/√n) over
    #: ``paired_batches`` pairs (:func:`specwatch.specdecode.decision.paired_ratio`, the estimator
    #: advise decides on); absent with fewer than two pairs.
    paired_ratio: float | None = jfield("paired_ratio", _NUM, omit_none=True)
    paired_ratio_lower: float | None = jfield("paired_ratio_lower", _NUM, omit_none=True)
    paired_ratio_upper: float | None = jfield("paired_ratio_upper", _NUM, omit_none=True)
    paired_batches: int | None = jfield("paired_batches", Int(), omit_none=True)
    acceptance_rate: float | None = jfield("spec_decode_acceptance_rate", Percent())
    acceptance_length: float | None = jfield("spec_decode_acceptance_length", _NUM)
    baseline_failed: float | None = jfield("baseline_failed", _NUM)
    speculative_failed: float | None = jfield("speculative_failed", _NUM)


@dataclass(frozen=True, kw_only=True)
class EquivalencePrompt(JsonRecord):
    """One prompt of the greedy-output check (``equivalence.prompts[i]``,
    :class:`specwatch.bench.equivalence.PromptComparison`): identical outputs or the first
    differing character, the outputs' lengths in characters and a request error."""

    name: str | None = jfield("name", _STR)
    identical: bool | None = jfield("identical", Bool())
    first_difference: int | None = jfield("first_difference", Int())
    baseline_chars: int | None = jfield("baseline_chars", Int())
    speculative_chars: int | None = jfield("speculative_chars", Int())
    error: str | None = jfield("error", _STR)
    #: ``{"index", "baseline", "speculative", "source"}`` (:mod:`specwatch.bench.equivalence`), verbatim.
    first_differing_token: Mapping[str, Any] | None = jfield("first_differing_token", _OBJ)


@dataclass(frozen=True, kw_only=True)
class Equivalence(JsonRecord):
    """The greedy-output check (``equivalence`` of a bench result and of a demo summary;
    :func:`specwatch.bench.equivalence.compare_outputs` builds it): ``matched`` of
    ``total`` prompts identical, ``output_len`` tokens per prompt."""

    matched: int | None = jfield("matched", Int())
    total: int | None = jfield("total", Int())
    prompts: tuple[EquivalencePrompt, ...] = jfield("prompts", ListOf(Rec(EquivalencePrompt)), default=())
    output_len: int | None = jfield("output_len", Int(), omit_none=True)

    @classmethod
    def from_json(cls, data: Any, where: str | None = None) -> Equivalence:
        """The record read from a result file's ``equivalence`` object (its key order kept)."""
        return read_document(cls, data, where, "greedy-output check", BenchRecordError)

    @property
    def ran(self) -> bool:
        """The check ran (an empty document, as an interrupted run may leave, did not)."""
        return self.total is not None or bool(self.prompts)


@dataclass(frozen=True, kw_only=True)
class BenchResult(JsonRecord):
    """A bench result document (``<stem>.json`` of ``specwatch bench``)."""

    format: int = jfield(FORMAT_KEY, Int(), nullable=False, default=FORMAT)
    status: str | None = jfield("status", _STR)
    error: str | None = jfield("error", _STR)
    started_at: str | None = jfield("started_at", _STR)
    #: The run's settings (:meth:`specwatch.bench.runner.BenchConfig.record`, secrets left out), verbatim.
    config: Mapping[str, Any] | None = jfield("config", _OBJ)
    batches: tuple[BenchBatch, ...] = jfield("batches", ListOf(Rec(BenchBatch)), default=())
    cells: tuple[BenchCell, ...] = jfield("summary", ListOf(Rec(BenchCell)), default=())
    #: :func:`specwatch.bench.results.compare`'s rows (derived from the cells).
    comparison: tuple[ComparisonRow, ...] | None = jfield("comparison", ListOf(Rec(ComparisonRow)))
    #: The greedy-output check (None when it did not run).
    equivalence: Equivalence | None = jfield("equivalence", Rec(Equivalence))

    @classmethod
    def from_json(cls, data: Any, where: str | None = None) -> BenchResult:
        """The record of a parsed bench document; ``where`` names it in errors (the file).
        Raises BenchRecordError for a document of the wrong shape or an unknown format."""
        if isinstance(data, Mapping) and FORMAT_KEY in data and data[FORMAT_KEY] not in READABLE_FORMATS:
            raise BenchRecordError(f"{where or 'the document'} is not a specwatch bench result of format "
                                   f"{', '.join(map(str, READABLE_FORMATS))} ({FORMAT_KEY}: {data[FORMAT_KEY]!r})")
        return read_document(cls, data, where, "bench result", BenchRecordError)

    @classmethod
    def load(cls, path: str | Path) -> BenchResult:
        """Read a bench result file. Raises BenchRecordError (one line naming the file and the field)."""
        return cls.from_json(read_json_file(path, "bench result", BenchRecordError), str(path))

    def measured_batches(self) -> list[BenchBatch]:
        """The batches that are not warm-up."""
        return [b for b in self.batches if not b.warmup]

    def cells_by_key(self) -> dict[tuple[str, int], BenchCell]:
        """(workload, concurrency) → cell summary (cells without both keys left out)."""
        return {(c.workload, int(c.max_concurrency)): c for c in self.cells
                if c.workload is not None and c.max_concurrency is not None}

    def batches_by_key(self) -> dict[tuple[str, int], dict[int, BenchBatch]]:
        """(workload, concurrency) → {batch index: measured batch}."""
        out: dict[tuple[str, int], dict[int, BenchBatch]] = {}
        for b in self.measured_batches():
            if b.workload is None or b.max_concurrency is None:
                continue
            out.setdefault((b.workload, int(b.max_concurrency)), {})[int(b.batch_index or 0)] = b
        return out



def finite_or_none(o: Any) -> Any:
    """NaN and infinities as None, recursively (what the file would hold: JSON has no NaN)."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, Mapping):
        return {k: finite_or_none(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite_or_none(v) for v in o]
    return o


# --------------------------------------------------------------------------------------------
# The CSV beside the JSON: one row per batch.

#: The CSV's columns: the batch record's JSON keys, then per-request columns and the first error.
CSV_FIELDS = (
    "role", "workload", "max_concurrency", "batch_index", "warmup", "started_at", "request_rate",
    "num_prompts", "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "output_throughput", "total_token_throughput",
    *[f"{s}_{k}_ms" for k in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "std", "p90", "p99")],
    "spec_decode_acceptance_rate", "spec_decode_acceptance_length", "spec_decode_num_drafts",
    "spec_decode_draft_tokens", "spec_decode_accepted_tokens", "spec_decode_per_position_acceptance_rates",
    "spec_decode_num_speculative_tokens", "spec_decode_curve_basis", "spec_decode_missing_draft_tokens_ratio",
    "spec_decode_per_request_status", "spec_decode_per_request_problems",
    "spec_decode_exact_per_position_acceptance_rates", "metrics_error", "first_error",
)
#: CSV columns holding a curve: written as values joined by ";" (6 significant digits).
CSV_CURVE_FIELDS = ("spec_decode_per_position_acceptance_rates", "spec_decode_exact_per_position_acceptance_rates")


def csv_row(batch: BenchBatch, per_request: PerRequest | None) -> dict[str, Any]:
    """The CSV row of ``batch`` (:data:`CSV_FIELDS`; an unset value is ""). ``per_request``: the
    batch's full per-request summary (the row's per-request status, problems and exact curve;
    the batch record keeps only its status, requests and problems)."""
    rec = batch.to_json()
    pr = per_request
    rec["spec_decode_per_request_status"] = None if pr is None else pr.status
    rec["spec_decode_per_request_problems"] = None if pr is None else format_problems(pr.problems)
    rec["spec_decode_exact_per_position_acceptance_rates"] = None if pr is None else pr.per_position_acceptance_rates
    for key in CSV_CURVE_FIELDS:
        pp = rec.get(key)
        rec[key] = "" if pp is None else ";".join(f"{x:.6g}" for x in pp)
    rec["first_error"] = batch.errors[0].error if batch.errors else ""
    return {k: ("" if rec.get(k) is None else rec.get(k)) for k in CSV_FIELDS}


def csv_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """The CSV file of :func:`csv_row` rows (a header, then one line per batch)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore")
    w.writeheader()
    for row in rows:
        w.writerow(row)
    return buf.getvalue()


__all__ = ["BatchError", "BenchBatch", "BenchCell", "BenchRecordError", "BenchResult", "ComparisonRow", "CSV_FIELDS", "Equivalence",
           "EquivalencePrompt", "FORMAT", "FORMAT_KEY", "PerRequest", "ThroughputInterval", "csv_row", "csv_text", "format_problems"]
