"""Crash-safe result files and log tails, shared by bench, sweep, demo and the local vLLM launcher."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any


class NotARegularFile(ValueError):
    """A file a command reads that is not a regular file (a FIFO, a device, a directory) or is
    larger than accepted; the message is one line naming it."""


def read_regular_file(path: str | Path, max_bytes: int, what: str) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes`` bytes. A FIFO (which would
    block), a device (``/dev/zero`` never ends) or a directory is refused before it is opened for
    reading (opened non-blocking, and checked again on the descriptor); a larger file is refused,
    and so is one that grows past the cap while it is read. ``what`` names it in messages ("sweep
    result").

    Raises:
        NotARegularFile: not a regular file, or too large.
        OSError: it cannot be read (missing, permissions).
    """
    p = Path(path)
    st = os.stat(p)
    if not stat.S_ISREG(st.st_mode):
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise NotARegularFile(f"{p}: the {what} must be a regular file, this is {kind}")
    if st.st_size > max_bytes:
        raise NotARegularFile(f"{p}: the {what} is {st.st_size} bytes, more than the {max_bytes} accepted")
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the stat
            raise NotARegularFile(f"{p}: the {what} must be a regular file")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > max_bytes:
        raise NotARegularFile(f"{p}: the {what} is more than the {max_bytes} bytes accepted")
    return b"".join(chunks)


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
        with contextlib.suppress(OSError):
            os.unlink(tmp)
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


def same_file(a: str | Path, b: str | Path) -> bool:
    """True when ``a`` and ``b`` name the same existing file (symlinks and hard links included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


#: The format keys of the measurement files specwatch writes, and what each file is: an output
#: flag never overwrites one (:func:`measurement_file_kind`).
#: The key is the document's first (each writer puts it there); a key deeper in, as the decision
#: inside an advice JSON holds, does not make the file a measurement.
_MEASUREMENT_KEYS = re.compile(rb'\A(?:\xef\xbb\xbf)?\s*\{\s*"(specwatch_sweep_format|specwatch_bench_format|specwatch_demo_format)"\s*:')
_MEASUREMENT_KINDS = {b"specwatch_sweep_format": "a specwatch sweep result",
                      b"specwatch_bench_format": "a specwatch bench result",
                      b"specwatch_demo_format": "a specwatch demo summary"}


def measurement_file_kind(path: str | Path) -> str | None:
    """What measurement file ``path`` holds ("a specwatch sweep result", "… bench result", "… demo
    summary"), from the first key of its JSON; None when it is missing, not a
    regular file, unreadable or none of those (an advice JSON, a report, a cost profile: outputs
    that may be written again)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return None
        with open(path, "rb") as fh:
            head = fh.read(65536)
    except OSError:
        return None
    m = _MEASUREMENT_KEYS.match(head)
    return None if m is None else _MEASUREMENT_KINDS[m.group(1)]


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
