"""The sweep's advice with and without its between-starts term (issue #37): per row, the pick, its
interval over the baseline and its confidence against the runner-up, from the same file read twice
(once without its A/A starts). Then the A/A cells themselves.

    python docs/results/sweep-aa-2026-12-05/compare.py
"""

from __future__ import annotations

from pathlib import Path

from specwatch.choosek.advise import advise_sweep, speedup_text
from specwatch.choosek.model import paired_logs
from specwatch.choosek.resultfile import aa_measurements, load_sweep, measurements, start_spread
from specwatch.specdecode.decision import format_interval, ratio_from_logs

HERE = Path(__file__).resolve().parent


def main() -> None:
    rec = load_sweep(HERE / "paired.json")
    base = {(m.workload, m.concurrency): m for m in measurements(rec) if m.k == 0}
    print("A/A cells (true ratio 1):")
    for m in sorted(aa_measurements(rec), key=lambda m: (m.config, m.workload, m.concurrency)):
        r = ratio_from_logs(paired_logs(m, base[(m.workload, m.concurrency)])[0])
        print(f"  {m.config} {m.workload:13s} c={m.concurrency}: {r.value:.3f} {format_interval(r.lower, r.upper)}"
              f"  holds 1: {r.lower <= 1.0 <= r.upper}")
    spread = start_spread(rec, "paired.json")
    print(f"spread: {spread.percent_text()}")
    print()
    print("| workload | c | pick | without the term | confidence | with the term | confidence |")
    print("|---|---|---|---|---|---|---|")
    with_term = advise_sweep(rec, source="paired.json")[0].recommendations
    without = advise_sweep(rec.without_aa())[0].recommendations
    for a, b in zip(with_term, without, strict=True):
        assert a.config == b.config
        wl = "all workloads" if a.workload == "*" else a.workload
        ca = a.pick.confidence_text() if a.pick else "–"
        cb = b.pick.confidence_text() if b.pick else "–"
        print(f"| {wl} | {a.concurrency} | {a.config} | {speedup_text(b)} | {cb} | {speedup_text(a)} | {ca} |")


if __name__ == "__main__":
    main()
