"""The demo's decision table as typed records: the only module that knows its fields.

:func:`specwatch.demo.decision.decide` builds a :class:`Decision` from the two bench
results of a ``specwatch demo`` run; the demo stores its ``to_json`` in ``demo-summary.json``
(key ``decision``, :class:`specwatch.demo.records.DemoSummary`), and the console
(:mod:`specwatch.demo`) and ``report.html`` (:mod:`specwatch.demo.report`) render it through
:mod:`specwatch.demo.decision`'s formatters. How each number is computed is in
:mod:`specwatch.demo.decision`'s docstring; this module declares the fields, their JSON
keys and units.

The document, in the key order it has always been written in::

    {"k", "rows": [DecisionRow], "cost_lines": {"<concurrency>": CostLine | null},
     "profile_fit": [ProfileFit], "how": {basis: text}, "tolerance", "profile"?}

``profile`` (:class:`DecisionProfile`, the exporter profile the plain-step check used) is added by
:func:`specwatch.demo.report.demo_decision`.

**Formats.** ``decision_format`` 2 (written first; issue #36): the k to run comes from the one
decision rule, :func:`specwatch.specdecode.decision.decide`, over off, the run's k and the
what-if k′; each row adds ``verdict``, ``confidence`` (:meth:`~specwatch.specdecode.decision.Pick.confidence_text`),
``pick`` (:meth:`~specwatch.specdecode.decision.Pick.to_json`), ``never_accepted`` and
``disagreement``; its choice has no ``at_lower``/``at_value``/``at_upper``; an estimate may say
``paired: false`` (an unpaired comparison, asked for). A document without the key is format 1
(the three-scenario choice), read and rendered as written. Every older document reads and writes
unchanged (``Decision.from_json(x).to_json() == x``, unknown keys kept): rows whose choice has no
``certain`` (a file written before the k to run was marked uncertain), a choice whose ``k`` is null
and whose ``run`` is ``withheld`` (a file written before the demo always chose a k). Speedups are
ratios over running without speculation (1 = no change); step times are in milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from specwatch.common.records import (Bool, Int, JsonRecord, ListOf, MapOf, Num, Obj, Rec, RecordError, Str, jfield,
                                      read_document)

_NUM, _STR, _INT = Num(), Str(), Int()

#: The decision document's format (key :data:`FORMAT_KEY`); a document without the key is format 1.
FORMAT = 2
READABLE_FORMATS = (1, 2)
FORMAT_KEY = "decision_format"


class DecisionRecordError(RecordError):
    """A decision document that cannot be read: the message names it and the field."""


@dataclass(frozen=True, kw_only=True)
class DecisionEstimate(JsonRecord):
    """One speedup estimate with its 95 % interval (a row's ``measured`` and ``calibrated``; the
    base of :class:`WhatIf`), written from a :class:`specwatch.specdecode.decision.Estimate`:
    ``value`` ≥ ``lower``… ``upper`` (speculative over baseline, > 0), ``basis`` (``measured``,
    ``calibrated``, ``profile``, ``extrapolated``) and ``verdict`` (``pays`` when lower > 1,
    ``loses`` when upper < 1, else ``cannot_tell``)."""

    value: float | None = jfield("value", _NUM)
    lower: float | None = jfield("lower", _NUM)
    upper: float | None = jfield("upper", _NUM)
    basis: str | None = jfield("basis", _STR)
    verdict: str | None = jfield("verdict", _STR)
    #: False for an unpaired comparison (asked for with ``--unpaired``); absent (None) when paired.
    paired: bool | None = jfield("paired", Bool(), omit_none=True)

    @classmethod
    def of(cls, e: Any, *, paired: bool = True) -> DecisionEstimate | None:
        """The record of a :class:`specwatch.specdecode.decision.Estimate` (None stays None);
        ``paired`` False marks an unpaired comparison."""
        if e is None:
            return None
        return cls(value=e.value, lower=e.lower, upper=e.upper, basis=e.basis, verdict=e.verdict,
                   paired=None if paired else False)

    @property
    def given(self) -> bool:
        """False for an empty object (``{}``), which the formatters show as "–" like a null."""
        return self.keys != ()


@dataclass(frozen=True, kw_only=True)
class WhatIf(DecisionEstimate):
    """One k′ the choice compared (``rows[i].what_if[j]``): the estimate at ``k`` = k′ (1 … the
    run's k; the run's k itself is its anchor, the measured or calibrated estimate), ``x`` the
    drafted tokens per request-step at k′ (x × k′ / k), ``c`` the relative step cost at k′ (t_spec /
    t0 on the cost line's slope through the cell's own point) and ``relative_to_run`` R(k′), the
    modelled speedup of k′ over the run's k (1 at the run's k)."""

    write_order: ClassVar[tuple[str, ...]] = ("k",)

    k: int | None = jfield("k", _INT)
    x: float | None = jfield("x", _NUM)
    c: float | None = jfield("c", _NUM)
    relative_to_run: float | None = jfield("relative_to_run", _NUM)

    @classmethod
    def at(cls, k: int, e: Any, *, x: float | None, c: float | None, relative_to_run: float) -> WhatIf:
        """The what-if row of k′ = ``k`` from its :class:`specwatch.specdecode.decision.Estimate` ``e``."""
        return cls(k=k, value=e.value, lower=e.lower, upper=e.upper, basis=e.basis, verdict=e.verdict, x=x, c=c,
                   relative_to_run=relative_to_run)


@dataclass(frozen=True, kw_only=True)
class CellCost(JsonRecord):
    """A cell's measured step cost (``rows[i].cost``): ``t0_ms`` the baseline's and ``t_spec_ms``
    the speculative server's step time (ms, ``server_step_duration_ms``: vLLM's ITL sum / count),
    ``c`` = t_spec / t0, ``x`` drafted tokens per request-step (Δdraft_tokens / Δrequest-steps),
    ``s`` the share of request-steps that carried a draft (Δdrafts / Δrequest-steps, at most 1),
    ``b`` the speculative server's running requests per step and ``tau`` the tokens per
    request-step it emitted (1 + Δaccepted / Δrequest-steps). None where the bench file lacks the
    counter."""

    t0_ms: float | None = jfield("t0_ms", _NUM)
    t_spec_ms: float | None = jfield("t_spec_ms", _NUM)
    c: float | None = jfield("c", _NUM)
    x: float | None = jfield("x", _NUM)
    s: float | None = jfield("s", _NUM)
    b: float | None = jfield("b", _NUM)
    tau: float | None = jfield("tau", _NUM)


@dataclass(frozen=True, kw_only=True)
class DecisionChoice(JsonRecord):
    """The k to run of a row (``rows[i].choice``): ``k`` (0 = off; None only in files written
    before the demo always chose, ``run`` then ``withheld``), ``run`` its text (``off``, ``k=3``),
    ``certain`` (format 2: the pick is separated from its runner-up; format 1: the lower ends,
    values and upper ends agree; absent in older files), ``reason`` (None; format 2:
    ``uncertain``, ``no_interval``, ``never_accepted``, ``no_data``; format 1 ``uncertain``,
    ``no_interval``, ``no_data``), ``basis`` (format 2: the weakest of the pick and its runner-up;
    format 1: of the estimates compared) and, in format 1 only, the k at the lower ends, values
    and upper ends (``at_lower``, ``at_value``, ``at_upper``)."""

    k: int | None = jfield("k", _INT)
    run: str | None = jfield("run", _STR)
    certain: bool | None = jfield("certain", Bool())
    reason: str | None = jfield("reason", _STR)
    basis: str | None = jfield("basis", _STR)
    at_lower: int | None = jfield("at_lower", _INT, omit_none=True)
    at_value: int | None = jfield("at_value", _INT, omit_none=True)
    at_upper: int | None = jfield("at_upper", _INT, omit_none=True)

    @property
    def is_certain(self) -> bool:
        """``certain``; for a file written before the key existed, whether it gave no reason."""
        if self.certain is None and (self.keys is None or "certain" not in self.keys):
            return self.reason is None
        return bool(self.certain)


@dataclass(frozen=True, kw_only=True)
class DecisionRow(JsonRecord):
    """One workload × concurrency of the table (``rows[i]``): ``batches`` measured batch pairs,
    ``ratio`` the client's speculative / baseline output throughput (None without both),
    ``measured`` and ``calibrated`` estimates at the run's k (None when not measurable: one
    batch, no step times), ``cost`` (:class:`CellCost`), ``curve_source`` (``exact per-request``
    or ``counters (…)``), ``what_if`` (:class:`WhatIf` per k′), ``choice``
    (:class:`DecisionChoice`) and ``note`` (what is missing, "; "-joined; "" when nothing).

    Format 2 adds (absent in format 1): ``verdict`` (the pick's verdict against the baseline,
    :attr:`specwatch.specdecode.decision.Pick.verdict`: ``pays``, ``loses``, ``cannot_tell``),
    ``confidence`` (:meth:`~specwatch.specdecode.decision.Pick.confidence_text`, the text every
    surface prints), ``never_accepted`` (the speculative cell accepted no draft token in any
    measured batch, or proposed none: physics, off), ``disagreement``
    (:func:`specwatch.specdecode.decision.disagreement` of the measured and calibrated estimates,
    None when they agree) and ``pick`` (:meth:`~specwatch.specdecode.decision.Pick.to_json`)."""

    workload: str | None = jfield("workload", _STR)
    concurrency: int | None = jfield("concurrency", _INT)
    batches: int | None = jfield("batches", _INT)
    ratio: float | None = jfield("ratio", _NUM)
    measured: DecisionEstimate | None = jfield("measured", Rec(DecisionEstimate))
    calibrated: DecisionEstimate | None = jfield("calibrated", Rec(DecisionEstimate))
    cost: CellCost | None = jfield("cost", Rec(CellCost))
    curve_source: str | None = jfield("curve_source", _STR)
    what_if: tuple[WhatIf, ...] = jfield("what_if", ListOf(Rec(WhatIf)), default=())
    choice: DecisionChoice | None = jfield("choice", Rec(DecisionChoice))
    note: str | None = jfield("note", _STR)
    verdict: str | None = jfield("verdict", _STR, omit_none=True)
    confidence: str | None = jfield("confidence", _STR, omit_none=True)
    never_accepted: bool | None = jfield("never_accepted", Bool(), omit_none=True)
    disagreement: str | None = jfield("disagreement", _STR, omit_none=True)
    pick: Mapping[str, Any] | None = jfield("pick", Obj(), omit_none=True)

    @classmethod
    def from_json(cls, data: Any, where: str | None = None) -> DecisionRow:
        """One row alone. Raises DecisionRecordError naming the field."""
        return read_document(cls, data, where, "decision row", DecisionRecordError)



@dataclass(frozen=True, kw_only=True)
class CostLine(JsonRecord):
    """The least-squares line c = a + b x over the workloads at one concurrency
    (``cost_lines["<concurrency>"]``, :func:`specwatch.demo.decision.fit_line`): ``a``, ``b``
    (relative step cost per drafted token per request-step), ``points`` (workloads fitted),
    ``x_min`` / ``x_max`` the fitted range of x, ``slope_halfwidth`` t(m−2) × SE(b) (0 for two
    points) and ``residual_log_sd`` sd of log(c / ĉ) (None for two points)."""

    a: float | None = jfield("a", _NUM)
    b: float | None = jfield("b", _NUM)
    points: int | None = jfield("points", _INT)
    x_min: float | None = jfield("x_min", _NUM)
    x_max: float | None = jfield("x_max", _NUM)
    slope_halfwidth: float | None = jfield("slope_halfwidth", _NUM)
    residual_log_sd: float | None = jfield("residual_log_sd", _NUM)


@dataclass(frozen=True, kw_only=True)
class ProfileFit(JsonRecord):
    """The profile check at one concurrency (``profile_fit[i]``,
    :func:`specwatch.demo.decision.profile_fit`): this machine's plain step
    ``measured_t0_ms`` (the baseline cells pooled, ms) at ``running_requests`` b against the cost
    profile's ``profile_t0_ms`` = t0(b) (ms); ``ratio`` = measured / profile and ``fits`` when it is
    within :data:`specwatch.demo.decision.FIT_BAND` either way."""

    concurrency: int | None = jfield("concurrency", _INT)
    running_requests: float | None = jfield("running_requests", _NUM)
    measured_t0_ms: float | None = jfield("measured_t0_ms", _NUM)
    profile_t0_ms: float | None = jfield("profile_t0_ms", _NUM)
    ratio: float | None = jfield("ratio", _NUM)
    fits: bool | None = jfield("fits", Bool())



@dataclass(frozen=True, kw_only=True)
class DecisionProfile(JsonRecord):
    """The exporter cost profile the decision's profile check used (``profile``, added by
    :func:`specwatch.demo.report.demo_decision`): its ``file`` and ``name`` (None when it
    could not be loaded)."""

    file: str | None = jfield("file", _STR)
    name: str | None = jfield("name", _STR)


@dataclass(frozen=True, kw_only=True)
class Decision(JsonRecord):
    """The decision table of a demo run (see the module docstring): the run's ``k``, one
    :class:`DecisionRow` per cell measured on both servers (in the speculative file's cell order),
    the cost line per concurrency (``cost_lines``, keyed by the concurrency as text; None where no
    line could be fitted), the profile check (``profile_fit``), how each basis was obtained
    (``how``: basis → text), the tie ``tolerance`` of the choice (a fraction, 0.02 = 2 %) and the
    ``profile`` the check used; ``format`` (key ``decision_format``): 2 for a document written by
    the one decision rule, 1 (no key) for an older one."""

    write_order: ClassVar[tuple[str, ...]] = (FORMAT_KEY,)

    format: int | None = jfield(FORMAT_KEY, _INT, omit_none=True)
    k: int | None = jfield("k", _INT)
    rows: tuple[DecisionRow, ...] = jfield("rows", ListOf(Rec(DecisionRow)), default=())
    cost_lines: Mapping[str, CostLine | None] | None = jfield("cost_lines", MapOf(Rec(CostLine), nullable_items=True))
    profile_fit: tuple[ProfileFit, ...] = jfield("profile_fit", ListOf(Rec(ProfileFit)), default=())
    how: Mapping[str, str] | None = jfield("how", MapOf(_STR))
    tolerance: float | None = jfield("tolerance", _NUM)
    profile: DecisionProfile | None = jfield("profile", Rec(DecisionProfile), omit_none=True)

    @classmethod
    def from_json(cls, data: Any, where: str | None = None) -> Decision:
        """The record of a parsed decision document; ``where`` names it in errors. Raises
        DecisionRecordError (one line naming the field) for a document of the wrong shape or of a
        format this version cannot read."""
        if isinstance(data, Mapping) and data.get(FORMAT_KEY, 1) not in READABLE_FORMATS:
            raise DecisionRecordError(f"{where or 'the decision'} is not a demo decision of format "
                                      f"{', '.join(map(str, READABLE_FORMATS))} ({FORMAT_KEY}: {data[FORMAT_KEY]!r})")
        return read_document(cls, data, where, "demo decision", DecisionRecordError)

    def cost_line(self, concurrency: int) -> CostLine | None:
        """The cost line fitted at ``concurrency`` (None when there is none)."""
        return (self.cost_lines or {}).get(str(concurrency))

    @property
    def decision_format(self) -> int:
        """The document's format: 1 without the key (an older document), else the key's value."""
        return 1 if self.format is None else self.format

    @property
    def profile_name(self) -> str | None:
        """The name of the profile the check used (None when unknown)."""
        return None if self.profile is None else self.profile.name


__all__ = ["CellCost", "CostLine", "Decision", "DecisionChoice", "DecisionEstimate", "DecisionProfile", "DecisionRecordError",
           "DecisionRow", "FORMAT", "FORMAT_KEY", "ProfileFit", "READABLE_FORMATS", "WhatIf"]
