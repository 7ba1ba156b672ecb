#!/usr/bin/env bash
# A paired sweep with its own A/A starts (issue #37): `specwatch sweep --aa-starts 2` on the embedded vLLM,
# the cells of runs 5-7 (ngram k = 2, 4; copy and random-output; c = 1, 4; 4 batches), beside a steady
# `yes` hog. aa-1 and aa-2 are the baseline started again and measured beside it (true ratio 1); advise and
# report add their between-starts spread to every interval. Then advise on the file, with and without it.
set -u
cd /work/main
out=${1:-docs/results/sweep-aa-2026-12-05}
yes > /dev/null &
hog=$!
trap 'kill $hog 2>/dev/null' EXIT
echo "hog pid $hog; commit $(git rev-parse --short HEAD)" >> $out/times.txt
echo "start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
/usr/bin/time -v scripts/specwatch sweep --result-file $out/paired.json --k 2,4 --workloads copy,random-output \
  --concurrency 1,4 --num-batches 4 --max-batches 4 --aa-starts 2 --no-progress > $out/sweep.log 2> $out/sweep.time
echo "end $(date -u +%FT%TZ) rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
kill $hog 2>/dev/null
scripts/specwatch advise $out/paired.json > $out/advise.txt 2>&1
scripts/specwatch advise $out/paired.json --json $out/advise.json > /dev/null 2>&1
echo done >> $out/times.txt
