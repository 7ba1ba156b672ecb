"""The demo's decision: per workload × concurrency, does speculation pay here, and which k to run.

Pure: reads the two bench results of a ``specwatch demo`` run (``bench-baseline.json``,
``bench-speculative.json``, as :class:`specwatch.bench.records.BenchResult` records or their parsed
documents: a :class:`~specwatch.bench.records.BenchCell` per cell and a
:class:`~specwatch.bench.records.BenchBatch` per batch) and, optionally, the plain step
t0(b) of the cost profile the demo's exporter used; it returns a :class:`~specwatch.choosek.decisionrecords.Decision`
record (:mod:`specwatch.choosek.decisionrecords`, the only module that knows its fields), whose
``to_json`` the demo stores in ``demo-summary.json`` (key ``decision``) and which the console and
``report.html`` render with this module's formatters. Decisions are made on
95 % intervals with :mod:`specwatch.specdecode.decision` (verdict: ``pays`` when lower > 1,
``loses`` when upper < 1, else ``cannot_tell``; :func:`~specwatch.specdecode.decision.choose_k`).

Per cell (the speculative server runs k; ``n`` measured batch pairs, batch i of both servers
serving the same seeded prompts):

- **measured** (basis ``measured``: the client's ratio, both servers live): speculative / baseline
  output throughput (mean of the batches, the comparison table's ratio). Its interval comes from
  the spread of the paired per-batch ratios r_i = spec_i / base_i: value × exp(± t(n−1) ×
  sd(log r_i) / √n), Student's t at 97.5 %. One measured batch gives no interval (at concurrency
  1 a batch is one request, so there is no per-request spread either): no verdict, and the table
  says to run ``--num-batches 2`` or more.
- **calibrated** (basis ``calibrated``: the run's k, every input measured on this machine):
  τ / c with c = t_spec / t0, the server step time of the speculative cell over the baseline
  cell's (``server_step_duration_ms``: vLLM's ITL sum / count, same workload and concurrency), and
  τ = 1 + Δaccepted / Δrequest-steps the tokens per request-step the server emitted (so τ / c is
  the server-side decode-speed ratio, prefill and client overhead left out). Interval: the spread
  of the per-batch ratios τ_i / c_i, as for ``measured``.
- **what-if k′ = 1 … k − 1** (basis ``profile`` inside the measured range of x, ``extrapolated``
  outside it by more than :data:`X_MARGIN` of its span): the run's k anchor (``measured`` when it
  has an interval, else ``calibrated``) times R(k′) = [τ(k′) / c(x′)] / [τ(k) / c(x)], the modelled
  speedup of k′ over the run's k. τ(k′) = 1 + s (E(k′) − 1) tokens per request-step, s = Δdrafts /
  Δrequest-steps (the share of request-steps that carried a draft; τ = 1 when nothing was
  drafted) and E(k′) = 1 + Σ_(j<k′) r_j from the **exact per-request curve** (vLLM's
  ``--per-request-spec-decode-metrics detailed``; the counter curve when the server returned none,
  which the row notes); c(x) = a + b x is a line fitted (least squares) over the m workloads at
  this concurrency to (x, c), x = Δdraft_tokens / Δrequest-steps (drafted tokens per
  request-step), and x′ = x × k′ / k. The fitted slope b is laid through the cell's own measured
  (x, c): c(x′) = c + b (x′ − x), since the line's level differs between workloads (their
  contexts differ: copy's prompts are long) while what a drafted token adds is what the what-if
  needs. Anchoring on the client ratio keeps what the step times leave out (prefill, scheduling,
  the client) in every k′ alike, so "which k" and "does it pay" come from one number. Its log
  half-width combines in quadrature the anchor's and the slope's: t(m−2) × SE(b) × |x′ − x| /
  c(x′) (0 with two workloads, which the row notes). The acceptance curve's own sampling error is
  not included (it counts every verify step of the cell).
- **k to run**: always a k or "off". :func:`~specwatch.specdecode.decision.choose_k` over k′ = 1 … k
  (k = 0 = "off" is exactly 1) at the lower ends, the values and the upper ends; the k run is the
  one at the values (the best estimate), ``certain`` when the three agree, else marked
  ``uncertain`` with the k at each end, so a reader sees what the interval allows. With one
  measured batch (no interval) the k comes from the point values, marked ``no_interval``. Its
  basis is the weakest among the estimates compared.

The profile check: at each concurrency the baseline's pooled step time t0 (ms, at its measured
running requests per step b) against the profile's ``plain_step(b)``; their ratio is the drift of
the profile on this machine (:data:`FIT_BAND` around 1 counts as fitting).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from specwatch.bench.records import BenchBatch, BenchCell, BenchResult
from specwatch.choosek.decisionrecords import (CellCost, CostLine, Decision, DecisionChoice, DecisionEstimate, DecisionRow, ProfileFit,
                                               WhatIf)
from specwatch.specdecode.derive import expected_lengths
from specwatch.specdecode.decision import CANNOT_TELL, TOLERANCE, Estimate, t975, best_k, choose_k, combine_log_halfwidths

#: Bases, strongest first, spelled as the exporter and :mod:`specwatch.specdecode.decision` do.
MEASURED = "measured"
CALIBRATED = "calibrated"
PROFILE = "profile"
EXTRAPOLATED = "extrapolated"
BASES = (MEASURED, CALIBRATED, PROFILE, EXTRAPOLATED)

#: x′ within this share of the workloads' measured x span beyond either end counts as inside it.
X_MARGIN = 0.15
#: A profile whose plain step is within this factor of this machine's (either way) fits it.
FIT_BAND = 1.25

HOW = {
    MEASURED: "client output throughput, speculative / baseline (mean of the measured batches); 95 % interval "
              "from the paired per-batch ratios (batch i of both servers serves the same seeded prompts): "
              "exp(± t(n−1) × sd(log ratio) / √n)",
    CALIBRATED: "the run's k from server step times measured here: τ / c, c = t_spec / t0 (vLLM's step time, "
                "speculative cell over baseline cell), τ = tokens per request-step the server emitted; "
                "interval from the paired per-batch ratios",
    PROFILE: "what-if k′ < k: the run's k anchor (the measured ratio; the calibrated one without an interval) times "
             "R(k′) = [τ(k′) / c(x′)] / [τ(k) / c(x)], τ(k′) = 1 + s (E(k′) − 1) from the exact per-request curve, "
             "c(x′) = c + b (x′ − x): the slope b of a line c = a + b x fitted over the workloads at this concurrency "
             "(x = drafted tokens per request-step, x′ = x k′ / k) through the cell's own measured cost, x′ inside "
             "the measured range of x; interval: the anchor's and the slope's (t, m − 2 df) in quadrature",
    EXTRAPOLATED: "as profile, with x′ outside the range of x the line was fitted on",
}


def weakest(bases: Sequence[str]) -> str:
    """The weakest of ``bases`` (order :data:`BASES`)."""
    return max(bases, key=BASES.index)


def log_halfwidth(ratios: Sequence[float]) -> float | None:
    """t(n−1) × sd(log r) / √n of positive ratios; None for fewer than two."""
    logs = [math.log(r) for r in ratios if r is not None and math.isfinite(r) and r > 0]
    if len(logs) < 2:
        return None
    return t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _pos(v: Any) -> float | None:
    x = _num(v)
    return x if x is not None and x > 0 else None


#: A bench result: its record, a parsed document (read into the record), or None (no file).
BenchDoc = BenchResult | Mapping[str, Any] | None


def _cells(doc: BenchDoc) -> dict[tuple[str, int], BenchCell]:
    rec = BenchResult.coerce(doc)
    return {} if rec is None else rec.cells_by_key()


def _batches(doc: BenchDoc) -> dict[tuple[str, int], dict[int, BenchBatch]]:
    rec = BenchResult.coerce(doc)
    return {} if rec is None else rec.batches_by_key()


def _server_ratio(spec: BenchBatch, base: BenchBatch) -> float | None:
    """τ / c of one batch pair: (1 + Δaccepted / Δrequest-steps) × t0 / t_spec."""
    t0, ts, tau = _pos(base.server_step_duration_ms), _pos(spec.server_step_duration_ms), _server_tau(spec)
    if t0 is None or ts is None or tau is None:
        return None
    return tau * t0 / ts


def _server_tau(rec: BenchCell | BenchBatch) -> float | None:
    """Tokens per request-step the server measured at its k: 1 + Δaccepted / Δrequest-steps."""
    steps, acc = _pos(rec.server_request_steps), _num(rec.accepted_tokens)
    return None if steps is None or acc is None else 1.0 + acc / steps


def _curve(spec: BenchCell) -> tuple[list[float], str]:
    """(E(k′) for k′ = 1 …, source): the exact per-request curve, else the counters'."""
    exact = None if spec.per_request is None else spec.per_request.expected_lengths()
    if exact:
        return exact, "exact per-request"
    rates = []
    for r in spec.per_position_acceptance_rates or ():
        if _num(r) is None:
            break
        rates.append(float(r))
    return list(expected_lengths(tuple(rates))), f"counters ({spec.curve_basis or 'exact'})"


def fit_line(points: Sequence[tuple[float, float]]) -> CostLine | None:
    """Least-squares line c = a + b x over (x, c) points (drafted tokens per request-step, relative
    step cost), as a :class:`~specwatch.choosek.decisionrecords.CostLine`; None with fewer than two
    distinct x. ``slope_halfwidth``: t(m−2) × the standard
    error of the slope b (0 for two points: no residual to measure, see ``points``);
    ``residual_log_sd``: sd of log(c / ĉ) (None for two points)."""
    pts = [(x, c) for x, c in points if x is not None and c is not None]
    xs = [x for x, _ in pts]
    if len(pts) < 2 or max(xs) - min(xs) <= 1e-9:
        return None
    mx, mc = statistics.fmean(xs), statistics.fmean(c for _, c in pts)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (c - mc) for x, c in pts) / sxx
    a = mc - b * mx
    slope_h, res_sd = 0.0, None
    if len(pts) > 2:
        dof = len(pts) - 2
        res = [c - (a + b * x) for x, c in pts]
        slope_h = t975(dof) * math.sqrt(sum(r * r for r in res) / dof / sxx)
        logs = [math.log(c / (a + b * x)) for x, c in pts if a + b * x > 0 and c > 0]
        res_sd = math.sqrt(sum(r * r for r in logs) / dof) if len(logs) == len(pts) else None
    return CostLine(a=a, b=b, points=len(pts), x_min=min(xs), x_max=max(xs), slope_halfwidth=slope_h,
                    residual_log_sd=res_sd)


def profile_fit(baseline: BenchDoc,
                plain_step: Callable[[float], float] | None) -> list[ProfileFit]:
    """Per concurrency (a :class:`~specwatch.choosek.decisionrecords.ProfileFit` each, in
    increasing concurrency): this machine's plain step (the baseline cells pooled: Σ ITL sum / Σ
    request-steps, ms, at b = Σ request-steps / Σ engine steps) against ``plain_step(b)`` (seconds,
    the profile's t0(b)); ``ratio`` = measured / profile (the profile's drift here), ``fits`` when
    within :data:`FIT_BAND` either way. Empty without a profile or step times."""
    if plain_step is None:
        return []
    pooled: dict[int, list[float]] = {}
    for (_, conc), r in _cells(baseline).items():
        s, n, e = _pos(r.server_itl_sum_seconds), _pos(r.server_request_steps), _pos(r.server_engine_steps)
        if s is None or n is None or e is None:
            continue
        acc = pooled.setdefault(conc, [0.0, 0.0, 0.0])
        acc[0] += s
        acc[1] += n
        acc[2] += e
    out = []
    for conc in sorted(pooled):
        s, n, e = pooled[conc]
        b = n / e
        measured = s / n * 1000
        prof = plain_step(b) * 1000
        ratio = measured / prof
        out.append(ProfileFit(concurrency=conc, running_requests=b, measured_t0_ms=measured, profile_t0_ms=prof,
                              ratio=ratio, fits=1 / FIT_BAND <= ratio <= FIT_BAND))
    return out


def decide(baseline: BenchDoc, speculative: BenchDoc, k: int, *,
           plain_step: Callable[[float], float] | None = None, tolerance: float = TOLERANCE) -> Decision:
    """The decision table of a demo run (module doc) from its two bench documents and the run's
    k (≥ 1). ``plain_step``: the exporter profile's t0(b) in seconds (for :func:`profile_fit`);
    ``tolerance``: the choice's tie tolerance (a fraction).

    Returns a :class:`~specwatch.choosek.decisionrecords.Decision` (its fields and units are
    documented there): ``k``, ``rows`` (one :class:`~specwatch.choosek.decisionrecords.DecisionRow`
    per cell: ``measured`` and ``calibrated`` estimates, None when not measurable; ``cost``;
    ``what_if`` per k′; ``choice``; ``note``), ``cost_lines`` (by concurrency as text),
    ``profile_fit``, ``how`` (basis → text) and ``tolerance``. Rows follow the speculative file's
    cell order; cells measured on one server only are left out. Raises ValueError for k < 1."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    bcells, scells = _cells(baseline), _cells(speculative)
    bbat, sbat = _batches(baseline), _batches(speculative)
    keys = [key for key in scells if key in bcells]
    cost: dict[tuple[str, int], CellCost] = {}
    for key in keys:
        b, s = bcells[key], scells[key]
        t0, ts = _pos(b.server_step_duration_ms), _pos(s.server_step_duration_ms)
        steps = _pos(s.server_request_steps)
        dt, dr = _num(s.draft_tokens), _num(s.num_drafts)
        cost[key] = CellCost(t0_ms=t0, t_spec_ms=ts, c=ts / t0 if t0 and ts else None,
                             x=dt / steps if steps and dt is not None else None,
                             s=min(1.0, dr / steps) if steps and dr is not None else None,
                             b=_pos(s.server_running_requests), tau=_server_tau(s))
    lines: dict[int, CostLine | None] = {}
    for conc in sorted({c for _, c in keys}):
        lines[conc] = fit_line([(cost[key].x, cost[key].c) for key in keys if key[1] == conc])

    rows = []
    for key in keys:
        wl, conc = key
        b, s = bcells[key], scells[key]
        pairs = sorted(set(bbat.get(key, {})) & set(sbat.get(key, {})))
        notes = []
        # measured: the client ratio
        bt, st = _pos(b.output_throughput), _pos(s.output_throughput)
        measured = None
        if bt and st:
            h = log_halfwidth([_pos(sbat[key][i].output_throughput) / _pos(bbat[key][i].output_throughput)
                               for i in pairs if _pos(sbat[key][i].output_throughput)
                               and _pos(bbat[key][i].output_throughput)])
            if h is not None:
                measured = Estimate.around(st / bt, h, MEASURED)
            else:
                notes.append(f"{len(pairs)} measured batch: no interval (run --num-batches 2 or more)")
        ratio = st / bt if bt and st else None
        # calibrated: the run's k from the measured step costs
        cc = cost[key]
        curve, source = _curve(s)
        if not source.startswith("exact"):
            notes.append(f"acceptance curve from the {source}, not per-request")
        share = cc.s if cc.s is not None else 1.0
        if share == 0:  # nothing drafted: one token per request-step at every k'
            tau = dict.fromkeys(range(1, k + 1), 1.0)
        else:
            tau = {kk: 1.0 + share * (e - 1.0) for kk, e in enumerate(curve[:k], 1)}
        calibrated = None
        h_cal = log_halfwidth([_server_ratio(sbat[key][i], bbat[key][i]) for i in pairs])
        tau_run = cc.tau
        if cc.c is None or tau_run is None:
            notes.append("no server step times: nothing calibrated")
        elif h_cal is not None:
            calibrated = Estimate.around(tau_run / cc.c, h_cal, CALIBRATED)
        # the anchor for the run's k: the client ratio (both servers live) when it has an interval,
        # else the calibrated one; what-ifs k' < k are the anchor times the modelled ratio R(k')
        anchor = measured if measured is not None else calibrated
        h_anchor = (math.log(anchor.upper / anchor.value) if anchor is not None else None)
        what_if: list[WhatIf] = []
        estimates: dict[int, Estimate] = {}
        points: dict[int, float] = {}  # point values only (no interval): one measured batch
        if anchor is not None:
            estimates[k] = anchor
        line = lines.get(conc)
        if line is None:
            notes.append("no cost line at this concurrency (needs two workloads with different drafted tokens per step)")
        elif line.points == 2:
            notes.append("cost line through 2 workloads: no fit spread in the what-if intervals")
        run_value = anchor.value if anchor is not None else ratio
        tau_k = tau.get(k, tau_run)  # the counters' τ where the exact curve stops short of k (ragged drafts)
        for kk in range(1, k):
            if kk not in tau or tau_k is None or line is None or cc.x is None or cc.c is None or not run_value:
                continue
            x2 = cc.x * kk / k
            c2 = cc.c + line.b * (x2 - cc.x)  # the fitted slope through this cell's own point
            if c2 <= 0:
                continue
            rel = (tau[kk] / c2) / (tau_k / cc.c)  # R(k'): k' over the run's k, same curve and cost line
            if h_anchor is None:
                points[kk] = run_value * rel
                continue
            span = line.x_max - line.x_min
            inside = line.x_min - X_MARGIN * span <= x2 <= line.x_max + X_MARGIN * span
            h_line = line.slope_halfwidth * abs(x2 - cc.x) / c2
            e = Estimate.around(anchor.value * rel, combine_log_halfwidths([h_anchor, h_line]),
                                PROFILE if inside else EXTRAPOLATED)
            estimates[kk] = e
            what_if.append(WhatIf.at(kk, e, x=x2, c=c2, relative_to_run=rel))
        if anchor is not None:
            what_if.append(WhatIf.at(k, anchor, x=cc.x, c=cc.c, relative_to_run=1.0))
        if estimates:
            ch = choose_k(estimates, weakest=weakest([e.basis for e in estimates.values()]), tolerance=tolerance)
            choice = DecisionChoice(k=ch.at_value, run=_run(ch.at_value), certain=ch.k is not None, reason=ch.reason,
                                    basis=ch.basis, at_lower=ch.at_lower, at_value=ch.at_value, at_upper=ch.at_upper)
        elif run_value:
            points[k] = run_value
            kk = best_k(points, tolerance)
            choice = DecisionChoice(k=kk, run=_run(kk), certain=False, reason="no_interval",
                                    basis=MEASURED if len(points) == 1 else PROFILE, at_value=kk)
        else:
            choice = DecisionChoice(run="withheld", certain=False, reason="no_data")
        rows.append(DecisionRow(workload=wl, concurrency=conc, batches=len(pairs), ratio=ratio,
                                measured=DecisionEstimate.of(measured), calibrated=DecisionEstimate.of(calibrated),
                                cost=cc, curve_source=source, what_if=tuple(what_if), choice=choice,
                                note="; ".join(notes)))
    return Decision(k=k, rows=tuple(rows), cost_lines={str(c): ln for c, ln in lines.items()},
                    profile_fit=tuple(profile_fit(baseline, plain_step)), how=dict(HOW), tolerance=tolerance)


def _run(k: int | None) -> str:
    if k is None:
        return "withheld"
    return "off" if k == 0 else f"k={k}"


# -- text for the console and the report ----------------------------------------------------------

VERDICT_TEXT = {"pays": "pays", "loses": "loses", CANNOT_TELL: "cannot tell"}


def _x(v: float) -> str:
    return f"{v:.2f}" if v < 100 else f"{v:.3g}"


#: A decision: its record or a parsed ``decision`` document (read into the record).
DecisionDoc = Decision | Mapping[str, Any]
#: A row of the table: its record or a parsed row.
RowDoc = DecisionRow | Mapping[str, Any]


def _estimate(e: DecisionEstimate | Mapping[str, Any] | None) -> DecisionEstimate | None:
    """``e`` as a record, None for None or an empty object (shown as "–")."""
    e = DecisionEstimate.coerce(e)
    return e if e is not None and e.given else None


def format_estimate(e: DecisionEstimate | Mapping[str, Any] | None, *, with_basis: bool = True) -> str:
    """``2.95× [2.80–3.11] measured`` (value, 95 % interval, basis) of an estimate (or a what-if
    row); "–" for None."""
    e = _estimate(e)
    if e is None:
        return "–"
    s = f"{_x(e.value)}× [{_x(e.lower)}–{_x(e.upper)}]"
    return f"{s} {e.basis}" if with_basis else s


def format_verdict(row: RowDoc) -> str:
    """The row's verdict: on the measured interval, else "cannot tell (no interval)"."""
    m = _estimate(DecisionRow.coerce(row).measured)
    if m is not None:
        return VERDICT_TEXT.get(m.verdict, m.verdict)
    return "cannot tell (no interval)"


def format_choice(row: RowDoc) -> str:
    """``k=3 (profile)`` when the choice is the same across the intervals; ``k=4 (profile;
    uncertain: off/k=4/k=4)`` when it is not (the k at the lower ends / values / upper ends, the
    one at the values run); ``off (measured; no interval)`` from point values; "–" without data.
    See :data:`CHOICE_LEGEND`."""
    ch = DecisionRow.coerce(row).choice or DecisionChoice()
    if ch.k is None:  # a file written before the demo always chose (withheld then)
        return f"withheld: {ch.reason or 'no data'}"
    if ch.is_certain:
        return f"{ch.run} ({ch.basis})"
    if ch.reason == "uncertain":
        return f"{ch.run} ({ch.basis}; uncertain: {_run(ch.at_lower)}/{_run(ch.at_value)}/{_run(ch.at_upper)})"
    return f"{ch.run} ({ch.basis}; no interval)"


#: What the "k to run" column's texts mean (printed under the table).
CHOICE_LEGEND = ("k to run: the smallest k within 2 % of the best (off = no speculation, exactly 1), compared at the "
                 "intervals' lower ends, values and upper ends; the k at the values is the one to run. Where the three "
                 "differ it says 'uncertain (a/b/c)' with the k at each: measure more batches, or run the k at the "
                 "values and watch the exporter. 'no interval': one measured batch, point values only. The basis in "
                 "brackets is the weakest of the estimates compared.")


def table_rows(decision: DecisionDoc) -> list[list[str]]:
    """The decision table as text cells: workload, concurrency, measured ratio [95 %] basis,
    verdict, calibrated at k [95 %] basis, k to run (basis). ``decision``: the record or its
    parsed document (raises DecisionRecordError for a damaged one)."""
    out = []
    for r in Decision.coerce(decision).rows:
        m = _estimate(r.measured)
        mtxt = format_estimate(m) if m else (f"{r.ratio:.2f}× (no interval) measured" if r.ratio else "–")
        out.append([r.workload, str(r.concurrency), mtxt, format_verdict(r), format_estimate(r.calibrated),
                    format_choice(r)])
    return out


def row_notes(decision: DecisionDoc) -> list[str]:
    """``<workload> c=<concurrency>: <note>`` for every row with a note (what is missing), in the
    table's order."""
    return [f"{r.workload} c={r.concurrency}: {r.note}" for r in Decision.coerce(decision).rows if r.note]


TABLE_COLUMNS = ("workload", "concurrency", "measured ratio [95 %], basis", "verdict",
                 "run's k from step costs [95 %], basis", "k to run (basis)")


def profile_fit_lines(fit: Sequence[ProfileFit | Mapping[str, Any]], profile_name: str | None = None) -> list[str]:
    """Sentences on whether the exporter's cost profile (``profile_name``) fits this machine, one
    per concurrency (see :func:`profile_fit`; records or their parsed entries), then what a misfit
    does to the exporter's answer."""
    fit = [ProfileFit.coerce(f) for f in fit]
    out = []
    for f in fit:
        out.append(f"c={f.concurrency}: the shipped profile's plain step is {f.profile_t0_ms:.1f} ms at "
                   f"b={f.running_requests:.2f}; this machine measured {f.measured_t0_ms:.1f} ms "
                   f"(ratio {f.ratio:.2f}): " + ("it fits this machine." if f.fits else
                                                "it does not fit this machine."))
    if fit and profile_name:
        out.insert(0, f"The exporter's cost profile: {profile_name}.")
    if any(not f.fits for f in fit):
        out.append("What that does to the exporter's answer: its calibrated speedups are relative (step time over the "
                   "profile's plain step, c = t / t0), so a uniform speed difference cancels; its intervals widen with "
                   "the drift. The table above needs no profile: both servers were measured here.")
    return out


__all__ = ["BASES", "CALIBRATED", "CHOICE_LEGEND", "EXTRAPOLATED", "FIT_BAND", "HOW", "MEASURED", "PROFILE", "TABLE_COLUMNS",
           "DecisionDoc", "RowDoc", "decide", "fit_line", "format_choice", "format_estimate", "format_verdict", "log_halfwidth",
           "profile_fit", "profile_fit_lines", "row_notes", "t975", "table_rows", "weakest"]
