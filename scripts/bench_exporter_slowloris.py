#!/usr/bin/env python3
"""Slowloris benchmark: can a well-behaved scraper still read `specwatch serve` while one client
holds many half-sent requests and re-opens each as soon as it is answered? (issue #26, item 4)

Starts, on 127.0.0.1 only,

- one fake upstream (a thread) serving the real vLLM 0.32 capture
  tests/fixtures/metrics/vllm-0.32-ngram-k4-after-traffic.txt;
- the exporter as a real process (`python -m specwatch serve`, defaults unless ``--serve-arg``);
- the attacker (a thread, one selector): ``--connections`` connections, each sending
  ``GET /metrics HTTP/1.1`` and the start of a header line, never finishing it; a connection that
  gets an answer (408 at the request timeout, 503) or is closed is re-opened at once;
- the scraper: one GET /metrics every ``--interval`` seconds for ``--seconds`` seconds (client
  timeout 5 s), once the attacker has held its connections for 1.5 s.

Prints (and with ``--json FILE`` writes) the scrapes, how many answered 200 within 1 s, the
latency percentiles, the status codes, and how often the attacker was answered. Goal (issue #26):
at least 95 % of the scrapes answer 200 within 1 s under 200 connections. A benchmark: it prints,
it does not assert (tests/integration/test_exporter_hardening_labels.py runs it briefly and asserts).

Usage: python scripts/bench_exporter_slowloris.py [--connections 200] [--seconds 60] [--interval 0.5]
                                                  [--serve-arg=--request-timeout=10 ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

from specwatch.common.processes import free_port

from benchlib import serve_bodies, write_result

REPO = Path(__file__).resolve().parent.parent
CAPTURE = REPO / "tests" / "fixtures" / "metrics" / "vllm-0.32-ngram-k4-after-traffic.txt"
HALF = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def start_exporter(upstream: str, serve_args: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "specwatch", "serve", "--listen-address", f"127.0.0.1:{port}",
                             "--upstream", f"good={upstream}", "--log-level", "error", *serve_args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"specwatch serve exited: {proc.stderr.read()}")
        try:
            requests.get(base + "/", timeout=1)
            return proc, base
        except requests.RequestException:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("specwatch serve did not start")


class Attacker(threading.Thread):
    """Holds ``n`` half-sent requests to ``port``, re-opening each as soon as it is answered or closed."""

    def __init__(self, port: int, n: int):
        super().__init__(daemon=True)
        self.port, self.n = port, n
        self.stop = threading.Event()
        self.answers: collections.Counter = collections.Counter()
        self.opened = 0
        self.held = 0

    def _open(self, sel: selectors.BaseSelector) -> None:
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            s.sendall(HALF)
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
            self.opened += 1
        except OSError:
            self.answers["connect_failed"] += 1
            time.sleep(0.01)

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            while not self.stop.is_set():
                while len(sel.get_map()) < self.n and not self.stop.is_set():
                    self._open(sel)
                self.held = len(sel.get_map())
                for key, _ in sel.select(timeout=0.05):
                    s = key.fileobj
                    try:
                        data = s.recv(4096)
                    except OSError:
                        data = b""
                    code = data.split(b" ", 2)[1].decode("ascii", "replace") if data.startswith(b"HTTP/") else "closed"
                    self.answers[code] += 1
                    sel.unregister(s)
                    s.close()
        finally:
            for key in list(sel.get_map().values()):
                key.fileobj.close()
            sel.close()


def run(base: str, port: int, connections: int, seconds: float, interval: float) -> dict:
    """Attack ``port`` with ``connections`` half-sent requests and scrape ``base`` meanwhile; the figures."""
    attacker = Attacker(port, connections)
    attacker.start()
    end = time.monotonic() + 15
    while attacker.held < connections and time.monotonic() < end:
        time.sleep(0.05)
    time.sleep(1.5)  # the held connections are now older than any eviction threshold
    held_at_start = attacker.held
    lat: list[float] = []
    codes: collections.Counter = collections.Counter()
    ok = 0
    t_end = time.monotonic() + seconds
    try:
        while time.monotonic() < t_end:
            t0 = time.monotonic()
            try:
                r = requests.get(base + "/metrics", timeout=5)
                code: str | int = r.status_code
            except requests.RequestException as exc:
                code = type(exc).__name__
            took = time.monotonic() - t0
            lat.append(took)
            codes[str(code)] += 1
            ok += code == 200 and took <= 1.0
            time.sleep(max(0.0, interval - took))
    finally:
        attacker.stop.set()
        attacker.join(5)
    lat.sort()
    n = len(lat)
    return {
        "connections": connections, "held_at_start": held_at_start, "seconds": seconds, "interval": interval,
        "scrapes": n, "ok_200_within_1s": ok, "ok_share": ok / n if n else 0.0,
        "p50_seconds": statistics.median(lat) if lat else None,
        "p99_seconds": lat[min(n - 1, int(0.99 * n))] if lat else None, "max_seconds": lat[-1] if lat else None,
        "status_codes": dict(codes), "attacker_opened": attacker.opened, "attacker_answers": dict(attacker.answers),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--serve-arg", action="append", default=[], help="extra flag for specwatch serve (repeatable)")
    ap.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = ap.parse_args()
    srv, upstream = serve_bodies([CAPTURE.read_bytes()])
    proc, base = start_exporter(upstream, [a for x in args.serve_arg for a in x.split("=", 1)])
    try:
        res = run(base, int(base.rsplit(":", 1)[1]), args.connections, args.seconds, args.interval)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        srv.shutdown()
    res["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    res["machine"] = f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    print(json.dumps(res, indent=2))
    print(f"{res['ok_200_within_1s']}/{res['scrapes']} scrapes answered 200 within 1 s ({100 * res['ok_share']:.1f} %) "
          f"under {args.connections} held half-sent connections (goal: >= 95 %)")
    write_result(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
