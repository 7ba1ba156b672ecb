"""Issue #38 item 2: a sweep killed with SIGKILL (the OOM killer, ``kill -9``, a CI timeout) must not
leave its server running, and a resume must not start a second one beside a server an earlier run
left behind.

Real child processes throughout: the sweep runs as ``python -m specwatch sweep`` with the stub
server of tests/support/sweep_stub.py as its ``--server-command``, and is killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specwatch.choosek.resultfile import SweepError
from specwatch.choosek.sweep import ServerRecord, SweepPlan, build_configs, run_sweep, servers_record_path
from specwatch.common.processes import process_start_time, stop_recorded_group
from pids import alive
from polling import wait_until

WRAPPER = """
import subprocess, sys
# a server whose own child does the work (as vLLM's engine core): SIGTERM ends this process
# (default action) and leaves the child running in the process group
sys.exit(subprocess.Popen([sys.executable] + sys.argv[1:]).wait())
"""


def _kill_sweep_once_serving(tmp_path: Path, template: str, out: Path) -> tuple[int, dict]:
    """Start a sweep that would run for hours, wait until its stub server started (its pid in
    STUB_PID_LOG), SIGKILL the sweep; returns (the stub's pid, the recorded server entry)."""
    pids = tmp_path / "pids.log"
    env = {**os.environ, "STUB_PID_LOG": str(pids)}
    cmd = [sys.executable, "-m", "specwatch", "sweep", "--result-file", str(out), "--k", "2", "--workloads", "copy",
           "--concurrency", "1", "--output-len", "8", "--num-batches", "100000", "--server-command", template,
           "--no-lock", "--no-progress", "--sequential"]  # one server up (paired would start a second beside it)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        t0 = time.time()
        while not (pids.exists() and pids.read_text().strip()):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.time() - t0 < 60, "the stub server did not start"
            time.sleep(0.1)
        wait_until(lambda: ServerRecord(out).entries(), 10, interval=0.1)
        entries = ServerRecord(out).entries()
        time.sleep(1.0)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(entries) == 1, entries
    return int(pids.read_text().split()[0]), entries[0]


def _reap(pid: int) -> None:
    if alive(pid):
        os.kill(pid, signal.SIGKILL)


def test_the_server_of_a_sweep_killed_with_sigkill_stops(tmp_path, stub):
    template, _ = stub
    out = tmp_path / "s.json"
    server_pid, entry = _kill_sweep_once_serving(tmp_path, template, out)
    assert entry["pid"] == server_pid and entry["config"] == "baseline"
    assert entry["start_time"] == process_start_time(server_pid) or not alive(server_pid)
    try:
        wait_until(lambda: not alive(server_pid), 20, interval=0.1)
        assert not alive(server_pid), "the server outlived the sweep killed with SIGKILL"
    finally:
        _reap(server_pid)


def test_a_resume_stops_the_server_an_earlier_killed_sweep_left_behind(tmp_path, stub):
    template, log = stub
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    wrapped = f"{shlex.quote(sys.executable)} {shlex.quote(str(wrapper))} " + template.split(" ", 1)[1]
    out = tmp_path / "s.json"
    worker_pid, entry = _kill_sweep_once_serving(tmp_path, wrapped, out)
    try:
        leader = entry["pid"]
        wait_until(lambda: not alive(leader), 20, interval=0.1)  # the leader got SIGTERM when the sweep died
        time.sleep(0.5)
        assert alive(worker_pid), "the scenario needs a survivor in the server's process group"
        assert os.getpgid(worker_pid) == leader
        msgs: list[str] = []
        plan = SweepPlan(build_configs((2,), (), True), ("copy",), (1,), 8, None, 1, 1, 1, 0, paired=False)
        doc = run_sweep(plan, out, template=template, lock=False, progress=False, echo=lambda m, **_: msgs.append(m)).to_json()
        assert doc["status"] == "complete"
        assert any(m.startswith(f"stopping the server an earlier sweep of {out} left running (baseline, pid {leader};")
                   for m in msgs), msgs
        assert msgs.index(next(m for m in msgs if m.startswith("stopping the server an earlier"))) < msgs.index(
            "baseline: starting the server (1 cell to run)")
        assert not alive(worker_pid)
        assert not servers_record_path(out).exists()  # every server of the resume was stopped
    finally:
        _reap(worker_pid)


def test_a_recorded_pid_now_used_by_another_process_is_left_alone(tmp_path):
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        out = tmp_path / "s.json"
        real = process_start_time(other.pid)
        assert real is not None
        path = servers_record_path(out)
        path.write_text(json.dumps({"running_servers": [{"config": "baseline", "pid": other.pid, "start_time": real - 1}]}))
        msgs: list[str] = []
        ServerRecord(out).stop_leftovers(out, msgs.append, timeout=1)
        assert other.poll() is None and msgs == []
        assert not path.exists()
        assert stop_recorded_group(other.pid, real - 1, 1) is False and other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_a_leftover_that_cannot_be_stopped_is_refused_in_one_line(tmp_path, stub, monkeypatch):
    import specwatch.common.processes as processes

    template, log = stub
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        out = tmp_path / "s.json"
        servers_record_path(out).write_text(json.dumps({"running_servers": [
            {"config": "ngram-k2", "pid": other.pid, "start_time": process_start_time(other.pid)}]}))

        def refuse(pgid, sig):
            raise PermissionError(1, "Operation not permitted")

        monkeypatch.setattr(processes.os, "killpg", refuse)
        plan = SweepPlan(build_configs((2,), (), True), ("copy",), (1,), 8, None, 1, 1, 1, 0, paired=False)
        with pytest.raises(SweepError) as err:
            run_sweep(plan, out, template=template, lock=False, progress=False, echo=lambda *a, **k: None)
        msg = err.value.message
        assert "\n" not in msg
        assert msg == (f"a server an earlier sweep of {out} left running (ngram-k2, pid {other.pid}) cannot be stopped: "
                       f"it belongs to another user; stop it (kill -TERM -{other.pid}) or use another --result-file")
        monkeypatch.undo()
        assert other.poll() is None and not log.exists()  # nothing started beside it
    finally:
        other.kill()
        other.wait()
