#!/usr/bin/env bash
# exporter soak beside a CPU hog (issue #38): first the old tree (74fcf60) and the new one side by
# side under the same load, then the soak (128 upstreams, 10 scrapers, 5 min) on the new one
set -u
cd /work/main
out=docs/results/soak-2026-12-05
yes > /dev/null &
hog=$!
trap 'kill $hog 2>/dev/null' EXIT
echo "hog pid $hog; new tree $(git rev-parse --short HEAD), old tree $(git -C /tmp/old-tree rev-parse --short HEAD)" >> $out/times.txt
echo "side by side start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
PYTHONPATH=/tmp/old-tree/exporter .venv/bin/python scripts/bench_exporter_soak.py --upstreams 64 --scrapers 5 --minutes 3 --json $out/side-old.json > $out/side-old.txt 2>&1 &
old=$!
.venv/bin/python scripts/bench_exporter_soak.py --upstreams 64 --scrapers 5 --minutes 3 --json $out/side-new.json > $out/side-new.txt 2>&1
wait $old
echo "side by side end $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
.venv/bin/python scripts/bench_exporter_soak.py --upstreams 128 --scrapers 10 --minutes 5 --json $out/soak-new.json > $out/soak-new.txt 2>&1
echo "soak end $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
echo done >> $out/times.txt
