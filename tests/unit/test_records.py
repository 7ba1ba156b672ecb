"""The typed result records (specwatch.bench.records, specwatch.choosek.records): every result
file in the repository reads into its record and writes back to the same JSON, byte for byte;
units are converted at the boundary; a damaged file's error names the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.bench.records import BenchCell, BenchRecordError, BenchResult
from specwatch.choosek.records import SweepRecordError, SweepResult
from specwatch.common.records import RecordError, percent_to_fraction

from bench_records import one_batch_cell_record

ROOT = Path(__file__).resolve().parents[2]


def _documents(key: str) -> list[Path]:
    out = []
    for p in sorted([*ROOT.glob("tests/fixtures/**/*.json"), *ROOT.glob("docs/**/*.json")]):
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except ValueError:
            continue
        if isinstance(doc, dict) and key in doc:
            out.append(p)
    return out


BENCH_FILES = _documents("specwatch_bench_format")
SWEEP_FILES = _documents("specwatch_sweep_format")


def test_the_repository_has_result_files_of_both_kinds():
    assert len(BENCH_FILES) >= 6 and len(SWEEP_FILES) >= 4


@pytest.mark.parametrize("path", BENCH_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_bench_file_round_trips(path):
    doc = json.loads(path.read_text(encoding="utf-8"))
    rec = BenchResult.load(path)
    assert rec.to_json() == doc
    assert json.dumps(rec.to_json(), indent=1) == json.dumps(doc, indent=1)  # same keys in the same order
    assert len(rec.cells) == len(doc["summary"]) and len(rec.batches) == len(doc["batches"])
    for cell, raw in zip(rec.cells, doc["summary"], strict=True):
        assert cell.workload == raw["workload"] and cell.output_throughput == raw["output_throughput"]
        pct = raw.get("spec_decode_acceptance_rate")
        assert (cell.acceptance_rate is None) == (pct is None)
        if pct is not None:  # 0-1 inside, percent in the file
            assert 0 <= cell.acceptance_rate <= 1 and cell.acceptance_rate * 100 == pct


@pytest.mark.parametrize("path", SWEEP_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_sweep_file_round_trips(path):
    doc = json.loads(path.read_text(encoding="utf-8"))
    rec = SweepResult.load(path)
    assert rec.to_json() == doc
    assert json.dumps(rec.to_json(), indent=1) == json.dumps(doc, indent=1)
    assert [c.key for c in rec.cells] == [(c["config"], c["workload"], c["max_concurrency"]) for c in doc["cells"]]
    assert [c.name for c in rec.configs] == [c["name"] for c in doc["configs"]]


def test_a_document_without_a_format_key_is_format_1_and_stays_without_it():
    bench = {"status": "complete", "summary": [{"workload": "copy", "max_concurrency": 1, "output_throughput": 5.0}]}
    rec = BenchResult.from_json(bench)
    assert rec.format == 1 and rec.cells[0].output_throughput == 5.0 and rec.to_json() == bench
    sweep = {"cells": []}
    assert SweepResult.from_json(sweep).format == 1 and SweepResult.from_json(sweep).to_json() == sweep


def test_the_writers_records_are_what_the_records_read():
    rec = one_batch_cell_record()
    cell = BenchCell.from_json(rec)
    assert cell.to_json() == rec
    assert cell.acceptance_rate == 250 / 400 and rec["spec_decode_acceptance_rate"] == 250 / 400 * 100
    assert cell.per_position_acceptance_rates == (0.9, 0.7, 0.5, 0.4)


@pytest.mark.parametrize("pct", [62.5, 63.21428571428571, 0.0, 100.0, 33.33333333333333, 97.14285714285714])
def test_percentages_convert_back_to_the_same_bytes(pct):
    r = percent_to_fraction(pct)
    assert r * 100.0 == pct and abs(r - pct / 100) < 1e-15


@pytest.mark.parametrize("change, field", [
    (lambda d: d["cells"][0].update(k="4"), "cells[0]: 'k' is missing or not an integer"),
    (lambda d: d["cells"][1]["summary"].update(mean_tpot_ms="slow"), "cells[1]: summary 'mean_tpot_ms' is not a number"),
    (lambda d: d["cells"][0]["batches"][0].update(warmup="no"), "cells[0]: batches[0]: 'warmup' is not true or false"),
    (lambda d: d["configs"][0].pop("name"), "configs[0]: 'name' is missing"),
    (lambda d: d["settings"].update(concurrencies=["1"]), "settings concurrencies[0] is not an integer"),
])
def test_a_damaged_sweep_file_names_the_file_and_the_field(tmp_path, change, field):
    doc = json.loads(SWEEP_FILES[0].read_text(encoding="utf-8"))
    change(doc)
    f = tmp_path / "damaged.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(SweepRecordError) as info:
        SweepResult.load(f)
    assert isinstance(info.value, RecordError)
    assert str(f) in info.value.message and field in info.value.message, info.value.message
    assert "\n" not in info.value.message


def test_a_damaged_bench_file_names_the_file_and_the_field(tmp_path):
    doc = json.loads((ROOT / "tests/fixtures/demo/bench-speculative.json").read_text(encoding="utf-8"))
    doc["summary"][2]["spec_decode_per_position_acceptance_rates"] = [0.5, "x"]
    f = tmp_path / "bench.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(BenchRecordError, match=r"bench\.json is a damaged bench result: summary\[2\]: "
                                               r"spec_decode_per_position_acceptance_rates\[1\] is not a number"):
        BenchResult.load(f)
    f.write_text(json.dumps({**doc, "specwatch_bench_format": 7}))
    with pytest.raises(BenchRecordError, match="format 1"):
        BenchResult.load(f)
    f.write_text("{")
    with pytest.raises(BenchRecordError, match="not valid JSON"):
        BenchResult.load(f)
