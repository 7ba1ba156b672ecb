#!/usr/bin/env bash
# Set everything up on this machine and run the demo on the embedded default:
# a real vLLM (CPU, SmolLM2-135M, ngram k=4) and a baseline vLLM one after the other, with the
# exporter and Prometheus running, the published workloads at concurrency 1 and 8, then the comparison
# table and the per-position curve. Extra arguments go to `specwatch demo` (see --help).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SPECWATCH_VENV:-$here/.venv}"
bash "$here/scripts/setup.sh"
cd "$here"
exec "$venv/bin/specwatch" demo "$@"
