"""Child processes, signals and ports: one managed child server (:class:`ManagedProcess`: start,
wait until ready, stop its whole process group; on Linux the server gets SIGTERM when its parent
dies, even by SIGKILL: :func:`die_with_parent`), stopping a process group (also one recorded by an
earlier process: :func:`process_start_time`, :func:`stop_recorded_group`), turning SIGTERM and
SIGHUP into Ctrl-C, probing and picking listen ports. Shared by bench, sweep, demo and the local
vLLM launcher."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import psutil

if TYPE_CHECKING:
    import requests


class NotReady(RuntimeError):
    """A server did not answer in time, or its process exited first (the message says which)."""


class _HttpOk:
    """Readiness check ``GET url`` answers 200 (each try times out after 2 s); keeps the last
    request error for the timeout message."""

    def __init__(self, url: str):
        self.url = url
        self.last_error: requests.RequestException | None = None

    def __call__(self) -> bool:
        # imported here: `specwatch bench` loads this module for its signal handling and never
        # waits for a server, so it does not pay requests' import (about 0.1 s a process)
        import requests

        try:
            return requests.get(self.url, timeout=2).status_code == 200
        except requests.RequestException as exc:
            self.last_error = exc
            return False


def _poll_ready(check: Callable[[], Any], timeout: float, proc: subprocess.Popen | None, interval: float) -> str:
    """Call ``check`` every ``interval`` s until it returns true (``"ready"``), ``proc`` exits
    (``"exited"``, looked at before each try) or ``timeout`` s pass (``"not-ready"``)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            return "exited"
        if check():
            return "ready"
        if time.monotonic() >= deadline:
            return "not-ready"
        time.sleep(interval)


def _not_ready_message(what: str, timeout: float, url: str | None, last: BaseException | None) -> str:
    at = f" at {url}" if url else ""
    return f"{what} not ready{at} within {timeout:.0f} s" + (f" ({type(last).__name__})" if last else "")


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, what: str = "the server",
              interval: float = 0.3) -> None:
    """Wait until ``GET url`` answers 200 (each try times out after 2 s).

    Raises :class:`NotReady` naming ``what`` when ``proc`` exits first or ``timeout`` s pass."""
    check = _HttpOk(url)
    outcome = _poll_ready(check, timeout, proc, interval)
    if outcome == "exited":
        raise NotReady(f"{what} exited with code {proc.returncode}")
    if outcome == "not-ready":
        raise NotReady(_not_ready_message(what, timeout, url, check.last_error))


#: prctl(2) option: the signal the calling process gets when its parent (thread) dies.
_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen` that makes the child get ``sig`` when this
    process dies, however it dies (SIGKILL, the OOM killer, a CI timeout): Linux's
    ``prctl(PR_SET_PDEATHSIG)``, called through ctypes in the child before it executes the
    program. A parent that died before the call is noticed (the child's parent pid changed) and
    the child signals itself. The signal goes to the child alone, not its process group: a
    server's own children are its business (vLLM stops its engine core on SIGTERM).

    None where that is not available (not Linux, no libc ``prctl``) or when called outside the
    main thread: the kernel sends the signal when the *thread* that started the child exits, so
    a child started from a worker thread would die with the thread."""
    import sys

    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    signum = int(sig)

    def preexec() -> None:  # runs in the child between fork and exec: no imports, no allocation to speak of
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signum)

    return preexec


def process_start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (field 22 of ``/proc/<pid>/stat``),
    or None when there is no such process (or no /proc). With the pid it names one process for
    good: a pid reused later belongs to a process with another start time."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_bytes()
    except (OSError, ValueError):
        return None
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return int(fields[19])  # field 22 of the line; fields here start at field 3 (state)
    except (IndexError, ValueError):
        return None


def group_members(pgid: int, started_since: int | None = None) -> list[int]:
    """The live processes (zombies left out) of process group ``pgid``; with ``started_since``
    (ticks since boot, :func:`process_start_time`) only those started at or after it."""
    out = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) != pgid or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
        except (OSError, psutil.Error):
            continue
        if started_since is not None:
            st = process_start_time(proc.pid)
            if st is None or st < started_since:
                continue
        out.append(proc.pid)
    return out


def stop_recorded_group(pid: int, start_time: int | None, timeout: float) -> bool:
    """Stop the process group that process ``pid`` led when it started at ``start_time``
    (:func:`process_start_time`), recorded by another process (e.g. an earlier sweep that was
    killed): SIGTERM to the group, SIGKILL after ``timeout`` s, then up to 10 s for it to vanish.

    The group is that one only if its leader still has that start time, or, with the leader gone,
    for its members started since (Linux does not reuse a pid while a process group still carries
    it). A leader pid now used by another process means the group is long gone: nothing is
    signalled. Returns True when something was stopped, False when nothing of the group was left.

    Raises:
        PermissionError: the group belongs to someone else (it cannot be signalled).
        RuntimeError: ``start_time`` is None (the process cannot be identified) while the pid
            runs, or the group survives SIGKILL.
    """
    now = process_start_time(pid)
    if start_time is None:
        if now is None and not group_members(pid):
            return False
        raise RuntimeError(f"process {pid} runs but its start time was not recorded: it may not be the same process")
    if now is not None and now != start_time:
        return False  # the pid belongs to a newer process: the recorded group is gone

    def left() -> list[int]:
        return group_members(pid, started_since=start_time)

    if not left():
        return False
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait
        while left():
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        else:
            return True
    raise RuntimeError(f"process group {pid} survived SIGKILL for 10 s")


class StartFailed(NotReady):
    """Why a :class:`ManagedProcess` did not come up; the message is :func:`wait_http`'s.

    ``kind``: ``"cannot-run"`` (the program could not be executed; ``cause`` is the OSError),
    ``"exited"`` (it exited before it was ready; ``returncode``), ``"not-ready"`` (not ready
    within the start-up timeout; ``cause`` is a URL check's last request error, if any),
    ``"exited-after-ready"`` (the readiness check passed but the started process had exited:
    something else answered, e.g. another server on the port; ``returncode``)."""

    def __init__(self, message: str, kind: str, *, returncode: int | None = None, cause: BaseException | None = None):
        super().__init__(message)
        self.kind = kind
        self.returncode = returncode
        self.cause = cause


class LockLike(Protocol):
    """What :class:`ManagedProcess` needs of a lock (e.g. :class:`specwatch.common.locks.FileLock`)."""

    def acquire(self) -> None: ...

    def release(self) -> None: ...


class ManagedProcess:
    """One child server for the duration of a ``with`` block (or between :meth:`start` and :meth:`stop`).

    :meth:`start`: takes ``lock`` if given (its errors propagate as they are), calls
    ``before_start()`` (e.g. a port check; with the lock held), resolves ``argv`` (a sequence, or
    a callable returning one, called with the lock held: e.g. to prepare a model first), starts it
    in its own process group with stdin from /dev/null and stdout + stderr appended to
    ``log_path`` (its parent folder created; ``None``: a new temporary file named
    ``log_prefix…log``; ``"-"``: the caller's terminal; the child writes through its own copy of
    the descriptor, this object's copy is closed once the child started), then polls ``ready``
    every ``interval`` s until it passes and checks that the started process is still running.
    ``ready`` is a URL (ready when ``GET`` answers 200, each try timing out after 2 s, as
    :func:`wait_http`) or a callable returning true when ready (it handles its own request
    errors). ``startup_seconds``: from the start of the process until ready.

    On any failure of :meth:`start` (including Ctrl-C) the process group is stopped and the lock
    released before the error propagates. A start-up failure is a :class:`StartFailed` (the
    program cannot be run, it exits first, it is not ready within ``startup_timeout`` s, or it
    had exited when the check passed); with ``on_error`` the exception ``on_error(failure)``
    returns is raised instead, so callers keep their own exception types and messages.

    :meth:`stop`: :func:`stop_process_group` (SIGTERM, SIGKILL after ``stop_timeout`` s), then
    releases the lock if this object took it. Safe to call twice, and before :meth:`start`.

    The child gets SIGTERM when this process dies without stopping it (:func:`die_with_parent`:
    Linux, started from the main thread). ``on_launch(process)`` is called right after the
    process started, before the readiness wait (e.g. to record its pid for a later clean-up).

    Attributes: ``command`` (the argv started, ``[]`` before), ``process`` (the
    :class:`subprocess.Popen`, None before), ``log_path`` (None for the terminal, or before a
    temporary one is made), ``startup_seconds``, ``what`` (names it in messages), ``stop_timeout``.
    """

    def __init__(self, argv: Sequence[str] | Callable[[], Sequence[str]], *, ready: str | Callable[[], Any],
                 log_path: Path | str | None, what: str = "the server", env: Mapping[str, str] | None = None,
                 log_prefix: str = "specwatch-", startup_timeout: float = 60.0, stop_timeout: float = 30.0,
                 interval: float = 0.5, lock: LockLike | None = None, before_start: Callable[[], None] | None = None,
                 on_error: Callable[[StartFailed], BaseException] | None = None,
                 on_launch: Callable[[subprocess.Popen], None] | None = None):
        self.argv = argv
        self.on_launch = on_launch
        self.ready = ready
        self.what = what
        self.env = dict(env) if env is not None else None
        self._log_arg = log_path
        self.log_path: Path | None = Path(log_path) if log_path not in (None, "-") else None
        self.log_prefix = log_prefix
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.interval = interval
        self.lock = lock
        self.before_start = before_start
        self.on_error = on_error
        self.command: list[str] = []
        self.process: subprocess.Popen | None = None
        self.startup_seconds: float | None = None
        self._locked = False
        self._t0 = 0.0

    @property
    def running(self) -> bool:
        """The started process has not exited (False before :meth:`start`)."""
        return self.process is not None and self.process.poll() is None

    def start(self) -> ManagedProcess:
        """Start and wait until ready (see the class docstring)."""
        if self.lock is not None:
            self.lock.acquire()
            self._locked = True
        try:
            self.launch()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def launch(self) -> None:
        """The first half of :meth:`start` without the lock: ``before_start``, then start the
        process (no wait, no clean-up on failure: for starting several before waiting for each)."""
        if self.before_start is not None:
            self.before_start()
        self.command = [str(a) for a in (self.argv() if callable(self.argv) else self.argv)]
        with contextlib.ExitStack() as files:
            out = None
            if self._log_arg != "-":
                if self._log_arg is None:
                    fd, name = tempfile.mkstemp(prefix=self.log_prefix, suffix=".log")
                    os.close(fd)
                    self.log_path = Path(name)
                else:
                    self.log_path.parent.mkdir(parents=True, exist_ok=True)
                out = files.enter_context(open(self.log_path, "ab"))
            self._t0 = time.monotonic()
            try:
                self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT if out is not None else None,
                                                stdin=subprocess.DEVNULL, env=self.env, start_new_session=True,
                                                preexec_fn=die_with_parent())
            except OSError as exc:
                self._fail(StartFailed(f"cannot run {self.what} ({self.command[0]!r}): {exc.strerror or exc}",
                                       "cannot-run", cause=exc))
        if self.on_launch is not None:
            self.on_launch(self.process)

    def wait_ready(self) -> None:
        """The second half of :meth:`start`: poll ``ready`` (no clean-up on failure)."""
        url = self.ready if isinstance(self.ready, str) else None
        check = _HttpOk(url) if url is not None else self.ready
        outcome = _poll_ready(check, self.startup_timeout - (time.monotonic() - self._t0), self.process, self.interval)
        rc = self.process.poll()
        if outcome == "exited":
            self._fail(StartFailed(f"{self.what} exited with code {rc}", "exited", returncode=rc))
        if outcome == "not-ready":
            last = check.last_error if isinstance(check, _HttpOk) else None
            self._fail(StartFailed(_not_ready_message(self.what, self.startup_timeout, url, last), "not-ready", cause=last))
        if rc is not None:
            self._fail(StartFailed(f"{self.what} exited with code {rc} while its readiness check passed "
                                   "(another server on the port?)", "exited-after-ready", returncode=rc))
        self.startup_seconds = time.monotonic() - self._t0

    def _fail(self, failure: StartFailed) -> None:
        raise (failure if self.on_error is None else self.on_error(failure)) from None

    def stop(self) -> None:
        """Stop the process group (:func:`stop_process_group`) and release the lock if taken here."""
        try:
            stop_process_group(self.process, self.stop_timeout)
        finally:
            if self._locked:
                self._locked = False
                self.lock.release()

    def __enter__(self) -> ManagedProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (the kernel's pick for port 0)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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
    if process is None:
        return
    pgid = process.pid
    previous, deferred = _defer_stop_signals()
    try:
        if _group_alive(process, pgid):
            _signal_group(process, pgid, signal.SIGTERM)
            if not _wait_gone(process, pgid, timeout):
                _signal_group(process, pgid, signal.SIGKILL)
                _wait_gone(process, pgid, 10.0)
    finally:
        _restore_signals(previous, deferred)


def _group_alive(process: subprocess.Popen, pgid: int) -> bool:
    """Stop step: whether a process of the group is still alive (zombies do not count)."""
    if process.poll() is None:  # (also reaps the leader: its zombie would count for killpg)
        return True
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg also counts zombies (exited children not yet reaped by their new parent; a
    # container's PID 1 may never reap them): look for a live member of the group.
    return _has_live_member(pgid)


def _has_live_member(pgid: int) -> bool:
    """Stop step: whether any process of group ``pgid`` is not a zombie."""
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (OSError, psutil.Error):
            continue
    return False


def _signal_group(process: subprocess.Popen, pgid: int, sig: int) -> None:
    """Stop step: send ``sig`` to the group (to the process alone when it leads none)."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # not a group leader after all: signal the process alone
        if process.poll() is None:
            process.send_signal(sig)
    except PermissionError:
        pass


def _wait_gone(process: subprocess.Popen, pgid: int, seconds: float) -> bool:
    """Stop step: wait up to ``seconds`` for the group to vanish; whether it did."""
    deadline = time.monotonic() + seconds
    while _group_alive(process, pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _defer_stop_signals() -> tuple[dict[int, Any], list[int]]:
    """Stop step: from the main thread, record SIGINT and SIGTERM instead of acting on them;
    returns (the previous handlers, the list the signals are recorded in)."""
    deferred: list[int] = []
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.getsignal(sig)
            signal.signal(sig, lambda signum, frame: deferred.append(signum))
    return previous, deferred


def _restore_signals(previous: dict[int, Any], deferred: list[int]) -> None:
    """Stop step: restore the previous handlers, then hand the first recorded signal to its own."""
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
