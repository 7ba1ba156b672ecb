"""The sweep result file as typed records: the only module that reads a sweep document's fields.

Format ``specwatch_sweep_format`` 1 (written by :mod:`specwatch.choosek.sweep`, documented field
by field there and in ``docs/choosing-k.md``)::

    {"specwatch_sweep_format": 1, "status", "created_at", "updated_at",
     "settings": SweepSettings, "server": ServerSource, "configs": [SweepConfig],
     "servers": [ServerStart], "cells": [SweepCell], "resumed_at": [time, …] (after a resume)}

A cell's ``summary`` and ``batches`` are the bench's own records
(:class:`specwatch.bench.records.BenchCell`, :class:`specwatch.bench.records.BenchBatch`).
:meth:`SweepResult.load` reads a file (one-line errors naming the file and the field),
:meth:`SweepResult.to_json` writes what :meth:`SweepResult.from_json` read, byte for byte
(unknown keys are kept), and is what the sweep writes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specwatch.bench.records import BenchBatch, BenchCell
from specwatch.common.labels import for_terminal
from specwatch.common.records import (Anything, Bool, Int, JsonRecord, ListOf, Num, Obj, Rec, RecordError, Str, jfield, read_document,
                                      read_json_file)

FORMAT = 1
FORMAT_KEY = "specwatch_sweep_format"
#: The largest sweep result file read (a sweep of a thousand cells with their batches: a few MiB).
MAX_SWEEP_BYTES = 256 * 1024 * 1024
#: Settings that must match between a result file and a resumed sweep.
MEASUREMENT_KEYS = ("output_len", "num_prompts", "prompts_per_concurrency", "num_batches",
                    "warmup_batches", "seed", "request_rate", "target_ci", "max_batches")

_NUM, _STR, _ANY, _OBJ = Num(), Str(), Anything(), Obj()
#: Control characters (C0, DEL, C1): no name a sweep writes holds one.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class SweepError(Exception):
    """A sweep cannot start or continue (bad options, unreadable or mismatched result file,
    server that fails to start). A plain exception: the command layer
    (:mod:`specwatch.choosek.cli`) prints its one line and exits with :attr:`exit_code`."""

    #: The exit status of a command that stops on this error.
    exit_code = 1

    @property
    def message(self) -> str:
        """The one-line text (as the command prints it after ``Error: ``)."""
        return str(self)


class SweepRecordError(SweepError, RecordError):
    """A sweep result file (or document) that cannot be read: the message names it and the field.
    A :class:`SweepError` (the commands print it as one line) and a
    :class:`specwatch.common.records.RecordError`."""

    def __init__(self, message: str) -> None:
        SweepError.__init__(self, message)


class SweepFileArgumentError(SweepRecordError):
    """A sweep result argument that is not a regular file or is too large: a usage error (exit 2)."""

    exit_code = 2


@dataclass(frozen=True, kw_only=True)
class SweepSettings(JsonRecord):
    """``settings``: how the cells were measured (:meth:`specwatch.choosek.sweep.SweepPlan.settings`)."""

    workloads: tuple[str, ...] | None = jfield("workloads", ListOf(_STR))
    concurrencies: tuple[int, ...] | None = jfield("concurrencies", ListOf(Int()))
    output_len: Any = jfield("output_len", _ANY)
    num_prompts: Any = jfield("num_prompts", _ANY)
    prompts_per_concurrency: Any = jfield("prompts_per_concurrency", _ANY)
    num_batches: Any = jfield("num_batches", _ANY)
    warmup_batches: Any = jfield("warmup_batches", _ANY)
    seed: Any = jfield("seed", _ANY)
    #: Requests per second, or the text "inf".
    request_rate: Any = jfield("request_rate", _ANY)
    dataset_path: str | None = jfield("dataset_path", _STR)
    target_ci: Any = jfield("target_ci", _ANY)
    max_batches: Any = jfield("max_batches", _ANY)

    def items(self) -> list[tuple[str, Any]]:
        """(key, value) of every setting the file holds, in its order (for display)."""
        return list(self.to_json().items())

    def differences(self, new: SweepSettings) -> list[tuple[str, Any, Any]]:
        """(key, old, new) of the measurement settings (:data:`MEASUREMENT_KEYS`) this file holds
        and ``new`` gives differently, then the ShareGPT file when both name one."""
        old_d, new_d = self.to_json(), new.to_json()
        out = [(k, old_d[k], new_d.get(k)) for k in MEASUREMENT_KEYS if k in old_d and old_d[k] != new_d.get(k)]
        if self.dataset_path and new.dataset_path and self.dataset_path != new.dataset_path:
            out.append(("dataset_path", self.dataset_path, new.dataset_path))
        return out

    def extended(self, new: SweepSettings) -> SweepSettings:
        """These settings updated by ``new``'s, with the workloads and concurrencies of both (the
        file's first) and ``new``'s ShareGPT file, else this one's."""
        merged = {**self.to_json(), **new.to_json(),
                  "workloads": list(dict.fromkeys([*(self.workloads or ()), *(new.workloads or ())])),
                  "concurrencies": sorted(set(self.concurrencies or ()) | set(new.concurrencies or ())),
                  "dataset_path": new.dataset_path or self.dataset_path}
        return SweepSettings.read(merged)


@dataclass(frozen=True, kw_only=True)
class ServerSource(JsonRecord):
    """``server``: where the servers came from: ``kind`` "embedded" or "template" and the
    (redacted) ``command_template`` of a template."""

    kind: str | None = jfield("kind", _STR)
    command_template: str | None = jfield("command_template", _STR)

    def describe(self) -> str:
        """"the embedded vLLM" or "--server-command '<template>'"."""
        return "the embedded vLLM" if self.kind == "embedded" else f"--server-command {self.command_template!r}"


@dataclass(frozen=True, kw_only=True)
class SweepConfig(JsonRecord):
    """``configs[i]``: one server configuration (:class:`specwatch.choosek.sweep.ServerConfig`)."""

    name: str = jfield("name", _STR, required=True, nullable=False)
    k: int | None = jfield("k", Int())
    family: str | None = jfield("family", _STR)
    speculative_config: Mapping[str, Any] | None = jfield("speculative_config", _OBJ)
    #: The --drafter label of a draft_model configuration (optional key).
    drafter: str | None = jfield("drafter", _ANY, omit_none=True)
    #: An A/A configuration (``--aa-starts``; optional key): another start of the baseline (k 0,
    #: no speculation) measured beside it like a speculative one, whose true ratio is 1; its
    #: cells measure the between-starts spread, never a candidate. Readers that do not know the
    #: key would take it for a second baseline: advise, report and calibrate read
    #: :meth:`SweepResult.without_aa`.
    aa: bool | None = jfield("aa", Bool(), omit_none=True)

    @property
    def has_speculative_config(self) -> bool:
        """The file gives the configuration's ``speculative_config`` (null for the baseline)."""
        return self.keys is None or "speculative_config" in self.keys

    @property
    def variable_width(self) -> bool:
        """The configuration runs vLLM's dynamic table (``num_speculative_tokens_per_batch_size``)."""
        return bool((self.speculative_config or {}).get("num_speculative_tokens_per_batch_size"))


@dataclass(frozen=True, kw_only=True)
class ServerStart(JsonRecord):
    """``servers[i]``: one server start: start-up time and the KV-cache capacity it reported."""

    config: str = jfield("config", _STR, required=True, nullable=False)
    k: int | None = jfield("k", Int())
    started_at: str | None = jfield("started_at", _STR)
    startup_seconds: float | None = jfield("startup_seconds", _NUM)
    command: tuple[Any, ...] | None = jfield("command", ListOf(_ANY))
    log: str | None = jfield("log", _STR)
    kv_cache_tokens: float | None = jfield("kv_cache_tokens", _NUM)
    num_gpu_blocks: float | None = jfield("num_gpu_blocks", _NUM)
    #: Tokens per block, or the sorted sizes when the engines differ.
    block_size: Any = jfield("block_size", _ANY)
    engines: int | None = jfield("engines", Int())


@dataclass(frozen=True, kw_only=True)
class SweepCell(JsonRecord):
    """``cells[i]``: one (configuration, workload, concurrency) cell: the bench's cell summary and
    batch records, and the server's exit code when it died during the cell."""

    config: str = jfield("config", _STR, required=True, nullable=False)
    k: int = jfield("k", Int(0, 1000), required=True, nullable=False)
    family: str | None = jfield("family", _STR)
    workload: str = jfield("workload", _STR, required=True, nullable=False)
    max_concurrency: int = jfield("max_concurrency", Int(1, 1_000_000), required=True, nullable=False)
    finished_at: str | None = jfield("finished_at", _STR)
    summary: BenchCell | None = jfield("summary", Rec(BenchCell))
    batches: tuple[BenchBatch, ...] | None = jfield("batches", ListOf(Rec(BenchBatch)))
    server_exited: int | None = jfield("server_exited", _ANY, omit_none=True)
    #: "paired": measured in alternating rounds beside the baseline server (issue #37); absent
    #: (None): measured alone, one server after the other (sequential; every older file).
    mode: str | None = jfield("mode", _STR, omit_none=True)
    #: Paired mode, on a speculative cell: the baseline's batches measured beside it (batch i of
    #: both served the same prompts, back to back); on the baseline's own cell: the configuration
    #: it was measured beside.
    baseline_batches: tuple[BenchBatch, ...] | None = jfield("baseline_batches", ListOf(Rec(BenchBatch)), omit_none=True)
    paired_with: str | None = jfield("paired_with", _STR, omit_none=True)

    @property
    def paired(self) -> bool:
        """True when the cell was measured in paired rounds beside the baseline."""
        return self.mode == "paired"

    @property
    def key(self) -> tuple[str, str, int]:
        """(configuration, workload, concurrency)."""
        return (self.config, self.workload, int(self.max_concurrency))

    @property
    def name(self) -> str:
        """``ngram-k1/copy/c=2``."""
        return f"{self.config}/{self.workload}/c={self.max_concurrency}"

    def problem(self) -> str | None:
        """Why the cell does not count as finished — "8 of 8 requests failed", "the server exited
        during the cell (…)" — or None when it does."""
        s = self.summary
        failed = int((s.failed if s else None) or 0)
        total = failed + int((s.completed if s else None) or 0)
        requests = f"{failed} of {total} requests failed"
        if self.server_exited is not None:
            return f"the server exited during the cell (code {self.server_exited}" + (f"; {requests})" if failed else ")")
        return requests if failed else None

    def first_error(self) -> str | None:
        """The first error text of the cell's batches, on one line (at most 200 characters)."""
        for b in self.batches or ():
            err = b.first_error()
            if err:
                return " ".join(str(err).split())[:200]
        return None


#: The largest measured quantity a sweep can hold (tokens, milliseconds, tokens per second, counts):
#: beyond it a value is not a measurement (and its arithmetic would overflow).
MAX_MEASURED = 1e15
#: The smallest positive measured quantity (a femtosecond in milliseconds, a token in 30 years per
#: second): a positive value below it is no measurement, and its reciprocal would overflow (a
#: step of 1e-300 ms became a profile step of 0.0 s).
MIN_MEASURED = 1e-9
#: How far a cell's mean running requests (``server_running_requests``) may exceed its
#: concurrency: the bench keeps at most ``max_concurrency`` requests in flight, so more than
#: twice that (plus one) is no reading of that cell.
RUNNING_SLACK = 2.0
#: Summary fields that are fractions (0 to 1), single or per position.
_FRACTIONS = ("acceptance_rate", "output_from_drafts_ratio", "missing_draft_tokens_ratio")
_FRACTION_LISTS = ("per_position_acceptance_rates", "conditional_per_position_acceptance_rates")


def _not_measured(v: float) -> str | None:
    """Why ``v`` is no measured value, or None: negative or beyond :data:`MAX_MEASURED` ("(0 to
    1e+15)"), or positive below :data:`MIN_MEASURED`."""
    if not 0 <= v <= MAX_MEASURED:
        return f"(0 to {MAX_MEASURED:g})"
    if 0 < v < MIN_MEASURED:
        return f"(a positive value below {MIN_MEASURED:g})"
    return None


#: Summary fields that are 0 only when no request completed (and positive when one did).
_POSITIVE_WHEN_COMPLETED = ("output_throughput", "request_throughput", "duration", "total_output_tokens")


def impossible_value(summary: BenchCell, max_concurrency: int | None = None) -> str | None:
    """What no measurement can give in a cell summary, or None: a negative (or beyond
    :data:`MAX_MEASURED`, or positive below :data:`MIN_MEASURED`) count, time, token number or
    throughput, also in ``output_throughput_per_batch``; a rate outside 0–1; a mean acceptance
    length below 1; more accepted than drafted tokens; a throughput, duration or output of 0 for
    completed requests; a step time of 0 over engine steps; more mean running requests than
    :data:`RUNNING_SLACK` times the cell's concurrency (``max_concurrency``, else the summary's)
    plus one. Named by the file's key."""
    keys = {name: meta["key"] for name, meta in type(summary)._jfields()}
    for name, key in keys.items():
        v = getattr(summary, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if name in _FRACTIONS:
            if not 0.0 <= v <= 1.0:
                return f"{key} {v * 100 if name == 'acceptance_rate' else v:g} is outside 0 to " \
                       f"{'100 (percent)' if name == 'acceptance_rate' else '1'}"
        elif (why := _not_measured(v)) is not None:
            return f"{key} {v:g} is not a possible measurement {why}"
    for name in _FRACTION_LISTS:
        for i, v in enumerate(getattr(summary, name) or ()):
            if v is not None and not 0.0 <= v <= 1.0:
                return f"{keys[name]}[{i}] {v:g} is outside 0 to 1"
    for i, v in enumerate(getattr(summary, "output_throughput_per_batch", None) or ()):
        if v is not None and (why := _not_measured(v)) is not None:
            return f"output_throughput_per_batch[{i}] {v:g} is not a possible measurement {why}"
    completed = summary.completed
    if completed is not None and completed > 0:
        for name in _POSITIVE_WHEN_COMPLETED:
            if getattr(summary, name) == 0:
                return f"{keys[name]} is 0 although {completed:g} requests completed"
    if summary.server_step_duration_ms == 0 and (summary.server_engine_steps or 0) > 0:
        return (f"{keys['server_step_duration_ms']} is 0 although the server made "
                f"{summary.server_engine_steps:g} engine steps")
    c = max_concurrency if max_concurrency is not None else summary.max_concurrency
    running = summary.server_running_requests
    if c and running is not None and running > RUNNING_SLACK * c + 1:
        return (f"{keys['server_running_requests']} {running:g} is more than a cell of concurrency {c} can "
                f"hold (at most {RUNNING_SLACK:g} × {c} + 1)")
    if summary.acceptance_length is not None and 0 < summary.acceptance_length < 1:
        return f"{keys['acceptance_length']} {summary.acceptance_length:g} is below 1 (the bonus token is always accepted)"
    if summary.accepted_tokens is not None and summary.draft_tokens is not None and summary.accepted_tokens > summary.draft_tokens:
        return f"{keys['accepted_tokens']} {summary.accepted_tokens:g} is more than {keys['draft_tokens']} {summary.draft_tokens:g}"
    return None


#: Batch fields that are measurements (a batch record's throughputs, duration and counts).
_BATCH_MEASURES = ("output_throughput", "request_throughput", "duration", "completed", "failed",
                   "total_output_tokens", "total_input_tokens")


def impossible_batch_value(batch: Any) -> str | None:
    """What no measurement can give in a batch record (:class:`specwatch.bench.records.BenchBatch`),
    or None: a negative or non-finite (or beyond :data:`MAX_MEASURED`) throughput, duration or
    count, e.g. an ``output_throughput`` of −5 that would otherwise enter a paired ratio."""
    for name in _BATCH_MEASURES:
        v = getattr(batch, name, None)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if not math.isfinite(v):
            return f"{name} {v:g} is not a possible measurement (0 to {MAX_MEASURED:g})"
        if (why := _not_measured(v)) is not None:
            return f"{name} {v:g} is not a possible measurement {why}"
    index = getattr(batch, "batch_index", None)
    if index is not None and index < 0:
        return f"batch_index {index} is negative"
    return None


def _control_character(value: Any) -> str | None:
    """The first control character of a name (escaped: ``\\x1b``), or None."""
    m = _CONTROL.search(value) if isinstance(value, str) else None
    return None if m is None else ascii(m.group())[1:-1]


def _shown(value: str) -> str:
    """A name from the file, escaped for one message line (:func:`specwatch.common.labels.for_terminal`)."""
    return for_terminal(value)


def check_cells(doc: SweepResult, where: str | None) -> None:
    """Raise SweepRecordError naming the configuration or cell when ``doc`` holds what no sweep
    writes: a configuration twice; a name (configuration, workload, family, drafter) with a control
    character; a cell of a configuration the file does not list, or at another k than its
    configuration's; a cell twice (the same configuration, workload and concurrency: the sweep
    replaces a re-measured cell, so a second one was added by hand or by a merge); a cell summary
    or batch with an impossible value (:func:`impossible_value`, :func:`impossible_batch_value`);
    a batch index twice in one cell's batches; a server start with a negative value."""
    prefix = f"{where} is a damaged sweep result" if where else "damaged sweep result"
    configs = _check_configs(doc.configs, prefix)
    _check_servers(doc.servers, prefix)
    seen: set[tuple[str, str, int]] = set()
    for i, cell in enumerate(doc.cells):
        at = f"{prefix}: cells[{i}]"
        _check_names(cell, ("config", "workload", "family"), at)
        _check_cell_config(cell, configs, at)
        if cell.key in seen:
            raise SweepRecordError(f"{at}: cell {cell.name} appears twice (one measurement per "
                                   "configuration, workload and concurrency)")
        seen.add(cell.key)
        _check_cell_values(cell, at)


def _check_names(rec: Any, keys: Sequence[str], at: str) -> None:
    """Refuse a control character in the names ``keys`` of ``rec`` (``at``: the message's start)."""
    for key in keys:
        value = getattr(rec, key)
        ch = _control_character(value)
        if ch:
            raise SweepRecordError(f"{at}: '{key}' holds the control character {ch} ('{_shown(value)}')")


def _check_configs(configs: Sequence[SweepConfig], prefix: str) -> dict[str, SweepConfig]:
    """The configurations by name; refuses a control character in a name or in a text value of
    its ``speculative_config`` (``method``, ``model``: shown by advise and report), and a
    configuration twice."""
    out: dict[str, SweepConfig] = {}
    for i, cfg in enumerate(configs):
        _check_names(cfg, ("name", "family", "drafter"), f"{prefix}: configs[{i}]")
        for key, value in (cfg.speculative_config or {}).items():
            ch = _control_character(value)
            if ch:
                raise SweepRecordError(f"{prefix}: configs[{i}]: 'speculative_config.{_shown(str(key))}' holds the "
                                       f"control character {ch} ('{_shown(value)}')")
        if cfg.name in out:
            raise SweepRecordError(f"{prefix}: configs[{i}]: configuration {cfg.name} appears twice")
        if cfg.aa and (cfg.k not in (None, 0) or cfg.speculative_config):
            got = f"k {cfg.k}" if cfg.k not in (None, 0) else "a speculative_config"
            raise SweepRecordError(f"{prefix}: configs[{i}]: A/A configuration {cfg.name} must run without "
                                   f"speculation (k 0, no speculative_config), got {got}")
        out[cfg.name] = cfg
    plain = [(i, c) for i, c in enumerate(configs) if not c.aa and c.k in (None, 0) and not c.speculative_config]
    if len(plain) > 1:  # one baseline: a second one would silently replace it in every reader
        i, c = plain[1]
        raise SweepRecordError(f"{prefix}: configs[{i}]: {c.name} is a second configuration without speculation "
                               f"beside {plain[0][1].name} (one baseline per sweep; an A/A start is marked \"aa\": true)")
    aa = [c.name for c in configs if c.aa]
    if aa and not plain:
        raise SweepRecordError(f"{prefix}: A/A start{'s' if len(aa) > 1 else ''} {', '.join(aa)} but no baseline "
                               "configuration (k 0, no speculation) to measure them against")
    return out


def _check_servers(servers: Sequence[ServerStart], prefix: str) -> None:
    """Refuse a server start with a negative start-up time or KV-cache capacity."""
    for i, srv in enumerate(servers):
        for key in ("startup_seconds", "kv_cache_tokens", "num_gpu_blocks"):
            v = getattr(srv, key)
            if v is not None and v < 0:
                raise SweepRecordError(f"{prefix}: servers[{i}]: '{key}' {v:g} is negative")


def _check_cell_config(cell: SweepCell, configs: Mapping[str, SweepConfig], at: str) -> None:
    """Refuse a cell of a configuration ``configs`` does not list, or at another k than its configuration's."""
    if not configs:  # a document without configurations (built in code) names none to check against
        return
    cfg = configs.get(cell.config)
    if cfg is None:
        raise SweepRecordError(f"{at} (cell {cell.name}): configuration {cell.config} is not "
                               f"in 'configs' ({', '.join(configs)})")
    if cfg.k is not None and cfg.k != cell.k:
        raise SweepRecordError(f"{at} (cell {cell.name}): 'k' {cell.k}, but configuration "
                               f"{cell.config} has k {cfg.k}")


def _check_cell_values(cell: SweepCell, at: str) -> None:
    """Refuse an impossible value in the cell's summary or batches, and a batch index twice in one list."""
    bad = None if cell.summary is None else impossible_value(cell.summary, cell.max_concurrency)
    if bad:
        raise SweepRecordError(f"{at} (cell {cell.name}): summary.{bad}")
    for field in ("batches", "baseline_batches"):
        indices: set[int] = set()
        for j, b in enumerate(getattr(cell, field) or ()):
            bad = impossible_batch_value(b)
            if bad:
                raise SweepRecordError(f"{at} (cell {cell.name}): {field}[{j}].{bad}")
            if b.batch_index is not None:
                if b.batch_index in indices:
                    raise SweepRecordError(f"{at} (cell {cell.name}): {field}[{j}].batch_index "
                                           f"{b.batch_index} appears twice")
                indices.add(b.batch_index)


#: Other specwatch documents by their format key (a file of the wrong kind is named as what it is).
_OTHER_FORMATS = {"specwatch_bench_format": "a specwatch bench result (specwatch advise reads bench files: "
                                            "--baseline FILE --speculative FILE, or one FILE of both servers)",
                  "specwatch_demo_format": "a specwatch demo summary (demo-summary.json)",
                  "specwatch_demo_advice_format": "specwatch advise's JSON (--json)",
                  "specwatch_advice_format": "specwatch advise's JSON (--json)",
                  "advise_format": "specwatch advise's JSON (--json)",
                  "specwatch_cost_profile": "a specwatch cost profile"}


def _what_it_is(data: Any) -> str:
    """``": it is …"`` naming what a JSON document that is no sweep result of this format is ("" when
    it says nothing)."""
    if isinstance(data, dict):
        if FORMAT_KEY in data:
            v = data[FORMAT_KEY]
            if not isinstance(v, int) or isinstance(v, bool):  # "1", 1.0, true: not a format number at all
                return f": its '{FORMAT_KEY}' is {for_terminal(json.dumps(v))[:40]}, not an integer (the file is damaged)"
            return f": it is a sweep result of format {v}, which this specwatch does not read"
        for key, what in _OTHER_FORMATS.items():
            if key in data:
                return f": it is {what}"
        if {"servers", "workloads", "k"} <= data.keys():  # demo.records.is_demo_summary's shape
            return ": it is a specwatch demo summary (demo-summary.json)"
        if "cells" in data and "configs" in data:
            return f": it has no '{FORMAT_KEY}' key"
        return ""
    kind = "an array" if isinstance(data, list) else "null" if data is None else type(data).__name__
    return f": its JSON is {kind}, not an object"


@dataclass(frozen=True, kw_only=True)
class SweepResult(JsonRecord):
    """A sweep result document (``specwatch sweep --result-file``)."""

    format: int = jfield(FORMAT_KEY, Int(), nullable=False, default=FORMAT)
    status: str | None = jfield("status", _STR)
    created_at: str | None = jfield("created_at", _STR)
    updated_at: str | None = jfield("updated_at", _STR)
    settings: SweepSettings | None = jfield("settings", Rec(SweepSettings))
    server: ServerSource | None = jfield("server", Rec(ServerSource))
    configs: tuple[SweepConfig, ...] = jfield("configs", ListOf(Rec(SweepConfig)), nullable=False, default=())
    servers: tuple[ServerStart, ...] = jfield("servers", ListOf(Rec(ServerStart)), nullable=False, default=())
    cells: tuple[SweepCell, ...] = jfield("cells", ListOf(Rec(SweepCell)), nullable=False, default=())
    resumed_at: tuple[Any, ...] | None = jfield("resumed_at", ListOf(_ANY), nullable=False, omit_none=True)

    @classmethod
    def from_json(cls, data: Any, where: str | None = None) -> SweepResult:
        """The record of a parsed sweep document; ``where`` names it in errors (the file). A
        document without ``specwatch_sweep_format`` is format 1. Raises SweepRecordError (also for
        a duplicated cell or an impossible value: :func:`check_cells`)."""
        if not isinstance(data, Mapping) or data.get(FORMAT_KEY, FORMAT) != FORMAT:
            raise SweepRecordError(f"{where or 'the document'} is not a specwatch sweep result (format {FORMAT})")
        doc = read_document(cls, data, where, "sweep result", SweepRecordError)
        check_cells(doc, where)
        return doc

    @classmethod
    def load(cls, path: str | Path) -> SweepResult:
        """Read a sweep result file. Raises SweepRecordError (exit 1: one line naming the file and,
        for a damaged file, the field) when it is unreadable, empty, cut short, not UTF-8 JSON, not
        a sweep result of format 1 (the key is required in a file; a file of another kind is named
        as what it is), has no ``cells`` list, has cells but no ``configs``, or is damaged
        (:func:`check_cells`); SweepFileArgumentError (exit 2) when it is not a regular file (a
        FIFO, ``/dev/zero``) or is larger than :data:`MAX_SWEEP_BYTES`."""
        p = Path(path)
        data = read_json_file(p, "sweep result", SweepRecordError, max_bytes=MAX_SWEEP_BYTES,
                              shape_error=SweepFileArgumentError)
        if not isinstance(data, dict) or data.get(FORMAT_KEY) != FORMAT:
            raise SweepRecordError(f"{p} is not a specwatch sweep result (format {FORMAT}){_what_it_is(data)}")
        if not isinstance(data.get("cells"), list):
            raise SweepRecordError(f"{p} has no 'cells' list")
        doc = cls.from_json(data, str(p))
        if doc.cells and not doc.configs:  # a sweep lists each configuration before its first cell
            raise SweepRecordError(f"{p} is a damaged sweep result: 'configs' is empty, but its cells name "
                                   f"{', '.join(dict.fromkeys(for_terminal(c.config) for c in doc.cells))}")
        return doc

    # -- views ---------------------------------------------------------------------------------
    def failed_cells(self) -> list[str]:
        """One line per stored cell that does not count as finished, e.g.
        ``"ngram-k1/copy/c=2: 8 of 8 requests failed"``."""
        return [f"{c.name}: {p}" for c in self.cells if (p := c.problem())]

    def servers_by_config(self) -> dict[str, ServerStart]:
        """The latest server start of each configuration."""
        return {s.config: s for s in self.servers}

    @property
    def measurement_mode(self) -> str | None:
        """How the speculative cells were measured (issue #37): ``paired`` (each beside the
        baseline server, alternating rounds on the same prompts), ``sequential`` (one server after
        the other; every file written before paired mode), ``mixed`` (a resume switched), or None
        without speculative cells."""
        modes = {("paired" if c.paired else "sequential") for c in self.cells if c.k > 0}
        if not modes:
            return None
        return modes.pop() if len(modes) == 1 else "mixed"

    def configs_by_name(self) -> dict[str, SweepConfig]:
        return {c.name: c for c in self.configs}

    @property
    def aa_names(self) -> frozenset[str]:
        """The names of the A/A configurations (``--aa-starts``: other starts of the baseline)."""
        return frozenset(c.name for c in self.configs if c.aa)

    def aa_cells(self) -> tuple[SweepCell, ...]:
        """The cells of the A/A configurations."""
        names = self.aa_names
        return tuple(c for c in self.cells if c.config in names)

    def without_aa(self) -> SweepResult:
        """The document without its A/A configurations, their server starts and cells: what
        the readers choose k from (an A/A start is k 0 and must not be taken for the baseline)."""
        names = self.aa_names
        if not names:
            return self
        return self.replace(configs=tuple(c for c in self.configs if c.name not in names),
                            servers=tuple(s for s in self.servers if s.config not in names),
                            cells=tuple(c for c in self.cells if c.config not in names))

    def workloads(self) -> list[str]:
        """The settings' workloads, then those of the cells, without repeats."""
        return list(dict.fromkeys([*((self.settings.workloads if self.settings else None) or ()),
                                   *(c.workload for c in self.cells)]))

    def replace(self, **changes: Any) -> SweepResult:
        return dataclasses.replace(self, **changes)

    def with_cell(self, cell: SweepCell) -> SweepResult:
        """The document with ``cell`` last, replacing a stored cell of the same key."""
        return self.replace(cells=tuple(c for c in self.cells if c.key != cell.key) + (cell,))

    def only_cells(self, keep: Sequence[SweepCell]) -> SweepResult:
        return self.replace(cells=tuple(keep))


__all__ = ["FORMAT", "FORMAT_KEY", "MAX_MEASURED", "MAX_SWEEP_BYTES", "MEASUREMENT_KEYS", "ServerSource",
           "ServerStart", "SweepCell", "SweepConfig", "SweepError",
           "SweepFileArgumentError", "SweepRecordError", "SweepResult", "SweepSettings", "check_cells", "impossible_value"]
