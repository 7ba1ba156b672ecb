"""A/A check of the paired rounds (issue #37): per cell, the paired ratio of two starts of the same
server (B over A, per-batch output throughput, the sweep's estimator:
:func:`specwatch.specdecode.decision.ratio_from_logs`) and whether its 95 % interval covers the
true ratio 1; then the spread of the cells' mean log ratios beyond what their own intervals allow
(the excess variance: mean of m² − mean of se², the true log ratio being 0).

    python docs/results/aa-2026-12-05/analyse.py
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from specwatch.specdecode.decision import format_interval, ratio_from_logs

HERE = Path(__file__).resolve().parent


def cells(path: Path) -> dict[tuple[str, int], list[float]]:
    """Per (workload, concurrency) of one bench result: the per-pair log ratios B / A."""
    doc = json.loads(path.read_text())
    by: dict[tuple[str, int], dict[str, dict[int, float]]] = {}
    for b in doc["batches"]:
        if not b.get("warmup"):
            by.setdefault((b["workload"], b["max_concurrency"]), {}).setdefault(b["role"], {})[b["batch_index"]] = (
                b["output_throughput"])
    out = {}
    for key, roles in sorted(by.items()):
        idx = sorted(set(roles["speculative"]) & set(roles["baseline"]))
        out[key] = [math.log(roles["speculative"][i] / roles["baseline"][i]) for i in idx]
    return out


def main() -> None:
    means, se2, covered, total = [], [], 0, 0
    for path in sorted(HERE.glob("round*-c*.json")):
        for (wl, c), logs in cells(path).items():
            r = ratio_from_logs(logs)
            covers = r.lower <= 1.0 <= r.upper
            covered += covers
            total += 1
            means.append(statistics.fmean(logs))
            se2.append(statistics.variance(logs) / len(logs))
            pairs = " ".join(f"{math.exp(x):.3f}" for x in logs)
            print(f"{path.stem[:6]} {wl:13s} c={c}  B/A {r.value:.3f} {format_interval(r.lower, r.upper)}  "
                  f"covers 1: {covers}  per pair {pairs}")
    ms2 = statistics.fmean(m * m for m in means)
    excess = ms2 - statistics.fmean(se2)
    print(f"cells whose paired 95 % interval covers 1: {covered} of {total}")
    print(f"mean log ratio per cell: rms {math.sqrt(ms2):.4f}; mean within-cell se^2 {statistics.fmean(se2):.6f}; "
          f"excess variance {excess:.6f} -> sd {math.sqrt(max(0.0, excess)):.4f}")


if __name__ == "__main__":
    main()
