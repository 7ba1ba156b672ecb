"""A profile calibrated from a paired sweep records the spread of the relative cost between its
rounds, and the calibrated intervals use it (issue #37, item 4), on two real sweeps of the same
cells (tests/fixtures/sweeps/embedded-{paired,sequential}-sweep.json)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from specwatch.choosek.calibrate import SPREAD_FLOOR, paired_cost_spread, profile_from_sweep
from specwatch.choosek.records import SweepResult

SWEEPS = Path(__file__).parents[1] / "fixtures" / "sweeps"
PAIRED = SWEEPS / "embedded-paired-sweep.json"
SEQUENTIAL = SWEEPS / "embedded-sequential-sweep.json"


def _sd_log_cost(cell: dict) -> float:
    """sd(ln(step_i / plain step_i)) over the measured pairs, straight from the file's dicts."""
    base = {b["batch_index"]: b["server_step_duration_ms"] for b in cell["baseline_batches"] if not b["warmup"]}
    logs = [math.log(b["server_step_duration_ms"] / base[b["batch_index"]]) for b in cell["batches"] if not b["warmup"]]
    return statistics.stdev(logs)


def test_a_paired_curve_records_the_spread_of_c_between_its_rounds():
    doc = json.loads(PAIRED.read_text())
    prof = profile_from_sweep(SweepResult.load(PAIRED), name="p", source_path=str(PAIRED))
    assert "paired rounds' spread of the relative cost" in prof.provenance["how"]
    for curve in prof.speculative:
        cells = [c for c in doc["cells"] if c["k"] == curve.k and c.get("mode") == "paired"]
        assert len(cells) == 4
        want = max(SPREAD_FLOOR, math.sqrt(statistics.fmean(_sd_log_cost(c) ** 2 for c in cells)))
        assert curve.spread == pytest.approx(want, abs=5e-5)  # stored to 4 decimals
        # the calibrated intervals take it: the profile's lookup of c carries this spread
        p = curve.points[0]
        lk = prof.cost_ratio(p.running_requests, curve.k, curve.method, curve.drafter,
                             drafted_tokens_per_step=p.drafted_tokens_per_step, context_tokens=p.context_tokens)
        assert lk is not None and lk.spread == pytest.approx(curve.spread, rel=1e-3)


def test_a_sequential_sweep_keeps_the_batch_to_batch_spread_of_each_side():
    rec = SweepResult.load(SEQUENTIAL)
    assert all(paired_cost_spread(c) is None for c in rec.cells)
    prof = profile_from_sweep(rec, name="s", source_path=str(SEQUENTIAL))
    assert "paired rounds" not in prof.provenance["how"]
    doc = json.loads(SEQUENTIAL.read_text())
    base = {(c["workload"], c["max_concurrency"]): c for c in doc["cells"] if c["k"] == 0}

    def rel_sd(cell):
        v = [b["server_step_duration_ms"] for b in cell["batches"] if not b["warmup"]]
        return statistics.stdev(v) / statistics.fmean(v)

    for curve in prof.speculative:
        sds = []
        for c in doc["cells"]:
            if c["k"] == curve.k:
                sds += [rel_sd(c), rel_sd(base[(c["workload"], c["max_concurrency"])])]
        assert curve.spread == pytest.approx(max(SPREAD_FLOOR, math.sqrt(statistics.fmean(v * v for v in sds))), abs=5e-5)


def test_a_paired_cell_without_two_usable_pairs_has_no_paired_spread():
    rec = SweepResult.load(PAIRED)
    cell = next(c for c in rec.cells if c.paired and c.baseline_batches)
    assert paired_cost_spread(cell) is not None
    from dataclasses import replace
    one = replace(cell, baseline_batches=tuple(b for b in cell.baseline_batches if b.warmup or b.batch_index == 1))
    assert paired_cost_spread(one) is None
