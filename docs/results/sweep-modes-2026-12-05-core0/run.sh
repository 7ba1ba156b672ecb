#!/usr/bin/env bash
# paired against sequential sweeps, run 8 (issue #37): as run 7, but the changing neighbour (scripts/changing_load.sh, seed 7) pinned to core 0, the core the embedded vLLM binds its compute thread to ("core ids=[0]" in its log), so its phases reach vLLM
# the sweeps (no other jobs on the machine), and the paired sweep FIRST (runs 1-4 ran it second)
set -u
cd /work/main
out=${1:-docs/results/sweep-modes-2026-12-05-core0}
scripts/changing_load.sh 7 $out/neighbour.txt 0 &
hog=$!
(while sleep 30; do echo "$(date -u +%T) $(cut -d' ' -f1 /proc/loadavg)"; done) > $out/load.txt &
sampler=$!
trap 'kill $hog $sampler 2>/dev/null' EXIT
common=(--k 2,4 --workloads copy,random-output --concurrency 1,4 --num-batches 4 --max-batches 4 --no-progress)
echo "neighbour: scripts/changing_load.sh 7 (pinned to core 0), pid $hog; commit $(git rev-parse --short HEAD)" >> $out/times.txt
echo "paired start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
/usr/bin/time -v scripts/specwatch sweep --result-file $out/paired.json "${common[@]}" > $out/paired.log 2> $out/paired.time
echo "paired end $(date -u +%FT%TZ) rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
/usr/bin/time -v scripts/specwatch sweep --sequential --result-file $out/sequential.json "${common[@]}" > $out/sequential.log 2> $out/sequential.time
echo "sequential end $(date -u +%FT%TZ) rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
.venv/bin/python scripts/compare_sweep_modes.py $out/paired.json $out/sequential.json > $out/compare.md 2>&1
echo done >> $out/times.txt
