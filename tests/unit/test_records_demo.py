"""``demo-summary.json`` as a record (:mod:`specwatch.demo.records`): the shipped demo
result round-trips byte for byte, a file without the format key (written before it existed) reads
as format 1, a record built in code writes the key, and a damaged field is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.bench.records import ComparisonRow
from specwatch.demo.records import FORMAT_KEY, DemoServer, DemoSummary, DemoSummaryError, RunCurve

DEMO = Path(__file__).resolve().parents[1] / "fixtures" / "demo" / "demo-summary.json"


def test_the_shipped_demo_summary_round_trips_byte_for_byte():
    doc = json.loads(DEMO.read_text(encoding="utf-8"))
    assert FORMAT_KEY not in doc  # written before the key existed: format 1
    rec = DemoSummary.load(DEMO)
    assert rec.format == 1 and rec.to_json() == doc
    assert json.dumps(rec.to_json(), indent=1) == json.dumps(doc, indent=1)
    assert rec.k == doc["k"] and rec.run_status == "complete"
    assert rec.servers["baseline"].startup_seconds == doc["servers"]["baseline"]["startup_seconds"]
    row = rec.comparison[0]
    assert row.acceptance_rate * 100 == doc["comparison"][0]["spec_decode_acceptance_rate"]
    assert rec.per_position.expected_length(1) == doc["per_position"]["expected_acceptance_length_by_k"]["1"]


def test_a_summary_built_in_code_writes_the_format_key_and_reads_back():
    s = DemoSummary(started_at="20261202-100000", workloads=("copy",), concurrencies=(1,), k=4, method="ngram",
                    output_len=64, num_batches=3)
    s = s.with_server("baseline", DemoServer(startup_seconds=30.0, port=8001))
    s = s.with_server("baseline", DemoServer(startup_seconds=30.0, port=8001, result_file="/x/bench-baseline.json"))
    doc = s.to_json()
    assert list(doc)[:2] == [FORMAT_KEY, "started_at"] and doc[FORMAT_KEY] == 1
    assert "status" not in doc and "decision" not in doc and "result_file" in doc["servers"]["baseline"]
    assert DemoSummary.from_json(json.loads(json.dumps(doc))).to_json() == doc
    assert s.result_file_name("baseline") == "bench-baseline.json" and s.result_file_name("speculative") == "bench-speculative.json"
    curve = RunCurve(per_position_acceptance_rate=(0.8, 0.6), expected_acceptance_length_by_k={"1": 1.8, "2": 2.4})
    row = ComparisonRow(workload="copy", max_concurrency=1, acceptance_rate=0.625)
    doc2 = DemoSummary(k=2, per_position=curve, comparison=(row,)).to_json()
    assert doc2["comparison"][0]["spec_decode_acceptance_rate"] == 62.5


def test_a_damaged_summary_names_the_file_and_the_field(tmp_path):
    doc = json.loads(DEMO.read_text(encoding="utf-8"))
    doc["servers"]["speculative"]["port"] = "8000"
    f = tmp_path / "demo-summary.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(DemoSummaryError) as info:
        DemoSummary.load(f)
    assert str(f) in str(info.value) and "'port'" in str(info.value) and "\n" not in str(info.value)
    f.write_text(json.dumps({**doc, FORMAT_KEY: 99}))
    with pytest.raises(DemoSummaryError, match="format"):
        DemoSummary.load(f)
    f.write_text(json.dumps({"cells": []}))
    with pytest.raises(DemoSummaryError, match="not a specwatch demo summary"):
        DemoSummary.load(f)


def _without(doc: dict, key: str) -> dict:
    return {k: v for k, v in doc.items() if k != key}


def test_a_curve_without_e_of_k_stays_without_it():
    doc = json.loads(DEMO.read_text(encoding="utf-8"))
    doc["per_position"] = _without(doc["per_position"], "expected_acceptance_length_by_k")
    rec = DemoSummary.from_json(doc)
    assert rec.per_position.expected_acceptance_length_by_k == {} and rec.per_position.expected_length(1) is None
    assert rec.to_json() == doc
    assert json.dumps(rec.to_json(), indent=1) == json.dumps(doc, indent=1)
    curve = {"draft_acceptance_rate": 0.5, "per_position_acceptance_rate": [0.6, 0.4]}
    assert RunCurve.read(curve).to_json() == curve


def test_a_curve_with_an_empty_e_of_k_keeps_it():
    curve = {"draft_acceptance_rate": 0.5, "expected_acceptance_length_by_k": {}, "draft_tokens_per_draft": 3.0}
    assert json.dumps(RunCurve.read(curve).to_json()) == json.dumps(curve)


def test_a_summary_without_servers_stays_without_them():
    doc = _without(json.loads(DEMO.read_text(encoding="utf-8")), "servers")
    rec = DemoSummary.read(doc)  # from_json wants "servers" to recognise a demo summary; the record does not
    assert rec.servers == {}
    assert json.dumps(rec.to_json(), indent=1) == json.dumps(doc, indent=1)
    # a server set since then is written (after the keys the document had)
    doc2 = rec.with_server("baseline", DemoServer(port=8001)).to_json()
    assert list(doc2)[-1] == "servers" and doc2["servers"] == {"baseline": {"startup_seconds": None, "speculative_config": None,
                                                                         "port": 8001}}
