#!/usr/bin/env bash
# RSS over 12 minutes (the 5m window's history full from minute 5 on), beside one CPU hog (issue #38)
set -u
cd /work/main
out=docs/results/soak-2026-12-05
yes > /dev/null &
hog=$!
trap 'kill $hog 2>/dev/null' EXIT
echo "run4: hog pid $hog; tree $(git rev-parse --short HEAD); start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
.venv/bin/python scripts/bench_exporter_soak.py --upstreams 128 --scrapers 10 --minutes 12 --json $out/soak4-12min.json > $out/soak4-12min.txt 2>&1
echo "run4 soak end $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
