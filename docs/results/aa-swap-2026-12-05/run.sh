#!/usr/bin/env bash
# A/A check with the roles swapped (issue #37): as docs/results/aa-2026-12-05/run.sh, at c = 1
# only, each round measuring the same two server starts twice: B in the speculative role, then A.
# A ratio that follows the role (the schedule) flips from B/A to A/B; one that follows the server
# start stays with the server.
set -u
cd /work/main
out=${1:-docs/results/aa-swap-2026-12-05}
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
for round in 1 2; do
  serve 18201 $out/round$round-a.log
  wait_up 18201 || { echo "round $round: A did not start" >> $out/times.txt; exit 1; }
  serve 18202 $out/round$round-b.log
  wait_up 18202 || { echo "round $round: B did not start" >> $out/times.txt; exit 1; }
  echo "round $round start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
  for swap in 0 1; do  # 0: B speculative, A baseline; 1: A speculative, B baseline
    if [ $swap = 0 ]; then spec=18202; base=18201; else spec=18201; base=18202; fi
    .venv/bin/specwatch bench --base-url http://127.0.0.1:$spec --baseline-url http://127.0.0.1:$base --paired \
      --dataset-name copy,random-output --max-concurrency 1 --num-prompts 2 --num-batches 4 \
      --warmup-batches 1 --output-len 64 --no-equivalence --no-progress --result-dir $out \
      --result-filename round$round-swap$swap.json > $out/round$round-swap$swap.out 2>&1
    echo "round $round swap $swap end $(date -u +%FT%TZ) rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
  done
  for p in "${pids[@]}"; do kill -- -"$p" 2>/dev/null; done
  for p in "${pids[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 1; done; done
  pids=()
done
echo done >> $out/times.txt
