#!/usr/bin/env python3
"""Benchmark: what the measured interval's batch means cost a fetch round (issue #37).

With ``--baseline-upstream`` the exporter also computes, for every upstream, (model, engine) and
window, how the decode speed moved between the window's fetches
(:meth:`specwatch.exporter.windows.WindowEngine.values` with ``spread=True``: a few binary searches
over the window's kept records). This runs two collectors side by side in one process on the same
bodies, round by round, alternating which goes first:

- A: N upstreams, the exporter's default windows (15s, 30s, 1m, 5m: a record every 1.25 s);
- B: the same, with the last upstream named ``--baseline-upstream`` (every window's spread).

Bodies are real vLLM 0.32 captures (tests/fixtures/metrics/vllm-0.32-ngram-k{2,4,8}-after-traffic.txt)
whose counters grow every round (as scripts/bench_exporter_soak.py serves them); a fake clock
advances 1.25 s per round, so after 241 rounds the 5m window holds its full history. Prints the
median round time of A and B over the rounds with a full history and their ratio (goal: B / A
close to 1). A benchmark, not a test: compare, don't time.

Usage: python scripts/bench_exporter_spread.py [--upstreams 128] [--rounds 300]
"""

from __future__ import annotations

import argparse
import statistics
import time

from prometheus_client import CollectorRegistry, generate_latest

from specwatch.exporter.collector import SpecwatchCollector
from specwatch.exporter.config import build_config

from benchlib import CAPTURES, growing_template, render_growing

FULL = 241  # rounds until the 5m window holds 300 s at one record per 1.25 s


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstreams", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    templates = [growing_template(p.read_text()) for p in CAPTURES]
    mult = {"n": 1}

    def fetch(upstream, timeout, max_bytes):
        i = int(upstream.name[1:])
        return render_growing(templates[i % len(templates)], mult["n"]).decode()

    names = [f"u{i}=http://127.0.0.1:9/{i}" for i in range(args.upstreams)]
    windows = ["15s", "30s", "1m", "5m"]
    regs, clocks = {}, {}
    for label, extra in (("A", {}), ("B", {"baseline_upstream": f"u{args.upstreams - 1}"})):
        clock = _Clock()
        cfg = build_config(names, windows, "127.0.0.1:1", min_fetch_interval=0.0, **extra)
        reg = CollectorRegistry(auto_describe=False)
        reg.register(SpecwatchCollector(cfg, fetch=fetch, clock=clock))
        regs[label], clocks[label] = reg, clock
    times: dict[str, list[float]] = {"A": [], "B": []}
    for r in range(args.rounds):
        mult["n"] = r + 1
        order = ("A", "B") if r % 2 == 0 else ("B", "A")
        for label in order:
            clocks[label].t += 1.25
            t0 = time.perf_counter()
            out = generate_latest(regs[label])
            if r >= FULL:
                times[label].append(time.perf_counter() - t0)
        assert b"specwatch_up" in out
    a, b = statistics.median(times["A"]) * 1e3, statistics.median(times["B"]) * 1e3
    print(f"{args.upstreams} upstreams, windows {','.join(windows)}, {len(times['A'])} rounds with a full 5m history "
          f"(after {FULL}), alternating A and B")
    print(f"{'collector':<40} | {'median round ms':>15}")
    print(f"{'A: no baseline upstream':<40} | {a:>15.1f}")
    print(f"{'B: --baseline-upstream (batch means)':<40} | {b:>15.1f}")
    print(f"ratio B / A: {b / a:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
