#!/usr/bin/env bash
# Does a CPU neighbour move the embedded vLLM's speed on this VM? (issue #37, after runs 7 and 8.)
# One embedded vLLM (no speculation), `specwatch bench` copy at c = 1 (2 prompts, 1 warm-up + 3
# measured batches of 64 tokens) with: nothing beside it; two `yes` pinned to core 0 (where vLLM's
# log binds its OpenMP worker: "core ids=[0]"); two pinned to core 1 (the engine core and the API
# server's side); four unpinned; nothing again. Run as it was, 2026-12-05 10:32-10:37 UTC, by hand.
set -u
cd /work/main
out=${1:-docs/results/neighbour-effect-2026-12-05}
model=$(.venv/bin/python -c "from specwatch.localvllm.model import default_model_dir; print(default_model_dir())")
export VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1
setsid .venv/bin/python -m vllm.entrypoints.openai.api_server --model "$model" --served-model-name smollm2 \
  --port 18301 --host 127.0.0.1 --enforce-eager --max-model-len 2048 --max-num-seqs 16 --dtype bfloat16 \
  --disable-uvicorn-access-log > $out/v.log 2>&1 &
srv=$!
trap 'pkill -x yes; kill -- -$srv 2>/dev/null' EXIT
for _ in $(seq 60); do curl -sf http://127.0.0.1:18301/v1/models > /dev/null && break; sleep 2; done
run() {
  .venv/bin/specwatch bench --base-url http://127.0.0.1:18301 --dataset-name copy --max-concurrency 1 --num-prompts 2 \
    --num-batches 3 --warmup-batches 1 --output-len 64 --no-equivalence --no-progress --result-dir $out \
    --result-filename "$1.json" > /dev/null 2>&1
  .venv/bin/python -c "import json; d = json.load(open('$out/$1.json')); print('$1', [round(b['output_throughput'], 1) for b in d['batches'] if not b['warmup']])"
}
run idle
taskset -c 0 yes > /dev/null & taskset -c 0 yes > /dev/null & run core0x2; pkill -x yes
taskset -c 1 yes > /dev/null & taskset -c 1 yes > /dev/null & run core1x2; pkill -x yes
for _ in 1 2 3 4; do yes > /dev/null & done; run free4; pkill -x yes
run idle2
