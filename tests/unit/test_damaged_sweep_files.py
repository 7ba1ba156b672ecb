"""Issue #38: `advise`, `report` and `calibrate --from-sweep` over damaged sweep result files.

Every case is a real sweep (tests/fixtures/sweeps/) copied and damaged, or a file of another
kind; each of the three readers must answer it with the same one line and the documented exit
status (docs/choosing-k.md, "The result-file contract"): 2 for a usage error (a missing path, a
directory, a FIFO, a device, a file over the cap: nothing read), 1 for a damaged or foreign file.
No traceback, no hang (a FIFO used to block, /dev/zero to be read until MemoryError).

Before this test, the readers disagreed on a cell at another k than its configuration's (advise
and report used it, calibrate exit 1 naming an internal "speculative[0].k"), on a step time of
1e-300 ms or 1e15 running requests (the same, "plain[0].step_seconds … got 0.0", "points
repeat"), and on a workload with an escape character (advise and report printed it raw, calibrate
refused the profile's provenance); they all used a cell of a configuration the file does not list,
a duplicated configuration or batch index, a throughput or step time of 0 for a measured cell, and
a name with a newline broke the one-line error into two. An empty file, JSON cut short and a cost
profile read "is not valid JSON: Expecting value: line 1 column 1 (char 0)" or "Expecting ','
delimiter"; a bench result, a demo summary or another format just "not a specwatch sweep result";
advise's "the sweep has no finished speculative cell yet" did not name the file.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest
from click.testing import CliRunner

from specwatch.choosek.cli import advise, calibrate, report

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "tests" / "fixtures" / "sweeps" / "embedded-sequential-sweep.json"
PAIRED = ROOT / "tests" / "fixtures" / "sweeps" / "embedded-paired-sweep.json"
PROFILE = ROOT / "exporter" / "specwatch" / "data" / "cost-profiles" / "cpu-2core-smollm2-135m-vllm0.32.yaml"
BENCH_BOTH = ROOT / "tests" / "fixtures" / "bench-writer" / "bench-run.json"
BENCH_ONE = ROOT / "tests" / "fixtures" / "demo" / "bench-baseline.json"
DEMO_SUMMARY = ROOT / "tests" / "fixtures" / "demo" / "demo-summary.json"

COMMANDS = ("advise", "report", "calibrate")
BENCH_KIND = ("it is a specwatch bench result (specwatch advise reads bench files: --baseline FILE --speculative FILE, "
              "or one FILE of both servers)")


def _args(command: str, path: Path, out: Path) -> tuple:
    return {"advise": (advise, [str(path)]),
            "report": (report, [str(path), "-o", str(out / "r.html")]),
            "calibrate": (calibrate, ["--from-sweep", str(path), "-o", str(out / "p.yaml")])}[command]


def _doc(src: Path = SWEEP) -> dict:
    return json.loads(src.read_text())


def _write(path: Path, doc) -> Path:
    path.write_text(json.dumps(doc))
    return path


def _cell(doc: dict, k: int | None = None, baseline: bool = False) -> int:
    """Index of the first cell at ``k`` (speculative when None, or the baseline)."""
    return next(i for i, c in enumerate(doc["cells"]) if (c["k"] == 0 if baseline else c["k"] > 0 if k is None else c["k"] == k))


def _name(doc: dict, i: int) -> str:
    c = doc["cells"][i]
    return f"{c['config']}/{c['workload']}/c={c['max_concurrency']}"


def _damaged(edit: Callable[[dict], str], src: Path = SWEEP):
    """A case: the real sweep ``src`` edited by ``edit`` (which returns what the line says after
    "<file> is a damaged sweep result: "); exit 1 from all three readers."""
    def make(d: Path):
        doc = _doc(src)
        says = edit(doc)
        f = _write(d / "s.json", doc)
        return f, 1, f"{f} is a damaged sweep result: {says}"
    return make


def _summary(key, value, says):
    def edit(doc):
        i = _cell(doc)
        doc["cells"][i]["summary"][key] = value
        return f"cells[{i}] (cell {_name(doc, i)}): summary.{says}"
    return edit


def _raw(data: bytes, code: int, says: str, name: str = "s.json"):
    def make(d: Path):
        f = d / name
        f.write_bytes(data)
        return f, code, f"{f} {says}"
    return make


def _k_mismatch(doc):
    i = _cell(doc, baseline=True)
    doc["cells"][i]["k"] = 3
    return f"cells[{i}] (cell {_name(doc, i)}): 'k' 3, but configuration baseline has k 0"


def _unknown_config(doc):
    i = _cell(doc)
    doc["cells"][i]["config"] = "ngram-k9"
    names = ", ".join(c["name"] for c in doc["configs"])
    return f"cells[{i}] (cell {_name(doc, i)}): configuration ngram-k9 is not in 'configs' ({names})"


def _no_configs(d: Path):
    doc = _doc()
    names = ", ".join(dict.fromkeys(c["config"] for c in doc["cells"]))
    doc["configs"] = []
    f = _write(d / "s.json", doc)
    return f, 1, f"{f} is a damaged sweep result: 'configs' is empty, but its cells name {names}"


def _duplicated_cell(doc):
    n = len(doc["cells"])
    doc["cells"].append(dict(doc["cells"][1]))
    return (f"cells[{n}]: cell {_name(doc, 1)} appears twice (one measurement per configuration, workload and "
            "concurrency)")


def _duplicated_config(doc):
    n = len(doc["configs"])
    doc["configs"].append(dict(doc["configs"][1]))
    return f"configs[{n}]: configuration {doc['configs'][1]['name']} appears twice"


def _duplicated_batch(doc):
    i = _cell(doc)
    for b in doc["cells"][i]["batches"]:
        b["batch_index"] = 1
    return f"cells[{i}] (cell {_name(doc, i)}): batches[1].batch_index 1 appears twice"


def _negative_batch_index(doc):
    i = _cell(doc)
    doc["cells"][i]["batches"][0]["batch_index"] = -7
    return f"cells[{i}] (cell {_name(doc, i)}): batches[0].batch_index -7 is negative"


def _negative_batch_throughput(doc):
    i = _cell(doc)
    doc["cells"][i]["batches"][1]["output_throughput"] = -5.0
    return f"cells[{i}] (cell {_name(doc, i)}): batches[1].output_throughput -5 is not a possible measurement (0 to 1e+15)"


def _tiny_paired_baseline(doc):
    i = next(n for n, c in enumerate(doc["cells"]) if c.get("baseline_batches"))
    doc["cells"][i]["baseline_batches"][0]["output_throughput"] = 1e-300
    return (f"cells[{i}] (cell {_name(doc, i)}): baseline_batches[0].output_throughput 1e-300 is not a possible "
            "measurement (a positive value below 1e-09)")


def _zero_step(doc):
    i = _cell(doc, baseline=True)
    s = doc["cells"][i]["summary"]
    s["server_step_duration_ms"] = 0.0
    return (f"cells[{i}] (cell {_name(doc, i)}): summary.server_step_duration_ms is 0 although the server made "
            f"{s['server_engine_steps']:g} engine steps")


def _zero_throughput(doc):
    i = _cell(doc, baseline=True)
    s = doc["cells"][i]["summary"]
    s["output_throughput"] = 0.0
    return f"cells[{i}] (cell {_name(doc, i)}): summary.output_throughput is 0 although {s['completed']:g} requests completed"


def _tiny_step_everywhere(doc):
    for c in doc["cells"]:
        c["summary"]["server_step_duration_ms"] = 1e-300
    return (f"cells[0] (cell {_name(doc, 0)}): summary.server_step_duration_ms 1e-300 is not a possible measurement "
            "(a positive value below 1e-09)")


def _running_everywhere(doc):
    for c in doc["cells"]:
        c["summary"]["server_running_requests"] = 1e15
    c = doc["cells"][0]["max_concurrency"]
    return (f"cells[0] (cell {_name(doc, 0)}): summary.server_running_requests 1e+15 is more than a cell of "
            f"concurrency {c} can hold (at most 2 × {c} + 1)")


def _per_batch_negative(doc):
    i = _cell(doc)
    doc["cells"][i]["summary"]["output_throughput_per_batch"][0] = -5.0
    return f"cells[{i}] (cell {_name(doc, i)}): summary.output_throughput_per_batch[0] -5 is not a possible measurement (0 to 1e+15)"


def _escape_in_workload(doc):
    for c in doc["cells"]:
        if c["workload"] == "copy":
            c["workload"] = "\x1b[31mcopy"
    i = next(n for n, c in enumerate(doc["cells"]) if c["workload"].startswith("\x1b"))
    return f"cells[{i}]: 'workload' holds the control character \\x1b ('\\x1b[31mcopy')"


def _newline_in_config(doc):
    old = doc["configs"][1]["name"]
    doc["configs"][1]["name"] = "ngram\nk2"
    for c in doc["cells"]:
        if c["config"] == old:
            c["config"] = "ngram\nk2"
    return "configs[1]: 'name' holds the control character \\n ('ngram\\nk2')"


def _escape_in_method(doc):
    i = next(n for n, c in enumerate(doc["configs"]) if c.get("speculative_config"))
    doc["configs"][i]["speculative_config"]["method"] = "ngram\x1b[2J"
    return f"configs[{i}]: 'speculative_config.method' holds the control character \\x1b ('ngram\\x1b[2J')"


def _aa_with_speculation(doc):
    i = next(n for n, c in enumerate(doc["configs"]) if c.get("speculative_config"))
    doc["configs"][i]["aa"] = True  # an A/A start must be the baseline again: never speculative
    return (f"configs[{i}]: A/A configuration {doc['configs'][i]['name']} must run without speculation (k 0, no "
            f"speculative_config), got k {doc['configs'][i]['k']}")


def _aa_flag_dropped(doc):
    # an A/A start without its flag is a second baseline: it must not silently replace the first
    doc["configs"].insert(1, {"name": "aa-1", "k": 0, "family": "", "speculative_config": None})
    return "configs[1]: aa-1 is a second configuration without speculation beside baseline (one baseline per " \
           "sweep; an A/A start is marked \"aa\": true)"


def _aa_without_baseline(doc):
    doc["configs"][0]["aa"] = True  # the baseline itself marked A/A: no baseline left
    return f"A/A start {doc['configs'][0]['name']} but no baseline configuration (k 0, no speculation) to measure them against"


def _aa_not_a_boolean(doc):
    doc["configs"][0]["aa"] = "yes"
    return "configs[0]: 'aa' is not true or false"


def _negative_startup(doc):
    doc["servers"][0]["startup_seconds"] = -1
    return "servers[0]: 'startup_seconds' -1 is negative"


def _copy(src: Path, name: str | None = None):
    def make(d: Path):
        f = d / (name or src.name)
        shutil.copy(src, f)
        return f
    return make


def _foreign(src: Path, says: str, name: str | None = None):
    def make(d: Path):
        f = _copy(src, name)(d)
        return f, 1, f"{f} {says}"
    return make


def _format(value):
    def make(d: Path):
        doc = _doc()
        doc["specwatch_sweep_format"] = value
        f = _write(d / "s.json", doc)
        return f, 1, (f"{f} is not a specwatch sweep result (format 1): it is a sweep result of format {value}, which "
                      "this specwatch does not read")
    return make


def _no_format_key(d: Path):
    doc = _doc()
    del doc["specwatch_sweep_format"]
    f = _write(d / "s.json", doc)
    return f, 1, f"{f} is not a specwatch sweep result (format 1): it has no 'specwatch_sweep_format' key"


def _truncated(fraction: float):
    def make(d: Path):
        raw = SWEEP.read_bytes()
        f = d / "s.json"
        f.write_bytes(raw[: int(len(raw) * fraction)])
        size = f.stat().st_size
        return f, 1, (f"{f} is not valid JSON: it is cut short (it ends at byte {size}, inside the document: a partial "
                      "copy?), not a usable sweep result")
    return make


def _fifo(d: Path):
    f = d / "s.json"
    os.mkfifo(f)
    return f, 2, f"{f}: the sweep result must be a regular file, this is a FIFO"


def _dev_zero(d: Path):
    return Path("/dev/zero"), 2, "/dev/zero: the sweep result must be a regular file, this is a device"


def _link_to_dev_zero(d: Path):
    f = d / "s.json"
    f.symlink_to("/dev/zero")
    return f, 2, f"{f}: the sweep result must be a regular file, this is a device"


def _over_the_cap(d: Path):
    f = d / "s.json"
    with open(f, "wb") as fh:  # sparse: nothing is written, and the reader refuses it from os.stat
        fh.truncate(256 * 1024 * 1024 + 1)
    return f, 2, f"{f}: the sweep result is {256 * 1024 * 1024 + 1} bytes, more than the {256 * 1024 * 1024} accepted"


#: name -> make(tmp dir) -> (path, exit status, the one line after "Error: ") or a dict of them per command
CASES = {
    # cut, empty, not JSON
    "truncated-half": _truncated(0.5),
    "truncated-inside-a-string": _truncated(0.30001),
    "truncated-last-bytes": _truncated(0.99999),
    "empty": _raw(b"", 1, "is not valid JSON: the file is empty (0 bytes), not a specwatch sweep result"),
    "blank": _raw(b" \n\n", 1, "is not valid JSON: the file is empty (3 bytes), not a specwatch sweep result"),
    "not-utf8": _raw(b"\xff\xfe{}", 1, "is not a specwatch sweep result (not UTF-8 text: invalid start byte at byte 0)"),
    "nested-too-deep": _raw(b"[" * 100_000 + b"]" * 100_000, 1, "is not a usable sweep result: RecursionError: maximum "
                            "recursion depth exceeded while decoding a JSON array from a unicode string"),
    "json-array": _raw(b"[]", 1, "is not a specwatch sweep result (format 1): its JSON is an array, not an object"),
    "json-null": _raw(b"null", 1, "is not a specwatch sweep result (format 1): its JSON is null, not an object"),
    # files of another kind
    "cost-profile": _foreign(PROFILE, "is not valid JSON: it is a specwatch cost profile (YAML), not a sweep result"),
    "cost-profile-named-json": _foreign(PROFILE, "is not valid JSON: it is a specwatch cost profile (YAML), not a sweep "
                                        "result", "profile.json"),
    "bench-result-of-one-server": _foreign(BENCH_ONE, f"is not a specwatch sweep result (format 1): {BENCH_KIND}"),
    "sweep-format-2": _format(2),
    "no-format-key": _no_format_key,
    # damaged cells and configurations
    "duplicated-cell": _damaged(_duplicated_cell),
    "duplicated-configuration": _damaged(_duplicated_config),
    "cell-of-an-unlisted-configuration": _damaged(_unknown_config),
    "no-configurations": _no_configs,
    "cell-at-another-k": _damaged(_k_mismatch),
    "cell-k-out-of-range": _damaged(lambda d: (d["cells"][3].__setitem__("k", -1), "cells[3]: 'k' -1 is out of range (0 to 1000)")[1]),
    "acceptance-150-percent": _damaged(_summary("spec_decode_acceptance_rate", 150.0,
                                                "spec_decode_acceptance_rate 150 is outside 0 to 100 (percent)")),
    "negative-throughput": _damaged(_summary("output_throughput", -5.0,
                                             "output_throughput -5 is not a possible measurement (0 to 1e+15)")),
    "throughput-1e308": _damaged(_summary("output_throughput", 1e308,
                                          "output_throughput 1e+308 is not a possible measurement (0 to 1e+15)")),
    "throughput-1e-300": _damaged(_summary("output_throughput", 1e-300, "output_throughput 1e-300 is not a possible "
                                           "measurement (a positive value below 1e-09)")),
    "acceptance-length-below-1": _damaged(_summary("spec_decode_acceptance_length", 0.5, "spec_decode_acceptance_length "
                                                   "0.5 is below 1 (the bonus token is always accepted)")),
    "nan-literal": _damaged(lambda d: (d["cells"][0]["summary"].__setitem__("output_throughput", float("nan")),
                                       "cells[0]: summary 'output_throughput' is not a finite number")[1]),
    "zero-throughput-of-completed-requests": _damaged(_zero_throughput),
    "zero-step-over-engine-steps": _damaged(_zero_step),
    "step-1e-300-everywhere": _damaged(_tiny_step_everywhere),
    "running-1e15-everywhere": _damaged(_running_everywhere),
    "negative-per-batch-throughput": _damaged(_per_batch_negative),
    "negative-batch-throughput": _damaged(_negative_batch_throughput),
    "duplicated-batch-index": _damaged(_duplicated_batch),
    "negative-batch-index": _damaged(_negative_batch_index),
    "paired-baseline-batch-1e-300": _damaged(_tiny_paired_baseline, PAIRED),
    "escape-in-a-workload": _damaged(_escape_in_workload),
    "newline-in-a-configuration-name": _damaged(_newline_in_config),
    "escape-in-a-speculative-method": _damaged(_escape_in_method),
    "negative-start-up-time": _damaged(_negative_startup),
    "speculative-aa-start": _damaged(_aa_with_speculation),
    "aa-not-a-boolean": _damaged(_aa_not_a_boolean),
    "aa-flag-dropped": _damaged(_aa_flag_dropped),
    "aa-without-a-baseline": _damaged(_aa_without_baseline),
    # not a regular file, too large: usage errors, nothing read
    "fifo": _fifo,
    "dev-zero": _dev_zero,
    "symlink-to-dev-zero": _link_to_dev_zero,
    "over-the-size-cap": _over_the_cap,
}


def _one_line_error(output: str) -> str:
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), output
    return lines[0].removeprefix("Error: ")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", list(CASES))
def test_each_reader_answers_a_damaged_sweep_file_in_one_line(tmp_path, case, command):
    path, code, line = CASES[case](tmp_path)
    cmd, args = _args(command, path, tmp_path)
    r = CliRunner().invoke(cmd, args, catch_exceptions=False)
    assert "Traceback" not in r.output and "\x1b" not in r.output
    assert r.exit_code == code, (r.exit_code, r.output)
    assert _one_line_error(r.output) == line
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_path_and_a_directory_are_usage_errors(tmp_path, command):
    """Exit 2 from all three. report and calibrate: click's usage error (its Error line names the
    argument); advise reads a directory as a demo result folder and says it holds none."""
    folder = tmp_path / "results"
    folder.mkdir()
    shutil.copy(SWEEP, folder / "sweep.json")
    for path in (tmp_path / "missing.json", folder):
        cmd, args = _args(command, path, tmp_path)
        r = CliRunner().invoke(cmd, args, catch_exceptions=False)
        assert r.exit_code == 2, r.output
        errors = [line for line in r.output.splitlines() if line.startswith("Error: ")]
        assert len(errors) == 1 and "Traceback" not in r.output, r.output
        if path == folder and command == "advise":
            assert errors[0] == (f"Error: {folder}/bench-baseline.json: no baseline bench file there (a demo result "
                                 "folder holds bench-baseline.json and bench-speculative.json)")
        else:
            assert str(path) in errors[0] and ("does not exist" in errors[0] or "is a directory" in errors[0])


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bench_file_of_both_servers_is_read_by_advise_only(tmp_path, command):
    """The one input the three read differently, by design: advise takes a bench file holding both
    servers' batches as the demo's decision (docs/demo.md: bad input there is exit 2); report and
    calibrate need a sweep and say what the file is (exit 1)."""
    f = _copy(BENCH_BOTH, "bench.json")(tmp_path)
    cmd, args = _args(command, f, tmp_path)
    r = CliRunner().invoke(cmd, args, catch_exceptions=False)
    if command == "advise":
        assert r.exit_code == 2
        assert _one_line_error(r.output) == (f"{f}: its baseline and speculative batches have no workload and "
                                             "concurrency in common")
    else:
        assert r.exit_code == 1
        assert _one_line_error(r.output) == f"{f} is not a specwatch sweep result (format 1): {BENCH_KIND}"


def test_a_demo_summary_alone_is_named_as_one_by_calibrate(tmp_path):
    f = _copy(DEMO_SUMMARY)(tmp_path)
    r = CliRunner().invoke(calibrate, ["--from-sweep", str(f), "-o", str(tmp_path / "p.yaml")], catch_exceptions=False)
    assert r.exit_code == 1
    assert _one_line_error(r.output) == (f"{f} is not a specwatch sweep result (format 1): it is a specwatch demo summary "
                                         "(demo-summary.json)")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_sweep_without_a_finished_cell_is_named_by_every_reader(tmp_path, command):
    """advise said "the sweep has no finished speculative cell yet" without the file."""
    doc = _doc()
    doc["cells"] = []
    f = _write(tmp_path / "s.json", doc)
    cmd, args = _args(command, f, tmp_path)
    r = CliRunner().invoke(cmd, args, catch_exceptions=False)
    assert r.exit_code == 1
    assert _one_line_error(r.output).startswith(f"{f}")


@pytest.mark.parametrize("command", COMMANDS)
def test_the_undamaged_sweep_is_read_by_all_three(tmp_path, command):
    f = _copy(SWEEP)(tmp_path)
    cmd, args = _args(command, f, tmp_path)
    r = CliRunner().invoke(cmd, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
