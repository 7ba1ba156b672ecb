#!/usr/bin/env python3
"""Soak benchmark: `specwatch serve` with many upstreams and concurrent scrapers over minutes.

Starts, on 127.0.0.1 only,

- one fake-upstream process (asyncio, one thread) serving real vLLM 0.32 captures
  (tests/fixtures/metrics/vllm-0.32-ngram-k{2,4,8}-after-traffic.txt) as N upstreams; each answer
  multiplies the counters the exporter reads by the number of requests that upstream has served
  so far (integers, so vLLM's invariants hold), so window values change on every fetch;
  ``--hung H`` makes the first H upstreams *hung*: they answer a status line and then trickle one
  header byte per second, forever (the worst case for a per-read timeout);
- the exporter as a real process (`python -m specwatch serve`, windows 1m and 5m, defaults
  otherwise: 5 s fetch deadline, 1 s fetch coalescing interval);
- C scraper threads, each GETting /metrics back to back (15 s client timeout).

Reports per minute: scrapes, p50/p99/max latency, fewest healthy upstreams up in one scrape,
and the exporter's RSS and open file descriptors at start (after the first scrape) and end
(from /proc). Goals (issue #14): 128 upstreams, 10 scrapers, 5 minutes: p99 < 5 s in every
minute, last minute's p50 within 20 % of the first's, RSS growth < 10 MB; with 40 hung: every
scrape < 8 s with the 88 healthy ones up. A benchmark, not a test: it prints, it does not assert.

Usage: python scripts/bench_exporter_soak.py [--upstreams 128] [--scrapers 10] [--minutes 5]
                                             [--hung 0] [--json FILE] [--windows 15s,30s,1m,5m]
                                             [--baseline-upstream]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

from specwatch.common.processes import free_port

from benchlib import CAPTURES, growing_template, render_growing, write_result

def _upstream_server(port_out, n_hung: int) -> None:
    templates = [growing_template(p.read_text()) for p in CAPTURES]
    served: dict[int, int] = {}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                i = int(path.strip("/").split("/")[0])
                if i < n_hung:
                    writer.write(b"HTTP/1.1 200 OK\r\nX-Trickle: ")
                    while True:
                        await writer.drain()
                        await asyncio.sleep(1.0)
                        writer.write(b"x")
                served[i] = served.get(i, 0) + 1
                body = render_growing(templates[i % len(templates)], served[i])
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError, IndexError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        srv = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        port_out.put(srv.sockets[0].getsockname()[1])
        async with srv:
            await srv.serve_forever()

    asyncio.run(main())


def _proc_stats(pid: int) -> tuple[float, int]:
    """(RSS in MB, open file descriptors) of ``pid`` from /proc."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstreams", type=int, default=128)
    ap.add_argument("--scrapers", type=int, default=10)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--hung", type=int, default=0, help="how many of the upstreams are hung (header trickle)")
    ap.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    ap.add_argument("--windows", default="1m,5m",
                    help="the exporter's windows (default 1m,5m; the exporter's own default is 15s,30s,1m,5m, whose "
                         "shortest window makes it keep a record every 1.25 s)")
    ap.add_argument("--baseline-upstream", action="store_true",
                    help="name the last upstream --baseline-upstream: every upstream's windows then also compute "
                         "the measured interval's batch means (a pass over the window's kept records; issue #37)")
    args = ap.parse_args()

    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    up_proc = ctx.Process(target=_upstream_server, args=(q, args.hung), daemon=True)
    up_proc.start()
    up_port = q.get(timeout=30)
    port = free_port()
    cmd = [sys.executable, "-m", "specwatch", "serve", "--listen-address", f"127.0.0.1:{port}", "--log-level", "error"]
    for w in args.windows.split(","):
        cmd += ["--window", w.strip()]
    for i in range(args.upstreams):
        cmd += ["--upstream", f"u{i}=http://127.0.0.1:{up_port}/{i}"]
    if args.baseline_upstream:
        cmd += ["--baseline-upstream", f"u{args.upstreams - 1}"]
    exp = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    healthy = args.upstreams - args.hung
    try:
        for _ in range(200):
            try:
                requests.get(f"http://127.0.0.1:{port}/", timeout=2)
                break
            except requests.ConnectionError:
                time.sleep(0.1)
        requests.get(url, timeout=30)  # first round: connections opened, history started
        rss0, fd0 = _proc_stats(exp.pid)
        t_start = time.monotonic()
        t_end = t_start + args.minutes * 60
        records: list[tuple[float, float, int, int]] = []  # (t, seconds, status, healthy up)
        lock = threading.Lock()
        up_re = re.compile(rb'^specwatch_up\{upstream="u(\d+)"\} 1\.0$', re.M)

        def scraper() -> None:
            s = requests.Session()
            while time.monotonic() < t_end:
                t0 = time.monotonic()
                try:
                    r = s.get(url, timeout=15)  # the whole body read (not streamed)
                    t1 = time.monotonic()  # the scrape's latency ends here, before this client parses the body
                    status = r.status_code
                    n_up = sum(1 for m in up_re.finditer(r.content) if int(m.group(1)) >= args.hung)
                except requests.RequestException:
                    t1 = time.monotonic()
                    status, n_up = 0, 0
                with lock:
                    records.append((t0 - t_start, t1 - t0, status, n_up))

        threads = [threading.Thread(target=scraper, daemon=True) for _ in range(args.scrapers)]
        for t in threads:
            t.start()
        minutes = int(round(args.minutes))
        per_min_stats = []
        for m in range(minutes):
            time.sleep(max(0.0, t_start + (m + 1) * 60 - time.monotonic()))
            per_min_stats.append(_proc_stats(exp.pid))
        for t in threads:
            t.join(timeout=30)
        rss1, fd1 = _proc_stats(exp.pid)
    finally:
        exp.terminate()
        try:
            exp.wait(timeout=10)
        except subprocess.TimeoutExpired:
            exp.kill()
        up_proc.terminate()

    print(f"{args.upstreams} upstreams ({args.hung} hung: header trickle), {args.scrapers} scrapers, "
          f"{args.minutes:g} min; windows {args.windows}{'; --baseline-upstream (batch means)' if args.baseline_upstream else ''}; "
          f"bodies {', '.join(p.name for p in CAPTURES)}")
    print(f"{'minute':>6} | {'scrapes':>7} | {'p50 s':>6} | {'p99 s':>6} | {'max s':>6} | {'non-200':>7} | "
          f"{'fewest healthy up':>17} | {'RSS MB':>6} | {'fds':>4}")
    rows = []
    for m in range(minutes):
        xs = [r for r in records if m * 60 <= r[0] < (m + 1) * 60]
        lat = [r[1] for r in xs] or [float("nan")]
        row = {"minute": m + 1, "scrapes": len(xs), "p50": statistics.median(lat), "p99": _pct(lat, 0.99),
               "max": max(lat), "non_200": sum(1 for r in xs if r[2] != 200),
               "fewest_healthy_up": min((r[3] for r in xs), default=0),
               "rss_mb": per_min_stats[m][0], "fds": per_min_stats[m][1]}
        rows.append(row)
        print(f"{row['minute']:>6} | {row['scrapes']:>7} | {row['p50']:>6.2f} | {row['p99']:>6.2f} | {row['max']:>6.2f} | "
              f"{row['non_200']:>7} | {row['fewest_healthy_up']:>8} of {healthy:<5} | {row['rss_mb']:>6.1f} | {row['fds']:>4}")
    summary = {
        "upstreams": args.upstreams, "hung": args.hung, "scrapers": args.scrapers, "minutes": args.minutes,
        "windows": args.windows, "baseline_upstream": args.baseline_upstream,
        "rss_mb_start": rss0, "rss_mb_end": rss1, "fds_start": fd0, "fds_end": fd1,
        "last_over_first_p50": rows[-1]["p50"] / rows[0]["p50"] if rows and rows[0]["p50"] else None,
        "max_p99": max(r["p99"] for r in rows) if rows else None,
        "max_latency": max(r["max"] for r in rows) if rows else None,
        "minutes_detail": rows,
    }
    print(f"RSS {rss0:.1f} -> {rss1:.1f} MB ({rss1 - rss0:+.1f}); open files {fd0} -> {fd1}; "
          f"last/first minute p50 {summary['last_over_first_p50']:.2f}; worst p99 {summary['max_p99']:.2f} s; "
          f"slowest scrape {summary['max_latency']:.2f} s")
    write_result(args.json, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
