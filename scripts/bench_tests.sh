#!/usr/bin/env bash
# The fast tier (tests/unit + tests/integration without a real vLLM, stage 2 of scripts/test.sh)
# serial and in parallel (pytest-xdist), one after the other in one run, so the ratio is measured
# on the same machine at the same time of day: prints each run's wall time, CPU time and pytest
# summary, then the parallel/serial ratios. Needs set-up (scripts/setup.sh). Runs no real vLLM.
#   bash scripts/bench_tests.sh [WORKERS ...]      default: auto 4
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SPECWATCH_VENV:-$here/.venv}"
cd "$here"
[ -x "$venv/bin/python" ] || { echo "bench_tests: no virtualenv at $venv; run bash scripts/setup.sh first" >&2; exit 2; }
workers=("$@"); [ ${#workers[@]} -gt 0 ] || workers=(auto 4)
expr="(unit or integration) and not realvllm and not compose"
out="$(mktemp -d)"
declare -A wall
run() {  # run NAME PYTEST-ARGS...
  local name="$1"; shift
  local start end rc=0
  start=$(date +%s.%N)
  /usr/bin/env time -f "%U %S" -o "$out/$name.cpu" "$venv/bin/python" -m pytest -q -p no:cacheprovider -m "$expr" "$@" \
    > "$out/$name.log" 2>&1 || rc=$?
  end=$(date +%s.%N)
  wall[$name]=$(python3 -c "print(f'{$end - $start:.1f}')")
  local cpu; cpu=$(awk '{printf "%.0f", $1 + $2}' "$out/$name.cpu" 2>/dev/null)
  echo "[bench-tests] $name: ${wall[$name]} s wall, ${cpu:-?} s CPU, pytest exit $rc: $(tail -1 "$out/$name.log")"
}
echo "[bench-tests] $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); logs in $out"
run serial
for w in "${workers[@]}"; do run "n$w" -n "$w" --dist loadfile; done
for w in "${workers[@]}"; do
  python3 -c "print(f'[bench-tests] -n $w / serial: {${wall[n$w]} / ${wall[serial]}:.2f} of the wall time')"
done
echo "[bench-tests] load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
