#!/usr/bin/env python3
"""Client-side speed of ``specwatch bench`` versus ``vllm bench serve``'s client.

Both clients drive the same local streaming stub, run in its own process and answering
instantly: by default :mod:`specwatch.testing.faststub` (raw HTTP, precomputed events, one event per
running request per engine-like step; it spends less CPU per token than either client, so the
clients are what is measured), or with ``--stub aiohttp`` the test stub
(:mod:`specwatch.testing.stubserver`, ~8 µs of CPU per token: then the stub is the bottleneck and
the figures mostly show how each client's read pattern changes the stub's cost). On a machine with
two or more CPUs the stub is pinned to one CPU and the clients to another (``--no-pin`` to turn
off), so neither steals the other's core. They get the same ShareGPT-format prompts in the same order
(``specwatch/data/sharegpt_sample.json``; vLLM's client gets them pre-ordered with
``--disable-shuffle``), the same output length (``ignore_eos``) and the same concurrency, so the
stub's speed is shared and the difference is the client. Rounds alternate (ours first in odd
rounds, vLLM's first in even ones); the medians of sustained requests/s and output tokens/s (each
tool's own ``request_throughput`` / ``output_throughput`` from its result JSON) are compared:
ratio = ours / vLLM's (goal ≥ 1.0).

``vllm bench serve`` needs a tokenizer; a small word-level tokenizer is built locally with the
``tokenizers`` package (no download). Each client runs in a fresh subprocess.

Usage::

    python scripts/bench_client.py [--concurrency 64] [--num-prompts 2000] [--output-len 256]
                                   [--rounds 3] [--stub fast|aiohttp] [--no-pin]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from specwatch.bench.records import BenchResult
from specwatch.common.processes import free_port, wait_http

PY = sys.executable


def build_tokenizer(dataset: Path, out_dir: Path) -> None:
    """A word-level tokenizer over the dataset's words (local, for vllm bench serve's sampler)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = set()
    for conv in json.loads(dataset.read_text()):
        for turn in conv.get("conversations", []):
            words.update(turn["value"].split())
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(sorted(words))}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(out_dir)


def ordered_dataset(dataset: Path, n: int, out: Path) -> Path:
    """Write the ``n`` prompts ``specwatch bench`` sends (sharegpt workload, seed 0, batch 0), in its
    order, as a ShareGPT file; ``vllm bench serve --disable-shuffle`` on it sends the same sequence,
    so both clients group the same requests into the same concurrency waves."""
    from specwatch.bench.workloads import WorkloadOptions, build_requests, load_sharegpt

    items = {i.prompt: i for i in load_sharegpt(dataset)}
    reqs = build_requests("sharegpt", n, WorkloadOptions(seed=0, dataset_path=str(dataset)), batch=0)
    convs = [{"id": f"ordered-{k}", "conversations": [{"from": "human", "value": r.prompt},
                                                       {"from": "gpt", "value": items[r.prompt].completion}]}
             for k, r in enumerate(reqs)]
    out.write_text(json.dumps(convs))
    return out


VLLM_DRIVER = r"""
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

p = FlexibleArgumentParser()
add_cli_args(p)
main(p.parse_args(sys.argv[1:]))
"""


#: CPU sets (stub, clients) when pinning; None = no pinning.
PIN: tuple[set[int], set[int]] | None = None


def _client_preexec():
    if PIN is not None:
        os.sched_setaffinity(0, PIN[1])


def run_vllm(url: str, tok: Path, dataset: Path, out: Path, conc: int, n: int, out_len: int, model: str) -> dict:
    args = [
        "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", model, "--tokenizer", str(tok), "--dataset-name", "sharegpt",
        "--dataset-path", str(dataset), "--disable-shuffle", "--sharegpt-output-len", str(out_len), "--ignore-eos",
        "--num-prompts", str(n), "--max-concurrency", str(conc), "--temperature", "0",
        "--seed", "0", "--num-warmups", "0", "--ready-check-timeout-sec", "0", "--disable-tqdm",
        "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    r = subprocess.run([PY, "-c", VLLM_DRIVER, *args], capture_output=True, text=True, env=env,
                       preexec_fn=_client_preexec)
    if r.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    d = json.loads(out.read_text())
    return {"request_throughput": d["request_throughput"], "output_throughput": d["output_throughput"],
            "completed": d["completed"], "failed": d["failed"], "duration": d["duration"]}


def run_ours(url: str, dataset: Path, out: Path, conc: int, n: int, out_len: int, model: str) -> dict:
    args = [
        "-m", "specwatch", "bench", "--base-url", url, "--model", model,
        "--dataset-name", "sharegpt", "--dataset-path", str(dataset), "--output-len", str(out_len),
        "--ignore-eos", "--temperature", "0", "--max-concurrency", str(conc), "--num-prompts", str(n),
        "--num-batches", "1", "--warmup-batches", "0", "--metrics-port", "0", "--no-progress",
        "--no-equivalence", "--result-dir", str(out.parent), "--result-filename", out.name,
    ]
    r = subprocess.run([PY, *args], capture_output=True, text=True, preexec_fn=_client_preexec)
    if r.returncode != 0:
        raise RuntimeError(f"specwatch bench failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    b = BenchResult.load(out).batches[0]
    return {"request_throughput": b.request_throughput, "output_throughput": b.output_throughput,
            "completed": b.completed, "failed": b.failed, "duration": b.duration}


def rounds(url: str, tok: Path | None, dataset: Path, a: argparse.Namespace, model: str) -> tuple[list, list]:
    """Alternate the two clients ``a.rounds`` times against ``url``; returns (ours, vLLM's)."""
    with tempfile.TemporaryDirectory() as tmp:
        tdir = Path(tmp)
        if tok is None:
            tok = tdir / "tok"
            build_tokenizer(dataset, tok)
        same_order = ordered_dataset(dataset, a.num_prompts, tdir / "ordered.json")
        ours, theirs = [], []
        for i in range(a.rounds):
            # Alternate which client goes first, so a drifting server (warming up, a neighbour's
            # load) does not favour either.
            if i % 2 == 0:
                o = run_ours(url, dataset, tdir / f"ours-{i}.json", a.concurrency, a.num_prompts, a.output_len, model)
            v = run_vllm(url, tok, same_order, tdir / f"vllm-{i}.json", a.concurrency, a.num_prompts, a.output_len, model)
            if i % 2 == 1:
                o = run_ours(url, dataset, tdir / f"ours-{i}.json", a.concurrency, a.num_prompts, a.output_len, model)
            ours.append(o)
            theirs.append(v)
            print(f"round {i + 1}: specwatch {o['request_throughput']:.2f} req/s {o['output_throughput']:.1f} tok/s "
                  f"(failed {o['failed']}) | vllm bench serve {v['request_throughput']:.2f} req/s "
                  f"{v['output_throughput']:.1f} tok/s (failed {v['failed']})", flush=True)
    return ours, theirs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--num-prompts", type=int, default=2000)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--real-vllm", action="store_true",
                    help="instead of the stub, start the embedded real vLLM (holding the vLLM lock) and compare "
                         "output throughput (goal: within 5 %%); use e.g. --concurrency 4 --num-prompts 12 --output-len 128")
    ap.add_argument("--base-url", default=None,
                    help="use this already running server instead (with --model and --tokenizer, a local tokenizer dir)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokenizer", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--stub", choices=("fast", "aiohttp"), default="fast",
                    help="which local stub: the fast one (default; measures the clients) or the aiohttp test stub")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the stub and the clients to separate CPUs")
    a = ap.parse_args()
    for name in ("concurrency", "num_prompts", "output_len", "rounds"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.json is not None and not (a.json.parent.is_dir() and os.access(a.json.parent, os.W_OK)):
        ap.error(f"--json {a.json}: the directory does not exist or is not writable")
    global PIN
    cpus = sorted(os.sched_getaffinity(0))
    if not a.no_pin and len(cpus) >= 2 and not (a.real_vllm or a.base_url):
        PIN = ({cpus[0]}, set(cpus[1:]))

    import specwatch.bench.workloads as wl

    dataset = wl.sample_sharegpt_path()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if a.base_url:
        if not (a.model and a.tokenizer):
            ap.error("--base-url needs --model and --tokenizer")
        with tempfile.TemporaryDirectory() as tmp:  # warm-up run, discarded
            run_ours(a.base_url, dataset, Path(tmp) / "warm.json", a.concurrency, a.num_prompts, a.output_len, a.model)
        ours, theirs = rounds(a.base_url, a.tokenizer, dataset, a, a.model)
    elif a.real_vllm:
        from specwatch.localvllm.server import VllmServer
        from specwatch.localvllm.model import default_model_dir

        with VllmServer(port, on_status=lambda m: print(m, flush=True)) as srv:
            print(f"vLLM ready in {srv.startup_seconds:.0f} s (k={srv.k}); warm-up run", flush=True)
            with tempfile.TemporaryDirectory() as tmp:
                run_ours(srv.base_url, dataset, Path(tmp) / "warm.json", a.concurrency, a.num_prompts,
                         a.output_len, srv.served_model_name)
            ours, theirs = rounds(srv.base_url, srv.model_dir or default_model_dir(), dataset, a, srv.served_model_name)
    else:
        cmd = ([PY, "-m", "specwatch.testing.faststub", "--port", str(port)] if a.stub == "fast"
               else [PY, "-m", "specwatch.testing.stubserver", "--port", str(port), "--k", "4"])
        stub = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                preexec_fn=(lambda: os.sched_setaffinity(0, PIN[0])) if PIN else None)
        try:
            wait_http(url + "/v1/models", 30.0)
            ours, theirs = rounds(url, None, dataset, a, "stub-model")
        finally:
            stub.terminate()
            try:
                stub.wait(30)  # a loaded machine can take its time to unwind the stub's open streams
            except subprocess.TimeoutExpired:
                stub.kill()
                stub.wait(10)

    def med(rows, k):
        return statistics.median(r[k] for r in rows)

    res = {
        "concurrency": a.concurrency, "num_prompts": a.num_prompts, "output_len": a.output_len, "rounds": a.rounds,
        "specwatch_request_throughput": med(ours, "request_throughput"),
        "specwatch_output_throughput": med(ours, "output_throughput"),
        "vllm_request_throughput": med(theirs, "request_throughput"),
        "vllm_output_throughput": med(theirs, "output_throughput"),
    }
    res["ratio_request_throughput"] = res["specwatch_request_throughput"] / res["vllm_request_throughput"]
    res["ratio_output_throughput"] = res["specwatch_output_throughput"] / res["vllm_output_throughput"]
    where = "real vLLM" if (a.real_vllm or a.base_url) else (
        f"{a.stub} stub" + (f", stub on CPU {sorted(PIN[0])}, clients on CPU {sorted(PIN[1])}" if PIN else ""))
    print(f"median over {a.rounds} rounds, concurrency {a.concurrency}, {a.num_prompts} requests x {a.output_len} tokens ({where}):")
    print(f"  specwatch bench : {res['specwatch_request_throughput']:.2f} req/s, {res['specwatch_output_throughput']:.1f} tok/s")
    print(f"  vllm bench serve: {res['vllm_request_throughput']:.2f} req/s, {res['vllm_output_throughput']:.1f} tok/s")
    real = a.real_vllm or bool(a.base_url)
    goal = "within 5 %" if real else ">= 1.0"
    print(f"  ratio (ours / vLLM's): requests/s {res['ratio_request_throughput']:.3f}, tokens/s {res['ratio_output_throughput']:.3f}"
          f"  (goal {goal})")
    res["target"] = "real vLLM" if real else f"{a.stub} stub"
    res["pinned"] = PIN is not None
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
