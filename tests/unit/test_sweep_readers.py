"""Issue #38 items 4, 5 and 12 (the readers' part): the sweep-file readers (``calibrate``,
``advise``, ``report``) take regular files only, with a size cap (a FIFO would block, /dev/zero
never ends), refuse impossible values and duplicated cells naming the cell, never overwrite their
input, and a write error (a full disk: /dev/full) is one line. ``advise`` exits 2 on a missing
file like ``report`` and ``calibrate``; ``report -o`` refuses a directory that does not exist."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from clirun import invoke as _invoke, one_line_error as _one_line_error
from specwatch.choosek.cli import advise, calibrate, report, sweep
from specwatch.choosek.records import SweepRecordError, SweepResult

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sweeps" / "embedded-ngram-draft-sweep.json"
READERS = {
    "calibrate": lambda f, tmp: (calibrate, ["--from-sweep", str(f), "-o", str(tmp / "p.yaml")]),
    "advise": lambda f, tmp: (advise, [str(f)]),
    "report": lambda f, tmp: (report, [str(f), "-o", str(tmp / "r.html")]),
}


@pytest.fixture
def sweep_copy(tmp_path) -> Path:
    out = tmp_path / "s.json"
    shutil.copy(FIXTURE, out)
    return out


# ------------------------------------------------------------------------------------------------
# item 4: calibrate -o never overwrites its input


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink"])
def test_calibrate_refuses_to_overwrite_its_input(sweep_copy, tmp_path, how):
    before = sweep_copy.read_bytes()
    out = sweep_copy
    if how == "symlink":
        out = tmp_path / "link.json"
        out.symlink_to(sweep_copy)
    elif how == "hardlink":
        out = tmp_path / "hard.json"
        os.link(sweep_copy, out)
    r = _invoke(calibrate, ["--from-sweep", str(sweep_copy), "-o", str(out)])
    assert r.exit_code == 2
    assert _one_line_error(r) == (f"--output {out} is the input {sweep_copy} itself: writing it would destroy it; "
                                  "give another --output")
    assert sweep_copy.read_bytes() == before


# ------------------------------------------------------------------------------------------------
# item 5: regular files only, with a cap


@pytest.mark.timeout(60)
@pytest.mark.parametrize("reader", sorted(READERS))
def test_readers_refuse_a_fifo_without_blocking(tmp_path, reader):
    fifo = tmp_path / "s.json"
    os.mkfifo(fifo)
    cmd, args = READERS[reader](fifo, tmp_path)
    r = _invoke(cmd, args)
    assert r.exit_code == 2, r.output
    assert _one_line_error(r) == f"{fifo}: the sweep result must be a regular file, this is a FIFO"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("reader", sorted(READERS))
def test_readers_refuse_dev_zero(tmp_path, reader):
    cmd, args = READERS[reader](Path("/dev/zero"), tmp_path)
    r = _invoke(cmd, args)
    assert r.exit_code == 2, r.output
    assert _one_line_error(r) == "/dev/zero: the sweep result must be a regular file, this is a device"


def test_a_sweep_file_over_the_cap_is_refused(sweep_copy, monkeypatch):
    import specwatch.choosek.records as records

    monkeypatch.setattr(records, "MAX_SWEEP_BYTES", 1000)
    size = sweep_copy.stat().st_size
    with pytest.raises(SweepRecordError) as err:
        SweepResult.load(sweep_copy)
    assert err.value.message == f"{sweep_copy}: the sweep result is {size} bytes, more than the 1000 accepted"
    assert err.value.exit_code == 2


# ------------------------------------------------------------------------------------------------
# item 5: impossible values and duplicated cells, named by the cell


def _edited(path: Path, edit) -> Path:
    doc = json.loads(FIXTURE.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    return path


def _cell_named(doc, i) -> str:
    c = doc["cells"][i]
    return f"{c['config']}/{c['workload']}/c={c['max_concurrency']}"


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_duplicated_cell_is_refused_naming_it(tmp_path, reader):
    doc = json.loads(FIXTURE.read_text())
    n = len(doc["cells"])
    f = _edited(tmp_path / "dup.json", lambda d: d["cells"].append(dict(d["cells"][1])))
    cmd, args = READERS[reader](f, tmp_path)
    r = _invoke(cmd, args)
    assert r.exit_code == 1
    assert _one_line_error(r) == (f"{f} is a damaged sweep result: cells[{n}]: cell {_cell_named(doc, 1)} appears twice "
                                  "(one measurement per configuration, workload and concurrency)")


@pytest.mark.parametrize(("key", "value", "says"), [
    ("output_throughput", -3.0, "summary.output_throughput -3 is not a possible measurement (0 to 1e+15)"),
    ("output_throughput", 1e308, "summary.output_throughput 1e+308 is not a possible measurement (0 to 1e+15)"),
    ("server_step_duration_ms", -1.0, "summary.server_step_duration_ms -1 is not a possible measurement (0 to 1e+15)"),
    ("spec_decode_acceptance_rate", 150.0, "summary.spec_decode_acceptance_rate 150 is outside 0 to 100 (percent)"),
    ("spec_decode_acceptance_length", 0.5, "summary.spec_decode_acceptance_length 0.5 is below 1"),
])
@pytest.mark.parametrize("reader", sorted(READERS))
def test_an_impossible_value_is_refused_naming_the_cell(tmp_path, reader, key, value, says):
    doc = json.loads(FIXTURE.read_text())
    i = next(i for i, c in enumerate(doc["cells"]) if c["k"] > 0)

    def edit(d):
        d["cells"][i]["summary"][key] = value

    f = _edited(tmp_path / "bad.json", edit)
    cmd, args = READERS[reader](f, tmp_path)
    r = _invoke(cmd, args)
    assert r.exit_code == 1
    line = _one_line_error(r)
    assert line.startswith(f"{f} is a damaged sweep result: cells[{i}] (cell {_cell_named(doc, i)}): {says}"), line
    assert "<profile" not in line


def test_the_shipped_and_fixture_sweeps_have_no_impossible_value():
    root = Path(__file__).resolve().parents[2]
    files = [*root.glob("tests/fixtures/sweeps/*.json"), *root.glob("docs/**/*sweep*.json")]
    assert len(files) >= 3
    for f in files:
        SweepResult.load(f)


# ------------------------------------------------------------------------------------------------
# item 5: write errors are one line


def test_calibrate_on_a_full_disk_is_one_line(sweep_copy):
    r = _invoke(calibrate, ["--from-sweep", str(sweep_copy), "-o", "/dev/full"])
    assert r.exit_code == 1
    assert _one_line_error(r) == "cannot write /dev/full: No space left on device"


def test_advise_json_on_a_full_disk_is_one_line(sweep_copy):
    r = _invoke(advise, [str(sweep_copy), "--json", "/dev/full"])
    assert r.exit_code == 1
    assert r.output.strip().splitlines()[-1] == "Error: cannot write /dev/full: No space left on device"
    assert "Traceback" not in r.output


def test_sweep_on_a_full_disk_is_one_line(tmp_path, stub, monkeypatch):
    import specwatch.choosek.sweep as sw

    template, log = stub
    out = tmp_path / "s.json"

    def full(path, doc, indent=1):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(sw, "atomic_write_json", full)
    r = CliRunner().invoke(sweep, ["--result-file", str(out), "--k", "1", "--workloads", "copy", "--concurrency", "1",
                                   "--output-len", "8", "--num-batches", "1", "--server-command", template,
                                   "--no-lock", "--no-progress"])
    assert r.exit_code == 1, r.output
    assert r.output.strip().splitlines()[-1] == (
        f"Error: cannot write {out}: No space left on device; finished cells are in {out} up to the last write that "
        "succeeded")
    assert r.exception is None or isinstance(r.exception, SystemExit)


# ------------------------------------------------------------------------------------------------
# item 12: a missing file, a missing output directory


def test_advise_exits_2_on_a_missing_file_like_report_and_calibrate(tmp_path):
    missing = tmp_path / "nope.json"
    codes = {name: _invoke(*READERS[name](missing, tmp_path)).exit_code for name in READERS}
    assert codes == {"advise": 2, "calibrate": 2, "report": 2}


def test_report_refuses_an_output_directory_that_does_not_exist(sweep_copy, tmp_path):
    out = tmp_path / "typo-dir" / "x.html"
    r = _invoke(report, [str(sweep_copy), "-o", str(out)])
    assert r.exit_code == 2
    assert _one_line_error(r) == f"--output {out}: the directory {out.parent} does not exist (create it first)"
    assert not out.parent.exists()


def test_impossible_batch_values_are_refused_naming_the_cell_and_the_batch(tmp_path):
    """A negative throughput in a batch (a paired cell's baseline_batches included) would enter a
    paired ratio and change the pick: refused like an impossible summary value (fresh-user review)."""
    src = Path(__file__).resolve().parents[2] / "docs" / "results" / "sweep-modes-2026-12-04" / "paired.json"
    doc = json.loads(src.read_text())
    i = next(n for n, c in enumerate(doc["cells"]) if c.get("baseline_batches"))
    doc["cells"][i]["baseline_batches"][1]["output_throughput"] = -3.0
    f = tmp_path / "neg.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(SweepRecordError, match=rf"cells\[{i}\] .*baseline_batches\[1\]\.output_throughput -3 is not a "
                                               "possible measurement"):
        SweepResult.load(f)
    r = CliRunner().invoke(advise, [str(f)])
    assert r.exit_code != 0 and "baseline_batches[1].output_throughput -3" in r.output and "Traceback" not in r.output


def test_impossible_values_in_demo_bench_files_are_refused(tmp_path):
    src = Path(__file__).resolve().parents[1] / "fixtures" / "demo"
    folder = tmp_path / "demo"
    shutil.copytree(src, folder)
    p = folder / "bench-speculative.json"
    doc = json.loads(p.read_text())
    doc["batches"][2]["output_throughput"] = -5
    p.write_text(json.dumps(doc))
    r = CliRunner().invoke(advise, [str(folder)])
    assert r.exit_code == 2 and "batches[2].output_throughput -5 is not a possible measurement" in r.output
