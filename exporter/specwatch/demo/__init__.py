"""``specwatch demo``: the whole pipeline once on the embedded default (CPU-only machine).

Starts the exporter (with ``--baseline-upstream baseline``) and Prometheus (the embedded default's
``prometheus.yml`` with its rules and alerts, rendered by the mixin generator into
``OUT/prometheus/``), then a baseline vLLM and a speculative vLLM (SmolLM2-135M, ngram) side by
side under one hold of the machine-wide vLLM lock, and runs the workloads of the published n-gram
measurement (docs/load-generator.md) at the given concurrencies
with the load generator in paired rounds (issue #37): per cell, batch i on the baseline and on the
speculative server back to back, the same prompts, ABBA order, only one server loaded at a time.
So the exporter serves the ``measured`` speedup live (both servers in its window); after each cell
the demo records what it served (``live_measured`` in ``demo-summary.json``). The load generator's
own metrics are served on 19338 throughout. Both servers stay up while the demo keeps running at
the end, so the exporter still has both to read.
It ends with the baseline-vs-speculative table, the greedy-output equivalence check, the
per-position acceptance curve with the what-if expected acceptance length for every smaller k,
what Prometheus recorded, and the decision (:mod:`specwatch.demo.decision`: per workload ×
concurrency the measured ratio with its 95 % interval, pays / loses / cannot tell, the k to run,
each with its basis, and whether the exporter's cost profile fits this machine); it writes
``report.html`` (the decision first, then plots, rendered by :mod:`specwatch.demo.report`
with the sweep report's helpers) into the result folder and ends with its path, or, when it keeps
Prometheus and the exporter running, with how to stop them. Before the load starts it says how to
watch the run live (``specwatch top``).

Outputs and batches are shortened by default so the whole job takes minutes on 2 cores; the
console says so. Every result file is rewritten after each batch, so an interrupted job keeps what
it measured.

Pieces, one module each: the command :func:`demo` (here) only parses and checks its flags (and the
result folder, then the machine: Prometheus, free ports) into :class:`~.flags.DemoSettings`
(:mod:`.flags`: the flags, the embedded default's ports, the console); :class:`~.stack.DemoStack`
(:mod:`.stack`) runs the exporter, Prometheus (both :class:`specwatch.common.processes.ManagedProcess`)
and the bench metrics; :func:`~.run.run_demo` (:mod:`.run`) runs the job; :mod:`.checks` shows and
checks the results (the ``_print_*`` functions, :func:`~.checks._query_prometheus`). The decision
(:mod:`.decision`), its records (:mod:`.decisionrecords`), ``demo-summary.json``'s record
(:mod:`.records`) and ``report.html`` (:mod:`.report`) are the demo's too; ``specwatch advise`` and
``specwatch report`` read a demo folder through :mod:`.report`.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import click
from rich.console import Console

from specwatch.bench.workloads import parse_workloads
from specwatch.common.params import int_list
from specwatch.demo.checks import (PROM_CHECKS, WITHHELD_QUERY, WITHHELD_REASONS, _print_live, _print_per_position,
                                   _print_prometheus_check, _query_prometheus, _wait_scraped_up, _withheld_text, live_measured,
                                   live_window, withheld_reasons)
from specwatch.demo.decision import render_decision
from specwatch.demo.decisionrecords import Decision
from specwatch.demo.flags import (BASELINE_PORT, BENCH_PORT, DEFAULT_WORKLOADS, EXPORTER_URL, EXPORTER_WINDOWS, PROM_PORT, PROM_URL,
                                  SPEC_PORT, TOP_COMMAND, DemoFlagError, DemoSettings, _remove_empty, _result_folder,
                                  console)
from specwatch.demo.run import (KEEP_RUNNING_HINT, _BenchFiles, _equivalence_outputs, _print_end, _print_intro, _spec_curve,
                                _write_report, run_demo)
from specwatch.demo.stack import DemoError, DemoStack, exporter_cost_options
from specwatch.localvllm.drafters import DrafterError, resolve_drafter

#: The names ``specwatch.demo`` had as one module, kept importable from the package.
__all__ = ["BASELINE_PORT", "BENCH_PORT", "DEFAULT_WORKLOADS", "EXPORTER_URL", "EXPORTER_WINDOWS", "KEEP_RUNNING_HINT",
           "PROM_CHECKS", "PROM_PORT", "PROM_URL", "SPEC_PORT", "TOP_COMMAND", "WITHHELD_QUERY", "WITHHELD_REASONS",
           "DemoError", "DemoFlagError", "DemoSettings", "DemoStack", "_BenchFiles", "_equivalence_outputs", "_print_decision",
           "_print_end", "_print_intro", "_print_live", "_print_per_position", "_print_prometheus_check", "_query_prometheus",
           "_remove_empty", "_result_folder", "_spec_curve", "_wait_scraped_up", "_withheld_text", "_write_report", "console",
           "demo", "exporter_cost_options", "live_measured", "live_window", "run_demo", "withheld_reasons"]


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
    out = result_dir or Path.cwd() / "results" / f"demo-{stamp}"
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
    try:
        run_demo(settings, stack, console)
    except DemoError as exc:  # the run's failures, as click's one line (exit 1)
        raise click.ClickException(str(exc)) from None


def _print_decision(decision: Decision, con: Console | None = None) -> None:
    """The decision table, how its intervals were made, the per-cell notes and whether the
    exporter's profile fits (to ``con``, default the module's ``console``), printed by
    :func:`specwatch.demo.decision.render_decision` as ``specwatch advise`` on the result
    folder prints it. ``decision``: its record (:class:`specwatch.demo.decisionrecords.Decision`)."""
    render_decision(decision, console if con is None else con)
