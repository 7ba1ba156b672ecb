"""No output flag destroys measurements (found by a fresh user's bad-input pass, 2026-12-05):
``advise --json``, ``report -o`` and ``calibrate -o`` refuse a file that holds a sweep, bench or
demo result (their own inputs on the demo-folder and two-bench-file paths included), and leave it
byte-identical; an earlier advice JSON or report may be written again. ``calibrate
--from-forward-json`` reads a regular file with a cap (``/dev/zero`` and a FIFO are refused at
once). ``advise --baseline`` refuses a file measured on a speculative server."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from clirun import invoke as _invoke, one_line_error as _one_line_error
from specwatch.choosek.cli import advise, calibrate, report
from specwatch.common.files import measurement_file_kind

FIX = Path(__file__).resolve().parents[1] / "fixtures"
DEMO = FIX / "demo-12row"
SWEEP = FIX / "sweeps" / "embedded-ngram-draft-sweep.json"
OTHER_SWEEP = FIX / "sweeps" / "embedded-paired-sweep.json"


@pytest.fixture
def demo(tmp_path) -> Path:
    d = tmp_path / "demo"
    shutil.copytree(DEMO, d)
    return d


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.unit
def test_measurement_file_kind_names_each_result_and_nothing_else(tmp_path):
    assert measurement_file_kind(SWEEP) == "a specwatch sweep result"
    assert measurement_file_kind(DEMO / "bench-baseline.json") == "a specwatch bench result"
    assert measurement_file_kind(DEMO / "demo-summary.json") == "a specwatch demo summary"
    advice = tmp_path / "a.json"
    advice.write_text(json.dumps({"specwatch_advice_format": 3, "source": "sweep"}))
    assert measurement_file_kind(advice) is None
    assert measurement_file_kind(tmp_path / "missing.json") is None
    assert measurement_file_kind(tmp_path) is None


@pytest.mark.unit
@pytest.mark.parametrize("target", ["bench-baseline.json", "bench-speculative.json", "demo-summary.json"])
def test_advise_of_a_demo_folder_never_overwrites_the_folder(demo, target):
    before = _snapshot(demo)
    out = demo / target
    r = _invoke(advise, [str(demo), "--json", str(out)])
    assert r.exit_code == 2
    assert "writing it would destroy" in _one_line_error(r)
    assert _snapshot(demo) == before
    # and the folder still decides
    assert _invoke(advise, [str(demo)]).exit_code == 0


@pytest.mark.unit
@pytest.mark.parametrize("which", ["baseline", "speculative"])
def test_advise_of_two_bench_files_never_overwrites_either(demo, which):
    before = _snapshot(demo)
    b, s = demo / "bench-baseline.json", demo / "bench-speculative.json"
    out = b if which == "baseline" else s
    r = _invoke(advise, ["--baseline", str(b), "--speculative", str(s), "--json", str(out)])
    assert r.exit_code == 2
    assert _one_line_error(r) == (f"--json {out} is the input {out} itself: writing it would destroy it; give another --json")
    assert _snapshot(demo) == before


@pytest.mark.unit
def test_report_of_a_demo_never_writes_over_a_bench_file(demo):
    before = _snapshot(demo)
    out = demo / "bench-baseline.json"
    r = _invoke(report, [str(demo / "demo-summary.json"), "-o", str(out)])
    assert r.exit_code == 2
    assert _one_line_error(r) == (f"--output {out} holds a specwatch bench result: writing it would destroy those "
                                  "measurements; give another --output")
    assert _snapshot(demo) == before


@pytest.mark.unit
@pytest.mark.parametrize("command", ["advise", "report", "calibrate"])
def test_no_output_flag_replaces_another_sweep(tmp_path, command):
    src, other = tmp_path / "s.json", tmp_path / "other.json"
    shutil.copy(SWEEP, src)
    shutil.copy(OTHER_SWEEP, other)
    before = other.read_bytes()
    cmd, args = {"advise": (advise, [str(src), "--json", str(other)]),
                 "report": (report, [str(src), "-o", str(other)]),
                 "calibrate": (calibrate, ["--from-sweep", str(src), "-o", str(other)])}[command]
    r = _invoke(cmd, args)
    assert r.exit_code == 2
    flag = "--json" if command == "advise" else "--output"
    assert _one_line_error(r) == (f"{flag} {other} holds a specwatch sweep result: writing it would destroy those "
                                  f"measurements; give another {flag}")
    assert other.read_bytes() == before


@pytest.mark.unit
def test_an_earlier_advice_json_is_written_again(tmp_path):
    src, out = tmp_path / "s.json", tmp_path / "advice.json"
    shutil.copy(SWEEP, src)
    assert _invoke(advise, [str(src), "--json", str(out)]).exit_code == 0
    first = json.loads(out.read_text())
    assert first["specwatch_advice_format"] == 3
    out.write_text(json.dumps({**first, "marker": "old"}))
    assert _invoke(advise, [str(src), "--json", str(out)]).exit_code == 0
    assert "marker" not in json.loads(out.read_text())


@pytest.mark.unit
@pytest.mark.timeout(60)
@pytest.mark.parametrize("source", ["/dev/zero", "fifo"])
def test_forward_json_reader_refuses_what_is_not_a_regular_file(tmp_path, source):
    path = source
    if source == "fifo":
        path = str(tmp_path / "f.json")
        os.mkfifo(path)
    r = _invoke(calibrate, ["--from-forward-json", path, "--method", "ngram", "--hardware", "h", "--model", "m",
                            "-o", str(tmp_path / "p.yaml")])
    assert r.exit_code != 0
    assert "the vllm bench forward result must be a regular file" in _one_line_error(r)
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.unit
def test_forward_json_errors_name_the_file(tmp_path):
    f = tmp_path / "forward.json"
    f.write_text(json.dumps({"not": "a list"}))
    r = _invoke(calibrate, ["--from-forward-json", str(f), "--method", "ngram", "--hardware", "h", "--model", "m",
                            "-o", str(tmp_path / "p.yaml")])
    assert r.exit_code != 0
    assert _one_line_error(r).startswith(f"{f}: not a vllm bench forward result")


@pytest.mark.unit
def test_advise_refuses_a_speculative_servers_file_as_the_baseline(demo):
    spec = demo / "bench-speculative.json"
    other = demo / "spec-copy.json"
    shutil.copy(spec, other)
    r = _invoke(advise, ["--baseline", str(other), "--speculative", str(spec)])
    assert r.exit_code == 2
    msg = _one_line_error(r)
    assert msg.startswith(f"{other} measured a speculative server (")
    assert msg.endswith("the baseline file must come from a server without speculation")


@pytest.mark.unit
@pytest.mark.parametrize("command", ["advise", "advise-demo", "calibrate"])
def test_a_missing_output_directory_is_refused_not_created(tmp_path, demo, command):
    src = tmp_path / "s.json"
    shutil.copy(SWEEP, src)
    out = tmp_path / "nodir" / "x.out"
    cmd, args, flag = {"advise": (advise, [str(src), "--json", str(out)], "--json"),
                       "advise-demo": (advise, [str(demo), "--json", str(out)], "--json"),
                       "calibrate": (calibrate, ["--from-sweep", str(src), "-o", str(out)], "--output")}[command]
    r = _invoke(cmd, args)
    assert r.exit_code == 2
    assert _one_line_error(r) == f"{flag} {out}: the directory {out.parent} does not exist (create it first)"
    assert not out.parent.exists()


@pytest.mark.unit
@pytest.mark.parametrize("value, says", [("1", '"1", not an integer (the file is damaged)'),
                                         (99, "a sweep result of format 99, which this specwatch does not read")])
def test_a_sweep_format_that_is_not_a_number_says_so(tmp_path, value, says):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"specwatch_sweep_format": value, "cells": []}))
    r = _invoke(advise, [str(f)])
    assert r.exit_code != 0
    assert _one_line_error(r).endswith(says)


@pytest.mark.unit
def test_a_demo_advice_json_is_written_again(demo, tmp_path):
    """The demo folder's advice JSON holds the decision (with its own format key) inside: it is an
    output, written again, not a measurement."""
    out = tmp_path / "a.json"
    for _ in range(2):
        assert _invoke(advise, [str(demo), "--json", str(out)]).exit_code == 0
    assert measurement_file_kind(out) is None and "decision_format" in out.read_text()


@pytest.mark.unit
def test_fit_k_names_each_missing_k_once(tmp_path):
    src = tmp_path / "s.json"
    shutil.copy(OTHER_SWEEP, src)  # runs at k = 2, 4
    r = _invoke(advise, [str(src), "--fit-k", "3,1,3"])
    assert r.exit_code == 2
    assert _one_line_error(r) == f"--fit-k: no finished run at k = 1, 3 in {src} (runs at k = 2, 4)"
