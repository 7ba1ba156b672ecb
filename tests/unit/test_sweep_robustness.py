"""specwatch sweep robustness: busy ports, servers that die, failed cells, resume mismatches, process
groups that outlive their leader, signals while a server stops, missing programs, damaged result
files, templates without {spec_args}, sharegpt's dataset, the vLLM lock, messages.

The stub server (the ``stub`` fixture of tests/support/sweep_stub.py, as in test_sweep.py) has
failure injection from the environment: ``STUB_ERROR_EVERY=n`` (every n-th generation request gets HTTP 500) and
``STUB_DIE_AFTER=n`` (the process exits abruptly on generation request n + 1).
"""

from __future__ import annotations

import contextlib
import json
import re
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from specwatch.common.processes import free_port, stop_process_group
from specwatch.choosek.resultfile import SweepError, failed_cells, measurements
from records import sweep_document, sweep_record
from specwatch.choosek.sweep import SweepPlan, TemplateServer, build_configs, run_sweep
from pids import alive
from polling import wait_until
from sweep_stub import starts


QUIET = {"lock": False, "progress": False}


def plan(ks=(2,), workloads=("copy",), concs=(1,), spec=(), baseline=True, dataset_path=None, paired=False) -> SweepPlan:
    """A small plan; sequential (one server at a time, the schedule these tests pin) unless ``paired``."""
    return SweepPlan(build_configs(ks, spec, baseline), workloads, concs, 8, None, 1, 1, 1, 0,
                     dataset_path=dataset_path, paired=paired)


def keys(doc) -> list[tuple[str, str, int]]:
    return [(c["config"], c["workload"], c["max_concurrency"]) for c in doc["cells"]]


# --------------------------------------------------------------------------------------------
# 1. busy port


def test_busy_port_is_refused_before_any_server_starts(tmp_path, stub):
    template, log = stub
    out = tmp_path / "s.json"
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(SweepError, match=rf"baseline: cannot start a server on 127.0.0.1:{port}: .*in use.*--port"):
            run_sweep(plan(), out, template=template, port=port, echo=lambda *a, **k: None, **QUIET)
    assert starts(log) == []
    assert sweep_document(out)["status"] == "failed"


def test_server_that_exits_while_another_answers_on_its_port_is_an_error(tmp_path, stub, monkeypatch):
    """If something else answers /v1/models on the port (the busy-port check raced), the sweep
    must notice that its own process exited instead of measuring the other server."""
    import specwatch.choosek.sweep as sw

    template, log = stub
    port = free_port()
    other = subprocess.Popen([sys.executable, str(tmp_path / "stub.py"), "--port", str(port)],
                             env={**os.environ, "STUB_START_LOG": str(tmp_path / "other.log")}, start_new_session=True)
    try:
        t0 = time.time()
        while sw.listen_error("127.0.0.1", port) is None:
            assert time.time() - t0 < 60 and other.poll() is None
            time.sleep(0.1)
        monkeypatch.setattr(sw, "listen_error", lambda host, port: None)
        out = tmp_path / "s.json"
        dies = f"{shlex.quote(sys.executable)} -c 'import sys; sys.exit(5)' --port {{port}} {{spec_args}}"
        with pytest.raises(SweepError, match="exited with code 5"):
            run_sweep(plan(), out, template=dies, port=port, echo=lambda *a, **k: None, **QUIET)
        doc = sweep_document(out)
        assert doc["status"] == "failed"
        assert measurements(sweep_record(doc)) == []
    finally:
        stop_process_group(other, 5)


# --------------------------------------------------------------------------------------------
# 2. servers that die, cells with failed requests


def test_server_killed_between_cells_stops_the_sweep_with_its_log(tmp_path, stub, monkeypatch):
    template, log = stub
    pids = tmp_path / "pids.log"
    monkeypatch.setenv("STUB_PID_LOG", str(pids))
    out = tmp_path / "s.json"

    def echo(msg: str, **_: object) -> None:
        if msg.startswith("  ngram-k2 copy c=1:"):
            pid = int(pids.read_text().split()[-1])
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not alive(pid), 10)  # dead (a zombie until the sweep reaps it)

    with pytest.raises(SweepError) as info:
        run_sweep(plan(concs=(1, 2)), out, template=template, echo=echo, **QUIET)
    msg = str(info.value)
    assert msg.startswith("ngram-k2: the server exited with code -9 before copy c=2")
    assert str(tmp_path / "s-logs" / "ngram-k2.log") in msg
    doc = sweep_document(out)
    assert doc["status"] == "failed"
    assert sorted(keys(doc)) == [("baseline", "copy", 1), ("baseline", "copy", 2), ("ngram-k2", "copy", 1)]
    assert len(measurements(sweep_record(doc))) == 3 and failed_cells(sweep_record(doc)) == []


def test_server_dying_during_a_cell_keeps_it_as_failed_and_resume_measures_it_again(tmp_path, stub, monkeypatch):
    template, log = stub
    out = tmp_path / "s.json"
    msgs: list[str] = []
    # each server: c=1 sends 1 warm-up + 1 measured request, c=2 then 2 + 2; die on the 3rd
    monkeypatch.setenv("STUB_DIE_AFTER", "2")
    with pytest.raises(SweepError, match=r"^baseline: the server exited with code 7 during copy c=2") as info:
        run_sweep(plan(concs=(1, 2)), out, template=template, echo=lambda m, **_: msgs.append(m), **QUIET)
    assert "baseline.log" in str(info.value)
    doc = sweep_document(out)
    assert doc["status"] == "failed"
    bad = next(c for c in doc["cells"] if c["max_concurrency"] == 2)
    assert bad["server_exited"] == 7 and bad["summary"]["failed"] == 2  # data kept
    assert failed_cells(sweep_record(doc)) == ["baseline/copy/c=2: the server exited during the cell (code 7; 2 of 2 requests failed)"]
    assert [(m.config, m.concurrency) for m in measurements(sweep_record(doc))] == [("baseline", 1)]

    monkeypatch.delenv("STUB_DIE_AFTER")
    doc = run_sweep(plan(concs=(1, 2)), out, template=template, echo=lambda m, **_: msgs.append(m), **QUIET).to_json()
    assert doc["status"] == "complete"
    assert starts(log) == [0, 0, 2]  # the baseline again, for its failed cell
    assert sorted(keys(doc)) == sorted(set(keys(doc)))  # the failed record was replaced
    assert len(doc["cells"]) == 4 and failed_cells(sweep_record(doc)) == [] and len(measurements(sweep_record(doc))) == 4
    assert any("baseline: starting the server (1 cell to run)" in m for m in msgs)


def test_cells_with_failed_requests_are_kept_marked_and_rerun(tmp_path, stub, monkeypatch):
    template, log = stub
    out = tmp_path / "s.json"
    msgs: list[str] = []
    monkeypatch.setenv("STUB_ERROR_EVERY", "1")  # every request: HTTP 500
    doc = run_sweep(plan(), out, template=template, echo=lambda m, **_: msgs.append(m), **QUIET).to_json()
    assert doc["status"] == "incomplete"
    assert sweep_document(out)["status"] == "incomplete"
    assert failed_cells(sweep_record(doc)) == ["baseline/copy/c=1: 1 of 1 requests failed", "ngram-k2/copy/c=1: 1 of 1 requests failed"]
    assert measurements(sweep_record(doc)) == []
    warnings = [m for m in msgs if "warning:" in m]
    assert len(warnings) == 2 and "1 of 1 requests failed" in warnings[0] and "injected failure" in warnings[0]

    monkeypatch.delenv("STUB_ERROR_EVERY")
    doc = run_sweep(plan(), out, template=template, echo=lambda m, **_: msgs.append(m), **QUIET).to_json()
    assert doc["status"] == "complete"
    assert starts(log) == [0, 2, 0, 2]
    assert len(doc["cells"]) == 2 and failed_cells(sweep_record(doc)) == [] and len(measurements(sweep_record(doc))) == 2


def test_cli_exits_non_zero_when_cells_had_failed_requests(tmp_path, stub, monkeypatch):
    from specwatch.choosek.cli import sweep

    template, _ = stub
    out = tmp_path / "s.json"
    monkeypatch.setenv("STUB_ERROR_EVERY", "1")
    r = CliRunner().invoke(sweep, ["--result-file", str(out), "--k", "1", "--no-baseline", "--workloads", "copy",
                                   "--concurrency", "1", "--output-len", "8", "--num-batches", "1",
                                   "--server-command", template, "--no-lock", "--no-progress"])
    assert r.exit_code == 1, r.output
    assert isinstance(r.exception, SystemExit)
    assert "sweep incomplete: 1 cell had failed requests (ngram-k1/copy/c=1: 2 of 2 requests failed)" in r.output
    assert "sweep complete" not in r.output


def test_measurements_leave_out_failed_cells_of_an_old_file():
    cell = {"config": "ngram-k1", "k": 1, "family": "ngram", "workload": "copy", "max_concurrency": 2,
            "summary": {"workload": "copy", "max_concurrency": 2, "output_throughput": 5.0, "completed": 0,
                        "failed": 8, "num_batches": 1}}
    good = {**cell, "config": "baseline", "k": 0, "summary": {**cell["summary"], "completed": 8, "failed": 0}}
    doc = {"specwatch_sweep_format": 1, "cells": [cell, good]}
    assert [m.config for m in measurements(sweep_record(doc))] == ["baseline"]
    assert failed_cells(sweep_record(doc)) == ["ngram-k1/copy/c=2: 8 of 8 requests failed"]


# --------------------------------------------------------------------------------------------
# 3. resume must not mix configurations or servers


def test_resume_refuses_another_speculative_config_under_the_same_name(tmp_path, stub):
    template, log = stub
    out = tmp_path / "s.json"
    a = '{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":5}'
    b = '{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":3}'
    run_sweep(plan(spec=(a,), baseline=False), out, template=template, echo=lambda *a, **k: None, **QUIET)
    before = out.read_text()
    with pytest.raises(SweepError, match=r"measured ngram-k2 with speculative config .*\"prompt_lookup_max\":5.*"
                                         r"\"prompt_lookup_max\":3.*--result-file"):
        run_sweep(plan(spec=(b,), baseline=False), out, template=template, echo=lambda *a, **k: None, **QUIET)
    assert out.read_text() == before and starts(log) == [2]
    # the same config again: resumes (nothing to run)
    doc = run_sweep(plan(spec=(a,), baseline=False), out, template=template, echo=lambda *a, **k: None, **QUIET).to_json()
    assert doc["status"] == "complete" and starts(log) == [2]


def test_resume_refuses_another_server_command(tmp_path, stub):
    template, log = stub
    out = tmp_path / "s.json"
    run_sweep(plan(), out, template=template, echo=lambda *a, **k: None, **QUIET)
    before = out.read_text()
    assert "stub.py --port" in sweep_document(out)["server"]["command_template"]
    with pytest.raises(SweepError, match=r"was measured with --server-command .*this run uses --server-command"):
        run_sweep(plan(), out, template=template + " --api-key other", echo=lambda *a, **k: None, **QUIET)
    assert out.read_text() == before and starts(log) == [0, 2]


# --------------------------------------------------------------------------------------------
# 4./5. stopping a process group


GROUP = r'''
import signal, subprocess, sys, time
child_mode, pid_file = sys.argv[1], sys.argv[2]
leader_slow = len(sys.argv) > 3
CHILD = """
import signal, sys, time
mode, pid_file = sys.argv[1], sys.argv[2]
if mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1.0), sys.exit(0)))
open(pid_file, "w").write("ready")
time.sleep(600)
"""
if leader_slow:
    signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1.0), sys.exit(0)))
child = subprocess.Popen([sys.executable, "-c", CHILD, child_mode, pid_file + ".ready"])
while True:
    try:
        if open(pid_file + ".ready").read() == "ready":
            break
    except OSError:
        pass
    time.sleep(0.02)
open(pid_file, "w").write(str(child.pid))
time.sleep(600)
'''


def start_group(tmp_path, child_mode: str, leader_slow: bool = False) -> tuple[subprocess.Popen, int]:
    script = tmp_path / "group.py"
    script.write_text(GROUP)
    pid_file = tmp_path / f"child-{child_mode}.pid"
    argv = [sys.executable, str(script), child_mode, str(pid_file)] + (["slow"] if leader_slow else [])
    p = subprocess.Popen(argv, start_new_session=True)
    t0 = time.time()
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.time() - t0 < 30 and p.poll() is None
        time.sleep(0.02)
    time.sleep(0.1)  # the leader is in its sleep, its SIGTERM handler installed
    return p, int(pid_file.read_text())


def _cleanup(p: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.poll()


def test_stop_process_group_waits_for_children_that_outlive_the_leader(tmp_path):
    p, child = start_group(tmp_path, "slow")
    try:
        t0 = time.monotonic()
        stop_process_group(p, 10)
        assert not alive(child), "the child (EngineCore) outlived stop_process_group"
        assert not alive(p.pid) and p.returncode is not None
        assert 0.9 < time.monotonic() - t0 < 8
    finally:
        _cleanup(p)


def test_stop_process_group_kills_children_that_ignore_sigterm(tmp_path):
    p, child = start_group(tmp_path, "ignore")
    try:
        t0 = time.monotonic()
        stop_process_group(p, 0.5)
        assert not alive(child)
        assert time.monotonic() - t0 < 8
        stop_process_group(p, 0.5)  # a second call is a no-op
    finally:
        _cleanup(p)


def test_second_ctrl_c_while_stopping_does_not_orphan_the_server(tmp_path):
    p, child = start_group(tmp_path, "slow", leader_slow=True)
    handler = signal.getsignal(signal.SIGINT)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    raised = False
    try:
        timer.start()
        try:
            stop_process_group(p, 10)
        except KeyboardInterrupt:
            raised = True
        timer.join()
        assert raised, "the Ctrl-C that arrived while stopping was lost"
        assert not alive(p.pid) and not alive(child), "the server was left running"
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        timer.cancel()
        _cleanup(p)


def test_stop_process_group_from_another_thread_leaves_signals_alone(tmp_path):
    p, child = start_group(tmp_path, "slow")
    errors: list[BaseException] = []

    def run() -> None:
        try:
            stop_process_group(p, 10)
        except BaseException as exc:
            errors.append(exc)

    try:
        t = threading.Thread(target=run)
        t.start()
        t.join(30)
        assert errors == [] and not alive(child)
    finally:
        _cleanup(p)


# --------------------------------------------------------------------------------------------
# 6. missing program


def test_missing_program_is_a_one_line_error(tmp_path):
    from specwatch.choosek.cli import sweep

    out = tmp_path / "s.json"
    with pytest.raises(SweepError) as info:
        run_sweep(plan(), out, template="nonexistent-binary-xyz --port {port} {spec_args}",
                  echo=lambda *a, **k: None, **QUIET)
    assert str(info.value) == "baseline: --server-command: program 'nonexistent-binary-xyz' not found"
    assert sweep_document(out)["status"] == "failed"
    r = CliRunner().invoke(sweep, ["--result-file", str(out), "--no-lock",
                                   "--server-command", "nonexistent-binary-xyz --port {port} {spec_args}"])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    assert "--server-command" in r.output and "'nonexistent-binary-xyz' not found" in r.output


# --------------------------------------------------------------------------------------------
# 7. damaged result files


def _doc(**over):
    doc = {"specwatch_sweep_format": 1, "status": "complete", "settings": {}, "configs": [], "servers": [], "cells": []}
    doc.update(over)
    return doc


GOOD_CELL = {"config": "baseline", "k": 0, "family": "", "workload": "copy", "max_concurrency": 1,
             "summary": {"output_throughput": 3.0, "completed": 1, "failed": 0}}


@pytest.mark.parametrize("doc, what", [
    (_doc(cells=[1]), "cells[0] is not an object"),
    (_doc(cells=[{k: v for k, v in GOOD_CELL.items() if k != "config"}]), "cells[0]: 'config'"),
    (_doc(cells=[{**GOOD_CELL, "max_concurrency": "1"}]), "cells[0]: 'max_concurrency'"),
    (_doc(cells=[{**GOOD_CELL, "summary": "x"}]), "cells[0]: 'summary' is not an object"),
    (_doc(cells=[{**GOOD_CELL, "summary": {"output_throughput": "fast"}}]), "summary 'output_throughput'"),
    (_doc(configs="x"), "'configs' is not a list"),
    (_doc(configs=[{"k": 1}]), "configs[0]"),
    (_doc(servers=[{"k": 1}]), "servers[0]"),
    (_doc(settings=[]), "'settings' is not an object"),
    (_doc(settings={"workloads": 3}), "settings 'workloads'"),
    (_doc(cells=[{**GOOD_CELL, "max_concurrency": 0}]), "'max_concurrency' 0 is out of range"),
    (_doc(cells=[{**GOOD_CELL, "max_concurrency": 10**400}]), "'max_concurrency'"),
    (_doc(cells=[{**GOOD_CELL, "k": -3}]), "'k' -3 is out of range"),
])
def test_hand_damaged_result_files_give_clean_errors(tmp_path, doc, what):
    from specwatch.choosek.cli import advise
    from specwatch.choosek.cli import report
    from specwatch.choosek.cli import sweep

    f = tmp_path / "s.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(SweepError, match="damaged sweep result") as info:
        sweep_document(f)
    assert what in str(info.value)
    with pytest.raises(SweepError, match="damaged sweep result"):
        measurements(sweep_record(doc))
    for cmd, args in ((advise, [str(f)]), (report, [str(f), "-o", str(tmp_path / "r.html")]),
                      (sweep, ["--result-file", str(f), "--server-command", "true --port {port} {spec_args}", "--no-lock"])):
        r = CliRunner().invoke(cmd, args)
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (cmd.name, r.output, r.exception)
        assert "damaged sweep result" in r.output


def test_non_utf8_result_file_is_a_clean_error(tmp_path):
    from specwatch.choosek.cli import report

    f = tmp_path / "s.json"
    f.write_bytes(b'{"specwatch_sweep_format": 1, "cells": [], "x": "\xff\xfe"}')
    with pytest.raises(SweepError, match="not UTF-8"):
        sweep_document(f)
    r = CliRunner().invoke(report, [str(f)])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit) and "not UTF-8" in r.output


# --------------------------------------------------------------------------------------------
# 8. templates without {spec_args}


def test_template_without_spec_args_is_refused_when_speculation_is_swept(tmp_path, stub):
    from specwatch.choosek.cli import sweep

    template, log = stub
    out = tmp_path / "s.json"
    no_spec = template.replace(" {spec_args}", "")
    for args in (["--k", "2"], ["--speculative-config", '{"method":"ngram","num_speculative_tokens":2}']):
        r = CliRunner().invoke(sweep, ["--result-file", str(out), *args, "--server-command", no_spec, "--no-lock"])
        assert r.exit_code == 2, r.output
        assert "--server-command" in r.output and "{spec_args}" in r.output
    assert starts(log) == [] and not out.exists()
    r = CliRunner().invoke(sweep, ["--result-file", str(out), "--k", "2", "--no-baseline", "--workloads", "copy",
                                   "--concurrency", "1", "--output-len", "8", "--num-batches", "1", "--no-lock",
                                   "--no-progress", "--server-command",
                                   no_spec + " --speculative-config {speculative_config}"])
    assert r.exit_code == 0, r.output
    assert starts(log) == [2]


# --------------------------------------------------------------------------------------------
# 9. sharegpt


def test_sharegpt_needs_a_dataset_path_before_any_server_starts(tmp_path, stub):
    from specwatch.choosek.cli import sweep

    template, log = stub
    out = tmp_path / "s.json"
    base = ["--result-file", str(out), "--k", "2", "--workloads", "sharegpt", "--server-command", template, "--no-lock"]
    r = CliRunner().invoke(sweep, base)
    assert r.exit_code == 2 and "--dataset-path" in r.output, r.output
    r = CliRunner().invoke(sweep, [*base, "--dataset-path", str(tmp_path / "missing.json")])
    assert r.exit_code == 2 and "--dataset-path" in r.output and "not found" in r.output, r.output
    with pytest.raises(SweepError, match="--dataset-path"):
        run_sweep(plan(workloads=("sharegpt",)), out, template=template, echo=lambda *a, **k: None, **QUIET)
    assert starts(log) == [] and not out.exists()


def test_sharegpt_sweep_with_a_dataset(tmp_path, stub):
    from specwatch.choosek.cli import sweep

    template, log = stub
    data = tmp_path / "sg.json"
    data.write_text(json.dumps([
        {"id": str(i), "conversations": [{"from": "human", "value": f"Question {i}: tell me about rivers."},
                                         {"from": "gpt", "value": f"Answer {i}: rivers flow to the sea."}]}
        for i in range(4)]))
    out = tmp_path / "s.json"
    r = CliRunner().invoke(sweep, ["--result-file", str(out), "--k", "2", "--workloads", "sharegpt,copy",
                                   "--dataset-path", str(data), "--concurrency", "1", "--output-len", "8",
                                   "--num-batches", "1", "--server-command", template, "--no-lock", "--no-progress"])
    assert r.exit_code == 0, r.output
    doc = sweep_document(out)
    assert doc["settings"]["dataset_path"] == str(data)
    assert {(c["config"], c["workload"]) for c in doc["cells"]} == {
        (cfg, wl) for cfg in ("baseline", "ngram-k2") for wl in ("sharegpt", "copy")}
    assert failed_cells(sweep_record(doc)) == []


# --------------------------------------------------------------------------------------------
# 10. the vLLM lock


def test_template_server_reports_lock_waits_and_timeouts(tmp_path):
    from specwatch.localvllm.server import VllmLock

    lock_path = tmp_path / "vllm.lock"
    msgs: list[str] = []
    srv = TemplateServer(["true"], free_port(), log_path=tmp_path / "x.log", lock=True, lock_path=lock_path,
                         lock_timeout=1.5, on_status=msgs.append)
    with VllmLock(lock_path), pytest.raises(SweepError, match=re.escape(f"another real vLLM still holds {lock_path} after 2 s")):
        srv.__enter__()
    assert msgs == [f"waiting for {lock_path} (another real vLLM is running: pid {os.getpid()})"]
    assert srv.process is None


def test_template_sweep_echoes_while_it_waits_for_the_lock(tmp_path, stub, monkeypatch):
    import specwatch.localvllm.server as emb
    from specwatch.localvllm.server import VllmLock

    template, log = stub
    lock_path = tmp_path / "vllm.lock"
    monkeypatch.setattr(emb, "LOCK_PATH", lock_path)
    held = VllmLock(lock_path)
    held.acquire()
    timer = threading.Timer(1.5, held.release)
    msgs: list[str] = []
    try:
        timer.start()
        doc = run_sweep(plan(ks=(1,), baseline=False), tmp_path / "s.json", template=template, lock=True,
                        progress=False, echo=lambda m, **_: msgs.append(m)).to_json()
    finally:
        timer.cancel()
        held.release()
    assert doc["status"] == "complete"
    assert f"waiting for {lock_path} (another real vLLM is running: pid {os.getpid()})" in msgs


# --------------------------------------------------------------------------------------------
# 11. messages


def test_messages_singular_cell_and_stopping_the_server(tmp_path, stub):
    template, _ = stub
    msgs: list[str] = []
    out = tmp_path / "s.json"
    run_sweep(plan(), out, template=template, echo=lambda m, **_: msgs.append(m), **QUIET)
    assert "baseline: starting the server (1 cell to run)" in msgs
    assert "ngram-k2: stopping the server (up to 30 s)…" in msgs
    msgs.clear()
    run_sweep(plan(), out, template=template, echo=lambda m, **_: msgs.append(m), **QUIET)
    assert f"baseline: its cell is already in {out}, skipped" in msgs


# --------------------------------------------------------------------------------------------
# second round of bad input


def test_a_first_attempt_that_measured_nothing_does_not_lock_the_file(tmp_path, stub):
    """A typo in --server-command (or a busy port) leaves a "failed" file without cells; the
    corrected command must be accepted on the same file."""
    template, log = stub
    out = tmp_path / "s.json"
    with pytest.raises(SweepError):
        run_sweep(plan(), out, template="false --port {port} {spec_args}", echo=lambda *a, **k: None, **QUIET)
    assert sweep_document(out)["status"] == "failed" and sweep_document(out)["cells"] == []
    doc = run_sweep(plan(), out, template=template, echo=lambda *a, **k: None, **QUIET).to_json()
    assert doc["status"] == "complete" and len(doc["cells"]) == 2
    assert "stub.py" in doc["server"]["command_template"]
    # a configuration without cells may be redefined; one with cells may not
    spec_a = (json.dumps({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 5}),)
    out2 = tmp_path / "s2.json"
    seen = []

    def stop_after_baseline(msg: str, **_: object) -> None:
        seen.append(msg)
        if "baseline copy" in msg:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(plan(ks=(), spec=spec_a), out2, template=template, echo=stop_after_baseline, **QUIET)
    spec_b = (json.dumps({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}),)
    doc = run_sweep(plan(ks=(), spec=spec_b), out2, template=template, echo=lambda *a, **k: None, **QUIET).to_json()
    assert doc["status"] == "complete"
    stored = next(c for c in doc["configs"] if c["k"] == 2)
    assert stored["speculative_config"]["prompt_lookup_max"] == 3
    with pytest.raises(SweepError, match="speculative config"):
        run_sweep(plan(ks=(), spec=spec_a), out2, template=template, echo=lambda *a, **k: None, **QUIET)


def test_two_sweeps_cannot_write_one_result_file(tmp_path, stub):
    from specwatch.choosek.resultfile import result_file_lock

    template, log = stub
    out = tmp_path / "s.json"
    with result_file_lock(out), pytest.raises(SweepError, match="another specwatch sweep is writing"):  # as a running sweep holds it
        run_sweep(plan(), out, template=template, echo=lambda *a, **k: None, **QUIET)
    assert not out.exists() and starts(log) == []
    assert run_sweep(plan(), out, template=template, echo=lambda *a, **k: None, **QUIET).to_json()["status"] == "complete"


def _as_if_from_a_shell() -> None:
    # `cmd &` ignores SIGINT; a terminal leaves SIGHUP at its default (under nohup, which CI may
    # use, SIGHUP is ignored and the sweep rightly keeps ignoring it)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_stops_the_sweep_and_its_server(tmp_path, stub, sig):
    """``timeout``/``docker stop`` (SIGTERM) or a closed terminal (SIGHUP) must stop the sweep
    like Ctrl-C: the server it started is stopped, the result file says "interrupted"."""
    template, log = stub
    pids = tmp_path / "pids.log"
    out = tmp_path / "s.json"
    env = {**os.environ, "STUB_PID_LOG": str(pids)}
    cmd = [sys.executable, "-m", "specwatch", "sweep", "--result-file", str(out), "--k", "2", "--workloads", "copy",
           "--concurrency", "1", "--output-len", "8", "--num-batches", "100000", "--server-command", template,
           "--no-lock", "--no-progress"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_as_if_from_a_shell)
    try:
        t0 = time.time()
        while not (pids.exists() and pids.read_text().strip()):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.time() - t0 < 60, "the stub server did not start"
            time.sleep(0.1)
        server_pid = int(pids.read_text().split()[0])
        time.sleep(1.0)
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output
    assert "interrupted" in output
    wait_until(lambda: not alive(server_pid), 15, interval=0.1)
    if alive(server_pid):
        os.kill(server_pid, signal.SIGKILL)
        raise AssertionError(f"the sweep left its server running after {sig.name}")
    assert sweep_document(out)["status"] == "interrupted"


def test_repeated_k_and_concurrency_are_measured_once(tmp_path, stub):
    from specwatch.choosek.cli import sweep

    template, log = stub
    out = tmp_path / "s.json"
    r = CliRunner().invoke(sweep, ["--result-file", str(out), "--k", "2,2", "--concurrency", "1,1", "--workloads", "copy",
                                   "--output-len", "8", "--num-batches", "1", "--server-command", template,
                                   "--no-lock", "--no-progress"])
    assert r.exit_code == 0, r.output
    doc = sweep_document(out)
    assert [c["name"] for c in doc["configs"]] == ["baseline", "ngram-k2"]
    assert sorted(keys(doc)) == [("baseline", "copy", 1), ("ngram-k2", "copy", 1)]
    assert starts(log) == [0, 2]
    r = CliRunner().invoke(sweep, ["--result-file", str(out), "--k", "", "--no-lock"])
    assert r.exit_code == 2 and "Invalid value for '--k': empty list" in r.output
