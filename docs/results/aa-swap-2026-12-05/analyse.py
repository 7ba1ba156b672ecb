"""A/A with the roles swapped (issue #37): per round and workload, the paired ratio with B in the
speculative role (swap 0) and with A in it (swap 1), both written as B / A. A ratio that follows
the server start is the same in both; one that follows the role (the schedule) is inverted.

    python docs/results/aa-swap-2026-12-05/analyse.py
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from specwatch.specdecode.decision import format_interval, ratio_from_logs

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("aa", HERE.parent / "aa-2026-12-05" / "analyse.py")
aa = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(aa)


def main() -> None:
    for path in sorted(HERE.glob("round*-swap0.json")):
        other = path.with_name(path.name.replace("swap0", "swap1"))
        if not other.exists():
            continue
        first, second = aa.cells(path), aa.cells(other)
        for key in first:
            b_over_a = ratio_from_logs(first[key])  # B speculative: spec / baseline = B / A
            flipped = ratio_from_logs([-x for x in second[key]])  # A speculative: invert to B / A
            role = math.exp((sum(first[key]) / len(first[key]) + sum(second[key]) / len(second[key])) / 2)
            print(f"{path.stem[:6]} {key[0]:13s} c={key[1]}  B/A with B speculative {b_over_a.value:.3f} "
                  f"{format_interval(b_over_a.lower, b_over_a.upper)}; with A speculative {flipped.value:.3f} "
                  f"{format_interval(flipped.lower, flipped.upper)}; speculative role / baseline role "
                  f"(geometric mean of both) {role:.3f}")


if __name__ == "__main__":
    main()
