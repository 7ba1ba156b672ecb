"""Child processes, signals and ports: stopping a server's whole process group, turning SIGTERM
and SIGHUP into Ctrl-C, probing and picking listen ports. Shared by bench, sweep, demo and the
local vLLM launcher."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from typing import Any

import psutil
import requests


class NotReady(RuntimeError):
    """A server did not answer in time, or its process exited first (the message says which)."""


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, what: str = "the server",
              interval: float = 0.3) -> None:
    """Wait until ``GET url`` answers 200 (each try times out after 2 s).

    Raises :class:`NotReady` naming ``what`` when ``proc`` exits first or ``timeout`` s pass."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise NotReady(f"{what} exited with code {proc.returncode}")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException as exc:
            last = exc
        time.sleep(interval)
    raise NotReady(f"{what} not ready at {url} within {timeout:.0f} s" + (f" ({type(last).__name__})" if last else ""))


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
        # container's PID 1 may never reap them): look for a live member of the group.
        for proc in psutil.process_iter(["status"]):
            try:
                if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    return True
            except (OSError, psutil.Error):
                continue
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
