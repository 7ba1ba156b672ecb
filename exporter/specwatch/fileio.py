"""Crash-safe result files, child-process shutdown and port probes, shared by bench, sweep, demo
and embedded."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` via a temporary file in the same directory, fsync and
    ``os.replace``: a crash or Ctrl-C leaves the previous complete file, never a torn one.
    A symlink is followed (its target is replaced, the link stays); a path that exists but is
    not a regular file (``/dev/stdout``, a FIFO, a device) is written in place, never replaced.
    Creates the parent directory; the file gets the usual mode (0666 less the umask).
    Raises OSError when the directory is not writable."""
    given = Path(path)
    try:
        st = os.stat(given)  # follows symlinks
    except OSError:
        st = None
    if (st is not None and not stat.S_ISREG(st.st_mode)) or str(given).startswith(("/dev/", "/proc/")):
        # /dev/stdout, a pipe, a FIFO, a device: write into it (replacing it would break it)
        with open(given, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        return
    path = Path(os.path.realpath(given))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def finite_json(o: Any) -> Any:
    """``o`` with every NaN/inf float replaced by None (JSON has no such numbers), dict keys as str."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): finite_json(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite_json(v) for v in o]
    return o


def atomic_write_json(path: str | Path, doc: Any, indent: int = 1) -> None:
    """:func:`atomic_write_text` of ``doc`` as JSON (NaN/inf become null; other objects via str)."""
    atomic_write_text(path, json.dumps(finite_json(doc), indent=indent, default=str) + "\n")


def stop_process_group(process: subprocess.Popen | None, timeout: float) -> None:
    """Stop every process of the group led by ``process`` (started with ``start_new_session=True``),
    including children that outlive the leader (vLLM's EngineCore holds the model's memory).

    SIGTERM to the group, then wait up to ``timeout`` s until no process of the group is left
    (polled with ``os.killpg(pgid, 0)`` every 0.05 s; zombies, which hold no memory, do not count),
    then SIGKILL the group and wait up to 10 s more for it to vanish. The leader is reaped (a
    ``process`` that leads no group is signalled alone). No-op when ``process`` is None or its
    group is already gone; returns (without raising) if processes still survive SIGKILL after
    those 10 s (stuck in the kernel).

    Called from the main thread, SIGINT and SIGTERM are deferred while it runs, so a second Ctrl-C
    cannot leave the server half-stopped: they are only recorded, the previous handlers are
    restored afterwards and the first recorded signal is then handed to its previous handler
    (Python's default SIGINT handler raises KeyboardInterrupt; SIG_IGN ignores it; SIG_DFL
    re-raises the signal). From other threads signals are not touched (``signal.signal`` works
    only in the main thread).
    """
    import threading
    import time

    if process is None:
        return
    pgid = process.pid

    def group_alive() -> bool:
        if process.poll() is None:  # (also reaps the leader: its zombie would count for killpg)
            return True
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # killpg also counts zombies (exited children not yet reaped by their new parent; a
        # container's PID 1 may never reap them): on Linux, look for a live member in /proc.
        try:
            pids = [p for p in os.listdir("/proc") if p.isdigit()]
        except OSError:
            return True
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2:].split()  # state, ppid, pgrp, …
            if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] != b"Z":
                return True
        return False

    def signal_group(sig: int) -> None:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:  # not a group leader after all: signal the process alone
            if process.poll() is None:
                process.send_signal(sig)
        except PermissionError:
            pass

    def wait_gone(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while group_alive():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    deferred: list[int] = []
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.getsignal(sig)
            signal.signal(sig, lambda signum, frame: deferred.append(signum))
    try:
        if group_alive():
            signal_group(signal.SIGTERM)
            if not wait_gone(timeout):
                signal_group(signal.SIGKILL)
                wait_gone(10.0)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        if deferred:
            signum = deferred[0]
            handler = previous.get(signum)
            if callable(handler):
                handler(signum, None)
            elif handler != signal.SIG_IGN:
                signal.raise_signal(signum)


def listen_error(host: str, port: int) -> str | None:
    """Why a server could not listen on ``host:port`` now (e.g. "Address already in use"), or None
    when it could. Binds with SO_REUSEADDR, as the servers do, so TIME_WAIT sockets do not count."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def install_stop_signals() -> None:
    """Make SIGTERM (``timeout``, ``docker stop``, systemd) and SIGHUP (the terminal or SSH session
    closed; left alone when ignored, as under ``nohup``) act exactly like Ctrl-C: each re-sends
    itself as SIGINT, so plain code gets KeyboardInterrupt and ``asyncio.run`` cancels its main
    task (the code's CancelledError paths run). A command that owns child servers or result files
    then stops them on its ``finally``/``with`` paths instead of dying with them running. SIGINT
    gets Python's default handler back even when the process was started from a shell that
    ignores it for background jobs (``cmd &``). Call from the main thread."""

    def _as_sigint(signum, frame):
        os.kill(os.getpid(), signal.SIGINT)

    signal.signal(signal.SIGTERM, _as_sigint)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # a closed terminal/SSH session; nohup ignores it
        signal.signal(signal.SIGHUP, _as_sigint)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def same_file(a: str | Path, b: str | Path) -> bool:
    """True when ``a`` and ``b`` name the same existing file (symlinks and hard links included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def log_tail(path: str | Path | None, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file (reads at most its last 64 KiB; undecodable bytes
    replaced), or "(no log file)" when there is none or it cannot be read."""
    try:
        with open(path, "rb") as fh:  # type: ignore[arg-type]
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except (OSError, TypeError):
        return "(no log file)"
    return "\n".join(text.splitlines()[-lines:])
