#!/usr/bin/env python3
"""Check issue #13 on the real embedded vLLM: exact per-request curves vs the exporter's labelled
counter curves, for a dynamic table and for fixed k (prints figures, writes a JSON summary).

For each configuration (one real vLLM at a time, holding /tmp/specwatch-vllm.lock; started by
specwatch.localvllm with --per-request-spec-decode-metrics detailed):

1. start the exporter (``specwatch serve``, in-process WSGI on a free port) against it;
2. ``specwatch bench`` (the load generator) at each concurrency in turn, copy workload (and explain
   for ngram): per-request exact curves in its result file;
3. read the exporter's /metrics: per-position series with their basis label, specwatch_ragged_drafts,
   specwatch_recommended_num_speculative_tokens / specwatch_recommendation_withheld (lifetime window).

Configurations: ``dynamic`` (draft_model = target, k = 3, [[1,1,3],[2,8,1]], c = 1 then 4),
``draft-k3`` (the same drafter at a fixed k = 3, c = 4), ``ngram-k3`` (copy and explain, c = 4).

Usage: .venv/bin/python scripts/verify_ragged.py [--only dynamic,draft-k3,ngram-k3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server

import requests
from prometheus_client.parser import text_string_to_metric_families

from specwatch.bench.records import BenchResult
from specwatch.localvllm.model import prepare_model
from specwatch.localvllm.server import VllmServer

CONFIGS = {
    "dynamic": ({"method": "draft_model", "model": "MODEL_DIR", "num_speculative_tokens": 3,
                 "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 8, 1]]}, ["copy"], [1, 4]),
    "draft-k3": ({"method": "draft_model", "model": "MODEL_DIR", "num_speculative_tokens": 3}, ["copy"], [4]),
    "ngram-k3": ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 5},
                 ["copy", "explain"], [4]),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Quiet(WSGIRequestHandler):
    def log_message(self, *a):
        pass


def start_exporter(upstream: str):
    from specwatch.exporter.config import build_config
    from specwatch.exporter.app import make_app, make_registry

    cfg = build_config([f"spec={upstream}"], ["1m"])
    reg = make_registry(cfg)
    port = free_port()
    httpd = make_server("127.0.0.1", port, make_app(cfg, reg), handler_class=_Quiet)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{port}"


def exporter_view(url: str) -> dict:
    text = requests.get(url + "/metrics", timeout=30).text
    out: dict = {"positions": {}, "expected": {}, "ragged": {}, "missing_ratio": {}, "recommended": {}, "withheld": {}}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            lab = s.labels
            w = lab.get("window")
            if fam.name == "specwatch_position_acceptance_rate":
                out["positions"].setdefault(w, {})[lab["position"]] = (round(s.value, 4), lab.get("basis"))
            elif fam.name == "specwatch_expected_acceptance_length":
                out["expected"].setdefault(w, {})[lab["k"]] = (round(s.value, 4), lab.get("basis"))
            elif fam.name == "specwatch_ragged_drafts":
                out["ragged"][w] = s.value
            elif fam.name == "specwatch_missing_draft_tokens_ratio":
                out["missing_ratio"][w] = round(s.value, 4)
            elif fam.name == "specwatch_recommended_num_speculative_tokens":
                out["recommended"][w] = (s.value, lab.get("basis"))
            elif fam.name == "specwatch_recommendation_withheld":
                out["withheld"][w] = lab.get("reason")
    landing = requests.get(url + "/", timeout=10).text
    out["landing_mentions_withheld"] = "Recommendation withheld" in landing
    return out


def bench(base_url: str, workloads: list[str], conc: int, out_dir: Path, name: str) -> BenchResult:
    fname = f"{name}-c{conc}.json"
    cmd = [sys.executable, "-m", "specwatch", "bench", "--base-url", base_url, "--dataset-name", ",".join(workloads),
           "--max-concurrency", str(conc), "--num-prompts", str(2 * conc), "--num-batches", "1",
           "--warmup-batches", "1", "--output-len", "96", "--no-progress", "--result-dir", str(out_dir),
           "--result-filename", fname]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return BenchResult.load(out_dir / fname)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(CONFIGS))
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "specwatch-verify-ragged")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = prepare_model()
    summary = {}
    for name in [x.strip() for x in args.only.split(",") if x.strip()]:
        cfg, workloads, concs = CONFIGS[name]
        spec = {k: (str(model_dir) if v == "MODEL_DIR" else v) for k, v in cfg.items()}
        print(f"[verify] {name}: starting vLLM …", file=sys.stderr, flush=True)
        with VllmServer(free_port(), model_dir=model_dir, speculative_config=spec,
                        log_path=args.out / f"vllm-{name}.log",
                        on_status=lambda m: print(f"[verify] {m}", file=sys.stderr, flush=True)) as srv:
            httpd, exp = start_exporter(srv.metrics_url)
            try:
                requests.get(exp + "/metrics", timeout=30)  # first record of the windows
                runs = {}
                for c in concs:
                    doc = bench(srv.base_url, workloads, c, args.out, name)
                    runs[f"c{c}"] = [{k: cell.get(k) for k in (
                        "workload", "max_concurrency", "spec_decode_per_position_acceptance_rates",
                        "spec_decode_curve_basis", "spec_decode_missing_draft_tokens_ratio", "output_throughput")}
                        | {"per_request": {k: (cell.get("spec_decode_per_request") or {}).get(k) for k in (
                            "status", "requests", "problems", "per_position_acceptance_rates",
                            "conditional_per_position_acceptance_rates", "expected_acceptance_lengths",
                            "draft_length_histogram", "request_acceptance", "num_outliers", "outliers")}}
                        for cell in (c.to_json() for c in doc.cells)]
                    time.sleep(1.5)
                    requests.get(exp + "/metrics", timeout=30)
                time.sleep(1.5)
                view = exporter_view(exp)
            finally:
                httpd.shutdown()
        summary[name] = {"speculative_config": cfg, "bench": runs, "exporter": view}
        print(json.dumps(summary[name], indent=1), flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"[verify] wrote {args.out / 'summary.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
