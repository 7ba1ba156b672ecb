#!/usr/bin/env bash
# after the unloaded verify run: the loaded verify run, then the paired/sequential sweeps (issue #37)
set -u
cd /work/main
until grep -q '^rc=' /work/runs/verify-unloaded/run.log 2>/dev/null; do sleep 10; done
mkdir -p /work/runs/verify-loaded
{ echo "start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"
  .venv/bin/python scripts/verify_speedup.py --baseline-upstream --load-hog 1 --output-len 128 \
    --cost-profile exporter/specwatch/data/cost-profiles/cpu-2core-smollm2-135m-vllm0.32.yaml \
    --out /work/runs/verify-loaded/verify.json
  echo "rc=$?"; echo "end $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"; } > /work/runs/verify-loaded/run.log 2>&1
out=/work/runs/modes
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
