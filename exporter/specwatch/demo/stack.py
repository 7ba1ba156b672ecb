"""What watches the demo's servers (:class:`DemoStack`): the exporter, Prometheus and the
load generator's metrics, and the exporter's cost profile (:func:`exporter_cost_options`)."""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from specwatch.bench.metrics import BenchMetrics
from specwatch.common.defaults import EXPORTER_PORT
from specwatch.common.files import atomic_write_text
from specwatch.common.processes import ManagedProcess, listen_error
from specwatch.mixin.config import DEFAULT_CONFIG
from specwatch.mixin.generate import EMBEDDED_CONFIG_FILE, PROMETHEUS_DIR, render_embedded_prometheus
from specwatch.specdecode.costprofile import (EMBEDDED_CPU_DRAFTERS_PROFILE, EMBEDDED_CPU_PROFILE, EMBEDDED_TARGET_DRAFTER,
                                              load_profile)
from specwatch.demo.flags import (BASELINE_PORT, BENCH_PORT, EXPORTER_URL, EXPORTER_WINDOWS, PROM_PORT, PROM_URL, SPEC_PORT,
                                   console)

def exporter_cost_options(method: str, drafter_label: str | None) -> tuple[Path, str | None]:
    """(cost profile, drafter name to state for the speculative upstream) for the demo's exporter.

    The profile must hold a measured curve for what the speculative server runs, else the exporter
    withholds the what-if speedups and the recommended k (``no_cost_curve``): ngram and the target
    as drafter are in the embedded CPU profile (whose draft_model curve names the target
    ``SmolLM2-135M-Instruct``: the drafter *is* the target model), the derived drafters ``close``
    and ``far`` in the drafter study's profile. A drafter directory of the user's own has no
    curve anywhere; it is stated as given and the exporter says so."""
    if method != "draft_model" or drafter_label is None:
        return EMBEDDED_CPU_PROFILE, None
    if drafter_label == "target":
        return EMBEDDED_CPU_PROFILE, EMBEDDED_TARGET_DRAFTER
    if load_profile(EMBEDDED_CPU_DRAFTERS_PROFILE).has_curve(method, drafter_label):
        return EMBEDDED_CPU_DRAFTERS_PROFILE, drafter_label
    # a directory: its last component, in characters an --upstream option value takes
    return EMBEDDED_CPU_PROFILE, re.sub(r"[\s,=]", "_", Path(drafter_label).name or drafter_label)


class DemoError(Exception):
    """A failure of the demo's run (a child process that exited or was not ready, the machine-wide
    vLLM lock not had, a bench value refused): one line; the ``demo`` command answers it with
    click's ``Error: …`` and exit status 1."""


def _demo_error(failure: Exception) -> DemoError:
    """A :class:`ManagedProcess` failure as the demo's one-line error."""
    return DemoError(str(failure))


class DemoStack:
    """What watches the demo's servers, as a context manager: the exporter (``specwatch serve`` on
    19337, upstreams ``spec`` and ``baseline`` at the two vLLM ports, windows :data:`EXPORTER_WINDOWS`, the cost
    profile of :func:`exporter_cost_options`), Prometheus (the embedded default's ``prometheus.yml``
    and its rules, rendered by the mixin generator (:func:`specwatch.mixin.generate.render_embedded_prometheus`,
    the same text as the repository's ``prometheus/``) into ``OUT/prometheus/`` on enter; its data in
    ``OUT/prometheus-data``) and the load generator's
    metrics (``metrics``, served on 19338). Logs go to ``OUT/logs``.

    :meth:`problem` says why it cannot start here (Prometheus missing, a port of the embedded
    default in use). On enter it writes the Prometheus config, then both processes start, then it waits for each (the exporter
    up to 30 s, Prometheus 60 s; :class:`DemoError` naming the one that exited or was not
    ready) and serves the metrics. On exit the metrics server and both processes stop (every one,
    even if Ctrl-C is pressed again while one stops)."""

    #: the ports of the embedded default: the two vLLM servers, Prometheus, the exporter, the bench metrics
    PORTS = (SPEC_PORT, BASELINE_PORT, BENCH_PORT, PROM_PORT, EXPORTER_PORT)

    def __init__(self, out: Path, method: str, drafter_label: str | None,
                 say: Callable[[str], None] | None = None):
        self.out = out
        self.logs = out / "logs"
        self.method = method
        self.prometheus_bin = shutil.which("prometheus")
        self.prometheus_dir = out / PROMETHEUS_DIR
        self.prometheus_config = self.prometheus_dir / EMBEDDED_CONFIG_FILE
        self.prometheus_data = out / "prometheus-data"
        # the embedded default's measured step times, with a curve for what the speculative server
        # runs: speedups with basis calibrated/profile (see exporter_cost_options)
        self.cost_profile, self.cost_drafter = exporter_cost_options(method, drafter_label)
        self.exporter_url, self.prometheus_url = EXPORTER_URL, PROM_URL
        self.metrics = BenchMetrics()
        self.processes: list[ManagedProcess] = []
        self._say = say or (lambda message: console.print(message))

    def problem(self) -> str | None:
        """Why the stack cannot start on this machine now (one line), or None."""
        if self.prometheus_bin is None:
            return "Debian's prometheus is not installed: run scripts/setup.sh"
        busy = [p for p in self.PORTS if listen_error("127.0.0.1", p)]
        if busy:
            return f"ports in use: {busy}; the embedded default needs 8000, 8001, 9090, 19337, 19338"
        return None

    def exporter_argv(self) -> list[str]:
        return [sys.executable, "-m", "specwatch", "serve",
                "--upstream", f"spec=http://127.0.0.1:{SPEC_PORT},method={self.method}"
                + (f",drafter={self.cost_drafter}" if self.cost_drafter else ""),
                "--upstream", f"baseline=http://127.0.0.1:{BASELINE_PORT}", "--baseline-upstream", "baseline",
                *[a for w in EXPORTER_WINDOWS for a in ("--window", w)],
                "--listen-address", f"127.0.0.1:{EXPORTER_PORT}", "--cost-profile", str(self.cost_profile)]

    def prometheus_argv(self) -> list[str]:
        return [str(self.prometheus_bin), f"--config.file={self.prometheus_config}",
                f"--storage.tsdb.path={self.prometheus_data}",
                f"--web.listen-address=127.0.0.1:{PROM_PORT}", "--web.enable-lifecycle"]

    @property
    def running(self) -> bool:
        """Both processes still run."""
        return bool(self.processes) and all(p.running for p in self.processes)

    def write_prometheus_config(self) -> None:
        """Write the embedded default's ``prometheus.yml`` and its rules and alerts (as the mixin
        generator renders them from its default config) into ``OUT/prometheus/``."""
        for rel, text in render_embedded_prometheus(DEFAULT_CONFIG).items():
            atomic_write_text(self.prometheus_dir / rel, text)

    def __enter__(self) -> DemoStack:
        self.write_prometheus_config()
        self.processes = [
            ManagedProcess(self.exporter_argv(), ready=self.exporter_url + "/", what="the exporter",
                           log_path=self.logs / "exporter.log", startup_timeout=30, stop_timeout=20, on_error=_demo_error),
            ManagedProcess(self.prometheus_argv(), ready=self.prometheus_url + "/-/ready", what="Prometheus",
                           log_path=self.logs / "prometheus.log", startup_timeout=60, stop_timeout=20, on_error=_demo_error),
        ]
        try:
            for p in self.processes:  # both start, then each is waited for
                p.launch()
            for p in self.processes:
                p.wait_ready()
            self.metrics.serve(BENCH_PORT, "127.0.0.1")
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.metrics.shutdown()
        finally:
            self._stop()

    def _stop(self) -> None:
        for p in self.processes:  # every one of them, even if Ctrl-C is pressed again while stopping
            try:
                p.stop()
            except KeyboardInterrupt:
                self._say("[yellow]still stopping the other servers…")
