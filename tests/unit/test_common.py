"""The shared layer (``specwatch.common``): the one file lock, the one duration parser and the one
managed child process that the exporter, the mixin, the sweep, the demo and the local vLLM use."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from specwatch.common.locks import FileLock, LockHeld, lock_holder
from specwatch.common.params import int_list, parse_duration
from specwatch.common.processes import ManagedProcess, StartFailed, free_port
from specwatch.exporter.config import ConfigError, parse_window


def test_file_lock_excludes_another_process_and_names_its_holder(tmp_path):
    path = tmp_path / "lock"
    assert lock_holder(path) is None  # no file yet
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from specwatch.common.locks import FileLock\n"
        f"with FileLock({str(path)!r}, note='other job'):\n"
        "    print('held', flush=True); time.sleep(30)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert lock_holder(path) == (holder.pid, "other job")
        waited = []
        t0 = time.monotonic()
        with pytest.raises(LockHeld, match=str(path)):
            FileLock(path, timeout=0.6, on_wait=waited.append, poll=0.1).acquire()
        assert time.monotonic() - t0 >= 0.5 and len(waited) == 1  # waited, and said so once
    finally:
        holder.kill()
        holder.wait()
    # the holder died without releasing: flock goes with the process, nothing stale remains
    with FileLock(path, timeout=5, note="me") as lock:
        assert lock_holder(path) == (os.getpid(), "me")
    assert lock._fd is None and lock_holder(path) is None


def test_one_duration_parser_for_exporter_windows_and_mixin():
    assert parse_duration("1h30m") == 5400 and parse_duration("500ms") == 0.5
    for bad in ("", "5", "m", "5m1h", "1.5m", "-5m"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    w = parse_window(" 1h30m ")
    assert (w.label, w.seconds) == ("1h30m", 5400.0)
    for bad in ("4s", "25h", "5", "lifetime"):
        with pytest.raises(ConfigError, match="window"):
            parse_window(bad)


def test_int_list_with_one_message_for_every_bad_input():
    import click
    from click.testing import CliRunner

    @click.command()
    @click.option("--c", default="1,8", callback=int_list(1, dedupe=False, message="{value!r}: expected integers >= 1"))
    def cmd(c):
        click.echo(repr(c))

    assert CliRunner().invoke(cmd, []).output == "(1, 8)\n"
    assert CliRunner().invoke(cmd, ["--c", "2, 2"]).output == "(2, 2)\n"  # not deduplicated
    for bad in ("0,1", "1,x", ""):
        r = CliRunner().invoke(cmd, ["--c", bad])
        assert r.exit_code == 2 and f"Invalid value for '--c': {bad!r}: expected integers >= 1" in r.output, r.output


# a tiny HTTP server: answers 200 on / after SLEEP s, writes a line to its log, exits with EXIT
# after serving one request when EXIT is set
_SERVER = """
import http.server, os, sys, time
time.sleep(float(os.environ.get("SLEEP", "0")))
print("serving", flush=True)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
s = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
if os.environ.get("EXIT"):
    s.handle_request(); sys.exit(int(os.environ["EXIT"]))
s.serve_forever()
"""


class _CountingLock:
    def __init__(self):
        self.held = 0
        self.calls: list[str] = []

    def acquire(self):
        self.held += 1
        self.calls.append("acquire")

    def release(self):
        self.held -= 1
        self.calls.append("release")


def _server(tmp_path, port, **kw):
    script = tmp_path / "srv.py"
    script.write_text(_SERVER)
    env = {**os.environ, **{k: str(v) for k, v in kw.pop("env", {}).items()}}
    return ManagedProcess([sys.executable, str(script), str(port)], env=env, **kw)


def test_managed_process_starts_logs_waits_and_stops_its_group(tmp_path):
    port, lock = free_port(), _CountingLock()
    log = tmp_path / "logs" / "srv.log"
    log.parent.mkdir()
    log.write_text("earlier run\n")
    before = []
    proc = _server(tmp_path, port, env={"SLEEP": 0.5}, ready=f"http://127.0.0.1:{port}/", log_path=log, lock=lock,
                   before_start=lambda: before.append(lock.held), interval=0.05)
    with proc:
        assert proc.running and proc.startup_seconds >= 0.5
        assert before == [1]  # called with the lock held
        assert proc.command[-1] == str(port) and os.getpgid(proc.process.pid) == proc.process.pid
        pid = proc.process.pid
    assert not proc.running and proc.process.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    assert lock.calls == ["acquire", "release"]
    assert log.read_text() == "earlier run\nserving\n"  # appended
    proc.stop()  # twice: a no-op, the lock is not released again
    assert lock.calls == ["acquire", "release"]


def test_managed_process_start_failures_are_typed_and_clean_up(tmp_path):
    port, lock = free_port(), _CountingLock()
    # exits before ready
    p = _server(tmp_path, "not-a-port", ready=f"http://127.0.0.1:{port}/", log_path=tmp_path / "a.log", what="the stub",
                lock=lock, interval=0.05)
    with pytest.raises(StartFailed, match=r"^the stub exited with code 1$") as info:
        p.start()
    assert info.value.kind == "exited" and info.value.returncode == 1 and lock.held == 0
    assert "ValueError" in (tmp_path / "a.log").read_text()
    # not ready in time: wait_http's message, with the last request error; the process is stopped
    p = _server(tmp_path, port, env={"SLEEP": 30}, ready=f"http://127.0.0.1:{port}/", log_path="-", what="the stub",
                startup_timeout=0.5, interval=0.05, lock=lock)
    t0 = time.monotonic()
    with pytest.raises(StartFailed, match=rf"^the stub not ready at http://127.0.0.1:{port}/ within 0 s \(ConnectionError\)$"):
        p.start()
    assert time.monotonic() - t0 < 10 and p.process.poll() is not None and p.log_path is None and lock.held == 0
    # exits while the readiness check passes (as if another server answered on its port)
    p = ManagedProcess(["sh", "-c", "sleep 0.3; exit 3"], ready=lambda: p.process.wait(timeout=30) is not None,
                       log_path=tmp_path / "c.log", what="the stub", lock=lock)
    with pytest.raises(StartFailed, match="^the stub exited with code 3 while its readiness check passed") as info:
        p.start()
    assert info.value.kind == "exited-after-ready" and info.value.returncode == 3 and lock.held == 0
    # the caller's own exception from the error hook; a program that cannot run
    p = ManagedProcess([str(tmp_path / "missing")], ready="http://127.0.0.1:1/", log_path=tmp_path / "d.log", lock=lock,
                       on_error=lambda f: RuntimeError(f"mine: {f.kind}: {type(f.cause).__name__}"))
    with pytest.raises(RuntimeError, match="^mine: cannot-run: FileNotFoundError$"):
        p.start()
    assert p.process is None and lock.held == 0
    # before_start refuses: nothing starts, the lock is released
    p = _server(tmp_path, port, ready="http://127.0.0.1:1/", log_path=tmp_path / "e.log", lock=lock,
                before_start=lambda: (_ for _ in ()).throw(ValueError("port busy")))
    with pytest.raises(ValueError, match="port busy"):
        p.start()
    assert p.process is None and lock.held == 0 and not (tmp_path / "e.log").exists()


def test_managed_process_callable_readiness_and_temporary_log(tmp_path):
    port = free_port()
    answers = iter([False, False, True])
    script = tmp_path / "srv.py"
    script.write_text(_SERVER)
    p = ManagedProcess(lambda: [sys.executable, str(script), str(port)], ready=lambda: next(answers), log_path=None,
                       log_prefix="specwatch-test-mp-", interval=0.01)
    try:
        p.start()
        assert p.log_path.name.startswith("specwatch-test-mp-") and p.log_path.suffix == ".log"
        assert p.command == [sys.executable, str(script), str(port)]
        assert next(answers, "used up") == "used up"  # polled until the third answer
    finally:
        p.stop()
        if p.log_path is not None:
            p.log_path.unlink()
