"""The k-choice commands: ``specwatch sweep`` (measure), ``specwatch calibrate`` (cost profile),
``specwatch advise`` (recommend k) and ``specwatch report`` (HTML). Thin: parse and check flags,
then call :mod:`.sweep`, :mod:`.calibrate`, :mod:`.advise` and :mod:`.report`, which share the
result-file contract of :mod:`.resultfile`."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import click
import requests
from rich.table import Table

from specwatch.bench.workloads import WORKLOADS
from specwatch.choosek.advise import (
    DEFAULT_LIVE_CONCURRENCIES,
    LiveAdviceResult,
    PrometheusError,
    SweepAdviceResult,
    advice_document,
    advise_sweep,
    curves_from_exporter,
    curves_from_prometheus,
    live_advices,
    make_console,
    render_left_out,
    render_result,
    request_failure,
)
from specwatch.choosek.calibrate import (
    CalibrationError,
    load_forward_json,
    num_positions,
    profile_from_forward,
    profile_from_live,
    profile_from_sweep,
    sample_live,
)
from specwatch.choosek.drafterstudy import family_labels, pick_drafters
from specwatch.demo.report import (DemoReportError, advise_demo, is_bench_file_of_both_servers, is_demo_summary_file,
                                          render_advice, write_demo_report)
from specwatch.choosek.model import DEFAULT_TOLERANCE, KChoiceError, parse_mix

from specwatch.choosek.report import render_report
from specwatch.choosek.resultfile import (
    ARITHMETIC_ERRORS,
    SweepError,
    WriteCheckError,
    check_dir_writable,
    check_writable,
    damaged_file_message,
    load_measured,
    load_sweep,
    measurements,
)
from specwatch.choosek.sweep import (
    DEFAULT_CONCURRENCIES,
    DEFAULT_KS,
    DEFAULT_MAX_BATCHES,
    DEFAULT_NUM_BATCHES,
    DEFAULT_OUTPUT_LEN,
    DEFAULT_PROMPTS_PER_CONCURRENCY,
    DEFAULT_TARGET_CI,
    DEFAULT_WARMUP_BATCHES,
    DEFAULT_WORKLOADS,
    SweepPlan,
    build_configs,
    check_dataset,
    render_command,
    run_sweep,
    uses_speculation,
)
from specwatch.common.files import atomic_write_json, atomic_write_text, measurement_file_kind, same_file
from specwatch.common.params import FloatRange, int_list
from specwatch.common.processes import install_stop_signals
from specwatch.localvllm.drafters import DrafterError, resolve_drafter
from specwatch.specdecode.cost import CostModel
from specwatch.exporter.config import ConfigError, check_profile_estimates
from specwatch.specdecode.costprofile import CostProfile, CostProfileError, load_profile


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


#: The plain exceptions of the library modules below (records, result file, advise): each is one
#: line, and the command prints it as click prints its own errors ("Error: …"), exit ``exit_code``.
ONE_LINE_ERRORS = (SweepError, WriteCheckError, PrometheusError)


class OneLineErrors(click.Command):
    """A command that prints :data:`ONE_LINE_ERRORS` as one line (``Error: <message>``) and exits with
    their ``exit_code`` (1; 2 for a result-file argument that is no regular file), as it did when they
    were click exceptions."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ONE_LINE_ERRORS as exc:
            err = click.ClickException(str(exc))
            err.exit_code = getattr(exc, "exit_code", 1)
            raise err from None


# click callbacks: flag errors exit 2 with a Usage line and the option's name

def _spec_configs_cb(ctx, param, value):
    for text in value or ():
        try:
            build_configs((), (text,), False)
        except SweepError as exc:
            raise click.BadParameter(exc.message.removeprefix("--speculative-config ")) from None
    return value


def _workloads_cb(ctx, param, value):
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
        argv = render_command(value, 8000, {"method": "ngram", "num_speculative_tokens": 1})
    except SweepError as exc:
        raise click.BadParameter(exc.message.removeprefix("--server-command").lstrip(": ")) from None
    except ValueError as exc:  # shlex: unbalanced quotes
        raise click.BadParameter(f"cannot split it like a shell: {exc}") from None
    if shutil.which(argv[0]) is None:
        raise click.BadParameter(f"program {argv[0]!r} not found (not on PATH, or not an executable file)")
    return value


class FlagError(click.ClickException):
    """A bad flag value: one line naming the flag, exit 2 (nothing started, nothing written)."""

    exit_code = 2


def _check_output_dir(path: Path, flag: str) -> None:
    """Exit 2 (one line) when the directory ``path`` would be written into does not exist: a typo
    in it is not a reason to create directories."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.exists() and not parent.is_symlink():  # (a file in its place: check_writable says so)
        raise FlagError(f"{flag} {path}: the directory {parent} does not exist (create it first)")


def _check_not_input(output: Path, inputs, flag: str) -> None:
    """Exit 2 (one line) when ``output`` is one of the ``inputs`` files, or an existing file that
    holds measurements (a sweep, bench or demo result, :func:`measurement_file_kind`): writing it
    would destroy what was measured. An earlier advice JSON, report or cost profile may be
    written again."""
    for src in inputs:
        if src is not None and same_file(output, src):
            raise FlagError(f"{flag} {output} is the input {src} itself: writing it would destroy it; give another {flag}")
    kind = measurement_file_kind(output)
    if kind is not None:
        raise FlagError(f"{flag} {output} holds {kind}: writing it would destroy those measurements; give another {flag}")


def _check_output(path: Path, flag: str, inputs=()) -> None:
    """Every check an output flag's file gets before anything runs (each exit 2, one line): its
    directory exists (:func:`_check_output_dir`), it is none of the ``inputs`` and holds no
    measurements (:func:`_check_not_input`), and it can be written (``check_writable``)."""
    _check_output_dir(path, flag)
    _check_not_input(path, inputs, flag)
    check_writable(path, flag)


def _target_ci_cb(ctx, param, value):
    if value is not None and not (0.0 < value < 1.0):
        raise FlagError(f"--target-ci must be in (0, 1) (a relative half width: 0.05 = ±5 %), got {value:g}")
    return value


class DrafterFlagError(click.ClickException):
    """A bad --drafter: one line naming it, exit 2 (nothing started)."""

    exit_code = 2


def _drafter_models(drafters, server_command, model_dir) -> list[tuple[str, str]]:
    """(label, model) per --drafter: the embedded vLLM's drafters are resolved and checked
    (:func:`specwatch.localvllm.drafters.resolve_drafter`: unknown name, damaged directory or a
    vocabulary unlike the target's → exit 2); with --server-command the value is passed verbatim."""
    out: list[tuple[str, str]] = []
    for d in drafters:
        if server_command is not None:
            out.append((d.rstrip("/").rsplit("/", 1)[-1] or d, d))
            continue
        try:
            label, path = resolve_drafter(d, Path(model_dir) if model_dir else None)
        except DrafterError as exc:
            raise DrafterFlagError(str(exc)) from None
        out.append((label.rstrip("/").rsplit("/", 1)[-1], str(path)))
    labels = [lab for lab, _ in out]
    if len(set(labels)) != len(labels):
        raise DrafterFlagError(f"--drafter: the same drafter name twice ({', '.join(labels)})")
    return out


@click.command("sweep", cls=OneLineErrors)
@click.option("--result-file", type=click.Path(dir_okay=False, path_type=Path), default=Path("specwatch-sweep.json"),
              show_default=True, help="One JSON file with every cell; rerun with the same file to resume.")
@click.option("--k", "ks", default=",".join(map(str, DEFAULT_KS)), show_default=True, callback=int_list(1),
              help="Comma-separated num_speculative_tokens for ngram servers (ignored with --speculative-config).")
@click.option("--speculative-config", "spec_configs", multiple=True, callback=_spec_configs_cb,
              help="A --speculative-config JSON (with num_speculative_tokens); repeat for several servers.")
@click.option("--drafter", "drafters", multiple=True, metavar="NAME|DIR",
              help="Add method draft_model servers with this drafter at every --k (repeatable; a drafter dimension beside k "
                   "and concurrency). Embedded vLLM: target, close, far (specwatch prepare-model --drafter) or a model "
                   "directory; with --server-command: the draft model as the server knows it (e.g. Qwen/Qwen3-0.6B).")
@click.option("--baseline/--no-baseline", default=True, show_default=True, help="Include a server without speculation (k = 0).")
@click.option("--workloads", default=",".join(DEFAULT_WORKLOADS), show_default=True, callback=_workloads_cb,
              help="Comma-separated workloads of the load generator (copy, word-chain, random-output, code-return, explain, "
                   "random-words, sharegpt with --dataset-path).")
@click.option("--dataset-path", type=click.Path(dir_okay=False), default=None,
              help="ShareGPT-format JSON file for the sharegpt workload.")
@click.option("--concurrency", "concurrencies", default=",".join(map(str, DEFAULT_CONCURRENCIES)), show_default=True, callback=int_list(1),
              help="Comma-separated max concurrencies.")
@click.option("--output-len", type=click.IntRange(min=1), default=DEFAULT_OUTPUT_LEN, show_default=True, help="Output tokens per request.")
@click.option("--num-prompts", type=click.IntRange(min=1), default=None,
              help="Requests per batch (default: --prompts-per-concurrency × concurrency).")
@click.option("--prompts-per-concurrency", type=click.IntRange(min=1), default=DEFAULT_PROMPTS_PER_CONCURRENCY, show_default=True)
@click.option("--num-batches", type=click.IntRange(min=1), default=DEFAULT_NUM_BATCHES, show_default=True,
              help="Measured batches per cell (the minimum: see --target-ci).")
@click.option("--target-ci", type=float, default=DEFAULT_TARGET_CI, show_default=True, callback=_target_ci_cb,
              help="Noise-aware cells: repeat measured batches until the 95 % interval of the cell's throughput is "
                   "within this fraction of its mean (0.05 = ±5 %), or --max-batches ran.")
@click.option("--max-batches", type=click.IntRange(min=1), default=None,
              help=f"Most measured batches per cell (>= --num-batches; equal to it: a fixed number of batches). "
                   f"Default: {DEFAULT_MAX_BATCHES}, or --num-batches when that is larger.")
@click.option("--warmup-batches", type=click.IntRange(min=0), default=DEFAULT_WARMUP_BATCHES, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--server-command", default=None, callback=_server_command_cb,
              help="Server command template with {port} and {spec_args} (or {speculative_config}), e.g. "
                   "\"vllm serve MODEL --port {port} {spec_args}\". Default: the embedded vLLM (CPU).")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Server port (default: a free port for each server). Paired (the default mode): the speculative "
                   "servers' port; the baseline beside them takes a free port, printed when it starts.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--model-dir", default=None, help="Embedded vLLM: the prepared model directory (default: prepare it).")
@click.option("--startup-timeout", type=FloatRange(min=0, min_open=True), default=900.0, show_default=True,
              help="Seconds to wait for each server.")
@click.option("--lock/--no-lock", default=True, show_default=True,
              help="Hold flock /tmp/specwatch-vllm.lock while a template server runs (the embedded one always does).")
@click.option("--aa-starts", type=click.IntRange(0, 20), default=0, show_default=True,
              help="A/A check: start the baseline again N more times (aa-1 … aa-N), each measured beside the "
                   "baseline like a speculative server (true ratio 1). Their spread between starts is added to "
                   "every interval advise and report give; without it the intervals hold one start of each "
                   "server only (docs/choosing-k.md). Each costs one configuration's time.")
@click.option("--sequential", is_flag=True, default=False,
              help="One server at a time, each cell measured alone (for hosts that cannot hold two servers). Default: "
                   "paired — the baseline server stays up beside each speculative one and every cell alternates "
                   "the two batch by batch on the same prompts (--target-ci then applies to the paired ratio).")
@click.option("--api-key", envvar=["SPECWATCH_API_KEY", "OPENAI_API_KEY"], default=None, show_envvar=True,
              help="Bearer key for the servers (never written or logged).")
@click.option("--log-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Server logs (default: <result-file stem>-logs/ beside it).")
@click.option("--progress/--no-progress", default=True, show_default=True)
def sweep(result_file, ks, spec_configs, drafters, baseline, workloads, dataset_path, concurrencies, output_len, num_prompts,
          prompts_per_concurrency, num_batches, target_ci, max_batches, warmup_batches, seed, server_command, port, host, model_dir,
          startup_timeout, lock, aa_starts, sequential, api_key, log_dir, progress) -> None:
    """Run the load generator over server configurations × workloads × concurrencies.

    Default: the embedded vLLM (SmolLM2-135M on CPU) as a baseline and with ngram speculation at
    k = 1, 2, 3, 4, 6, 8; workloads copy and random-output; concurrency 1 and 4; 64-token outputs —
    sized for 2 CPU cores. Then: specwatch advise RESULT, specwatch report RESULT.
    """
    if max_batches is None:
        max_batches = max(DEFAULT_MAX_BATCHES, num_batches)
    if max_batches < num_batches:
        raise FlagError(f"--max-batches ({max_batches}) must be >= --num-batches ({num_batches})")
    drafter_models = _drafter_models(drafters, server_command, model_dir)
    try:
        configs = build_configs(ks, spec_configs, baseline, drafter_models, aa_starts)
    except SweepError as exc:
        raise click.UsageError(exc.message) from None
    if server_command is not None and any(c.speculative_config for c in configs) and not uses_speculation(server_command):
        raise click.UsageError("--server-command has no {spec_args} (or {speculative_config}): the speculative servers "
                               "would run without speculation; add {spec_args} where the server takes --speculative-config")
    wls, concs = workloads, concurrencies
    try:
        check_dataset(wls, dataset_path)
    except SweepError as exc:
        raise click.UsageError(exc.message) from None
    check_writable(result_file, "--result-file")
    check_dir_writable(log_dir or result_file.with_name(result_file.stem + "-logs"), "--log-dir")
    plan = SweepPlan(configs, wls, concs, output_len, num_prompts, prompts_per_concurrency, num_batches,
                     warmup_batches, seed, dataset_path=dataset_path, target_ci=target_ci, max_batches=max_batches,
                     paired=not sequential)
    echo = click.echo
    if server_command is None:
        echo("specwatch sweep: embedded vLLM on CPU; the defaults (64-token outputs, 2×concurrency prompts per "
             "batch, 1 warm-up + 2-6 measured batches, concurrency 1,4) are sized for 2 cores. This run: "
             f"{output_len}-token outputs, {prompts_per_concurrency}×concurrency prompts per batch, "
             f"{warmup_batches} warm-up + {num_batches}-{max_batches} measured batches (until the 95 % interval is "
             f"within ±{target_ci * 100:g} %), concurrency {','.join(map(str, concs))}. "
             "CPU numbers are noisy: compare within one sweep.")
    echo(f"configs: {', '.join(c.name for c in configs)}; workloads: {', '.join(wls)}; "
         f"concurrency: {', '.join(map(str, concs))}; results: {result_file}")
    install_stop_signals()
    try:
        doc = run_sweep(plan, result_file, template=server_command, port=port, host=host, log_dir=log_dir,
                        startup_timeout=startup_timeout, lock=lock, api_key=api_key, model_dir=model_dir,
                        progress=progress, echo=echo)
    except KeyboardInterrupt:
        echo(f"interrupted: finished cells are in {result_file}; run the same command to resume", err=True)
        sys.exit(130)
    except OSError as exc:  # the result file or a log cannot be written (a full disk, a read-only mount)
        raise click.ClickException(f"cannot write {exc.filename or result_file}: {exc.strerror or exc}; finished cells "
                                   f"are in {result_file} up to the last write that succeeded") from None
    if doc.status == "incomplete":
        names = {c.name for c in configs}
        bad = doc.only_cells([c for c in doc.cells if c.config in names and c.workload in wls
                              and c.max_concurrency in concs]).failed_cells()
        raise click.ClickException(
            f"sweep incomplete: {_plural(len(bad), 'cell')} had failed requests ({'; '.join(bad[:3])}"
            f"{'; …' if len(bad) > 3 else ''}); they are kept in {result_file} but not used by advise/report; "
            "run the same command to measure them again")
    echo(f"sweep complete: {result_file}\nnext: specwatch advise {result_file}; specwatch report {result_file}")


@click.command("advise", cls=OneLineErrors)
@click.argument("result_file", required=False, type=click.Path(exists=True, path_type=Path))
@click.option("--exporter", "exporter_url", default=None, help="Live: the specwatch exporter's /metrics URL (e.g. http://127.0.0.1:19337/metrics).")
@click.option("--prometheus", "prometheus_url", default=None, help="Live: Prometheus base URL (uses the recording rules).")
@click.option("--window", default="5m", show_default=True, help="Live (exporter): the window label of the curve (falls back to lifetime).")
@click.option("--concurrency", "concurrencies", default=",".join(map(str, DEFAULT_LIVE_CONCURRENCIES)), show_default=True,
              callback=int_list(1),
              help="Live: running requests per engine to advise for.")
@click.option("--tolerance", type=float, default=DEFAULT_TOLERANCE, show_default=True,
              help="Relative noise tolerance: the smallest k within it of the best wins.")
@click.option("--candidates", type=click.Choice(["measured", "all"]), default="measured", show_default=True,
              help="Sweep: recommend only k that were measured, or any k up to the largest (predicted only).")
@click.option("--cost-profile", "cost_profile", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Live: the measured step times (specwatch calibrate); without it the speedups are a built-in "
                   "guess, labelled basis=default.")
@click.option("--method", default=None, help="Live: the speculative method to look up in the cost profile (default: its first).")
@click.option("--drafter", default=None, help="Live: the drafter to look up in the cost profile (draft_model, eagle).")
@click.option("--step-cost-per-draft-token", "old_cost_a", hidden=True, default=None, expose_value=True)
@click.option("--step-cost-per-draft-token-per-running-request", "old_cost_b", hidden=True, default=None, expose_value=True)
@click.option("--base-config", default=None, help="Live: the speculative config to extend (JSON; default ngram, lookup 2-5).")
@click.option("--acceptance", type=click.Choice(["measured", "curve"]), default="measured", show_default=True,
              help="Sweep: tokens per step of a measured k from its own run (measured) or from the largest k's curve (curve).")
@click.option("--basis", type=click.Choice(["measured", "model"]), default="measured", show_default=True,
              help="Sweep: score a measured k by its measured throughput (measured; the model fills in k not run) "
                   "or every k by the model's prediction (model).")
@click.option("--fit-k", "fit_k", default=None, callback=int_list(1, dedupe=False),
              help="Sweep: fit the step cost only on the runs at these k (e.g. 1,8) and predict the others (held-out check).")
@click.option("--mix", default=None, metavar="WORKLOAD=WEIGHT,...",
              help="Sweep: each workload's share of the work (output tokens) for the all-workloads advice, e.g. "
                   "copy=3,random-output=1 (default: the same work from every workload; throughputs combine through time).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the advice as JSON here (specwatch_advice_format 3; a demo folder's: specwatch_demo_advice_format 1).")
@click.option("--baseline", "baseline_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Two bench files: the baseline server's (with --speculative); the demo's decision table.")
@click.option("--speculative", "speculative_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Two bench files: the speculative server's (with --baseline).")
@click.option("--unpaired", is_flag=True, default=False,
              help="Demo folder / two bench files: compare cells whose batches are not paired, unpaired (labelled so).")
def advise(result_file, exporter_url, prometheus_url, window, concurrencies, tolerance, candidates,
           cost_profile, method, drafter, old_cost_a, old_cost_b, base_config, acceptance, basis, fit_k, mix,
           json_path, baseline_file, speculative_file, unpaired) -> None:
    """Recommend num_speculative_tokens per concurrency from a sweep RESULT_FILE (or live data), or
    decide again from a `specwatch demo` result folder (RESULT_FILE a folder) or two bench files
    (--baseline FILE --speculative FILE): the demo's decision table."""
    console = make_console()
    demo_folder = result_file if result_file is not None and (result_file.is_dir() or is_demo_summary_file(result_file)) else None
    if result_file is not None and demo_folder is None and not (baseline_file or speculative_file) \
            and is_bench_file_of_both_servers(result_file):  # one `specwatch bench --baseline-url` file
        baseline_file = speculative_file = result_file
        result_file = None
    if demo_folder is not None or baseline_file or speculative_file or unpaired:  # the demo's decision (demo.report)
        if exporter_url or prometheus_url or (result_file is not None and demo_folder is None) \
                or (demo_folder is not None and (baseline_file or speculative_file)):
            raise click.UsageError("give a demo result folder, or --baseline FILE --speculative FILE, and nothing else")
        if json_path:
            _check_output(json_path, "--json", (baseline_file, speculative_file))
        try:
            got = advise_demo(folder=None if demo_folder is None else (demo_folder if demo_folder.is_dir() else demo_folder.parent),
                              baseline=baseline_file, speculative=speculative_file, unpaired=unpaired)
        except DemoReportError as exc:
            raise FlagError(str(exc)) from None
        render_advice(got, console)
        if json_path:
            atomic_write_json(json_path, got.to_json())
        return
    sources = [x for x in (result_file, exporter_url, prometheus_url) if x]
    if len(sources) != 1:
        raise click.UsageError("give exactly one of RESULT_FILE, --exporter or --prometheus")
    if not (0.0 <= tolerance < 1.0):
        raise click.BadParameter("must be in [0, 1)", param_hint="--tolerance")
    if mix is not None and result_file is None:
        raise FlagError("--mix applies to a sweep RESULT_FILE (the all-workloads advice), not to live advice")
    if old_cost_a is not None or old_cost_b is not None:
        raise click.UsageError("--step-cost-per-draft-token(-per-running-request) are gone: measured step times come "
                               "from a cost profile (specwatch calibrate, then --cost-profile FILE)")
    profile = None
    if cost_profile is not None:
        try:
            profile = load_profile(cost_profile)
            check_profile_estimates(profile)  # the exporter's start-up check: no absurd speedups
        except CostProfileError as exc:
            raise click.BadParameter(str(exc), param_hint="--cost-profile") from None
        except ConfigError as exc:
            raise click.BadParameter(str(exc).removeprefix("--cost-profile: "), param_hint="--cost-profile") from None
    cost = CostModel()  # the step-cost fit's prior for k not run in a sweep (choosek.model)
    if json_path:
        if result_file is not None and same_file(json_path, result_file):
            raise click.BadParameter("is the sweep result itself: writing it would destroy the sweep", param_hint="--json")
        _check_output(json_path, "--json")

    if result_file is not None:
        result = _advise_from_sweep(result_file, console, tolerance=tolerance, candidates=candidates, prior=cost,
                                    acceptance=acceptance, fit_k=fit_k, basis=basis, mix=mix)
    else:
        result = _advise_live(exporter_url, prometheus_url, window=window, concurrencies=concurrencies, tolerance=tolerance,
                              profile=profile, profile_path=cost_profile, method=method, drafter=drafter,
                              base_config=base_config)
    render_result(result, console)
    if json_path:
        try:
            atomic_write_json(json_path, advice_document(result))
        except OSError as exc:
            raise click.ClickException(f"cannot write {json_path}: {exc.strerror or exc}") from None


def _advise_from_sweep(result_file: Path, console, *, tolerance, candidates, prior, acceptance, fit_k, basis,
                       mix) -> SweepAdviceResult:
    """``advise RESULT_FILE``: the sweep's advice (its left-out cells said first). Raises
    click.ClickException (one line) for a flag the sweep cannot serve or values it cannot use."""
    doc = load_sweep(result_file)
    mix_weights = None
    if mix is not None:
        try:
            mix_weights = parse_mix(mix, doc.workloads())
        except KChoiceError as exc:
            raise FlagError(str(exc)) from None
    left_out = doc.failed_cells()
    render_left_out(left_out, console)
    ms = measurements(doc)
    if fit_k is not None:
        run_ks = {m.k for m in ms if m.k > 0}
        missing = sorted({k for k in fit_k if k not in run_ks})
        if missing:  # a flag the file cannot serve: exit 2, as any other wrong flag
            raise FlagError(
                f"--fit-k: no finished run at k = {', '.join(map(str, missing))} in {result_file} "
                f"(runs at k = {', '.join(map(str, sorted(run_ks))) or 'none'})")
    try:
        advices = advise_sweep(doc, tolerance=tolerance, candidates=candidates, prior=prior, acceptance=acceptance,
                               fit_ks=fit_k, basis=basis, mix=mix_weights, measured=ms, source=str(result_file))
    except KChoiceError as exc:  # named by the file, as report and calibrate name it
        msg = str(exc)
        raise click.ClickException(msg if msg.startswith(str(result_file)) else f"{result_file}: {msg}") from None
    except SweepError:
        raise
    except ARITHMETIC_ERRORS as exc:
        raise click.ClickException(damaged_file_message(result_file, exc)) from None
    labels = family_labels(doc)
    return SweepAdviceResult(source=str(result_file), advices=tuple(advices), labels=labels,
                             picks=tuple(pick_drafters(advices, labels, tolerance)), left_out=tuple(left_out),
                             status=doc.status, tolerance=tolerance, candidates=candidates,
                             fit_k=None if fit_k is None else tuple(fit_k), acceptance=acceptance, basis=basis, mix=mix_weights,
                             mode=doc.measurement_mode)


def _advise_live(exporter_url, prometheus_url, *, window, concurrencies, tolerance, profile, profile_path, method, drafter,
                 base_config) -> LiveAdviceResult:
    """``advise --exporter/--prometheus``: the live curves' advice. Raises click exceptions (one
    line) for a bad flag, an unreadable source or no curve."""
    base: dict[str, Any] | None = None
    if base_config:
        try:
            base = json.loads(base_config)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--base-config") from None
        if not isinstance(base, dict):
            raise click.BadParameter("must be a JSON object", param_hint="--base-config")
    bases: dict[tuple[str, ...], str] = {}
    if exporter_url:
        try:
            r = requests.get(exporter_url, timeout=10)
            r.raise_for_status()
        except requests.RequestException as exc:
            raise click.ClickException(f"cannot read {exporter_url}: {request_failure(exporter_url, exc)}") from None
        try:
            curves = curves_from_exporter(r.text, window, bases)
        except KChoiceError as exc:
            raise click.ClickException(f"{exporter_url} is not the specwatch exporter's /metrics: {exc}") from None
        source = exporter_url
    else:
        curves = curves_from_prometheus(prometheus_url, bases=bases)
        source = prometheus_url
    if not curves:
        hint = "no speculative traffic yet?"
        if exporter_url and "vllm:" in r.text and "specwatch_" not in r.text:
            hint = "this looks like vLLM's own /metrics: point --exporter at the specwatch exporter (specwatch serve)"
        raise click.ClickException(f"no per-position acceptance rates at {source} ({hint})")
    if profile is not None and method is not None and all(m != method for m, _ in profile.methods()):
        raise click.BadParameter(f"{profile.source} has no curve for method {method!r} "
                                 f"(it has {', '.join(m for m, _ in profile.methods()) or 'none'})", param_hint="--method")
    items = live_advices(curves, concurrencies, profile, tolerance, base, method=method, drafter=drafter, bases=bases)
    return LiveAdviceResult(source=source, items=tuple(items), concurrencies=tuple(concurrencies), tolerance=tolerance,
                            profile=profile, profile_path=None if profile is None else str(profile_path), method=method,
                            drafter=drafter)


@click.command("report", cls=OneLineErrors)
@click.argument("result_file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="HTML file to write (default: the result file with .html).")
@click.option("--tolerance", type=float, default=DEFAULT_TOLERANCE, show_default=True, help="As for specwatch advise.")
@click.option("--candidates", type=click.Choice(["measured", "all"]), default="measured", show_default=True)
@click.option("--basis", type=click.Choice(["measured", "model"]), default="measured", show_default=True,
              help="As for specwatch advise.")
@click.option("--title", default="specwatch sweep report", show_default=True)
def report(result_file: Path, output: Path | None, tolerance: float, candidates: str, basis: str, title: str) -> None:
    """Render a self-contained HTML report (embedded PNG plots) of a sweep RESULT_FILE (or of a
    `specwatch demo` result: its demo-summary.json, written to report.html beside it)."""
    if not (0.0 <= tolerance < 1.0):
        raise click.BadParameter("must be in [0, 1)", param_hint="--tolerance")
    if output is not None and same_file(output, result_file):
        raise click.BadParameter("is the sweep result itself: writing it would destroy the sweep", param_hint="--output")
    if is_demo_summary_file(result_file):  # a `specwatch demo` result: its own renderer, report.html beside it
        out = output or result_file.parent / "report.html"
        _check_output(out, "--output")
        try:
            written = write_demo_report(result_file.parent, out)
        except DemoReportError as exc:
            raise click.ClickException(str(exc)) from None
        except OSError as exc:
            raise click.ClickException(f"cannot write {out}: {exc.strerror or exc}") from None
        click.echo(f"report written: {written} ({written.stat().st_size // 1024} KiB)")
        return
    doc, usable = load_measured(result_file)  # NoFinishedCell (a SweepError: one line) without a finished cell
    out = output or result_file.with_suffix(".html")
    if same_file(out, result_file):
        raise click.BadParameter(f"{out} is the sweep result itself: writing it would destroy the sweep "
                                 "(give another --output)", param_hint="--output")
    _check_output(out, "--output")
    try:
        text = render_report(doc, tolerance=tolerance, candidates=candidates, basis=basis, title=title, measured=usable,
                             source=str(result_file))
    except KChoiceError as exc:
        raise click.ClickException(f"{result_file}: {exc}") from None
    except SweepError:
        raise
    except ARITHMETIC_ERRORS as exc:
        raise click.ClickException(damaged_file_message(result_file, exc)) from None
    try:
        atomic_write_text(out, text)
    except OSError as exc:
        raise click.ClickException(f"cannot write {out}: {exc.strerror or exc}") from None
    click.echo(f"report written: {out} ({len(text) // 1024} KiB)")


def render_profile(profile: CostProfile, console) -> None:
    """The profile's points as a table: t0(b), and t(b, k) with the cost ratio c = t / t0."""
    prov = profile.provenance
    console.print(f"[bold]{profile.name}[/bold] — {prov.get('source')}, {prov.get('hardware')}; model {prov.get('model')}; "
                  f"vLLM {prov.get('vllm_version') or '?'}" + ("; [yellow]forward pass only[/yellow]" if profile.forward_only else ""))
    t = Table(title="step time (ms) against running requests b; c = speculative / plain step at that b "
                    "(the same workload's, as the file holds it)")
    t.add_column("configuration")
    t.add_column("b", justify="right")
    t.add_column("step ms", justify="right")
    t.add_column("c(k, b)", justify="right")
    for p in profile.plain:
        t.add_row("plain (no speculation)", f"{p.running_requests:.2f}", f"{p.step_seconds * 1000:.2f}", "1")
    for c in profile.speculative:
        for p in c.points:
            # the file's own c (against the same workload's plain step) where it has one (format 2)
            ratio = p.cost_ratio if p.cost_ratio is not None else p.step_seconds / profile.plain_step(p.running_requests).seconds
            t.add_row(f"{c.method}{'' if c.drafter is None else ' (' + Path(c.drafter).name + ')'} k={c.k}",
                      f"{p.running_requests:.2f}", f"{p.step_seconds * 1000:.2f}", f"{ratio:.2f}")
    console.print(t)


@click.command("calibrate", cls=OneLineErrors)
@click.option("--from-sweep", "sweep_file", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="A specwatch sweep result with a baseline and speculative configurations.")
@click.option("--baseline-url", default=None, help="Live: the baseline server (no speculation), e.g. http://127.0.0.1:8001.")
@click.option("--url", "spec_url", default=None, help="Live: the speculative server, e.g. http://127.0.0.1:8000.")
@click.option("--duration", type=FloatRange(min=1), default=300.0, show_default=True,
              help="Live: seconds to sample both servers (send traffic to both meanwhile).")
@click.option("--interval", type=FloatRange(min=0.5), default=10.0, show_default=True, help="Live: seconds per sample.")
@click.option("--from-forward-json", "forward_file", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="GPU hosts: the JSON of `vllm bench forward --output-json` (forward pass only).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The cost profile (YAML) to write.")
@click.option("--name", default=None, help="Profile name (default: the output file's stem).")
@click.option("--method", default=None, help="Live / forward: the speculative method (ngram, draft_model, eagle, …).")
@click.option("--drafter", default=None, help="Live: the draft model (name or path) for draft_model/eagle.")
@click.option("--hardware", default=None, help="Provenance: the hardware (default: this machine, for --from-sweep).")
@click.option("--model", "model", default=None, help="Provenance: the target model.")
@click.option("--served-model-name", default=None, help="Provenance: the served model name the profile applies to.")
@click.option("--vllm-version", default=None, help="Provenance: the vLLM version measured.")
def calibrate(sweep_file, baseline_url, spec_url, duration, interval, forward_file, output, name, method, drafter,
              hardware, model, served_model_name, vllm_version) -> None:
    """Write a cost profile (measured step times) from a sweep, two live servers, or vllm bench forward."""
    sources = [x for x in (sweep_file, baseline_url or spec_url, forward_file) if x]
    if len(sources) != 1:
        raise click.UsageError("give exactly one source: --from-sweep FILE, --baseline-url with --url, or --from-forward-json FILE")
    if (baseline_url is None) != (spec_url is None):
        raise click.UsageError("live calibration needs both --baseline-url and --url")
    _check_output(output, "--output", (sweep_file, forward_file))
    name = name or output.stem
    prov = {"hardware": hardware, "model": model, "served_model_name": served_model_name, "vllm_version": vllm_version}
    console = make_console()
    try:
        if sweep_file is not None:
            doc = load_sweep(sweep_file)
            left_out: list[str] = []
            profile = profile_from_sweep(doc, name=name, source_path=str(sweep_file), provenance=prov, notes=left_out)
            for line in left_out:
                console.print(line, markup=False, highlight=False, soft_wrap=True)
        elif forward_file is not None:
            if not method or not hardware or not model:
                raise click.UsageError("--from-forward-json needs --method, --hardware and --model (the JSON does not say)")
            forward = load_forward_json(forward_file)
            try:
                profile = profile_from_forward(forward, name=name, method=method, provenance=prov)
            except CalibrationError as exc:
                raise CalibrationError(f"{forward_file}: {exc}") from None
        else:
            if not method:
                raise click.UsageError("live calibration needs --method (vLLM's /metrics does not say which method runs)")
            if not model:
                raise click.UsageError("live calibration needs --model (provenance)")
            urls = {"baseline": baseline_url.rstrip("/") + "/metrics", "speculative": spec_url.rstrip("/") + "/metrics"}
            try:
                k = num_positions(urls["speculative"])
            except (requests.RequestException, ValueError) as exc:
                raise click.ClickException(f"cannot read {urls['speculative']}: {exc}") from None
            if k < 1:
                raise click.ClickException(f"{urls['speculative']} shows no speculative decoding (no per-position counters)")
            console.print(f"sampling {urls['baseline']} and {urls['speculative']} (k = {k}) every {interval:g} s for "
                          f"{duration:g} s: send traffic to both now")
            try:
                samples = sample_live(urls, duration=duration, interval=interval,
                                      on_sample=lambda role, b, t: console.print(f"  {role}: b {b:.2f}, step {t * 1000:.1f} ms"))
            except requests.RequestException as exc:
                raise click.ClickException(f"cannot read the servers: {request_failure('', exc)}") from None
            prov = {**prov, "hardware": hardware or "unknown (set --hardware)",
                    "how": f"two live servers sampled every {interval:g} s for {duration:g} s: step time = Δ ITL sum / "
                           "Δ ITL count, b = Δ ITL count / Δ iteration count; binned by b, medians"}
            profile = profile_from_live(samples, k=k, method=method, drafter=drafter, name=name, provenance=prov)
    except CostProfileError as exc:
        # the profile made from the input did not validate: name the input, not the internal draft
        text = str(exc).removeprefix(f"<profile {name}>: ")
        src = sweep_file or forward_file
        raise click.ClickException(f"{src}: cannot make a valid cost profile of it ({text})" if src is not None
                                   else text) from None
    except CalibrationError as exc:
        raise click.ClickException(str(exc)) from None
    except (click.ClickException, *ONE_LINE_ERRORS):  # a SweepError (an unreadable or damaged sweep), a usage error
        raise
    except ARITHMETIC_ERRORS as exc:
        raise click.ClickException(damaged_file_message(sweep_file, exc)) from None
    try:
        atomic_write_text(output, profile.dumps())
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror or exc}") from None
    render_profile(profile, console)
    console.print(f"cost profile written: {output}\nuse it: specwatch serve --cost-profile {output} …; "
                  f"specwatch advise --cost-profile {output} …")
