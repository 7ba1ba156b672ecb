"""``specwatch advise``: which k (num_speculative_tokens) to run, from a sweep or from live data.

From a sweep result (``specwatch sweep``), for each speculative family (the speculative config
without its k): the expected acceptance length of every smaller k predicted from the largest k's
per-position curve and its error against the runs measured at those k; the step-time fit per
(workload, concurrency); the predicted throughput of every k; the recommended k per workload and
concurrency and over all workloads (by measured throughput where a k was run, ``--basis``; smaller
k preferred within ``--tolerance``; k = 0 = speculation off), with a half-batch cross-validation of
the picks; and a ready-to-paste ``--speculative-config`` with vLLM's dynamic
``num_speculative_tokens_per_batch_size`` table. The maths is in :mod:`specwatch.choosek.model`.

Live (``--exporter URL`` or ``--prometheus URL``): the per-position curve comes from the exporter's
``specwatch_position_acceptance_rate{window=…}`` (or Prometheus'
``model_name:specwatch_position_acceptance_rate:ratio_rate5m``) and the step cost from the cost
profile (``--cost-profile``; without one the built-in guess, basis ``default``), with the
exporter's own functions (:func:`specwatch.specdecode.speedup.speedups` and ``pick``, as its
``specwatch_speedup`` series): one :class:`LiveAdvice` record per curve.

Both modes give a typed result (:class:`SweepAdviceResult`, :class:`LiveAdviceResult`), printed by
one renderer (:func:`render_result`); its ``--json`` file (:func:`advice_document`) is its
``to_json()`` under the format key ``specwatch_advice_format`` (:data:`ADVISE_FORMAT`).
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from specwatch.specdecode.decision import NO_START_SPREAD, StartSpread, format_interval, format_ratio
from specwatch.choosek import model as kchoice
from specwatch.choosek.drafterstudy import picks_json, render_picks
from specwatch.choosek.model import DEFAULT_TOLERANCE, Advice, KChoiceError, speculative_config_advice
from specwatch.choosek.records import SweepResult
from specwatch.choosek.resultfile import measurements, start_spread
from specwatch.common.labels import for_terminal
from specwatch.specdecode.cost import CostModel
from specwatch.specdecode.costprofile import CostProfile
from specwatch.specdecode.speedup import LiveCost, pick, speedups
from specwatch.choosek.variablewidth import engine_formats

DEFAULT_LIVE_CONCURRENCIES = (1, 2, 4, 8, 16, 32, 64)


# --------------------------------------------------------------------------------------------
# From a sweep
# --------------------------------------------------------------------------------------------


def expected_rows(rec: SweepResult, family: str, ms) -> dict[tuple[str, int], str]:
    """Every (workload, concurrency) a family's advice must have a row for — each cell the sweep
    measured for the family or for the baseline, finished or not — with the reason to show when it
    cannot be scored: the family's cells there failed (:meth:`specwatch.choosek.records.SweepCell.problem`),
    or the family was not measured there (a dynamic table is a configuration of its own, scored like a fixed k)."""
    fam_cells = [c for c in rec.cells if c.k > 0 and (c.family or "") == family]
    base_cells = [c for c in rec.cells if c.k == 0]
    out: dict[tuple[str, int], str] = {}
    name = _family_name(family)
    for c in fam_cells + base_cells:
        key = (c.workload, int(c.max_concurrency))
        here = [x for x in fam_cells if (x.workload, int(x.max_concurrency)) == key]
        problems = [f"{x.config}: {x.problem()}" for x in here if x.problem()]
        runs = [m for m in ms if (m.workload, m.concurrency) == key and m.k > 0]
        if problems and not runs:
            out[key] = "not scored: " + "; ".join(problems) + " (resume the sweep to measure it again)"
        elif not here:
            out[key] = f"not scored: no {name} run was measured here (baseline only)"
        else:
            out[key] = "not scored: no finished speculative run with a measured throughput"
    return out


def _family_name(family: str) -> str:
    try:
        d = json.loads(family) if family else {}
    except json.JSONDecodeError:
        return family or "speculative"
    return str(d.get("method") or ("draft model" if d.get("model") else "speculative")) if isinstance(d, dict) else family


def advise_sweep(rec: SweepResult, *, tolerance: float = DEFAULT_TOLERANCE, candidates: str = "measured",
                 prior: CostModel | None = None, fit_ks=None, acceptance: str = "measured",
                 basis: str = "measured", mix: dict[str, float] | None = None,
                 measured: Sequence[kchoice.Measurement] | None = None, source: str | None = None) -> list[Advice]:
    """One :class:`specwatch.choosek.model.Advice` per speculative family of a sweep result (its
    record), each with the baseline runs and a row for every (workload,
    concurrency) measured for it or the baseline (:func:`expected_rows`); ``mix``: workload → share
    of the work for "all workloads" (:func:`specwatch.choosek.model.recommend`); ``measured``: the
    sweep's :func:`specwatch.choosek.resultfile.measurements` when the caller has them already;
    ``source``: the result file's path (names the file of the sweep command that measures a
    composed table, :func:`measure_command`). The sweep's A/A cells (``--aa-starts``), if any,
    give the between-server-starts term every interval and comparison holds
    (:func:`specwatch.choosek.resultfile.start_spread`, kept on each advice as ``start_spread``);
    they are never candidates. Raises KChoiceError if the sweep has no usable speculative run."""
    spread = start_spread(rec, source)
    aa_starts = tuple(sorted(rec.aa_names))
    rec = rec.without_aa()
    ms = list(measurements(rec) if measured is None else measured)
    base = [m for m in ms if m.k == 0]
    fams: dict[str, list] = defaultdict(list)
    for m in ms:
        if m.k > 0:
            fams[m.family].append(m)
    if not fams:
        raise KChoiceError("the sweep has no finished speculative cell yet")
    configs = rec.configs_by_name()
    out = []
    for fam, spec in fams.items():
        base_cfg = None
        tables: dict[str, dict[str, Any]] = {}
        for m in spec:
            cfg = configs.get(m.config)
            sc = cfg.speculative_config if cfg is not None else None
            if sc and m.variable_width:
                tables[kchoice.candidate_name(m)] = dict(sc)
            elif sc and base_cfg is None:
                base_cfg = {k: v for k, v in sc.items() if k not in ("num_speculative_tokens",
                                                                     "num_speculative_tokens_per_batch_size")}
        if base_cfg is None and tables:
            base_cfg = {k: v for k, v in next(iter(tables.values())).items()
                        if k not in ("num_speculative_tokens", "num_speculative_tokens_per_batch_size")}
        try:
            a = kchoice.advise(base + spec, tolerance=tolerance, prior=prior, candidates=candidates,
                               base_config=base_cfg, family=fam, fit_ks=fit_ks, acceptance=acceptance,
                               basis=basis, mix=mix, expected=expected_rows(rec, fam, spec), table_configs=tables,
                               start_spread=spread)
            a.aa_starts = aa_starts
            if a.candidate_config is not None:
                compare = [c for n, c in a.config_of.items() if c is not None and n not in tables]
                a.measure_command = measure_command(rec, [*compare, a.candidate_config], source, len(aa_starts))
            out.append(a)
        except KChoiceError as exc:
            if len(fams) == 1:
                raise
            print(f"family {fam}: {exc}", file=sys.stderr)
    return out


def measure_command(rec: SweepResult, configs: Sequence[Mapping[str, Any]],
                    source: str | None = None, aa_starts: int = 0) -> str:
    """The ``specwatch sweep`` command that measures ``configs`` (e.g. the fixed-k picks and a
    table composed from them) beside a baseline with the sweep's own settings (workloads,
    concurrencies, output length, prompts, batches, seed; its server command template when it
    used one; ``--aa-starts`` when the sweep had A/A starts, ``aa_starts`` of them), into a new
    result file beside ``source`` (``<stem>-table.json``)."""
    st = rec.settings.to_json() if rec.settings is not None else {}
    stem = (source or "specwatch-sweep.json").rsplit(".json", 1)[0]
    parts = ["specwatch sweep", f"--result-file {shlex.quote(stem + '-table.json')}"]
    wls = rec.workloads()
    if wls:
        parts.append(f"--workloads {','.join(wls)}")
    concs = sorted({int(c.max_concurrency) for c in rec.cells})
    if concs:
        parts.append(f"--concurrency {','.join(map(str, concs))}")
    for key, flag in (("output_len", "--output-len"), ("num_prompts", "--num-prompts"),
                      ("prompts_per_concurrency", "--prompts-per-concurrency"), ("num_batches", "--num-batches"),
                      ("max_batches", "--max-batches"), ("target_ci", "--target-ci"),
                      ("warmup_batches", "--warmup-batches"), ("seed", "--seed"), ("dataset_path", "--dataset-path")):
        v = st.get(key)
        if v is not None and not (key == "prompts_per_concurrency" and st.get("num_prompts") is not None):
            parts.append(f"{flag} {shlex.quote(str(v))}")
    if rec.server is not None and rec.server.kind == "template" and rec.server.command_template:
        parts.append(f"--server-command {shlex.quote(rec.server.command_template)}")
    if aa_starts:
        parts.append(f"--aa-starts {aa_starts}")
    for c in configs:
        parts.append("--speculative-config " + shlex.quote(json.dumps(dict(c), separators=(",", ":"))))
    return " ".join(parts)


#: What the advice says of how the sweep measured (issue #37).
MODE_LINES = {
    "paired": "measured paired: each speculative server beside the baseline server, alternating rounds on the same "
              "prompts (a drift of the host weighs on both sides of a pair alike; the noise within a pair stays)",
    "sequential": "measured sequentially: one server after the other; batch i of each still served the same prompts, "
                  "so ratios are paired by prompt, but minutes apart (they include whatever the host did in between; "
                  "re-run without --sequential for paired rounds)",
    "mixed": "measured partly paired, partly sequentially (a resumed sweep switched mode): see each cell's mode",
}


def start_spread_line(spread: StartSpread | None, aa_starts: Sequence[str] = ()) -> str:
    """What every interval of a sweep's advice holds beyond its batches: the between-server-starts
    term measured by the sweep's A/A starts (:class:`specwatch.specdecode.decision.StartSpread`),
    or that it was not measured (:data:`specwatch.specdecode.decision.NO_START_SPREAD`; when the
    sweep has A/A starts ``aa_starts`` but no usable cell of theirs, says so)."""
    if spread is None and aa_starts:
        return (f"between-start spread not measured: the A/A start{'s' if len(aa_starts) > 1 else ''} "
                f"{', '.join(aa_starts)} of this sweep have no finished cell with two or more paired batches; each "
                "interval holds one start of each server only (resume the sweep to measure them)")
    if spread is None:
        return NO_START_SPREAD
    if spread.log_sd == 0.0:
        return f"between server starts: {spread.percent_text()}; measured by {spread.source}"
    return (f"between server starts: {spread.percent_text()} added to every interval and to every comparison of "
            f"two starts; measured by {spread.source}")

WIDE_CONSOLE = 160


def make_console():
    """A rich Console for command output: the terminal's width on a TTY, else ``WIDE_CONSOLE``
    columns (so tables piped to a file are not cut to 80 columns)."""
    return Console() if sys.stdout.isatty() else Console(width=WIDE_CONSOLE)


def request_failure(url: str, exc: BaseException) -> str:
    """A one-line reason for a failed HTTP request to ``url`` (no urllib3 object dumps):
    "HTTP 404", "timed out", "connection refused", "name or service not known", …"""
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        return f"HTTP {exc.response.status_code} {exc.response.reason or ''}".strip()
    if isinstance(exc, requests.Timeout):
        return "timed out"
    if isinstance(exc, (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema,
                        requests.exceptions.InvalidSchema)):
        return f"invalid URL ({exc})"
    seen, todo = set(), [exc]
    while todo:  # find the socket error under requests → urllib3 wrappers
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.strerror and not isinstance(e, requests.RequestException):
            return e.strerror.lower() if isinstance(e.strerror, str) else str(e.strerror)
        todo.extend([getattr(e, "reason", None), e.__cause__, e.__context__, *[a for a in e.args if isinstance(a, BaseException)]])
    return type(exc).__name__


def _f(v: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if v is None else f"{v:{spec}}{suffix}"


def _ci_text(iv, mean) -> str:
    """`` [41.6–46.6]`` (the 95 % interval of a throughput, log scale: positive; shown, never
    decided on); `` 1 batch`` without an interval."""
    if mean is None:
        return ""
    if iv is None:
        return " 1 batch"
    return f" [{iv[0]:.1f}–{iv[1]:.1f}]"


def _iv_text(iv) -> str:
    return "" if iv is None else f" [{iv[0]:.1f}–{iv[1]:.1f}]"


def speedup_text(r) -> str:
    """The pick's speedup over the baseline with its paired 95 % interval, e.g. ``3.22×
    [2.54–3.90]`` (``1×`` for speculation off; ``(1 batch: no interval)`` with one batch)."""
    if r.pick is None:
        return "–"
    c = r.pick.pick
    if c.off:
        return "1× (off)"
    return f"{format_ratio(c.value)}× {format_interval(c.lower, c.upper)}"


VERDICT_TEXT = {"pays": "pays", "loses": "loses", "cannot_tell": "cannot tell"}


def pick_label(r) -> str:
    """The pick's name as a table shows it, with its basis when it is not measured (a what-if k:
    ``k=3 (calibrated)``); ``–`` for a row that cannot be scored."""
    if r.config is None or r.pick is None:
        return "–"
    b = r.pick.pick.basis
    return r.config if b == "measured" else f"{r.config} ({b})"


def _row_label(r, a: Advice) -> str:
    if r.workload != "*":
        return r.workload
    return "all workloads" + (" (mix)" if a.mix else "")


def recommendation_note(r) -> str:
    """What a row of the recommendation table says beside its pick: why a row is not scored, or
    the pick's confidence against its runner-up (:meth:`specwatch.specdecode.decision.Pick.confidence_text`),
    configurations that cannot pay (drafts never accepted), lower-bound what-ifs and
    single-batch candidates (a value, no interval)."""
    if r.k is None or r.pick is None:
        return r.reason or "not scored"
    parts = [r.pick.confidence_text()]
    if r.pick.runner_up is not None:  # else the confidence text names them already
        for name, _why in r.pick.excluded:
            parts.append(f"{name}: no draft token accepted in any batch: cannot pay")
    if r.lower_bound_ks:
        parts.append("what-if k=" + ",".join(map(str, r.lower_bound_ks)) + " from a lower-bound curve (ragged drafts)")
    if r.one_batch:
        parts.append("1 batch (no interval): " + ", ".join(r.one_batch))
    return "; ".join(parts)


def render_advice(a: Advice, console) -> None:
    """Print one family's advice as rich tables on ``console``: the acceptance-length predictions,
    the step-time fits, the throughputs, the pick per cell, the check against the measurements and
    what to run (:func:`render_sweep_config`)."""
    if a.family:
        console.print(f"[bold]speculative family[/bold] {a.family}")
    _render_acceptance(a, console)
    _render_step_fits(a, console)
    _render_throughputs(a, console)
    _render_model_gaps(a, console)
    _render_throughput_error(a, console)
    _render_picks_per_cell(a, console)
    _render_accuracy(a, console)
    if not any(r.k is not None for r in a.recommendations):
        console.print("[yellow]no recommendation: no measured cell has both a speculative run and a baseline run to "
                      "pair it with[/yellow]")
    render_sweep_config(a, console)


def _render_acceptance(a: Advice, console) -> None:
    """The predicted against the measured acceptance lengths E(k), then their errors."""
    t = Table(title="Expected acceptance length E(k) from the largest k's per-position curve vs measured")
    for col in ("workload", "conc.", "k", "from k", "predicted", "measured", "drafts", "error", "rel. error"):
        t.add_column(col, justify="left" if col == "workload" else "right")
    for p in a.acceptance:
        t.add_row(p.workload, str(p.concurrency), str(p.k), str(p.source_k), _f(p.predicted), _f(p.measured),
                  _f(p.measured_drafts, ".0f"),
                  _f(p.error, "+.2f"), _f(None if p.relative_error is None else p.relative_error * 100, "+.1f", " %"))
    console.print(t)
    for e in (a.acceptance_error, a.acceptance_error_over(100.0)):
        if e.n:
            console.print(f"acceptance-length prediction error (k < largest k, {e.n} runs"
                          + (f" with >= {e.min_drafts:.0f} drafts" if e.min_drafts else "")
                          + f"): mean |rel| {e.mean_abs_relative * 100:.1f} %, max {e.max_abs_relative * 100:.1f} %")


def _render_step_fits(a: Advice, console) -> None:
    """The step-time fit T(x) = T0 + β·x per (workload, concurrency)."""
    t = Table(title="Step time T(x) = T0 + β·x (x = draft tokens verified per request-step; T = c·τ / throughput)")
    for col in ("workload", "conc.", "baseline T ms", "T0 ms", "β ms/token", "fit", "max residual"):
        t.add_column(col, justify="left" if col == "workload" else "right")
    for f in a.fits:
        t.add_row(f.workload, str(f.concurrency), _f(None if f.baseline_step_s is None else f.baseline_step_s * 1000),
                  _f(f.intercept_s * 1000), _f(f.slope_s * 1000, ".3f"), f.method, _f(f.max_residual * 100, ".1f", " %"))
    console.print(t)


def _render_throughputs(a: Advice, console) -> None:
    """The predicted (and measured) throughput of every k per cell, and the measured dynamic tables."""
    ks = sorted({p.k for p in a.throughput})
    t = Table(title="Output throughput tok/s: predicted (measured [95 % interval, log scale: shown, never decided on]); "
                    "\"lower bound\": a what-if from a ragged cell's lower-bound curve; –: no model for the cell (its "
                    "measurement still counts); a dynamic table: measured only")
    t.add_column("workload")
    t.add_column("conc.", justify="right")
    for k in ks:
        t.add_column("baseline" if k == 0 else f"k={k}", justify="right")
    for name in a.table_throughputs:
        t.add_column(name, justify="right")
    rows: dict[tuple[str, int], dict[int, Any]] = defaultdict(dict)
    for p in a.throughput:
        rows[(p.workload, p.concurrency)][p.k] = p
    for key in {key for cells in a.table_throughputs.values() for key in cells}:
        rows.setdefault(key, {})
    for (wl, c), ps in sorted(rows.items()):
        cells = [_throughput_cell(ps.get(k), k) for k in ks]
        for tcells in a.table_throughputs.values():
            v = tcells.get((wl, c))
            cells.append("" if v is None else f"– ({v[0]:.1f}{_ci_text(v[1], v[0])})")
        t.add_row(wl, str(c), *cells)
    console.print(t)


def _throughput_cell(p, k: int) -> str:
    """One k's cell of the throughput table: the prediction with the measurement and its interval."""
    if p is None:
        return ""
    if k == 0:
        return f"{p.measured:.1f}" + _ci_text(p.interval, p.measured)
    if p.curve_basis in ("none", "beyond_curve"):
        return f"– ({p.measured:.1f}{_ci_text(p.interval, p.measured)})"
    return (f"{p.predicted:.1f}" + ("" if p.measured is None else f" ({p.measured:.1f}{_ci_text(p.interval, p.measured)})")
            + (" lower bound" if p.curve_basis == "lower_bound" and p.measured is None else ""))


def _render_model_gaps(a: Advice, console) -> None:
    """The cells without a model and the k beyond a cell's per-position curve."""
    no_model = sorted({(p.workload, p.concurrency) for p in a.throughput if p.k > 0 and p.curve_basis == "none"})
    if no_model:
        console.print("[yellow]no model for " + ", ".join(f"{wl} c={c}" for wl, c in no_model) + ": those runs have no "
                      "spec-decode counters or step time to predict other k from (a vLLM whose /metrics lacks "
                      "vllm:spec_decode_* counters?); their measured throughput still scores their own k[/yellow]",
                      soft_wrap=True)
    beyond = sorted({(p.workload, p.concurrency, p.k) for p in a.throughput if p.curve_basis == "beyond_curve"})
    if beyond:
        console.print("no prediction for " + ", ".join(f"{wl} c={c} k={k}" for wl, c, k in beyond) + ": k is beyond "
                      "the per-position curve of that cell (its drafts were never that long); the measured throughput "
                      "still scores that k", soft_wrap=True)


def _render_throughput_error(a: Advice, console) -> None:
    """The throughput predictions' error over the measured runs (or that the fit is exact)."""
    te = a.throughput_error
    if te.n and te.exact_fit:
        console.print(f"throughput prediction error: exact fit: {te.max_points} runs, {te.parameters} parameters "
                      f"per (workload, concurrency) — no error estimate (measure more k to get one)")
    elif te.n:
        console.print(f"throughput prediction error ({te.n} measured runs): mean |rel| "
                      f"{te.mean_abs_relative * 100:.1f} %, max {te.max_abs_relative * 100:.1f} %"
                      + ("" if a.noise is None else f"; measurement noise (median rel. std. error) {a.noise * 100:.1f} %"))


def _render_picks_per_cell(a: Advice, console) -> None:
    """The decision rule's pick per cell, the rows' notes and how all workloads combine."""
    t = Table(title="Pick per cell (the decision rule, docs/choosing-k.md#the-decision-rule: the best speedup "
                    "estimate from paired per-batch ratios over the baseline, smaller k within "
                    f"{a.tolerance * 100:g} %; off = speculation off; a dynamic table is a configuration of its own)")
    for col in ("workload", "conc.", "pick", "speedup vs baseline (paired 95 %)", "verdict", "batches", "confidence / note"):
        t.add_column(col, justify="left" if col in ("workload", "pick", "verdict", "confidence / note") else "right")
    for r in a.recommendations:
        t.add_row(_row_label(r, a), str(r.concurrency), pick_label(r), speedup_text(r),
                  "–" if r.verdict is None else VERDICT_TEXT.get(r.verdict, r.verdict),
                  ", ".join(f"{n}: {b}" for n, b in r.batches.items()), recommendation_note(r))
    console.print(t)
    notes = list(dict.fromkeys(n for r in a.recommendations for n in r.notes))
    line = kchoice.unpaired_line(notes)
    for n in ([line] if line else []) + [n for n in notes if not n.endswith(kchoice.UNPAIRED_NOTE)]:
        console.print(n, style="yellow", markup=False, soft_wrap=True, highlight=False)
    combos = {r.combination for r in a.recommendations if r.workload == "*" and r.combination}
    for how in sorted(combos):
        console.print(f"all workloads: speedups combined through {how}, batch by batch on the log scale — total baseline "
                      "time / total time with the configuration (the harmonic mean of the per-workload speedups, "
                      "weighted by baseline time)", soft_wrap=True)


def _render_accuracy(a: Advice, console) -> None:
    """The picks' measured throughput against the best measured configuration of their cell."""
    if not a.accuracy:
        return
    t = Table(title="Check against the measurements: throughput of the pick vs the best measured configuration "
                    "(mean tok/s [95 %, log scale])")
    for col in ("workload", "conc.", "pick", "best measured", "pick tok/s", "best tok/s", "shortfall"):
        t.add_column(col, justify="left" if col in ("workload", "pick", "best measured") else "right")
    for x in a.accuracy:
        t.add_row(x.workload, str(x.concurrency), x.picked + (" (within tolerance)" if x.tie else ""), x.best,
                  _f(x.picked_throughput, ".1f") + _iv_text(x.picked_interval),
                  _f(x.best_throughput, ".1f") + _iv_text(x.best_interval),
                  _f(None if x.shortfall is None else x.shortfall * 100, ".1f", " %"))
    console.print(t)
    if a.worst_shortfall is not None:
        console.print(f"shortfall of the picks against the best measured configuration of their cell: worst "
                      f"{a.worst_shortfall * 100:.1f} % over {len(a.accuracy)} cells (mean throughputs; the picks "
                      "are decided on paired ratios)", soft_wrap=True)


def render_sweep_config(a: Advice, console) -> None:
    """What to run from a sweep's all-workloads picks (:attr:`specwatch.choosek.model.Advice.answer`):
    one configuration everywhere (its flag to paste; a dynamic table only when that measured
    table was the pick), off everywhere, or per concurrency — then a table composed from the
    fixed-k picks is printed as a candidate to measure with the sweep command that measures it,
    never as the answer."""
    if a.answer is None:
        return
    console.print("[bold]pick by concurrency (all workloads):[/bold] "
                  + ", ".join(f"c={c}: {n}" for c, n in sorted(a.config_by_concurrency.items())))
    for r in a.recommendations:
        if r.workload == "*" and r.pick is not None:
            console.print(f"  c={r.concurrency}: {r.config} ({r.pick.confidence_text()})", markup=False, highlight=False,
                          soft_wrap=True)
    if a.answer == "off":
        console.print("[bold]vLLM:[/bold] speculation is not the pick at any measured concurrency: run without "
                      "--speculative-config.")
        return
    if a.answer == "one":
        name = next(iter(a.config_by_concurrency.values()))
        console.print(f"[bold]vLLM flag to paste[/bold] ({name}, the pick at every measured concurrency):")
        console.print(f"--speculative-config '{json.dumps(a.speculative_config, separators=(',', ':'))}'",
                      markup=False, highlight=False, soft_wrap=True)
        if (a.speculative_config or {}).get("num_speculative_tokens_per_batch_size"):
            console.print("(a dynamic table measured in this sweep, ahead of every fixed k)", markup=False)
            render_engine_formats(engine_formats(a.speculative_config, a.k_by_concurrency), console)
        return
    console.print("[bold]no single configuration is the pick at every measured concurrency[/bold]; per concurrency:")
    for c, name in sorted(a.config_by_concurrency.items()):
        cfg = a.config_of.get(name)
        console.print(f"  c={c}: {name}: " + ("run without --speculative-config" if cfg is None else
                                              f"--speculative-config '{json.dumps(cfg, separators=(',', ':'))}'"),
                      markup=False, highlight=False, soft_wrap=True)
    if a.candidate_config is not None:
        console.print("a table composed from these picks is a [bold]candidate to measure[/bold], not an answer (a table "
                      "can lose where every fixed k gains):", soft_wrap=True)
        console.print(f"  --speculative-config '{json.dumps(a.candidate_config, separators=(',', ':'))}'",
                      markup=False, highlight=False, soft_wrap=True)
        if a.measure_command:
            console.print("measure it beside the fixed k:", markup=False)
            console.print(f"  {a.measure_command}", markup=False, highlight=False, soft_wrap=True)


def render_config(cfg: dict[str, Any] | None, k_by_c: dict[int, int], console, *, candidate: bool = False) -> None:
    """Print the ready-to-paste vLLM flags; ``candidate``: the picks are not certain (or rest on
    the built-in guess), so the config is printed as a candidate to measure, with the
    ``specwatch sweep`` command that measures it beside a baseline, never as the answer
    (docs/choosing-k.md#the-decision-rule)."""
    if not k_by_c:
        return
    console.print("[bold]k by concurrency (all workloads):[/bold] " + ", ".join(f"c={c}: k={k}" for c, k in sorted(k_by_c.items())))
    if cfg is None:
        console.print("[bold]vLLM:[/bold] speculation does not pay at any measured concurrency: run without --speculative-config.")
        return
    text = json.dumps(cfg, separators=(",", ":"))
    if candidate:
        console.print("[bold]a candidate to measure, not yet the answer[/bold] (measure it beside a baseline, paired):",
                      markup=True)
        console.print(f"specwatch sweep --speculative-config '{text}'", markup=False, highlight=False, soft_wrap=True)
        return
    console.print("[bold]vLLM flag to paste:[/bold]", markup=True)
    console.print(f"--speculative-config '{text}'", markup=False, highlight=False, soft_wrap=True)
    table = cfg.get("num_speculative_tokens_per_batch_size")
    if table:
        console.print("num_speculative_tokens_per_batch_size (dynamic speculative decoding, vLLM 0.24+; "
                      "inclusive batch-size ranges, the last k carried up to max_num_seqs):", markup=False)
        for s, e, k in table:
            console.print(f"  batch size {s}-{e}: k = {k}" + (" (speculation off)" if k == 0 else ""), markup=False)
    render_engine_formats(engine_formats(cfg, k_by_c), console)


def render_engine_formats(formats: dict[str, Any] | None, console) -> None:
    """Tier-boundary warnings and the table in SGLang's and TensorRT-LLM's formats
    (:mod:`specwatch.choosek.variablewidth`)."""
    if not formats:
        return
    for w in formats["tier_warnings"]:
        console.print(f"[yellow]warning: {w['message']}[/yellow]", soft_wrap=True)
    sg, trt = formats["sglang"], formats["tensorrt_llm"]
    console.print(f"SGLang ({sg['format']}; {sg['flags']}), the config file:", markup=False, soft_wrap=True)
    console.print("  " + json.dumps(sg["speculative_adaptive_config"], separators=(",", ":")), markup=False,
                  highlight=False, soft_wrap=True)
    console.print(f"TensorRT-LLM ({trt['format']}), in speculative_config:", markup=False, soft_wrap=True)
    console.print("  " + json.dumps({"max_draft_len": trt["max_draft_len"], "draft_len_schedule":
                                     {int(b): k for b, k in trt["draft_len_schedule"].items()}}), markup=False,
                  highlight=False, soft_wrap=True)
    if trt.get("note"):
        console.print(f"  note: {trt['note']}", markup=False, soft_wrap=True)


# --------------------------------------------------------------------------------------------
# Live
# --------------------------------------------------------------------------------------------


def curves_from_exporter(text: str, window: str,
                         bases: dict[tuple[str, ...], str] | None = None) -> dict[tuple[str, ...], tuple[float, ...]]:
    """Per-position curves from the exporter's exposition text:
    ``specwatch_position_acceptance_rate{upstream, model_name, engine, position, window}``, for
    ``window`` (falling back to "lifetime" when that window has no samples). Keyed by
    (upstream, model_name, engine); positions in order. Parsed with prometheus_client.parser.
    Raises KChoiceError when ``text`` does not parse (an HTML page, garbage). ``bases``, when
    given, receives each curve's ``basis`` label (exact / lower_bound; "exact" for an exporter
    that predates the label)."""
    found: dict[str, dict[tuple[str, ...], dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    found_basis: dict[str, dict[tuple[str, ...], str]] = defaultdict(dict)
    try:
        for fam in text_string_to_metric_families(text):
            if fam.name != "specwatch_position_acceptance_rate":
                continue
            for s in fam.samples:
                # upstream text: printed by advise, so never raw (a model name may hold escape codes)
                key = (for_terminal(s.labels.get("upstream", "")), for_terminal(s.labels.get("model_name", "")),
                       for_terminal(s.labels.get("engine", "")))
                found[s.labels.get("window", "")][key][int(s.labels["position"])] = s.value
                found_basis[s.labels.get("window", "")][key] = s.labels.get("basis", "exact")
    except Exception as exc:  # the parser raises ValueError, KeyError, IndexError… on garbage
        head = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise KChoiceError(f"not Prometheus exposition text ({head})") from None
    chosen_window = window if found.get(window) else "lifetime"
    chosen = found.get(chosen_window) or {}
    if bases is not None:
        bases.update({k: found_basis[chosen_window].get(k, "exact") for k in chosen})
    return {k: tuple(v[i] for i in sorted(v)) for k, v in chosen.items()}


class PrometheusError(Exception):
    """Prometheus cannot be queried or answers what is no query result (one line): a plain
    exception, printed by the command layer (:mod:`specwatch.choosek.cli`), exit 1."""

    exit_code = 1


def curves_from_prometheus(url: str, rule: str = "model_name:specwatch_position_acceptance_rate:ratio_rate5m",
                           timeout: float = 10.0,
                           bases: dict[tuple[str, ...], str] | None = None) -> dict[tuple[str, ...], tuple[float, ...]]:
    """Per-position curves from Prometheus' instant query of the recording rule ``rule`` (labels
    job, model_name, position). Raises PrometheusError (one line) when Prometheus cannot be queried."""
    try:
        r = requests.get(url.rstrip("/") + "/api/v1/query", params={"query": rule}, timeout=timeout)
        r.raise_for_status()
        data = r.json()
    except requests.RequestException as exc:
        raise PrometheusError(f"cannot query Prometheus at {url}: {request_failure(url, exc)}") from None
    except ValueError:
        raise PrometheusError(f"cannot query Prometheus at {url}: the answer is not JSON (is it Prometheus?)") from None
    if not isinstance(data, dict):
        raise PrometheusError(f"cannot query Prometheus at {url}: unexpected answer (is it Prometheus?)")
    if data.get("status") != "success":
        raise PrometheusError(f"Prometheus query failed: {for_terminal(data.get('error'))}")
    acc: dict[tuple[str, ...], dict[int, float]] = defaultdict(dict)
    for item in data.get("data", {}).get("result", []):
        m = item.get("metric", {})
        v = float(item["value"][1])
        if math.isfinite(v) and "position" in m:
            key = (for_terminal(m.get("job", "")), for_terminal(m.get("model_name", "")))  # printed: never raw
            acc[key][int(m["position"])] = v
            if bases is not None and bases.get(key) != "lower_bound":  # any lower-bound sample makes the curve one
                bases[key] = m.get("basis", "exact")
    return {k: tuple(v[i] for i in sorted(v)) for k, v in acc.items()}


@dataclass(frozen=True)
class SpeedupValue:
    """The speedup of one k at one concurrency with its 95 % interval and basis
    (:func:`specwatch.specdecode.speedup.speedups`)."""

    value: float
    lower: float | None
    upper: float | None
    basis: str

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "lower": self.lower, "upper": self.upper, "basis": self.basis}


@dataclass(frozen=True)
class LiveAdvice:
    """The live advice for one curve (one ``series``: upstream, model_name, engine from the
    exporter, or job, model_name from Prometheus): ``speedup`` by concurrency and k, the k
    (``k_by_concurrency``) or why it is withheld (``withheld_by_concurrency``) per concurrency with
    its basis, and the vLLM config. ``withheld`` is ``no_cost_curve`` when the cost profile has no
    curve for the method and drafter (then there are no speedups). Concurrencies and k are ints
    here; :meth:`to_json` writes them as text keys (``advise --json``'s ``live`` items)."""

    series: tuple[str, ...]
    position_acceptance_rates: tuple[float, ...]
    curve_basis: str
    withheld: str | None = None
    speedup: Mapping[int, Mapping[int, SpeedupValue]] = field(default_factory=dict)
    k_by_concurrency: Mapping[int, int] = field(default_factory=dict)
    basis_by_concurrency: Mapping[int, str] = field(default_factory=dict)
    withheld_by_concurrency: Mapping[int, str] = field(default_factory=dict)
    cost_profile: str | None = None
    speculative_config: Mapping[str, Any] | None = None
    engine_formats: Mapping[str, Any] | None = None
    certain_by_concurrency: Mapping[int, bool] = field(default_factory=dict)
    confidence_by_concurrency: Mapping[int, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The series as shown: its non-empty labels joined by " / "."""
        return " / ".join(x for x in self.series if x)

    def to_json(self) -> dict[str, Any]:
        """The JSON object of ``advise --json``'s ``live`` list."""
        out: dict[str, Any] = {"series": list(self.series), "position_acceptance_rates": list(self.position_acceptance_rates),
                               "curve_basis": self.curve_basis}
        if self.withheld is not None:
            out["withheld"] = self.withheld
        out.update({
            "speedup": {str(c): {str(k): v.to_json() for k, v in sp.items()} for c, sp in self.speedup.items()},
            "k_by_concurrency": {str(c): k for c, k in self.k_by_concurrency.items()},
            "basis_by_concurrency": {str(c): b for c, b in self.basis_by_concurrency.items()},
            "withheld_by_concurrency": {str(c): r for c, r in self.withheld_by_concurrency.items()},
            "certain_by_concurrency": {str(c): v for c, v in self.certain_by_concurrency.items()},
            "confidence_by_concurrency": {str(c): t for c, t in self.confidence_by_concurrency.items()},
            "cost_profile": self.cost_profile, "speculative_config": self.speculative_config,
            "engine_formats": self.engine_formats})
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str | None = None) -> LiveAdvice:
        """The record of one ``live`` item of an ``advise --json`` file. Raises KChoiceError
        (naming ``where``) for an item of the wrong shape."""
        try:
            return cls(series=tuple(data["series"]), position_acceptance_rates=tuple(data["position_acceptance_rates"]),
                       curve_basis=data["curve_basis"], withheld=data.get("withheld"),
                       speedup={int(c): {int(k): SpeedupValue(**v) for k, v in sp.items()}
                                for c, sp in data["speedup"].items()},
                       k_by_concurrency={int(c): k for c, k in data["k_by_concurrency"].items()},
                       basis_by_concurrency={int(c): b for c, b in data["basis_by_concurrency"].items()},
                       withheld_by_concurrency={int(c): r for c, r in data["withheld_by_concurrency"].items()},
                       cost_profile=data["cost_profile"], speculative_config=data["speculative_config"],
                       engine_formats=data["engine_formats"],
                       certain_by_concurrency={int(c): bool(v) for c, v in data.get("certain_by_concurrency", {}).items()},
                       confidence_by_concurrency={int(c): str(t) for c, t in
                                                  data.get("confidence_by_concurrency", {}).items()})
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise KChoiceError(f"{where or 'live advice'}: not a live advice item ({type(exc).__name__}: {exc})") from None


def live_advices(curves: dict[tuple[str, ...], tuple[float, ...]], concurrencies, profile: CostProfile | None,
                 tolerance: float, base_config: dict[str, Any] | None, *, method: str | None = None,
                 drafter: str | None = None, bases: dict[tuple[str, ...], str] | None = None) -> list[LiveAdvice]:
    """For each curve: the speedup of every k, with its 95 % interval, at each number of running
    requests b (from the cost profile's relative costs: basis "profile" or "extrapolated"; without a
    profile the built-in guess, basis "default" — :func:`specwatch.specdecode.speedup.speedups`),
    the k per b by the one decision rule (:func:`specwatch.specdecode.speedup.pick`: the best
    estimate, ties within ``tolerance`` to the smaller k, always served with its confidence in
    ``certain_by_concurrency`` and ``confidence_by_concurrency``, never withheld as uncertain) with
    the weaker basis of the pick and its runner-up, and the vLLM config. A curve whose ``bases`` entry is ``lower_bound``
    (ragged drafts, :mod:`specwatch.specdecode.ragged`) keeps its speedups; as its share of
    never-drafted positions is not known here, their upper ends take every position as accepted
    (r_i = 1), which widens the pick's confidence. A profile without a curve for
    ``method``/``drafter`` gives no speedups and no k: ``withheld`` is ``no_cost_curve`` (measured
    for another drafter; the built-in guess does not stand in for it)."""
    out = []
    no_curve = profile is not None and not profile.has_curve(method, drafter)
    prof_name = None if profile is None else profile.name
    for key, rates in sorted(curves.items()):
        if not rates:
            continue
        basis = (bases or {}).get(key, "exact")
        if no_curve:
            out.append(LiveAdvice(series=tuple(key), position_acceptance_rates=tuple(rates), curve_basis=basis,
                                  withheld="no_cost_curve", cost_profile=prof_name))
            continue
        by_c, k_by_c, basis_by_c, withheld_by_c, certain_by_c, conf_by_c = {}, {}, {}, {}, {}, {}
        for c in concurrencies:
            sp = speedups(rates, LiveCost(profile=profile, running_requests_fallback=float(c), method=method,
                                          drafter=drafter, missing_ratio=1.0 if basis == "lower_bound" else 0.0),
                          current_k=0)
            by_c[c] = {k: SpeedupValue(v.value, v.lower, v.upper, v.basis) for k, v in sp.items()}
            # physics first: a curve whose every position is 0 had drafts and accepted none (off, certain)
            choice = pick(sp, tolerance, never_accepted=not any(r > 0 for r in rates))
            k_by_c[c] = choice.k
            certain_by_c[c] = choice.certain
            conf_by_c[c] = choice.confidence_text()
            basis_by_c[c] = choice.basis
        config = speculative_config_advice(base_config, k_by_c) if k_by_c else None
        out.append(LiveAdvice(series=tuple(key), position_acceptance_rates=tuple(rates), curve_basis=basis, speedup=by_c,
                              k_by_concurrency=k_by_c, basis_by_concurrency=basis_by_c, withheld_by_concurrency=withheld_by_c,
                              cost_profile=prof_name, speculative_config=config,
                              engine_formats=engine_formats(config, k_by_c) if config else None,
                              certain_by_concurrency=certain_by_c, confidence_by_concurrency=conf_by_c))
    return out


# --------------------------------------------------------------------------------------------
# The two results of `specwatch advise` and their one renderer
# --------------------------------------------------------------------------------------------

#: ``advise --json`` format: 2 added rows that cannot be scored (``k`` null with a ``reason``),
#: intervals, ties, batches and the all-workloads combination (``combination``, ``mix``); 3: each
#: row is decided by the one rule on paired ratios and carries its ``pick``
#: (:meth:`specwatch.specdecode.decision.Pick.to_json`), its ``config`` (a dynamic table is a
#: configuration of its own), ``scores`` and ``batches`` keyed by configuration name, ``notes``;
#: the family's ``answer``, ``config_by_concurrency`` and ``candidate_to_measure``; no
#: ``intervals``/``tied`` (the overlap rule is gone) and no cross-validation.
ADVISE_FORMAT = 3
#: The format key of ``advise --json`` in both modes (sweep result and live data), named as the
#: other result files name theirs (``specwatch_sweep_format``, ``specwatch_bench_format``, …); its
#: value is :data:`ADVISE_FORMAT`. A sweep's document keeps its ``advise_format`` too.
ADVICE_FORMAT_KEY = "specwatch_advice_format"


@dataclass(frozen=True)
class SweepAdviceResult:
    """``specwatch advise RESULT_FILE``: the advice per speculative family (:func:`advise_sweep`),
    the drafter labels and picks (:mod:`specwatch.choosek.drafterstudy`), the cells left out, the
    sweep's status and the settings the advice was made with."""

    source: str
    advices: tuple[Advice, ...]
    labels: Mapping[str, str]
    picks: tuple[Any, ...]
    left_out: tuple[str, ...]
    status: str | None
    tolerance: float
    candidates: str
    fit_k: tuple[int, ...] | None
    acceptance: str
    basis: str
    mix: Mapping[str, float] | None
    #: How the sweep measured its speculative cells (``SweepResult.measurement_mode``).
    mode: str | None = None

    @property
    def start_spread(self) -> StartSpread | None:
        """The between-server-starts term the intervals hold (the sweep's A/A cells), None if unmeasured."""
        return next((a.start_spread for a in self.advices if a.start_spread is not None), None)

    @property
    def aa_starts(self) -> tuple[str, ...]:
        """The sweep's A/A configurations (``--aa-starts``)."""
        return next((a.aa_starts for a in self.advices if a.aa_starts), ())

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document (``advise_format`` :data:`ADVISE_FORMAT`)."""
        return {"source": self.source, "advise_format": ADVISE_FORMAT, "measurement_mode": self.mode,
                "left_out_cells": list(self.left_out),
                "mix": self.mix, "tolerance": self.tolerance, "candidates": self.candidates,
                "fit_k": None if self.fit_k is None else list(self.fit_k), "acceptance": self.acceptance,
                "basis": self.basis, "families": [{**a.to_dict(), "engine_formats": engine_formats(
                    a.speculative_config, a.k_by_concurrency)} for a in self.advices],
                "drafter_picks": picks_json(self.picks),
                "start_spread": None if self.start_spread is None else self.start_spread.to_json(),
                "start_spread_text": start_spread_line(self.start_spread, self.aa_starts)}


@dataclass(frozen=True)
class LiveAdviceResult:
    """``specwatch advise --exporter/--prometheus``: one :class:`LiveAdvice` per curve at
    ``concurrencies``, with the cost profile (None: the built-in guess) and the method and drafter
    it was looked up for."""

    source: str
    items: tuple[LiveAdvice, ...]
    concurrencies: tuple[int, ...]
    tolerance: float
    profile: CostProfile | None
    profile_path: str | None
    method: str | None
    drafter: str | None

    @property
    def how(self) -> str:
        """Where the speedups' step costs come from, as the tables' titles say it."""
        p = self.profile
        if p is None:
            return "no cost profile: the built-in guess c(k, b) = 1 + k (0.05 + 0.02 b), basis default — calibrate first"
        return (f"cost profile {p.name} ({p.provenance.get('source')}, {p.provenance.get('hardware')}"
                f"{'; forward pass only' if p.forward_only else ''})")

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document."""
        return {"source": self.source, "tolerance": self.tolerance, "cost_profile": self.profile_path,
                "live": [a.to_json() for a in self.items]}


def advice_document(result: SweepAdviceResult | LiveAdviceResult) -> dict[str, Any]:
    """The ``advise --json`` file of either mode: the result's ``to_json()`` (a sweep's families,
    or the ``live`` items) with :data:`ADVICE_FORMAT_KEY` after its ``source`` (the first key, as
    before the format key)."""
    doc = result.to_json()
    return {"source": doc.pop("source"), ADVICE_FORMAT_KEY: ADVISE_FORMAT, **doc}


def render_left_out(lines: Sequence[str], console) -> None:
    """The sweep's cells left out of the advice (failed requests), said before the advice is made."""
    if lines:
        console.print(f"[yellow]left out: {len(lines)} cell(s) with failed requests (resume the sweep to measure "
                      "them again):[/yellow]")
        for line in lines:
            console.print(f"  {line}", markup=False, highlight=False)


def render_result(result: SweepAdviceResult | LiveAdviceResult, console) -> None:
    """Print the advice of either mode on ``console`` (the left-out cells of a sweep are
    :func:`render_left_out`'s, said before)."""
    if isinstance(result, SweepAdviceResult):
        _render_sweep(result, console)
    else:
        _render_live(result, console)


def _render_sweep(r: SweepAdviceResult, console) -> None:
    if r.status != "complete":
        console.print(f"[yellow]note: the sweep's status is {r.status!r}: advice from the cells finished so far[/yellow]")
    if r.mode is not None:
        console.print(MODE_LINES.get(r.mode, r.mode), soft_wrap=True)
    console.print(start_spread_line(r.start_spread, r.aa_starts), soft_wrap=True, markup=False, highlight=False)
    for a in r.advices:
        if a.family in r.labels:
            console.print(f"[bold]drafter[/bold] {r.labels[a.family]}")
        render_advice(a, console)
    if r.picks:
        render_picks(r.picks, console, r.tolerance)


def _render_live(r: LiveAdviceResult, console) -> None:
    profile, how = r.profile, r.how
    for item in r.items:
        kmax = len(item.position_acceptance_rates)
        if item.withheld == "no_cost_curve":
            console.print(f"[bold]{item.name}[/bold]: no k recommended: {profile.source} has no curve for method "
                          f"{r.method or '(its first)'}, drafter {r.drafter or '(any)'} (it has "
                          f"{', '.join(f'{m} {d or chr(8212)}' for m, d in profile.methods()) or 'none'}); a cost "
                          "measured for another drafter is not this one's. Calibrate this drafter (specwatch calibrate).",
                          soft_wrap=True)
            continue
        t = Table(title=f"{item.name} (curve basis={item.curve_basis}): "
                        f"speedup [95 % interval] from {how}"
                        + ("; a lower-bound curve: upper ends take every undrafted position as accepted"
                           if item.curve_basis == "lower_bound" else ""))
        t.add_column("running requests", justify="right")
        for k in range(1, kmax + 1):
            t.add_column(f"k={k}", justify="right")
        t.add_column("recommended k", justify="right")
        t.add_column("basis", justify="left")
        for c in r.concurrencies:
            sp = item.speedup[c]
            cells = []
            for k in range(1, kmax + 1):
                v = sp[k]
                iv = f" [{v.lower:.2f}-{v.upper:.2f}]" if v.lower is not None and v.upper is not None else ""
                cells.append(f"{v.value:.2f}{iv}" + ("" if v.basis == "profile" else f" ({v.basis})"))
            if c in item.k_by_concurrency:
                kk = item.k_by_concurrency[c]
                k_text = ("off" if kk == 0 else str(kk)) + ("" if item.certain_by_concurrency.get(c, True) else " (not certain)")
            else:
                k_text = f"withheld ({item.withheld_by_concurrency.get(c, 'uncertain')})"
            t.add_row(str(c), *cells, k_text, item.basis_by_concurrency[c])
        console.print(t)
        for c in r.concurrencies:
            if c in item.confidence_by_concurrency:
                console.print(f"  b={c}: {item.confidence_by_concurrency[c]}", markup=False, highlight=False)
        unsure = [c for c in r.concurrencies if item.certain_by_concurrency.get(c) is False]
        if item.k_by_concurrency and unsure:
            console.print(f"[yellow]not certain at running requests {', '.join(map(str, unsure))}: the best estimates, "
                          "a configuration to measure (specwatch sweep with a baseline), not yet the answer[/yellow]",
                          soft_wrap=True)
        if item.k_by_concurrency:
            guess = any(item.basis_by_concurrency.get(c) == "default" for c in item.k_by_concurrency)
            render_config(item.speculative_config, dict(item.k_by_concurrency), console, candidate=bool(unsure) or guess)
        else:
            why = ("basis=lower_bound (ragged drafts: drafts shorter than k), so the upper ends count every undrafted "
                   "position as accepted; measure exact curves with specwatch bench against a server started with "
                   "--per-request-spec-decode-metrics detailed" if item.curve_basis == "lower_bound"
                   else "calibrate a cost profile on this server (specwatch calibrate) or run a baseline beside it")
            console.print(f"[bold]{item.name}[/bold]: no k recommended: the best k differs across the intervals; {why}.",
                          soft_wrap=True)
