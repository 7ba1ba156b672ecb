"""Issue 36 for sweeps: `specwatch advise`, `report` and `calibrate --from-sweep` decide with the one
rule (specwatch.specdecode.decision.decide) on paired per-batch ratios, and a dynamic table is a
configuration of its own.

Real data: tests/fixtures/sweeps/embedded-ngram-draft-sweep.json (baseline, ngram k = 2 and 4,
draft_model k = 3; 2 batches per cell) and embedded-ngram-table-sweep.json (baseline, ngram k = 4
and ngram k = 4 with the table [[1,2,4],[3,1024,1]]; 3 batches per cell); README there.
"""

from __future__ import annotations

import copy
import json
import math
import re
import statistics
from pathlib import Path

import pytest
from click.testing import CliRunner

from specwatch.choosek.advise import advise_sweep
from specwatch.choosek.calibrate import profile_from_sweep
from specwatch.choosek.cli import advise as advise_cmd
from specwatch.choosek.cli import calibrate as calibrate_cmd
from specwatch.choosek.report import render_report
from records import sweep_document, sweep_record

SWEEPS = Path(__file__).parents[1] / "fixtures" / "sweeps"
DRAFT = SWEEPS / "embedded-ngram-draft-sweep.json"
TABLE = SWEEPS / "embedded-ngram-table-sweep.json"
TABLE_NAME = "table [[1,2,4],[3,1024,1]]"


def _family(doc, word: str = "ngram"):
    (a,) = [x for x in advise_sweep(sweep_record(doc)) if word in x.family]
    return a, {(r.workload, r.concurrency): r for r in a.recommendations}


def _cell(doc, config, wl, c):
    return next(x for x in doc["cells"] if (x["config"], x["workload"], x["max_concurrency"]) == (config, wl, c))


def _measured(doc, config, wl, c) -> dict[int, float]:
    return {b["batch_index"]: b["output_throughput"] for b in _cell(doc, config, wl, c)["batches"] if not b["warmup"]}


def _intervals(text: str) -> list[tuple[float, float]]:
    """Every printed interval ``[a–b]`` or ``[a, b]`` of a command's output."""
    return [(float(a), float(b)) for a, b in re.findall(r"\[(-?[\d.]+)\s*[–,]\s*(-?[\d.]+)\]", text)]


# ------------------------------------------------------------------------------- the project's CPU fixture
@pytest.fixture(scope="module")
def draft_doc():
    return sweep_document(DRAFT)


@pytest.mark.parametrize("c", [2, 4, 8])
def test_copy_picks_the_measured_best_k(draft_doc, c):
    """copy at c = 2, 4, 8: k = 4, the best measured ngram configuration (the overlap rule answered
    k = 2, "tie", 24.8-33.8 % below it)."""
    thr = {cfg: _cell(draft_doc, cfg, "copy", c)["summary"]["output_throughput"] for cfg in ("baseline", "ngram-k2", "ngram-k4")}
    best = max(thr, key=thr.get)
    assert best == "ngram-k4"
    a, recs = _family(draft_doc)
    r = recs[("copy", c)]
    assert r.config == "k=4" and r.k == 4 and not r.tie
    # the speedup is the geometric mean of the paired per-batch ratios, its interval positive
    k4, base = _measured(draft_doc, "ngram-k4", "copy", c), _measured(draft_doc, "baseline", "copy", c)
    expect = math.exp(statistics.fmean(math.log(k4[i] / base[i]) for i in sorted(k4)))
    assert r.speedup == pytest.approx(expect, rel=1e-12)
    assert 0 < r.pick.pick.lower < r.speedup < r.pick.pick.upper
    (acc,) = [x for x in a.accuracy if (x.workload, x.concurrency) == ("copy", c)]
    assert acc.picked == acc.best == "k=4" and acc.shortfall == 0.0


def test_every_printed_interval_is_positive(draft_doc, tmp_path):
    out = tmp_path / "a.json"
    r = CliRunner().invoke(advise_cmd, [str(DRAFT), "--json", str(out)])
    assert r.exit_code == 0, r.output
    ivs = _intervals(r.output)
    assert len(ivs) > 40
    assert all(0 < lo <= hi for lo, hi in ivs), [x for x in ivs if x[0] <= 0]
    assert "cross-validation" not in r.output and "tie:" not in r.output
    doc = json.loads(out.read_text())
    for fam in doc["families"]:
        for row in fam["recommendations"]:
            p = row["pick"]
            assert p is not None and p["text"]
            if row["workload"] == "*":  # the pick per concurrency is printed with its confidence
                assert f"  c={row['concurrency']}: {row['config']} ({p['text']})" in r.output
            for x in (p, p["versus_runner_up"] or {}):
                assert x.get("lower") is None or x["lower"] > 0
    html = render_report(sweep_record(draft_doc))
    assert all(0 < lo <= hi for lo, hi in _intervals(html))


def test_drafts_never_accepted_cannot_pay(draft_doc):
    """random-output at c = 1: not one draft token accepted by k = 2 or k = 4 (the counters say
    so): both are excluded and the pick is off, "loses", whatever the ratios' noise."""
    for cfg in ("ngram-k2", "ngram-k4"):
        assert _cell(draft_doc, cfg, "random-output", 1)["summary"]["spec_decode_accepted_tokens"] == 0
    _, recs = _family(draft_doc)
    r = recs[("random-output", 1)]
    assert r.config == "off" and r.verdict == "loses"
    assert {n for n, _ in r.pick.excluded} == {"k=2", "k=4"}


def test_batches_that_cannot_be_paired_are_named(draft_doc, tmp_path):
    """ngram-k4's batches at copy c = 2 sent another number of prompts than the baseline's: they
    are not paired; the ratio has no interval and one line names the cell."""
    doc = copy.deepcopy(draft_doc)
    for b in _cell(doc, "ngram-k4", "copy", 2)["batches"]:
        b["num_prompts"] = 3
    _, recs = _family(doc)
    r = recs[("copy", 2)]
    k4 = next(x for x in r.pick.candidates if x.name == "k=4")
    assert not k4.has_interval and k4.log_ratios is None
    assert any("ngram-k4/copy/c=2" in n and "not paired" in n for n in r.notes)
    path = tmp_path / "unpaired.json"
    path.write_text(json.dumps(doc))
    res = CliRunner().invoke(advise_cmd, [str(path)])
    assert res.exit_code == 0, res.output
    lines = [x for x in res.output.splitlines() if "not paired with the baseline's batches" in x]
    assert len(lines) == 1 and lines[0].endswith("ngram-k4/copy/c=2 batch 1, 2")
    # two cells: still one line, naming both
    for b in _cell(doc, "ngram-k2", "random-output", 8)["batches"]:
        b["num_prompts"] = 5
    path.write_text(json.dumps(doc))
    res = CliRunner().invoke(advise_cmd, [str(path)])
    lines = [x for x in res.output.splitlines() if "not paired with the baseline's batches" in x]
    assert len(lines) == 1 and "ngram-k4/copy/c=2 batch 1, 2" in lines[0] and "ngram-k2/random-output/c=8 batch" in lines[0]


def test_a_composed_table_is_a_candidate_to_measure_never_the_answer(draft_doc, tmp_path):
    """Where the picks differ across concurrencies, each concurrency's configuration is given and
    the table composed from them is printed as a candidate to measure with its sweep command."""
    doc = copy.deepcopy(draft_doc)
    for wl in ("copy", "random-output"):  # k = 4 slower than k = 2 at c = 8, batch by batch
        k2 = _measured(doc, "ngram-k2", wl, 8)
        for b in _cell(doc, "ngram-k4", wl, 8)["batches"]:
            if not b["warmup"]:
                b["output_throughput"] = k2[b["batch_index"]] * 0.8
    a, recs = _family(doc)
    assert a.answer == "per_concurrency" and a.speculative_config is None
    assert a.config_by_concurrency[1] == "k=4" and a.config_by_concurrency[8] != "k=4"
    assert a.candidate_config["num_speculative_tokens_per_batch_size"]
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(doc))
    res = CliRunner().invoke(advise_cmd, [str(path)])
    assert res.exit_code == 0, res.output
    assert "candidate to measure" in res.output and "vLLM flag to paste" not in res.output
    cmd = next(line.strip() for line in res.output.splitlines() if line.strip().startswith("specwatch sweep"))
    assert f"--result-file {tmp_path / 'mixed'}-table.json" in cmd
    assert "--workloads copy,random-output" in cmd and "--concurrency 1,2,4,8" in cmd and "--output-len 128" in cmd
    assert cmd.count("--speculative-config") >= 2 and "num_speculative_tokens_per_batch_size" in cmd


# ------------------------------------------------------------------------------- a real fixed k and table sweep
@pytest.fixture(scope="module")
def table_doc():
    return sweep_document(TABLE)


def test_the_table_sweep_is_what_it_says(table_doc):
    cfgs = {c["name"]: c["speculative_config"] for c in table_doc["configs"]}
    assert cfgs["ngram-k4"]["num_speculative_tokens"] == cfgs["ngram-k4-2"]["num_speculative_tokens"] == 4
    assert cfgs["ngram-k4-2"]["num_speculative_tokens_per_batch_size"] == [[1, 2, 4], [3, 1024, 1]]
    assert "num_speculative_tokens_per_batch_size" not in cfgs["ngram-k4"]
    assert {(c["config"], c["workload"], c["max_concurrency"]) for c in table_doc["cells"]} == {
        (cfg, wl, c) for cfg in cfgs for wl in ("copy", "random-output") for c in (1, 4)}


def test_advise_keeps_the_fixed_k_and_the_table_apart(table_doc):
    """Every row compares off, k = 4 and the table (the old advice dropped every k = 4 cell)."""
    a, recs = _family(table_doc)
    assert set(recs) == {(wl, c) for wl in ("copy", "random-output", "*") for c in (1, 4)}
    for key, r in recs.items():
        assert r.k is not None, (key, r.reason)
        assert {"off", "k=4", TABLE_NAME} <= set(r.scores), key
    for wl in ("copy", "random-output"):
        for c in (1, 4):
            for cfg, name in (("ngram-k4", "k=4"), ("ngram-k4-2", TABLE_NAME)):
                spec, base = _measured(table_doc, cfg, wl, c), _measured(table_doc, "baseline", wl, c)
                expect = math.exp(statistics.fmean(math.log(spec[i] / base[i]) for i in sorted(spec)))
                assert recs[(wl, c)].scores[name] == pytest.approx(expect, rel=1e-12)
    # the measured table is shown beside the fixed k in the throughput table
    assert set(a.table_throughputs) == {TABLE_NAME}
    assert len(a.table_throughputs[TABLE_NAME]) == 4


def test_advise_cli_prints_both_configurations_in_every_table(table_doc, tmp_path):
    out = tmp_path / "t.json"
    r = CliRunner().invoke(advise_cmd, [str(TABLE), "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert all(0 < lo <= hi for lo, hi in _intervals(r.output))
    doc = json.loads(out.read_text())
    (fam,) = doc["families"]
    for row in fam["recommendations"]:
        assert set(row["scores"]) >= {"k=4", TABLE_NAME}
    assert TABLE_NAME in fam["table_throughputs"]
    # the answer: one configuration everywhere, or per concurrency; a measured table is pasted only
    # where the table itself is the pick at every concurrency
    if fam["answer"] == "one":
        assert fam["speculative_config"] == fam["config_of"][fam["config_by_concurrency"]["1"]]
    else:
        assert fam["speculative_config"] is None


def test_a_measured_table_that_beats_the_fixed_k_everywhere_is_the_answer(table_doc):
    doc = copy.deepcopy(table_doc)
    for wl in ("copy", "random-output"):
        for c in (1, 4):
            k4 = _measured(doc, "ngram-k4", wl, c)
            for b in _cell(doc, "ngram-k4-2", wl, c)["batches"]:
                if not b["warmup"]:
                    b["output_throughput"] = k4[b["batch_index"]] * 1.5
    a, recs = _family(doc)
    assert {recs[("*", c)].config for c in (1, 4)} == {TABLE_NAME}
    assert a.answer == "one"
    assert a.speculative_config["num_speculative_tokens_per_batch_size"] == [[1, 2, 4], [3, 1024, 1]]
    assert a.candidate_config is None


def test_calibrate_leaves_the_table_out_with_one_line(table_doc, tmp_path):
    notes: list[str] = []
    prof = profile_from_sweep(sweep_record(table_doc), name="t", source_path=str(TABLE), notes=notes)
    assert len(notes) == 1 and notes[0].startswith("ngram-k4-2: left out: a dynamic table ([[1,2,4],[3,1024,1]])")
    (curve,) = prof.speculative
    assert (curve.method, curve.k) == ("ngram", 4)
    fixed = [c for c in table_doc["cells"] if c["config"] == "ngram-k4" and c["summary"].get("server_step_duration_ms")]
    assert len(curve.points) == len(fixed) == 4
    out = tmp_path / "p.yaml"
    r = CliRunner().invoke(calibrate_cmd, ["--from-sweep", str(TABLE), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.exists() and "ngram-k4-2: left out: a dynamic table" in r.output
    assert "a second curve" not in r.output


def test_report_shows_both_configurations(table_doc):
    html = render_report(sweep_record(table_doc))
    for wl in ("copy", "random-output"):
        for c in (1, 4):
            assert re.search(rf"<td>{wl}</td><td>{c}</td><td>ngram-k4 \(k=4\)</td>", html), (wl, c)
            assert re.search(rf"<td>{wl}</td><td>{c}</td><td>ngram-k4-2 \(table \[\[1,2,4\],\[3,1024,1\]\]\)</td>", html)
    assert all(0 < lo <= hi for lo, hi in _intervals(html))
    assert "confidence / note" in html


def test_curves_and_measured_lengths_come_from_the_fixed_k_not_the_table(table_doc):
    from specwatch.choosek.charts import expected_length_series, largest_k_runs
    from specwatch.choosek.resultfile import measurements

    ms = measurements(sweep_record(table_doc))
    # the table listed first: a tie in basis and k must still go to the fixed k
    ms = sorted(ms, key=lambda m: not m.variable_width)
    runs = largest_k_runs(ms)
    assert runs and all(not m.variable_width for m in runs.values())
    fixed = {(m.workload, m.concurrency): m for m in ms if m.config == "ngram-k4"}
    for s in expected_length_series(ms):
        assert s["measured"] == ([] if fixed[(s["workload"], s["concurrency"])].ragged_drafts
                                 else [(4, fixed[(s["workload"], s["concurrency"])].acceptance_length)])
    a, _ = _family(table_doc)
    for p in a.acceptance:
        if p.k == 4 and p.measured is not None:
            assert p.measured == fixed[(p.workload, p.concurrency)].acceptance_length


def test_what_ifs_are_candidates_with_their_basis_and_physics(draft_doc):
    """--candidates all: the what-if k′ (k = 1, 3 for ngram) are candidates, basis calibrated, with
    no per-batch ratios; where every measured k's drafts were never accepted, they cannot pay either."""
    (a,) = [x for x in advise_sweep(sweep_record(draft_doc), candidates="all") if "ngram" in x.family]
    recs = {(r.workload, r.concurrency): r for r in a.recommendations}
    for key in (("copy", 2), ("random-output", 1)):
        cands = {c.name: c for c in recs[key].pick.candidates}
        assert cands["k=3"].basis == "calibrated" and cands["k=3"].log_ratios is None
        assert cands["k=4"].basis == "measured" and cands["k=4"].log_ratios is not None
    r = recs[("random-output", 1)]
    assert r.config == "off" and r.verdict == "loses"
    assert {n for n, _ in r.pick.excluded} == {"k=1", "k=2", "k=3", "k=4"}
    assert recs[("copy", 2)].config == "k=4"
