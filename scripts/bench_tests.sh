#!/usr/bin/env bash
# The fast tier (tests/unit + tests/integration without vLLM, stage 2 of scripts/test.sh)
# serial and in parallel (pytest-xdist), one after the other in one run, so the ratio is measured
# on the same machine at the same time of day: prints each run's wall time, CPU time and pytest
# summary, then the parallel/serial ratios. Needs set-up (scripts/setup.sh). Runs no real vLLM.
#   bash scripts/bench_tests.sh [WORKERS ...]      default: auto 4
#
# Two trees side by side (e.g. main and a branch, each a git worktree): stage 2 as scripts/test.sh
# runs it (-n <two per core, at most 16> --dist loadfile, or SPECWATCH_TEST_WORKERS) in BASE, then in NEW, then, with
# --rounds 2, in NEW and BASE again (alternating order, so a drift in the machine's load falls on
# both); prints each run's wall and CPU time and the ratios new/base of the sums.
#   bash scripts/bench_tests.sh --compare BASE_DIR NEW_DIR [--rounds 1|2]
# Each tree runs its own code: PYTHONPATH=<tree>/exporter:<tree>/tests/support (also for the
# specwatch commands the tests start), with this tree's virtualenv (SPECWATCH_VENV) for both.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SPECWATCH_VENV:-$here/.venv}"
cd "$here"
[ -x "$venv/bin/python" ] || { echo "bench_tests: no virtualenv at $venv; run bash scripts/setup.sh first" >&2; exit 2; }
expr="(unit or integration) and not realvllm and not vllmpkg and not compose"
default_workers=$(( 2 * $(nproc) )); [ "$default_workers" -gt 16 ] && default_workers=16  # as scripts/test.sh
out="$(mktemp -d)"
declare -A wall cpu
run_env=()  # VAR=value for the pytest run (the tree's PYTHONPATH with --compare)
run() {  # run NAME PYTEST-ARGS...   (in the current directory)
  local name="$1"; shift
  local start end rc=0
  start=$(date +%s.%N)
  /usr/bin/env ${run_env[@]+"${run_env[@]}"} time -f "%U %S" -o "$out/$name.cpu" "$venv/bin/python" -m pytest -q -p no:cacheprovider -m "$expr" "$@" \
    > "$out/$name.log" 2>&1 || rc=$?
  end=$(date +%s.%N)
  wall[$name]=$(python3 -c "print(f'{$end - $start:.1f}')")
  cpu[$name]=$(tail -1 "$out/$name.cpu" 2>/dev/null | awk '{printf "%.0f", $1 + $2}')  # time -o: "Command exited with non-zero status" first
  echo "[bench-tests] $name: ${wall[$name]} s wall, ${cpu[$name]:-?} s CPU, pytest exit $rc: $(tail -1 "$out/$name.log")"
}
echo "[bench-tests] $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); logs in $out"

if [ "${1:-}" = "--compare" ]; then
  [ $# -ge 3 ] || { echo "usage: bash scripts/bench_tests.sh --compare BASE_DIR NEW_DIR [--rounds 1|2]" >&2; exit 2; }
  base="$(cd "$2" && pwd)"; new="$(cd "$3" && pwd)"; rounds=1
  [ "${4:-}" = "--rounds" ] && rounds="${5:-1}"
  export SPECWATCH_VENV="$venv"  # tests that run scripts/test.sh --plan look at the virtualenv: the same for both
  tree() {  # tree NAME DIR
    echo "[bench-tests] $1 = $2 at $(git -C "$2" rev-parse --short HEAD)$(git -C "$2" diff --quiet HEAD || echo ' (+ uncommitted changes)')"
    run_env=("PYTHONPATH=$2/exporter:$2/tests/support${PYTHONPATH:+:$PYTHONPATH}")
    cd "$2" && run "$1" -n "${SPECWATCH_TEST_WORKERS:-$default_workers}" --dist loadfile
    cd "$here"
  }
  order=(base new); [ "$rounds" = 2 ] && order=(base new new2 base2)
  for name in "${order[@]}"; do
    case "$name" in base*) tree "$name" "$base" ;; *) tree "$name" "$new" ;; esac
  done
  python3 - "$rounds" "${wall[base]}" "${cpu[base]}" "${wall[new]}" "${cpu[new]}" \
    "${wall[base2]:-0}" "${cpu[base2]:-0}" "${wall[new2]:-0}" "${cpu[new2]:-0}" <<'PY'
import sys
r = int(sys.argv[1]); v = [float(x) for x in sys.argv[2:]]
bw, bc, nw, nc = v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]
print(f"[bench-tests] new / base over {r} run(s) each: {nw / bw:.2f} of the wall time ({nw / r:.0f} s vs {bw / r:.0f} s), "
      f"{nc / bc:.2f} of the CPU time ({nc / r:.0f} s vs {bc / r:.0f} s)")
PY
  echo "[bench-tests] load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
  exit 0
fi

workers=("$@"); [ ${#workers[@]} -gt 0 ] || workers=(auto 4)
run serial
for w in "${workers[@]}"; do run "n$w" -n "$w" --dist loadfile; done
for w in "${workers[@]}"; do
  python3 -c "print(f'[bench-tests] -n $w / serial: {${wall[n$w]} / ${wall[serial]}:.2f} of the wall time')"
done
echo "[bench-tests] load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
