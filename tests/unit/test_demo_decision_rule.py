"""The demo's decision by the one decision rule (issue #36), on the bench files of a real demo run
(tests/fixtures/demo, see its README), some edited as each test says: physics first (a cell whose
drafts were never accepted is off whatever its ratio says), bases that disagree (measured rules,
and the row says so), bounds at the precision that decided, and ``specwatch advise`` on a demo
result folder or two bench files printing the demo's table (the same k, verdict and confidence in
every row), with exit 2 and one line for bad input."""

from __future__ import annotations

import copy
import io
import json
import math
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from specwatch import demo as demo_mod
from specwatch.demo import decision as dd
from specwatch.choosek.advise import WIDE_CONSOLE
from specwatch.choosek.cli import advise
from specwatch.demo.decisionrecords import Decision
from specwatch.demo.report import ADVICE_FORMAT_KEY
from records import bench_record

DEMO = Path(__file__).resolve().parents[1] / "fixtures" / "demo"


def _load(name):
    return json.loads((DEMO / name).read_text(encoding="utf-8"))


@pytest.fixture
def docs():
    return _load("bench-baseline.json"), _load("bench-speculative.json"), _load("demo-summary.json")


def _row(decision, wl, c):
    (r,) = [r for r in decision.rows if (r.workload, r.concurrency) == (wl, c)]
    return r


def _scale(doc, wl, c, factor, key="output_throughput"):
    """``key`` of every batch (and the cell) of ``wl`` at concurrency ``c`` multiplied by ``factor``."""
    for rec in [*doc["batches"], *doc["summary"]]:
        if rec["workload"] == wl and rec["max_concurrency"] == c and isinstance(rec.get(key), (int, float)):
            rec[key] *= factor


def _keep_batches(doc, keep):
    doc["batches"] = [b for b in doc["batches"] if b["warmup"] or b["batch_index"] in keep]


# -- physics first -----------------------------------------------------------------------------------


def test_a_cell_whose_drafts_were_never_accepted_is_off(docs):
    """random-output at c = 1 proposed no draft in any batch (the real run's counters): off, with
    the reason, whatever its throughput ratio; c = 4 accepted 5 tokens in batch 3, so physics does
    not decide there."""
    base, spec, summary = docs
    assert all(b["spec_decode_accepted_tokens"] == 0 for b in spec["batches"]
               if (b["workload"], b["max_concurrency"]) == ("random-output", 1))
    d = dd.decide(bench_record(base), bench_record(spec), summary["k"])
    row = _row(d, "random-output", 1)
    assert row.never_accepted and row.choice.k == 0 and row.choice.reason == "never_accepted"
    assert row.verdict == "loses" and dd.format_choice(row) == "off (no draft accepted)"
    assert dd.format_verdict(row) == "loses (no draft accepted)"
    assert row.confidence == "k=1, k=2, k=3, k=4 excluded: no draft token was accepted in any batch: it cannot pay"
    assert not _row(d, "random-output", 4).never_accepted


def test_physics_rules_over_a_ratio_that_says_pays(docs):
    """The issue's case (random-output, acceptance 0.0 %, printed "k=1"): the speculative server's
    throughput in that cell made 4× the real run's, so its paired interval lies above 1; no draft
    was accepted, so it is still off (the three-scenario rule picked k = 4 here)."""
    base, spec, summary = docs
    spec = copy.deepcopy(spec)
    _scale(spec, "random-output", 1, 4.0)
    row = _row(dd.decide(bench_record(base), bench_record(spec), summary["k"]), "random-output", 1)
    assert row.measured.verdict == "pays" and row.measured.lower > 1
    assert row.choice.k == 0 and row.choice.run == "off" and row.verdict == "loses"
    assert "no draft token was accepted" in row.note


# -- bases that disagree -------------------------------------------------------------------------------


def test_bases_that_disagree_are_said_and_measured_rules(docs):
    """Batches 1 and 2 of the real run only: at word-chain c = 4 the measured paired interval
    straddles 1 (cannot tell) while the calibrated one (step costs) lies above it (pays)."""
    base, spec, summary = docs
    base, spec = copy.deepcopy(base), copy.deepcopy(spec)
    for doc in (base, spec):
        _keep_batches(doc, {1, 2})
    d = dd.decide(bench_record(base), bench_record(spec), summary["k"])
    row = _row(d, "word-chain", 4)
    assert row.measured.verdict == "cannot_tell" and row.calibrated.verdict == "pays"
    assert row.disagreement is not None and row.disagreement.endswith("measured rules (both servers live)")
    assert row.disagreement.startswith(f"measured cannot tell [{dd.format_ratio(row.measured.lower)}–")
    assert row.verdict == "cannot_tell"  # the verdict follows the measured basis
    assert dd.format_verdict(row) == "cannot tell (calibrated: pays; measured rules)"
    assert f"the bases disagree: {row.disagreement}" in row.note
    (table_row,) = [r for r in dd.table_rows(d) if r[:2] == ["word-chain", "4"]]
    assert table_row[3] == "cannot tell (calibrated: pays; measured rules)"
    # where they agree, nothing is said
    agree = _row(d, "copy", 1)
    assert agree.disagreement is None and "measured rules" not in dd.format_verdict(agree)


# -- precision -----------------------------------------------------------------------------------------


def test_a_lower_end_just_below_1_is_printed_at_the_precision_that_decided(docs):
    """The baseline's throughput at word-chain c = 4 scaled so that the measured lower end is
    0.9989: the table prints 0.999 (not "1.00", which reads "pays") and the verdict cannot tell."""
    base, spec, summary = docs
    lower = _row(dd.decide(bench_record(base), bench_record(spec), summary["k"]), "word-chain", 4).measured.lower
    base = copy.deepcopy(base)
    _scale(base, "word-chain", 4, lower / 0.9989)
    d = dd.decide(bench_record(base), bench_record(spec), summary["k"])
    row = _row(d, "word-chain", 4)
    assert row.measured.lower == pytest.approx(0.9989, rel=1e-9) and row.measured.verdict == "cannot_tell"
    (table_row,) = [r for r in dd.table_rows(d) if r[:2] == ["word-chain", "4"]]
    assert "[0.999–" in table_row[2] and "1.00–" not in table_row[2]
    assert dd.format_estimate(row.measured).startswith(f"{dd.format_ratio(row.measured.value)}× [0.999–")


# -- the same table on every surface ---------------------------------------------------------------------


def _console_text(decision, width=WIDE_CONSOLE):
    buf = io.StringIO()
    demo_mod._print_decision(decision, Console(width=width, file=buf, color_system=None))
    return buf.getvalue()


def test_the_summary_the_console_and_the_report_show_the_same_k_verdict_and_confidence(docs):
    from specwatch.demo.report import decision_section

    decision = Decision.from_json(docs[2]["decision"])
    console = _console_text(decision, width=400)
    html = "".join(decision_section(decision))
    for r in decision.rows:
        assert r.confidence and r.verdict
        for text in (dd.format_choice(r), dd.format_verdict(r), r.confidence):
            assert text in console and text.replace("'", "&#x27;") in html or text in html


@pytest.fixture
def demo_dir(tmp_path):
    d = tmp_path / "demo-20261201-200014"
    shutil.copytree(DEMO, d)
    return d


def test_advise_on_the_demo_folder_prints_the_demos_table(demo_dir, tmp_path, docs):
    out = tmp_path / "advice.json"
    r = CliRunner().invoke(advise, [str(demo_dir), "--json", str(out)])
    assert r.exit_code == 0, r.output
    stored = Decision.from_json(docs[2]["decision"])
    # the same table, cell for cell, as the demo printed it (same console width)
    assert _console_text(stored) in r.output
    got = json.loads(out.read_text())
    assert got[ADVICE_FORMAT_KEY] == 1 and got["decision"]["decision_format"] == 2
    decided = Decision.from_json(got["decision"])
    assert [(x.workload, x.concurrency, x.choice.run, x.verdict, x.confidence) for x in decided.rows] == \
        [(x.workload, x.concurrency, x.choice.run, x.verdict, x.confidence) for x in stored.rows]
    assert dd.table_rows(decided) == dd.table_rows(stored)
    # its demo-summary.json names the folder just as well
    r2 = CliRunner().invoke(advise, [str(demo_dir / "demo-summary.json")])
    assert r2.exit_code == 0 and _console_text(stored) in r2.output


def test_advise_on_two_bench_files_prints_the_same_k_and_verdicts(demo_dir, tmp_path, docs):
    out = tmp_path / "advice.json"
    r = CliRunner().invoke(advise, ["--baseline", str(demo_dir / "bench-baseline.json"),
                                    "--speculative", str(demo_dir / "bench-speculative.json"), "--json", str(out)])
    assert r.exit_code == 0, r.output
    stored = Decision.from_json(docs[2]["decision"])
    assert _console_text(stored) in r.output  # k from the bench file's cells, the shipped profile
    assert dd.table_rows(Decision.from_json(json.loads(out.read_text())["decision"])) == dd.table_rows(stored)


def _one_line_exit_2(r, *names):
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.output
    for n in names:
        assert n in lines[0], (n, lines[0])
    assert "Traceback" not in r.output
    return lines[0]


def test_a_folder_missing_a_bench_file_is_one_line_naming_it(demo_dir):
    (demo_dir / "bench-speculative.json").unlink()
    _one_line_exit_2(CliRunner().invoke(advise, [str(demo_dir)]), str(demo_dir / "bench-speculative.json"))


@pytest.mark.parametrize("content", ['{"specwatch_bench_format": 99, "summary": []}', "not json", '{"cells": []}'])
def test_a_bench_file_of_an_unreadable_format_is_one_line_naming_it(demo_dir, content):
    (demo_dir / "bench-baseline.json").write_text(content)
    _one_line_exit_2(CliRunner().invoke(advise, [str(demo_dir)]), str(demo_dir / "bench-baseline.json"))


def test_batches_not_paired_are_refused_naming_the_cells(demo_dir):
    """Another seed: no cell is paired; another prompt count in one batch: that cell is named."""
    f = demo_dir / "bench-speculative.json"
    doc = json.loads(f.read_text())
    doc["config"]["options"]["seed"] = 1
    f.write_text(json.dumps(doc))
    line = _one_line_exit_2(CliRunner().invoke(advise, [str(demo_dir)]), "not paired", "copy c=1", "word-chain c=4",
                            "seed 0 vs 1", "--unpaired")
    assert line.count("seed 0 vs 1") == 6
    doc["config"]["options"]["seed"] = 0
    for b in doc["batches"]:
        if (b["workload"], b["max_concurrency"], b["batch_index"]) == ("copy", 4, 2):
            b["num_prompts"] = 8
    f.write_text(json.dumps(doc))
    line = _one_line_exit_2(CliRunner().invoke(advise, [str(demo_dir)]), "not paired", "copy c=4: batch 2: 4 vs 8 prompts")
    assert "copy c=1" not in line


def test_an_unpaired_comparison_only_when_asked_and_labelled(demo_dir):
    f = demo_dir / "bench-speculative.json"
    doc = json.loads(f.read_text())
    doc["config"]["options"]["seed"] = 1
    f.write_text(json.dumps(doc))
    r = CliRunner().invoke(advise, [str(demo_dir), "--unpaired"])
    assert r.exit_code == 0, r.output
    assert "compared UNPAIRED, as asked (--unpaired)" in r.output and "measured, unpaired" in r.output
    spec = json.loads(f.read_text())
    base = json.loads((demo_dir / "bench-baseline.json").read_text())
    d = dd.decide(bench_record(base), bench_record(spec), 4, unpaired=True)
    for row in d.rows:
        assert row.measured.paired is False and row.calibrated is None and "not paired (seed 0 vs 1)" in row.note
        # unpaired: the throughput estimates of both cells on the log scale, their ratio
        assert row.measured.value > 0 and row.measured.lower > 0
    # without --unpaired, decide() gives such a row no k
    plain = dd.decide(bench_record(base), bench_record(spec), 4)
    assert all(r.choice.k is None and dd.format_choice(r) == "withheld: not paired" for r in plain.rows)


def test_advise_refuses_a_demo_folder_with_another_source(demo_dir):
    r = CliRunner().invoke(advise, [str(demo_dir), "--baseline", str(demo_dir / "bench-baseline.json")])
    assert r.exit_code == 2 and "nothing else" in r.output


def test_pairing_of_the_real_run_is_complete(docs):
    base, spec, _ = docs
    assert dd.pairing(bench_record(base), bench_record(spec)) == {}
    # paired batch by batch: the same prompts (input tokens) and counts in every batch of every cell
    for b, s in zip(sorted(base["batches"], key=lambda x: (x["workload"], x["max_concurrency"], x["batch_index"])),
                    sorted(spec["batches"], key=lambda x: (x["workload"], x["max_concurrency"], x["batch_index"])),
                    strict=True):
        assert (b["num_prompts"], b["total_input_tokens"]) == (s["num_prompts"], s["total_input_tokens"])
    assert math.isfinite(dd.t975(2))


# -- the live view the demo suggests -----------------------------------------------------------------------


def test_the_demo_suggests_top_with_a_15s_window_its_exporter_serves(tmp_path):
    assert demo_mod.TOP_COMMAND == "specwatch top --window 15s"
    argv = demo_mod.DemoStack(tmp_path, "ngram", None).exporter_argv()
    windows = [argv[i + 1] for i, a in enumerate(argv) if a == "--window"]
    assert windows[0] == "15s" and {"1m", "5m"} <= set(windows)
    buf = io.StringIO()
    con = Console(width=200, file=buf, color_system=None)
    con.print(demo_mod.TOP_COMMAND)
    assert "--window 15s" in buf.getvalue()


# -- a full demo run of this code (tests/fixtures/demo-12row) -------------------------------------------

FULL = Path(__file__).resolve().parents[1] / "fixtures" / "demo-12row"


def test_a_full_demo_run_is_off_wherever_no_draft_was_accepted_and_advise_agrees(tmp_path):
    """The real run the issue's case comes from: random-output at c = 8 proposed drafts and had none
    accepted (acceptance 0.0 %), at c = 1 it proposed none: both off. `specwatch advise` on the
    folder decides every row as the demo did (its demo-summary.json)."""
    spec = json.loads((FULL / "bench-speculative.json").read_text())
    summary = json.loads((FULL / "demo-summary.json").read_text())
    stored = Decision.from_json(summary["decision"])
    assert len(stored.rows) == 12 and stored.decision_format == 2
    never = {(b["workload"], b["max_concurrency"]) for b in spec["batches"] if not b["warmup"]}
    never = {key for key in never if all(b["spec_decode_accepted_tokens"] == 0 for b in spec["batches"]
                                         if not b["warmup"] and (b["workload"], b["max_concurrency"]) == key)}
    assert never == {("random-output", 1), ("random-output", 8)}
    assert sum(b["spec_decode_num_drafts"] for b in spec["batches"]
               if not b["warmup"] and (b["workload"], b["max_concurrency"]) == ("random-output", 8)) > 0
    for r in stored.rows:
        assert (r.choice.run == "off" and r.never_accepted) if (r.workload, r.concurrency) in never \
            else not r.never_accepted
    d = tmp_path / "demo"
    shutil.copytree(FULL, d)
    out = tmp_path / "advice.json"
    res = CliRunner().invoke(advise, [str(d), "--json", str(out)])
    assert res.exit_code == 0, res.output
    again = Decision.from_json(json.loads(out.read_text())["decision"])
    assert [(r.workload, r.concurrency, r.choice.run, r.verdict, r.confidence) for r in again.rows] == \
        [(r.workload, r.concurrency, r.choice.run, r.verdict, r.confidence) for r in stored.rows]
    assert _console_text(stored) in res.output


def test_a_positive_bound_never_prints_as_zero(docs):
    """word-chain at c = 1 of the shortened run: its what-if comparison's lower end is about 1.6e-07
    (three batches scatter widely there, and the comparison is unpaired); it prints as 1.6e-07, not
    "0.00" (an interval must read positive)."""
    base, spec, summary = docs
    row = _row(dd.decide(bench_record(base), bench_record(spec), summary["k"]), "word-chain", 1)
    lower = row.pick["versus_runner_up"]["lower"]
    assert 0 < lower < 0.005
    assert "[0.00–" not in row.confidence and f"[{dd.format_ratio(lower)}–" in row.confidence
    assert dd.format_ratio(0.0007) == "0.0007" and dd.format_ratio(0.0) == "0.00" and dd.format_ratio(0.9989) == "0.999"
    assert dd.format_ratio(1.6253e-07) == "1.6e-07" and dd.format_ratio(0.004) == "0.004" and dd.format_ratio(0.006) == "0.01"


def test_one_bench_file_of_both_servers_is_advised_by_role(tmp_path):
    """`specwatch bench --baseline-url … --paired` writes one file with both servers' batches:
    `advise FILE` (and --baseline FILE --speculative FILE) split it by role; a file of one server
    given as both is refused (a file compared with itself says nothing: it read 1.00x everywhere)."""
    from specwatch.bench.runner import BenchConfig, run_bench
    from specwatch.bench.workloads import WorkloadOptions
    from specwatch.choosek.cli import advise
    from specwatch.testing.stubserver import StubConfig, ThreadedStub

    with ThreadedStub(StubConfig(k=0)) as b, ThreadedStub(StubConfig(k=4, accept_pattern=(4, 2, 1, 3))) as s:
        run_bench(BenchConfig(base_url=s.url, baseline_url=b.url, paired=True, workloads=("copy",), concurrencies=(1,),
                              num_batches=3, options=WorkloadOptions(output_len=12), result_dir=str(tmp_path),
                              result_filename="paired.json", progress=False, equivalence=False))
    f = tmp_path / "paired.json"
    doc = json.loads(f.read_text())
    by_role = {r: {x["batch_index"]: x["output_throughput"] for x in doc["batches"] if x["role"] == r and not x["warmup"]}
               for r in ("baseline", "speculative")}
    want = math.exp(sum(math.log(by_role["speculative"][i] / by_role["baseline"][i]) for i in by_role["baseline"]) / 3)
    for args in ([str(f)], ["--baseline", str(f), "--speculative", str(f)]):
        out = tmp_path / "a.json"
        r = CliRunner().invoke(advise, [*args, "--json", str(out)])
        assert r.exit_code == 0, r.output
        (row,) = json.loads(out.read_text())["decision"]["rows"]
        assert row["measured"]["value"] == pytest.approx(want) and row["measured"]["value"] != pytest.approx(1.0)
    one = tmp_path / "one.json"
    one.write_text(json.dumps({**doc, "batches": [x for x in doc["batches"] if x["role"] == "baseline"],
                               "summary": [c for c in doc["summary"] if c["role"] == "baseline"]}))
    r = CliRunner().invoke(advise, ["--baseline", str(one), "--speculative", str(one)])
    assert r.exit_code == 2 and "compared with itself" in r.output and "Traceback" not in r.output


def test_the_live_line_shows_the_shortest_window_that_covers_the_cell():
    """The demo's line after a cell: a 15 s window after a 25 s cell misses part of it (the review
    saw 0.92x live beside 3.06x for the cell); the shortest window at least as long is shown."""
    from specwatch.demo import live_window

    served = {"lifetime": {}, "15s": {}, "30s": {}, "1m": {}, "5m": {}}
    assert [live_window(served, s) for s in (10, 25, 45, 400, None)] == ["15s", "30s", "1m", "5m", "15s"]
    assert live_window({"1m": {}, "5m": {}}, 10) == "1m" and live_window({}, 10) is None


def test_a_cost_line_through_two_workloads_gives_no_paired_certainty(docs):
    """With two workloads at a concurrency the cost line has no fit spread, so the what-if's model
    error is unknown: k' must not be compared paired with a zero-width interval (a real 2-workload
    demo printed "ahead of k=3 by 1.24x [1.24-1.24]"); with three it is paired."""
    base, spec, summary = docs

    def only(doc, keep):
        d = copy.deepcopy(doc)
        d["batches"] = [b for b in d["batches"] if b["workload"] in keep]
        d["summary"] = [c for c in d["summary"] if c["workload"] in keep]
        return d

    two = dd.decide(bench_record(only(base, {"copy", "word-chain"})), bench_record(only(spec, {"copy", "word-chain"})), summary["k"])
    three = dd.decide(bench_record(base), bench_record(spec), summary["k"])
    checked = 0
    for row in two.rows:
        vs = row.pick["versus_runner_up"] if row.pick else None
        if vs and row.pick["runner_up"] != "off":
            assert not vs["paired"] and vs["lower"] < vs["upper"]
            checked += 1
    assert checked >= 2
    paired3 = [r for r in three.rows if r.pick and r.pick["versus_runner_up"] and r.pick["runner_up"] not in ("off", None)
               and r.pick["versus_runner_up"]["paired"]]
    assert paired3 and all(r.pick["versus_runner_up"]["lower"] < r.pick["versus_runner_up"]["upper"] for r in paired3)
