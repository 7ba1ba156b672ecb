#!/usr/bin/env bash
# Accuracy benchmark of `specwatch advise` on the real (embedded, CPU) vLLM.
#
# 1. `specwatch sweep` on the embedded vLLM: baseline + ngram k = 1,2,3,4,6,8; workloads copy
#    random-output, word-chain and explain; concurrency 1 and 4, 64-token outputs (resumable:
#    rerun to continue an interrupted sweep).
# 2. `specwatch advise` on the result (defaults: measured k only, scored by measured throughput),
#    and, for information, `--basis model` (every k scored by the model's prediction alone).
# 3. Prints, for every workload x concurrency cell, the measured throughput at the k the advisor
#    picked against the best measured configuration (target: within 3 %), the same for the
#    model-only picks, and the acceptance-length prediction error (E(k) from the largest k's per-position curve vs the
#    measured mean acceptance length at each smaller k). Exit status 1 if a cell of the default
#    advice misses the 3 % target.
#
# Takes ~15-30 minutes on 2 CPU cores (7 server starts of ~25-40 s, 56 cells). Holds
# flock /tmp/specwatch-vllm.lock while each server runs (the embedded server does).
# Environment: OUT (result directory, default bench-results/sweep-accuracy), PY (python),
# KS, WORKLOADS, CONCURRENCY, OUTPUT_LEN, NUM_BATCHES to change the sweep.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-bench-results/sweep-accuracy}
KS=${KS:-1,2,3,4,6,8}
WORKLOADS=${WORKLOADS:-copy,random-output,word-chain,explain}
CONCURRENCY=${CONCURRENCY:-1,4}
OUTPUT_LEN=${OUTPUT_LEN:-64}
NUM_BATCHES=${NUM_BATCHES:-2}
mkdir -p "$OUT"
"$PY" -m specwatch sweep --result-file "$OUT/sweep.json" --k "$KS" --workloads "$WORKLOADS" \
  --concurrency "$CONCURRENCY" --output-len "$OUTPUT_LEN" --num-batches "$NUM_BATCHES" --no-progress
"$PY" -m specwatch advise "$OUT/sweep.json" --candidates measured --json "$OUT/advice.json"
"$PY" -m specwatch advise "$OUT/sweep.json" --candidates measured --basis model --json "$OUT/advice-model.json" \
  > "$OUT/advice-model.txt"
# held-out variant (information only): step cost fitted on the smallest and largest k alone
"$PY" -m specwatch advise "$OUT/sweep.json" --candidates measured --fit-k "${KS%%,*},${KS##*,}" \
  --json "$OUT/advice-heldout.json" > "$OUT/advice-heldout.txt"
"$PY" -m specwatch report "$OUT/sweep.json" --output "$OUT/report.html"
"$PY" - "$OUT/advice.json" "$OUT/advice-heldout.json" "$OUT/advice-model.json" <<'PYEOF'
import json, sys
held = json.load(open(sys.argv[2]))
hs = [a["shortfall"] or 0.0 for fam in held["families"] for a in fam["accuracy"]]
ht = [fam["throughput_error"] for fam in held["families"]]
adv = json.load(open(sys.argv[1]))
model = json.load(open(sys.argv[3]))
model_picks = {(a["workload"], a["concurrency"]): a for fam in model["families"] for a in fam["accuracy"]}
worst = 0.0
print("\naccuracy of the advisor (measured throughput at the picked k vs the best measured k):")
print(f"{'workload':<14}{'c':>3}{'picked k':>9}{'best k':>7}{'picked tok/s':>13}{'best tok/s':>11}{'shortfall':>10}"
      f"{'model-only k':>13}{'its shortfall':>14}")
for fam in adv["families"]:
    for a in fam["accuracy"]:
        s = a["shortfall"] if a["shortfall"] is not None else 0.0  # None: a what-if pick, not measured
        worst = max(worst, s)
        m = model_picks.get((a["workload"], a["concurrency"]))
        print(f"{a['workload']:<14}{a['concurrency']:>3}{a['picked_k']:>9}{a['best_k']:>7}"
              f"{a['picked_throughput']:>13.1f}{a['best_throughput']:>11.1f}{s * 100:>9.1f}%"
              + ("" if m is None else f"{m['picked_k']:>13}{(m['shortfall'] or 0.0) * 100:>13.1f}%"))
    t = fam["throughput_error"]
    for e, what in ((fam["acceptance_error"], "all runs at k < largest k"),
                    (fam["acceptance_error_min_100_drafts"], "runs with >= 100 drafts")):
        if e["n"]:
            print(f"acceptance-length prediction error, {what} ({e['n']}): mean |rel| {e['mean_abs_relative'] * 100:.1f} %, "
                  f"max {e['max_abs_relative'] * 100:.1f} %")
    if t["n"]:
        print(f"throughput prediction error over {t['n']} runs: mean |rel| {t['mean_abs_relative'] * 100:.1f} %, "
              f"max {t['max_abs_relative'] * 100:.1f} %")
print(f"held-out (step cost fitted on k = {held['fit_k']} only): worst shortfall {max(hs) * 100:.1f} % over {len(hs)} cells, "
      + ", ".join(f"throughput prediction error mean |rel| {t['mean_abs_relative'] * 100:.1f} % max {t['max_abs_relative'] * 100:.1f} %"
                  for t in ht if t["n"]))
ms = [a["shortfall"] or 0.0 for a in model_picks.values()]
if ms:
    print(f"model-only picks (--basis model): worst shortfall {max(ms) * 100:.1f} %, within 3 % in "
          f"{sum(1 for x in ms if x <= 0.03)}/{len(ms)} cells")
print(f"worst shortfall: {worst * 100:.1f} % (target <= 3 %): {'PASS' if worst <= 0.03 else 'FAIL'}")
sys.exit(0 if worst <= 0.03 else 1)
PYEOF
