"""Does the between-starts term make the paired intervals cover? (issue #37, `sweep --aa-starts`.)

The A/A checks of 2026-12-05 (docs/results/aa-2026-12-05: three rounds; aa-swap-2026-12-05: two more,
each with the roles swapped once) are 20 cells of two starts of the same server, true ratio 1; the
A/A starts aa-1 and aa-2 of the sweep in docs/results/sweep-aa-2026-12-05 (`--aa-starts 2`) are two
more rounds of 4 cells, each against the sweep's baseline. Hold
out one round (one pair of starts) at a time, estimate the between-starts spread from the other
rounds' cells with the estimator advise uses (:class:`specwatch.specdecode.decision.StartSpread`),
widen the held-out cells' paired intervals with it (:meth:`Candidate.with_start_spread`), and count
how often they hold 1, against the plain paired intervals.

    python docs/results/aa-2026-12-05/holdout.py
"""

from __future__ import annotations

from pathlib import Path

import analyse  # the A/A reader beside this file
from specwatch.choosek.model import paired_logs
from specwatch.choosek.resultfile import aa_measurements, load_sweep, measurements
from specwatch.specdecode.decision import Candidate, StartSpread, format_interval, ratio_from_logs

HERE = Path(__file__).resolve().parent
SWAP = HERE.parent / "aa-swap-2026-12-05"
SWEEP = HERE.parent / "sweep-aa-2026-12-05" / "paired.json"


def cells(path: Path, sign: float = 1.0) -> dict[tuple[str, int], list[float]]:
    """:func:`analyse.cells` of one bench result times ``sign`` (-1: the roles were swapped, so
    B/A is the inverse)."""
    return {key: [sign * x for x in logs] for key, logs in analyse.cells(path).items()}


def rounds() -> dict[str, list[tuple[str, list[float]]]]:
    """Round (one pair of server starts) → its cells (label, log ratios B/A)."""
    out: dict[str, list[tuple[str, list[float]]]] = {}
    for r in (1, 2, 3):
        for c in (1, 4):
            for (wl, cc), logs in cells(HERE / f"round{r}-c{c}.json").items():
                out.setdefault(f"aa round{r}", []).append((f"{wl} c={cc}", logs))
    for r in (1, 2):
        for swap, sign in ((0, 1.0), (1, -1.0)):
            for (wl, cc), logs in cells(SWAP / f"round{r}-swap{swap}.json", sign).items():
                out.setdefault(f"swap round{r}", []).append((f"{wl} c={cc} swap{swap}", logs))
    rec = load_sweep(SWEEP)
    base = {(m.workload, m.concurrency): m for m in measurements(rec) if m.k == 0}
    for m in aa_measurements(rec):
        logs = paired_logs(m, base[(m.workload, m.concurrency)])[0]
        out.setdefault(f"sweep {m.config}", []).append((f"{m.workload} c={m.concurrency}", logs))
    return out


def main() -> None:
    rs = rounds()
    plain = widened = total = 0
    for held, its in rs.items():
        others = [logs for r, cs in rs.items() if r != held for _, logs in cs]
        spread = StartSpread.from_cells(others, f"the A/A cells of the other rounds than {held}")
        print(f"{held}: spread from {spread.cells} other cells: {spread.percent_text()}")
        for label, logs in its:
            r = ratio_from_logs(logs)
            c = Candidate.from_ratio("B", 1, r, log_ratios=logs).with_start_spread(spread, "B")
            p, w = r.lower <= 1.0 <= r.upper, c.lower <= 1.0 <= c.upper
            plain, widened, total = plain + p, widened + w, total + 1
            print(f"  {label:28s} B/A {r.value:.3f}  paired {format_interval(r.lower, r.upper)} holds 1: {p!s:5s}  "
                  f"with the start term {format_interval(c.lower, c.upper)} holds 1: {w}")
    print(f"held-out cells whose interval holds 1: paired {plain} of {total}; with the start term {widened} of {total}")
    # as `--aa-starts 2` gives it: the spread from two rounds only (8 cells), every other cell held out
    names = sorted(rs)
    held = cover = 0
    zero = 0
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            spread = StartSpread.from_cells([logs for r in (a, b) for _, logs in rs[r]], f"{a} and {b}")
            zero += spread.log_sd == 0.0
            for r in names:
                if r in (a, b):
                    continue
                for _, logs in rs[r]:
                    c = Candidate.from_ratio("B", 1, ratio_from_logs(logs), log_ratios=logs).with_start_spread(spread, "B")
                    held, cover = held + 1, cover + (c.lower <= 1.0 <= c.upper)
    pairs = len(names) * (len(names) - 1) // 2
    print(f"the spread from two rounds only (8 cells, as --aa-starts 2 measures it), over all {pairs} pairs of rounds: "
          f"the other cells' intervals hold 1 in {cover} of {held} ({cover / held * 100:.0f} %); "
          f"{zero} of the {pairs} pairs estimated no spread at all")


if __name__ == "__main__":
    main()
