#!/usr/bin/env bash
# the soak (128 upstreams, 10 scrapers, 5 min) beside one CPU hog, at a moment when nothing else ran (issue #38)
set -u
cd /work/main
out=docs/results/soak-2026-12-05
yes > /dev/null &
hog=$!
trap 'kill $hog 2>/dev/null' EXIT
echo "run3: hog pid $hog; tree $(git rev-parse --short HEAD); start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
( for i in $(seq 1 30); do sleep 10; echo "$(date -u +%T) $(cut -d' ' -f1 /proc/loadavg)"; done ) > $out/soak3-load.txt &
.venv/bin/python scripts/bench_exporter_soak.py --upstreams 128 --scrapers 10 --minutes 5 --json $out/soak3-new.json > $out/soak3-new.txt 2>&1
echo "run3 soak end $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
