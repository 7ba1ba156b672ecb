"""The sweep result file: the one typed, versioned contract between ``specwatch sweep`` (writer),
``specwatch advise``, ``specwatch report`` and ``specwatch calibrate`` (readers).

Format ``specwatch_sweep_format`` 1, read and written by the records of
:mod:`specwatch.choosek.records` (:class:`SweepResult`: :meth:`SweepResult.load` checks every
field and names the file and the field in its one-line error). Here: the views the readers share
(:func:`measurements`: a typed :class:`specwatch.choosek.measurement.Measurement` per finished cell;
:func:`failed_cells`; :func:`load_measured`: the record and its measurements, refused without a
finished cell), the lock a writer holds (:func:`result_file_lock`) and the write checks.
Writing goes through :func:`specwatch.common.files.atomic_write_json` of :meth:`SweepResult.to_json`.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specwatch.choosek.measurement import BatchPoint, KChoiceError, Measurement
from specwatch.choosek.model import paired_logs
from specwatch.choosek.records import FORMAT, MEASUREMENT_KEYS, SweepError, SweepRecordError, SweepResult
from specwatch.common.locks import FileLock, LockHeld
from specwatch.specdecode.decision import StartSpread

__all__ = ["ARITHMETIC_ERRORS", "FORMAT", "aa_measurements",
           "batch_points", "MEASUREMENT_KEYS", "SweepError", "SweepRecordError", "SweepResult", "cell_key",
           "NoFinishedCell", "WriteCheckError", "check_dir_writable", "check_writable", "damaged_file_message", "failed_cells",
           "load_measured", "load_sweep", "measurements", "result_file_lock", "servers_by_config", "start_spread"]


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def load_sweep(path: str | Path) -> SweepResult:
    """Read a sweep result file into its record (:meth:`SweepResult.load`). Raises
    SweepRecordError (a SweepError: one line naming the file, and the field for a damaged one)."""
    return SweepResult.load(path)


class NoFinishedCell(SweepError):
    """A sweep result without a finished cell: nothing to report (one line naming the file, its
    status and the cells left out for failed requests; exit 1)."""


def load_measured(path: str | Path) -> tuple[SweepResult, list[Measurement]]:
    """A sweep result file's record (:func:`load_sweep`) and its :func:`measurements`, read once,
    for a reader that needs at least one finished cell (``specwatch report``). Raises
    SweepRecordError as :func:`load_sweep` and :func:`measurements` do, and
    :class:`NoFinishedCell` when no cell has finished."""
    rec = load_sweep(path)
    ms = measurements(rec)
    if not ms:
        left_out = rec.failed_cells()
        raise NoFinishedCell(
            f"{path} has no finished cell yet (status {rec.status!r}): nothing to report; run or resume "
            "specwatch sweep first" + (f". Left out for failed requests: {'; '.join(left_out)}" if left_out else ""))
    return rec, ms


def cell_key(config: str, workload: str, concurrency: int) -> tuple[str, str, int]:
    return (config, workload, int(concurrency))


def failed_cells(doc: SweepResult) -> list[str]:
    """One line per stored cell that does not count as finished (failed requests, or its server
    died), e.g. ``"ngram-k1/copy/c=2: 8 of 8 requests failed"``; such cells are left out of
    :func:`measurements` and measured again by a resumed sweep."""
    return doc.failed_cells()


def measurements(rec: SweepResult) -> list[Measurement]:
    """One :class:`specwatch.choosek.measurement.Measurement` per finished cell of a sweep result. Left
    out: cells with no successful request, cells with failed requests or whose server died (see
    :func:`failed_cells`), and the A/A cells (:func:`start_spread` reads them). Raises
    SweepRecordError for a malformed document."""
    aa = rec.aa_names
    return _measurements(rec, [c for c in rec.cells if c.config not in aa])


def aa_measurements(rec: SweepResult) -> list[Measurement]:
    """As :func:`measurements`, for the A/A cells only (``--aa-starts``: k 0, never candidates)."""
    aa = rec.aa_names
    return _measurements(rec, [c for c in rec.cells if c.config in aa])


def start_spread(rec: SweepResult, source: str | None = None) -> StartSpread | None:
    """The between-server-starts spread of a sweep (:class:`specwatch.specdecode.decision.StartSpread`)
    from its A/A cells (``--aa-starts``: other starts of the baseline measured beside it, paired
    by batch with the baseline's batches as a speculative cell is,
    :func:`specwatch.choosek.model.paired_logs`); None when the sweep has no finished A/A cell
    with two or more pairs. ``source``: the file, named in the spread's ``source``. Raises
    SweepRecordError for a malformed document."""
    aa = rec.aa_names
    if not aa:
        return None
    base = {(m.workload, m.concurrency): m for m in measurements(rec) if m.k == 0}
    cells, names = [], []
    for m in aa_measurements(rec):
        b = base.get((m.workload, m.concurrency))
        if b is None and not m.paired_baseline:  # a sequential A/A cell with no baseline cell to pair with
            cells.append([])
            continue
        # a paired A/A cell pairs with the baseline batches measured beside it (paired_logs), even
        # when the baseline's own cell is missing
        logs, _ = paired_logs(m, b if b is not None else m)
        cells.append(logs)
        if len(logs) >= 2:
            names.append(m.config)
    names = sorted(set(names))
    where = f"the A/A start{'s' if len(names) != 1 else ''} {', '.join(names)}" + (f" of {source}" if source else "")
    return StartSpread.from_cells(cells, where)


def _measurements(rec: SweepResult, cells) -> list[Measurement]:
    dynamic = {c.name: (c.speculative_config or {}).get("num_speculative_tokens_per_batch_size")
               for c in rec.configs if c.variable_width}
    seed = rec.settings.seed if rec.settings is not None else None
    out = []
    for cell in cells:
        s = cell.summary
        if s is None or not s.output_throughput or cell.problem():
            continue
        try:
            out.append(Measurement.from_cell(s, config=cell.config, k=cell.k, family=cell.family or "",
                                             variable_width=cell.config in dynamic, workload=cell.workload,
                                             concurrency=cell.max_concurrency, batches=batch_points(cell, seed),
                                             table=dynamic.get(cell.config),
                                             paired_baseline=batch_points(cell, seed, cell.baseline_batches or ())))
        except KChoiceError as exc:
            raise SweepRecordError(f"damaged sweep result: cell {cell.name}: {exc}") from None
    return out


def batch_points(cell: Any, seed: Any = None, batches: Any = None) -> tuple[BatchPoint, ...]:
    """The measured (non-warm-up) batches of a sweep cell (:class:`specwatch.choosek.records.SweepCell`)
    as :class:`specwatch.choosek.measurement.BatchPoint` (batch_index, output throughput tok/s,
    num_prompts, the sweep's ``seed``, accepted draft tokens), in the file's order; batches without
    an index or a positive throughput are left out; empty when the cell has no batch records.
    ``batches``: other batch records of the cell to convert instead (a paired cell's
    ``baseline_batches``)."""
    out = []
    for b in (cell.batches if batches is None else batches) or ():
        if b.warmup or b.batch_index is None or not b.output_throughput or b.output_throughput <= 0:
            continue
        out.append(BatchPoint(int(b.batch_index), float(b.output_throughput),
                              None if b.num_prompts is None else float(b.num_prompts), seed,
                              None if b.accepted_tokens is None else float(b.accepted_tokens)))
    return tuple(out)


def servers_by_config(doc: SweepResult) -> dict[str, Any]:
    """The latest server start of each configuration (:class:`specwatch.choosek.records.ServerStart`:
    start-up time, KV capacity)."""
    return doc.servers_by_config()


@contextmanager
def result_file_lock(result_file: Path) -> Iterator[None]:
    """Hold an exclusive, non-blocking flock for ``result_file`` (on a lock file in the temporary
    directory named after the file's absolute path, so nothing is added beside the results).
    Raises SweepError when another sweep holds it: two sweeps writing one file would each
    overwrite the other's cells."""
    key = hashlib.sha1(os.path.realpath(result_file).encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"specwatch-sweep-{key}.lock"
    try:
        lock = FileLock(path, timeout=0, note=f"sweep {result_file}")
        lock.acquire()
    except LockHeld:
        raise SweepError(f"another specwatch sweep is writing {result_file} (lock {path}); "
                         "wait for it or use another --result-file") from None
    try:
        yield
    finally:
        lock.release()


class WriteCheckError(Exception):
    """A result file or folder that cannot be written (one line naming it): a plain exception,
    printed by the command layer (:mod:`specwatch.choosek.cli`), exit 1."""

    exit_code = 1


def check_writable(path: str | Path, what: str) -> None:
    """Fail early (:class:`WriteCheckError`, one line) when ``path`` cannot be written: its nearest
    existing ancestor is not a directory, or that directory (or an existing ``path``) is not
    writable. For an existing parent directory the check creates and removes a temporary file
    there (the only test that also holds for root). Creates nothing that stays."""
    p = Path(path)
    if p.exists() and p.is_dir():
        raise WriteCheckError(f"cannot write {what} {p}: it is a directory")
    if p.exists() and not os.access(p, os.W_OK):
        raise WriteCheckError(f"cannot write {what} {p}: permission denied")
    anc = p.parent if str(p.parent) else Path(".")
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise WriteCheckError(f"cannot write {what} {p}: {anc} is not a directory")
    if anc == (p.parent if str(p.parent) else Path(".")):
        try:
            with tempfile.NamedTemporaryFile(dir=anc, prefix=".specwatch-write-check-"):
                pass
        except OSError as exc:
            raise WriteCheckError(f"cannot write {what} {p}: {exc.strerror or exc}") from None
    elif not os.access(anc, os.W_OK | os.X_OK):
        raise WriteCheckError(f"cannot write {what} {p}: {anc} is not writable")


def check_dir_writable(path: str | Path, what: str) -> None:
    """As :func:`check_writable` for a directory that may not exist yet."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise WriteCheckError(f"cannot use {what} {p}: it is not a directory")
    check_writable(p / ".specwatch-write-check", what)


#: What a result file whose every field has the right kind (:mod:`specwatch.choosek.records`
#: checked them on reading) can still raise deep in the maths: a zero or absurd value
#: (ZeroDivisionError, OverflowError, a math domain error).
ARITHMETIC_ERRORS = (ArithmeticError, ValueError)


def damaged_file_message(path, exc: BaseException) -> str:
    """The one-line error for a result file whose values the advice cannot use."""
    return (f"{path}: cannot use the values in this result file ({type(exc).__name__}: {exc}); "
            "was it edited by hand? Re-run or resume the sweep into a new file")
