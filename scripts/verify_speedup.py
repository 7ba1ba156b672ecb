#!/usr/bin/env python3
"""Does the exporter's live speedup agree with a measured throughput ratio? (issue: measured cost)

On the embedded vLLM (CPU), one server at a time: the baseline (no speculation), then each
speculative configuration (default: ngram k = 4 and draft_model with the draft equal to the
target, k = 3). For every workload × concurrency cell:

1. a warm-up batch (not measured);
2. a fresh exporter (``specwatch serve --cost-profile P --window 5m``) is started and scraped once
   idle, so its 5m window holds exactly the cell's traffic;
3. the cell is measured with ``specwatch bench`` (client output throughput);
4. the exporter is scraped again: ``specwatch_speedup{basis="measured", window="5m"}`` at the
   server's k (its live decode speed × the profile's plain step time at the live batch).

With ``--other-profile P2`` (another machine's profile, e.g. the shipped CPU profile measured on
a faster VM, or the H200 reference) a second exporter reads the same server with P2, and every
cell also records ``specwatch_cost_profile_error_ratio{window="5m"}`` under both profiles: near 1
with the profile calibrated here, off by more than the drift alert's 25 % with the other.

Then per cell: measured ratio = speculative / baseline output throughput (client-side, same
prompts), against the exporter's live speedup; the script prints both and the relative error,
and writes everything to --out (JSON, rewritten after every cell).

Usage:  .venv/bin/python scripts/verify_speedup.py --cost-profile PROFILE.yaml [--out FILE]
Takes about 15 minutes on 2 cores (serialised with other real-vLLM users by the vLLM lock).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from specwatch.common.files import atomic_write_json
from specwatch.common.processes import free_port, stop_process_group, wait_http
from specwatch.localvllm.model import default_model_dir, prepare_model
from specwatch.localvllm.server import VllmServer

SPECWATCH = Path(sys.executable).with_name("specwatch")


def configs(model_dir: Path) -> list[tuple[str, dict | None, str | None]]:
    """Server order: the baseline first and again last (the machine's load drifts: each cell's
    baseline throughput is the mean of the two runs, so the speculative runs sit between them)."""
    return [
        ("baseline", None, None),
        ("ngram-k4", {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}, "ngram"),
        ("draft_model-k3", {"method": "draft_model", "model": str(model_dir), "num_speculative_tokens": 3}, "draft_model"),
        ("baseline", None, None),
    ]


def bench(base_url: str, workload: str, conc: int, args, warmup: bool, result_dir: Path) -> float | None:
    cmd = [str(SPECWATCH), "bench", "--base-url", base_url, "--dataset-name", workload, "--max-concurrency", str(conc),
           "--num-prompts", str(conc * args.prompts_per_concurrency), "--output-len", str(args.output_len),
           "--metrics-port", "0", "--no-progress", "--no-equivalence", "--seed", "0"]
    if warmup:
        cmd += ["--num-batches", "1", "--warmup-batches", "0", "--no-save-result"]
    else:
        cmd += ["--num-batches", str(args.num_batches), "--warmup-batches", "0", "--save-result", "--result-dir", str(result_dir)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"bench failed ({r.returncode}): {r.stderr[-1500:]}")
    if warmup:
        return None
    newest = max(result_dir.glob("*.json"), key=lambda p: p.stat().st_mtime)
    doc = json.loads(newest.read_text())
    cells = doc.get("summary") or []
    for c in cells:
        if c.get("workload") == workload and int(c.get("max_concurrency", 0)) == conc:
            return float(c["output_throughput"])
    raise RuntimeError(f"no cell in {newest}")


def scrape(url: str) -> str:
    r = requests.get(url, timeout=30)
    r.raise_for_status()
    return r.text


def measured_speedup(text: str, k: int) -> dict | None:
    for fam in text_string_to_metric_families(text):
        if fam.name != "specwatch_speedup":
            continue
        for s in fam.samples:
            if s.labels.get("window") == "5m" and s.labels.get("k") == str(k):
                return {"value": s.value, "basis": s.labels.get("basis")}
    return None


def drift(text: str) -> float | None:
    """``specwatch_cost_profile_error_ratio{window="5m"}`` (live step time / the profile's), if served."""
    for fam in text_string_to_metric_families(text):
        if fam.name == "specwatch_cost_profile_error_ratio":
            for s in fam.samples:
                if s.labels.get("window") == "5m":
                    return s.value
    return None


def start_exporter(base_url: str, profile: str, method: str | None) -> tuple[subprocess.Popen, str]:
    """A fresh ``specwatch serve --window 5m --cost-profile profile`` on a free port; (process, /metrics URL)."""
    eport = free_port()
    cmd = [str(SPECWATCH), "serve", "--upstream", f"spec={base_url}", "--window", "5m",
           "--listen-address", f"127.0.0.1:{eport}", "--cost-profile", profile, "--log-level", "warning"]
    if method:
        cmd += ["--speculative-method", method]
    exp = subprocess.Popen(cmd, start_new_session=True)
    url = f"http://127.0.0.1:{eport}/metrics"
    wait_http(url, 30, exp, "specwatch serve", interval=0.2)  # raises NotReady naming it
    return exp, url


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cost-profile", required=True)
    ap.add_argument("--other-profile", default=None, help="another machine's profile: its drift is recorded too")
    ap.add_argument("--out", type=Path, default=Path("results/verify-speedup.json"))
    ap.add_argument("--workloads", default="copy,random-output")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--output-len", type=int, default=192)
    ap.add_argument("--prompts-per-concurrency", type=int, default=3)
    ap.add_argument("--num-batches", type=int, default=1)
    ap.add_argument("--only", default=None, help="comma-separated config names (default: all)")
    args = ap.parse_args()
    model_dir = default_model_dir()
    prepare_model(model_dir)
    workloads = args.workloads.split(",")
    concs = [int(c) for c in args.concurrency.split(",")]
    out = {"cost_profile": args.cost_profile, "settings": vars(args) | {"out": str(args.out)}, "cells": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="specwatch-verify-"))
    chosen = configs(model_dir)
    if args.only:
        chosen = [c for c in chosen if c[0] in args.only.split(",")]
    for name, spec, method in chosen:
        port = free_port()
        print(f"[{name}] starting vLLM on {port}", flush=True)
        with VllmServer(port, model_dir=model_dir, speculative_config=spec, log_path=work / f"{name}.log",
                        on_status=lambda m: print(f"  {m}", flush=True)) as srv:
            k = srv.k
            for wl in workloads:
                for c in concs:
                    bench(srv.base_url, wl, c, args, True, work)
                    profiles = [args.cost_profile] + ([args.other_profile] if args.other_profile else [])
                    exporters = [start_exporter(srv.base_url, p, method) for p in profiles]
                    try:
                        time.sleep(1.5)  # past the exporters' freshness interval: the next scrape fetches anew
                        thr = bench(srv.base_url, wl, c, args, False, work)
                        time.sleep(1.5)
                        texts = [scrape(url) for _, url in exporters]
                    finally:
                        for exp, _ in exporters:
                            stop_process_group(exp, 10)
                    text = texts[0]
                    sp = measured_speedup(text, k) if k else None
                    cell = {"config": name, "k": k, "workload": wl, "concurrency": c, "output_throughput": thr,
                            "exporter_speedup": sp, "drift": drift(texts[0]),
                            "other_profile_drift": drift(texts[1]) if len(texts) > 1 else None}
                    out["cells"].append(cell)
                    atomic_write_json(args.out, out)
                    print(f"  {name} {wl} c={c}: {thr:.1f} tok/s; exporter speedup {sp}; drift {cell['drift']}, "
                          f"with the other profile {cell['other_profile_drift']}", flush=True)
    runs: dict[tuple[str, int], list[float]] = {}
    for c in out["cells"]:
        if c["config"] == "baseline":
            runs.setdefault((c["workload"], c["concurrency"]), []).append(c["output_throughput"])
    base = {key: sum(v) / len(v) for key, v in runs.items()}
    out["baseline_runs"] = {f"{w}/c={c}": v for (w, c), v in runs.items()}
    rows = []
    for c in out["cells"]:
        if c["config"] == "baseline" or not c["exporter_speedup"]:
            continue
        b = base.get((c["workload"], c["concurrency"]))
        if not b:
            continue
        ratio = c["output_throughput"] / b
        live = c["exporter_speedup"]["value"]
        c["measured_ratio"] = ratio
        c["relative_error"] = live / ratio - 1
        rows.append(c)
    atomic_write_json(args.out, out)
    print(f"\n{'config':<16}{'workload':<15}{'c':>3}{'measured ratio':>16}{'exporter speedup':>18}{'basis':>10}{'error':>9}"
          f"{'drift':>8}{'other':>8}")
    bad = 0
    for c in rows:
        sp = c["exporter_speedup"]
        ok = abs(c["relative_error"]) <= 0.15 and ((sp["value"] < 1) == (c["measured_ratio"] < 1) or abs(c["measured_ratio"] - 1) < 0.03)
        bad += not ok
        print(f"{c['config']:<16}{c['workload']:<15}{c['concurrency']:>3}{c['measured_ratio']:>16.3f}{sp['value']:>18.3f}"
              f"{sp['basis']:>10}{c['relative_error'] * 100:>8.1f}%{_fmt(c['drift']):>8}{_fmt(c['other_profile_drift']):>8}"
              f"{'' if ok else '  <- off'}")
    print(f"\n{len(rows) - bad}/{len(rows)} cells within 15 % and on the right side of 1; results in {args.out}")
    return 0 if rows and not bad else 1


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


if __name__ == "__main__":
    sys.exit(main())
