#!/usr/bin/env bash
# after the final verify runs: the paired/sequential sweeps again, with the settle batches (issue #37)
set -u
cd /work/main
until [ -f /work/runs/queue2.done ]; do sleep 10; done
out=/work/runs/modes3
yes > /dev/null &
hog=$!
trap 'kill $hog 2>/dev/null' EXIT
common=(--k 2,4 --workloads copy,random-output --concurrency 1,4 --num-batches 4 --max-batches 4 --no-progress)
echo "hog: yes > /dev/null, pid $hog; commit $(git rev-parse --short HEAD)" >> $out/times.txt
echo "sequential start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
/usr/bin/time -v scripts/specwatch sweep --sequential --result-file $out/sequential.json "${common[@]}" > $out/sequential.log 2> $out/sequential.time
echo "sequential end $(date -u +%FT%TZ) rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
/usr/bin/time -v scripts/specwatch sweep --result-file $out/paired.json "${common[@]}" > $out/paired.log 2> $out/paired.time
echo "paired end $(date -u +%FT%TZ) rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
echo done >> $out/times.txt
