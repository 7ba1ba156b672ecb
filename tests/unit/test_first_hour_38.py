"""Issue #38 item 12, the first hour's details (the readers' exit codes and ``report -o`` into a
missing directory are in test_sweep_readers.py):

- a wait for the machine-wide vLLM lock is said on the console when it starts and every ~30 s
  while it lasts, naming the holder's pid; also without an ``on_status`` (stderr);
- a failed ``specwatch bench`` says where it wrote its result files (status failed);
- the demo keeps running at the end only when its output is a terminal (not its input);
- ``serve --help`` / ``top --help`` say ``--cost-profile`` gives basis calibrated/profile;
- the README's port table says where ``specwatch serve`` listens by default.
"""

from __future__ import annotations

import io
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from specwatch.common.locks import FileLock
from specwatch.common.processes import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_a_lock_wait_is_said_again_while_it_lasts_naming_the_holder(tmp_path):
    path = tmp_path / "x.lock"
    holder = FileLock(path, note="the holder's note")
    holder.acquire()
    timer = threading.Timer(1.3, holder.release)
    msgs: list[str] = []
    try:
        timer.start()
        FileLock(path, timeout=10, on_wait=msgs.append, poll=0.05, remind=0.4).acquire()
    finally:
        timer.cancel()
        holder.release()
    assert msgs[0] == f"waiting for {path} (held by pid {os.getpid()}, the holder's note)"
    assert len(msgs) >= 3, msgs  # said again every `remind` seconds, not once
    assert all(m.startswith(f"waiting for {path} (held by pid {os.getpid()}") for m in msgs)
    assert re.search(r"; waited \d+ s so far$", msgs[-1]), msgs


def test_the_vllm_lock_wait_is_said_every_30_s_by_default():
    from specwatch.localvllm.server import VllmLock

    assert VllmLock(Path("/nonexistent/lock")).remind == 30.0


def test_an_embedded_vllm_without_on_status_says_its_lock_wait_on_stderr(tmp_path, capsys):
    from specwatch.localvllm.server import LockTimeout, VllmLock, VllmServer

    lock_path = tmp_path / "vllm.lock"
    with VllmLock(lock_path, note="http://127.0.0.1:1"), pytest.raises(LockTimeout):
        VllmServer(free_port(), lock_path=lock_path, lock_timeout=1.2).start()
    err = capsys.readouterr().err
    assert f"specwatch: waiting for {lock_path} (another real vLLM is running: pid {os.getpid()}, http://127.0.0.1:1)" in err


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_failed_bench_says_where_it_wrote_its_result_files(tmp_path):
    r = subprocess.run([sys.executable, "-m", "specwatch", "bench", "--base-url", f"http://127.0.0.1:{_closed_port()}",
                        "--metrics-port", "0", "--no-progress"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    written = sorted(tmp_path.glob("specwatch-bench-*"))
    assert [p.suffix for p in written] == [".csv", ".json"], written
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("Error: ") and "Traceback" not in r.stderr
    for p in written:
        assert str(p.resolve()) in line, line
    assert "status failed" in line


class _Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


@pytest.mark.parametrize(("stdin_tty", "stdout_tty"), [(True, False), (False, True)])
def test_the_demo_keeps_running_only_when_its_output_is_a_terminal(tmp_path, monkeypatch, stdin_tty, stdout_tty):
    import specwatch.demo as demo_mod

    seen = {}
    monkeypatch.setattr(demo_mod, "run_demo", lambda settings, stack, con: seen.setdefault("settings", settings))
    monkeypatch.setattr(demo_mod.DemoStack, "problem", lambda self: None)
    ctx = demo_mod.demo.make_context("demo", ["--result-dir", str(tmp_path / "out")])
    monkeypatch.setattr(sys, "stdin", _Stream(stdin_tty))
    monkeypatch.setattr(sys, "stdout", _Stream(stdout_tty))
    with ctx:
        demo_mod.demo.callback(**ctx.params)
    assert seen["settings"].keep_running is stdout_tty


@pytest.mark.parametrize("command", ["serve", "top"])
def test_help_says_the_cost_profile_gives_calibrated_and_profile(command):
    from specwatch.cli import main

    text = " ".join(CliRunner().invoke(main, [command, "--help"], terminal_width=200).output.split())
    cost = text[text.index("--cost-profile"):][:400]
    assert "calibrated" in cost and "profile" in cost, cost
    assert "measured/profile" not in text


def test_readme_port_table_says_where_serve_listens():
    from specwatch.exporter.config import DEFAULT_LISTEN_ADDRESS

    host, port = DEFAULT_LISTEN_ADDRESS.rsplit(":", 1)
    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith(f"| {port} |"))
    assert "specwatch serve" in row and f"`{host}`" in row and "--listen-address 127.0.0.1" in row
