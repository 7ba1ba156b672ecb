#!/usr/bin/env bash
# the same side by side after the pre-rendering commit, then the soak again (issue #38)
set -u
cd /work/main
out=docs/results/soak-2026-12-05
yes > /dev/null &
hog=$!
trap 'kill $hog 2>/dev/null' EXIT
echo "run2: hog pid $hog; new tree $(git rev-parse --short HEAD), old tree $(git -C /tmp/old-tree rev-parse --short HEAD)" >> $out/times.txt
echo "run2 side by side start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
PYTHONPATH=/tmp/old-tree/exporter .venv/bin/python scripts/bench_exporter_soak.py --upstreams 64 --scrapers 5 --minutes 3 --json $out/side2-old.json > $out/side2-old.txt 2>&1 &
old=$!
.venv/bin/python scripts/bench_exporter_soak.py --upstreams 64 --scrapers 5 --minutes 3 --json $out/side2-new.json > $out/side2-new.txt 2>&1
wait $old
echo "run2 side by side end $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
.venv/bin/python scripts/bench_exporter_soak.py --upstreams 128 --scrapers 10 --minutes 5 --json $out/soak2-new.json > $out/soak2-new.txt 2>&1
echo "run2 soak end $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/times.txt
echo done >> $out/times.txt
