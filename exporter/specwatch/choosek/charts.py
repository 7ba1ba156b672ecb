"""Building blocks of specwatch's HTML reports: matplotlib charts rendered to embedded PNG data
URIs and the Jinja2 page template (``templates/report.html.j2``).

Shared by the sweep report (:mod:`specwatch.choosek.report`), its drafter section
(:mod:`specwatch.choosek.drafterstudy`) and the demo report (:mod:`specwatch.demo.report`).
Every chart draws :class:`~specwatch.choosek.model.Measurement` values as they were measured
(client-side throughput/TPOT/TTFT of the load generator; acceptance from the servers'
``vllm:spec_decode_*`` counters, or vLLM's per-request data where the cell has them); the only
modelled line is E(k) predicted from the largest k's per-position curve, labelled as predicted with
its basis (a lower-bound curve of ragged drafts is dashed and labelled "lower bound"; measured
markers of ragged runs are left out).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import markupsafe

from specwatch.choosek.model import Measurement, expected_length
from specwatch.choosek.records import ServerStart

BASELINE_COLOR = "black"


def pyplot():
    """matplotlib.pyplot on the Agg backend. Imported here, not at module top: it costs about 0.8 s
    (measured with ``python -X importtime``), and every ``specwatch`` command that loads the
    k-choice CLI would pay it, though only the reports draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_data_uri(fig) -> str:
    """Render a matplotlib figure to PNG and return it as a ``data:image/png;base64,…`` URI
    (the figure is closed)."""
    plt = pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


#: Widest figure, inches at the PNG's 100 dpi: the report page is at most 1200 px wide, so a
#: figure up to 12 in is shown unscaled and its 8-9 pt labels stay readable (a 6-workload row of
#: 5.2 in subplots was 31 in, shown at 38 %).
MAX_FIG_WIDTH_IN = 12.0


def legend_below(fig, axes_list, fontsize: float = 8) -> None:
    """One legend for the figure, below its axes (never over a plot): the distinct labelled
    handles of ``axes_list``, in up to 4 columns. ``bbox_inches="tight"`` keeps it in the PNG."""
    handles, labels = [], []
    for ax in axes_list:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if handles:
        # as many columns as fit the figure's width (about 0.55 x fontsize / 72 in per character, plus
        # the handle), at most 4: long labels (a curve's basis, its workload) go one under the other
        width_in = fig.get_size_inches()[0]
        longest = max(len(lab) for lab in labels)
        per_col = 0.6 + longest * 0.55 * fontsize / 72
        ncol = max(1, min(4, len(labels), int(width_in // per_col)))
        fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol,
                   fontsize=fontsize, frameon=False)


def config_order(ms: Sequence[Measurement]) -> list[tuple[str, int]]:
    seen: dict[str, int] = {}
    for m in ms:
        seen.setdefault(m.config, m.k)
    return sorted(seen.items(), key=lambda kv: (kv[1], kv[0]))


def config_colors(configs: Sequence[tuple[str, int]]) -> dict[str, Any]:
    plt = pyplot()
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
    plt = pyplot()
    workloads = sorted({m.workload for m in ms})
    configs = config_order(ms)
    colors = config_colors(configs)
    if not any(getattr(m, attr) is not None for m in ms):
        return None
    ncols = min(3, len(workloads))
    nrows = -(-len(workloads) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(min(MAX_FIG_WIDTH_IN, 4.0 * ncols), 3.3 * nrows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(workloads):]:
        ax.set_visible(False)
    for ax, wl in zip(flat, workloads, strict=False):
        for name, k in configs:
            pts = sorted((m.concurrency, getattr(m, attr)) for m in ms
                         if m.workload == wl and m.config == name and getattr(m, attr) is not None)
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
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
    fig.suptitle(title)
    fig.tight_layout()
    legend_below(fig, flat)
    return png_data_uri(fig)


def plot_position_acceptance(ms: Sequence[Measurement]) -> str | None:
    """Per-position acceptance rate (unconditional, solid; conditional r_i / r_(i-1), dashed) of
    the largest k (:func:`largest_k_runs`), one line per (workload, concurrency), the curve basis in
    the legend (a lower-bound curve dotted)."""
    plt = pyplot()
    src = largest_k_runs(ms)
    if not src:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    cmap = plt.get_cmap("tab10")
    for i, ((wl, c), m) in enumerate(sorted(src.items())):
        r = m.position_rates
        pos = list(range(len(r)))
        cond = [r[0] if j == 0 else (r[j] / r[j - 1] if r[j - 1] > 0 else float("nan")) for j in pos]
        lower = m.curve_basis == "lower_bound"
        axes[0].plot(pos, [x * 100 for x in r], marker="o", color=cmap(i % 10), linestyle=":" if lower else "-",
                     label=curve_label(wl, c, m))
        axes[1].plot(pos, [x * 100 for x in cond], marker="s", linestyle=":" if lower else "--", color=cmap(i % 10),
                     label=curve_label(wl, c, m))
    for ax, t in zip(axes, ("unconditional: P(positions 0..i all accepted)", "conditional: P(i accepted | 0..i-1 accepted)"), strict=True):
        ax.set_xlabel("draft position i (0-based)")
        ax.set_ylabel("acceptance %")
        ax.set_ylim(0, 105)
        ax.set_title(t, fontsize=10)
        ax.grid(True, alpha=0.3)
    fig.suptitle("Per-position acceptance rate (largest k)")
    fig.tight_layout()
    legend_below(fig, [axes[0]])  # one entry per curve; it covered the left plot with 12 cells
    return png_data_uri(fig)


def plot_expected_length(ms: Sequence[Measurement]) -> str | None:
    """Expected acceptance length E(k) = 1 + Σ_(i<k) r_i predicted from the largest k's curve
    (lines, the curve basis in the legend; a lower-bound curve dashed), with the mean acceptance
    length measured at each k with full drafts (markers): :func:`expected_length_series`."""
    plt = pyplot()
    series = expected_length_series(ms)
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    cmap = plt.get_cmap("tab10")
    for i, sr in enumerate(series):
        ax.plot(sr["ks"], sr["values"], color=cmap(i % 10), linestyle="--" if sr["lower_bound"] else "-", label=sr["label"])
        if sr["measured"]:
            mk, mv = zip(*sr["measured"], strict=True)
            ax.scatter(mk, mv, color=cmap(i % 10), marker="x", s=50, zorder=3)
    kmax = max(len(sr["ks"]) - 1 for sr in series)
    ax.plot([0, kmax], [1, kmax + 1], color="grey", linestyle=":", label="every draft accepted (k + 1)")
    ax.set_xlabel("num_speculative_tokens k")
    ax.set_ylabel("tokens per verify step")
    ax.set_title("Expected acceptance length vs k (× = measured, full drafts)")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    legend_below(fig, [ax])
    return png_data_uri(fig)


def plot_servers(servers: Mapping[str, ServerStart], order: Sequence[tuple[str, int]]) -> str | None:
    """Bars of start-up time (s) and KV-cache capacity (tokens) per configuration (the latest
    server start of each, :meth:`specwatch.choosek.records.SweepResult.servers_by_config`)."""
    plt = pyplot()
    names = [n for n, _ in order if n in servers] or list(servers)
    if not names:
        return None
    colors = config_colors([(n, dict(order).get(n, 1)) for n in names])
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    st = [servers[n].startup_seconds or 0 for n in names]
    kv = [servers[n].kv_cache_tokens or 0 for n in names]
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


def largest_k_runs(ms: Sequence[Measurement]) -> dict[tuple[str, int], Measurement]:
    """Per (workload, concurrency): the run whose per-position curve the charts draw — the largest
    k with a curve and drafts whose curve is not a lower bound (``curve_basis`` exact or
    exact_per_request, as :func:`specwatch.choosek.model.predict_acceptance_lengths` uses); a cell
    with lower-bound curves only (ragged drafts, counters) gets its largest-k lower-bound run, which
    the charts draw dashed and label "lower bound". A fixed k comes before a dynamic table of the
    same k (a configuration of its own, whose curve mixes widths)."""
    out: dict[tuple[str, int], Measurement] = {}
    for m in ms:
        if m.k > 0 and m.position_rates and m.drafts:
            cur = out.get((m.workload, m.concurrency))
            rank = (m.curve_basis != "lower_bound", not m.variable_width, m.k)
            if cur is None or rank > (cur.curve_basis != "lower_bound", not cur.variable_width, cur.k):
                out[(m.workload, m.concurrency)] = m
    return out


#: How a drawn curve was obtained, for legends (``Measurement.curve_basis``).
CURVE_BASIS_LABELS = {
    "exact": "counters, full drafts",
    "exact_per_request": "exact, per-request data",
    "lower_bound": "LOWER BOUND: ragged drafts, counters",
}


def curve_label(wl: str, c: int, m: Measurement) -> str:
    """Legend text of a curve: workload, concurrency, the k it was measured at and its basis."""
    return f"{wl} c={c} (k={m.k}; {CURVE_BASIS_LABELS.get(m.curve_basis, m.curve_basis)})"


def expected_length_series(ms: Sequence[Measurement]) -> list[dict[str, Any]]:
    """What :func:`plot_expected_length` draws, per (workload, concurrency): ``label`` (with the
    curve basis), ``ks`` and ``values`` E(k) = 1 + Σ_(i<k) r_i from the largest k's curve,
    ``lower_bound`` (drawn dashed), and ``measured`` [(k, mean acceptance length)] of the runs
    whose drafts were full — a ragged run's mean acceptance length is not E(k) (a dynamic table
    ran shorter drafts) and is left out."""
    out = []
    for (wl, c), m in sorted(largest_k_runs(ms).items()):
        ks = list(range(0, len(m.position_rates) + 1))
        lower = m.curve_basis == "lower_bound"
        meas = sorted((x.k, x.acceptance_length) for x in ms
                      if x.workload == wl and x.concurrency == c and x.k > 0 and x.acceptance_length is not None
                      and not x.ragged_drafts and not x.variable_width)
        out.append({"workload": wl, "concurrency": c, "source_k": m.k, "basis": m.curve_basis, "lower_bound": lower,
                    "label": f"{wl} c={c}: " + ("lower bound from" if lower else "predicted from")
                             + f" k={m.k} ({CURVE_BASIS_LABELS.get(m.curve_basis, m.curve_basis)})",
                    "ks": ks, "values": [expected_length(m.position_rates, k) for k in ks], "measured": meas})
    return out


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------


def escape(v: Any) -> str:
    return html.escape(str(v))


def fmt_num(v: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "–" if v is None else f"{v:{spec}}{suffix}"


_TEMPLATES = jinja2.Environment(loader=jinja2.PackageLoader("specwatch.choosek", "templates"),
                                autoescape=True, keep_trailing_newline=True)


def _template():
    return _TEMPLATES.get_template("report.html.j2")


def html_table(head: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    """An HTML table (templates/report.html.j2 ``table``; every cell escaped)."""
    return str(_template().module.table(head, rows, cls))


def html_figure(uri: str | None, alt: str) -> str:
    """A figure with an embedded PNG data URI, or a "no data" note (template ``figure``)."""
    return str(_template().module.figure(uri, alt))


def render_page(title: str, fragments: Sequence[str]) -> str:
    """The whole HTML page (template ``report.html.j2``): ``title`` escaped; ``fragments`` are
    markup built by :func:`html_table`, :func:`html_figure` or from :func:`escape`-escaped pieces."""
    return _template().render(title=title, css=markupsafe.Markup(CSS), fragments=[markupsafe.Markup(f) for f in fragments])


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.6em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.8em 0;font-size:.9em} th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f3f3f3} td:first-child,th:first-child{text-align:left}
figure{margin:1em 0} img{max-width:100%;border:1px solid #eee} figcaption{font-size:.85em;color:#666}
code,pre{background:#f6f6f6;padding:.2em .4em;border-radius:3px} pre{padding:.8em;overflow-x:auto;white-space:pre-wrap}
.note{color:#666;font-size:.9em}
"""
