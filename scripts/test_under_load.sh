#!/usr/bin/env bash
# The suite on a busy machine: clone this repository's HEAD (the commit at the start, for every
# run) into fresh temporary folders and run
# `bash .ci/run` there RUNS times in a row (default 2) while a CPU-heavy process runs beside it
# (HOGS busy loops, default 1: `yes > /dev/null`). Exit 0 only if every run passed.
# Logs: OUT_DIR/run-N.log (default: a new temporary folder, printed at the start).
#   bash scripts/test_under_load.sh [RUNS] [HOGS] [OUT_DIR]
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs="${1:-2}"; hogs="${2:-1}"; out="${3:-$(mktemp -d)}"
case "$runs$hogs" in *[!0-9]*) echo "usage: $0 [RUNS] [HOGS] [OUT_DIR]  (RUNS, HOGS: integers)" >&2; exit 2;; esac
mkdir -p "$out" || exit 2
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; }
trap cleanup EXIT
trap 'exit 130' INT TERM
for _ in $(seq 1 "$hogs"); do yes > /dev/null & pids+=($!); done
# Every run tests the commit HEAD was at the start, even if HEAD moves while they run.
commit="$(git -C "$repo" rev-parse --short HEAD)"
sha="$(git -C "$repo" rev-parse HEAD)"
echo "[under-load] $runs run(s) of .ci/run at $commit beside $hogs busy loop(s); logs in $out" >&2
failed=0
for i in $(seq 1 "$runs"); do
  d="$(mktemp -d)"
  git clone -q "$repo" "$d" && git -C "$d" checkout -q "$sha" || { echo "[under-load] run $i: cannot clone $commit into $d" >&2; failed=1; continue; }
  start=$(date +%s)
  (cd "$d" && bash .ci/run) > "$out/run-$i.log" 2>&1
  rc=$?
  # One pytest summary line per stage of scripts/test.sh (fast, vLLM, e2e), joined.
  summary="$(grep -E '^=+ .*(passed|failed|error|deselected).* =+$' "$out/run-$i.log" | sed -E 's/^=+ //; s/ =+$//' | paste -sd ';' -)"
  echo "[under-load] run $i: exit $rc in $(( $(date +%s) - start )) s: ${summary:-no pytest summary}" >&2
  if [ "$rc" = 0 ]; then rm -rf "$d"; else failed=1; echo "[under-load] run $i's clone kept: $d" >&2; fi
done
exit "$failed"
