"""Exact per-request curves beside the counter-based ones, for ``specwatch report`` (and any text).

Reads the typed cell summaries of a sweep result (:class:`specwatch.bench.records.BenchCell` of
each :class:`specwatch.choosek.records.SweepCell`): the counter-based curve
(``per_position_acceptance_rates``) with its ``curve_basis`` (exact / lower_bound,
:mod:`specwatch.specdecode.ragged`) and the per-request record (``per_request``,
:mod:`specwatch.bench.perrequest`: exact curve, per-request acceptance distribution, draft
lengths, outliers, problems).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from specwatch.bench.perrequest import format_outlier, format_problems
from specwatch.choosek.records import SweepResult

#: Why a cell has no exact curve, by the per-request record's status
#: (:func:`specwatch.bench.perrequest.cell_status`).
NO_EXACT_CURVE = {
    "not_offered": "server did not return per-request metrics",
    "unusable": "no usable per-request payload (see problems)",
    "no_drafts": "no verify step with draft tokens",
}


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def _curve(vals: Sequence[Any] | None) -> str:
    if not vals:
        return "–"
    return " / ".join("–" if v is None else f"{float(v):.2f}" for v in vals)


def cell_rows(doc: SweepResult) -> list[dict[str, Any]]:
    """One row per speculative cell of a sweep result (its record): config,
    workload, concurrency, the counter curve and basis, and the per-request record
    (:class:`specwatch.bench.records.PerRequest`; None when the server did not return per-request
    metrics)."""
    out = []
    for cell in doc.cells:
        s = cell.summary
        if s is None or not s.per_position_acceptance_rates:
            continue
        out.append({"config": cell.config, "workload": cell.workload, "concurrency": cell.max_concurrency,
                    "counter_rates": s.per_position_acceptance_rates,
                    "counter_basis": s.curve_basis or "exact (not labelled: older result)",
                    "per_request": s.per_request})
    return out


def render_html(doc: SweepResult) -> str:
    """The report section: a table of counter vs exact curves per cell, then per-request
    distributions, draft lengths, problems and outliers. Empty string without speculative cells."""
    rows = cell_rows(doc)
    if not rows:
        return ""
    parts = ["<h2>Per-position acceptance: counters beside exact per-request curves</h2>",
             "<p class='note'>Counter curve: r_i = Δper_pos[i] / Δdrafts from vllm:spec_decode_* counters; "
             "basis lower_bound when drafts were ragged (fewer than k tokens beyond max(1, 0.5 % of drafts)), as "
             "undrafted positions count as rejected. Exact curve: from vLLM's per-request per_step_accepted / "
             "per_step_drafted (--per-request-spec-decode-metrics detailed): c_j = P(position j accepted | positions "
             "0..j-1 accepted and j drafted), r_j = c_0 × … × c_j; D_j is the number of verify steps that drafted position "
             "j (c_j is estimated on those of them whose positions 0..j-1 were accepted). Problems: requests left out of the "
             "exact curve, by reason; outliers by batch and request index.</p>"]
    head = ["configuration", "workload", "c", "counter curve", "counter basis", "exact curve r_j",
            "exact conditional c_j", "steps drafting position j (D_j)", "exact E(k)", "requests",
            "per-request acceptance p5 / p50 / p95", "draft lengths (steps)", "problems", "outliers"]
    body = []
    for r in rows:
        pr = r["per_request"]
        status = None if pr is None else pr.status
        if pr is None or not pr.has_exact_curve:
            why = NO_EXACT_CURVE.get(status, "server did not return per-request metrics")
            body.append([r["config"], r["workload"], r["concurrency"], _curve(r["counter_rates"]), r["counter_basis"],
                         why, "–", "–", "–", "–" if status is None else f"{pr.requests} ({status})", "–", "–",
                         format_problems(None if pr is None else pr.problems), "–"])
            continue
        ra = pr.request_acceptance or {}
        outs = pr.outliers or ()
        body.append([
            r["config"], r["workload"], r["concurrency"], _curve(r["counter_rates"]), r["counter_basis"],
            _curve(pr.per_position_acceptance_rates),
            _curve(pr.conditional_per_position_acceptance_rates),
            " / ".join(str(n) for n in pr.drafted_steps_per_position or ()) or "–",
            " / ".join(f"E({k})={v:.2f}" for k, v in pr.format_expected()) or "–",
            f"{pr.requests} ({pr.status})",
            " / ".join(f"{float(ra[p]):.2f}" for p in ("p5", "p50", "p95")) if ra else "–",
            ", ".join(f"{d}: {n}" for d, n in (pr.draft_length_histogram or {}).items()) or "–",
            format_problems(pr.problems),
            "; ".join(format_outlier(o) for o in outs[:5]) + (f" (+{pr.num_outliers - 5})" if (pr.num_outliers or 0) > 5 else "")
            if outs else "none",
        ])
    parts.append("<table class='exact'><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"
                 + "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in body) + "</table>")
    return "".join(parts)


__all__ = ["cell_rows", "render_html"]
