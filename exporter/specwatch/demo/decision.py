"""The demo's decision: per workload × concurrency, does speculation pay here, and which k to run.

Pure: reads the two bench results of a ``specwatch demo`` run (``bench-baseline.json``,
``bench-speculative.json``, as :class:`specwatch.bench.records.BenchResult` records or their parsed
documents: a :class:`~specwatch.bench.records.BenchCell` per cell and a
:class:`~specwatch.bench.records.BenchBatch` per batch) and, optionally, the plain step
t0(b) of the cost profile the demo's exporter used; it returns a :class:`~specwatch.demo.decisionrecords.Decision`
record (:mod:`specwatch.demo.decisionrecords`, the only module that knows its fields), whose
``to_json`` the demo stores in ``demo-summary.json`` (key ``decision``) and which the console and
``report.html`` render with this module's formatters (as does ``specwatch advise`` on the result
folder, :func:`specwatch.demo.report.advise_demo`). The k to run is the project's one
decision rule, :func:`specwatch.specdecode.decision.decide` (docs/choosing-k.md; verdict: ``pays``
when lower > 1, ``loses`` when upper < 1, else ``cannot_tell``).

Per cell (the speculative server runs k; ``n`` measured batch pairs, batch i of both servers
serving the same seeded prompts):

- **measured** (basis ``measured``: the client's ratio, both servers live): speculative / baseline
  output throughput, paired (:func:`specwatch.specdecode.decision.ratio_from_logs`): exp(mean log
  r_i) of the per-batch ratios r_i = spec_i / base_i, interval exp(mean ± t(n−1) × sd(log r_i) /
  √n), Student's t at 97.5 % (batches that are not paired, :func:`pairing`, give none, or an
  unpaired comparison labelled so when asked for). One measured batch gives no interval (at concurrency
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
- **k to run**: always a k or "off": :func:`specwatch.specdecode.decision.decide` over the
  candidates off (exactly 1), the run's k (the measured paired ratio with its per-batch log
  ratios; the calibrated estimate where the measured one has no interval; the point value with one
  batch) and the what-if k′ < k. Physics first: a cell that accepted no draft token in any
  measured batch (or proposed none, :func:`never_accepted`) is off, whatever its ratio says. The
  row keeps the pick's verdict, its confidence against the runner-up
  (:meth:`~specwatch.specdecode.decision.Pick.confidence_text`; ``certain`` when separated) and,
  where the measured and calibrated verdicts differ,
  :func:`~specwatch.specdecode.decision.disagreement` (measured rules).

The profile check: at each concurrency the baseline's pooled step time t0 (ms, at its measured
running requests per step b) against the profile's ``plain_step(b)``; their ratio is the drift of
the profile on this machine (:data:`FIT_BAND` around 1 counts as fitting).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from specwatch.bench.records import BenchBatch, BenchCell, BenchResult
from specwatch.bench.results import keep_names_whole
from specwatch.demo.decisionrecords import (FORMAT, CellCost, CostLine, Decision, DecisionChoice, DecisionEstimate, DecisionRow,
                                               ProfileFit, WhatIf)
from specwatch.specdecode.derive import expected_lengths
from specwatch.specdecode import decision as rule
from specwatch.specdecode.decision import (CANNOT_TELL, NO_START_SPREAD, TOLERANCE, Candidate, Estimate, PairedRatio,
                                           combine_log_halfwidths,
                                          disagreement, format_ratio, ratio_from_logs, t975, unpaired_ratio)

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
    MEASURED: "client output throughput, speculative / baseline, paired batch by batch (batch i of both servers "
              "serves the same seeded prompts): exp(mean log r_i) of the per-batch ratios r_i, 95 % interval "
              "exp(mean ± t(n−1) × sd(log r_i) / √n)",
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


def _cells(rec: BenchResult | None) -> dict[tuple[str, int], BenchCell]:
    return {} if rec is None else rec.cells_by_key()


def _batches(rec: BenchResult | None) -> dict[tuple[str, int], dict[int, BenchBatch]]:
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
    step cost), as a :class:`~specwatch.demo.decisionrecords.CostLine`; None with fewer than two
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


def profile_fit(baseline: BenchResult | None,
                plain_step: Callable[[float], float] | None) -> list[ProfileFit]:
    """Per concurrency (a :class:`~specwatch.demo.decisionrecords.ProfileFit` each, in
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


def pairing(brec: BenchResult | None, srec: BenchResult | None) -> dict[tuple[str, int], str]:
    """The cells measured on both servers whose batches are **not** paired, each with why (one
    phrase): batch i of both must have served the same seeded prompts, so the two files must have
    the same seed and workload options (``config.options``: seed, output_len, prompt_words,
    dataset_path), the cell at least one common measured batch, and each common batch the same
    number of prompts and the same input tokens. An empty mapping: every common cell is paired."""
    if brec is None or srec is None:
        return {}
    bcells, scells = brec.cells_by_key(), srec.cells_by_key()
    keys = [key for key in scells if key in bcells]
    bo = ((brec.config or {}).get("options") or {}) if isinstance(brec.config, Mapping) else {}
    so = ((srec.config or {}).get("options") or {}) if isinstance(srec.config, Mapping) else {}
    file_level = [f"{opt} {bo.get(opt)!r} vs {so.get(opt)!r}" for opt in PAIRING_OPTIONS
                  if isinstance(bo, Mapping) and isinstance(so, Mapping) and bo.get(opt) != so.get(opt)]
    bbat, sbat = brec.batches_by_key(), srec.batches_by_key()
    out: dict[tuple[str, int], str] = {}
    for key in keys:
        if file_level:
            out[key] = ", ".join(file_level)
            continue
        common = sorted(set(bbat.get(key, {})) & set(sbat.get(key, {})))
        if not common:
            out[key] = "no measured batch in common"
            continue
        for i in common:
            b, s = bbat[key][i], sbat[key][i]
            if _num(b.num_prompts) != _num(s.num_prompts):
                out[key] = f"batch {i}: {_count(b.num_prompts)} vs {_count(s.num_prompts)} prompts"
                break
            if _num(b.total_input_tokens) is not None and _num(s.total_input_tokens) is not None \
                    and b.total_input_tokens != s.total_input_tokens:
                out[key] = (f"batch {i}: other prompts ({_count(b.total_input_tokens)} vs "
                            f"{_count(s.total_input_tokens)} input tokens)")
                break
    return out


#: The bench options that must be equal for batch i of two files to serve the same prompts.
PAIRING_OPTIONS = ("seed", "output_len", "prompt_words", "dataset_path")


def _count(v: Any) -> str:
    x = _num(v)
    return "?" if x is None else f"{x:g}"


def never_accepted(cell: BenchCell, batches: Sequence[BenchBatch]) -> bool:
    """Physics: the speculative cell accepted no draft token in any of its measured ``batches``
    (or proposed no draft at all), so it cannot pay whatever its ratio's noise says. Judged on the
    batches' counters when every batch has them, else on the cell's; False when unknown."""
    accepted = [_num(b.accepted_tokens) for b in batches]
    if batches and all(a is not None for a in accepted):
        return all(a == 0 for a in accepted)
    if _num(cell.num_drafts) == 0:
        return True
    acc = _num(cell.accepted_tokens)
    return acc == 0 if acc is not None else False


def _log_throughput(batches: Sequence[BenchBatch]) -> Estimate | None:
    """A cell's throughput on the log scale (exp(mean log), exp(± t · sd / √n)); None for fewer
    than two batches with a throughput."""
    xs = [_pos(b.output_throughput) for b in batches]
    xs = [x for x in xs if x is not None]
    if len(xs) < 2:
        return None
    r = ratio_from_logs([math.log(x) for x in xs])
    return Estimate(r.value, r.lower, r.upper, MEASURED)


def decide(baseline: BenchResult | None, speculative: BenchResult | None, k: int, *,
           plain_step: Callable[[float], float] | None = None, tolerance: float = TOLERANCE,
           unpaired: bool = False) -> Decision:
    """The decision table of a demo run (module doc) from its two bench documents and the run's
    k (≥ 1). ``plain_step``: the exporter profile's t0(b) in seconds (for :func:`profile_fit`);
    ``tolerance``: the rule's tie tolerance (a fraction); ``unpaired``: compare the cells whose
    batches are not paired (:func:`pairing`) unpaired, labelled so (else such a row says "not
    paired" and has no k).

    Returns a :class:`~specwatch.demo.decisionrecords.Decision` of format 2 (its fields and
    units are documented there): ``k``, ``rows`` (one :class:`~specwatch.demo.decisionrecords.DecisionRow`
    per cell: ``measured`` and ``calibrated`` estimates, None when not measurable; ``cost``;
    ``what_if`` per k′; ``choice``, ``verdict``, ``confidence`` and ``pick`` from
    :func:`specwatch.specdecode.decision.decide`; ``never_accepted``; ``disagreement``;
    ``note``), ``cost_lines`` (by concurrency as text), ``profile_fit``, ``how`` (basis → text)
    and ``tolerance``. Rows follow the speculative file's cell order; cells measured on one
    server only are left out. Raises ValueError for k < 1."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    bcells, scells = _cells(baseline), _cells(speculative)
    keys = [key for key in scells if key in bcells]
    cost = {key: _cell_cost(bcells[key], scells[key]) for key in keys}
    lines: dict[int, CostLine | None] = {}
    for conc in sorted({c for _, c in keys}):
        lines[conc] = fit_line([(cost[key].x, cost[key].c) for key in keys if key[1] == conc])
    shared = _Shared(k=k, bbat=_batches(baseline), sbat=_batches(speculative), not_paired=pairing(baseline, speculative),
                     lines=lines, tolerance=tolerance, unpaired=unpaired)
    rows = [_CellDecision(key, bcells[key], scells[key], cost[key], shared).row() for key in keys]
    return Decision(format=FORMAT, k=k, rows=tuple(rows), cost_lines={str(c): ln for c, ln in lines.items()},
                    profile_fit=tuple(profile_fit(baseline, plain_step)), how=dict(HOW), tolerance=tolerance)


def _cell_cost(b: BenchCell, s: BenchCell) -> CellCost:
    """A cell's step costs: t0, t_spec, c = t_spec / t0, x and s per request-step, b, τ."""
    t0, ts = _pos(b.server_step_duration_ms), _pos(s.server_step_duration_ms)
    steps = _pos(s.server_request_steps)
    dt, dr = _num(s.draft_tokens), _num(s.num_drafts)
    return CellCost(t0_ms=t0, t_spec_ms=ts, c=ts / t0 if t0 and ts else None,
                    x=dt / steps if steps and dt is not None else None,
                    s=min(1.0, dr / steps) if steps and dr is not None else None,
                    b=_pos(s.server_running_requests), tau=_server_tau(s))


@dataclass(frozen=True)
class _Shared:
    """What every row of one :func:`decide` shares: the run's k, the batches by cell, the cells not paired, the cost lines, the options."""

    k: int
    bbat: dict[tuple[str, int], dict[int, BenchBatch]]
    sbat: dict[tuple[str, int], dict[int, BenchBatch]]
    not_paired: dict[tuple[str, int], str]
    lines: dict[int, CostLine | None]
    tolerance: float
    unpaired: bool


class _CellDecision:
    """One cell's row of :func:`decide` while it is built; its steps are the methods, its notes collect in order."""

    def __init__(self, key: tuple[str, int], b: BenchCell, s: BenchCell, cc: CellCost, shared: _Shared) -> None:
        self.key, self.b, self.s, self.cc, self.shared = key, b, s, cc, shared
        self.bb, self.sb = shared.bbat.get(key, {}), shared.sbat.get(key, {})
        self.why_not_paired = shared.not_paired.get(key)
        self.pairs = [] if self.why_not_paired else sorted(set(self.bb) & set(self.sb))
        self.notes: list[str] = []

    def row(self) -> DecisionRow:
        """The row: the measured and calibrated estimates, the what-ifs, the candidates and the pick."""
        k, cc, s = self.shared.k, self.cc, self.s
        bt, st = _pos(self.b.output_throughput), _pos(s.output_throughput)
        measured_ratio, logs = self.measured_ratio()
        measured = measured_ratio.estimate(MEASURED) if measured_ratio is not None else None
        if measured_ratio is not None and not measured_ratio.has_interval:
            self.notes.append(f"{len(logs)} measured batch: no interval (run --num-batches 2 or more)")
        curve, source = _curve(s)
        if not source.startswith("exact"):
            self.notes.append(f"acceptance curve from the {source}, not per-request")
        calibrated = self.calibrated()
        na = never_accepted(s, [self.sb[i] for i in self.pairs] if self.pairs else list(self.sb.values()))
        if na:
            self.notes.append("no draft token was accepted in any measured batch (or none was proposed): speculation "
                              "cannot pay here, off whatever the ratio's noise says")
        split = disagreement(measured if measured_ratio is not None and measured_ratio.paired else None, calibrated)
        if split:
            self.notes.append(f"the bases disagree: {split}")
        # the run's k: the measured paired ratio where it has an interval, else the calibrated one,
        # else (one batch) the measured point value; what-ifs k' < k are that anchor times R(k')
        anchor = measured if measured is not None else calibrated
        cands = _run_candidates(k, measured_ratio, measured, calibrated, logs, na)
        paired_logs = logs if measured is not None and measured_ratio.paired else []
        what_if = self.what_ifs(_tau_by_k(cc.s, curve, k), anchor, cands, paired_logs, na)
        if anchor is not None:
            what_if.append(WhatIf.at(k, anchor, x=cc.x, c=cc.c, relative_to_run=1.0))
        choice, verdict_, confidence, pick_json = self.choose(cands, na)
        return DecisionRow(workload=self.key[0], concurrency=self.key[1], batches=len(self.pairs),
                           ratio=st / bt if bt and st else None,
                           measured=DecisionEstimate.of(measured, paired=measured_ratio is None or measured_ratio.paired),
                           calibrated=DecisionEstimate.of(calibrated), cost=cc, curve_source=source,
                           what_if=tuple(what_if), choice=choice, note="; ".join(self.notes), verdict=verdict_,
                           confidence=confidence, never_accepted=na, disagreement=split, pick=pick_json)

    def measured_ratio(self) -> tuple[PairedRatio | None, list[float]]:
        """(the paired ratio of the client's output throughputs, both servers live, or the unpaired
        one asked for; its per-batch log ratios)."""
        bb, sb = self.bb, self.sb
        logs = [math.log(_pos(sb[i].output_throughput) / _pos(bb[i].output_throughput))
                for i in self.pairs if _pos(sb[i].output_throughput) and _pos(bb[i].output_throughput)]
        measured_ratio: PairedRatio | None = ratio_from_logs(logs) if logs else None
        if self.why_not_paired:
            if self.shared.unpaired:
                se, be = _log_throughput(list(sb.values())), _log_throughput(list(bb.values()))
                measured_ratio = unpaired_ratio(se, be) if se is not None and be is not None else None
                self.notes.append(f"not paired ({self.why_not_paired}): an unpaired comparison, as asked (--unpaired)")
            else:
                self.notes.append(f"not paired ({self.why_not_paired}): no paired ratio (--unpaired compares it unpaired)")
        return measured_ratio, logs

    def calibrated(self) -> Estimate | None:
        """The run's k from the measured step costs (paired per-batch server ratios), None without them."""
        cc = self.cc
        h_cal = log_halfwidth([_server_ratio(self.sb[i], self.bb[i]) for i in self.pairs])
        if cc.c is None or cc.tau is None:
            self.notes.append("no server step times: nothing calibrated")
        elif h_cal is not None:
            return Estimate.around(cc.tau / cc.c, h_cal, CALIBRATED)
        return None

    def what_ifs(self, tau: dict[int, float], anchor: Estimate | None, cands: list[Candidate], paired_logs: list[float],
                 na: bool) -> list[WhatIf]:
        """The what-ifs k′ < k (each also a candidate, added to ``cands``): the anchor times R(k′)."""
        k, cc = self.shared.k, self.cc
        line = self.shared.lines.get(self.key[1])
        if line is None:
            self.notes.append("no cost line at this concurrency (needs two workloads with different drafted tokens per step)")
        elif line.points == 2:
            self.notes.append("cost line through 2 workloads: no fit spread in the what-if intervals")
        run_value = cands[0].value if cands else None
        tau_k = tau.get(k, cc.tau)  # the counters' τ where the exact curve stops short of k (ragged drafts)
        if tau_k is None or line is None or cc.x is None or cc.c is None or not run_value:
            return []
        h_anchor = math.log(anchor.upper / anchor.value) if anchor is not None else None
        out: list[WhatIf] = []
        for kk in range(1, k):
            if kk not in tau:
                continue
            x2 = cc.x * kk / k
            c2 = cc.c + line.b * (x2 - cc.x)  # the fitted slope through this cell's own point
            if c2 <= 0:
                continue
            rel = (tau[kk] / c2) / (tau_k / cc.c)  # R(k'): k' over the run's k, same curve and cost line
            span = line.x_max - line.x_min
            inside = line.x_min - X_MARGIN * span <= x2 <= line.x_max + X_MARGIN * span
            basis = PROFILE if inside else EXTRAPOLATED
            if h_anchor is None:  # one batch: the point value only
                cands.append(Candidate(_run(kk), kk, run_value * rel, basis=basis, never_accepted=na))
                continue
            h_line = line.slope_halfwidth * abs(x2 - cc.x) / c2
            e = Estimate.around(anchor.value * rel, combine_log_halfwidths([h_anchor, h_line]), basis)
            # from the measured paired anchor: the same batches shifted by log R(k'), so k' and the
            # run's k compare paired, with R's own (slope) error only; a line through two workloads
            # has no fit spread to give that error, so there k' stays an unpaired estimate
            shifted = [x + math.log(rel) for x in paired_logs] if paired_logs and line.points >= 3 else None
            cands.append(Candidate.from_estimate(_run(kk), kk, e, never_accepted=na, log_ratios=shifted,
                                                 model_log_halfwidth=h_line if shifted is not None else 0.0))
            out.append(WhatIf.at(kk, e, x=x2, c=c2, relative_to_run=rel))
        return out

    def choose(self, cands: list[Candidate], na: bool) -> tuple[DecisionChoice, str | None, str | None, Any]:
        """(the choice, the verdict, the confidence, the pick's JSON) by the decision rule over ``cands``."""
        if self.why_not_paired and not self.shared.unpaired:
            return DecisionChoice(run="withheld", certain=False, reason="not_paired"), None, None, None
        if not cands:
            return DecisionChoice(run="withheld", certain=False, reason="no_data"), None, None, None
        p = rule.decide(sorted(cands, key=lambda c: c.k), self.shared.tolerance)
        reason = ("never_accepted" if na else None if any(c.has_interval for c in cands) else "no_interval")
        if reason is None and not p.certain:
            reason = "uncertain"
        choice = DecisionChoice(k=p.k, run=_run(p.k), certain=reason is None, reason=reason, basis=p.basis)
        return choice, p.verdict, p.confidence_text(), p.to_json()


def _tau_by_k(share: float | None, curve: Sequence[float], k: int) -> dict[int, float]:
    """Tokens per request-step τ(k′) = 1 + s (E(k′) − 1) for k′ = 1 … k along ``curve`` (s unknown: 1)."""
    share = share if share is not None else 1.0
    # share 0, nothing drafted: one token per request-step at every k'
    return (dict.fromkeys(range(1, k + 1), 1.0) if share == 0
            else {kk: 1.0 + share * (e - 1.0) for kk, e in enumerate(curve[:k], 1)})


def _run_candidates(k: int, measured_ratio: PairedRatio | None, measured: Estimate | None, calibrated: Estimate | None,
                    logs: list[float], na: bool) -> list[Candidate]:
    """The run's k as a candidate: the measured ratio, else the calibrated estimate, else (one batch) the point value."""
    if measured is not None:
        return [Candidate.from_ratio(_run(k), k, measured_ratio, basis=MEASURED,
                                     log_ratios=logs if measured_ratio.paired else None, never_accepted=na)]
    if calibrated is not None:
        return [Candidate.from_estimate(_run(k), k, calibrated, never_accepted=na)]
    if measured_ratio is not None:
        return [Candidate.from_ratio(_run(k), k, measured_ratio, basis=MEASURED, never_accepted=na)]
    return []


def _run(k: int | None) -> str:
    if k is None:
        return "withheld"
    return "off" if k == 0 else f"k={k}"


# -- text for the console and the report ----------------------------------------------------------

VERDICT_TEXT = {"pays": "pays", "loses": "loses", CANNOT_TELL: "cannot tell"}


def _x(v: float) -> str:
    """A ratio at the precision that decides (:func:`~specwatch.specdecode.decision.format_ratio`:
    0.9989 → 0.999, never "1.00"); three significant digits from 100 on."""
    return format_ratio(v) if v < 100 else f"{v:.3g}"


def _estimate(e: DecisionEstimate | None) -> DecisionEstimate | None:
    """``e``, None for None or an empty object (shown as "–")."""
    return e if e is not None and e.given else None


def _by_rule(row: DecisionRow) -> bool:
    """True for a row written by the one decision rule (format 2: it has a verdict or a confidence)."""
    return row.verdict is not None or row.confidence is not None


def format_estimate(e: DecisionEstimate | None, *, with_basis: bool = True) -> str:
    """``2.95× [2.80–3.11] measured`` (value, 95 % interval, basis; ``, unpaired`` for an unpaired
    comparison) of an estimate (or a what-if row), the bounds at the precision that decides the
    verdict (0.9989 → ``0.999``); "–" for None."""
    e = _estimate(e)
    if e is None:
        return "–"
    s = f"{_x(e.value)}× [{_x(e.lower)}–{_x(e.upper)}]"
    if not with_basis:
        return s
    return f"{s} {e.basis}" + (", unpaired" if e.paired is False else "")


def format_verdict(r: DecisionRow) -> str:
    """The row's verdict. Format 2: the pick's verdict against the baseline, with ``(no draft
    accepted)`` where physics decided and ``(calibrated: pays; measured rules)`` where the two
    bases disagree. Format 1: on the measured interval, else "cannot tell (no interval)"."""
    if r.verdict is not None:
        text = VERDICT_TEXT.get(r.verdict, r.verdict)
        if r.never_accepted:
            return f"{text} (no draft accepted)"
        cal = _estimate(r.calibrated)
        if r.disagreement and cal is not None:
            return f"{text} (calibrated: {VERDICT_TEXT.get(cal.verdict, cal.verdict)}; measured rules)"
        return text
    m = _estimate(r.measured)
    if m is not None:
        return VERDICT_TEXT.get(m.verdict, m.verdict)
    return "cannot tell (no interval)"


_WITHHELD_TEXT = {"not_paired": "not paired", "no_data": "no data"}


def format_choice(r: DecisionRow) -> str:
    """The k to run. Format 2 (the one rule): ``k=4 (measured)`` when separated from its
    runner-up, ``k=4 (profile; uncertain)`` when not (the confidence column says by how much),
    ``off (no draft accepted)`` where physics decided, ``k=4 (measured; 1 batch: no interval)``
    from point values, ``withheld: not paired``. Format 1: ``k=3 (profile)``, ``k=4 (profile;
    uncertain: off/k=4/k=4)`` (the k at the lower ends / values / upper ends), ``off (measured;
    no interval)``. See :func:`choice_legend`."""
    ch = r.choice or DecisionChoice()
    if ch.k is None:  # not paired, no data; a file written before the demo always chose (withheld then)
        return f"withheld: {_WITHHELD_TEXT.get(ch.reason, ch.reason) if ch.reason else 'no data'}"
    if _by_rule(r):
        if ch.reason == "never_accepted":
            return f"{ch.run} (no draft accepted)"
        if ch.reason == "no_interval":
            return f"{ch.run} ({ch.basis}; 1 batch: no interval)"
        return f"{ch.run} ({ch.basis}{'' if ch.is_certain else '; uncertain'})"
    if ch.is_certain:
        return f"{ch.run} ({ch.basis})"
    if ch.reason == "uncertain":
        return f"{ch.run} ({ch.basis}; uncertain: {_run(ch.at_lower)}/{_run(ch.at_value)}/{_run(ch.at_upper)})"
    return f"{ch.run} ({ch.basis}; no interval)"


def format_confidence(row: DecisionRow) -> str:
    """The pick against its runner-up (format 2: the row's ``confidence``, the text of
    :meth:`~specwatch.specdecode.decision.Pick.confidence_text`); "–" for a format-1 row."""
    return row.confidence or "–"


#: What the "k to run" column's texts meant in format 1 (printed under an older document's table).
CHOICE_LEGEND = ("k to run: the smallest k within 2 % of the best (off = no speculation, exactly 1), compared at the "
                 "intervals' lower ends, values and upper ends; the k at the values is the one to run. Where the three "
                 "differ it says 'uncertain (a/b/c)' with the k at each: measure more batches, or run the k at the "
                 "values and watch the exporter. 'no interval': one measured batch, point values only. The basis in "
                 "brackets is the weakest of the estimates compared.")

#: What the columns of a format-2 table mean: the one decision rule (printed under the table).
RULE_LEGEND = ("k to run: the one decision rule (docs/choosing-k.md): among off (exactly 1), the run's k and the "
               "what-if k′ < k, the best estimate; within 2 % of it the smaller k wins; a configuration none of whose "
               "draft tokens was accepted cannot pay, so it is off whatever the ratio's noise says. The basis in brackets "
               "is the weaker of the pick's and its runner-up's. verdict: the pick against the baseline (pays: the "
               "interval's lower end above 1; loses: its upper end below 1); where the measured and the calibrated "
               "basis disagree the row says so, and measured (both servers live) rules. confidence: the pick against "
               "its runner-up, pick / runner-up with its 95 % interval (paired batch by batch where both were measured, "
               "else labelled unpaired); where it does not separate them the pick stays the better estimate "
               "('uncertain'). '1 batch: no interval': point values only. The demo starts each server once: its "
               + NO_START_SPREAD + ".")


def choice_legend(d: Decision) -> str:
    """The legend printed under the table: :data:`RULE_LEGEND` for a format-2 decision,
    :data:`CHOICE_LEGEND` for an older one."""
    return RULE_LEGEND if d.decision_format >= 2 or any(_by_rule(r) for r in d.rows) else CHOICE_LEGEND


def table_rows(decision: Decision) -> list[list[str]]:
    """The decision table as text cells (:data:`TABLE_COLUMNS`): workload, concurrency, measured
    ratio [95 %] basis, verdict, calibrated at k [95 %] basis, k to run (basis), confidence.
    The console, report.html and ``specwatch advise`` on a demo folder print these cells."""
    out = []
    for r in decision.rows:
        m = _estimate(r.measured)
        if m:
            mtxt = format_estimate(m)
        elif r.choice is not None and r.choice.reason == "not_paired":
            mtxt = "not paired"
        else:
            mtxt = f"{_x(r.ratio)}× (no interval) measured" if r.ratio else "–"
        out.append([r.workload, str(r.concurrency), mtxt, format_verdict(r), format_estimate(r.calibrated),
                    format_choice(r), format_confidence(r)])
    return out


def row_notes(decision: Decision) -> list[str]:
    """``<workload> c=<concurrency>: <note>`` for every row with a note (what is missing, physics,
    bases that disagree), in the table's order."""
    return [f"{r.workload} c={r.concurrency}: {r.note}" for r in decision.rows if r.note]


TABLE_COLUMNS = ("workload", "concurrency", "measured ratio [95 %], basis", "verdict",
                 "run's k from step costs [95 %], basis", "k to run (basis)", "confidence (against the runner-up)")


def render_decision(decision: Decision, con: Any) -> None:
    """Print the decision table to the rich console ``con``, as the demo ends and as ``specwatch
    advise`` on a demo folder prints it: the table (:func:`table_rows`), the legend
    (:func:`choice_legend`), how each basis was obtained, the per-cell notes and whether the
    exporter's cost profile fits this machine."""
    t = Table(title=f"the decision: does speculation (k={decision.k}) pay here, and which k to run", title_justify="left")
    for col in TABLE_COLUMNS:
        t.add_column(col, justify="left" if col in ("workload", "verdict") or col.startswith(("k to", "confidence"))
                     else "right")
    for row in table_rows(decision):
        t.add_row(*row)
    con.print(keep_names_whole(t))
    con.print(f"  {choice_legend(decision)}", soft_wrap=True)
    for basis, how in (decision.how or {}).items():
        con.print(f"  [bold]{basis}[/]: {how}", soft_wrap=True)
    for n in row_notes(decision):
        con.print(f"  {n}", soft_wrap=True)
    for line in profile_fit_lines(decision.profile_fit, decision.profile_name):
        con.print(line, soft_wrap=True)


def profile_fit_lines(fit: Sequence[ProfileFit], profile_name: str | None = None) -> list[str]:
    """Sentences on whether the exporter's cost profile (``profile_name``) fits this machine, one
    per concurrency (see :func:`profile_fit`), then what a misfit
    does to the exporter's answer."""
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


__all__ = ["BASES", "CALIBRATED", "CHOICE_LEGEND", "EXTRAPOLATED", "FIT_BAND", "HOW", "MEASURED", "PAIRING_OPTIONS", "PROFILE",
           "RULE_LEGEND", "TABLE_COLUMNS", "choice_legend", "decide", "fit_line",
           "format_choice", "format_confidence", "format_estimate", "format_verdict", "log_halfwidth", "never_accepted",
           "pairing", "profile_fit", "profile_fit_lines", "render_decision", "row_notes", "t975", "table_rows", "weakest"]
