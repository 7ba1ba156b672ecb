#!/usr/bin/env bash
# A/A check of the paired rounds (issue #37): two starts of the SAME server (the embedded vLLM,
# no speculation), measured against each other with `specwatch bench --paired` (ABBA rounds,
# settle batches, the same cells and batch counts as the sweep comparisons), beside the steady hog
# of runs 5-6. The true ratio is 1: how often does a paired 95 % interval leave it out?
# Three rounds, each with two fresh server starts.
set -u
cd /work/main
out=${1:-docs/results/aa-2026-12-05}
model=$(.venv/bin/python -c "from specwatch.localvllm.model import default_model_dir; print(default_model_dir())" 2>/dev/null || echo /root/.cache/specwatch/models/SmolLM2-135M-Instruct)
export VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1
yes > /dev/null &
hog=$!
pids=()
cleanup() { kill "$hog" 2>/dev/null; for p in "${pids[@]}"; do kill -- -"$p" 2>/dev/null; done; }
trap cleanup EXIT
serve() {  # port log: one server in its own process group
  setsid .venv/bin/python -m vllm.entrypoints.openai.api_server --model "$model" --served-model-name smollm2 \
    --port "$1" --host 127.0.0.1 --enforce-eager --max-model-len 2048 --max-num-seqs 16 --dtype bfloat16 \
    --disable-uvicorn-access-log > "$2" 2>&1 &
  pids+=($!)
}
wait_up() { for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$1/v1/models" > /dev/null && return 0; sleep 2; done; return 1; }
echo "hog pid $hog; commit $(git rev-parse --short HEAD); model $model" >> $out/times.txt
for round in 1 2 3; do
  serve 18201 $out/round$round-a.log
  wait_up 18201 || { echo "round $round: A did not start" >> $out/times.txt; exit 1; }
  serve 18202 $out/round$round-b.log
  wait_up 18202 || { echo "round $round: B did not start" >> $out/times.txt; exit 1; }
  echo "round $round start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
  for c in 1 4; do  # 2 x concurrency prompts per batch, as the sweep
    .venv/bin/specwatch bench --base-url http://127.0.0.1:18202 --baseline-url http://127.0.0.1:18201 --paired \
      --dataset-name copy,random-output --max-concurrency $c --num-prompts $((2 * c)) --num-batches 4 \
      --warmup-batches 1 --output-len 64 --no-equivalence --no-progress --result-dir $out \
      --result-filename round$round-c$c.json > $out/round$round-c$c.out 2>&1
    echo "round $round c $c end $(date -u +%FT%TZ) rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
  done
  for p in "${pids[@]}"; do kill -- -"$p" 2>/dev/null; done
  for p in "${pids[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 1; done; done
  pids=()
done
echo done >> $out/times.txt
