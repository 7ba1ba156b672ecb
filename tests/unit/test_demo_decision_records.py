"""The demo's decision table as typed records (:mod:`specwatch.demo.decisionrecords`):
``decide()`` writes exactly the JSON captured in tests/fixtures/demo-decision (format 2, the one
decision rule, issue #36; see its README), every decision document round-trips, older documents
(format 1: the real run's own decision, a withheld choice, no ``certain``, a ``profile`` added by
the report) read and render as captured, a damaged decision in a demo summary is one line naming
the field, and no package module reads a decision by key outside its record module."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from specwatch import demo as demo_mod
from specwatch.bench.records import BenchResult
from specwatch.demo import decision as dd
from specwatch.demo import report as demoreport
from specwatch.demo.decisionrecords import Decision, DecisionChoice, DecisionRecordError, DecisionRow, ProfileFit
from specwatch.demo.records import DemoSummary, DemoSummaryError
from specwatch.common.records import RecordError
from specwatch.specdecode.costprofile import EMBEDDED_CPU_PROFILE, load_profile
from records import bench_record, record

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DEMO = FIXTURES / "demo"
GOLDEN = FIXTURES / "demo-decision"


def _load(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def _same(a, b) -> bool:
    """Equal as JSON text: the same keys, in the same order, with the same values."""
    return json.dumps(a) == json.dumps(b)


@pytest.fixture(scope="module")
def docs():
    return _load(DEMO / "bench-baseline.json"), _load(DEMO / "bench-speculative.json"), _load(DEMO / "demo-summary.json")


@pytest.fixture(scope="module")
def golden():
    return _load(GOLDEN / "decisions.json")


def _plain():
    prof = load_profile(EMBEDDED_CPU_PROFILE)
    return lambda b: prof.plain_step(b).seconds


def _one_batch(doc):
    doc = copy.deepcopy(doc)
    doc["batches"] = [b for b in doc["batches"] if b["warmup"] or b["batch_index"] == 1]
    return doc


def _variants(docs):
    base, spec, summary = docs
    benches = {"baseline": BenchResult.from_json(base), "speculative": BenchResult.from_json(spec)}
    return {
        "profile_k4": lambda: dd.decide(bench_record(base), bench_record(spec), 4, plain_step=_plain()),
        "noprofile_k4": lambda: dd.decide(bench_record(base), bench_record(spec), 4),
        "profile_k2": lambda: dd.decide(bench_record(base), bench_record(spec), 2, plain_step=_plain()),
        "tolerance5_k4": lambda: dd.decide(bench_record(base), bench_record(spec), 4, plain_step=_plain(), tolerance=0.05),
        "one_batch_k4": lambda: dd.decide(bench_record(_one_batch(base)), bench_record(_one_batch(spec)), 4, plain_step=_plain()),
        "no_files_k4": lambda: dd.decide(None, None, 4),
        "demo_decision": lambda: demoreport.demo_decision(record(DemoSummary, {k: v for k, v in summary.items() if k != "decision"}),
                                                          benches),
        "slow_profile_k4": lambda: dd.decide(bench_record(base), bench_record(spec), 4, plain_step=lambda b: 1.0),
    }


def test_decide_returns_a_record_that_writes_the_captured_json(docs, golden):
    variants = _variants(docs)
    assert set(variants) == set(golden)
    for name, make in variants.items():
        d = make()
        assert isinstance(d, Decision) and all(isinstance(r, DecisionRow) for r in d.rows), name
        assert d.decision_format == 2 and d.to_json()["decision_format"] == 2, name
        assert _same(d.to_json(), golden[name]), name


def test_a_decision_round_trips(docs, golden):
    for name, make in _variants(docs).items():
        d = make()
        doc = json.loads(json.dumps(d.to_json()))
        assert Decision.from_json(d.to_json()).to_json() == d.to_json(), name
        assert _same(Decision.from_json(doc).to_json(), doc), name
    # the documents older versions wrote, and the fixture's own decision (with "profile")
    for name, doc in {**_load(GOLDEN / "old-decisions.json"), "fixture": docs[2]["decision"],
                      "fixture_format1": _load(GOLDEN / "fixture-format1-decision.json")}.items():
        assert _same(Decision.from_json(doc).to_json(), doc), name


def test_the_records_carry_the_numbers(docs):
    base, spec, summary = docs
    d = dd.decide(bench_record(base), bench_record(spec), summary["k"], plain_step=_plain())
    row = d.rows[0]
    assert (row.workload, row.concurrency) == (summary["workloads"][0], summary["concurrencies"][0])
    assert row.measured.basis == "measured" and row.measured.lower <= row.measured.value <= row.measured.upper
    assert row.cost.c == pytest.approx(row.cost.t_spec_ms / row.cost.t0_ms)
    assert [w.k for w in row.what_if] == list(range(1, summary["k"] + 1))
    assert row.what_if[-1].relative_to_run == 1.0 and row.what_if[-1].value == row.measured.value
    assert d.cost_line(row.concurrency).points == len(summary["workloads"]) and d.cost_line(999) is None
    assert all(isinstance(f, ProfileFit) for f in d.profile_fit) and d.profile is None and d.profile_name is None
    assert isinstance(row.choice, DecisionChoice) and row.choice.is_certain == row.choice.certain


def test_old_documents_read_and_render_as_before(docs):
    rendered = _load(GOLDEN / "renderings.json")
    documents = {**_load(GOLDEN / "old-decisions.json"), **_load(GOLDEN / "decisions.json"),
                 "fixture": docs[2]["decision"], "fixture_format1": _load(GOLDEN / "fixture-format1-decision.json"),
                 "rows_only": {"rows": [docs[2]["decision"]["rows"][0]]}}
    assert set(documents) | {"none"} == set(rendered)
    for name, doc in documents.items():
        rec = Decision.from_json(doc)
        want = rendered[name]
        for d in (record(Decision, doc), rec):  # the parsed document, read at the test's edge, and the record
            assert dd.table_rows(d) == want["table_rows"], name
            assert demoreport.decision_section(d) == want["decision_section"], name
            buf = io.StringIO()
            if want["console"] is not None:
                demo_mod._print_decision(d, Console(width=200, file=buf, color_system=None))
                assert buf.getvalue() == want["console"], name
        assert [dd.format_choice(r) for r in rec.rows] == want["format_choice"], name
        assert [dd.format_verdict(r) for r in rec.rows] == want["format_verdict"], name
        assert [[dd.format_estimate(r.measured), dd.format_estimate(r.calibrated, with_basis=False)]
                + [dd.format_estimate(w) for w in r.what_if] for r in rec.rows] == want["format_estimate"], name
        assert dd.profile_fit_lines(rec.profile_fit, rec.profile_name) == want["profile_fit_lines"], name
    assert demoreport.decision_section(None) == rendered["none"]["decision_section"]
    # what the old documents hold: a choice withheld (k null), choices without "certain"
    old = Decision.from_json(_load(GOLDEN / "old-decisions.json")["old"])
    assert old.rows[0].choice.k is None and dd.format_choice(old.rows[0]) == "withheld: uncertain"
    assert old.rows[1].choice.certain is None and old.rows[1].choice.is_certain
    assert old.rows[2].choice.certain is None and not old.rows[2].choice.is_certain
    # a format-1 document renders with its own legend and no confidence; a format-2 one with the rule's
    f1 = Decision.from_json(_load(GOLDEN / "fixture-format1-decision.json"))
    assert f1.decision_format == 1 and dd.choice_legend(f1) == dd.CHOICE_LEGEND
    assert all(row[-1] == "–" for row in dd.table_rows(f1)) and "uncertain: off/k=4/k=1" in dd.table_rows(f1)[0][5]
    f2 = Decision.from_json(docs[2]["decision"])
    assert f2.decision_format == 2 and dd.choice_legend(f2) == dd.RULE_LEGEND
    assert all(row[-1] == r.confidence != "–" for row, r in zip(dd.table_rows(f2), f2.rows, strict=True))


def test_a_decision_of_an_unknown_format_is_one_line_naming_it():
    with pytest.raises(DecisionRecordError, match="decision_format: 3") as info:
        Decision.from_json({"decision_format": 3, "k": 4, "rows": []}, "the decision")
    assert "\n" not in str(info.value) and "format 1, 2" in str(info.value)


def test_the_demo_summary_holds_a_typed_decision_and_writes_it_unchanged(docs):
    summary = DemoSummary.load(DEMO / "demo-summary.json")
    assert isinstance(summary.decision, Decision) and summary.decision.profile.file.endswith(EMBEDDED_CPU_PROFILE.name)
    assert _same(summary.to_json(), docs[2])
    # the demo stores demo_decision()'s record: the summary writes its JSON
    base, spec, _ = docs
    made = demoreport.demo_decision(record(DemoSummary, {k: v for k, v in docs[2].items() if k != "decision"}),
                                    {"baseline": bench_record(base), "speculative": bench_record(spec)})
    stored = dataclasses.replace(summary, decision=made)
    assert _same(stored.to_json()["decision"], made.to_json())
    assert _same(DemoSummary.from_json(json.loads(json.dumps(stored.to_json()))).to_json(), stored.to_json())
    assert demoreport.demo_decision(summary, {}) is summary.decision  # the written decision, as it is


@pytest.mark.parametrize(("edit", "field"), [
    (lambda d: d["rows"][0]["choice"].__setitem__("k", "4"), "decision rows[0]: choice 'k' is not an integer"),
    (lambda d: d["rows"][1]["measured"].__setitem__("value", "fast"), "decision rows[1]: measured 'value' is not a number"),
    (lambda d: d["rows"][2]["what_if"].__setitem__(0, 3), "decision rows[2]: what_if[0] is not an object"),
    (lambda d: d["cost_lines"].__setitem__("1", {"b": []}), "decision cost_lines['1']: 'b' is not a number"),
    (lambda d: d["profile_fit"][0].__setitem__("fits", "yes"), "decision profile_fit[0]: 'fits' is not true or false"),
    (lambda d: d.__setitem__("rows", {}), "decision 'rows' is not a list"),
])
def test_a_damaged_decision_in_a_summary_is_one_line_naming_the_field(tmp_path, docs, edit, field):
    doc = copy.deepcopy(docs[2])
    edit(doc["decision"])
    f = tmp_path / "demo-summary.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(DemoSummaryError) as info:
        DemoSummary.load(f)
    msg = str(info.value)
    assert isinstance(info.value, RecordError) and "\n" not in msg
    assert msg == f"{f} is a damaged demo result: {field}"
    # the decision alone, and the formatters given the damaged document
    with pytest.raises(DecisionRecordError, match=re.escape(field.removeprefix("decision "))):
        Decision.from_json(doc["decision"], "decision")
    with pytest.raises(DecisionRecordError):
        dd.table_rows(record(Decision, doc["decision"]))


#: Keys of the decision document that only its record module may spell as a subscript (not the
#: generic ones other documents share, e.g. a chart series' "measured" or a cost profile's
#: "running_requests").
DECISION_KEYS = ("rows", "what_if", "choice", "calibrated", "cost_lines", "profile_fit", "curve_source",
                 "relative_to_run", "at_lower", "at_value", "at_upper", "certain", "measured_t0_ms",
                 "profile_t0_ms", "slope_halfwidth", "x_min", "x_max", "t0_ms", "t_spec_ms")


def test_no_module_reads_a_decision_by_key_outside_its_record_module():
    package = Path(__file__).resolve().parents[2] / "exporter" / "specwatch"
    pattern = re.compile(r"""(\[\s*["'](%s)["']\s*\](?!\s*=[^=]))|\.get\(\s*["'](%s)["']""" % (("|".join(DECISION_KEYS),) * 2))
    found = [f"{p.relative_to(package)}:{i}: {line.strip()}" for p in sorted(package.rglob("*.py"))
             if p.relative_to(package).as_posix() != "demo/decisionrecords.py"
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not found, "\n".join(found)
