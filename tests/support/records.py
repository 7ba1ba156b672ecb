"""The tests' one edge between documents and records (issue #39): specwatch's readers take typed
records only (:class:`specwatch.choosek.records.SweepResult`, :class:`specwatch.bench.records.BenchResult`,
:class:`specwatch.demo.records.DemoSummary`, :class:`specwatch.demo.decisionrecords.Decision`,
:class:`specwatch.bench.records.BenchCell`, …).
A test that edits a real document into a variant (a plain dict) turns it into its record here,
through the record's own reader, so a damaged variant fails as a damaged file would."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from specwatch.bench.records import BenchCell, BenchResult
from specwatch.choosek.records import SweepResult
from specwatch.common.records import JsonRecord, RecordError, read_document
from specwatch.demo.report import load_demo_result

R = TypeVar("R", bound=JsonRecord)


def record(cls: type[R], doc: Mapping[str, Any] | None, where: str | None = None) -> R | None:
    """The record ``cls`` of the parsed (or edited) document ``doc`` (None for None): its
    ``from_json`` where the record has one (the file-level checks included), else its generic
    reader. Raises the record's RecordError naming the field."""
    if doc is None:
        return None
    assert isinstance(doc, Mapping), f"record() takes a parsed document, not {type(doc).__name__}"
    from_json = getattr(cls, "from_json", None)
    if from_json is not None:
        return from_json(doc, where)
    return read_document(cls, doc, where, cls.__name__, RecordError)


def sweep_document(path: str | Path) -> dict[str, Any]:
    """The checked JSON document of a sweep result file (read through :meth:`SweepResult.load`,
    written back with ``to_json``): a plain dict for a test to inspect or edit into a variant."""
    return SweepResult.load(path).to_json()


def sweep_record(doc: Mapping[str, Any]) -> SweepResult:
    """``record(SweepResult, doc)``: the sweep tests' most common edge."""
    return record(SweepResult, doc)


def demo_documents(result_dir: str | Path) -> tuple[dict[str, Any], dict[str, BenchResult]]:
    """A demo result folder (:func:`specwatch.demo.report.load_demo_result`) with its summary as a
    plain dict for a test to edit (turn it back with ``record(DemoSummary, summary)``), and the
    bench results as records."""
    summary, benches = load_demo_result(Path(result_dir))
    return summary.to_json(), benches


def bench_record(doc: Mapping[str, Any] | None) -> BenchResult | None:
    """``record(BenchResult, doc)``: a bench result document a test edited (None: no file)."""
    return record(BenchResult, doc)


def cell_record(doc: Mapping[str, Any]) -> BenchCell:
    """``record(BenchCell, doc)``: a cell summary document a test constructed with the bench's field
    names (what :meth:`specwatch.choosek.measurement.Measurement.from_cell` takes)."""
    return record(BenchCell, doc)
