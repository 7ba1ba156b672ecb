"""``demo-summary.json`` as a typed record: the only module that knows its fields.

``specwatch demo`` (:mod:`specwatch.demo`) builds a :class:`DemoSummary` and writes its
``to_json`` into the result folder after each server and at the end; the demo report
(:mod:`specwatch.demo.report`) reads it with :meth:`DemoSummary.from_json` /
:meth:`DemoSummary.load` (or :meth:`DemoSummary.from_json` of a parsed document). Format
``specwatch_demo_format`` 1; a file without the key (written before it existed) is format 1 and
reads unchanged (``from_json(x).to_json() == x``, unknown keys kept).

Fields: the run's settings (``started_at``, ``workloads``, ``concurrencies``, ``k``, ``method``,
``drafter``, ``output_len``, ``num_batches``), ``servers`` (role → :class:`DemoServer`), the
exporter's cost profile (:class:`CostProfileRef`), what Prometheus held (``prometheus``: query →
values), the greedy-output check (``equivalence``: :class:`specwatch.bench.records.Equivalence`),
the whole-run curve (``per_position``: :class:`RunCurve`, rates 0–1), the
baseline-vs-speculative rows (``comparison``: :class:`specwatch.bench.records.ComparisonRow`),
the decision table (``decision``: :class:`specwatch.demo.decisionrecords.Decision`, made by
:func:`specwatch.demo.decision.decide`) and ``status`` (absent for a finished run,
``interrupted``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specwatch.bench.records import ComparisonRow, Equivalence
from specwatch.demo.decisionrecords import Decision
from specwatch.common.records import (Int, JsonRecord, ListOf, MapOf, Num, Obj, Rec, RecordError, Str, jfield, read_document,
                                      read_json_file)

FORMAT = 1
READABLE_FORMATS = (1,)
FORMAT_KEY = "specwatch_demo_format"
#: The file's name in a demo result folder.
SUMMARY_FILE = "demo-summary.json"

_NUM, _STR, _OBJ = Num(), Str(), Obj()


class DemoSummaryError(RecordError):
    """A demo summary that cannot be read: the message names the file and the field."""


@dataclass(frozen=True, kw_only=True)
class DemoServer(JsonRecord):
    """One server of the run (``servers[role]``): its start-up time (s), ``--speculative-config``
    (None for the baseline), port and bench result file."""

    startup_seconds: float | None = jfield("startup_seconds", _NUM)
    speculative_config: Mapping[str, Any] | None = jfield("speculative_config", _OBJ)
    port: int | None = jfield("port", Int())
    result_file: str | None = jfield("result_file", _STR, omit_none=True)


@dataclass(frozen=True, kw_only=True)
class CostProfileRef(JsonRecord):
    """The cost profile the demo's exporter ran with (``exporter_cost_profile``): its file and the
    drafter it states for the speculative upstream."""

    file: str | None = jfield("file", _STR)
    drafter: str | None = jfield("drafter", _STR)


@dataclass(frozen=True, kw_only=True)
class RunCurve(JsonRecord):
    """The speculative run's whole-run curve (``per_position``; counter deltas over the run):
    rates 0–1, E(k) by k as text ("1", "2", …) as the file writes it."""

    draft_acceptance_rate: float | None = jfield("draft_acceptance_rate", _NUM)
    mean_acceptance_length: float | None = jfield("mean_acceptance_length", _NUM)
    per_position_acceptance_rate: tuple[float, ...] = jfield("per_position_acceptance_rate", ListOf(_NUM), default=())
    conditional_acceptance_rate: tuple[float | None, ...] = jfield(
        "conditional_acceptance_rate", ListOf(_NUM, nullable_items=True), default=())
    expected_acceptance_length_by_k: Mapping[str, Any] = jfield("expected_acceptance_length_by_k", _OBJ,
                                                                default_factory=dict)
    draft_tokens_per_draft: float | None = jfield("draft_tokens_per_draft", _NUM)

    def expected_length(self, k: int) -> float | None:
        """E(k) as stored (None when the curve has no value for k)."""
        v = self.expected_acceptance_length_by_k.get(str(k))
        return None if isinstance(v, bool) or not isinstance(v, (int, float)) else float(v)


@dataclass(frozen=True, kw_only=True)
class DemoSummary(JsonRecord):
    """``demo-summary.json`` (see the module docstring)."""

    format: int = jfield(FORMAT_KEY, Int(), nullable=False, default=FORMAT)
    started_at: str | None = jfield("started_at", _STR)
    workloads: tuple[str, ...] = jfield("workloads", ListOf(_STR), default=())
    concurrencies: tuple[int, ...] = jfield("concurrencies", ListOf(Int()), default=())
    k: int | None = jfield("k", Int())
    method: str | None = jfield("method", _STR)
    drafter: str | None = jfield("drafter", _STR)
    output_len: int | None = jfield("output_len", Int())
    num_batches: int | None = jfield("num_batches", Int())
    servers: Mapping[str, DemoServer] = jfield("servers", MapOf(Rec(DemoServer)), default_factory=dict)
    exporter_cost_profile: CostProfileRef | None = jfield("exporter_cost_profile", Rec(CostProfileRef), omit_none=True)
    #: PromQL query → the instant values Prometheus held at the end of the speculative run.
    prometheus: Mapping[str, Any] | None = jfield("prometheus", _OBJ, omit_none=True)
    #: The greedy-output check (None before it ran).
    equivalence: Equivalence | None = jfield("equivalence", Rec(Equivalence), omit_none=True)
    per_position: RunCurve | None = jfield("per_position", Rec(RunCurve), omit_none=True)
    comparison: tuple[ComparisonRow, ...] | None = jfield("comparison", ListOf(Rec(ComparisonRow)), omit_none=True)
    #: The decision table (:func:`specwatch.demo.decision.decide`, with the ``profile``
    #: :func:`specwatch.demo.report.demo_decision` adds); None before the run decided.
    decision: Decision | None = jfield("decision", Rec(Decision), omit_none=True)
    #: What the demo's exporter served right after each cell ("copy/c=1" → {"windows": {window →
    #: {value, lower, upper, basis, k}}}): the run's k, live, ``measured`` where both servers had
    #: traffic in the window (the paired demo, issue #37).
    live_measured: Mapping[str, Any] | None = jfield("live_measured", _OBJ, omit_none=True)
    #: None for a finished run (the file has no key), else ``interrupted``.
    status: str | None = jfield("status", _STR, omit_none=True)

    @classmethod
    def from_json(cls, data: Any, where: str | None = None) -> DemoSummary:
        """The record of a parsed demo summary; ``where`` names it in errors (the file). Raises
        DemoSummaryError for a document of the wrong shape or an unknown format."""
        if isinstance(data, Mapping) and FORMAT_KEY in data and data[FORMAT_KEY] not in READABLE_FORMATS:
            raise DemoSummaryError(f"{where or 'the document'} is not a specwatch demo summary of format "
                                   f"{', '.join(map(str, READABLE_FORMATS))} ({FORMAT_KEY}: {data[FORMAT_KEY]!r})")
        if not is_demo_summary(data):
            raise DemoSummaryError(f"{where or 'the document'} is not a specwatch demo summary")
        return read_document(cls, data, where, "demo result", DemoSummaryError)

    @classmethod
    def load(cls, path: str | Path) -> DemoSummary:
        """Read ``demo-summary.json``. Raises DemoSummaryError (one line naming the file and the field)."""
        return cls.from_json(read_json_file(path, "demo summary", DemoSummaryError), str(path))

    @property
    def run_status(self) -> str:
        """``status``, ``complete`` when the file has none."""
        return self.status or "complete"

    def with_server(self, role: str, server: DemoServer) -> DemoSummary:
        """The summary with ``servers[role]`` set (added after the others)."""
        return dataclasses.replace(self, servers={**self.servers, role: server})

    def result_file_name(self, role: str) -> str:
        """The name of ``role``'s bench result file (looked up in the result folder, which may have moved)."""
        s = self.servers.get(role)
        return Path((s.result_file if s is not None else None) or f"bench-{role}.json").name


def is_demo_summary(doc: Any) -> bool:
    """True for the document shape ``specwatch demo`` writes to ``demo-summary.json``."""
    return isinstance(doc, Mapping) and "specwatch_sweep_format" not in doc and {"servers", "workloads", "k"} <= set(doc)


__all__ = ["CostProfileRef", "DemoServer", "DemoSummary", "DemoSummaryError", "FORMAT", "FORMAT_KEY", "RunCurve", "SUMMARY_FILE",
           "is_demo_summary"]
