"""One advisory file lock (``flock``) for everything that must run alone on this machine: a real
vLLM (:class:`specwatch.localvllm.server.VllmLock`) and a sweep's result file
(:func:`specwatch.choosek.resultfile.result_file_lock`).

The lock file holds one line ``PID [NOTE]`` while held, so a waiter can say who holds it
(:func:`lock_holder`). The lock dies with its process (flock), so a killed holder never leaves a
stale lock behind.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path


class LockHeld(TimeoutError):
    """Another process still held the lock when the allowed wait ran out."""


class FileLock:
    """Exclusive ``flock`` on ``path`` (created if missing, mode 0666).

    ``timeout``: seconds to wait for it (0: fail at once), polling every ``poll`` s;
    ``on_wait(message)`` is called when it has to wait and again every ``remind`` s while it
    waits (:meth:`wait_message`: the holder's pid and note when the file names them, and how long
    it has waited), so a long wait is never silent; ``note`` goes into the file beside this
    process' PID while held. Usable as a context manager.

    Raises:
        LockHeld: still held by another process after ``timeout`` seconds.
        OSError: the lock file cannot be opened.
    """

    def __init__(self, path: Path | str, timeout: float = 0.0, *, on_wait: Callable[[str], None] | None = None,
                 note: str = "", poll: float = 0.5, remind: float = 30.0):
        self.path = Path(path)
        self.remind = remind
        self.timeout = timeout
        self.on_wait = on_wait
        self.note = note
        self.poll = poll
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock (see the class docstring for the errors)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        start = time.monotonic()
        deadline = start + self.timeout
        next_word = start
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
            if time.monotonic() >= deadline:
                os.close(fd)
                raise LockHeld(f"{self.path} is held by another process (waited {self.timeout:.0f} s)")
            now = time.monotonic()
            if self.on_wait is not None and now >= next_word:
                self.on_wait(self.wait_message(now - start, lock_holder(self.path)))
                next_word = now + self.remind
            time.sleep(self.poll)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {self.note}".rstrip().encode() + b"\n")
        self._fd = fd

    def wait_message(self, waited: float, holder: tuple[int, str] | None) -> str:
        """What :meth:`acquire` tells ``on_wait`` while it waits: ``waiting for PATH (held by pid
        N, NOTE)``, then ``…; waited 30 s so far`` on each reminder."""
        held = "" if holder is None else f" (held by pid {holder[0]}" + (f", {holder[1]}" if holder[1] else "") + ")"
        return f"waiting for {self.path}{held}" + (f"; waited {waited:.0f} s so far" if waited >= 1 else "")

    def release(self) -> None:
        """Release the lock (no-op if not held)."""
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_holder(path: Path | str) -> tuple[int, str] | None:
    """``(pid, note)`` written by the current holder of the lock at ``path``, or None if the lock
    is free or the file is missing/unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            pass  # held exclusively: read who holds it
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        line = os.read(fd, 4096).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)
    pid, _, note = line.partition(" ")
    return (int(pid), note.strip()) if pid.isdigit() else None
