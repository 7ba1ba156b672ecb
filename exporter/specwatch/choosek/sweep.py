"""``specwatch sweep``: run the load generator over server configurations × workloads × concurrencies.

A sweep starts one server per configuration — the baseline (no speculation) and one speculative
server per k (ngram, k ∈ {1, 2, 3, 4, 6, 8} by default) or per ``--speculative-config`` — waits
until it answers ``GET /v1/models``, records its start-up time and the KV-cache capacity it
reports (``vllm:cache_config_info``: ``num_gpu_blocks`` × ``block_size`` tokens, summed over
engines), runs every (workload, concurrency) cell with :func:`specwatch.bench.runner.run_bench`
(warm-up batches first; then at least ``num_batches`` measured batches and, with ``target_ci``,
more until the 95 % interval of the cell's throughput is within ``target_ci`` of its mean or
``max_batches`` ran; spec-decode values from the server's ``vllm:spec_decode_*`` counters),
and stops it before the next configuration starts.

Two modes. **Paired** (the default, issue #37): the baseline server stays up beside each
speculative server and every cell runs in alternating rounds on the same prompts (batch i on both
servers back to back, ABBA order: ``BenchConfig.paired``), so a drift of the host weighs on both
sides alike and ``target_ci`` applies to the paired ratio's interval; only one server is loaded at
a time. On the embedded default the sweep holds the machine-wide vLLM lock once for both servers.
The speculative cell stores the baseline's batches measured beside it (``baseline_batches``,
``mode: "paired"``); the baseline's own cell holds the batches it served beside the first
configuration measured there (``paired_with``). **Sequential** (``--sequential``, for hosts that
cannot hold two servers; every file written before paired mode): one server at a time, each cell
measured alone; the cells carry no ``mode``.

**A/A starts** (``--aa-starts N``, issue #37): ``aa-1`` … ``aa-N`` are the baseline started
again and measured beside it exactly as a speculative configuration is (``aa-1`` right after the
baseline, the others last); their true ratio is 1, and their cells give the between-starts spread
advise, report and calibrate add to their intervals (:func:`specwatch.choosek.resultfile.start_spread`).

Servers come from the embedded vLLM (:mod:`specwatch.localvllm.server`, the default; it holds
``flock /tmp/specwatch-vllm.lock`` while it runs) or from a command template
(``--server-command 'vllm serve MODEL --port {port} {spec_args}'``) for a GPU host.

Results: one JSON document (``specwatch_sweep_format`` 1; held and written as its typed record,
:class:`specwatch.choosek.records.SweepResult`) rewritten atomically after every finished cell::

    {"specwatch_sweep_format": 1,
     "status": "running" | "complete" | "incomplete" | "interrupted" | "failed",
     "settings": {...measurement settings...},
     "server": {"kind": "embedded" | "template", "command_template": <redacted template> | null},
     "configs": [{"name", "k", "family", "speculative_config", "drafter" (optional: the --drafter
                  label of a draft_model configuration; readers that do not know it ignore it),
                  "aa" (optional: true on an A/A start)}],
     "servers": [{"config", "k", "started_at", "startup_seconds", "kv_cache_tokens",
                  "num_gpu_blocks", "block_size", "command"}],
     "cells": [{"config", "k", "family", "workload", "max_concurrency", "finished_at",
                "summary": <bench cell summary: output_throughput, mean_tpot_ms, …,
                            output_throughput_ci95 (the 95 % interval of the throughput)>,
                "batches": [<bench batch records>], "server_exited": <exit code, only if the
                server died during the cell>, "mode": "paired" (paired cells only),
                "baseline_batches": [<the baseline's batches beside it>] (paired speculative cells),
                "paired_with": <configuration> (paired baseline cells)}]}

A cell with failed requests (``summary.failed`` > 0) or whose server died is kept in the file but
does not count as finished: :func:`measurements` leaves it out, :func:`failed_cells` describes it,
a resumed sweep measures it again (replacing the record) and the sweep ends "incomplete".

Running the same command again with the same ``--result-file`` resumes: finished cells are
skipped, and a server whose cells are all finished is not started. A server an earlier sweep of
the file left running (the sweep was killed with SIGKILL before it could stop it; on Linux its
server gets SIGTERM then, but the server's own children may stay) is stopped first: each server's
process group (pid and start time) is recorded while it runs (:class:`ServerRecord`). Measurement settings
(output length, prompts, batches, seed), the server command template and the speculative config
of every configuration name must match the file's, else the sweep refuses to mix them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import statistics
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from specwatch.bench.runner import BenchConfig, BenchConfigError, BenchInterrupted, run_bench
from specwatch.bench.workloads import WorkloadError, WorkloadOptions, load_sharegpt
from specwatch.choosek.model import family_of
from specwatch.bench.records import ThroughputInterval
from specwatch.choosek.records import ServerSource, ServerStart, SweepCell, SweepConfig, SweepResult, SweepSettings
from specwatch.choosek.resultfile import SweepError, _now, cell_key, load_sweep, result_file_lock
from specwatch.common.files import atomic_write_json, log_tail
from specwatch.common.processes import (ManagedProcess, StartFailed, free_port, group_members, listen_error,
                                         process_start_time, stop_recorded_group)
from specwatch.localvllm import server as localvllm_server
from specwatch.localvllm.model import SpecwatchEmbeddedError
from specwatch.localvllm.server import DEFAULT_SPECULATIVE_CONFIG, LockTimeout, VllmLock, VllmServer
from specwatch.specdecode.decision import format_interval, format_ratio, paired_ratio

DEFAULT_KS = (1, 2, 3, 4, 6, 8)
DEFAULT_WORKLOADS = ("copy", "random-output")
DEFAULT_CONCURRENCIES = (1, 4)
#: Defaults sized for the embedded vLLM on 2 CPU cores (a full default sweep: ~15 minutes).
DEFAULT_OUTPUT_LEN = 64
DEFAULT_PROMPTS_PER_CONCURRENCY = 2
DEFAULT_NUM_BATCHES = 2
DEFAULT_WARMUP_BATCHES = 1
#: Noise-aware cells: more measured batches until the 95 % interval of the cell's throughput is
#: within 5 % of its mean (relative half width), at most DEFAULT_MAX_BATCHES measured batches.
DEFAULT_TARGET_CI = 0.05
DEFAULT_MAX_BATCHES = 6
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
    #: The drafter's label for method draft_model configurations made by ``--drafter`` (else None).
    drafter: str | None = None
    #: An A/A start (``--aa-starts``): the baseline again (k 0, no speculation), measured beside
    #: the baseline as a speculative configuration is; its cells measure the between-starts spread.
    aa: bool = False

    @property
    def family(self) -> str:
        return family_of(self.speculative_config)

    @property
    def is_baseline(self) -> bool:
        """The baseline itself (k 0, no speculation, not an A/A start)."""
        return self.k == 0 and not self.speculative_config and not self.aa

    def to_dict(self) -> dict[str, Any]:
        d = {"name": self.name, "k": self.k, "family": self.family, "speculative_config": self.speculative_config}
        if self.drafter is not None:
            d["drafter"] = self.drafter  # optional key (format 1 readers ignore it)
        if self.aa:
            d["aa"] = True  # optional key
        return d


def default_spec_base() -> dict[str, Any]:
    """The embedded server's ngram settings (prompt lookup 2–5) without k."""
    d = dict(DEFAULT_SPECULATIVE_CONFIG)
    d.pop("num_speculative_tokens", None)
    return d


def build_configs(ks: Sequence[int], spec_configs: Sequence[str], baseline: bool,
                  drafters: Sequence[tuple[str, str]] = (), aa_starts: int = 0) -> list[ServerConfig]:
    """The sweep's configurations: the baseline (if ``baseline``), then ``aa-1`` (the first of
    ``aa_starts`` A/A starts: the baseline again, measured beside it as a speculative server is;
    the others ``aa-2`` … come last, so the A/A starts span the sweep), then one ``method: draft_model``
    server per drafter × k of ``ks`` (``drafters``: (label, model path or name) pairs, named
    ``draft-<label>-k<k>``), then one per JSON in ``spec_configs`` (each must give
    ``num_speculative_tokens`` ≥ 1 and ``method`` or ``model``), or, when neither drafters nor
    configs are given, ngram at each k of ``ks``. Raises SweepError on bad input."""
    out: list[ServerConfig] = []
    if baseline:
        out.append(ServerConfig("baseline", 0, None))
    for label, model in drafters:
        for k in ks:
            if k < 1:
                raise SweepError(f"k must be >= 1 (the baseline is k = 0 and always included), got {k}")
            out.append(ServerConfig(f"draft-{label}-k{k}", int(k),
                                    {"method": "draft_model", "model": str(model), "num_speculative_tokens": int(k)}, label))
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
    elif not drafters:
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
        unique.append(c if n == 0 else ServerConfig(f"{c.name}-{n + 1}", c.k, c.speculative_config, c.drafter))
    if not unique:
        raise SweepError("nothing to sweep: no baseline and no speculative configuration")
    if isinstance(aa_starts, bool) or not isinstance(aa_starts, int) or aa_starts < 0:
        raise SweepError(f"--aa-starts must be an integer >= 0, got {aa_starts!r}")
    if aa_starts:
        if not baseline:
            raise SweepError("--aa-starts needs the baseline (an A/A start is measured beside it): drop --no-baseline")
        aa = [ServerConfig(f"aa-{i}", 0, None, aa=True) for i in range(1, aa_starts + 1)]
        unique = unique[:1] + aa[:1] + unique[1:] + aa[1:]
    return unique


# --------------------------------------------------------------------------------------------
# Result file
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# KV capacity from /metrics
# --------------------------------------------------------------------------------------------


def kv_capacity(metrics_text: str) -> dict[str, Any]:
    """KV-cache capacity from ``vllm:cache_config_info`` (an info gauge whose labels are vLLM's
    CacheConfig fields): ``{"kv_cache_tokens": Σ num_gpu_blocks × block_size over engines,
    "num_gpu_blocks": Σ blocks, "block_size": …, "engines": n}``; values None when the metric or
    its labels are missing (non-vLLM servers). Parsed with ``prometheus_client.parser``."""
    out: dict[str, Any] = {"kv_cache_tokens": None, "num_gpu_blocks": None, "block_size": None, "engines": 0}
    try:
        fams = list(text_string_to_metric_families(metrics_text))
    except Exception as exc:  # the parser raises several types on bad input
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


def uses_speculation(template: str) -> bool:
    """True when a ``--server-command`` template passes the speculative config on (it contains
    ``{spec_args}`` or ``{speculative_config}``): rendering it with and without one differs.
    Raises SweepError for a bad template (see :func:`render_command`)."""
    spec = {"method": "ngram", "num_speculative_tokens": 1}
    return render_command(template, 8000, spec) != render_command(template, 8000, None)


def port_error(host: str, port: int) -> str | None:
    """A one-line reason why a server of the sweep cannot use ``host:port`` (something already
    listens there and would be measured instead), or None when the port is free."""
    busy = listen_error(host, port)
    if busy is None:
        return None
    return (f"cannot start a server on {host}:{port}: {busy} (another server is listening there and would be "
            "measured instead); stop it or choose another --port")


class TemplateServer:
    """A server started from a ``--server-command`` template, as a context manager
    (:class:`specwatch.common.processes.ManagedProcess`).

    Optionally takes the machine-wide vLLM lock (``lock=True``; waits up to ``lock_timeout`` s,
    calling ``on_status(message)`` once if it has to wait), refuses a port something already
    listens on, starts the command in its own process group (output appended to ``log_path``),
    polls ``GET {base_url}/v1/models`` until it answers 200 with at least one model and checks
    that the started process is still running, and on exit stops the whole process group
    (SIGTERM, SIGKILL after ``stop_timeout`` s; :func:`specwatch.common.processes.stop_process_group`)
    and releases the lock. Attributes as :class:`specwatch.localvllm.server.VllmServer`:
    ``base_url``, ``metrics_url``, ``startup_seconds``, ``command``, ``log_path``,
    ``served_model_name`` (the first model id listed), ``process``, ``stop_timeout``.
    ``on_launch(process)`` is called as soon as the process started (before the readiness wait).

    Raises (from ``__enter__``): SweepError when the port is busy, the program cannot be run, the
    lock is still held after ``lock_timeout`` s, or the process exits or is not ready in
    ``startup_timeout`` s (the message carries the log's tail).
    """

    def __init__(self, argv: list[str], port: int, *, host: str = "127.0.0.1", log_path: Path,
                 startup_timeout: float = 900.0, stop_timeout: float = 30.0, lock: bool = True,
                 api_key: str | None = None, on_status=None, lock_timeout: float = 3600.0,
                 lock_path: Path | None = None, on_launch=None):
        self.command = argv
        self.port = port
        self.host = host
        self.base_url = f"http://{host}:{port}"
        self.metrics_url = self.base_url + "/metrics"
        self.log_path = Path(log_path)
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.served_model_name: str | None = None
        self.on_status = on_status or (lambda msg: None)
        self._api_key = api_key
        self._lock = None
        if lock:
            # LOCK_PATH is read at call time (tests point it elsewhere with monkeypatch)
            self._lock = VllmLock(Path(lock_path) if lock_path else localvllm_server.LOCK_PATH, timeout=lock_timeout,
                                  on_wait=self.on_status, note=self.base_url)
        self._proc = ManagedProcess(argv, ready=self._lists_a_model, what="server", log_path=self.log_path,
                                    startup_timeout=startup_timeout, stop_timeout=stop_timeout, interval=0.25,
                                    lock=self._lock, before_start=self._check_port, on_error=self._start_error,
                                    on_launch=on_launch)

    @property
    def process(self) -> subprocess.Popen | None:
        return self._proc.process

    @property
    def startup_seconds(self) -> float | None:
        return self._proc.startup_seconds

    def _check_port(self) -> None:
        busy = port_error(self.host, self.port)
        if busy:
            raise SweepError(busy)

    def _lists_a_model(self) -> bool:
        """``/v1/models`` answers 200 with at least one model (its id becomes ``served_model_name``)."""
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        try:
            r = requests.get(self.base_url + "/v1/models", timeout=2, headers=headers)
            data = (r.json().get("data") or []) if r.status_code == 200 else []
        except (requests.RequestException, ValueError, AttributeError):
            return False
        if data:
            self.served_model_name = data[0].get("id")
        return bool(data)

    def _start_error(self, failure: StartFailed) -> SweepError:
        """The start-up failure as the sweep reports it (one line, then the log's tail)."""
        if failure.kind == "cannot-run":
            exc = failure.cause
            if isinstance(exc, FileNotFoundError):
                return SweepError(f"--server-command: program {self.command[0]!r} not found")
            return SweepError(f"--server-command: cannot run {self.command[0]!r}: {exc.strerror or exc}")
        log = f"log {self.log_path}:\n{_tail(self.log_path)}"
        if failure.kind == "not-ready":
            return SweepError(f"server not ready on {self.base_url} after {self.startup_timeout:.0f} s\n{log}")
        argv = shlex.join(redact_argv(self.command))
        if failure.kind == "exited":
            return SweepError(f"server exited with code {failure.returncode} during start-up: {argv}\n{log}")
        # whatever answered is not the server we started
        return SweepError(f"server exited with code {failure.returncode} while {self.base_url} answered (another server on the "
                          f"port?): {argv}\n{log}")

    def start(self) -> TemplateServer:
        """Take the lock, start the command and wait until it is ready (see the class doc)."""
        try:
            self._proc.start()
        except LockTimeout as exc:
            raise SweepError(f"{exc} (or run with --no-lock)") from None
        return self

    def stop(self) -> None:
        """Stop the server's process group and release the lock."""
        self._proc.stop()

    def __enter__(self) -> TemplateServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _tail(path: Path, lines: int = 30) -> str:
    return log_tail(path, lines)


def servers_record_path(result_file: Path) -> Path:
    """The side file in which a sweep writing ``result_file`` records the server it runs (beside
    the sweep's lock in the temporary directory, named after the result file's absolute path):
    ``{"running_servers": [{"config", "pid", "start_time", "sweep_pid", "command", "started_at"}]}``
    (``pid`` leads the server's process group; ``start_time``: :func:`process_start_time`).
    Written as soon as a server's process starts, emptied once it is stopped."""
    key = hashlib.sha1(os.path.realpath(result_file).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"specwatch-sweep-{key}.servers.json"


class ServerRecord:
    """The running server of a sweep, recorded in :func:`servers_record_path` so that the next
    sweep of the same result file can stop one this sweep leaves behind (when this process is
    killed with SIGKILL, by the OOM killer or a CI timeout, before it could stop it)."""

    def __init__(self, result_file: Path):
        self.path = servers_record_path(result_file)

    def entries(self) -> list[dict[str, Any]]:
        """The recorded servers ([] when there is no record or it is unreadable)."""
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
            servers = doc.get("running_servers") if isinstance(doc, dict) else None
        except (OSError, ValueError):
            return []
        return [e for e in servers or () if isinstance(e, dict) and isinstance(e.get("pid"), int)]

    def _write(self, entries: list[dict[str, Any]]) -> None:
        if entries:
            atomic_write_json(self.path, {"running_servers": entries})
        else:
            with suppress(FileNotFoundError):
                self.path.unlink()

    def launched(self, cfg: ServerConfig, process: subprocess.Popen) -> None:
        """Record the process group of ``cfg``'s server, just started."""
        entry = {"config": cfg.name, "pid": process.pid, "start_time": process_start_time(process.pid),
                 "sweep_pid": os.getpid(), "command": redact_argv([str(a) for a in process.args]), "started_at": _now()}
        self._write([*self.entries(), entry])

    def stopped(self, process: subprocess.Popen | None) -> None:
        """Forget the server of ``process`` once nothing of its process group is left."""
        if process is None or group_members(process.pid):
            return
        self._write([e for e in self.entries() if e.get("pid") != process.pid])

    def stop_leftovers(self, result_file: Path, echo, timeout: float = 30.0) -> None:
        """Stop every server an earlier sweep of ``result_file`` recorded and left running (the
        same process: checked by its start time), saying so through ``echo``. Raises SweepError
        (one line) when one cannot be stopped: the sweep then starts nothing beside it."""
        entries = self.entries()
        for e in entries:
            pid, what = e["pid"], f"{e.get('config', '?')}, pid {e['pid']}"
            start_time = e.get("start_time") if isinstance(e.get("start_time"), int) else None
            if start_time is not None and process_start_time(pid) in (None, start_time) and group_members(
                    pid, started_since=start_time):
                echo(f"stopping the server an earlier sweep of {result_file} left running ({what}; "
                     f"process group {pid}), up to {timeout:.0f} s…")
            try:
                stop_recorded_group(pid, start_time, timeout)
            except (PermissionError, RuntimeError) as exc:
                reason = "it belongs to another user" if isinstance(exc, PermissionError) else str(exc)
                raise SweepError(f"a server an earlier sweep of {result_file} left running ({what}) cannot be "
                                 f"stopped: {reason}; stop it (kill -TERM -{pid}) or use another --result-file") from None
        if entries:
            self._write([])


@contextmanager
def start_server(cfg: ServerConfig, *, template: str | None, port: int | None, host: str,
                 log_path: Path, startup_timeout: float, lock: bool, api_key: str | None,
                 model_dir: str | None, on_status, record: ServerRecord | None = None,
                 private_lock: Path | None = None) -> Iterator[Any]:
    """Start the server of ``cfg`` (embedded vLLM, or ``template``) and yield it while it runs;
    stop it afterwards (saying so through ``on_status``). ``record``: where its process group is
    recorded while it runs (:class:`ServerRecord`). ``private_lock``: the caller holds the
    machine-wide vLLM lock for this server and another (paired mode); the embedded server then
    takes this private lock file instead, and a template server none. Raises SweepError when it
    cannot start (busy port, missing program, lock timeout, start-up failure)."""
    on_launch = None if record is None else (lambda process: record.launched(cfg, process))
    p = port or free_port(host)
    if template is None:
        busy = port_error(host, p)
        if busy:
            raise SweepError(f"{cfg.name}: {busy}")
        srv: VllmServer | TemplateServer = VllmServer(
            p, model_dir=model_dir, speculative_config=cfg.speculative_config, host=host, log_path=log_path,
            startup_timeout=startup_timeout, on_status=on_status, on_launch=on_launch,
            **({} if private_lock is None else {"lock_path": private_lock}))
        start_errors: tuple[type[Exception], ...] = (SpecwatchEmbeddedError,)
    else:
        srv = TemplateServer(render_command(template, p, cfg.speculative_config), p, host=host, log_path=log_path,
                             startup_timeout=startup_timeout, lock=lock and private_lock is None, api_key=api_key,
                             on_status=on_status,
                             on_launch=on_launch)
        start_errors = (SweepError,)
    try:
        srv.start()
    except start_errors as exc:
        if record is not None:
            record.stopped(srv.process)
        raise SweepError(f"{cfg.name}: {exc.message if isinstance(exc, SweepError) else exc}") from None
    try:
        yield srv
    finally:
        try:
            on_status(f"{cfg.name}: stopping the server (up to {srv.stop_timeout:.0f} s)…")
        finally:
            srv.stop()
            if record is not None:
                record.stopped(srv.process)


def read_metrics(url: str, api_key: str | None = None) -> str | None:
    """GET a /metrics URL; None when it cannot be read."""
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
    """What to run and how to measure it (see :func:`run_sweep`). ``dataset_path``: the
    ShareGPT-format JSON file of the ``sharegpt`` workload (needed only with it)."""

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
    dataset_path: str | None = None
    #: Noise-aware cells (see :class:`specwatch.bench.runner.BenchConfig`): None = num_batches fixed.
    target_ci: float | None = None
    max_batches: int | None = None
    #: Paired (the default, issue #37): the baseline server stays up beside each speculative one
    #: and every cell runs in alternating rounds on the same prompts (``BenchConfig.paired``);
    #: ``target_ci`` then applies to the paired ratio's interval. False (``--sequential``): one
    #: server at a time, each cell measured alone. Not a measurement setting: each cell records
    #: its own ``mode``, and a resumed sweep may switch.
    paired: bool = True

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
            "dataset_path": self.dataset_path,
            "target_ci": self.target_ci,
            "max_batches": self.max_batches,
        }


def check_dataset(workloads: Sequence[str], dataset_path: str | None) -> None:
    """Fail before any server starts when the ``sharegpt`` workload is asked for without a usable
    ``--dataset-path`` (missing, unreadable, not ShareGPT format). Raises SweepError."""
    if "sharegpt" not in workloads:
        return
    if not dataset_path:
        raise SweepError("the sharegpt workload needs --dataset-path (a ShareGPT-format JSON file)")

    try:
        load_sharegpt(dataset_path)
    except WorkloadError as exc:
        raise SweepError(f"--dataset-path: {exc}") from None


def _canonical(spec: Any) -> str:
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))


def _merge_doc(path: Path, plan: SweepPlan, server_info: ServerSource) -> SweepResult:
    """The result document to continue: a new one, or the one in ``path`` extended by ``plan``.
    Raises SweepError (nothing written) when ``path`` is not a sweep result or was measured
    differently: other measurement settings or ShareGPT file, another server command template,
    or another speculative config under a configuration name of ``plan``. Only what stored cells
    were measured with counts: a file whose first attempt measured nothing (a typo in the command,
    a busy port) or a configuration without cells takes the new settings."""
    new = SweepSettings.read(plan.settings())
    if path.exists():
        doc = load_sweep(path)
        measured_configs = {c.config for c in doc.cells}
        if not measured_configs:  # nothing measured yet: start over with this run's settings
            doc = doc.replace(settings=SweepSettings.read({}), server=server_info, configs=()).with_keys(
                "settings", "server", "configs")
        old = doc.settings or SweepSettings.read({})
        diff = old.differences(new)
        if diff:
            raise SweepError(
                f"{path} was measured with different settings ({', '.join(f'{k}: {o!r} vs {n!r}' for k, o, n in diff)}); "
                "use another --result-file or the same options"
            )
        old_server = doc.server
        if old_server is not None and old_server.kind and (old_server.kind, old_server.command_template) != (
                server_info.kind, server_info.command_template):
            raise SweepError(f"{path} was measured with {old_server.describe()}, this run uses "
                             f"{server_info.describe()}; use another --result-file or the same server")
        # a configuration without cells takes the new definition
        kept = tuple(c for c in doc.configs if c.name in measured_configs)
        old_cfgs = {c.name: c for c in kept}
        for c in plan.configs:
            o = old_cfgs.get(c.name)
            if o is not None and o.has_speculative_config and _canonical(o.speculative_config) != _canonical(c.speculative_config):
                raise SweepError(f"{path} measured {c.name} with speculative config {_canonical(o.speculative_config)}, "
                                 f"this run asks for {_canonical(c.speculative_config)}; use another --result-file or the "
                                 "same --speculative-config/--k")
        # extend the lists of workloads/concurrencies/configs; keep what is there
        added = tuple(SweepConfig.read(c.to_dict()) for c in plan.configs if c.name not in old_cfgs)
        return doc.replace(settings=old.extended(new), configs=kept + added,
                           resumed_at=(*(doc.resumed_at or ()), _now())).with_keys("settings", "configs", "servers", "resumed_at")
    return SweepResult(status="running", created_at=_now(), updated_at=_now(), settings=new, server=server_info,
                       configs=tuple(SweepConfig.read(c.to_dict()) for c in plan.configs))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _server_exit_code(srv: Any) -> int | None:
    """The exit code of a started server's process, None while it runs."""
    proc = getattr(srv, "process", None)
    return None if proc is None else proc.poll()


def _interval_text(ci: ThroughputInterval | None, target: float | None) -> str:
    """`` ± 3.1 % (95 %, 4 batches)`` for the sweep's progress line (the batches used per cell);
    says when the target was not reached."""
    if ci is None:
        return ""
    n = ci.batches or 0
    rel = ci.relative_half_width
    if rel is None:
        return " (1 batch: no interval)" if n == 1 else ""
    missed = target is not None and rel > target
    return f" ± {rel * 100:.1f} % (95 %, {n} batches" + (
        f"; target {target * 100:g} % not reached" if missed else "") + ")"


def _paired_text(spec: Sequence[Any], base: Sequence[Any], target: float | None) -> str:
    """The paired cell's progress line: ``312.4 vs 101.9 tok/s: 3.07× [2.81–3.35] (paired, 3
    batches)``; says when the target was not reached. Measured batches of both roles, paired
    by batch index."""
    sm = {b.batch_index: b.output_throughput for b in spec if not b.warmup and (b.output_throughput or 0) > 0}
    bm = {b.batch_index: b.output_throughput for b in base if not b.warmup and (b.output_throughput or 0) > 0}
    idx = sorted(set(sm) & set(bm))
    if not idx:
        return "no pair of measured batches with output"
    r = paired_ratio([sm[i] for i in idx], [bm[i] for i in idx])
    thr = f"{statistics.fmean(sm[i] for i in idx):.1f} vs {statistics.fmean(bm[i] for i in idx):.1f} tok/s: "
    if not r.has_interval:
        return thr + f"{format_ratio(r.value)}× (paired, 1 batch: no interval)"
    rel = r.upper / r.value - 1.0
    missed = target is not None and rel > target
    return (thr + f"{format_ratio(r.value)}× {format_interval(r.lower, r.upper)} ± {rel * 100:.1f} % (paired, "
            f"{r.n} batches" + (f"; target {target * 100:g} % not reached" if missed else "") + ")")


def run_sweep(plan: SweepPlan, result_file: Path, *, template: str | None = None, port: int | None = None,
              host: str = "127.0.0.1", log_dir: Path | None = None, startup_timeout: float = 900.0, lock: bool = True,
              api_key: str | None = None, model_dir: str | None = None, progress: bool = True,
              echo=print) -> SweepResult:
    """Run (or resume) a sweep and return the result as its record
    (:class:`specwatch.choosek.records.SweepResult`; its ``to_json()`` is what ``result_file`` holds).

    The status ends "complete", or "incomplete" when some cells of ``plan`` had failed requests
    (kept in the file, listed by :meth:`SweepResult.failed_cells`, measured again on resume). Raises
    SweepError (bad/mismatched result file or ShareGPT file, busy port, server that does not
    start or exits during the sweep — the file then says "failed", finished cells kept —, another
    sweep writing the same file) and KeyboardInterrupt (after writing the file with status
    "interrupted").
    """
    with result_file_lock(Path(result_file)):
        return _run_sweep(plan, Path(result_file), template=template, port=port, host=host, log_dir=log_dir,
                          startup_timeout=startup_timeout, lock=lock, api_key=api_key, model_dir=model_dir,
                          progress=progress, echo=echo)


def _run_sweep(plan: SweepPlan, result_file: Path, *, template, port, host, log_dir, startup_timeout, lock, api_key,
               model_dir, progress, echo) -> SweepResult:
    sweep = _Sweep(plan, Path(result_file), template=template, port=port, host=host, log_dir=log_dir,
                   startup_timeout=startup_timeout, lock=lock, api_key=api_key, model_dir=model_dir,
                   progress=progress, echo=echo)
    sweep.open()
    sweep.save("running")
    try:
        if sweep.paired:
            sweep.run_paired()
        for cfg in ([sweep.base_cfg] if sweep.paired else plan.configs):
            sweep.run_sequential(cfg)
        sweep.save(sweep.final_status())
    except KeyboardInterrupt:
        sweep.save("interrupted")
        raise
    except BaseException:
        sweep.save("failed")
        raise
    return sweep.doc


class _Sweep:
    """One sweep while it runs: its plan, result document, finished cells and server record; the
    steps of :func:`_run_sweep` are its methods."""

    def __init__(self, plan: SweepPlan, result_file: Path, *, template, port, host, log_dir, startup_timeout, lock,
                 api_key, model_dir, progress, echo) -> None:
        self.plan = plan
        self.result_file = result_file
        self.template = template
        self.port = port
        self.host = host
        self.log_dir = Path(log_dir) if log_dir else result_file.with_name(result_file.stem + "-logs")
        self.startup_timeout = startup_timeout
        self.lock = lock
        self.api_key = api_key
        self.model_dir = model_dir
        self.progress = progress
        self.echo = echo
        self.base_cfg = next((cfg for cfg in plan.configs if cfg.is_baseline), None)
        self.spec_cfgs = [cfg for cfg in plan.configs if cfg is not self.base_cfg]
        self.paired = plan.paired and self.base_cfg is not None and bool(self.spec_cfgs)

    # -- the result file ---------------------------------------------------------------------

    def open(self) -> None:
        """Step 1: check the ShareGPT file, stop what an earlier sweep of the file left running,
        and read the result document to continue (or start one)."""
        plan, template = self.plan, self.template
        check_dataset(plan.workloads, plan.dataset_path)
        server_info = ServerSource.read({"kind": "template" if template else "embedded",
                                         "command_template": None if template is None
                                         else shlex.join(redact_argv(shlex.split(template)))})
        self.record = ServerRecord(self.result_file)
        self.record.stop_leftovers(self.result_file, self.echo)
        self.doc = _merge_doc(self.result_file, plan, server_info)
        self.done = {c.key for c in self.doc.cells if not c.problem()}
        self.options = WorkloadOptions(output_len=plan.output_len, seed=plan.seed, dataset_path=plan.dataset_path)

    def save(self, status: str) -> None:
        """Write the result document with ``status``."""
        self.doc = self.doc.replace(status=status, updated_at=_now())
        atomic_write_json(self.result_file, self.doc.to_json())

    def final_status(self) -> str:
        """Last step: "complete" when every planned cell is measured without a problem, else "incomplete"."""
        plan = self.plan
        planned = {cell_key(cfg.name, wl, c) for cfg in plan.configs for wl in plan.workloads for c in plan.concurrencies}
        return "complete" if planned <= self.done else "incomplete"

    def store(self, cell: SweepCell) -> str | None:
        """Cell step: keep ``cell`` in the document (replacing an older one) and save; returns and
        warns about its problem, if any."""
        self.doc = self.doc.with_cell(cell)  # a re-measured cell replaces the old record
        problem = cell.problem()
        if not problem:
            self.done.add(cell.key)
        self.save("running")
        if problem:
            err = cell.first_error()
            self.echo(f"  warning: {cell.config} {cell.workload} c={cell.max_concurrency}: {problem}"
                      + (f" (first error: {err})" if err else "")
                      + "; the cell is kept but not used by advise/report, and a resumed sweep measures it again")
        return problem

    # -- servers -----------------------------------------------------------------------------

    def todo(self, cfg: ServerConfig) -> list[tuple[str, int]]:
        """The (workload, concurrency) cells of ``cfg`` not yet measured."""
        return [(wl, c) for wl in self.plan.workloads for c in self.plan.concurrencies
                if cell_key(cfg.name, wl, c) not in self.done]

    def skipped(self, cfg: ServerConfig) -> None:
        """Say that every cell of ``cfg`` is already in the result file."""
        n = len(self.plan.workloads) * len(self.plan.concurrencies)
        self.echo(f"{cfg.name}: {'its cell is' if n == 1 else f'all {n} cells'} already in {self.result_file}, skipped")

    def server(self, cfg: ServerConfig, log_path: Path, *, port: int | None, private_lock: Path | None = None):
        """:func:`start_server` for ``cfg`` with this sweep's settings (a context manager)."""
        return start_server(cfg, template=self.template, port=port, host=self.host, log_path=log_path,
                            startup_timeout=self.startup_timeout, lock=self.lock, api_key=self.api_key,
                            model_dir=self.model_dir, on_status=self.echo, record=self.record,
                            private_lock=private_lock)

    def started(self, cfg: ServerConfig, srv: Any, log_path: Path) -> None:
        """Server step: record a ready server's start (its KV-cache capacity) and say so."""
        kv = kv_capacity(read_metrics(srv.metrics_url, self.api_key) or "")
        start = {"config": cfg.name, "k": cfg.k, "started_at": _now(),
                 "startup_seconds": srv.startup_seconds, "command": redact_argv(srv.command),
                 "log": str(log_path), **kv}
        self.doc = self.doc.replace(servers=(*self.doc.servers, ServerStart.read(start)))
        self.save("running")
        kvs = "unknown" if kv["kv_cache_tokens"] is None else f"{kv['kv_cache_tokens']} tokens"
        self.echo(f"{cfg.name}: ready in {srv.startup_seconds:.1f} s at {srv.base_url}, KV-cache capacity {kvs}")

    def server_died(self, cfg: ServerConfig, rc: int, log_path: Path, when: str) -> SweepError:
        """The error of a server that exited with ``rc`` ``when`` (with its log's tail)."""
        return SweepError(f"{cfg.name}: the server exited with code {rc} {when}; the sweep stops "
                          f"(finished cells are kept in {self.result_file})\nlog {log_path}:\n{_tail(log_path)}")

    # -- cells -------------------------------------------------------------------------------

    def bench_cell(self, cfg: ServerConfig, srv: Any, wl: str, c: int, baseline_srv: Any = None):
        """Cell step: one bench run of (wl, c) on ``srv`` (paired with ``baseline_srv`` when given)."""
        plan = self.plan
        try:
            bcfg = BenchConfig(
                base_url=srv.base_url, role="baseline" if cfg.is_baseline else "speculative",
                baseline_url=None if baseline_srv is None else baseline_srv.base_url, paired=baseline_srv is not None,
                served_model_name=getattr(srv, "served_model_name", None),
                workloads=(wl,), concurrencies=(c,), num_prompts=plan.prompts_for(c),
                num_batches=plan.num_batches, warmup_batches=plan.warmup_batches,
                request_rate=plan.request_rate, options=self.options, api_key=self.api_key,
                equivalence=False, save_result=False, progress=self.progress,
                target_ci=plan.target_ci, max_batches=plan.max_batches,
                # paired: the long-lived baseline served these prompts beside the configurations
                # before this one; its own salt per configuration keeps them out of its prefix cache
                cache_salt=None if baseline_srv is None else f"specwatch-sweep-{cfg.name}",
            )
        except (BenchConfigError, WorkloadError) as exc:
            raise SweepError(str(exc)) from None
        try:
            res = run_bench(bcfg)
        except BenchInterrupted:
            raise KeyboardInterrupt from None
        if not res.summary():
            raise SweepError(f"{cfg.name} {wl} c={c}: no measured batch")
        return res

    @staticmethod
    def settle(srv: Any, batches) -> int | None:
        """Cell step: the server's exit code after a cell (a moment's wait when requests failed), None while it runs."""
        if any(b.failed for b in batches) and _server_exit_code(srv) is None:
            # failures from a dying server: give it a moment to finish exiting
            with contextlib.suppress(subprocess.TimeoutExpired, AttributeError):
                srv.process.wait(timeout=1.0)
        return _server_exit_code(srv)

    # -- sequential --------------------------------------------------------------------------

    def run_sequential(self, cfg: ServerConfig) -> None:
        """One server at a time: start ``cfg``'s server and measure its cells still to run."""
        todo = self.todo(cfg)
        if not todo:
            if not self.paired:
                self.skipped(cfg)
            return
        self.echo(f"{cfg.name}: starting the server ({_plural(len(todo), 'cell')} to run)")
        log_path = self.log_dir / f"{cfg.name}.log"
        with self.server(cfg, log_path, port=self.port) as srv:
            self.started(cfg, srv, log_path)
            for wl, c in todo:
                self.sequential_cell(cfg, srv, log_path, wl, c)

    def sequential_cell(self, cfg: ServerConfig, srv: Any, log_path: Path, wl: str, c: int) -> None:
        """One cell measured alone on ``srv``: bench it, store it, say how it went, stop on a dead server."""
        rc = _server_exit_code(srv)
        if rc is not None:
            raise self.server_died(cfg, rc, log_path, f"before {wl} c={c}")
        res = self.bench_cell(cfg, srv, wl, c)
        summary = res.summary()[0].to_record()
        batches = tuple(b.to_record() for b in res.batches)
        rc = self.settle(srv, batches)
        cell = SweepCell(config=cfg.name, k=cfg.k, family=cfg.family, workload=wl, max_concurrency=c,
                         finished_at=_now(), summary=summary, batches=batches, server_exited=rc)
        problem = self.store(cell)
        acc = summary.acceptance_rate
        self.echo(f"  {cfg.name} {wl} c={c}: {summary.output_throughput or 0.0:.1f} tok/s"
                  + _interval_text(summary.output_throughput_ci95, self.plan.target_ci)
                  + ("" if acc is None else f", acceptance {acc * 100:.1f} %")
                  + (f", {summary.failed} failed" if summary.failed else ""))
        if rc is not None:
            raise self.server_died(cfg, rc, log_path, f"during {wl} c={c}")
        err = cell.first_error()
        if not problem and any(b.failed for b in batches):  # only warm-up requests failed
            self.echo(f"  warning: {cfg.name} {wl} c={c}: warm-up requests failed"
                      + (f" (first error: {err})" if err else ""))

    # -- paired ------------------------------------------------------------------------------

    def run_paired(self) -> None:
        """Paired mode: the baseline server up beside each speculative server, every cell in
        alternating rounds on the same prompts; the baseline's own cells are the batches it
        served beside the first configuration measured there."""
        todo = {cfg.name: self.todo(cfg) for cfg in self.spec_cfgs}
        if not any(todo.values()):
            return
        with ExitStack() as stack:
            self.hold_machine_lock(stack)
            private = Path(tempfile.mkdtemp(prefix="specwatch-pair-locks-"))
            stack.callback(shutil.rmtree, private, True)
            base_srv = self.start_baseline(stack, private)
            for cfg in self.spec_cfgs:
                if not todo[cfg.name]:
                    self.skipped(cfg)
                    continue
                self.run_beside(cfg, todo[cfg.name], base_srv, private)

    def hold_machine_lock(self, stack: ExitStack) -> None:
        """Paired step: one hold of the machine-wide vLLM lock for both servers (released by ``stack``)."""
        if self.template is None or self.lock:
            mlock = VllmLock(localvllm_server.LOCK_PATH, timeout=3600.0, on_wait=self.echo,
                             note="specwatch sweep (paired: baseline + speculative)")
            try:
                mlock.acquire()
            except LockTimeout as exc:
                raise SweepError(f"{exc}; the paired sweep needs it for both servers") from None
            stack.callback(mlock.release)

    def start_baseline(self, stack: ExitStack, private: Path) -> Any:
        """Paired step: start the baseline server, kept up by ``stack`` beside each speculative one."""
        base_cfg = self.base_cfg
        base_log = self.log_dir / f"{base_cfg.name}.log"
        self.echo(f"{base_cfg.name}: starting the server (paired mode: it stays up beside each speculative server; "
                  "--sequential runs one server at a time)")
        base_srv = stack.enter_context(self.server(base_cfg, base_log, port=None, private_lock=private / "baseline.lock"))
        self.started(base_cfg, base_srv, base_log)
        return base_srv

    def run_beside(self, cfg: ServerConfig, cells: list[tuple[str, int]], base_srv: Any, private: Path) -> None:
        """Paired step: start ``cfg``'s server beside the baseline and measure its cells in paired rounds."""
        self.echo(f"{cfg.name}: starting the server beside {self.base_cfg.name} ({_plural(len(cells), 'cell')} to run, "
                  "paired rounds)")
        log_path = self.log_dir / f"{cfg.name}.log"
        inner = ExitStack()
        try:
            srv = inner.enter_context(self.server(cfg, log_path, port=self.port, private_lock=private / f"{cfg.name}.lock"))
        except SweepError as exc:
            raise SweepError(f"{exc.message}\n{cfg.name} could not start beside the baseline server (memory, "
                             "port or lock?): run the same command with --sequential to measure one server "
                             f"at a time; finished cells are kept in {self.result_file}") from None
        with inner:
            self.started(cfg, srv, log_path)
            for wl, c in cells:
                self.paired_cell(cfg, srv, base_srv, wl, c)

    def paired_cell(self, cfg: ServerConfig, srv: Any, base_srv: Any, wl: str, c: int) -> None:
        """One cell in paired rounds: bench it on both servers, store the speculative cell (and the
        baseline's, the first time), say how it went, stop on a dead server."""
        base_cfg = self.base_cfg
        for who, server in ((cfg, srv), (base_cfg, base_srv)):
            rc = _server_exit_code(server)
            if rc is not None:
                raise self.server_died(who, rc, self.log_dir / f"{who.name}.log", f"before {cfg.name} {wl} c={c}")
        res = self.bench_cell(cfg, srv, wl, c, baseline_srv=base_srv)
        sb = tuple(b.to_record() for b in res.batches if b.role == "speculative")
        bb = tuple(b.to_record() for b in res.batches if b.role == "baseline")
        rc_s, rc_b = self.settle(srv, sb), self.settle(base_srv, bb)
        ss, bs = _role_summary(res, "speculative"), _role_summary(res, "baseline")
        cell = SweepCell(config=cfg.name, k=cfg.k, family=cfg.family, workload=wl, max_concurrency=c,
                         finished_at=_now(), summary=None if ss is None else ss.to_record(), batches=sb,
                         server_exited=rc_s, mode="paired", baseline_batches=bb)
        if cell_key(base_cfg.name, wl, c) not in self.done:
            self.store(SweepCell(config=base_cfg.name, k=0, family=base_cfg.family, workload=wl,
                                 max_concurrency=c, finished_at=_now(),
                                 summary=None if bs is None else bs.to_record(), batches=bb,
                                 server_exited=rc_b, mode="paired", paired_with=cfg.name))
        self.store(cell)
        self.echo(f"  {cfg.name} {wl} c={c}: " + _paired_text(sb, bb, self.plan.target_ci)
                  + ("" if cell.summary is None or cell.summary.acceptance_rate is None
                     else f", acceptance {cell.summary.acceptance_rate * 100:.1f} %"))
        for who, rc in ((cfg, rc_s), (base_cfg, rc_b)):
            if rc is not None:
                raise self.server_died(who, rc, self.log_dir / f"{who.name}.log", f"during {cfg.name} {wl} c={c}")


def _role_summary(res, role: str):
    """The bench run's summary of ``role``'s batches, None when it has none."""
    return next((x for x in res.summary() if x.role == role), None)
