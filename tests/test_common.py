"""The shared layer (``specwatch.common``): the one file lock and the one duration parser that
the exporter, the mixin, the sweep and the local vLLM all use."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from specwatch.common.locks import FileLock, LockHeld, lock_holder
from specwatch.common.params import parse_duration
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
