"""Processes by pid, as the tests that start servers (and their children) look at them."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an exited child its parent has not reaped yet
    holds nothing: it counts as gone). Reads ``/proc/<pid>/stat`` (Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:].split()[0] != b"Z"
