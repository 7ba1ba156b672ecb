"""Render a :class:`~specwatch.top.model.TopView`: rich renderables for the live screen, plain
text for ``--once``. Both read the same rows (:func:`engine_rows`), so they always agree.

Units: rates are shown as percent of the 0-1 ratios the exporter serves; lengths in tokens per
verify step; step time in ms. A value the exporter does not serve is "–", never 0.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from rich.bar import Bar
from rich.markup import escape
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from specwatch.common.labels import for_terminal
from specwatch.specdecode.decision import format_interval, format_ratio
from specwatch.top.model import DRIFT_FITS, EngineView, PositionRow, TopView, UpstreamView, Value

#: Below this many columns the bars are dropped; below MIN_WIDTH only a notice is shown.
BAR_WIDTH_MIN = 64
MIN_WIDTH = 36
KEYS_HELP = "keys: 1/5/l window 1m/5m/lifetime · w next window · q quit"
DASH = "–"


def pct(v: Value | float | None) -> str:
    """``77.2 %`` for a 0-1 ratio, "–" for None."""
    if v is None:
        return DASH
    x = v.value if isinstance(v, Value) else v
    return f"{x * 100:.1f} %"


def _count(x: float | None) -> str:
    """A request count: ``2`` for a whole number, ``1.5`` for a window mean (one decimal), "–"."""
    if x is None:
        return DASH
    return f"{x:.0f}" if abs(x - round(x)) < 0.05 else f"{x:.1f}"


def _labels(v: Value | None) -> str:
    return "" if v is None or not v.extra else f"[{v.label_text}]"


def position_note(p: PositionRow) -> str:
    """The labels of a per-position row, each distinct one once (``[basis=lower_bound]``, not
    once for the rate and again for the conditional rate)."""
    seen: list[str] = []
    for v in (p.rate, p.conditional):
        t = _labels(v)
        if t and t not in seen:
            seen.append(t)
    return " ".join(seen)


#: Note of the "requests" row per :attr:`EngineView.requests_source`.
REQUEST_NOTES = {
    "exporter": "mean of vllm:num_requests_running over the window (specwatch_running_requests)",
    "upstream": "vllm:num_requests_running / _waiting, read from the upstream",
    None: "not served for this window",
}


def drift_warning(e: EngineView) -> str:
    """The warning line for a cost-profile drift outside :data:`DRIFT_FITS` ("" when it fits or
    is not served): the profile's step times are ``max(r, 1/r)`` times off this machine's."""
    d = e.drift
    if d is None or DRIFT_FITS[0] <= d.value <= DRIFT_FITS[1] or d.value <= 0:
        return ""
    off = d.value if d.value >= 1 else 1 / d.value
    return (f"drift {d.value:.2f}: the cost profile does not fit this machine "
            f"(its step times are {off:.2f}x off); intervals widened")


@dataclass(frozen=True)
class Row:
    """One line of an engine block: ``label``, value ``text``, optional bar ``fraction`` (0-1) and
    a ``note`` (basis labels, bounds)."""

    label: str
    text: str
    fraction: float | None = None
    note: str = ""


def engine_rows(e: EngineView) -> list[Row]:
    """The summary rows of one engine block (see :class:`EngineView` for the series behind each)."""
    rows = []
    if e.draft_acceptance_rate is not None or e.v0_draft_acceptance_rate is None:
        r = e.draft_acceptance_rate
        rows.append(Row("draft acceptance rate", pct(r), None if r is None else r.value, _labels(r)))
    if e.v0_draft_acceptance_rate is not None:
        v = e.v0_draft_acceptance_rate
        rows.append(Row("V0 acceptance gauge", pct(v), v.value, "vLLM V0 gauge, most recent interval"))
    m, ceil = e.mean_acceptance_length, e.ceiling
    if m is None:
        rows.append(Row("mean acceptance length", DASH))
    else:
        rows.append(Row("mean acceptance length",
                        f"{m.value:.2f} of {ceil} (k+1)" if ceil else f"{m.value:.2f}",
                        m.value / ceil if ceil else None, _labels(m)))
    k = e.num_speculative_tokens
    if e.effective_k is None:
        rows.append(Row("effective k", DASH if k is None else f"{DASH} (k = {k})"))
    else:
        note = ragged_note(e)
        rows.append(Row("effective k", f"{e.effective_k.value:.2f}" + ("" if k is None else f" of k = {k}"),
                        e.effective_k.value / k if k else None, " ".join(x for x in (_labels(e.effective_k), note) if x)))
    if e.output_from_drafts is not None:
        rows.append(Row("output from drafts", pct(e.output_from_drafts), e.output_from_drafts.value,
                        _labels(e.output_from_drafts)))
    rows.append(Row("requests", f"running {_count(e.running)} · waiting {_count(e.waiting)}",
                    note=REQUEST_NOTES.get(e.requests_source, "")))
    if e.step_time:
        rows.append(Row("step time", ", ".join(f"{s.value * 1000:.1f} ms" for s in e.step_time),
                        note=" ".join(_labels(s) for s in e.step_time).strip()))
    else:
        rows.append(Row("step time", DASH, note="not served by the exporter"))
    rec = e.recommended_k
    rec_k = None if rec is None else int(rec.value)
    for label, kk in (("speedup at k", k), ("speedup at recommended k", rec_k)):
        if kk is None or (label != "speedup at k" and kk == k):
            continue
        sp = e.speedup_at(kk)
        for s in sp:  # one row per basis, its interval beside it when served
            rows.append(Row(f"{label} = {kk}", " ".join(x for x in (f"{s.value.value:.2f}×", s.interval_text) if x),
                            note=s.basis_text))
        if not sp and label == "speedup at k":
            rows.append(Row(f"{label} = {kk}", DASH))
        if label == "speedup at k":
            for verdict, basis in e.verdicts:
                rows.append(Row(f"verdict at k = {kk}", VERDICT_TEXT.get(verdict, verdict.replace("_", " ")),
                                note=f"basis={basis}" if basis else ""))
    if e.drift is not None and not drift_warning(e):  # outside the range: its own warning line instead
        rows.append(Row("cost profile drift", f"{e.drift.value:.2f}",
                        note=f"the profile fits this machine (within {DRIFT_FITS[0]:g}-{DRIFT_FITS[1]:g}) {_labels(e.drift)}".strip()))
    if rec is not None:
        rows.append(Row("recommended k", "0 (speculation off)" if rec_k == 0 else str(rec_k),
                        note=_labels(rec) or "from the speedup estimate"))
        conf = confidence_text(e)
        if conf:
            rows.append(Row("how sure", conf[0], note=conf[1]))
    elif e.withheld:
        rows.append(Row("recommended k", f"withheld ({', '.join(_reason_text(r) for r in e.withheld)})",
                        note="; ".join(WITHHELD_NOTES.get(r, f'specwatch_recommendation_withheld{{reason="{r}"}}')
                                       for r in e.withheld)))
    return rows


def _k_name(k: int) -> str:
    return "off" if k == 0 else f"k={k}"


def confidence_text(e: EngineView) -> tuple[str, str] | None:
    """(text, note) of the recommended k's confidence, read from the exporter's
    specwatch_recommendation_certain and specwatch_recommendation_over_runner_up (the one rule,
    docs/choosing-k.md): ``certain: ahead of k=2 by 1.35× [1.10–1.60]`` or ``best estimate: k=2
    within [0.90–1.30]: cannot tell them apart``; physics when no draft token was accepted in
    the window. None when the exporter serves no confidence (an older exporter)."""
    rec = e.recommended_k
    acc = e.draft_acceptance_rate
    if rec is not None and int(rec.value) == 0 and acc is not None and acc.value == 0.0 and e.certain:
        return "certain: off", "no draft token was accepted in this window: speculation cannot pay"
    if e.certain is None and e.runner_up is None:
        return None
    ru = e.runner_up
    if ru is None:
        return ("certain" if e.certain else "not certain"), "no other candidate"
    iv = format_interval(ru.lower, ru.upper) if ru.lower is not None and ru.upper is not None else "(no interval)"
    if e.certain:
        return "certain", f"ahead of {_k_name(ru.k)} by {format_ratio(ru.ratio)}× {iv}"
    return ("best estimate, not certain",
            f"{_k_name(ru.k)} within {iv} (pick / {_k_name(ru.k)}): cannot tell them apart yet "
            "(more traffic in the window narrows it; so do a baseline upstream and a profile calibrated on this server)")


#: Why the exporter withheld the recommended k, per ``reason`` label of specwatch_recommendation_withheld.
WITHHELD_NOTES = {
    "ragged_drafts": "(an older exporter) the per-position curve is only a lower bound",
    "uncertain": "(an older exporter) the speedup intervals did not tell the candidates apart",
    "invalid_value": "a value derived for this window was not a finite number",
    "no_cost_curve": "the cost profile has no curve for this method/drafter: no what-if speedup per k",
    "default_contradicted": "the built-in default cost disagrees with the measured speedup: not used to pick k",
    "insufficient_data": "too few drafts or steps in the window to decide",
}

#: Text of specwatch_speculation_verdict's ``verdict`` label (the server's current k).
VERDICT_TEXT = {
    "pays": "speculation pays",
    "loses": "speculation loses (slower than without)",
    "cannot_tell": "cannot tell (the interval straddles 1)",
}


def _reason_text(reason: str) -> str:
    return reason.replace("_", " ") or "no reason given"


def ragged_note(e: EngineView) -> str:
    """The ragged-draft label of an engine block, from the exporter's specwatch_ragged_drafts (and
    specwatch_missing_draft_tokens_ratio when served); "" when the drafts were full or unknown."""
    if not e.ragged:
        return ""
    if e.missing_ratio is not None:
        return f"ragged drafts ({pct(e.missing_ratio)} of the k × drafts positions never drafted)"
    return "ragged drafts (fewer than k tokens in some drafts)"


def _window_note(e: EngineView, view: TopView) -> str:
    if e.fell_back:
        return f"no {view.window} values (no drafts in it yet): showing lifetime"
    return f"window {e.window}"


def _upstream_status(u: UpstreamView) -> tuple[str, str]:
    """(text, style) of an upstream's state line."""
    errs = ", ".join(f"{r} {n:g}" for r, n in sorted(u.fetch_errors.items()))
    if u.up is False:
        return (f"DOWN: {u.last_error or 'last fetch failed'}" + (f" (failed fetches: {errs})" if errs else ""),
                "bold red")
    parts = ["up"]
    if u.schema:
        parts.append(f"schema {u.schema}")
    if u.scrape_seconds is not None:
        parts.append(f"scrape {u.scrape_seconds * 1000:.0f} ms")
    parts.append(f"failed fetches: {errs}" if errs else "no fetch errors")
    if u.violations:
        parts.append("invariant violations: " + ", ".join(f"{k} {v:g}" for k, v in sorted(u.violations.items())))
    return " · ".join(parts), "green" if not u.violations else "yellow"


def _no_engine_text(u: UpstreamView) -> str:
    if u.up is False:
        return "no values while the upstream is down (never stale ones)"
    if u.spec_decode_enabled is False:
        return "no speculation: this server runs without --speculative-config"
    return "no spec-decode values served yet"


# ---------------------------------------------------------------------------------------------
# plain text (--once)
# ---------------------------------------------------------------------------------------------


def render_plain(view: TopView, source: str) -> str:
    """The ``--once`` text: one section per upstream and engine, one ``label: value`` per line."""
    out = [f"specwatch top: {source}; window {view.window} (served: {', '.join(view.windows)})"]
    if not view.upstreams:
        out.append("no upstreams served by the exporter")
    for u in view.upstreams:
        status, _ = _upstream_status(u)
        out.append(f"upstream {for_terminal(u.name)}: {status}")
        if not u.engines or u.spec_decode_enabled is False:
            out.append(f"  {_no_engine_text(u)}")
        for e in u.engines:
            out.append(f"  model {for_terminal(e.model_name or DASH)} engine {for_terminal(e.engine or DASH)} "
                       f"({_window_note(e, view)})")  # upstream text: escaped, never raw
            for r in engine_rows(e):
                out.append(f"    {r.label + ':':<31}{r.text}" + (f"  {r.note}" if r.note else ""))
            if drift_warning(e):
                out.append(f"    {drift_warning(e)}")
            if e.positions:
                out.append(f"    {'position':<10}{'acceptance':>12}{'conditional':>13}")
                for p in e.positions:
                    note = position_note(p)
                    out.append(f"    {p.position:<10}{pct(p.rate):>12}{pct(p.conditional):>13}" + (f"  {note}" if note else ""))
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# rich (live)
# ---------------------------------------------------------------------------------------------


def _bar(fraction: float | None, width: int, color: str = "cyan") -> RenderableType:
    if fraction is None:
        return Text("")
    f = min(max(fraction, 0.0), 1.0)
    return Bar(size=1.0, begin=0.0, end=f, width=width, color=color, bgcolor="grey23")


def _engine_panel(u: UpstreamView, e: EngineView, view: TopView, width: int) -> Panel:
    bars = width >= BAR_WIDTH_MIN
    bar_w = max(10, min(40, (width - 50) // 2))
    grid = Table.grid(padding=(0, 1))
    rows = engine_rows(e)
    grid.add_column(style="bold", no_wrap=True, min_width=max(len(r.label) for r in rows))
    grid.add_column(no_wrap=True, min_width=max(len(r.text) for r in rows))
    if bars:
        grid.add_column(no_wrap=True, width=bar_w)
    grid.add_column(style="dim", overflow="fold")  # wraps: a long note is never cut at the panel edge
    for r in rows:
        # Text, not str: "[basis=default]" would be taken for rich markup and vanish
        cells: list[RenderableType] = [Text(r.label), Text(r.text)]
        if bars:
            cells.append(_bar(r.fraction, bar_w))
        cells.append(Text(r.note))
        grid.add_row(*cells)
    parts: list[RenderableType] = [grid]
    if drift_warning(e):
        parts.append(Text(drift_warning(e), style="bold yellow"))
    if e.positions:
        # The labels column must keep its width: shrink the two bars to what is left of the panel
        # (borders 4, pos/r_i/cond. 3 + 6 + 6, padding 2 per column), never the labels.
        note_w = max(len(position_note(p)) for p in e.positions)
        pos_bar_w = max(6, min(bar_w, (width - 4 - 15 - 12 - note_w) // 2))
        pos = Table(box=None, padding=(0, 1), show_edge=False, title_justify="left",
                    title="per-position acceptance (P(0..i accepted)) and conditional (P(i | 0..i-1))"
                    if bars else None)
        pos.add_column("pos", justify="right")
        if bars:
            pos.add_column("acceptance", no_wrap=True)
        pos.add_column("r_i", justify="right")
        if bars:
            pos.add_column("conditional", no_wrap=True)
        pos.add_column("cond.", justify="right")
        pos.add_column("", style="dim", min_width=note_w, overflow="fold")
        for p in e.positions:
            row: list[RenderableType] = [str(p.position)]
            if bars:
                row.append(_bar(None if p.rate is None else p.rate.value, pos_bar_w, "green"))
            row.append(pct(p.rate))
            if bars:
                row.append(_bar(None if p.conditional is None else p.conditional.value, pos_bar_w, "magenta"))
            row.append(pct(p.conditional))
            row.append(Text(position_note(p)))
            pos.add_row(*row)
        parts.append(pos)
        if e.ragged:
            parts.append(Text("ragged drafts: drafts that never proposed position i count as rejections there, "
                              "so r_i is a lower bound of acceptance given the position was drafted", style="yellow"))
    status, style = _upstream_status(u)
    # upstream text: terminal escapes and rich markup in it are shown, never acted on
    title = (f"[bold]{escape(for_terminal(u.name))}[/] · {escape(for_terminal(e.model_name or DASH))} · "
             f"engine {escape(for_terminal(e.engine or DASH))}")
    return Panel(Group(Text(status, style=style), *parts), title=title, title_align="left",
                 subtitle=_window_note(e, view), subtitle_align="right",
                 border_style="red" if u.up is False else "blue")


def _height(block: RenderableType, width: int) -> int:
    """Lines ``block`` takes on a terminal ``width`` columns wide."""
    console = Console(width=width, file=io.StringIO(), force_terminal=True, color_system=None)
    return len(console.render_lines(block, console.options, pad=False))


def fit_blocks(blocks: list[RenderableType], width: int, rows: int) -> tuple[list[RenderableType], str | None]:
    """The blocks that fit whole into ``rows`` lines, in order, and the notice saying how many are
    hidden (None when all fit). When not even the first fits it is shown cropped, and the notice
    says so. The notice is meant to stand above the blocks, where cropping cannot remove it."""
    shown: list[RenderableType] = []
    used = 0
    for b in blocks:
        h = _height(b, width)
        if used + h > rows:
            break
        shown.append(b)
        used += h
    hidden = len(blocks) - len(shown)
    if not hidden:
        return shown, None
    cropped = not shown
    if cropped:
        shown = blocks[:1]
    n = hidden - (1 if cropped else 0)
    text = (f"{n} of {len(blocks)} block{'s' if len(blocks) != 1 else ''} hidden" if n else "")
    if cropped:
        text += ("; " if text else "") + "the block below is cropped"
    return shown, f"{text}: the terminal is too short; make it taller or use --once"


def render_live(view: TopView | None, source: str, width: int, *, error: str | None = None,
                refreshed: str = "", interval: float = 2.0, window: str | None = None,
                height: int | None = None) -> RenderableType:
    """The whole screen for a terminal ``width`` columns wide and ``height`` rows high (None: no
    limit). ``error`` (the source could not be read) replaces the blocks: no stale values are
    shown. Blocks that do not fit into ``height`` are left out and a line says how many."""
    if width < MIN_WIDTH:
        return Text(f"terminal too narrow ({width} columns): specwatch top needs {MIN_WIDTH}; q quits", style="bold")
    head = Text.assemble(("specwatch top", "bold"), f"  {source}  ",
                         ("window ", ""), ((view.window if view else window or DASH), "bold reverse"),
                         f"  refreshed {refreshed} every {interval:g} s" if refreshed else "")
    parts: list[RenderableType] = [head, Text(KEYS_HELP, style="dim")]
    blocks: list[RenderableType] = []
    if error:
        blocks.append(Panel(Text(error, style="bold red"), title="source unreachable", border_style="red"))
    elif view is not None:
        if not view.upstreams:
            blocks.append(Text("the exporter serves no upstreams", style="yellow"))
        for u in view.upstreams:
            if not u.engines or u.spec_decode_enabled is False:
                status, style = _upstream_status(u)
                blocks.append(Panel(Group(Text(status, style=style), Text(_no_engine_text(u), style="dim")),
                                    title=f"[bold]{u.name}[/]", title_align="left",
                                    border_style="red" if u.up is False else "blue"))
            for e in u.engines:
                blocks.append(_engine_panel(u, e, view, width))
    if height is not None:
        rows = height - sum(_height(x, width) for x in parts) - 1  # one line for the notice
        blocks, notice = fit_blocks(blocks, width, rows)
        if notice:
            parts.append(Text(notice, style="bold yellow"))
    return Group(*parts, *blocks)
