"""``specwatch report``: a self-contained HTML report of a sweep, with PNG plots (matplotlib, Agg).

Sections: the sweep's settings; the servers (start-up time, KV-cache capacity from
``vllm:cache_config_info``); per-position acceptance (unconditional and conditional) of the largest
k; expected acceptance length against k (predicted from the largest k's curve, measured points
beside it); output throughput / mean TPOT / mean TTFT against concurrency, one line per server
configuration (baseline in black, as in the seed's charts); the comparison table (every
configuration's throughput and its ratio to the baseline, acceptance rate and length); the advice
of :mod:`specwatch.choosek.advise` (recommended k, the check against the measurements, the vLLM config).

Every image is embedded as a ``data:image/png;base64`` URI, so the single HTML file can be mailed
or archived; nothing is fetched when it is opened.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import markupsafe

from specwatch.choosek import exactcurves
from specwatch.choosek.advise import advise_sweep
from specwatch.choosek.model import DEFAULT_TOLERANCE, Advice, KChoiceError, Measurement
from specwatch.choosek.resultfile import failed_cells, measurements, servers_by_config

BASELINE_COLOR = "black"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_data_uri(fig) -> str:
    """Render a matplotlib figure to PNG and return it as a ``data:image/png;base64,…`` URI
    (the figure is closed)."""
    plt = _plt()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _config_order(ms: Sequence[Measurement]) -> list[tuple[str, int]]:
    seen: dict[str, int] = {}
    for m in ms:
        seen.setdefault(m.config, m.k)
    return sorted(seen.items(), key=lambda kv: (kv[1], kv[0]))


def _colors(configs: Sequence[tuple[str, int]]) -> dict[str, Any]:
    plt = _plt()
    spec = [name for name, k in configs if k > 0]
    cmap = plt.get_cmap("viridis")
    out: dict[str, Any] = {name: BASELINE_COLOR for name, k in configs if k == 0}
    for i, name in enumerate(spec):
        out[name] = cmap(0.1 + 0.8 * i / max(1, len(spec) - 1))
    return out


# --------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------


def plot_metric_vs_concurrency(ms: Sequence[Measurement], attr: str, ylabel: str, title: str) -> str | None:
    """One subplot per workload; x = concurrency, y = ``attr`` of each measurement; one line per
    configuration (baseline black). None when no measurement has the value."""
    plt = _plt()
    workloads = sorted({m.workload for m in ms})
    configs = _config_order(ms)
    colors = _colors(configs)
    if not any(getattr(m, attr) is not None for m in ms):
        return None
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.2 * len(workloads), 3.8), squeeze=False)
    for ax, wl in zip(axes[0], workloads):
        for name, k in configs:
            pts = sorted((m.concurrency, getattr(m, attr)) for m in ms
                         if m.workload == wl and m.config == name and getattr(m, attr) is not None)
            if not pts:
                continue
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", color=colors[name], linewidth=2.2 if k == 0 else 1.5,
                    label=name, zorder=3 if k == 0 else 2)
        concs = sorted({m.concurrency for m in ms})
        if concs and concs[-1] / max(concs[0], 1) >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks(concs)
        ax.set_xticklabels([str(c) for c in concs])
        ax.set_title(f"{wl}")
        ax.set_xlabel("max concurrency")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="best")
    fig.suptitle(title)
    return png_data_uri(fig)


def plot_position_acceptance(ms: Sequence[Measurement]) -> str | None:
    """Per-position acceptance rate (unconditional, solid; conditional r_i / r_(i-1), dashed) of
    the largest k, one line per (workload, concurrency)."""
    plt = _plt()
    src = _largest_k_runs(ms)
    if not src:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    cmap = plt.get_cmap("tab10")
    for i, ((wl, c), m) in enumerate(sorted(src.items())):
        r = m.position_rates
        pos = list(range(len(r)))
        cond = [r[0] if j == 0 else (r[j] / r[j - 1] if r[j - 1] > 0 else float("nan")) for j in pos]
        axes[0].plot(pos, [x * 100 for x in r], marker="o", color=cmap(i % 10), label=f"{wl} c={c} (k={m.k})")
        axes[1].plot(pos, [x * 100 for x in cond], marker="s", linestyle="--", color=cmap(i % 10), label=f"{wl} c={c}")
    for ax, t in zip(axes, ("unconditional: P(positions 0..i all accepted)", "conditional: P(i accepted | 0..i-1 accepted)")):
        ax.set_xlabel("draft position i (0-based)")
        ax.set_ylabel("acceptance %")
        ax.set_ylim(0, 105)
        ax.set_title(t, fontsize=10)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Per-position acceptance rate (largest k)")
    return png_data_uri(fig)


def plot_expected_length(ms: Sequence[Measurement]) -> str | None:
    """Expected acceptance length E(k) = 1 + Σ_(i<k) r_i predicted from the largest k's curve
    (lines), with the mean acceptance length measured at each k (markers)."""
    plt = _plt()
    src = _largest_k_runs(ms)
    if not src:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    cmap = plt.get_cmap("tab10")
    for i, ((wl, c), m) in enumerate(sorted(src.items())):
        ks = list(range(0, len(m.position_rates) + 1))
        e = [1.0 + math.fsum(m.position_rates[:k]) for k in ks]
        ax.plot(ks, e, color=cmap(i % 10), label=f"{wl} c={c}: predicted from k={m.k}")
        meas = sorted((x.k, x.acceptance_length) for x in ms
                      if x.workload == wl and x.concurrency == c and x.k > 0 and x.acceptance_length is not None)
        if meas:
            mk, mv = zip(*meas)
            ax.scatter(mk, mv, color=cmap(i % 10), marker="x", s=50, zorder=3)
    kmax = max(len(m.position_rates) for m in src.values())
    ax.plot([0, kmax], [1, kmax + 1], color="grey", linestyle=":", label="every draft accepted (k + 1)")
    ax.set_xlabel("num_speculative_tokens k")
    ax.set_ylabel("tokens per verify step")
    ax.set_title("Expected acceptance length vs k (× = measured)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return png_data_uri(fig)


def plot_servers(servers: Mapping[str, Mapping[str, Any]], order: Sequence[tuple[str, int]]) -> str | None:
    """Bars of start-up time (s) and KV-cache capacity (tokens) per configuration."""
    plt = _plt()
    names = [n for n, _ in order if n in servers] or list(servers)
    if not names:
        return None
    colors = _colors([(n, dict(order).get(n, 1)) for n in names])
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    st = [servers[n].get("startup_seconds") or 0 for n in names]
    kv = [servers[n].get("kv_cache_tokens") or 0 for n in names]
    axes[0].bar(names, st, color=[colors[n] for n in names])
    axes[0].set_ylabel("seconds")
    axes[0].set_title("start-up time (process start to /v1/models ready)", fontsize=10)
    axes[1].bar(names, kv, color=[colors[n] for n in names])
    axes[1].set_ylabel("tokens")
    axes[1].set_title("KV-cache capacity (num_gpu_blocks × block_size)", fontsize=10)
    for ax in axes:
        ax.tick_params(axis="x", rotation=30, labelsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    return png_data_uri(fig)


def _largest_k_runs(ms: Sequence[Measurement]) -> dict[tuple[str, int], Measurement]:
    out: dict[tuple[str, int], Measurement] = {}
    for m in ms:
        if m.k > 0 and m.position_rates and m.drafts:
            cur = out.get((m.workload, m.concurrency))
            if cur is None or m.k > cur.k:
                out[(m.workload, m.concurrency)] = m
    return out


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------


def _e(v: Any) -> str:
    return html.escape(str(v))


def _n(v: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "–" if v is None else f"{v:{spec}}{suffix}"


_TEMPLATES = jinja2.Environment(loader=jinja2.PackageLoader("specwatch.choosek", "templates"),
                                autoescape=True, keep_trailing_newline=True)


def _template():
    return _TEMPLATES.get_template("report.html.j2")


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    """An HTML table (templates/report.html.j2 ``table``; every cell escaped)."""
    return str(_template().module.table(head, rows, cls))


def _img(uri: str | None, alt: str) -> str:
    """A figure with an embedded PNG data URI, or a "no data" note (template ``figure``)."""
    return str(_template().module.figure(uri, alt))


def render_page(title: str, fragments: Sequence[str]) -> str:
    """The whole HTML page (template ``report.html.j2``): ``title`` escaped; ``fragments`` are
    markup built by :func:`_table`, :func:`_img` or from :func:`_e`-escaped pieces."""
    return _template().render(title=title, css=markupsafe.Markup(CSS), fragments=[markupsafe.Markup(f) for f in fragments])


def comparison_rows(ms: Sequence[Measurement]) -> tuple[list[str], list[list[str]]]:
    """The comparison table: one row per (workload, concurrency, configuration) with throughput,
    ratio to the baseline, TPOT, TTFT, acceptance rate and mean acceptance length."""
    base = {(m.workload, m.concurrency): m.output_throughput for m in ms if m.k == 0}
    head = ["workload", "concurrency", "configuration", "k", "output tok/s", "vs baseline", "mean TPOT ms",
            "mean TTFT ms", "acceptance", "acc. length"]
    rows = []
    for m in sorted(ms, key=lambda m: (m.workload, m.concurrency, m.k, m.config)):
        b = base.get((m.workload, m.concurrency))
        rows.append([m.workload, m.concurrency, m.config, m.k, _n(m.output_throughput),
                     "–" if not b else f"{m.output_throughput / b:.2f}×", _n(m.mean_tpot_ms), _n(m.mean_ttft_ms),
                     _n(None if m.acceptance_rate is None else m.acceptance_rate * 100, ".1f", " %"),
                     _n(m.acceptance_length, ".2f")])
    return head, rows


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.6em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.8em 0;font-size:.9em} th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f3f3f3} td:first-child,th:first-child{text-align:left}
figure{margin:1em 0} img{max-width:100%;border:1px solid #eee} figcaption{font-size:.85em;color:#666}
code,pre{background:#f6f6f6;padding:.2em .4em;border-radius:3px} pre{padding:.8em;overflow-x:auto;white-space:pre-wrap}
.note{color:#666;font-size:.9em}
"""


def render_report(doc: Mapping[str, Any], *, tolerance: float = DEFAULT_TOLERANCE, candidates: str = "measured",
                  title: str = "specwatch sweep report", basis: str = "measured") -> str:
    """The HTML text of the report for a sweep result document (see the module docstring)."""
    ms = measurements(doc)
    servers = servers_by_config(doc)
    order = _config_order(ms) or [(c["name"], c["k"]) for c in doc.get("configs", [])]
    settings = doc.get("settings", {})
    parts = []
    parts.append(
        f"<p>Status <b>{_e(doc.get('status'))}</b>; created {_e(doc.get('created_at'))}, updated {_e(doc.get('updated_at'))}; "
        f"server: {_e((doc.get('server') or {}).get('kind', '?'))}. {len(ms)} measured cells.</p>"
    )
    left_out = failed_cells(doc)
    if left_out:
        parts.append(f"<p class='note'>Left out: {len(left_out)} cell(s) with failed requests (resume the sweep to "
                     "measure them again): " + "; ".join(_e(x) for x in left_out) + ".</p>")
    parts.append(_table(["setting", "value"], [[k, json.dumps(v) if isinstance(v, (list, dict)) else v]
                                              for k, v in settings.items()], "settings"))

    parts.append("<h2>Servers</h2>")
    srows = []
    for name, k in order:
        s = servers.get(name, {})
        srows.append([name, k, _n(s.get("startup_seconds")), s.get("kv_cache_tokens") if s.get("kv_cache_tokens") is not None else "–",
                      s.get("num_gpu_blocks") if s.get("num_gpu_blocks") is not None else "–",
                      s.get("block_size") if s.get("block_size") is not None else "–"])
    parts.append(_table(["configuration", "k", "start-up s", "KV capacity tokens", "num_gpu_blocks", "block_size"], srows))
    parts.append(_img(plot_servers(servers, order), "Start-up time and KV-cache capacity per configuration"))

    if not ms:
        parts.append("<p class='note'>No finished cell yet.</p>")
        return render_page(title, parts)

    parts.append("<h2>Throughput, TPOT and TTFT against concurrency</h2>")
    parts.append("<p class='note'>One line per server configuration; the baseline (no speculation) is black.</p>")
    parts.append(_img(plot_metric_vs_concurrency(ms, "output_throughput", "output tokens/s", "Output throughput"),
                      "Output throughput vs concurrency"))
    parts.append(_img(plot_metric_vs_concurrency(ms, "mean_tpot_ms", "ms", "Mean TPOT (time per output token)"),
                      "Mean TPOT vs concurrency"))
    parts.append(_img(plot_metric_vs_concurrency(ms, "mean_ttft_ms", "ms", "Mean TTFT (time to first token)"),
                      "Mean TTFT vs concurrency"))

    parts.append("<h2>Acceptance</h2>")
    parts.append(_img(plot_position_acceptance(ms), "Per-position acceptance rate of the largest k"))
    parts.append(_img(plot_expected_length(ms), "Expected acceptance length against k"))
    parts.append(exactcurves.render_html(doc))

    parts.append("<h2>Comparison</h2>")
    head, rows = comparison_rows(ms)
    parts.append(_table(head, rows, "comparison"))

    parts.append("<h2>Advice</h2>")
    try:
        advices: list[Advice] = advise_sweep(dict(doc), tolerance=tolerance, candidates=candidates, basis=basis)
    except KChoiceError as exc:
        advices = []
        parts.append(f"<p class='note'>No advice: {_e(exc)}</p>")
    for a in advices:
        if a.family:
            parts.append(f"<p>Speculative family <code>{_e(a.family)}</code>.</p>")
        for e in (a.acceptance_error, a.acceptance_error_over(100.0)):
            if e["n"]:
                parts.append(f"<p>Acceptance-length prediction from the largest k's per-position curve: mean |relative error| "
                             f"{e['mean_abs_relative'] * 100:.1f} %, max {e['max_abs_relative'] * 100:.1f} % over {e['n']} runs"
                             + (f" with at least {e['min_drafts']:.0f} drafts" if e["min_drafts"] else "") + ".</p>")
        parts.append(_table(["workload", "concurrency", "k", "from k", "predicted E(k)", "measured", "drafts", "rel. error"],
                            [[p.workload, p.concurrency, p.k, p.source_k, _n(p.predicted, ".2f"), _n(p.measured, ".2f"),
                              _n(p.measured_drafts, ".0f"),
                              _n(None if p.relative_error is None else p.relative_error * 100, "+.1f", " %")]
                             for p in a.acceptance]))
        parts.append(_table(
            ["workload", "concurrency", "recommended k", "best k", "speedup vs baseline"],
            [["all workloads" if r.workload == "*" else r.workload, r.concurrency,
              f"{r.k} (speculation off)" if r.k == 0 else r.k, r.best_k, _n(r.speedup, ".2f", "×")]
             for r in a.recommendations]))
        if a.accuracy:
            parts.append("<p>Check: measured throughput at the recommended k against the best measured k "
                         f"(worst shortfall {_n(None if a.worst_shortfall is None else a.worst_shortfall * 100, '.1f', ' %')}).</p>")
            parts.append(_table(["workload", "concurrency", "picked k", "best measured k", "picked tok/s", "best tok/s", "shortfall"],
                                [[x.workload, x.concurrency, x.picked_k, x.best_k, _n(x.picked_throughput), _n(x.best_throughput),
                                  _n(None if x.shortfall is None else x.shortfall * 100, ".1f", " %")] for x in a.accuracy]))
        cv = a.cross_validation_summary
        if cv["n"]:
            parts.append(f"<p>Cross-validation (k picked on half of each cell's batches, judged on the other half): "
                         f"within 3 % of that half's best in {cv['within_3_percent']} of {cv['n']} picks, worst shortfall "
                         f"{cv['worst_shortfall'] * 100:.1f} %.</p>")
        if a.speculative_config is None:
            parts.append("<p><b>vLLM:</b> speculation does not pay at any measured concurrency: run without <code>--speculative-config</code>.</p>")
        else:
            parts.append("<p><b>vLLM flag:</b></p><pre>--speculative-config '"
                         + _e(json.dumps(a.speculative_config, separators=(",", ":"))) + "'</pre>")
    from specwatch.choosek.drafterstudy import report_sections

    parts.extend(report_sections(doc, ms, advices, tolerance))
    parts.append("<p class='note'>Generated by specwatch report. Throughputs are means over the measured batches of each cell "
                 "(warm-up excluded); spec-decode values come from the servers' vllm:spec_decode_* counters.</p>")
    return render_page(title, parts)
