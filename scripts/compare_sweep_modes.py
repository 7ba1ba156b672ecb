#!/usr/bin/env python3
"""Paired against sequential: the same cells measured both ways, side by side (issue #37).

    python scripts/compare_sweep_modes.py PAIRED.json SEQUENTIAL.json [--target 0.05] [--cap 8] [--json OUT]

Both files are ``specwatch sweep`` results of the same configurations, workloads and
concurrencies: one measured paired (the default: the baseline server up beside each speculative
one, alternating rounds), one with ``--sequential`` (one server after the other). For every
speculative cell the script computes, with the same estimator on both files (the paired log
ratios of batch i of the configuration and of the baseline, which served the same seeded prompts:
:func:`specwatch.choosek.model.paired_logs`, :func:`specwatch.specdecode.decision.ratio_from_logs`):

- the ratio over the baseline and its 95 % interval, and the interval's log half-width
  h = t(n−1) · sd(log r) / √n (printed as ±%);
- the width ratio paired / sequential at the same number of batches (the issue's bar: at most 0.5
  in at least 6 of 8 cells);
- the batches each mode would need for ±``target`` at the spread it measured (the smallest n with
  t(n−1) · sd / √n ≤ log(1 + target), capped at ``cap``: "> cap");
- the wall time per cell: paired, from the first to the last batch of the cell on either server;
  sequential, the configuration's cell plus the baseline's cell at the same (workload,
  concurrency), each measured alone (server start-ups excluded in both).

This is a benchmark in the project's sense: a ratio measured side by side in one run, never a
timed test. Exit 0; 2 for unreadable input.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import statistics
import sys
from pathlib import Path

from specwatch.choosek.model import paired_logs
from specwatch.choosek.records import SweepCell
from specwatch.choosek.resultfile import SweepError, load_sweep, measurements
from specwatch.specdecode.decision import format_interval, format_ratio, ratio_from_logs, t975


def batches_needed(sd: float | None, target: float, cap: int) -> int | None:
    """The smallest n ≥ 2 with t(n−1) · sd / √n ≤ log(1 + target); None beyond ``cap`` or
    without a spread (one batch)."""
    if sd is None:
        return None
    goal = math.log1p(target)
    for n in range(2, cap + 1):
        if t975(n - 1) * sd / math.sqrt(n) <= goal:
            return n
    return None


def _ts(s: str | None) -> float | None:
    if not s:
        return None
    return dt.datetime.fromisoformat(s).timestamp()


def cell_wall(cells: list[SweepCell]) -> float | None:
    """Seconds from the first batch's start to the last batch's end over ``cells``' batches (both
    roles of a paired cell: its own and ``baseline_batches``), warm-ups included; None without
    timestamps."""
    spans = []
    for cell in cells:
        for b in (*(cell.batches or ()), *(cell.baseline_batches or ())):
            t0 = _ts(b.started_at)
            if t0 is not None and b.duration is not None:
                spans.append((t0, t0 + float(b.duration)))
    if not spans:
        return None
    return max(e for _, e in spans) - min(s for s, _ in spans)


def analyse(path: Path, target: float, cap: int) -> dict[tuple[str, str, int], dict]:
    """Per speculative (configuration, workload, concurrency): ratio, interval, h, batches, the
    batches needed for ±target, and the wall time of the cell (see the module doc)."""
    rec = load_sweep(path)
    ms = measurements(rec)
    base = {(m.workload, m.concurrency): m for m in ms if m.k == 0}
    cells = {c.key: c for c in rec.cells}
    out = {}
    for m in ms:
        if m.k == 0 or (m.workload, m.concurrency) not in base:
            continue
        logs, unpaired = paired_logs(m, base[(m.workload, m.concurrency)])
        if not logs:
            continue
        r = ratio_from_logs(logs)
        h = None if r.log_sd is None else t975(r.n - 1) * r.log_sd / math.sqrt(r.n)
        own = cells[(m.config, m.workload, m.concurrency)]
        parts = [cell_wall([own])] if own.paired else [cell_wall([own]), cell_wall([cells[("baseline", m.workload, m.concurrency)]])]
        wall = None if any(x is None for x in parts) else sum(parts)
        out[(m.config, m.workload, m.concurrency)] = {
            "ratio": r.value, "lower": r.lower, "upper": r.upper, "n": r.n, "log_sd": r.log_sd, "h": h, "logs": list(logs),
            "unpaired_batches": unpaired, "needed": batches_needed(r.log_sd, target, cap),
            "wall_s": wall, "mode": "paired" if own.paired else "sequential"}
    return out


def regularized_beta(x: float, a: float, b: float, steps: int = 2000) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b ≥ 0.5 and 0 ≤ x ≤ 1: Simpson's
    rule on t = sin²θ, where the integrand 2 sin^(2a−1)θ cos^(2b−1)θ / B(a, b) has no singularity."""
    if not (a >= 0.5 and b >= 0.5):
        raise ValueError(f"a and b must be >= 0.5, got {a}, {b}")
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    top = math.asin(math.sqrt(x))
    log_beta = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)

    def f(th: float) -> float:
        return 2.0 * math.sin(th) ** (2 * a - 1) * math.cos(th) ** (2 * b - 1)

    n = steps + steps % 2
    h = top / n
    total = f(0.0) + f(top) + sum((4 if i % 2 else 2) * f(i * h) for i in range(1, n))
    return min(1.0, total * h / 3.0 / math.exp(log_beta))


def f_cdf(x: float, d1: int, d2: int) -> float:
    """P(F ≤ x) for F ~ F(d1, d2) (d1, d2 ≥ 1): I_{d1·x/(d1·x + d2)}(d1/2, d2/2)."""
    if x <= 0:
        return 0.0
    return regularized_beta(d1 * x / (d1 * x + d2), d1 / 2, d2 / 2)


def expected_half_as_wide(width_ratio: float, rows_p: list[dict], rows_s: list[dict], bar: float = 0.5) -> float:
    """The number of cells expected at a width ratio ≤ ``bar`` if every cell's true ratio were
    ``width_ratio`` (the pooled one): Σ P(F(n_p − 1, n_s − 1) ≤ (bar / width_ratio)²), a cell's
    width ratio being width_ratio · √F with F the ratio of its two sample variances over their
    true values (and of the t quantiles, equal at equal batches)."""
    total = 0.0
    for x, y in zip(rows_p, rows_s, strict=True):
        if x["n"] >= 2 and y["n"] >= 2:
            total += f_cdf((bar / width_ratio) ** 2, x["n"] - 1, y["n"] - 1)
    return total


def pooled_variance(rows: list[dict]) -> tuple[float, int] | None:
    """(pooled variance of the per-batch log ratio, its degrees of freedom) over cells:
    Σ (n−1) sd² / Σ (n−1). None without a cell of two batches."""
    num = den = 0
    for x in rows:
        if x["log_sd"] is not None and x["n"] >= 2:
            num += (x["n"] - 1) * x["log_sd"] ** 2
            den += x["n"] - 1
    return (num / den, den) if den else None


def order_effect(rows: list[dict]) -> tuple[float, float, int] | None:
    """Paired rounds (ABBA): per cell, the mean log ratio of the pairs run speculative-first (2, 4,
    …) minus that of the baseline-first pairs (1, 3, …); returns (mean over cells, its t
    statistic, cells). A server that sat idle during the other's batch and runs slower right
    after shows as a non-zero mean; None with fewer than two cells of at least two pairs."""
    d = []
    for x in rows:
        logs = x["logs"]
        odd, even = logs[0::2], logs[1::2]
        if odd and even:
            d.append(statistics.fmean(even) - statistics.fmean(odd))
    if len(d) < 2:
        return None
    sd = statistics.stdev(d)
    return statistics.fmean(d), (statistics.fmean(d) / (sd / math.sqrt(len(d))) if sd > 0 else math.inf), len(d)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paired", type=Path)
    ap.add_argument("sequential", type=Path)
    ap.add_argument("--target", type=float, default=0.05, help="relative half width to reach (0.05: ±5 %%)")
    ap.add_argument("--cap", type=int, default=8, help="most batches considered for --target")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    a = ap.parse_args(argv)
    if not (math.isfinite(a.target) and 0 < a.target < 1) or a.cap < 2:
        ap.error("--target must be in (0, 1) and --cap >= 2")
    try:
        p, s = analyse(a.paired, a.target, a.cap), analyse(a.sequential, a.target, a.cap)
    except SweepError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    keys = sorted(set(p) & set(s), key=lambda k: (k[0], k[1], k[2]))
    if not keys:
        print("error: the two files share no speculative cell", file=sys.stderr)
        return 2

    def pct(h: float | None) -> str:
        return "–" if h is None else f"±{math.expm1(h) * 100:.1f} %"

    def need(n: int | None) -> str:
        return f"> {a.cap}" if n is None else str(n)

    def secs(v: float | None) -> str:
        return "–" if not v else f"{v:.0f}"

    head = ("| configuration | workload | c | paired ratio [95 %] | sequential ratio [95 %] | paired h | sequential h "
            f"| width paired / sequential | batches for ±{a.target * 100:g} % (paired / sequential) "
            "| wall per cell s (paired / sequential) |")
    print(head)
    print("|" + "|".join("---" for _ in range(head.count("|") - 1)) + "|")
    halves, rows, walls = 0, [], []
    for k in keys:
        x, y = p[k], s[k]
        w = None if x["h"] is None or y["h"] is None or y["h"] == 0 else x["h"] / y["h"]
        halves += w is not None and w <= 0.5
        if x["wall_s"] and y["wall_s"]:
            walls.append(x["wall_s"] / y["wall_s"])
        rows.append({"cell": list(k), "paired": x, "sequential": y, "width_ratio": w})
        print(f"| {k[0]} | {k[1]} | {k[2]} | {format_ratio(x['ratio'])}× {format_interval(x['lower'], x['upper'])} "
              f"| {format_ratio(y['ratio'])}× {format_interval(y['lower'], y['upper'])} | {pct(x['h'])} | {pct(y['h'])} "
              f"| {'–' if w is None else f'{w:.2f}'} | {need(x['needed'])} / {need(y['needed'])} "
              f"| {secs(x['wall_s'])} / {secs(y['wall_s'])} |")
    print()
    print(f"paired interval at most half as wide as the sequential one (same batches): {halves} of {len(keys)} cells")
    if walls:
        print(f"wall time per cell, paired / sequential: median {statistics.median(walls):.2f} "
              f"(min {min(walls):.2f}, max {max(walls):.2f}); both modes run every batch on both servers, so the "
              "difference is the switching between the two servers within a cell (paired) against two cells "
              "measured apart (sequential), server start-ups excluded")
    vp, vs = pooled_variance([p[k] for k in keys]), pooled_variance([s[k] for k in keys])
    pooled = None
    if vp and vs and vs[0] > 0:
        rp, rs = [p[k] for k in keys], [s[k] for k in keys]
        pooled = {"paired_variance": vp[0], "sequential_variance": vs[0], "df": [vp[1], vs[1]],
                  "width_ratio": math.sqrt(vp[0] / vs[0])}
        pooled["expected_half_as_wide"] = (expected_half_as_wide(pooled["width_ratio"], rp, rs) if vp[0] > 0
                                           else float(len(keys)))
        print(f"pooled over the {len(keys)} cells, the per-batch log ratio's variance: paired {vp[0]:.4f}, sequential "
              f"{vs[0]:.4f} ({vp[1]} and {vs[1]} degrees of freedom): at the same batches the paired interval is "
              f"{pooled['width_ratio']:.2f} × the sequential one's width (one cell's width, from {keys and p[keys[0]]['n']} "
              "batches, scatters around this by a factor of F(n−1, n−1))")
        lo, hi = 1e-3, 1.0  # the pooled ratio at which 3 cells in 4 are expected at most half as wide
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if expected_half_as_wide(mid, rp, rs) > 0.75 * len(keys) else (lo, mid)
        pooled["ratio_for_three_in_four"] = lo
        print(f"expected at that pooled width ratio: {pooled['expected_half_as_wide']:.1f} of {len(keys)} cells at "
              "most half as wide (a cell's width ratio is the pooled one × √F(n_p−1, n_s−1)); 3 cells in 4 are "
              f"expected at a pooled width ratio of {lo:.2f}")
    oe = order_effect([p[k] for k in keys])
    if oe is not None:
        print(f"paired order effect: log ratio of the speculative-first pairs minus the baseline-first ones, mean "
              f"{oe[0]:+.3f} over {oe[2]} cells (t = {oe[1]:.1f})")
    if a.json:
        a.json.write_text(json.dumps({"target": a.target, "cap": a.cap, "rows": rows,
                                      "half_as_wide": halves, "cells": len(keys), "pooled": pooled,
                                      "order_effect": None if oe is None else {"mean": oe[0], "t": oe[1], "cells": oe[2]}},
                                     indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
