#!/usr/bin/env bash
# The published draft-model study (docs/load-generator.md, "The published measurements these
# workloads reproduce"), shortened for the embedded default (vLLM CPU, SmolLM2-135M, 2 cores):
# baseline + method draft_model with two drafters derived from the target (close: noise sigma
# 0.10, far: sigma 0.17; `specwatch prepare-model --drafter`), k = 1..4, max concurrency 1, 2, 4,
# 8; then advise (drafter and k per concurrency), the HTML report (the document's charts per
# drafter) and the document's tables in markdown.
#
# The document: Qwen3-32B target with Qwen3-0.6B / 1.7B drafters on an A100, 1000 ShareGPT prompts,
# concurrency 1-64, k 1-5. Here: the `explain` chat workload (our own prompt; no dataset is
# downloaded), OUTPUT_LEN-token outputs (default 48), 2 x concurrency prompts per batch, 1 warm-up +
# NUM_BATCHES measured batches, concurrency up to 8. The drafters are same-size models (135M, like
# the target), NOT distilled small models: every drafted token costs a full forward.
#
# Takes about 20 minutes on 2 idle cores (9 server starts; the recorded run in docs/drafter-study.md
# took 18 minutes), longer when the vLLM lock is shared. Two passes over one result file: first k in
# KS_FIRST (default 3: baseline and both drafters at k = 3, the document's table, early), then every k
# of KS (finished cells are skipped). Resumable: rerun with the same OUT to continue.
# Holds flock /tmp/specwatch-vllm.lock while each server runs. Environment: OUT, PY, KS,
# CONCURRENCY, OUTPUT_LEN, NUM_BATCHES, WORKLOADS, DRAFTERS (space-separated).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-bench-results/drafter-study}
KS=${KS:-1,2,3,4}
KS_FIRST=${KS_FIRST-3}
CONCURRENCY=${CONCURRENCY:-1,2,4,8}
OUTPUT_LEN=${OUTPUT_LEN:-48}
NUM_BATCHES=${NUM_BATCHES:-2}
WORKLOADS=${WORKLOADS:-explain}
DRAFTERS=${DRAFTERS:-close far}
mkdir -p "$OUT"
echo "drafter study (shortened for 2 CPU cores): drafters ${DRAFTERS}; k ${KS}; concurrency ${CONCURRENCY};" \
     "workload ${WORKLOADS}; ${OUTPUT_LEN}-token outputs; ${NUM_BATCHES} measured batches of 2 x concurrency prompts." \
     "The document ran 1000 ShareGPT prompts at concurrency 1-64, k 1-5, on an A100 with 0.6B/1.7B drafters."
dflags=()
for d in $DRAFTERS; do dflags+=(--drafter "$d"); done
"$PY" -m specwatch prepare-model "${dflags[@]}"
for ks in $KS_FIRST $KS; do
  "$PY" -m specwatch sweep --result-file "$OUT/sweep.json" --k "$ks" "${dflags[@]}" --workloads "$WORKLOADS" \
    --concurrency "$CONCURRENCY" --output-len "$OUTPUT_LEN" --num-batches "$NUM_BATCHES" --no-progress
done
"$PY" -m specwatch advise "$OUT/sweep.json" --json "$OUT/advice.json" | tee "$OUT/advice.txt"
"$PY" -m specwatch report "$OUT/sweep.json" --output "$OUT/report.html"
"$PY" -m specwatch.choosek.drafterstudy "$OUT/sweep.json" | tee "$OUT/table.md"
echo "results: $OUT/sweep.json, $OUT/advice.txt, $OUT/report.html, $OUT/table.md"
