"""``specwatch report``: a self-contained HTML report of a sweep, with PNG plots (matplotlib, Agg).

Sections: the sweep's settings; the servers (start-up time, KV-cache capacity from
``vllm:cache_config_info``); per-position acceptance (unconditional and conditional) of the largest
k (the curve basis in the legend, lower-bound curves only where nothing better was measured);
expected acceptance length against k (predicted from the largest k's curve, measured points of runs
with full drafts beside it); counter curves beside exact per-request ones
(:mod:`specwatch.choosek.exactcurves`); output throughput / mean TPOT / mean TTFT against concurrency, one line per server
configuration (baseline in black, as in the published n-gram measurement's charts); the comparison table (every
configuration's throughput and its ratio to the baseline, acceptance rate and length); the advice
of :mod:`specwatch.choosek.advise` (recommended k, the check against the measurements, the vLLM config).

Every image is embedded as a ``data:image/png;base64`` URI, so the single HTML file can be mailed
or archived; nothing is fetched when it is opened.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from specwatch.choosek import exactcurves
from specwatch.choosek.advise import (MODE_LINES, VERDICT_TEXT, advise_sweep, pick_label, recommendation_note, speedup_text,
                                      start_spread_line)
from specwatch.choosek.charts import (
    config_order,
    escape,
    fmt_num,
    html_figure,
    html_table,
    plot_expected_length,
    plot_metric_vs_concurrency,
    plot_position_acceptance,
    plot_servers,
    render_page,
)
from specwatch.choosek.drafterstudy import report_sections
from specwatch.choosek.model import (UNPAIRED_NOTE, DEFAULT_TOLERANCE, Advice, KChoiceError, Measurement, candidate_name,
                                     paired_logs, unpaired_line)
from specwatch.specdecode.decision import Candidate, StartSpread, format_interval, format_ratio, ratio_from_logs
from specwatch.choosek.records import SweepResult
from specwatch.choosek.resultfile import measurements, start_spread


def comparison_rows(ms: Sequence[Measurement], spread: StartSpread | None = None) -> tuple[list[str], list[list[str]]]:
    """The comparison table: one row per (workload, concurrency, configuration) — a dynamic table
    is a row of its own — with throughput, the paired ratio to the baseline with its 95 %
    interval (log scale; with ``spread``, the sweep's between-starts term added as the advice adds
    it, :meth:`specwatch.specdecode.decision.Candidate.with_start_spread`), TPOT, TTFT,
    acceptance rate and mean acceptance length."""
    base = {(m.workload, m.concurrency): m for m in ms if m.k == 0}
    head = ["workload", "concurrency", "configuration", "k", "output tok/s",
            "vs baseline (paired 95 %" + (", with the between-starts term)" if spread is not None else ")"),
            "mean TPOT ms", "mean TTFT ms", "acceptance", "acc. length"]
    rows = []
    for m in sorted(ms, key=lambda m: (m.workload, m.concurrency, m.k, m.variable_width, m.config)):
        b = base.get((m.workload, m.concurrency))
        ratio = "–"
        if b is not None and m.k > 0:
            logs, _ = paired_logs(m, b)
            if logs:
                r = Candidate.from_ratio(m.config, m.k, ratio_from_logs(logs), log_ratios=logs).with_start_spread(spread)
                ratio = f"{format_ratio(r.value)}× {format_interval(r.lower, r.upper)}"
            else:
                ratio = f"{format_ratio(m.output_throughput / b.output_throughput)}× (not paired)"
        rows.append([m.workload, m.concurrency, f"{m.config} ({candidate_name(m)})" if m.k else m.config, m.k,
                     fmt_num(m.output_throughput), ratio, fmt_num(m.mean_tpot_ms), fmt_num(m.mean_ttft_ms),
                     fmt_num(None if m.acceptance_rate is None else m.acceptance_rate * 100, ".1f", " %"),
                     fmt_num(m.acceptance_length, ".2f")])
    return head, rows


def config_html(a: Advice) -> str:
    """What to run, as the report says it (:func:`specwatch.choosek.advise.render_sweep_config`'s
    cases): one configuration everywhere, off everywhere, or per concurrency with a composed
    table as a candidate to measure (its sweep command), never as the answer."""
    if a.answer is None:
        return ""
    picks = ", ".join(f"c={c}: {escape(n)}" for c, n in sorted(a.config_by_concurrency.items()))
    if a.answer == "off":
        return (f"<p>Pick by concurrency (all workloads): {picks}.</p><p><b>vLLM:</b> speculation is not the pick at any "
                "measured concurrency: run without <code>--speculative-config</code>.</p>")
    if a.answer == "one":
        return (f"<p>Pick by concurrency (all workloads): {picks}.</p><p><b>vLLM flag</b> (the pick at every measured "
                "concurrency):</p><pre>--speculative-config '"
                + escape(json.dumps(a.speculative_config, separators=(",", ":"))) + "'</pre>")
    out = [f"<p>Pick by concurrency (all workloads): {picks}: no single configuration is the pick at every measured "
           "concurrency.</p><ul>"]
    for c, n in sorted(a.config_by_concurrency.items()):
        cfg = a.config_of.get(n)
        out.append(f"<li>c={c}: {escape(n)}: " + ("run without <code>--speculative-config</code>" if cfg is None else
                                                  "<code>--speculative-config '" + escape(json.dumps(cfg, separators=(",", ":")))
                                                  + "'</code>") + "</li>")
    out.append("</ul>")
    if a.candidate_config is not None:
        out.append("<p>A table composed from these picks is a <b>candidate to measure</b>, not an answer:</p><pre>"
                   + escape(a.measure_command or json.dumps(a.candidate_config, separators=(",", ":"))) + "</pre>")
    return "".join(out)


def render_report(rec: SweepResult, *, tolerance: float = DEFAULT_TOLERANCE, candidates: str = "measured",
                  title: str = "specwatch sweep report", basis: str = "measured",
                  measured: Sequence[Measurement] | None = None, source: str | None = None) -> str:
    """The HTML text of the report for a sweep result (its record; see the
    module docstring). ``measured``: its :func:`specwatch.choosek.resultfile.measurements` when the
    caller has them already (the document is read into measurements once); ``source``: the
    file's path (names where the A/A starts were measured). The sweep's A/A starts
    (``--aa-starts``) are left out of every table and give the advice's between-starts term."""
    full = rec
    rec = rec.without_aa()  # the A/A starts give the intervals' between-starts term, never a candidate
    ms = list(measurements(rec) if measured is None else measured)
    servers = rec.servers_by_config()
    order = config_order(ms) or [(c.name, c.k) for c in rec.configs]
    settings = rec.settings.items() if rec.settings is not None else []
    server_kind = rec.server.kind if rec.server is not None and rec.server.kind is not None else "?"
    parts = []
    parts.append(
        f"<p>Status <b>{escape(rec.status)}</b>; created {escape(rec.created_at)}, updated {escape(rec.updated_at)}; "
        f"server: {escape(server_kind)}. {len(ms)} measured cells.</p>"
    )
    if rec.measurement_mode is not None:  # paired (side by side) or sequential (issue #37)
        parts.append(f"<p class='note'>{escape(MODE_LINES.get(rec.measurement_mode, rec.measurement_mode))}.</p>")
    left_out = rec.failed_cells()
    if left_out:
        parts.append(f"<p class='note'>Left out: {len(left_out)} cell(s) with failed requests (resume the sweep to "
                     "measure them again): " + "; ".join(escape(x) for x in left_out) + ".</p>")
    parts.append(html_table(["setting", "value"], [[k, json.dumps(v) if isinstance(v, (list, dict)) else v]
                                                  for k, v in settings], "settings"))

    parts.append("<h2>Servers</h2>")
    srows = []
    for name, k in order:
        s = servers.get(name)
        kv = (None, None, None) if s is None else (s.kv_cache_tokens, s.num_gpu_blocks, s.block_size)
        srows.append([name, k, fmt_num(None if s is None else s.startup_seconds), *("–" if v is None else v for v in kv)])
    parts.append(html_table(["configuration", "k", "start-up s", "KV capacity tokens", "num_gpu_blocks", "block_size"], srows))
    parts.append(html_figure(plot_servers(servers, order), "Start-up time and KV-cache capacity per configuration"))

    if not ms:
        parts.append("<p class='note'>No finished cell yet.</p>")
        return render_page(title, parts)

    parts.append("<h2>Throughput, TPOT and TTFT against concurrency</h2>")
    parts.append("<p class='note'>One line per server configuration; the baseline (no speculation) is black.</p>")
    parts.append(html_figure(plot_metric_vs_concurrency(ms, "output_throughput", "output tokens/s", "Output throughput"),
                             "Output throughput vs concurrency"))
    parts.append(html_figure(plot_metric_vs_concurrency(ms, "mean_tpot_ms", "ms", "Mean TPOT (time per output token)"),
                             "Mean TPOT vs concurrency"))
    parts.append(html_figure(plot_metric_vs_concurrency(ms, "mean_ttft_ms", "ms", "Mean TTFT (time to first token)"),
                             "Mean TTFT vs concurrency"))

    parts.append("<h2>Acceptance</h2>")
    parts.append(html_figure(plot_position_acceptance(ms), "Per-position acceptance rate of the largest k"))
    parts.append(html_figure(plot_expected_length(ms), "Expected acceptance length against k"))
    parts.append(exactcurves.render_html(rec))

    parts.append("<h2>Comparison</h2>")
    head, rows = comparison_rows(ms, start_spread(full, source))
    parts.append(html_table(head, rows, "comparison"))

    parts.append("<h2>Advice</h2>")
    try:
        advices: list[Advice] = advise_sweep(full, tolerance=tolerance, candidates=candidates, basis=basis, measured=ms,
                                             source=source)
    except KChoiceError as exc:
        advices = []
        parts.append(f"<p class='note'>No advice: {escape(exc)}</p>")
    for a in advices:
        if a.family:
            parts.append(f"<p>Speculative family <code>{escape(a.family)}</code>.</p>")
        for e in (a.acceptance_error, a.acceptance_error_over(100.0)):
            if e.n:
                parts.append(f"<p>Acceptance-length prediction from the largest k's per-position curve: mean |relative error| "
                             f"{e.mean_abs_relative * 100:.1f} %, max {e.max_abs_relative * 100:.1f} % over {e.n} runs"
                             + (f" with at least {e.min_drafts:.0f} drafts" if e.min_drafts else "") + ".</p>")
        parts.append(html_table(["workload", "concurrency", "k", "from k", "predicted E(k)", "measured", "drafts", "rel. error"],
                                [[p.workload, p.concurrency, p.k, p.source_k, fmt_num(p.predicted, ".2f"), fmt_num(p.measured, ".2f"),
                                  fmt_num(p.measured_drafts, ".0f"),
                                  fmt_num(None if p.relative_error is None else p.relative_error * 100, "+.1f", " %")]
                                 for p in a.acceptance]))
        parts.append("<p>The pick per cell: the decision rule (docs/choosing-k.md#the-decision-rule) on paired "
                     "per-batch ratios over the baseline; a dynamic table is a configuration of its own.</p>")
        parts.append(f"<p class='note'>{escape(start_spread_line(a.start_spread, a.aa_starts))}.</p>")
        parts.append(html_table(
            ["workload", "concurrency", "pick", "speedup vs baseline (paired 95 %)", "verdict", "batches", "confidence / note"],
            [["all workloads" if r.workload == "*" else r.workload, r.concurrency,
              "–" if r.config is None else (f"{r.config} (speculation off)" if r.k == 0 else pick_label(r)),
              speedup_text(r), "–" if r.verdict is None else VERDICT_TEXT.get(r.verdict, r.verdict),
              ", ".join(f"{n}: {b}" for n, b in r.batches.items()), recommendation_note(r)]
             for r in a.recommendations]))
        notes = list(dict.fromkeys(n for r in a.recommendations for n in r.notes))
        line = unpaired_line(notes)
        for note in ([line] if line else []) + [n for n in notes if not n.endswith(UNPAIRED_NOTE)]:
            parts.append(f"<p class='note'>{escape(note)}</p>")
        for how in sorted({r.combination for r in a.recommendations if r.workload == "*" and r.combination}):
            parts.append(f"<p>All workloads: speedups combined through {escape(how)}, batch by batch on the log scale "
                         "(total baseline time / total time with the configuration: the harmonic mean of the "
                         "per-workload speedups, weighted by baseline time).</p>")
        if a.accuracy:
            parts.append("<p>Check: measured throughput of the pick against the best measured configuration "
                         f"(worst shortfall {fmt_num(None if a.worst_shortfall is None else a.worst_shortfall * 100, '.1f', ' %')}).</p>")
            parts.append(html_table(["workload", "concurrency", "pick", "best measured", "pick tok/s", "best tok/s", "shortfall"],
                                    [[x.workload, x.concurrency, x.picked, x.best, fmt_num(x.picked_throughput),
                                      fmt_num(x.best_throughput), fmt_num(None if x.shortfall is None else x.shortfall * 100, ".1f", " %")]
                                     for x in a.accuracy]))
        parts.append(config_html(a))
    parts.extend(report_sections(rec, ms, advices, tolerance))
    parts.append("<p class='note'>Generated by specwatch report. Throughputs are means over the measured batches of each cell "
                 "(warm-up excluded); spec-decode values come from the servers' vllm:spec_decode_* counters.</p>")
    return render_page(title, parts)
