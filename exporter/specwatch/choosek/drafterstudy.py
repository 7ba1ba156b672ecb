"""Drafters as a sweep dimension: which drafter and k per concurrency, and the second source
document's charts per drafter (a draft-model study: throughput, TPOT and TTFT against concurrency
with one line per k and the baseline in black, acceptance against k per drafter).

A drafter is a ``method: draft_model`` family of a sweep result (its speculative config without
k); its label is the configuration's optional ``drafter`` key written by ``specwatch sweep
--drafter`` (result format 1, :mod:`specwatch.choosek.resultfile`), else the last part of the
config's ``model``. All values are measured (client-side throughput/TPOT/TTFT of the load
generator; acceptance from the servers' ``vllm:spec_decode_*`` counters summed over the cells of
a (drafter, k) before dividing), except the advice's predicted scores for k that were not run.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from rich.table import Table

from specwatch.choosek.charts import (
    escape,
    html_figure,
    html_table,
    plot_metric_vs_concurrency,
    plot_position_acceptance,
    png_data_uri,
    pyplot,
)
from specwatch.choosek.model import Advice, Measurement, family_of
from specwatch.choosek.records import SweepResult
from specwatch.choosek.resultfile import SweepError, load_sweep, measurements
from specwatch.specdecode.decision import Candidate, decide


def drafter_labels(doc: SweepResult) -> dict[str, str]:
    """Configuration name → drafter label, for the ``method: draft_model`` configurations of a
    sweep result (others are left out)."""
    out: dict[str, str] = {}
    for c in doc.configs:
        sc = c.speculative_config or {}
        if sc.get("method") != "draft_model":
            continue
        label = c.drafter
        if not isinstance(label, str) or not label:
            label = str(sc.get("model", "?")).rstrip("/").rsplit("/", 1)[-1]
        out[c.name] = label
    return out


def family_labels(rec: SweepResult) -> dict[str, str]:
    """Speculative family (config JSON without k) → drafter label, for draft_model families."""
    labels = drafter_labels(rec)
    return {family_of(c.speculative_config): labels[c.name] for c in rec.configs if c.name in labels}


@dataclass(frozen=True)
class DrafterPick:
    """The drafter and k to run for ``workload`` ("*" = all workloads) at ``concurrency``, decided
    by the one rule (:func:`specwatch.specdecode.decision.decide`) over every drafter's
    configurations: ``drafter`` None and ``k`` 0 = no speculation. ``score``: the pick's speedup
    over the baseline (paired), ``best``: the best estimate (drafter, k, speedup) before the
    tolerance, ``speedup``: the pick's speedup; ``candidates``: every ``"<drafter> k=<k>"`` (and
    ``baseline``) → speedup compared; ``confidence``: the pick's confidence text; ``pick``: its
    :meth:`specwatch.specdecode.decision.Pick.to_json`."""

    workload: str
    concurrency: int
    drafter: str | None
    k: int
    score: float
    speedup: float | None
    best: tuple[str | None, int, float]
    candidates: dict[str, float]
    confidence: str = ""
    pick: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pick_drafters(advices: Sequence[Advice], labels: Mapping[str, str], tolerance: float) -> list[DrafterPick]:
    """Across the draft_model families of ``advices`` (``labels``: family → drafter label, from
    :func:`family_labels`), per (workload, concurrency): every (drafter, configuration) with its
    paired speedup over the baseline (the candidates of its family's pick), off as k = 0, decided
    by the one rule (:func:`specwatch.specdecode.decision.decide`: best estimate, ties within
    ``tolerance`` to the smaller k, physics first). Families that are not draft_model are ignored."""
    cells: dict[tuple[str, int], dict[str, tuple[str | None, Candidate]]] = defaultdict(dict)
    for a in advices:
        label = labels.get(a.family)
        if label is None:
            continue
        for r in a.recommendations:
            if r.pick is None:
                continue
            for c in r.pick.candidates:
                if c.off:
                    cells[(r.workload, r.concurrency)]["baseline"] = (None, replace(c, name="baseline"))
                else:
                    name = f"{label} {c.name}"
                    cells[(r.workload, r.concurrency)][name] = (label, replace(c, name=name))
    out = []
    for (wl, c), cands in sorted(cells.items(), key=lambda kv: (kv[0][0] != "*", kv[0])):
        p = decide([x for _, x in cands.values()], tolerance)
        drafter = cands[p.pick.name][0] if p.pick.name in cands else None
        best_d = cands[p.best.name][0] if p.best.name in cands else None
        out.append(DrafterPick(wl, c, drafter, p.pick.k, p.pick.value, p.pick.value, (best_d, p.best.k, p.best.value),
                               {n: x.value for n, (_, x) in sorted(cands.items(), key=lambda kv: (kv[1][1].k, kv[0]))},
                               p.confidence_text(), p.to_json()))
    return out


def render_picks(picks: Sequence[DrafterPick], console, tolerance: float) -> None:
    """Print the drafter-and-k table (rich) on ``console``."""
    t = Table(title=f"Drafter and k per concurrency (the decision rule: best paired speedup, smaller k within "
                    f"{tolerance * 100:g} %)")
    for col in ("workload", "conc.", "drafter", "k", "speedup vs baseline", "best", "confidence"):
        t.add_column(col, justify="left" if col in ("workload", "drafter", "best") else "right")
    for p in picks:
        best = "baseline" if p.best[0] is None else f"{p.best[0]} k={p.best[1]}"
        t.add_row("all workloads" if p.workload == "*" else p.workload, str(p.concurrency),
                  "none (speculation off)" if p.drafter is None else p.drafter, str(p.k),
                  "" if p.speedup is None else f"{p.speedup:.2f}×", best, p.confidence)
    console.print(t)


# --------------------------------------------------------------------------------------------
# The second document's table and charts
# --------------------------------------------------------------------------------------------


def acceptance_by_drafter(ms: Sequence[Measurement], labels: Mapping[str, str]) -> dict[str, dict[int, float]]:
    """Draft acceptance rate (0–1) per drafter and k: Σ accepted / Σ draft tokens over all its
    cells (vLLM counters, summed before dividing)."""
    acc: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for m in ms:
        d = labels.get(m.config)
        if d is None or m.k <= 0 or not m.draft_tokens or m.accepted_tokens is None:
            continue
        acc[(d, m.k)][0] += m.accepted_tokens
        acc[(d, m.k)][1] += m.draft_tokens
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for (d, k), (a, t) in sorted(acc.items()):
        if t > 0:
            out[d][k] = a / t
    return dict(out)


def _mean(values: Sequence[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return sum(vs) / len(vs) if vs else None


def study_rows(ms: Sequence[Measurement], labels: Mapping[str, str], k: int
               ) -> tuple[list[str], dict[int, dict[str, tuple[float | None, float | None, float | None]]]]:
    """The second document's table at one k: per concurrency, for the baseline and each drafter,
    (output throughput tok/s, mean TPOT ms, mean TTFT ms), each the mean over the workloads.
    Returns (column names, {concurrency: {column: values}})."""
    cols = ["baseline"] + sorted({d for d in labels.values()})
    cells: dict[tuple[int, str], list[Measurement]] = defaultdict(list)
    for m in ms:
        if m.k == 0:
            cells[(m.concurrency, "baseline")].append(m)
        elif m.k == k and m.config in labels:
            cells[(m.concurrency, labels[m.config])].append(m)
    rows: dict[int, dict[str, tuple]] = defaultdict(dict)
    for (c, col), group in cells.items():
        rows[c][col] = (_mean([m.output_throughput for m in group]), _mean([m.mean_tpot_ms for m in group]),
                        _mean([m.mean_ttft_ms for m in group]))
    return cols, dict(sorted(rows.items()))


def study_markdown(ms: Sequence[Measurement], labels: Mapping[str, str], k: int) -> str:
    """Markdown tables like the document's (throughput, TPOT, TTFT at k; baseline and each drafter
    per concurrency) plus the acceptance per drafter and k."""
    cols, rows = study_rows(ms, labels, k)
    lines = []
    for i, (what, unit, fmt) in enumerate((("Output throughput", "tok/s, higher is better", ".1f"),
                                           ("Mean TPOT", "ms, lower is better", ".1f"),
                                           ("Mean TTFT", "ms, lower is better", ".0f"))):
        lines.append(f"{what} ({unit}), k = {k}:\n")
        lines.append("| max concurrency | " + " | ".join(c if c == "baseline" else f"{c} (k={k})" for c in cols) + " |")
        lines.append("|---" * (len(cols) + 1) + "|")
        for c, vals in rows.items():
            cells = []
            for col in cols:
                v = vals.get(col, (None, None, None))[i]
                cells.append("–" if v is None else format(v, fmt))
            lines.append(f"| {c} | " + " | ".join(cells) + " |")
        lines.append("")
    acc = acceptance_by_drafter(ms, labels)
    if acc:
        ks = sorted({kk for d in acc.values() for kk in d})
        lines.append("Draft acceptance rate (vLLM counters, all cells of the drafter and k):\n")
        lines.append("| drafter | " + " | ".join(f"k={kk}" for kk in ks) + " |")
        lines.append("|---" * (len(ks) + 1) + "|")
        for d, by_k in acc.items():
            lines.append(f"| {d} | " + " | ".join("–" if kk not in by_k else f"{by_k[kk] * 100:.1f} %" for kk in ks) + " |")
        lines.append("")
    return "\n".join(lines)


def plot_acceptance_vs_k(ms: Sequence[Measurement], labels: Mapping[str, str]) -> str | None:
    """Draft acceptance rate (%) against k, one line per drafter (the document's last chart)."""
    acc = acceptance_by_drafter(ms, labels)
    if not acc:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    cmap = plt.get_cmap("tab10")
    for i, (d, by_k) in enumerate(acc.items()):
        ks = sorted(by_k)
        ax.plot(ks, [by_k[k] * 100 for k in ks], marker="o", color=cmap(i % 10), label=d)
    ax.set_xlabel("num_speculative_tokens k")
    ax.set_ylabel("draft acceptance rate %")
    ax.set_ylim(0, 105)
    ax.set_xticks(sorted({k for by_k in acc.values() for k in by_k}))
    ax.set_title("Draft acceptance rate per drafter and k")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return png_data_uri(fig)


def report_sections(doc: SweepResult, ms: Sequence[Measurement], advices: Sequence[Advice],
                    tolerance: float) -> list[str]:
    """HTML parts of the report's "Drafters" section (empty when the sweep has no draft_model
    configuration): per drafter, throughput / TPOT / TTFT against concurrency with one line per k
    and the baseline in black, and its per-position acceptance at its largest k (the general
    section's per-position chart mixes drafters); acceptance against k per drafter; the document's table at k = 3
    (or the k nearest it that was run); the drafter-and-k picks."""
    labels = drafter_labels(doc)
    if not labels or not any(m.config in labels for m in ms):
        return []
    parts = ["<h2>Drafters (method draft_model)</h2>",
             "<p class='note'>The layout of the published draft-model study's charts: per drafter, one line per k, the baseline "
             "(no speculation) in black.</p>"]
    for d in sorted(set(labels.values())):
        sub = [m for m in ms if m.k == 0 or labels.get(m.config) == d]
        if not any(labels.get(m.config) == d for m in sub):
            continue
        parts.append(f"<h3>Drafter {escape(d)}</h3>")
        for attr, ylabel, title in (("output_throughput", "output tokens/s", "Output throughput"),
                                    ("mean_tpot_ms", "ms", "Mean TPOT"), ("mean_ttft_ms", "ms", "Mean TTFT")):
            parts.append(html_figure(plot_metric_vs_concurrency(sub, attr, ylabel, f"{title}, drafter {d}"),
                                     f"{title} vs concurrency, drafter {d}"))
        parts.append(html_figure(plot_position_acceptance(sub), f"Per-position acceptance rate of the largest k, drafter {d}"))
    parts.append(html_figure(plot_acceptance_vs_k(ms, labels), "Draft acceptance rate against k per drafter"))
    ks = sorted({m.k for m in ms if m.config in labels})
    k = min(ks, key=lambda x: (abs(x - 3), x))
    cols, rows = study_rows(ms, labels, k)
    for i, what in enumerate(("output throughput tok/s", "mean TPOT ms", "mean TTFT ms")):
        parts.append(f"<p>{escape(what)} at k = {k} (mean over workloads):</p>")
        parts.append(html_table(["max concurrency"] + cols,
                                [[c] + ["–" if vals.get(col, (None,) * 3)[i] is None else f"{vals[col][i]:.1f}" for col in cols]
                                 for c, vals in rows.items()]))
    picks = pick_drafters(advices, family_labels(doc), tolerance)
    if picks:
        parts.append("<p>Drafter and k per concurrency (the decision rule, docs/choosing-k.md#the-decision-rule: the best "
                     "paired speedup, smaller k within the tolerance):</p>")
        parts.append(html_table(["workload", "concurrency", "drafter", "k", "speedup vs baseline", "best", "confidence"],
                                [["all workloads" if p.workload == "*" else p.workload, p.concurrency,
                                  "none (speculation off)" if p.drafter is None else p.drafter, p.k,
                                  "–" if p.speedup is None else f"{p.speedup:.2f}×",
                                  "baseline" if p.best[0] is None else f"{p.best[0]} k={p.best[1]}", p.confidence]
                                 for p in picks]))
    return parts


def picks_json(picks: Sequence[DrafterPick]) -> list[dict[str, Any]]:
    """JSON-ready picks (for ``advise --json``)."""
    return [p.to_dict() for p in picks]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m specwatch.choosek.drafterstudy RESULT_FILE [K]``: print the document's tables
    (markdown) for a sweep result with drafters, at K (default: the k nearest 3 that was run)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or len(args) > 2:
        print("usage: python -m specwatch.choosek.drafterstudy RESULT_FILE [K]", file=sys.stderr)
        return 2
    try:
        doc = load_sweep(args[0]).without_aa()
    except SweepError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    ms, labels = measurements(doc), drafter_labels(doc)
    ks = sorted({m.k for m in ms if m.config in labels})
    if not ks:
        print(f"error: {args[0]} has no finished draft_model cell", file=sys.stderr)
        return 2
    k = int(args[1]) if len(args) == 2 and args[1].isdigit() else min(ks, key=lambda x: (abs(x - 3), x))
    print(study_markdown(ms, labels, k))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
