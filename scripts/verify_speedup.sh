#!/usr/bin/env bash
# Issue #12's check, end to end: calibrate a cost profile from a fresh sweep on THIS machine, then
# at once compare the exporter's live measured speedup with measured throughput ratios
# (scripts/verify_speedup.py). Calibrating right before verifying matters: on a shared machine the
# speed drifts by 10-20 % within an hour, and a profile's plain step time is only as current as its
# sweep (specwatch_cost_profile_error_ratio shows that drift live).
#
#   bash scripts/verify_speedup.sh [OUT_DIR] [verify_speedup.py options...]
#        (default OUT_DIR results/verify-YYYYmmdd-HHMMSS; e.g. --baseline-upstream, --load-hog 2)
#
# Default: the embedded vLLM (CPU), baseline + ngram k=4 + draft_model (draft = target) k=3.
# Any vLLM (a GPU host): SERVER_COMMAND='vllm serve MODEL --port {port} {spec_args}' (the
# sweep's --server-command template) and SPEC_CONFIG (one --speculative-config JSON, default
# ngram k=4) are used by the calibration sweep and by the check alike.
#
# Writes OUT_DIR/calibration-sweep.json, OUT_DIR/profile.yaml, OUT_DIR/verify.json and the logs.
# About 30 minutes on 2 cores. Run again with the same OUT_DIR: an existing profile.yaml is kept
# (the sweep and calibration are skipped), an unfinished sweep resumes. OTHER_PROFILE: the
# "another machine's" profile whose drift is recorded beside (default: the shipped CPU profile).
# PROFILE=FILE: verify that profile (copied to OUT_DIR/profile.yaml; no sweep), e.g. issue 22's
# loaded check of the shipped one:
#   PROFILE=exporter/specwatch/data/cost-profiles/cpu-2core-smollm2-135m-vllm0.32.yaml \
#     bash scripts/verify_speedup.sh results/verify-loaded --baseline-upstream --load-hog 1
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SPECWATCH_VENV:-$here/.venv}"
out="$here/results/verify-$(date -u +%Y%m%d-%H%M%S)"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then out="$1"; shift; fi
mkdir -p "$out"
ngram='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}'
if [ -n "${SERVER_COMMAND:-}" ]; then
  spec_flags=(--speculative-config "${SPEC_CONFIG:-$ngram}")
  server_flags=(--server-command "$SERVER_COMMAND")
  verify_flags=("${server_flags[@]}" "${spec_flags[@]}")
  what="the --server-command server: baseline and ${SPEC_CONFIG:-ngram k=4}"
else
  model_dir="$("$venv/bin/python" -c 'from specwatch.localvllm.model import default_model_dir, prepare_model; d = default_model_dir(); prepare_model(d); print(d)')"
  spec_flags=(--speculative-config "$ngram"
              --speculative-config "{\"method\": \"draft_model\", \"model\": \"$model_dir\", \"num_speculative_tokens\": 3}")
  server_flags=()
  verify_flags=()
  what="embedded vLLM: baseline, ngram k=4, draft_model (draft = target) k=3"
fi

if [ -n "${PROFILE:-}" ]; then
  # check a given profile (e.g. the shipped one) instead of calibrating one here
  [ -s "$PROFILE" ] || { echo "verify_speedup.sh: PROFILE=$PROFILE: no such file" >&2; exit 2; }
  cp "$PROFILE" "$out/profile.yaml"
fi
if [ -s "$out/profile.yaml" ]; then
  echo "[verify] $out/profile.yaml exists (calibrated $(grep -m1 measured_at "$out/profile.yaml" | cut -d"'" -f2)): skipping the sweep; remove it to recalibrate" >&2
else
echo "[verify] 1/3 calibration sweep on $what; copy and random-output; concurrency 1,2,4" >&2
"$venv/bin/specwatch" sweep --result-file "$out/calibration-sweep.json" "${server_flags[@]}" "${spec_flags[@]}" \
  --workloads copy,random-output --concurrency 1,2,4 --output-len 128 --prompts-per-concurrency 2 \
  --num-batches 2 --max-batches 2 --warmup-batches 1 --no-progress 2>&1 | tee "$out/sweep.log"

echo "[verify] 2/3 calibrate" >&2
"$venv/bin/specwatch" calibrate --from-sweep "$out/calibration-sweep.json" -o "$out/profile.yaml" 2>&1 | tee "$out/calibrate.log"
fi

echo "[verify] 3/3 live speedup against measured throughput ratios" >&2
# and the drift metric under another machine's profile: the shipped CPU profile (another 2-core VM)
other="${OTHER_PROFILE:-$here/exporter/specwatch/data/cost-profiles/cpu-2core-smollm2-135m-vllm0.32.yaml}"
"$venv/bin/python" "$here/scripts/verify_speedup.py" --cost-profile "$out/profile.yaml" --other-profile "$other" \
  "${verify_flags[@]}" --out "$out/verify.json" "$@" 2>&1 | tee "$out/verify.log"
