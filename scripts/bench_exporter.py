#!/usr/bin/env python3
"""Benchmark: the exporter's cost per scrape against a bare fetch + parse of the same bodies.

Serves real vLLM captures (tests/fixtures/metrics/) from a local HTTP server as N upstreams and,
interleaving the two side by side in one run, measures

- bare:     fetch every upstream's /metrics concurrently (requests, same thread pool size) and parse
            each body completely with prometheus_client.parser;
- exporter: one full scrape of the specwatch collector (fetch, parse, invariants, lifetime and
            window values, advice) rendered with generate_latest, as Prometheus would get it.

Prints the median of each and their ratio for N = 1 and N = 32 (goal: ratio ≤ 1.2, and 32
upstreams well inside a 10 s scrape). A benchmark, not a test: compare, don't time.

Usage: python scripts/bench_exporter.py [--rounds 30] [--upstreams 1,32]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.exporter.collector import SpecwatchCollector
from specwatch.exporter.config import build_config

from benchlib import serve_bodies

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "metrics"
CAPTURES = [FIXTURES / f"vllm-0.32-ngram-k{k}-after-traffic.txt" for k in (2, 4, 8)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--upstreams", default="1,32")
    args = ap.parse_args()
    bodies = [p.read_bytes() for p in CAPTURES]
    srv, base = serve_bodies(bodies)
    local = threading.local()

    def bare_one(url: str) -> int:
        s = getattr(local, "s", None) or requests.Session()
        local.s = s
        text = s.get(url, timeout=5).content.decode("utf-8")
        return sum(len(f.samples) for f in text_string_to_metric_families(text))

    print(f"bodies: {', '.join(p.name for p in CAPTURES)} ({', '.join(str(len(b)) for b in bodies)} bytes)")
    print(f"{'upstreams':>9} | {'bare fetch+parse ms':>19} | {'exporter scrape ms':>18} | {'ratio':>5}")
    for n in [int(x) for x in args.upstreams.split(",")]:
        urls = [f"{base}/{i}/metrics" for i in range(n)]
        # min_fetch_interval=0: every scrape here fetches (no coalescing of back-to-back scrapes)
        cfg = build_config([f"u{i}={u}" for i, u in enumerate(urls)], ["1m", "5m"], "127.0.0.1:1",
                           min_fetch_interval=0.0)
        reg = CollectorRegistry(auto_describe=False)
        coll = SpecwatchCollector(cfg)
        reg.register(coll)
        pool = ThreadPoolExecutor(max_workers=min(32, n))
        bare, exp = [], []
        for r in range(args.rounds + 3):
            t0 = time.perf_counter()
            list(pool.map(bare_one, urls))
            t1 = time.perf_counter()
            out = generate_latest(reg)
            t2 = time.perf_counter()
            if r >= 3:  # warm-up rounds excluded
                bare.append(t1 - t0)
                exp.append(t2 - t1)
        assert b"specwatch_mean_acceptance_length" in out
        b, e = statistics.median(bare) * 1e3, statistics.median(exp) * 1e3
        print(f"{n:>9} | {b:>19.1f} | {e:>18.1f} | {e / b:>5.2f}")
        coll.close()
        pool.shutdown()
    srv.shutdown()


if __name__ == "__main__":
    main()
