"""The HTML report of a ``specwatch demo`` result folder (``report.html``), rendered with the
charts and HTML helpers of :mod:`specwatch.choosek.charts`, which the sweep report uses too, so both look alike.

Inputs, all written by ``specwatch demo`` into its result folder:

- ``demo-summary.json``: settings, servers (start-up time), the whole-run per-position curve
  (counter deltas of ``vllm:spec_decode_num_accepted_tokens_per_pos_total`` /
  ``…_num_drafts_total`` over the speculative run), the baseline-vs-speculative comparison, the
  greedy-output equivalence result and what Prometheus held at the end.
- ``bench-baseline.json`` and ``bench-speculative.json``: the load generator's per-cell summaries
  (client-measured throughput, TTFT, TPOT; server counter deltas per cell).

Sections: the decision table first (:mod:`specwatch.demo.decision`: per workload ×
concurrency the measured ratio with its 95 % interval, pays / loses / cannot tell, and the k to
run, each with its basis; whether the exporter's cost profile fits this machine); settings; output throughput baseline vs
speculative by workload and concurrency; mean
TTFT and TPOT; the per-position curve with E(k) (whole run, and per cell from the sweep report's
plots); the equivalence result; Prometheus' view. Images are embedded PNG data URIs.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specwatch.choosek.charts import (
    config_colors,
    escape,
    fmt_num,
    html_figure,
    html_table,
    plot_expected_length,
    plot_position_acceptance,
    MAX_FIG_WIDTH_IN,
    legend_below,
    png_data_uri,
    pyplot,
    render_page,
)
from specwatch.bench.records import BenchRecordError, BenchResult
from specwatch.demo.decisionrecords import Decision, DecisionProfile
from specwatch.demo.decision import (TABLE_COLUMNS, VERDICT_TEXT, choice_legend, decide,
                                           format_estimate, pairing, profile_fit_lines, render_decision, row_notes,
                                           table_rows)
from specwatch.demo.records import SUMMARY_FILE, DemoServer, DemoSummary, DemoSummaryError, RunCurve, is_demo_summary
from specwatch.choosek.model import KChoiceError, Measurement
from specwatch.choosek.records import impossible_batch_value, impossible_value
from specwatch.common.files import atomic_write_text, read_regular_file
from specwatch.specdecode.costprofile import EMBEDDED_CPU_PROFILE, CostProfileError, load_profile

REPORT_FILE = "report.html"
ROLES = ("baseline", "speculative")


class DemoReportError(ValueError):
    """The folder holds no usable demo result; the message says which file and why."""



#: What the equivalence count means (issue #25): a measurement of this run, not a guarantee.
EQUIVALENCE_NOTE = ("Speculative decoding is lossless in exact arithmetic, but vLLM documents that batched verification "
                    "can change floating-point results (its speculative-decoding docs, &quot;lossless guarantees&quot;): greedy "
                    "outputs with and without speculation may then part at some token and continue differently. The count "
                    "above is what this run measured; another run may differ.")


def differing_token_text(tok) -> str:
    """``' climbed' → ' walked' (token 12)`` for a record's ``first_differing_token``; "" when
    there is none (identical, or an older result file without it). Token texts are shown with
    repr() so leading spaces and newlines are visible; ``(text)`` marks a text-level piece (the
    server had no /tokenize)."""
    if not isinstance(tok, Mapping):
        return ""
    where = f"token {tok['index']}" if tok.get("index") is not None else "text"
    return f"{tok.get('baseline', '')!r} → {tok.get('speculative', '')!r} ({where})"

def same_path(a: Path, b: Path) -> bool:
    """True when ``a`` and ``b`` name the same file (symlinks and hard links followed)."""
    try:
        return a.samefile(b)
    except OSError:
        return False


def is_bench_file_of_both_servers(path: Path) -> bool:
    """True when ``path`` is a readable ``specwatch bench`` result holding both servers' batches
    (a run with ``--baseline-url``, e.g. ``--paired``); False on any error (a sweep result, a
    FIFO, a damaged file: the caller's own reader then says what is wrong)."""
    try:
        rec = BenchResult.load(path)
    except (BenchRecordError, OSError, ValueError, RecursionError):
        return False
    return bench_roles(rec) >= {"baseline", "speculative"}


def is_demo_summary_file(path: Path) -> bool:
    """True when ``path`` is a readable JSON file holding a demo summary (False on any error)."""
    try:
        return is_demo_summary(json.loads(read_regular_file(path, 64 << 20, "demo summary").decode("utf-8")))  # no FIFO, no /dev/zero
    except (OSError, ValueError, RecursionError):
        return False


def load_demo_result(result_dir: Path) -> tuple[DemoSummary, dict[str, BenchResult]]:
    """(``demo-summary.json`` as its record, {role: bench result record}) of a demo result folder.
    A bench file is looked up in the folder by its name (the folder may have moved since). Raises
    :class:`DemoReportError` when the summary is missing, not a demo summary or damaged, or a bench
    file is damaged (the message names the file and the field); a missing or unparsable bench file
    is left out (an interrupted demo)."""
    path = result_dir / SUMMARY_FILE
    try:
        summary = DemoSummary.load(path)
    except DemoSummaryError as exc:
        raise DemoReportError(str(exc)) from None
    benches = {}
    for role in ROLES:
        name = summary.result_file_name(role)
        try:
            data = json.loads((result_dir / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        try:
            benches[role] = BenchResult.from_json(data, str(result_dir / name))
        except BenchRecordError as exc:
            raise DemoReportError(str(exc)) from None
    return summary, benches


def demo_measurements(summary: DemoSummary, benches: Mapping[str, BenchResult | None]) -> list[Measurement]:
    """One :class:`Measurement` per (role, workload, concurrency) cell with a throughput: config
    ``baseline`` (k = 0) or ``speculative`` (k = the demo's k). ``benches``: role → bench result
    record (None: no file)."""
    run_k = summary.k or 0
    out = []
    for role, rec in benches.items():
        k = 0 if role == "baseline" else run_k
        for cell in () if rec is None else rec.cells:
            try:
                out.append(Measurement.from_cell(cell, config=role, k=k))
            except KChoiceError:
                continue  # a cell without a successful request: nothing to plot
    return out


def plot_cells(ms: Sequence[Measurement], attr: str, ylabel: str, title: str) -> str | None:
    """Grouped bars: one group per (workload, concurrency), one bar per configuration (baseline
    black, as in the sweep report), height = ``attr`` of the measurement; the ratio to the
    baseline is written above each speculative bar. None when no measurement has the value."""
    plt = pyplot()
    cells = sorted({(m.workload, m.concurrency) for m in ms})
    configs = sorted({(m.config, m.k) for m in ms}, key=lambda c: (c[1], c[0]))
    if not cells or not any(getattr(m, attr) is not None for m in ms):
        return None
    colors = config_colors(configs)
    by = {(m.workload, m.concurrency, m.config): getattr(m, attr) for m in ms}
    # Rows of at most `per_row` cells so the figure stays within MAX_FIG_WIDTH_IN (shown unscaled
    # on the 1200 px page: one row of 12 cells was 38 in wide, its labels unreadable).
    cell_w = 0.7 * len(configs) + 0.4
    per_row = max(1, min(len(cells), int((MAX_FIG_WIDTH_IN - 0.8) // cell_w)))
    rows = [cells[i:i + per_row] for i in range(0, len(cells), per_row)]
    top = max((v for v in by.values() if v is not None), default=1.0) * 1.15  # room for the ratio labels
    fig, axes = plt.subplots(len(rows), 1, figsize=(max(5.5, min(MAX_FIG_WIDTH_IN, cell_w * per_row + 0.8)), 3.2 * len(rows)),
                             squeeze=False)
    width = 0.8 / len(configs)
    for ax, row_cells in zip((a for r in axes for a in r), rows, strict=True):
        for j, (name, k) in enumerate(configs):
            xs, ys, cl = [], [], []
            for i, (wl, c) in enumerate(row_cells):
                v = by.get((wl, c, name))
                if v is not None:
                    xs.append(i - 0.4 + width * (j + 0.5))
                    ys.append(v)
                    cl.append((wl, c))
            bars = ax.bar(xs, ys, width=width, color=colors[name], label=name + (f" (k={k})" if k else ""))
            if k:
                for bar, (wl, c) in zip(bars, cl, strict=True):
                    base = by.get((wl, c, "baseline"))
                    if base:
                        ax.annotate(f"{bar.get_height() / base:.2f}×", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                    ha="center", va="bottom", fontsize=9)
        ax.set_xticks(range(len(row_cells)))
        ax.set_xticklabels([f"{wl}\nc={c}" for wl, c in row_cells], fontsize=9)
        ax.set_xlim(-0.6, per_row - 0.4)
        ax.set_ylim(0, top)
        ax.set_ylabel(ylabel)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    legend_below(fig, [axes[0][0]], fontsize=9)
    return png_data_uri(fig)


def plot_run_curve(curve: RunCurve | None, k: int) -> str | None:
    """The speculative run's whole-run curve: per-position acceptance r_i and conditional
    acceptance (left), expected acceptance length E(k') = 1 + Σ_(i<k') r_i for every k' ≤ k with
    the ceiling k' + 1 and the measured mean acceptance length at k (right)."""
    rates = [] if curve is None else list(curve.per_position_acceptance_rate)
    if not rates:
        return None
    plt = pyplot()
    cond = [float("nan") if c is None else c for c in curve.conditional_acceptance_rate]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    pos = list(range(len(rates)))
    axes[0].plot(pos, [r * 100 for r in rates], marker="o", label="r_i = P(positions 0..i accepted)")
    if cond:
        axes[0].plot(pos[:len(cond)], [c * 100 for c in cond], marker="s", linestyle="--",
                     label="conditional P(i | 0..i-1 accepted)")
    axes[0].set_ylim(0, 105)
    axes[0].set_xticks(pos)
    axes[0].set_xlabel("draft position i (0-based)")
    axes[0].set_ylabel("acceptance %")
    axes[0].set_title("per-position acceptance (whole speculative run)", fontsize=10)
    axes[0].grid(True, alpha=0.3)
    ks = list(range(0, len(rates) + 1))
    e = [1.0 + math.fsum(rates[:kk]) for kk in ks]
    axes[1].plot(ks, e, marker="o", label="E(k) from the curve")
    axes[1].plot(ks, [kk + 1 for kk in ks], color="grey", linestyle=":", label="every draft accepted (k + 1)")
    mal = curve.mean_acceptance_length
    if mal is not None:
        axes[1].scatter([k], [mal], marker="x", s=60, color="black", zorder=3, label=f"measured at k={k}")
    axes[1].set_xticks(ks)
    axes[1].set_xlabel("num_speculative_tokens k")
    axes[1].set_ylabel("tokens per verify step")
    axes[1].set_title("expected acceptance length E(k)", fontsize=10)
    axes[1].grid(True, alpha=0.3)
    fig.tight_layout()
    legend_below(fig, [axes[0], axes[1]])  # below the plots, never over a curve
    return png_data_uri(fig)


def render_demo_report(summary: DemoSummary, benches: Mapping[str, BenchResult | None],
                       title: str = "specwatch demo report") -> str:
    """The HTML text of ``report.html`` for a demo result (see the module docstring)."""
    ms = demo_measurements(summary, benches)
    k = summary.k or 0
    parts: list[str] = decision_section(demo_decision(summary, benches))
    parts.append(f"<p>Started {escape(summary.started_at)}; status <b>{escape(summary.run_status)}</b>. Baseline (no speculation) "
                 f"and speculative ({escape(summary.method or 'ngram')}, k={k}) real vLLM servers, one after the other "
                 "on the same machine, "
                 f"with the same seeded workloads.</p>")
    settings = [["workloads", ", ".join(summary.workloads)],
                ["concurrencies", ", ".join(str(c) for c in summary.concurrencies)],
                ["num_speculative_tokens k", k], ["output tokens per request", summary.output_len],
                ["measured batches per cell (after 1 warm-up)", summary.num_batches]]
    for role in ROLES:
        s = summary.servers.get(role) or DemoServer()
        settings.append([f"{role} server start-up s", fmt_num(s.startup_seconds)])
        if s.speculative_config:
            settings.append([f"{role} --speculative-config", json.dumps(s.speculative_config, separators=(",", ":"))])
    parts.append(html_table(["setting", "value"], settings, "settings"))

    parts.append("<h2>Baseline vs speculative</h2>")
    parts.append("<p class='note'>Output throughput (output tokens/s, client-measured, mean over the measured batches of "
                 "each cell); the number above a speculative bar is its ratio to the baseline.</p>")
    parts.append(html_figure(plot_cells(ms, "output_throughput", "output tokens/s", "Output throughput"),
                             "Output throughput, baseline vs speculative, by workload and concurrency"))
    rows = []
    for r in summary.comparison or ():
        rows.append([r.workload, r.max_concurrency, fmt_num(r.baseline_output_throughput),
                     fmt_num(r.speculative_output_throughput), fmt_num(r.ratio, ".2f", "×"),
                     fmt_num(_pct(r.acceptance_rate), ".1f", " %"), fmt_num(r.acceptance_length, ".2f")])
    parts.append(html_table(["workload", "concurrency", "baseline tok/s", "speculative tok/s", "ratio",
                             "draft acceptance rate", "mean acceptance length"], rows, "comparison"))

    parts.append("<h2>TTFT and TPOT</h2>")
    parts.append(html_figure(plot_cells(ms, "mean_ttft_ms", "ms", "Mean TTFT (time to first token)"), "Mean TTFT by cell"))
    parts.append(html_figure(plot_cells(ms, "mean_tpot_ms", "ms", "Mean TPOT (time per output token)"), "Mean TPOT by cell"))

    parts.append("<h2>Per-position acceptance and E(k)</h2>")
    curve = summary.per_position or RunCurve()
    if summary.per_position is not None:
        parts.append(f"<p>Whole speculative run (counter deltas of the server's vllm:spec_decode_* counters): draft "
                     f"acceptance rate {fmt_num(_pct(curve.draft_acceptance_rate), '.1f', ' %')}, mean acceptance "
                     f"length {fmt_num(curve.mean_acceptance_length, '.2f')} tokens per verify step (ceiling k+1 = {k + 1}), "
                     f"draft tokens per draft {fmt_num(curve.draft_tokens_per_draft, '.2f')}.</p>")
    parts.append(html_figure(plot_run_curve(curve, k), "Per-position acceptance and expected acceptance length E(k), whole run"))
    conds = curve.conditional_acceptance_rate
    parts.append(html_table(["position i / k", "acceptance r_i", "conditional", "E(k)"],
                            [[f"{i} / k={i + 1}", fmt_num(_pct(r), ".1f", " %"),
                              fmt_num(_pct(conds[i] if i < len(conds) else None), ".1f", " %"),
                              fmt_num(curve.expected_acceptance_length_by_k.get(str(i + 1)), ".2f")]
                             for i, r in enumerate(curve.per_position_acceptance_rate)]))
    if (curve.draft_tokens_per_draft or k) < k - 0.005:
        parts.append("<p class='note'>Ragged drafts: ngram proposed fewer than k tokens in some drafts, so r_i at later "
                     "positions counts drafts that never proposed that position as rejections (a lower bound).</p>")
    parts.append("<p class='note'>Per cell (the sweep report's plots; cells whose counters saw no draft are left out):</p>")
    parts.append(html_figure(plot_position_acceptance(ms), "Per-position acceptance rate per cell"))
    parts.append(html_figure(plot_expected_length(ms), "Expected acceptance length against k per cell"))

    parts.append("<h2>Greedy-output equivalence</h2>")
    eq = summary.equivalence
    if eq is not None and eq.ran:
        ok = eq.matched == eq.total
        parts.append(f"<p><b>{escape(eq.matched)}/{escape(eq.total)}</b> prompts produced identical greedy output "
                     "with and without speculation in this run"
                     f"{'' if ok else '; the others differ from the first differing token shown below'}.</p>")
        parts.append(f"<p class='note'>{EQUIVALENCE_NOTE}</p>")
        parts.append(html_table(["prompt", "identical", "first difference at (character)", "first differing token: baseline → speculative",
                                 "baseline chars", "speculative chars", "error"],
                                [[p.name, "yes" if p.identical else "NO",
                                  "" if p.first_difference is None else p.first_difference,
                                  differing_token_text(p.first_differing_token),
                                  p.baseline_chars, p.speculative_chars, p.error or ""]
                                 for p in eq.prompts]))
    else:
        parts.append("<p class='note'>Not run (the demo was interrupted before it).</p>")

    prom = summary.prometheus or {}
    if prom:
        parts.append("<h2>What Prometheus held at the end of the speculative run</h2>")
        parts.append(html_table(["series", "value"], [[q, ", ".join(f"{v:.3f}" for v in vals) or "(no data)"]
                                                      for q, vals in prom.items()]))
    parts.append("<p class='note'>Generated by specwatch demo (re-render: <code>specwatch report DIR/demo-summary.json"
                 "</code>). Throughput, TTFT and TPOT are measured by the load generator; acceptance values come from the "
                 "speculative server's vllm:spec_decode_* counters; E(k) for k below the run's k is computed from the "
                 "per-position curve (exact for chain drafters).</p>")
    return render_page(title, parts)


def _exporter_profile(summary: DemoSummary | None) -> tuple[Path, Any]:
    """(file, loaded profile or None) of the exporter cost profile named in ``summary`` (the
    embedded CPU profile when it names none; the shipped profile of the same name when the
    folder comes from another checkout)."""
    ref = summary.exporter_cost_profile if summary is not None else None
    prof_file = Path((ref.file if ref else None) or EMBEDDED_CPU_PROFILE)
    try:
        return prof_file, load_profile(prof_file)
    except CostProfileError:
        try:
            return prof_file, load_profile(EMBEDDED_CPU_PROFILE.parent / prof_file.name)
        except CostProfileError:
            return prof_file, None


def decide_demo(summary: DemoSummary | None, benches: Mapping[str, BenchResult | None], k: int, *,
                unpaired: bool = False) -> Decision:
    """The decision table of a demo's two bench results (``benches``: role → record)
    at the run's ``k``, by :func:`specwatch.demo.decision.decide`, with the plain-step check
    against the exporter profile named in ``summary`` (``profile`` names its file and name; None
    when it could not be loaded). What the demo stores and ``specwatch advise`` on its folder
    prints. ``unpaired``: as for :func:`~specwatch.demo.decision.decide`."""
    prof_file, prof = _exporter_profile(summary)
    d = decide(benches.get("baseline"), benches.get("speculative"), k,
               plain_step=None if prof is None else (lambda b: prof.plain_step(b).seconds), unpaired=unpaired)
    return dataclasses.replace(d, profile=DecisionProfile(file=str(prof_file), name=None if prof is None else prof.name))


def demo_decision(summary: DemoSummary, benches: Mapping[str, BenchResult | None]) -> Decision | None:
    """The run's decision table (:class:`specwatch.demo.decisionrecords.Decision`): the
    summary's ``decision`` as the demo wrote it (of any readable format), else (a result folder
    written before the demo decided) :func:`decide_demo` of the bench files. None when the run's
    k is unknown."""
    if summary.decision is not None:
        return summary.decision
    k = summary.k
    if k is None or k < 1:
        return None
    return decide_demo(summary, benches, k)


def decision_section(decision: Decision | None) -> list[str]:
    """The report's first section: the decision table (the cells of
    :func:`specwatch.demo.decision.table_rows`, as on the console), how each basis was
    obtained, the per-cell notes, the what-if values per k′ and whether the exporter's cost
    profile fits this machine. ``decision``: None when there is no
    decision."""
    parts = ["<h2 id='decision'>The decision: does speculation pay here, and which k to run</h2>"]
    if decision is None or not decision.rows:
        parts.append("<p class='note'>No decision: no cell was measured on both servers (an interrupted demo).</p>")
        return parts
    parts.append("<style>table.decision td:first-child{white-space:nowrap}</style>")
    if decision.decision_format >= 2:
        parts.append(f"<p>Per workload and concurrency, both servers measured on this machine: the client's paired "
                     f"throughput ratio with its 95 % interval, the run's k (k={escape(decision.k)}) from the server "
                     f"step costs, and the k to run by the one decision rule (docs/choosing-k.md): always a k or "
                     f"off, with its verdict against the baseline (pays: lower end above 1; loses: upper end below "
                     f"1) and how sure it is against the runner-up.</p>")
    else:
        parts.append(f"<p>Per workload and concurrency, both servers measured on this machine: the client's throughput "
                     f"ratio with its 95 % interval and the verdict on it (pays: lower end above 1; loses: upper end "
                     f"below 1), the run's k (k={escape(decision.k)}) from the server step costs, and the k to "
                     f"run: always a k or off, the best at the values, marked uncertain where the intervals' ends "
                     f"would choose differently.</p>")
    parts.append(html_table(list(TABLE_COLUMNS), table_rows(decision), "decision"))
    parts.append("<ul class='note'>" + f"<li>{escape(choice_legend(decision))}</li>"
                 + "".join(f"<li><b>{escape(b)}</b>: {escape(t)}</li>" for b, t in (decision.how or {}).items())
                 + "</ul>")
    notes = row_notes(decision)
    if notes:
        parts.append("<ul class='note'>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>")
    fit = profile_fit_lines(decision.profile_fit, decision.profile_name)
    if fit:
        parts.append("<p>" + "<br>".join(escape(x) for x in fit) + "</p>")
    rows = []
    for r in decision.rows:
        for w in r.what_if:
            rows.append([r.workload, r.concurrency, w.k, format_estimate(w, with_basis=False), w.basis,
                         VERDICT_TEXT.get(w.verdict, w.verdict), fmt_num(w.x, ".2f"), fmt_num(w.c, ".3f")])
    if rows:
        parts.append("<p class='note'>Every k′ the choice compared (k = 0, off, is exactly 1):</p>")
        parts.append(html_table(["workload", "concurrency", "k′", "speedup [95 %]", "basis", "verdict",
                                 "drafted tokens per request-step x", "relative step cost c"], rows, "what-if"))
    return parts


# -- `specwatch advise` on a demo result folder, or on two bench files ---------------------------------

#: The bench files of a demo result folder, by role.
BENCH_FILES = {"baseline": "bench-baseline.json", "speculative": "bench-speculative.json"}
#: The format key of ``specwatch advise --json`` on a demo folder or two bench files.
ADVICE_FORMAT_KEY = "specwatch_demo_advice_format"
ADVICE_FORMAT = 1


class DemoInputError(DemoReportError):
    """Bad input for ``specwatch advise`` on a demo folder or two bench files (a missing or
    unreadable file, batches that are not paired): one line naming the file or the cells; exit 2."""

    exit_code = 2


@dataclasses.dataclass(frozen=True)
class DemoAdvice:
    """What ``specwatch advise`` decided from two bench files: the ``decision`` (format 2, the
    demo's table), the files it read, the cells measured on one server only (``left_out``, as
    ``workload c=N``) and the cells whose batches were not paired (``not_paired``: cell → why;
    compared unpaired only when ``unpaired``)."""

    decision: Decision
    baseline: str
    speculative: str
    left_out: tuple[str, ...] = ()
    not_paired: Mapping[str, str] = dataclasses.field(default_factory=dict)
    unpaired: bool = False

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document: :data:`ADVICE_FORMAT_KEY`, the files, ``decision`` (its
        record's JSON, as ``demo-summary.json`` holds it), ``left_out``, ``not_paired`` and
        ``unpaired``."""
        return {ADVICE_FORMAT_KEY: ADVICE_FORMAT, "baseline": self.baseline, "speculative": self.speculative,
                "unpaired": self.unpaired, "left_out": list(self.left_out), "not_paired": dict(self.not_paired),
                "decision": self.decision.to_json()}


def load_bench_file(path: Path, role: str) -> BenchResult:
    """The bench result ``path`` (``role``: baseline or speculative, for the message). Raises
    :class:`DemoInputError` (one line naming the file) when it is missing, not JSON, of a format
    this version cannot read, damaged, or holds no cell."""
    if not path.is_file():
        raise DemoInputError(f"{path}: no {role} bench file there (a demo result folder holds "
                             f"{BENCH_FILES['baseline']} and {BENCH_FILES['speculative']})")
    try:
        rec = BenchResult.load(path)
    except BenchRecordError as exc:
        raise DemoInputError(str(exc)) from None
    if not rec.cells:
        raise DemoInputError(f"{path} is not a specwatch bench result with measured cells (no 'summary' cells)")
    for i, c in enumerate(rec.cells):
        bad = impossible_value(c)
        if bad:
            raise DemoInputError(f"{path} is a damaged bench result: summary[{i}].{bad}")
    for i, b in enumerate(rec.batches or ()):
        bad = impossible_batch_value(b)
        if bad:
            raise DemoInputError(f"{path} is a damaged bench result: batches[{i}].{bad}")
    return role_view(rec, role, path)


def bench_roles(rec: BenchResult) -> set[str]:
    """The roles (baseline, speculative) whose batches a bench result holds: both for a run with
    ``--baseline-url`` (``specwatch bench --paired`` or one after the other), one otherwise."""
    return {b.role for b in rec.batches or () if b.role} | {c.role for c in rec.cells if c.role}


def role_view(rec: BenchResult, role: str, path: Path | str) -> BenchResult:
    """``rec`` reduced to ``role``'s batches and cells when it holds both servers' (one
    ``specwatch bench --baseline-url`` file given as both ``--baseline`` and ``--speculative``);
    ``rec`` itself when it holds one role. Raises :class:`DemoInputError` when it holds both and
    none of ``role``'s."""
    roles = bench_roles(rec)
    if len(roles) < 2:
        return rec
    if role not in roles:
        raise DemoInputError(f"{path}: no {role} batches in this file (it holds {', '.join(sorted(roles))})")
    return dataclasses.replace(rec, batches=tuple(b for b in rec.batches or () if b.role == role),
                               cells=tuple(c for c in rec.cells if c.role == role), comparison=())


def _check_baseline_role(path: Path, rec: BenchResult) -> None:
    """Raise :class:`DemoInputError` when the file given as the baseline's measured a speculative
    server: its batches are recorded as the speculative role's, or its cells show a k ≥ 1
    (``spec_decode_num_speculative_tokens``). A ratio to it is not a ratio to no speculation."""
    roles = bench_roles(rec)
    k = run_k(rec)
    if roles == {"speculative"} or k is not None:
        why = f"its cells show k = {k}" if k is not None else "its batches are the speculative role's"
        raise DemoInputError(f"{path} measured a speculative server ({why}): the baseline file must come from a "
                             "server without speculation")


def run_k(speculative: BenchResult, summary: DemoSummary | None = None) -> int | None:
    """The speculative server's k: the demo summary's, else the largest
    ``spec_decode_num_speculative_tokens`` of the bench file's cells (None when neither says)."""
    if summary is not None and summary.k is not None and summary.k >= 1:
        return summary.k
    ks = [int(c.num_speculative_tokens) for c in speculative.cells
          if c.num_speculative_tokens is not None and c.num_speculative_tokens >= 1]
    return max(ks) if ks else None


def advise_demo(*, folder: Path | None = None, baseline: Path | None = None, speculative: Path | None = None,
                unpaired: bool = False) -> DemoAdvice:
    """The decision of a demo result ``folder`` (its ``bench-baseline.json`` and
    ``bench-speculative.json``; its ``demo-summary.json``, when there, gives the run's k and the
    exporter profile) or of two bench files, by the code the demo ran (:func:`decide_demo`), so
    it prints the demo's table. Raises :class:`DemoInputError` (one line, exit 2) for a missing or
    unreadable file, a k it cannot tell, or cells whose batches are not paired (unless
    ``unpaired``: then they are compared unpaired, labelled so)."""
    summary = None
    if folder is not None:
        if not folder.is_dir():
            raise DemoInputError(f"{folder}: not a folder")
        if (folder / SUMMARY_FILE).is_file():
            try:
                summary = DemoSummary.load(folder / SUMMARY_FILE)
            except DemoSummaryError as exc:
                raise DemoInputError(str(exc)) from None
        baseline = folder / (summary.result_file_name("baseline") if summary else BENCH_FILES["baseline"])
        speculative = folder / (summary.result_file_name("speculative") if summary else BENCH_FILES["speculative"])
    if baseline is None or speculative is None:
        raise DemoInputError("give a demo result folder, or both --baseline FILE and --speculative FILE")
    brec, srec = load_bench_file(baseline, "baseline"), load_bench_file(speculative, "speculative")
    if same_path(baseline, speculative) and not (bench_roles(brec) == {"baseline"} and bench_roles(srec) == {"speculative"}):
        raise DemoInputError(f"{baseline} is given as both files but does not hold both servers' batches "
                             "(a specwatch bench run with --baseline-url does); a file compared with itself says nothing")
    if not same_path(baseline, speculative):
        _check_baseline_role(baseline, brec)
    k = run_k(srec, summary)
    if k is None:
        raise DemoInputError(f"{speculative}: no cell says the speculative server's k "
                             "(spec_decode_num_speculative_tokens): is it the speculative server's bench file?")
    bkeys, skeys = brec.cells_by_key(), srec.cells_by_key()
    left_out = (tuple(f"{wl} c={c} (baseline only)" for wl, c in bkeys if (wl, c) not in skeys)
                + tuple(f"{wl} c={c} (speculative only)" for wl, c in skeys if (wl, c) not in bkeys))
    if not any(key in bkeys for key in skeys):
        raise DemoInputError(f"{baseline}: its baseline and speculative batches have no workload and concurrency in common"
                             if same_path(baseline, speculative) else
                             f"{baseline} and {speculative} have no workload and concurrency in common")
    not_paired = {f"{wl} c={c}": why for (wl, c), why in pairing(brec, srec).items()}
    if not_paired and not unpaired:
        raise DemoInputError("not paired (batch i of both files must serve the same seeded prompts): "
                             + "; ".join(f"{cell}: {why}" for cell, why in not_paired.items())
                             + ". Compare them unpaired with --unpaired (labelled so)")
    d = decide_demo(summary, {"baseline": brec, "speculative": srec}, k, unpaired=unpaired)
    return DemoAdvice(decision=d, baseline=str(baseline), speculative=str(speculative), left_out=left_out,
                      not_paired=not_paired, unpaired=unpaired)


def render_advice(advice: DemoAdvice, con: Any) -> None:
    """Print ``advice`` to the rich console ``con``: what it read, the cells left out (measured on
    one server only) and the cells compared unpaired, each in one line, then the decision table
    exactly as the demo printed it (:func:`specwatch.demo.decision.render_decision`)."""
    con.print(f"decided from {advice.baseline} and {advice.speculative} (the demo's rule and table)", soft_wrap=True)
    if advice.left_out:
        con.print(f"left out (measured on one server only): {', '.join(advice.left_out)}", soft_wrap=True)
    if advice.not_paired:
        con.print("compared UNPAIRED, as asked (--unpaired): " + "; ".join(f"{c}: {why}" for c, why in advice.not_paired.items()),
                  soft_wrap=True)
    render_decision(advice.decision, con)


def _pct(v: float | None) -> float | None:
    return None if v is None else v * 100


def write_demo_report(result_dir: Path, output: Path | None = None) -> Path:
    """Render the demo result in ``result_dir`` to ``output`` (default ``result_dir/report.html``);
    returns the path. Raises :class:`DemoReportError` (also for a damaged summary or bench file)
    or OSError."""
    summary, benches = load_demo_result(result_dir)
    out = output or result_dir / REPORT_FILE
    try:
        text = render_demo_report(summary, benches)
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
        raise DemoReportError(f"{result_dir / SUMMARY_FILE}: damaged demo result ({type(exc).__name__}: {exc})") from None
    atomic_write_text(out, text)
    return out
