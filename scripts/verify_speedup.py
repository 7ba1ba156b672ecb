#!/usr/bin/env python3
"""Does the exporter's live speedup agree with a measured throughput ratio? (issues 12 and 23)

Servers come from the sweep's code (:func:`specwatch.choosek.sweep.start_server`): the embedded
vLLM (CPU, the default) or, with ``--server-command``, the same template as ``specwatch sweep``
(``'vllm serve MODEL --port {port} {spec_args}'``) so the check runs on any vLLM (a GPU host);
``--speculative-config`` (repeatable) gives the speculative configurations (default: ngram k = 4
and, on the embedded vLLM, draft_model with the draft equal to the target, k = 3).

Two modes:

* default (one server at a time): the baseline, then each speculative configuration, then the
  baseline again (the machine's load drifts: each cell's baseline throughput is the mean of the
  two runs). Per cell: a warm-up batch, a fresh exporter (``specwatch serve --cost-profile P
  --window 30s --window 10m``) scraped once idle, the measured ``specwatch bench`` batches (the
  exporter scraped every 2.5 s meanwhile, as Prometheus would: :class:`Poller`), a last scrape.
  The exporter's measured basis comes from the cost profile (live decode speed × the profile's
  plain step time).
* ``--baseline-upstream``: the baseline and one speculative server up at the same time (both
  under one hold of the machine-wide vLLM lock), the exporter started with ``--upstream spec=URL
  --upstream base=URL2 --baseline-upstream base``. Per cell: warm-up on both, a fresh exporter,
  the cell benched in ``--rounds`` alternating rounds (ABBA: baseline then speculative, then
  speculative then baseline, ...; the same prompts; the exporter scraped every 2.5 s meanwhile),
  then a last scrape: its 10m window holds both, so the speedup has basis ``measured`` from the
  two servers' live decode speeds (no cost profile needed), with an interval that includes how
  each server's speed moved between the rounds (batch means over the fetches: issue #37).
  Alternating matters on a loaded machine: on 2026-12-01 the same baseline cell (copy, c = 4)
  ran at 67.7 tok/s in one pair and 48.7 tok/s 12 minutes later, so one baseline-then-speculative
  pair let the load's swings into the client's own ratio.

Per cell the JSON (``--out``, rewritten after every cell: an interrupted run keeps its cells)
and the table give: the client ratio (speculative / baseline output throughput, same prompts),
``specwatch_speedup{window="10m", k=<the server's k>}`` with its basis,
``specwatch_speedup_lower`` / ``specwatch_speedup_upper`` (same labels; null when the exporter
does not serve them), the drift ``specwatch_cost_profile_error_ratio{window="10m"}``, and the
checks: ``interval_contains_ratio`` (lower ≤ ratio ≤ upper), ``within_15_percent``
(|speedup / ratio − 1| ≤ 15 %), ``wrong_side_of_1`` (speedup and ratio on different sides of 1,
judged only where the ratio is outside 0.95–1.05) and ``interval_tight`` (upper / lower ≤ 1.35).
Exit status 0 when every cell is within 15 % and none is on the wrong side of 1. The table ends
with the coverage: in how many cells the measured 95 % interval holds the client ratio (issue #37
asks at least 90 % over runs); ``--coverage A.json B.json …`` prints it over several runs' files
(exit 0 at 90 % or more, 1 below, 2 for a file that is not a result).

``--load-hog N`` starts N CPU-burning processes for the whole run (the loaded-machine check) and
stops them (by pid) at the end.

Usage:  .venv/bin/python scripts/verify_speedup.py --cost-profile PROFILE.yaml [--out FILE]
        .venv/bin/python scripts/verify_speedup.py --baseline-upstream --server-command \\
            'vllm serve Qwen/Qwen3-8B --port {port} {spec_args}' \\
            --speculative-config '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":5}'
        .venv/bin/python scripts/verify_speedup.py --coverage RUN1/verify.json RUN2/verify.json
About 15 minutes on 2 cores for the embedded default (serialised with other real-vLLM users by
the vLLM lock).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from specwatch.bench.records import BenchResult
from specwatch.choosek.resultfile import SweepError
from specwatch.choosek.sweep import ServerConfig, build_configs, render_command, start_server, uses_speculation
from specwatch.common.files import atomic_write_json
from specwatch.common.params import parse_duration
from specwatch.common.processes import free_port, install_stop_signals, stop_process_group, wait_http
from specwatch.localvllm import server as localvllm_server
from specwatch.localvllm.server import VllmLock, VllmServer

SPECWATCH = Path(sys.executable).with_name("specwatch")
NGRAM_K4 = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
#: The exporter's window the checks read, and a short one beside it: the window engine keeps a record
#: every max(1 s, shortest window / 12), so the 30 s window makes it keep one every 2.5 s and the
#: measured interval's batch means (how each server's speed moved between the rounds) have the
#: cell's rounds to go on. 10 minutes: longer than a cell's rounds on 2 cores (a 5 m window lost the
#: first round of the slowest cells).
WINDOW = "10m"
SHORT_WINDOW = "30s"
#: Seconds between the poller's scrapes of each exporter while a cell runs (as Prometheus would
#: scrape it; the exporter fetches its upstreams only when scraped).
SCRAPE_INTERVAL = 2.5
#: The checks' thresholds (issue 23).
MAX_ERROR = 0.15
NEUTRAL_BAND = (0.95, 1.05)
MAX_INTERVAL_RATIO = 1.35


class UsageError(Exception):
    """A bad command line: one line on stderr, exit 2."""


def configs(model_dir: Path | None, spec_configs: list[str], template: str | None) -> list[ServerConfig]:
    """The speculative configurations: ``--speculative-config`` values (via the sweep's
    :func:`build_configs`), else ngram k = 4 and — on the embedded vLLM — draft_model with the
    draft equal to the target, k = 3. Raises UsageError for a bad config."""
    if spec_configs:
        try:
            return build_configs((), spec_configs, False)
        except SweepError as exc:
            raise UsageError(exc.message) from None
    out = [ServerConfig("ngram-k4", 4, dict(NGRAM_K4))]
    if template is None and model_dir is not None:
        out.append(ServerConfig("draft_model-k3", 3, {"method": "draft_model", "model": str(model_dir),
                                                      "num_speculative_tokens": 3}))
    return out


def bench(base_url: str, workload: str, conc: int, args, warmup: bool, result_dir: Path) -> float | None:
    """Client output throughput (tok/s) of one cell measured with ``specwatch bench`` (None for a
    warm-up, which sends one request per concurrency slot)."""
    cmd = [str(SPECWATCH), "bench", "--base-url", base_url, "--dataset-name", workload, "--max-concurrency", str(conc),
           "--num-prompts", str(conc if warmup else conc * args.prompts_per_concurrency), "--output-len", str(args.output_len),
           "--metrics-port", "0", "--no-progress", "--no-equivalence", "--seed", "0"]
    if warmup:
        cmd += ["--num-batches", "1", "--warmup-batches", "0", "--no-save-result"]
    else:
        cmd += ["--num-batches", str(args.num_batches), "--warmup-batches", "0", "--save-result", "--result-dir", str(result_dir)]
    before = set(result_dir.glob("*.json"))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"bench failed ({r.returncode}): {r.stderr[-1500:]}")
    if warmup:
        return None
    new = [p for p in result_dir.glob("*.json") if p not in before] or list(result_dir.glob("*.json"))
    newest = max(new, key=lambda p: p.stat().st_mtime)
    doc = BenchResult.load(newest)
    for c in doc.cells:
        if c.workload == workload and c.max_concurrency == conc and c.output_throughput is not None:
            return float(c.output_throughput)
    raise RuntimeError(f"no cell in {newest}")


def scrape(url: str) -> str:
    r = requests.get(url, timeout=30)
    r.raise_for_status()
    return r.text


def _sample(text: str, name: str, k: int, upstream: str | None) -> tuple[float, dict[str, str]] | None:
    for fam in text_string_to_metric_families(text):
        if fam.name != name:
            continue
        for s in fam.samples:
            if s.name != name:
                continue
            if s.labels.get("window") == WINDOW and s.labels.get("k") == str(k) and (
                    upstream is None or s.labels.get("upstream") == upstream):
                return s.value, s.labels
    return None


def live_speedup(text: str, k: int, upstream: str | None = None) -> dict[str, Any] | None:
    """``specwatch_speedup{window=WINDOW, k=k}`` (of ``upstream`` when given) with its basis, and
    ``specwatch_speedup_lower`` / ``_upper`` of the same labels (None when not served)."""
    got = _sample(text, "specwatch_speedup", k, upstream)
    if got is None:
        return None
    value, labels = got
    out: dict[str, Any] = {"value": value, "basis": labels.get("basis"), "lower": None, "upper": None}
    for side in ("lower", "upper"):
        for fam in text_string_to_metric_families(text):
            if fam.name != f"specwatch_speedup_{side}":
                continue
            for s in fam.samples:
                if all(s.labels.get(key) == v for key, v in labels.items() if key != "basis"):
                    out[side] = s.value
                    break
    return out


def drift(text: str, upstream: str | None = None) -> float | None:
    """``specwatch_cost_profile_error_ratio{window=WINDOW}`` (live step time / the profile's), if served."""
    for fam in text_string_to_metric_families(text):
        if fam.name == "specwatch_cost_profile_error_ratio":
            for s in fam.samples:
                if s.labels.get("window") == WINDOW and (upstream is None or s.labels.get("upstream") == upstream):
                    return s.value
    return None


def start_exporter(upstreams: list[str], profile: str | None, method: str | None,
                   baseline_upstream: str | None = None) -> tuple[subprocess.Popen, str]:
    """A fresh ``specwatch serve --window 30s --window 10m`` (:data:`WINDOW`) on a free port;
    (process, /metrics URL)."""
    eport = free_port()
    cmd = [str(SPECWATCH), "serve", "--window", SHORT_WINDOW, "--window", WINDOW, "--listen-address", f"127.0.0.1:{eport}",
           "--log-level", "warning"]
    for u in upstreams:
        cmd += ["--upstream", u]
    if baseline_upstream:
        cmd += ["--baseline-upstream", baseline_upstream]
    if profile:
        cmd += ["--cost-profile", profile]
    if method:
        cmd += ["--speculative-method", method]
    exp = subprocess.Popen(cmd, start_new_session=True)
    url = f"http://127.0.0.1:{eport}/metrics"
    try:
        wait_http(url, 30, exp, "specwatch serve", interval=0.2)  # raises NotReady naming it
    except BaseException:  # not ready, or interrupted (Ctrl-C, SIGTERM) while waiting: never leave it running
        stop_process_group(exp, 10)
        raise
    return exp, url


class Poller:
    """Scrapes each URL every ``interval`` seconds in a background thread while a cell runs, as
    Prometheus scrapes an exporter (the exporter fetches its upstreams only when scraped, so its
    window's records, and the measured interval's batch means, come from these scrapes). A failed
    scrape is counted, never raised. Use as a context manager."""

    def __init__(self, urls: list[str], interval: float = SCRAPE_INTERVAL):
        self.urls, self.interval = urls, interval
        self.scrapes = self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="verify-poller", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for u in self.urls:
                try:
                    requests.get(u, timeout=10).raise_for_status()
                    self.scrapes += 1
                except requests.RequestException:
                    self.failures += 1

    def __enter__(self) -> "Poller":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)


def interleaved_rounds(run_baseline, run_speculative, rounds: int) -> list[dict[str, Any]]:
    """Bench the two servers in ``rounds`` alternating rounds, ABBA order (round 0 baseline first,
    round 1 speculative first, ...), so that a load that rises or falls during the cell weighs on
    both sides alike. ``run_*``: callables returning one bench's output throughput (tok/s).
    Returns one dict per round: {"order", "baseline", "speculative"} (tok/s)."""
    out = []
    for i in range(rounds):
        if i % 2 == 0:
            b = run_baseline()
            s = run_speculative()
            order = "baseline,speculative"
        else:
            s = run_speculative()
            b = run_baseline()
            order = "speculative,baseline"
        out.append({"order": order, "baseline": b, "speculative": s})
    return out


def combined_throughput(rounds: list[dict[str, Any]], side: str) -> float:
    """Output throughput (tok/s) of one side over all rounds: every round generates the same
    tokens (same seeded prompts, fixed output length), so the combined throughput is the harmonic
    mean of the rounds' throughputs (total tokens / total time)."""
    vals = [float(r[side]) for r in rounds]
    return len(vals) / sum(1.0 / v for v in vals)


def round_ratios(rounds: list[dict[str, Any]]) -> list[float]:
    """Speculative / baseline throughput ratio of each round (their spread shows how much the
    machine's load moved the client's own reference during the cell)."""
    return [float(r["speculative"]) / float(r["baseline"]) for r in rounds]


def judge(ratio: float, sp: dict[str, Any] | None) -> dict[str, Any]:
    """The checks of one cell (see the module docstring); None where they cannot be judged.
    ``passes``: within 15 %, or the interval contains the ratio with upper / lower <= 1.35, and
    not on the wrong side of 1 (issue 22's done-when)."""
    out: dict[str, Any] = {"measured_ratio": ratio, "relative_error": None, "within_15_percent": None,
                           "wrong_side_of_1": None, "interval_contains_ratio": None, "interval_tight": None,
                           "passes": None}
    if not sp:
        return out
    live = sp["value"]
    out["relative_error"] = live / ratio - 1
    out["within_15_percent"] = abs(out["relative_error"]) <= MAX_ERROR
    outside = not (NEUTRAL_BAND[0] <= ratio <= NEUTRAL_BAND[1])
    out["wrong_side_of_1"] = outside and ((live < 1) != (ratio < 1))
    lo, hi = sp.get("lower"), sp.get("upper")
    if lo is not None and hi is not None:
        out["interval_contains_ratio"] = lo <= ratio <= hi
        out["interval_tight"] = lo > 0 and hi / lo <= MAX_INTERVAL_RATIO
    out["passes"] = bool((out["within_15_percent"] or (out["interval_contains_ratio"] and out["interval_tight"]))
                         and not out["wrong_side_of_1"])
    return out


def start_load_hogs(n: int) -> list[subprocess.Popen]:
    """N CPU-burning processes (each its own process group), for the loaded-machine check."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(n)]


def method_of(cfg: ServerConfig) -> str | None:
    sc = cfg.speculative_config or {}
    return str(sc.get("method") or ("draft_model" if sc.get("model") else "")) or None


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cost-profile", default=None, help="the cost profile (required without --baseline-upstream)")
    ap.add_argument("--other-profile", default=None, help="another machine's profile: its drift is recorded too")
    ap.add_argument("--out", type=Path, default=Path("results/verify-speedup.json"))
    ap.add_argument("--server-command", default=None,
                    help="the sweep's server command template, e.g. 'vllm serve MODEL --port {port} {spec_args}' "
                         "(default: the embedded CPU vLLM)")
    ap.add_argument("--speculative-config", action="append", default=[],
                    help="a --speculative-config JSON with num_speculative_tokens (repeatable)")
    ap.add_argument("--baseline-upstream", action="store_true",
                    help="baseline and speculative server up at once; the exporter's measured basis from both")
    ap.add_argument("--load-hog", type=int, default=0, metavar="N", help="N CPU-burning processes during the run")
    ap.add_argument("--workloads", default="copy,random-output")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--output-len", type=int, default=192)
    ap.add_argument("--prompts-per-concurrency", type=int, default=3)
    ap.add_argument("--num-batches", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2,
                    help="--baseline-upstream: alternating baseline/speculative rounds per cell, ABBA order "
                         "(default 2; the client ratio is over all rounds)")
    ap.add_argument("--startup-timeout", type=float, default=900.0)
    ap.add_argument("--only", default=None, help="comma-separated config names (default: all; 'baseline' included)")
    args = ap.parse_args(argv)
    try:
        args.concurrencies = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        raise UsageError(f"--concurrency: not a comma-separated list of integers: {args.concurrency!r}") from None
    if not args.concurrencies or min(args.concurrencies) < 1:
        raise UsageError(f"--concurrency: values must be >= 1, got {args.concurrency!r}")
    args.workload_list = [w for w in args.workloads.split(",") if w.strip()]
    if not args.workload_list:
        raise UsageError("--workloads is empty")
    if (args.output_len < 1 or args.prompts_per_concurrency < 1 or args.num_batches < 1 or args.rounds < 1
            or args.load_hog < 0):
        raise UsageError("--output-len, --prompts-per-concurrency, --num-batches and --rounds must be >= 1, "
                         "--load-hog >= 0")
    if args.cost_profile is None and not args.baseline_upstream:
        raise UsageError("--cost-profile is required without --baseline-upstream (the measured basis needs the "
                         "profile's plain step time, or a baseline upstream)")
    if args.server_command is not None:
        t = args.server_command
        if "{port}" not in t:
            raise UsageError("--server-command: the template must contain {port}")
        try:
            argv0 = render_command(t, 8000, NGRAM_K4)[0]
            if not uses_speculation(t):
                raise UsageError("--server-command has no {spec_args} (or {speculative_config}): the speculative "
                                 "servers would run without speculation")
        except SweepError as exc:
            raise UsageError(exc.message) from None
        except ValueError as exc:  # shlex: unbalanced quotes
            raise UsageError(f"--server-command: cannot split it like a shell: {exc}") from None
        if shutil.which(argv0) is None:
            raise UsageError(f"--server-command: program {argv0!r} not found")
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--coverage"]:
        if len(argv) < 2:
            print("verify_speedup: --coverage needs one or more result files (verify.json)", file=sys.stderr)
            return 2
        return combined_coverage([Path(a) for a in argv[1:]])
    try:
        args = parse_args(argv)
        model_dir = None
        if args.server_command is None:
            from specwatch.localvllm.model import default_model_dir, prepare_model
            model_dir = default_model_dir()
            prepare_model(model_dir)
        spec_cfgs = configs(model_dir, args.speculative_config, args.server_command)
    except UsageError as exc:
        print(f"verify_speedup: {exc}", file=sys.stderr)
        return 2
    only = None if not args.only else set(args.only.split(","))
    baseline = ServerConfig("baseline", 0, None)
    if only is not None:
        spec_cfgs = [c for c in spec_cfgs if c.name in only]
    out: dict[str, Any] = {
        "cost_profile": args.cost_profile, "mode": "baseline-upstream" if args.baseline_upstream else "sequential",
        "server": {"kind": "template" if args.server_command else "embedded",
                   "command_template": args.server_command and shlex.join(shlex.split(args.server_command))},
        "settings": {k: v for k, v in vars(args).items() if k not in ("out",)} | {"out": str(args.out)},
        "thresholds": {"max_error": MAX_ERROR, "neutral_band": list(NEUTRAL_BAND), "max_interval_ratio": MAX_INTERVAL_RATIO},
        "cells": [], "status": "running"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="specwatch-verify-"))
    hogs = start_load_hogs(args.load_hog)
    if hogs:
        print(f"[load] {len(hogs)} CPU-burning processes: pids {', '.join(str(h.pid) for h in hogs)}", flush=True)
    try:
        if args.baseline_upstream:
            rows = run_paired(args, spec_cfgs, baseline, model_dir, work, out)
        else:
            rows = run_sequential(args, spec_cfgs, baseline, model_dir, work, out, only)
        out["status"] = "complete"
    except KeyboardInterrupt:
        out["status"] = "interrupted"
        atomic_write_json(args.out, out)
        print(f"interrupted: finished cells are in {args.out}", file=sys.stderr)
        return 130
    except SweepError as exc:
        out["status"] = "failed"
        out["error"] = exc.message
        atomic_write_json(args.out, out)
        print(f"verify_speedup: {exc.message}", file=sys.stderr)
        return 1
    finally:
        for h in hogs:
            stop_process_group(h, 5)
    out["coverage"] = {"measured": coverage(rows), "calibrated": coverage(rows, "calibrated")}
    atomic_write_json(args.out, out)
    return print_table(rows, args.out)


def _server(cfg: ServerConfig, args, model_dir, work: Path, *, lock: bool = True, lock_path: Path | None = None):
    """The sweep's server start (embedded vLLM or the --server-command template) as a context
    manager. ``lock=False`` (template) / ``lock_path`` (embedded): the caller holds the
    machine-wide vLLM lock for both servers of the baseline-upstream mode."""
    log = work / f"{cfg.name}.log"
    status = lambda m: print(f"  {m}", flush=True)
    if args.server_command is None and lock_path is not None:
        return VllmServer(free_port(), model_dir=model_dir, speculative_config=cfg.speculative_config, log_path=log,
                          startup_timeout=args.startup_timeout, on_status=status, lock_path=lock_path)
    return start_server(cfg, template=args.server_command, port=None, host="127.0.0.1", log_path=log,
                        startup_timeout=args.startup_timeout, lock=lock, api_key=None,
                        model_dir=None if model_dir is None else str(model_dir), on_status=status)


def run_sequential(args, spec_cfgs, baseline, model_dir, work, out, only) -> list[dict[str, Any]]:
    """One server at a time: baseline, each speculative config, baseline again."""
    chosen = [baseline, *spec_cfgs, baseline]
    if only is not None:
        chosen = [c for c in chosen if c.name in only]
    for cfg in chosen:
        print(f"[{cfg.name}] starting the server", flush=True)
        with _server(cfg, args, model_dir, work) as srv:
            k, method = cfg.k, method_of(cfg)
            for wl in args.workload_list:
                for c in args.concurrencies:
                    bench(srv.base_url, wl, c, args, True, work)
                    profiles = [args.cost_profile] + ([args.other_profile] if args.other_profile else [])
                    exporters: list[tuple[subprocess.Popen, str]] = []
                    try:  # started inside the try: an interrupt between two starts stops the first
                        for p in profiles:
                            exporters.append(start_exporter([f"spec={srv.base_url}"], p, method))
                        time.sleep(1.5)  # past the exporters' freshness interval: the next scrape fetches anew
                        with Poller([url for _, url in exporters]):
                            thr = bench(srv.base_url, wl, c, args, False, work)
                        time.sleep(1.5)
                        texts = [scrape(url) for _, url in exporters]
                    finally:
                        for exp, _ in exporters:
                            stop_process_group(exp, 10)
                    sp = live_speedup(texts[0], k) if k else None
                    cell = {"config": cfg.name, "k": k, "workload": wl, "concurrency": c, "output_throughput": thr,
                            "exporter_speedup": sp, "drift": drift(texts[0]),
                            "other_profile_drift": drift(texts[1]) if len(texts) > 1 else None}
                    out["cells"].append(cell)
                    _judge_all(out)
                    atomic_write_json(args.out, out)
                    print(f"  {cfg.name} {wl} c={c}: {thr:.1f} tok/s; exporter speedup {sp}; drift {cell['drift']}, "
                          f"with the other profile {cell['other_profile_drift']}", flush=True)
    return [c for c in out["cells"] if c.get("measured_ratio") is not None]


def _judge_all(out: dict[str, Any]) -> None:
    """Per speculative cell: the ratio to the mean of the baseline runs so far, and the checks."""
    runs: dict[tuple[str, int], list[float]] = {}
    for c in out["cells"]:
        if c["config"] == "baseline":
            runs.setdefault((c["workload"], c["concurrency"]), []).append(c["output_throughput"])
    out["baseline_runs"] = {f"{w}/c={c}": v for (w, c), v in runs.items()}
    for c in out["cells"]:
        if c["config"] == "baseline":
            continue
        b = runs.get((c["workload"], c["concurrency"]))
        if b:
            c.update(judge(c["output_throughput"] / (sum(b) / len(b)), c["exporter_speedup"]))


def run_paired(args, spec_cfgs, baseline, model_dir, work, out) -> list[dict[str, Any]]:
    """Baseline and speculative server up at once; per cell baseline then speculative bench, one scrape."""
    for cfg in spec_cfgs:
        print(f"[{cfg.name}] starting the baseline and the speculative server (both up at once)", flush=True)
        with ExitStack() as stack:
            lock = VllmLock(localvllm_server.LOCK_PATH, on_wait=lambda m: print(f"  {m}", flush=True),
                            note="verify_speedup --baseline-upstream")
            lock.acquire()  # one hold of the machine-wide lock for both servers
            stack.callback(lock.release)
            private = work / "pair.lock"  # the embedded servers' own lock: the machine-wide one is held above
            base = stack.enter_context(_server(baseline, args, model_dir, work, lock=False, lock_path=private))
            spec = stack.enter_context(_server(cfg, args, model_dir, work, lock=False,
                                               lock_path=work / "pair-spec.lock"))
            for wl in args.workload_list:
                for c in args.concurrencies:
                    bench(base.base_url, wl, c, args, True, work)
                    bench(spec.base_url, wl, c, args, True, work)
                    exp = cal = None
                    try:  # started inside the try: an interrupt between the two starts stops the first
                        exp, url = start_exporter([f"spec={spec.base_url}", f"base={base.base_url}"],
                                                  args.cost_profile, method_of(cfg), baseline_upstream="base")
                        # with a profile, a second exporter reads the speculative server alone: its k is then
                        # `calibrated` (live step over the profile's relative cost), judged on the same cell
                        cal = (start_exporter([f"spec={spec.base_url}"], args.cost_profile, method_of(cfg))
                               if args.cost_profile else None)
                        time.sleep(1.5)
                        t_cell = time.monotonic()
                        with Poller([url] + ([cal[1]] if cal else [])):
                            rounds = interleaved_rounds(
                                partial(bench, base.base_url, wl, c, args, False, work),
                                partial(bench, spec.base_url, wl, c, args, False, work), args.rounds)
                        cell_seconds = time.monotonic() - t_cell
                        base_thr, spec_thr = combined_throughput(rounds, "baseline"), combined_throughput(rounds, "speculative")
                        time.sleep(1.5)
                        text = scrape(url)
                        cal_text = scrape(cal[1]) if cal else None
                    finally:
                        stop_process_group(exp, 10)  # (a no-op for None)
                        if cal:
                            stop_process_group(cal[0], 10)
                    sp = live_speedup(text, cfg.k, "spec")
                    cell = {"config": cfg.name, "k": cfg.k, "workload": wl, "concurrency": c,
                            "baseline_output_throughput": base_thr, "output_throughput": spec_thr,
                            "rounds": rounds, "round_ratios": round_ratios(rounds),
                            "exporter_speedup": sp, "drift": drift(text, "spec"), "other_profile_drift": None,
                            "cell_seconds": round(cell_seconds, 1), **judge(spec_thr / base_thr, sp)}
                    if cell_seconds > parse_duration(WINDOW):
                        print(f"  warning: the rounds took {cell_seconds:.0f} s, longer than the {WINDOW} window: the "
                              "exporter's value misses the first of them", flush=True)
                    if cal_text is not None:
                        csp = live_speedup(cal_text, cfg.k, "spec")
                        cell["calibrated"] = {"exporter_speedup": csp, "drift": drift(cal_text, "spec"),
                                              **judge(spec_thr / base_thr, csp)}
                    out["cells"].append(cell)
                    atomic_write_json(args.out, out)
                    print(f"  {cfg.name} {wl} c={c}: baseline {base_thr:.1f}, speculative {spec_thr:.1f} tok/s "
                          f"(round ratios {', '.join(f'{x:.3f}' for x in cell['round_ratios'])}); "
                          f"exporter speedup {sp}; drift {cell['drift']}", flush=True)
    return [c for c in out["cells"] if c.get("measured_ratio") is not None]


def print_table(rows: list[dict[str, Any]], out_path: Path) -> int:
    print(f"\n{'config':<16}{'workload':<15}{'c':>3}{'ratio':>8}{'speedup':>9}{'basis':>10}{'interval':>16}{'error':>8}"
          f"{'drift':>7}{'in int.':>8}{'<=15%':>6}{'side':>6}{'tight':>6}")
    bad = 0
    for c in rows:
        sp = c["exporter_speedup"] or {}
        ok = bool(c["within_15_percent"]) and not c["wrong_side_of_1"]
        bad += not ok
        iv = "-" if sp.get("lower") is None or sp.get("upper") is None else f"[{sp['lower']:.2f}, {sp['upper']:.2f}]"
        print(f"{c['config']:<16}{c['workload']:<15}{c['concurrency']:>3}{c['measured_ratio']:>8.3f}"
              f"{_fmt(sp.get('value'), '.3f'):>9}{str(sp.get('basis') or '-'):>10}{iv:>16}"
              f"{_fmt(None if c['relative_error'] is None else c['relative_error'] * 100, '.1f'):>7}%"
              f"{_fmt(c['drift']):>7}{_yn(c['interval_contains_ratio']):>8}{_yn(c['within_15_percent']):>6}"
              f"{_yn(None if c['wrong_side_of_1'] is None else not c['wrong_side_of_1']):>6}{_yn(c['interval_tight']):>6}"
              f"{'' if ok else '  <- off'}")
    print(f"\n{len(rows) - bad}/{len(rows)} cells within 15 % and on the right side of 1; results in {out_path}")
    print(coverage_line(coverage(rows), "measured"))
    cal = [c for c in rows if c.get("calibrated")]
    if cal:
        print("\nthe same cells, the exporter reading the speculative server alone with the profile (basis calibrated):")
        cbad = 0
        for c in cal:
            j = c["calibrated"]
            sp = j["exporter_speedup"] or {}
            cbad += not j["passes"]
            iv = "-" if sp.get("lower") is None or sp.get("upper") is None else f"[{sp['lower']:.2f}, {sp['upper']:.2f}]"
            print(f"{c['config']:<16}{c['workload']:<15}{c['concurrency']:>3}{c['measured_ratio']:>8.3f}"
                  f"{_fmt(sp.get('value'), '.3f'):>9}{str(sp.get('basis') or '-'):>11}{iv:>16}"
                  f"{_fmt(None if j['relative_error'] is None else j['relative_error'] * 100, '.1f'):>7}%"
                  f"{_fmt(j['drift']):>7}{_yn(j['interval_contains_ratio']):>8}{_yn(j['within_15_percent']):>6}"
                  f"{_yn(None if j['wrong_side_of_1'] is None else not j['wrong_side_of_1']):>6}{_yn(j['interval_tight']):>6}"
                  f"{'' if j['passes'] else '  <- off'}")
        print(f"{len(cal) - cbad}/{len(cal)} calibrated cells within 15 % or inside a tight interval (upper/lower <= 1.35), "
              "never on the wrong side of 1")
        bad += cbad
    return 0 if rows and not bad else 1


def coverage(rows: list[dict[str, Any]], basis: str = "measured") -> dict[str, Any]:
    """How often the exporter's 95 % interval of ``basis`` (``measured``: the first exporter,
    ``calibrated``: the one reading the speculative server alone) held the client ratio: {"basis",
    "cells" (cells whose value had that basis and an interval), "covered", "share" (None without
    cells), "missed": ["config workload c=…: ratio r outside [lo, hi]", …]}."""
    judged, covered, missed = 0, 0, []
    for c in rows:
        j = c if basis == "measured" else c.get("calibrated")
        if not j:
            continue
        sp = j.get("exporter_speedup") or {}
        if not str(sp.get("basis") or "").startswith(basis[:5]) or j.get("interval_contains_ratio") is None:
            continue
        judged += 1
        if j["interval_contains_ratio"]:
            covered += 1
        else:
            missed.append(f"{c['config']} {c['workload']} c={c['concurrency']}: ratio {c['measured_ratio']:.3f} outside "
                          f"[{sp['lower']:.3f}, {sp['upper']:.3f}]")
    return {"basis": basis, "cells": judged, "covered": covered, "share": covered / judged if judged else None,
            "missed": missed}


def coverage_line(cov: dict[str, Any], what: str) -> str:
    """``coverage: the measured interval holds the client ratio in 7 of 8 cells (87.5 %)`` plus the misses."""
    if not cov["cells"]:
        return f"coverage: no cell with a {what} interval"
    line = (f"coverage: the {what} 95 % interval holds the client ratio in {cov['covered']} of {cov['cells']} cells "
            f"({cov['share'] * 100:.1f} %; issue 37 asks at least 90 %)")
    return line + "".join(f"\n  missed: {m}" for m in cov["missed"])


def combined_coverage(paths: list[Path]) -> int:
    """``--coverage A.json B.json …``: the measured (and calibrated) intervals' coverage over the
    cells of several runs' result files together, and per file. Exit 0 when the measured share is
    at least 90 %, 1 when lower, 2 when a file cannot be read or holds no judged cell."""
    rows_all: list[dict[str, Any]] = []
    for p in paths:
        try:
            doc = json.loads(Path(p).read_text())
            rows = [c for c in doc["cells"] if c.get("measured_ratio") is not None]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"verify_speedup: --coverage {p}: not a verify_speedup result file ({exc})", file=sys.stderr)
            return 2
        hogs = (doc.get("settings") or {}).get("load_hog")
        print(f"{p} ({doc.get('mode')}, load hogs: {hogs}, status {doc.get('status')}): "
              + coverage_line(coverage(rows), "measured").removeprefix("coverage: "))
        rows_all += rows
    total = coverage(rows_all)
    print(f"all {len(paths)} runs: " + coverage_line(total, "measured").removeprefix("coverage: "))
    cal = coverage(rows_all, "calibrated")
    if cal["cells"]:
        print(f"all {len(paths)} runs: " + coverage_line(cal, "calibrated").removeprefix("coverage: "))
    if total["share"] is None:
        return 2
    return 0 if total["share"] >= 0.9 else 1


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else f"{x:{spec}}"


def _yn(x: bool | None) -> str:
    return "-" if x is None else ("yes" if x else "NO")


if __name__ == "__main__":
    # SIGTERM/SIGHUP act like Ctrl-C: the servers, the exporter and the load hogs are stopped on the
    # way out and the finished cells kept (status "interrupted", exit 130)
    install_stop_signals()
    sys.exit(main())
