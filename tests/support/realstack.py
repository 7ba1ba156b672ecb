"""Reusable pieces for tests against the real stack: a real vLLM, Debian's Prometheus, free ports.

The pytest fixtures themselves live in tests/conftest.py (``real_vllm``, ``prometheus_server``,
``free_port``, ``fixtures_dir``); this module holds the plain functions and classes behind them so
tests can also import them directly (``from realstack import send_copy_traffic, free_port``).

Opt out of everything real with ``SPECWATCH_SKIP_REAL=1`` (the fixtures then skip).
``SPECWATCH_REAL_VLLM_URL=http://127.0.0.1:PORT`` makes ``real_vllm`` use an already running
speculative vLLM (e.g. one ``specwatch vllm`` started, which holds the lock) instead of starting
its own; k and the served model name are then read from its /metrics and /v1/models.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml

import polling

from specwatch.common.processes import free_port  # the one free_port (127.0.0.1 by default), re-exported
from specwatch.common import processes as _processes
from specwatch.localvllm.server import DEFAULT_SERVED_MODEL_NAME, LOCK_PATH, VllmServer, lock_holder, speculative_config_for_k
from specwatch.localvllm.traffic import send_copy_traffic as _send_copy_traffic

FIXTURES_DIR = Path(__file__).resolve().parents[1] / "fixtures"
METRICS_FIXTURES_DIR = FIXTURES_DIR / "metrics"
REAL_K = 4


def skip_real_reason() -> str | None:
    """Why real-stack tests are skipped (``SPECWATCH_SKIP_REAL=1``), else None."""
    if os.environ.get("SPECWATCH_SKIP_REAL", "").strip() not in ("", "0", "false", "no"):
        return "SPECWATCH_SKIP_REAL is set"
    return None


#: Wait until a URL answers 200 (the product's helper, shared by the tests).
wait_http = _processes.wait_http
#: Poll a condition instead of sleeping (tests/support/polling.py), re-exported for the real-stack tests.
wait_for = polling.wait_for


def settled_metrics(metrics_url: str, prefix: str = "vllm:spec_decode_", timeout: float = 60.0,
                    interval: float = 1.0) -> str:
    """vLLM's /metrics text once the counters starting with ``prefix`` have stopped moving: two
    fetches ``interval`` s apart print the same values. vLLM folds a finished step's stats into its
    Prometheus counters after the last token has reached the client, so a fetch right after the
    traffic returns can still see the previous step's counts (a loaded machine widens that gap).
    Raises AssertionError after ``timeout`` s of moving counters."""

    def counters(text: str) -> list[str]:
        return sorted(line for line in text.splitlines() if line.startswith(prefix))

    def check():
        first = requests.get(metrics_url, timeout=30).text
        time.sleep(interval)
        second = requests.get(metrics_url, timeout=30).text
        return second if counters(first) == counters(second) else None

    return wait_for(f"vLLM's {prefix}* counters to settle", check, timeout, interval=0.0)


def write_prometheus_config(path: Path, jobs: dict[str, Sequence[tuple[str, dict]]], *, interval: str = "2s",
                            rule_files: Sequence[str] = ()) -> Path:
    """Write the test Prometheus' config: ``jobs`` maps job name → [(target host:port, extra labels)];
    scrape and evaluation every ``interval`` (scrape timeout ≤ 2 s); ``rule_files`` relative to ``path``."""
    seconds = float(interval.rstrip("s"))
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": f"{min(seconds, 2.0):g}s"},
        "rule_files": list(rule_files),
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [t], **({"labels": dict(l)} if l else {})} for t, l in targets]}
            for job, targets in jobs.items()
        ],
    }
    Path(path).write_text(yaml.safe_dump(config, sort_keys=False))
    return Path(path)


def prometheus_has_samples(base_url: str, expr: str, at_least: int = 1) -> bool:
    """True when the instant query ``expr`` returns a series whose value is ≥ ``at_least``."""
    r = requests.get(f"{base_url}/api/v1/query", params={"query": expr}, timeout=5).json()
    return any(float(x["value"][1]) >= at_least for x in r.get("data", {}).get("result", []))


@dataclass(frozen=True)
class RealVllm:
    """A running real vLLM as seen by tests.

    base_url: ``http://127.0.0.1:PORT``; metrics_url: ``…/metrics``; served_model_name: the
    ``model_name`` label of its metrics; k: num_speculative_tokens (0 = no speculation);
    startup_seconds: process start to ``/v1/models`` ready (None for a server we did not start);
    log_path: the server's log file (None for a server we did not start).
    """

    base_url: str
    metrics_url: str
    served_model_name: str
    k: int
    startup_seconds: float | None
    log_path: Path | None

    def metrics_text(self) -> str:
        """The current /metrics text (plain GET, Prometheus text format 0.0.4)."""
        r = requests.get(self.metrics_url, timeout=10)
        r.raise_for_status()
        return r.text


def start_real_vllm(k: int = REAL_K, served_model_name: str = DEFAULT_SERVED_MODEL_NAME, on_status=None) -> VllmServer:
    """Start (and return, already started) the embedded vLLM with ngram speculation ``k`` on a
    free port; the caller must ``stop()`` it. Holds /tmp/specwatch-vllm.lock while running.
    ``on_status(message)``: where its messages go (a wait for the lock every 30 s; default stderr).

    Raises: VllmStartError (with the log tail), LockTimeout.
    """
    log = Path(tempfile.gettempdir()) / f"specwatch-test-vllm-{os.getpid()}.log"
    server = VllmServer(
        free_port(),
        served_model_name=served_model_name,
        speculative_config=speculative_config_for_k(k),
        log_path=log,
        on_status=on_status,
    )
    return server.start()


def as_real_vllm(server: VllmServer) -> RealVllm:
    """The test-facing view of a started :class:`VllmServer`."""
    return RealVllm(
        base_url=server.base_url,
        metrics_url=server.metrics_url,
        served_model_name=server.served_model_name,
        k=server.k,
        startup_seconds=float(server.startup_seconds or 0.0),
        log_path=server.log_path,
    )


def existing_real_vllm(base_url: str) -> RealVllm:
    """Describe an already running vLLM at ``base_url``: served model name from ``/v1/models``,
    k from the ``position`` labels of ``vllm:spec_decode_num_accepted_tokens_per_pos_total``.

    Raises:
        RuntimeError: it does not answer, serves no model, or exports no per-position counters.
    """
    from prometheus_client.parser import text_string_to_metric_families

    base_url = base_url.rstrip("/")
    try:
        models = requests.get(base_url + "/v1/models", timeout=10).json()["data"]
        text = requests.get(base_url + "/metrics", timeout=10).text
    except (requests.RequestException, ValueError, KeyError) as exc:
        raise RuntimeError(f"SPECWATCH_REAL_VLLM_URL={base_url} does not answer like vLLM: {exc}") from exc
    if not models:
        raise RuntimeError(f"{base_url}/v1/models lists no model")
    name = models[0]["id"]
    positions = {
        s.labels["position"]
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "vllm:spec_decode_num_accepted_tokens_per_pos_total" and s.labels.get("model_name") == name
    }
    if not positions:
        raise RuntimeError(f"{base_url} exports no spec-decode per-position counters (no speculation?)")
    return RealVllm(base_url, base_url + "/metrics", name, len(positions), None, None)


def _parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def is_ancestor(pid: int, of: int | None = None) -> bool:
    """True if ``pid`` is a (grand…)parent of process ``of`` (default: this process)."""
    cur = os.getpid() if of is None else of
    for _ in range(64):
        cur = _parent_pid(cur)
        if cur is None or cur <= 1:
            return False
        if cur == pid:
            return True
    return False


def ancestor_server_url(lock_path: Path = LOCK_PATH) -> str | None:
    """The base URL of the real vLLM whose lock is held by one of our ancestor processes (a
    driver that started a server and then runs pytest), else None. Starting a second server would
    wait forever for that ancestor's lock, so ``real_vllm`` reuses this one instead."""
    held = lock_holder(lock_path)
    if held and held[1].startswith("http") and is_ancestor(held[0]):
        return held[1]
    return None


def send_copy_traffic(
    base_url: str,
    model: str = DEFAULT_SERVED_MODEL_NAME,
    n: int = 4,
    concurrency: int = 2,
    max_tokens: int = 128,
) -> list[dict]:
    """Send ``n`` greedy copy-like completions ("Text: … Copy 1: … Copy 2:") with ``concurrency``
    in flight, ``max_tokens`` output tokens each (``ignore_eos``). Returns the completion JSONs.
    See :func:`specwatch.localvllm.server.send_copy_traffic`."""
    return _send_copy_traffic(base_url, model, n=n, concurrency=concurrency, max_tokens=max_tokens)


class PrometheusProcess:
    """Debian's ``prometheus`` binary on a free loopback port with a temporary storage dir.

    Started with ``--config.file CONFIG --storage.tsdb.path TMP --web.listen-address
    127.0.0.1:PORT --web.enable-lifecycle`` (+ ``extra_args``); ``start()`` waits for ``/-/ready``.

    Raises (from start): FileNotFoundError if ``prometheus`` is not installed, RuntimeError with
    the log tail if it exits or is not ready within ``timeout`` s.
    """

    def __init__(self, config_file: Path | str, extra_args: Sequence[str] = (), timeout: float = 60.0):
        self.config_file = Path(config_file)
        self.extra_args = list(extra_args)
        self.timeout = timeout
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.storage = Path(tempfile.mkdtemp(prefix="specwatch-prom-"))
        self.log_path = self.storage / "prometheus.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> str:
        binary = shutil.which("prometheus")
        if binary is None:
            raise FileNotFoundError("Debian's prometheus binary is not installed (apt-get install prometheus)")
        if not self.config_file.is_file():
            raise FileNotFoundError(f"Prometheus config {self.config_file} does not exist")
        cmd = [
            binary,
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.storage / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
            *self.extra_args,
        ]
        with open(self.log_path, "wb") as log:  # prometheus holds its own copy of the descriptor
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            _processes.wait_http(self.base_url + "/-/ready", self.timeout, self.process, "prometheus")
        except _processes.NotReady as exc:
            tail = self.log_tail()  # before stop() removes the storage dir that holds the log
            _processes.stop_process_group(self.process, 20)
            raise RuntimeError(f"{exc}:\n{tail}") from None
        return self.base_url

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM, SIGKILL after 20 s (:func:`~specwatch.common.processes.stop_process_group`), then
        remove the temporary storage dir. Safe to call twice, and before :meth:`start`."""
        _processes.stop_process_group(self.process, 20)
        shutil.rmtree(self.storage, ignore_errors=True)


def metrics_fixture(name: str) -> str:
    """The text of ``tests/fixtures/metrics/<name>``."""
    return (METRICS_FIXTURES_DIR / name).read_text()


def real_metrics_fixtures() -> list[Path]:
    """The metrics fixtures captured from a real vLLM (every ``.txt`` not marked CONSTRUCTED)."""
    return sorted(
        p for p in METRICS_FIXTURES_DIR.glob("*.txt") if not p.read_text().startswith("# CONSTRUCTED")
    )


def constructed_metrics_fixtures() -> list[Path]:
    """The fixtures constructed by hand from the documented formats (first line ``# CONSTRUCTED``)."""
    return sorted(p for p in METRICS_FIXTURES_DIR.glob("*.txt") if p.read_text().startswith("# CONSTRUCTED"))
