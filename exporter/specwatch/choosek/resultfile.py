"""The sweep result file: the one typed, versioned contract between ``specwatch sweep`` (writer),
``specwatch advise`` and ``specwatch report`` (readers).

Format ``specwatch_sweep_format`` 1 (documented field by field in :mod:`specwatch.choosek.sweep`
and ``docs/choosing-k.md``). Reading goes through :func:`load_result` (shape checks, one-line
errors) and :func:`measurements` (typed :class:`specwatch.choosek.model.Measurement` per finished
cell); writing through :func:`specwatch.common.files.atomic_write_json` under
:func:`result_file_lock`.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from specwatch.choosek.model import KChoiceError, Measurement
from specwatch.common.locks import FileLock, LockHeld

FORMAT = 1
#: Settings that must match between a result file and a resumed sweep.
MEASUREMENT_KEYS = ("output_len", "num_prompts", "prompts_per_concurrency", "num_batches",
                    "warmup_batches", "seed", "request_rate", "target_ci", "max_batches")



class SweepError(click.ClickException):
    """A sweep cannot start or continue (bad options, unreadable or mismatched result file,
    server that fails to start)."""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def load_result(path: str | Path) -> dict[str, Any]:
    """Read a sweep result file and check its shape (see the module doc). Raises SweepError if it
    is unreadable, not UTF-8 JSON, not a sweep result, or has malformed configs/servers/cells."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SweepError(f"cannot read {p}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise SweepError(f"{p} is not a specwatch sweep result (not UTF-8 text: {exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise SweepError(f"{p} is not valid JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:  # an integer of > 4300 digits, nesting too deep
        raise SweepError(f"{p} is not a usable sweep result: {type(exc).__name__}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("specwatch_sweep_format") != FORMAT:
        raise SweepError(f"{p} is not a specwatch sweep result (format {FORMAT})")
    if not isinstance(doc.get("cells"), list):
        raise SweepError(f"{p} has no 'cells' list")
    problem = _shape_problem(doc)
    if problem:
        raise SweepError(f"{p} is a damaged sweep result: {problem}")
    return doc


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _shape_problem(doc: Mapping[str, Any]) -> str | None:
    """What is malformed in a sweep result document (None when its shape is fine)."""
    for key in ("settings", "server"):
        if key in doc and doc[key] is not None and not isinstance(doc[key], dict):
            return f"'{key}' is not an object"
    for key in ("configs", "servers", "resumed_at"):
        if key in doc and not isinstance(doc[key], list):
            return f"'{key}' is not a list"
    for key in ("workloads", "concurrencies"):
        if key in (doc.get("settings") or {}) and not isinstance(doc["settings"][key], list):
            return f"settings '{key}' is not a list"
    for i, c in enumerate(doc.get("configs") or []):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            return f"configs[{i}] is not an object with a 'name'"
        if c.get("speculative_config") is not None and not isinstance(c["speculative_config"], dict):
            return f"configs[{i}] ({c['name']}): 'speculative_config' is not an object"
    for i, s in enumerate(doc.get("servers") or []):
        if not isinstance(s, dict) or not isinstance(s.get("config"), str):
            return f"servers[{i}] is not an object with a 'config'"
    for i, c in enumerate(doc.get("cells") or []):
        if not isinstance(c, dict):
            return f"cells[{i}] is not an object"
        for key, ok, what in (("config", isinstance(c.get("config"), str), "a string"),
                              ("workload", isinstance(c.get("workload"), str), "a string"),
                              ("max_concurrency", _is_int(c.get("max_concurrency")), "an integer"),
                              ("k", _is_int(c.get("k")), "an integer")):
            if not ok:
                return f"cells[{i}]: '{key}' is missing or not {what}"
        if not 1 <= c["max_concurrency"] <= 1_000_000:
            return f"cells[{i}]: 'max_concurrency' {c['max_concurrency']} is out of range (1 to 1000000)"
        if not 0 <= c["k"] <= 1000:
            return f"cells[{i}]: 'k' {c['k']} is out of range (0 to 1000)"
        summary = c.get("summary")
        if summary is not None and not isinstance(summary, dict):
            return f"cells[{i}]: 'summary' is not an object"
        for key in ("output_throughput", "completed", "failed"):
            v = (summary or {}).get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                return f"cells[{i}]: summary '{key}' is not a number"
        if "batches" in c and not isinstance(c["batches"], list):
            return f"cells[{i}]: 'batches' is not a list"
    return None


def cell_key(config: str, workload: str, concurrency: int) -> tuple[str, str, int]:
    return (config, workload, int(concurrency))


def cell_problem(cell: Mapping[str, Any]) -> str | None:
    """Why a stored cell does not count as finished — "8 of 8 requests failed", "the server exited
    during the cell (…)" — or None when it does."""
    summary = cell.get("summary") or {}
    failed = int(summary.get("failed") or 0)
    total = failed + int(summary.get("completed") or 0)
    requests = f"{failed} of {total} requests failed"
    if cell.get("server_exited") is not None:
        return f"the server exited during the cell (code {cell['server_exited']}" + (f"; {requests})" if failed else ")")
    return requests if failed else None


def failed_cells(doc: Mapping[str, Any]) -> list[str]:
    """One line per stored cell that does not count as finished (failed requests, or its server
    died), e.g. ``"ngram-k1/copy/c=2: 8 of 8 requests failed"``; such cells are left out of
    :func:`measurements` and measured again by a resumed sweep. ``doc`` as from :func:`load_result`."""
    out = []
    for cell in doc.get("cells", []):
        problem = cell_problem(cell)
        if problem:
            out.append(f"{cell['config']}/{cell['workload']}/c={cell['max_concurrency']}: {problem}")
    return out


def measurements(doc: Mapping[str, Any]) -> list[Measurement]:
    """One :class:`specwatch.choosek.model.Measurement` per finished cell of a sweep result. Left out:
    cells with no successful request, and cells with failed requests or whose server died (see
    :func:`failed_cells`). Raises SweepError for a malformed document."""
    problem = _shape_problem(doc) if isinstance(doc.get("cells", []), list) else "'cells' is not a list"
    if problem:
        raise SweepError(f"damaged sweep result: {problem}")
    dynamic = {c.get("name") for c in doc.get("configs") or () if isinstance(c, Mapping)
               and isinstance(c.get("speculative_config"), Mapping)
               and c["speculative_config"].get("num_speculative_tokens_per_batch_size")}
    out = []
    for cell in doc.get("cells", []):
        summary = cell.get("summary") or {}
        thr = summary.get("output_throughput")
        if not thr or cell_problem(cell):
            continue
        rec = {**summary, "workload": cell["workload"], "max_concurrency": cell["max_concurrency"]}
        try:
            out.append(Measurement.from_record(rec, config=cell["config"], k=int(cell["k"]), family=cell.get("family", ""),
                                               variable_width=cell["config"] in dynamic))
        except (KChoiceError, KeyError, TypeError, ValueError) as exc:
            raise SweepError(f"damaged sweep result: cell {cell['config']}/{cell['workload']}/c={cell['max_concurrency']}: {exc}") from None
    return out


def servers_by_config(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The latest server start of each configuration (start-up time, KV capacity)."""
    out: dict[str, dict[str, Any]] = {}
    for s in doc.get("servers", []):
        out[s["config"]] = s
    return out


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


def check_writable(path: str | Path, what: str) -> None:
    """Fail early (click.ClickException, one line) when ``path`` cannot be written: its nearest
    existing ancestor is not a directory, or that directory (or an existing ``path``) is not
    writable. For an existing parent directory the check creates and removes a temporary file
    there (the only test that also holds for root). Creates nothing that stays."""
    p = Path(path)
    if p.exists() and p.is_dir():
        raise click.ClickException(f"cannot write {what} {p}: it is a directory")
    if p.exists() and not os.access(p, os.W_OK):
        raise click.ClickException(f"cannot write {what} {p}: permission denied")
    anc = p.parent if str(p.parent) else Path(".")
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise click.ClickException(f"cannot write {what} {p}: {anc} is not a directory")
    if anc == (p.parent if str(p.parent) else Path(".")):
        try:
            with tempfile.NamedTemporaryFile(dir=anc, prefix=".specwatch-write-check-"):
                pass
        except OSError as exc:
            raise click.ClickException(f"cannot write {what} {p}: {exc.strerror or exc}") from None
    elif not os.access(anc, os.W_OK | os.X_OK):
        raise click.ClickException(f"cannot write {what} {p}: {anc} is not writable")


def check_dir_writable(path: str | Path, what: str) -> None:
    """As :func:`check_writable` for a directory that may not exist yet."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise click.ClickException(f"cannot use {what} {p}: it is not a directory")
    check_writable(p / ".specwatch-write-check", what)


#: What a hand-edited but well-formed result file can still raise deep in the maths (a zero or
#: absurd count, a string where a number belongs, a nesting too deep for json).
DAMAGED_FILE_ERRORS = (ValueError, TypeError, KeyError, IndexError, ZeroDivisionError, OverflowError,
                       AttributeError, RecursionError)


def damaged_file_message(path, exc: BaseException) -> str:
    """The one-line error for a result file whose values the advice cannot use."""
    return (f"{path}: cannot use the values in this result file ({type(exc).__name__}: {exc}); "
            "was it edited by hand? Re-run or resume the sweep into a new file")
