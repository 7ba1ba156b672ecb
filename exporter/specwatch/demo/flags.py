"""The demo's flags and defaults: the embedded default's ports and URLs, the exporter's
windows, the workloads, the console, and :class:`DemoSettings` (the command's flags, checked),
with the result folder's check."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

import click
from rich.console import Console

from specwatch.common.defaults import BASELINE_VLLM_PORT, BENCH_METRICS_PORT, EXPORTER_PORT, PROMETHEUS_PORT, VLLM_PORT

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
