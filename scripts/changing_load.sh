#!/usr/bin/env bash
# A neighbour whose CPU load changes over minutes, as a shared host's other jobs do (a build, a
# batch job, another tenant): phases of 20-90 s, each running 0, 1 or 2 busy processes
# (`yes > /dev/null`), drawn from a seeded generator so a run can be repeated. On average it is
# one busy process, as the steady hog of the other benchmarks (`yes > /dev/null` alone).
#
#   scripts/changing_load.sh [SEED] [LOG] [CPUS]
#
# Each phase is logged to LOG (default: standard output) as "HH:MM:SS level N for S s".
# CPUS (a taskset list, e.g. 0): pin the busy processes there, e.g. on the core the embedded vLLM
# binds its compute thread to (its log: "core ids=[0]"), as a neighbour sharing that core would.
# Runs until killed (SIGTERM/SIGINT); its busy processes end with it.
set -u
RANDOM=${1:-7}
log=${2:-/dev/stdout}
cpus=${3:-}
pids=()
nap=
stop_busy() {
  [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null
  [ -n "$nap" ] && kill "$nap" 2>/dev/null
  pids=()
  nap=
}
trap 'stop_busy; exit 0' TERM INT
trap 'stop_busy' EXIT
while :; do
  level=$((RANDOM % 3))
  dur=$((20 + RANDOM % 71))
  echo "$(date -u +%T) level $level for $dur s" >> "$log"
  for ((i = 0; i < level; i++)); do
    if [ -n "$cpus" ]; then
      taskset -c "$cpus" yes > /dev/null &
    else
      yes > /dev/null &
    fi
    pids+=($!)
  done
  sleep "$dur" &
  nap=$!
  wait "$nap"
  stop_busy
done
