"""``specwatch sweep``: run the load generator over server configurations × workloads × concurrencies.

A sweep starts one server per configuration — the baseline (no speculation) and one speculative
server per k (ngram, k ∈ {1, 2, 3, 4, 6, 8} by default) or per ``--speculative-config`` — waits
until it answers ``GET /v1/models``, records its start-up time and the KV-cache capacity it
reports (``vllm:cache_config_info``: ``num_gpu_blocks`` × ``block_size`` tokens, summed over
engines), runs every (workload, concurrency) cell with :func:`specwatch.bench.runner.run_bench`
(warm-up batches first; spec-decode values from the server's ``vllm:spec_decode_*`` counters),
and stops it before the next configuration starts (one server at a time: they would share the
CPU/GPU).

Servers come from the embedded vLLM (:mod:`specwatch.embedded`, the default; it holds
``flock /tmp/specwatch-vllm.lock`` while it runs) or from a command template
(``--server-command 'vllm serve MODEL --port {port} {spec_args}'``) for a GPU host.

Results: one JSON document (``specwatch_sweep_format`` 1) rewritten atomically after every
finished cell::

    {"specwatch_sweep_format": 1, "status": "running" | "complete" | "interrupted" | "failed",
     "settings": {...measurement settings...},
     "configs": [{"name", "k", "family", "speculative_config"}],
     "servers": [{"config", "k", "started_at", "startup_seconds", "kv_cache_tokens",
                  "num_gpu_blocks", "block_size", "command"}],
     "cells": [{"config", "k", "family", "workload", "max_concurrency", "finished_at",
                "summary": <bench cell summary: output_throughput, mean_tpot_ms, …>,
                "batches": [<bench batch records>]}]}

Running the same command again with the same ``--result-file`` resumes: finished cells are
skipped, and a server whose cells are all finished is not started. Measurement settings
(output length, prompts, batches, seed) must match the file's, else the sweep refuses to mix them.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from specwatch.fileio import atomic_write_json, stop_process_group
from specwatch.kchoice import Measurement, family_of

FORMAT = 1
DEFAULT_KS = (1, 2, 3, 4, 6, 8)
DEFAULT_WORKLOADS = ("copy", "random-output")
DEFAULT_CONCURRENCIES = (1, 4)
#: Defaults sized for the embedded vLLM on 2 CPU cores (a full default sweep: ~15 minutes).
DEFAULT_OUTPUT_LEN = 64
DEFAULT_PROMPTS_PER_CONCURRENCY = 2
DEFAULT_NUM_BATCHES = 2
DEFAULT_WARMUP_BATCHES = 1
#: Settings that must match between a result file and a resumed sweep.
MEASUREMENT_KEYS = ("output_len", "num_prompts", "prompts_per_concurrency", "num_batches",
                    "warmup_batches", "seed", "request_rate")


class SweepError(click.ClickException):
    """A sweep cannot start or continue (bad options, unreadable or mismatched result file,
    server that fails to start)."""


# --------------------------------------------------------------------------------------------
# Configurations
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerConfig:
    """One server configuration: ``name`` ("baseline", "ngram-k4", …), k (0 = no speculation)
    and the ``--speculative-config`` JSON object (None for the baseline)."""

    name: str
    k: int
    speculative_config: dict[str, Any] | None

    @property
    def family(self) -> str:
        return family_of(self.speculative_config)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "k": self.k, "family": self.family, "speculative_config": self.speculative_config}


def default_spec_base() -> dict[str, Any]:
    """The embedded server's ngram settings (prompt lookup 2–5) without k."""
    from specwatch.embedded import DEFAULT_SPECULATIVE_CONFIG

    d = dict(DEFAULT_SPECULATIVE_CONFIG)
    d.pop("num_speculative_tokens", None)
    return d


def build_configs(ks: Sequence[int], spec_configs: Sequence[str], baseline: bool) -> list[ServerConfig]:
    """The sweep's configurations: the baseline (if ``baseline``), then one per JSON in
    ``spec_configs`` (each must give ``num_speculative_tokens`` ≥ 1 and ``method`` or ``model``),
    or, when none is given, ngram at each k of ``ks``. Raises SweepError on bad input."""
    out: list[ServerConfig] = []
    if baseline:
        out.append(ServerConfig("baseline", 0, None))
    if spec_configs:
        for text in spec_configs:
            try:
                cfg = json.loads(text)
            except json.JSONDecodeError as exc:
                raise SweepError(f"--speculative-config is not valid JSON ({exc}): {text!r}") from None
            if not isinstance(cfg, dict):
                raise SweepError(f"--speculative-config must be a JSON object, got {text!r}")
            k = cfg.get("num_speculative_tokens")
            if not isinstance(k, int) or isinstance(k, bool) or k < 1:
                raise SweepError(f"--speculative-config needs num_speculative_tokens >= 1: {text!r}")
            if "method" not in cfg and "model" not in cfg:
                raise SweepError(f"--speculative-config needs a 'method' or a draft 'model': {text!r}")
            method = str(cfg.get("method") or "draft")
            out.append(ServerConfig(f"{method}-k{k}", k, cfg))
    else:
        base = default_spec_base()
        for k in ks:
            if k < 1:
                raise SweepError(f"k must be >= 1 (the baseline is k = 0 and always included), got {k}")
            out.append(ServerConfig(f"{base.get('method', 'spec')}-k{k}", int(k), {**base, "num_speculative_tokens": int(k)}))
    names: dict[str, int] = {}
    unique = []
    for c in out:  # distinct names for configs that share method and k
        n = names.get(c.name, 0)
        names[c.name] = n + 1
        unique.append(c if n == 0 else ServerConfig(f"{c.name}-{n + 1}", c.k, c.speculative_config))
    if not unique:
        raise SweepError("nothing to sweep: no baseline and no speculative configuration")
    return unique


def parse_int_list(text: str, what: str) -> tuple[int, ...]:
    """"1,2, 4" → (1, 2, 4). Raises SweepError on anything else."""
    try:
        vals = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise SweepError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not vals:
        raise SweepError(f"{what}: empty list")
    return vals


# --------------------------------------------------------------------------------------------
# Result file
# --------------------------------------------------------------------------------------------


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def load_result(path: str | Path) -> dict[str, Any]:
    """Read a sweep result file. Raises SweepError if it is unreadable or not a sweep result."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SweepError(f"cannot read {p}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise SweepError(f"{p} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("specwatch_sweep_format") != FORMAT:
        raise SweepError(f"{p} is not a specwatch sweep result (format {FORMAT})")
    if not isinstance(doc.get("cells"), list):
        raise SweepError(f"{p} has no 'cells' list")
    return doc


def cell_key(config: str, workload: str, concurrency: int) -> tuple[str, str, int]:
    return (config, workload, int(concurrency))


def measurements(doc: Mapping[str, Any]) -> list[Measurement]:
    """One :class:`specwatch.kchoice.Measurement` per finished cell of a sweep result (cells with
    no successful request are skipped)."""
    out = []
    for cell in doc.get("cells", []):
        summary = cell.get("summary") or {}
        thr = summary.get("output_throughput")
        if not thr:
            continue
        out.append(Measurement.from_record(summary, config=cell["config"], k=int(cell["k"]), family=cell.get("family", "")))
    return out


def servers_by_config(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The latest server start of each configuration (start-up time, KV capacity)."""
    out: dict[str, dict[str, Any]] = {}
    for s in doc.get("servers", []):
        out[s["config"]] = s
    return out


# --------------------------------------------------------------------------------------------
# KV capacity from /metrics
# --------------------------------------------------------------------------------------------


def kv_capacity(metrics_text: str) -> dict[str, Any]:
    """KV-cache capacity from ``vllm:cache_config_info`` (an info gauge whose labels are vLLM's
    CacheConfig fields): ``{"kv_cache_tokens": Σ num_gpu_blocks × block_size over engines,
    "num_gpu_blocks": Σ blocks, "block_size": …, "engines": n}``; values None when the metric or
    its labels are missing (non-vLLM servers). Parsed with ``prometheus_client.parser``."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Any] = {"kv_cache_tokens": None, "num_gpu_blocks": None, "block_size": None, "engines": 0}
    try:
        fams = list(text_string_to_metric_families(metrics_text))
    except Exception as exc:  # noqa: BLE001 - the parser raises several types on bad input
        out["error"] = f"unparsable /metrics: {exc}"
        return out
    blocks_total, tokens_total, sizes = 0, 0, set()
    for fam in fams:
        if fam.name not in ("vllm:cache_config_info", "vllm:cache_config"):
            continue
        for s in fam.samples:
            try:
                blocks = int(float(s.labels.get("num_gpu_blocks", "")))
                bs = int(float(s.labels.get("block_size", "")))
            except ValueError:
                continue
            blocks_total += blocks
            tokens_total += blocks * bs
            sizes.add(bs)
            out["engines"] += 1
    if out["engines"]:
        out.update(kv_cache_tokens=tokens_total, num_gpu_blocks=blocks_total,
                   block_size=sizes.pop() if len(sizes) == 1 else sorted(sizes))
    return out


# --------------------------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """An unused TCP port chosen by the OS."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


_SECRET_FLAGS = ("--api-key", "--hf-token", "--token", "--password", "--secret")
_SECRET_WORDS = ("key", "token", "secret", "password")


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with secrets replaced by ``***``: the value after (or ``=`` of) a flag such as
    ``--api-key`` / ``--hf-token``, and ``NAME=value`` words whose NAME mentions a key, token,
    secret or password. Used for everything a sweep writes about server commands."""
    out: list[str] = []
    hide_next = False
    for a in argv:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        flag, eq, _ = a.partition("=")
        low = flag.lower()
        if low in _SECRET_FLAGS:
            if eq:
                out.append(f"{flag}=***")
            else:
                out.append(a)
                hide_next = True
        elif eq and not a.startswith("-") and any(w in low for w in _SECRET_WORDS):
            out.append(f"{flag}=***")
        else:
            out.append(a)
    return out


def render_command(template: str, port: int, speculative_config: Mapping[str, Any] | None) -> list[str]:
    """argv from a ``--server-command`` template. Placeholders: ``{port}``, ``{spec_args}``
    (``--speculative-config '<json>'``, empty for the baseline) and ``{speculative_config}`` (the
    JSON alone, ``{}`` for the baseline — prefer ``{spec_args}``). Values are shell-quoted, then
    the command is split like a shell would (no shell runs). Raises SweepError for an unknown
    placeholder or an empty command."""
    spec_json = json.dumps(dict(speculative_config), separators=(",", ":"), sort_keys=True) if speculative_config else "{}"
    spec_args = f"--speculative-config {shlex.quote(spec_json)}" if speculative_config else ""
    try:
        text = template.format(port=int(port), spec_args=spec_args, speculative_config=shlex.quote(spec_json))
    except (KeyError, IndexError, ValueError) as exc:
        raise SweepError(f"--server-command: bad placeholder {exc} (use {{port}}, {{spec_args}}, {{speculative_config}})") from None
    argv = shlex.split(text)
    if not argv:
        raise SweepError("--server-command is empty")
    return argv


class TemplateServer:
    """A server started from a ``--server-command`` template, as a context manager.

    Starts the command in its own process group (output to ``log_path``), optionally holding the
    machine-wide vLLM lock (``lock=True``), polls ``GET {base_url}/v1/models`` until it answers
    200 with at least one model, and on exit sends SIGTERM to the group (SIGKILL after
    ``stop_timeout`` s). Attributes as :class:`specwatch.embedded.VllmServer`: ``base_url``,
    ``metrics_url``, ``startup_seconds``, ``command``, ``log_path``, ``served_model_name`` (the
    first model id listed).

    Raises (from ``__enter__``): SweepError when the process exits or is not ready in
    ``startup_timeout`` s (the message carries the log's tail).
    """

    def __init__(self, argv: list[str], port: int, *, host: str = "127.0.0.1", log_path: Path,
                 startup_timeout: float = 900.0, stop_timeout: float = 30.0, lock: bool = True,
                 api_key: str | None = None):
        self.command = argv
        self.port = port
        self.base_url = f"http://{host}:{port}"
        self.metrics_url = self.base_url + "/metrics"
        self.log_path = Path(log_path)
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.startup_seconds: float | None = None
        self.served_model_name: str | None = None
        self.process: subprocess.Popen | None = None
        self._api_key = api_key
        self._lock = None
        if lock:
            from specwatch.embedded import VllmLock

            self._lock = VllmLock()
        self._log = None

    def __enter__(self) -> TemplateServer:
        import requests

        if self._lock is not None:
            self._lock.acquire()
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")
            t0 = time.monotonic()
            self.process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            while True:
                rc = self.process.poll()
                if rc is not None:
                    raise SweepError(f"server exited with code {rc} during start-up: {shlex.join(redact_argv(self.command))}\n"
                                     f"log {self.log_path}:\n{_tail(self.log_path)}")
                try:
                    r = requests.get(self.base_url + "/v1/models", timeout=2, headers=headers)
                    if r.status_code == 200:
                        data = r.json().get("data") or []
                        if data:
                            self.served_model_name = data[0].get("id")
                            break
                except (requests.RequestException, ValueError):
                    pass
                if time.monotonic() - t0 > self.startup_timeout:
                    raise SweepError(f"server not ready on {self.base_url} after {self.startup_timeout:.0f} s\n"
                                     f"log {self.log_path}:\n{_tail(self.log_path)}")
                time.sleep(0.25)
            self.startup_seconds = time.monotonic() - t0
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            stop_process_group(self.process, self.stop_timeout)
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
            if self._lock is not None:
                self._lock.release()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = Path(path).read_bytes()[-32768:].decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@contextmanager
def start_server(cfg: ServerConfig, *, template: str | None, port: int | None, host: str,
                 log_path: Path, startup_timeout: float, lock: bool, api_key: str | None,
                 model_dir: str | None, on_status) -> Iterator[Any]:
    """Start the server of ``cfg`` (embedded vLLM, or ``template``) and yield it while it runs."""
    p = port or free_port(host)
    if template is None:
        from specwatch.embedded import SpecwatchEmbeddedError, VllmServer

        srv = VllmServer(p, model_dir=model_dir, speculative_config=cfg.speculative_config, host=host,
                         log_path=log_path, startup_timeout=startup_timeout, on_status=on_status)
        try:
            srv.start()
        except SpecwatchEmbeddedError as exc:
            raise SweepError(f"{cfg.name}: {exc}") from None
        try:
            yield srv
        finally:
            srv.stop()
    else:
        srv = TemplateServer(render_command(template, p, cfg.speculative_config), p, host=host, log_path=log_path,
                             startup_timeout=startup_timeout, lock=lock, api_key=api_key)
        with srv:
            yield srv


def read_metrics(url: str, api_key: str | None = None) -> str | None:
    """GET a /metrics URL; None when it cannot be read."""
    import requests

    try:
        r = requests.get(url, timeout=10, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
        return r.text if r.status_code == 200 else None
    except requests.RequestException:
        return None


# --------------------------------------------------------------------------------------------
# The sweep
# --------------------------------------------------------------------------------------------


@dataclass
class SweepPlan:
    """What to run and how to measure it (see :func:`run_sweep`)."""

    configs: list[ServerConfig]
    workloads: tuple[str, ...]
    concurrencies: tuple[int, ...]
    output_len: int
    num_prompts: int | None
    prompts_per_concurrency: int
    num_batches: int
    warmup_batches: int
    seed: int
    request_rate: float = math.inf

    def prompts_for(self, concurrency: int) -> int:
        return self.num_prompts or max(1, self.prompts_per_concurrency * concurrency)

    def settings(self) -> dict[str, Any]:
        return {
            "workloads": list(self.workloads),
            "concurrencies": list(self.concurrencies),
            "output_len": self.output_len,
            "num_prompts": self.num_prompts,
            "prompts_per_concurrency": self.prompts_per_concurrency,
            "num_batches": self.num_batches,
            "warmup_batches": self.warmup_batches,
            "seed": self.seed,
            "request_rate": "inf" if math.isinf(self.request_rate) else self.request_rate,
        }


def _merge_doc(path: Path, plan: SweepPlan, server_info: Mapping[str, Any]) -> dict[str, Any]:
    if path.exists():
        doc = load_result(path)
        old = doc.get("settings") or {}
        new = plan.settings()
        diff = [k for k in MEASUREMENT_KEYS if k in old and old[k] != new[k]]
        if diff:
            raise SweepError(
                f"{path} was measured with different settings ({', '.join(f'{k}: {old[k]!r} vs {new[k]!r}' for k in diff)}); "
                "use another --result-file or the same options"
            )
        # extend the lists of workloads/concurrencies/configs; keep what is there
        doc["settings"] = {**old, **new,
                           "workloads": list(dict.fromkeys([*old.get("workloads", []), *new["workloads"]])),
                           "concurrencies": sorted(set(old.get("concurrencies", [])) | set(new["concurrencies"]))}
        known = {c["name"] for c in doc.get("configs", [])}
        doc["configs"] = doc.get("configs", []) + [c.to_dict() for c in plan.configs if c.name not in known]
        doc.setdefault("servers", [])
        doc["resumed_at"] = doc.get("resumed_at", []) + [_now()]
        return doc
    return {
        "specwatch_sweep_format": FORMAT,
        "status": "running",
        "created_at": _now(),
        "updated_at": _now(),
        "settings": plan.settings(),
        "server": dict(server_info),
        "configs": [c.to_dict() for c in plan.configs],
        "servers": [],
        "cells": [],
    }


def run_sweep(
    plan: SweepPlan,
    result_file: Path,
    *,
    template: str | None = None,
    port: int | None = None,
    host: str = "127.0.0.1",
    log_dir: Path | None = None,
    startup_timeout: float = 900.0,
    lock: bool = True,
    api_key: str | None = None,
    model_dir: str | None = None,
    progress: bool = True,
    echo=print,
) -> dict[str, Any]:
    """Run (or resume) a sweep and return the result document (also in ``result_file``).

    Raises SweepError (bad/mismatched result file, server that does not start) and
    KeyboardInterrupt (after writing the file with status "interrupted").
    """
    from specwatch.bench.runner import BenchConfig, BenchConfigError, BenchInterrupted, run_bench
    from specwatch.bench.workloads import WorkloadError, WorkloadOptions

    result_file = Path(result_file)
    log_dir = Path(log_dir) if log_dir else result_file.with_name(result_file.stem + "-logs")
    server_info = {"kind": "template" if template else "embedded",
                   "command_template": None if template is None else shlex.join(redact_argv(shlex.split(template)))}
    doc = _merge_doc(result_file, plan, server_info)
    done = {cell_key(c["config"], c["workload"], c["max_concurrency"]) for c in doc["cells"]}
    options = WorkloadOptions(output_len=plan.output_len, seed=plan.seed)

    def save(status: str) -> None:
        doc["status"] = status
        doc["updated_at"] = _now()
        atomic_write_json(result_file, doc)

    save("running")
    try:
        for cfg in plan.configs:
            todo = [(wl, c) for wl in plan.workloads for c in plan.concurrencies
                    if cell_key(cfg.name, wl, c) not in done]
            if not todo:
                echo(f"{cfg.name}: all {len(plan.workloads) * len(plan.concurrencies)} cells already in {result_file}, skipped")
                continue
            echo(f"{cfg.name}: starting the server ({len(todo)} cells to run)")
            log_path = log_dir / f"{cfg.name}.log"
            with start_server(cfg, template=template, port=port, host=host, log_path=log_path,
                              startup_timeout=startup_timeout, lock=lock, api_key=api_key,
                              model_dir=model_dir, on_status=echo) as srv:
                kv = kv_capacity(read_metrics(srv.metrics_url, api_key) or "")
                start = {"config": cfg.name, "k": cfg.k, "started_at": _now(),
                         "startup_seconds": srv.startup_seconds, "command": redact_argv(srv.command),
                         "log": str(log_path), **kv}
                doc["servers"].append(start)
                save("running")
                kvs = "unknown" if kv["kv_cache_tokens"] is None else f"{kv['kv_cache_tokens']} tokens"
                echo(f"{cfg.name}: ready in {srv.startup_seconds:.1f} s, KV-cache capacity {kvs}")
                for wl, c in todo:
                    try:
                        bcfg = BenchConfig(
                            base_url=srv.base_url, role="baseline" if cfg.k == 0 else "speculative",
                            served_model_name=getattr(srv, "served_model_name", None),
                            workloads=(wl,), concurrencies=(c,), num_prompts=plan.prompts_for(c),
                            num_batches=plan.num_batches, warmup_batches=plan.warmup_batches,
                            request_rate=plan.request_rate, options=options, api_key=api_key,
                            equivalence=False, save_result=False, progress=progress,
                        )
                    except (BenchConfigError, WorkloadError) as exc:
                        raise SweepError(str(exc)) from None
                    try:
                        res = run_bench(bcfg)
                    except BenchInterrupted:
                        raise KeyboardInterrupt from None
                    cells = res.summary()
                    if not cells:
                        raise SweepError(f"{cfg.name} {wl} c={c}: no measured batch")
                    summary = cells[0].record()
                    doc["cells"].append({
                        "config": cfg.name, "k": cfg.k, "family": cfg.family, "workload": wl,
                        "max_concurrency": c, "finished_at": _now(), "summary": summary,
                        "batches": [b.record() for b in res.batches],
                    })
                    done.add(cell_key(cfg.name, wl, c))
                    save("running")
                    acc = summary.get("spec_decode_acceptance_rate")
                    echo(f"  {cfg.name} {wl} c={c}: {summary['output_throughput']:.1f} tok/s"
                         + ("" if acc is None else f", acceptance {acc:.1f} %")
                         + (f", {summary['failed']} failed" if summary.get("failed") else ""))
        save("complete")
    except KeyboardInterrupt:
        save("interrupted")
        raise
    except BaseException:
        save("failed")
        raise
    return doc


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def check_writable(path: str | Path, what: str) -> None:
    """Fail early (click.ClickException, one line) when ``path`` cannot be written: its nearest
    existing ancestor is not a directory, or that directory (or an existing ``path``) is not
    writable. For an existing parent directory the check creates and removes a temporary file
    there (the only test that also holds for root). Creates nothing that stays."""
    import os
    import tempfile

    p = Path(path)
    if p.exists() and p.is_dir():
        raise click.ClickException(f"cannot write {what} {p}: it is a directory")
    if p.exists() and not os.access(p, os.W_OK):
        raise click.ClickException(f"cannot write {what} {p}: permission denied")
    anc = p.parent if str(p.parent) else Path(".")
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise click.ClickException(f"cannot write {what} {p}: {anc} is not a directory")
    if anc == (p.parent if str(p.parent) else Path(".")):
        try:
            with tempfile.NamedTemporaryFile(dir=anc, prefix=".specwatch-write-check-"):
                pass
        except OSError as exc:
            raise click.ClickException(f"cannot write {what} {p}: {exc.strerror or exc}") from None
    elif not os.access(anc, os.W_OK | os.X_OK):
        raise click.ClickException(f"cannot write {what} {p}: {anc} is not writable")


def check_dir_writable(path: str | Path, what: str) -> None:
    """As :func:`check_writable` for a directory that may not exist yet."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise click.ClickException(f"cannot use {what} {p}: it is not a directory")
    check_writable(p / ".specwatch-write-check", what)


# click callbacks: flag errors exit 2 with a Usage line and the option's name

def _int_list_cb(lo: int):
    def cb(ctx, param, value):
        if value is None:
            return None
        try:
            vals = parse_int_list(value, param.opts[0])
        except SweepError as exc:
            raise click.BadParameter(exc.message) from None
        bad = [v for v in vals if v < lo]
        if bad:
            raise click.BadParameter(f"every value must be >= {lo}, got {', '.join(map(str, bad))}")
        return vals
    return cb


def _spec_configs_cb(ctx, param, value):
    for text in value or ():
        try:
            build_configs((), (text,), False)
        except SweepError as exc:
            raise click.BadParameter(exc.message.removeprefix("--speculative-config ")) from None
    return value


def _workloads_cb(ctx, param, value):
    from specwatch.bench.workloads import WORKLOADS

    wls = tuple(w for w in value.replace(" ", "").split(",") if w)
    unknown = [w for w in wls if w not in WORKLOADS]
    if not wls or unknown:
        raise click.BadParameter(f"unknown workload(s) {', '.join(unknown) or repr(value)}; choose from {', '.join(WORKLOADS)}")
    return wls


def _server_command_cb(ctx, param, value):
    if value is None:
        return None
    if "{port}" not in value:
        raise click.BadParameter("the template must contain {port} (the sweep picks the port of each server)")
    try:
        render_command(value, 8000, {"method": "ngram", "num_speculative_tokens": 1})
    except SweepError as exc:
        raise click.BadParameter(exc.message.removeprefix("--server-command").lstrip(": ")) from None
    except ValueError as exc:  # shlex: unbalanced quotes
        raise click.BadParameter(f"cannot split it like a shell: {exc}") from None
    return value


@click.command("sweep")
@click.option("--result-file", type=click.Path(dir_okay=False, path_type=Path), default=Path("specwatch-sweep.json"),
              show_default=True, help="One JSON file with every cell; rerun with the same file to resume.")
@click.option("--k", "ks", default=",".join(map(str, DEFAULT_KS)), show_default=True, callback=_int_list_cb(1),
              help="Comma-separated num_speculative_tokens for ngram servers (ignored with --speculative-config).")
@click.option("--speculative-config", "spec_configs", multiple=True, callback=_spec_configs_cb,
              help="A --speculative-config JSON (with num_speculative_tokens); repeat for several servers.")
@click.option("--baseline/--no-baseline", default=True, show_default=True, help="Include a server without speculation (k = 0).")
@click.option("--workloads", default=",".join(DEFAULT_WORKLOADS), show_default=True, callback=_workloads_cb,
              help="Comma-separated workloads of the load generator (copy, word-chain, random-output, code-return, explain, random-words).")
@click.option("--concurrency", "concurrencies", default=",".join(map(str, DEFAULT_CONCURRENCIES)), show_default=True, callback=_int_list_cb(1),
              help="Comma-separated max concurrencies.")
@click.option("--output-len", type=click.IntRange(min=1), default=DEFAULT_OUTPUT_LEN, show_default=True, help="Output tokens per request.")
@click.option("--num-prompts", type=click.IntRange(min=1), default=None, help="Requests per batch (default: --prompts-per-concurrency × concurrency).")
@click.option("--prompts-per-concurrency", type=click.IntRange(min=1), default=DEFAULT_PROMPTS_PER_CONCURRENCY, show_default=True)
@click.option("--num-batches", type=click.IntRange(min=1), default=DEFAULT_NUM_BATCHES, show_default=True, help="Measured batches per cell.")
@click.option("--warmup-batches", type=click.IntRange(min=0), default=DEFAULT_WARMUP_BATCHES, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--server-command", default=None, callback=_server_command_cb,
              help="Server command template with {port} and {spec_args} (or {speculative_config}), e.g. "
                   "\"vllm serve MODEL --port {port} {spec_args}\". Default: the embedded vLLM (CPU).")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Server port (default: a free port for each server).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--model-dir", default=None, help="Embedded vLLM: the prepared model directory (default: prepare it).")
@click.option("--startup-timeout", type=click.FloatRange(min=0, min_open=True), default=900.0, show_default=True, help="Seconds to wait for each server.")
@click.option("--lock/--no-lock", default=True, show_default=True,
              help="Hold flock /tmp/specwatch-vllm.lock while a template server runs (the embedded one always does).")
@click.option("--api-key", envvar=["SPECWATCH_API_KEY", "OPENAI_API_KEY"], default=None, show_envvar=True,
              help="Bearer key for the servers (never written or logged).")
@click.option("--log-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Server logs (default: <result-file stem>-logs/ beside it).")
@click.option("--progress/--no-progress", default=True, show_default=True)
def sweep(result_file, ks, spec_configs, baseline, workloads, concurrencies, output_len, num_prompts,
          prompts_per_concurrency, num_batches, warmup_batches, seed, server_command, port, host, model_dir,
          startup_timeout, lock, api_key, log_dir, progress) -> None:
    """Run the load generator over server configurations × workloads × concurrencies.

    Default: the embedded vLLM (SmolLM2-135M on CPU) as a baseline and with ngram speculation at
    k = 1, 2, 3, 4, 6, 8; workloads copy and random-output; concurrency 1 and 4; 64-token outputs —
    sized for 2 CPU cores. Then: specwatch advise RESULT, specwatch report RESULT.
    """
    try:
        configs = build_configs(ks, spec_configs, baseline)
    except SweepError as exc:
        raise click.UsageError(exc.message) from None
    wls, concs = workloads, concurrencies
    check_writable(result_file, "--result-file")
    check_dir_writable(log_dir or result_file.with_name(result_file.stem + "-logs"), "--log-dir")
    plan = SweepPlan(configs, wls, concs, output_len, num_prompts, prompts_per_concurrency, num_batches,
                     warmup_batches, seed)
    echo = click.echo
    if server_command is None:
        echo("specwatch sweep: embedded vLLM on CPU; the defaults (64-token outputs, 2×concurrency prompts per "
             "batch, 1 warm-up + 2 measured batches, concurrency 1,4) are sized for 2 cores. This run: "
             f"{output_len}-token outputs, {prompts_per_concurrency}×concurrency prompts per batch, "
             f"{warmup_batches} warm-up + {num_batches} measured batches, concurrency {','.join(map(str, concs))}. "
             "CPU numbers are noisy: compare within one sweep.")
    echo(f"configs: {', '.join(c.name for c in configs)}; workloads: {', '.join(wls)}; "
         f"concurrency: {', '.join(map(str, concs))}; results: {result_file}")
    from specwatch.fileio import install_stop_signals

    install_stop_signals()
    try:
        run_sweep(plan, result_file, template=server_command, port=port, host=host, log_dir=log_dir,
                  startup_timeout=startup_timeout, lock=lock, api_key=api_key, model_dir=model_dir,
                  progress=progress, echo=echo)
    except KeyboardInterrupt:
        echo(f"interrupted: finished cells are in {result_file}; run the same command to resume", err=True)
        sys.exit(130)
    echo(f"sweep complete: {result_file}\nnext: specwatch advise {result_file}; specwatch report {result_file}")
