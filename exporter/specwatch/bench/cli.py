"""``specwatch bench``: click command; flag names follow ``vllm bench serve`` where the meaning
is the same. Builds one frozen :class:`~specwatch.bench.runner.BenchConfig` and calls
:func:`~specwatch.bench.runner.run_bench`.

Exit status: 0 when the run completed and every measured request succeeded; 1 when some
measured requests failed (the run still goes on to the end and writes all results) or the run
failed at start (result file status "failed" with the reason); 2 for bad flags; 130 when
interrupted (the result files then hold every finished batch).
"""

from __future__ import annotations

import math
import re
import sys

import click
from rich.console import Console

from specwatch.bench.results import render_tables
from specwatch.bench.runner import BenchConfig, BenchConfigError, BenchInterrupted, RunResult, run_bench
from specwatch.bench.workloads import DEFAULT_VOCAB_SIZE, WORKLOADS, WorkloadError, WorkloadOptions, load_sharegpt, parse_workloads
from specwatch.common.defaults import BENCH_METRICS_PORT, MAX_RESPONSE_BYTES, VLLM_PORT
from specwatch.common.params import FloatRange, int_list
from specwatch.common.processes import install_stop_signals

DEFAULT_METRICS_PORT = BENCH_METRICS_PORT

#: BenchConfig field → the flag that sets it (error messages name the flag).
FIELD_FLAGS = {
    "base_url": "--base-url", "baseline_url": "--baseline-url", "role": "--role", "paired": "--paired",
    "concurrencies": "--max-concurrency", "num_prompts": "--num-prompts", "num_batches": "--num-batches",
    "warmup_batches": "--warmup-batches", "request_rate": "--request-rate",
    "equivalence_output_len": "--equivalence-output-len", "timeout": "--timeout",
    "read_timeout": "--read-timeout", "max_response_bytes": "--max-response-bytes",
}

def flag_message(message: str) -> str:
    """``message`` with every BenchConfig field name replaced by its flag
    (``request_rate must be > 0`` → ``--request-rate must be > 0``)."""
    for name in sorted(FIELD_FLAGS, key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){name}\b", FIELD_FLAGS[name], message)
    return message


class BenchInputError(click.ClickException):
    """Bad input found before the run starts (e.g. a missing or unreadable ShareGPT file): one
    line, exit 2, and no result file is written."""

    exit_code = 2


def _workloads(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    try:
        return parse_workloads(value)
    except WorkloadError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("bench", context_settings={"show_default": True})
@click.option("--base-url", default=f"http://127.0.0.1:{VLLM_PORT}", help="Root URL of the (speculative) vLLM server.")
@click.option("--baseline-url", default=None,
              help="Root URL of a baseline server: the same run is made against it first, then the table compares both.")
@click.option("--paired", is_flag=True, default=False,
              help="With --baseline-url: alternate the two servers batch by batch on the same prompts "
                   "(ABBA rounds, both servers up) instead of the whole run on one, then the other.")
@click.option("--role", type=click.Choice(["speculative", "baseline"]), default="speculative",
              help="Role label of --base-url when no --baseline-url is given.")
@click.option("--model", default=None, help="Model name (default: first id of GET /v1/models).")
@click.option("--served-model-name", default=None, help="Name sent in the request's model field (default: --model).")
@click.option("--dataset-name", "workloads", default="copy", callback=_workloads,
              help=f"Comma-separated workloads: {', '.join(WORKLOADS)}.")
@click.option("--dataset-path", default=None, type=click.Path(dir_okay=False), help="ShareGPT-format JSON file for the sharegpt workload.")
@click.option("--max-concurrency", "concurrencies", default="1", callback=int_list(1, dedupe=False),
              help="Comma-separated concurrencies, e.g. 1,8,32.")
@click.option("--num-prompts", type=click.IntRange(min=1), default=None, help="Requests per batch (default: the concurrency).")
@click.option("--num-batches", type=click.IntRange(min=1), default=3, help="Measured batches per workload and concurrency.")
@click.option("--warmup-batches", type=click.IntRange(min=0), default=1,
              help="Warm-up batches before them (recorded, excluded from results).")
@click.option("--request-rate", type=float, default=math.inf, help="Requests per second (Poisson arrivals); inf sends all at once.")
@click.option("--output-len", type=click.IntRange(min=1), default=None,
              help="Output tokens per request (default: the workload's: 256, or natural end for chat).")
@click.option("--ignore-eos/--no-ignore-eos", default=None, help="Override the workload's ignore_eos.")
@click.option("--temperature", type=FloatRange(min=0.0), default=None, help="Override the workload's temperature.")
@click.option("--seed", type=int, default=0, help="Seed of prompt sampling (same prompts on every server).")
@click.option("--input-len", "prompt_words", type=click.IntRange(min=1), default=200, help="Words / token ids per generated prompt.")
@click.option("--vocab-size", type=click.IntRange(min=2), default=DEFAULT_VOCAB_SIZE,
              help="Vocabulary size for random-output token ids (SmolLM2: 49152).")
@click.option("--api-key", envvar="OPENAI_API_KEY", default=None, show_default=False, show_envvar=True,
              help="Bearer token for the servers (never written to results or logs).")
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535), default=DEFAULT_METRICS_PORT,
              help="Serve specwatch_bench_* metrics here (0: off).")
@click.option("--metrics-linger", type=FloatRange(min=0.0), default=0.0,
              help="Seconds to keep serving --metrics-port after the run completes, so Prometheus scrapes the last batch.")
@click.option("--metrics-url", default=None, help="Where to read the server's Prometheus metrics (default <base-url>/metrics).")
@click.option("--baseline-metrics-url", default=None, help="Same for the baseline server.")
@click.option("--equivalence/--no-equivalence", default=True, help="Greedy-output equivalence check (needs --baseline-url).")
@click.option("--equivalence-output-len", type=click.IntRange(min=1), default=128, help="Tokens per equivalence prompt.")
@click.option("--save-result/--no-save-result", default=True, help="Write JSON + CSV results (after every batch).")
@click.option("--result-dir", default=".", type=click.Path(file_okay=False), help="Directory of the result files.")
@click.option("--result-filename", default=None,
              help="JSON file name (CSV beside it); an existing file of this name is overwritten. "
                   "Default specwatch-bench-<YYYYmmdd-HHMMSS>.json, made unique with a -2, -3, ... suffix "
                   "(never overwrites an existing file).")
@click.option("--timeout", type=FloatRange(min=0.1), default=3600.0, help="Seconds a request may take in total before it fails.")
@click.option("--read-timeout", type=FloatRange(min=0.1), default=300.0,
              help="Seconds without any byte from the server before a request fails (stalled server).")
@click.option("--max-response-bytes", type=click.IntRange(min=1), default=MAX_RESPONSE_BYTES,
              help="Bytes one streamed response may have; a larger one fails the request.")
@click.option("--progress/--no-progress", default=True, help="Live progress bar.")
def bench(workloads, concurrencies, dataset_path, output_len, ignore_eos, temperature, seed, prompt_words,
          vocab_size, metrics_port, **kw) -> None:
    """Drive OpenAI-compatible vLLM servers with the workloads of the published measurements (docs/load-generator.md) and report throughput,
    latency (TTFT, TPOT, ITL, E2E) and the spec-decode acceptance of every batch.

    \b
    Exit codes: 0 all requests ok; 1 some measured requests failed (all
    results are still written) or the run failed at start; 2 bad flags;
    130 interrupted.
    """
    # Piped output (CI logs, files) gets a wide table instead of rich's 80-column default.
    console = Console(width=None if sys.stdout.isatty() else 160)
    try:
        options = WorkloadOptions(output_len=output_len, ignore_eos=ignore_eos, temperature=temperature,
                                  seed=seed, vocab_size=vocab_size, prompt_words=prompt_words,
                                  dataset_path=dataset_path)
        config = BenchConfig(workloads=workloads, concurrencies=concurrencies, options=options,
                             metrics_port=metrics_port or None, **kw)
    except (WorkloadError, BenchConfigError) as exc:
        raise click.UsageError(flag_message(str(exc))) from None
    if "sharegpt" in config.workloads:
        # Read before anything runs: a missing/unreadable/empty file is one line and exit 2, and
        # no "failed" result file lands in --result-dir (issue #25).
        try:
            load_sharegpt(config.options.dataset_path or "")
        except WorkloadError as exc:
            raise BenchInputError(f"--dataset-path: {exc}") from None
    if config.equivalence and not config.baseline_url:
        config = BenchConfig(**{**config.__dict__, "equivalence": False})
    install_stop_signals()  # SIGTERM (docker stop, timeout) ends the run like Ctrl-C: files say "interrupted"
    started = RunResult(config)
    try:
        result = run_bench(config, result=started)
    except BenchInterrupted as exc:
        result = exc.result
        if result.status == "complete":  # Ctrl-C during --metrics-linger: the run itself finished
            _finish(console, result)
            return
        _print(console, result)
        measured, warm = result.batch_counts()
        console.print(f"[yellow]interrupted: {measured} measured + {warm} warm-up batches kept"
                      + (f" in {result.json_path} and {result.csv_path}" if result.json_path else ""))
        sys.exit(130)
    except OSError as exc:  # e.g. the disk filled up while writing results
        raise click.ClickException(f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
                                   + _written(started)) from None
    except (WorkloadError, RuntimeError) as exc:
        raise click.ClickException(str(exc) + _written(started)) from None
    _finish(console, result)


def _written(result: RunResult) -> str:
    """Where a failed run left its result files (status "failed", the error inside), or ""."""
    paths = [p for p in (result.json_path, result.csv_path) if p is not None and p.exists()]
    return f" (the run's result files, status failed: {' and '.join(str(p.resolve()) for p in paths)})" if paths else ""


def _finish(console, result) -> None:
    """Print a finished run's tables and file names; exit 1 if any measured request failed."""
    _print(console, result)
    if result.json_path:
        console.print(f"results: {result.json_path}  {result.csv_path}")
    failed, total = result.request_counts()
    if failed:
        console.print(f"[red]{failed} of {total} requests failed")
        sys.exit(1)


def _print(console, result) -> None:
    for t in render_tables(result.batches, result.equivalence):
        console.print(t)
    failed = sum(b.failed for b in result.batches)
    if failed:
        first = next(b.errors[0]["error"] for b in result.batches if b.errors)
        console.print(f"[red]{failed} request(s) failed; first error: {first}")
