"""What the demo checks and shows of a run: what the exporter served after each cell
(:func:`live_measured`), the speculative run's per-position curve, and what Prometheus scraped and
recorded (:data:`PROM_CHECKS`, :func:`withheld_reasons`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import requests
from rich.console import Console
from rich.table import Table

from specwatch.demo.records import RunCurve
from specwatch.common.params import parse_duration
from specwatch.demo.flags import EXPORTER_WINDOWS, PROM_URL, console

def live_measured(exporter_url: str, upstream: str = "spec") -> dict[str, Any]:
    """What the demo's exporter serves right after a cell for the speculative server's own k:
    per window, ``specwatch_speedup`` with its basis and interval (``value``, ``lower``, ``upper``,
    ``basis``, ``k``). ``measured`` is the basis when the baseline upstream had traffic in that
    window (both servers live). ``{"error": …}`` when the exporter cannot be read."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = requests.get(f"{exporter_url}/metrics", timeout=10).text
        fams = list(text_string_to_metric_families(text))
    except (requests.RequestException, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    k_now = None
    vals: dict[str, dict[str, Any]] = {}
    for fam in fams:
        for smp in fam.samples:
            lb = smp.labels
            if lb.get("upstream") != upstream:
                continue
            if smp.name == "specwatch_num_speculative_tokens":
                k_now = str(int(smp.value))
    for fam in fams:
        for smp in fam.samples:
            lb = smp.labels
            if lb.get("upstream") != upstream or smp.name not in ("specwatch_speedup", "specwatch_speedup_lower",
                                                                  "specwatch_speedup_upper"):
                continue
            if k_now is not None and lb.get("k") != k_now:
                continue
            w = vals.setdefault(lb.get("window", "?"), {"k": lb.get("k"), "basis": lb.get("basis")})
            w[{"specwatch_speedup": "value", "specwatch_speedup_lower": "lower",
               "specwatch_speedup_upper": "upper"}[smp.name]] = smp.value
            if smp.name == "specwatch_speedup":
                w["basis"] = lb.get("basis")
    return {"windows": vals}


def live_window(windows: Mapping[str, Any], cell_seconds: float | None) -> str | None:
    """The window to show for a cell that lasted ``cell_seconds``: the shortest served window at
    least as long as the cell (shorter ones miss part of it; every window also holds whatever ran
    before the cell within its length), else the longest served; None when none is served."""
    served = [w for w in EXPORTER_WINDOWS if w in windows]
    if not served:
        return None
    if cell_seconds is None:
        return served[0]
    secs = {w: parse_duration(w) for w in served}
    return next((w for w in served if secs[w] >= cell_seconds), served[-1])


def _print_live(wl: str, conc: int, live: dict[str, Any], con: Console) -> None:
    """One line: what the exporter served right after the cell just measured, in the shortest
    window covering the cell (:func:`live_window`), which may also hold the end of the previous
    cell: the client's paired ratio in the decision table is the cell's own."""
    wins = live.get("windows") or {}
    name = live_window(wins, live.get("cell_seconds"))
    if name is None:
        con.print(f"  exporter after {wl} c={conc}: no speedup served" + (f" ({live['error']})" if "error" in live else ""))
        return
    w = wins[name]
    iv = "" if w.get("lower") is None or w.get("upper") is None else f" [{w['lower']:.2f}–{w['upper']:.2f}]"
    con.print(f"  exporter after {wl} c={conc} ({live.get('cell_seconds', '?')} s): live speedup at k={w.get('k')} "
              f"{w.get('value', float('nan')):.2f}×{iv} basis={w.get('basis')}, window {name} (it may hold the end of the "
              "previous cell; the cell's own paired ratio is in the table at the end)")


def _print_per_position(curve: RunCurve, k: int, con: Console | None = None) -> None:
    """The speculative run's per-position acceptance with E(k) for every smaller k (:func:`_spec_curve`)."""
    con = console if con is None else con
    t = Table(title=f"per-position acceptance (speculative server, k={k}, whole run)")
    for col in ("position / k", "acceptance r_i", "conditional", "expected acceptance length E(k)"):
        t.add_column(col, justify="right")
    for i, r in enumerate(curve.per_position_acceptance_rate):
        cond = curve.conditional_acceptance_rate[i]
        t.add_row(f"{i} / k={i + 1}", f"{r:.1%}", "-" if cond is None else f"{cond:.1%}",
                  f"{curve.expected_acceptance_length_by_k[str(i + 1)]:.2f}")
    con.print(t)
    con.print(f"draft acceptance rate {curve.draft_acceptance_rate:.1%}, mean acceptance length "
              f"{curve.mean_acceptance_length:.2f} tokens per verify step")


PROM_CHECKS = {
    "exporter: lifetime draft acceptance rate (spec)":
        'specwatch_draft_acceptance_rate{upstream="spec",window="lifetime"}',
    "exporter: 1m mean acceptance length (spec)": 'specwatch_mean_acceptance_length{upstream="spec",window="1m"}',
    "exporter: recommended k (spec, 5m)": 'specwatch_recommended_num_speculative_tokens{upstream="spec",window="5m"}',
    "rule: 5m draft acceptance rate (model)": "model_name:specwatch_draft_acceptance_rate:ratio_rate5m",
    "rule: 5m mean acceptance length (model)": "model_name:specwatch_mean_acceptance_length:ratio_rate5m",
}


#: The reason the exporter gives when it serves no recommended k (``specwatch_recommendation_withheld``).
WITHHELD_QUERY = 'specwatch_recommendation_withheld{upstream="spec",window="5m"} == 1'
#: What each reason means, said where the demo's Prometheus check shows no recommended k.
WITHHELD_REASONS = {
    "insufficient_data": "too few engine steps or drafts in the 5m window",
    "no_cost_curve": "the cost profile has no curve for this method and drafter",
    "default_contradicted": "no profile, and the built-in guess disagrees with the live speedup",
}


def withheld_reasons(url: str = PROM_URL) -> list[str]:
    """The ``reason`` labels of :data:`WITHHELD_QUERY` at the demo's Prometheus (``url``): why the
    exporter served no recommended k for the speculative server (empty when it served one, or when
    Prometheus cannot be read)."""
    try:
        r = requests.get(f"{url}/api/v1/query", params={"query": WITHHELD_QUERY}, timeout=10).json()
        return sorted({str(x["metric"].get("reason", "?")) for x in r["data"]["result"]})
    except (requests.RequestException, KeyError, ValueError, TypeError, AttributeError):
        return []


def _withheld_text(reasons: list[str]) -> str:
    """The table cell for a withheld recommended k: each reason and what it means."""
    if not reasons:
        return "(none: the exporter withheld it; specwatch top says why)"
    return "(withheld: " + "; ".join(f"{r}: {WITHHELD_REASONS[r]}" if r in WITHHELD_REASONS else r
                                     for r in reasons) + ")"


def _wait_scraped_up(upstream: str, timeout: float = 45.0, *, url: str = PROM_URL) -> None:
    """Wait until the Prometheus at ``url`` has scraped the exporter seeing ``upstream`` up (at most
    ``timeout`` s): the exporter's windows and the 5m rate rules need a sample from before the traffic."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = requests.get(f"{url}/api/v1/query",
                             params={"query": f'specwatch_up{{upstream="{upstream}"}} == 1'}, timeout=5).json()
            if r["data"]["result"]:
                return
        except (requests.RequestException, KeyError, ValueError):
            pass
        time.sleep(1)


def _query_prometheus(min_wait: float = 16.0, max_wait: float = 60.0, *, url: str = PROM_URL) -> dict[str, list[float]]:
    """Instant values of :data:`PROM_CHECKS` from the demo's Prometheus (at ``url``): after at least one more
    scrape and rule evaluation (15 s) since the last traffic, and until every check has data
    (a short run may need a second evaluation of the 5m rate rules) or ``max_wait`` s passed."""
    t0 = time.monotonic()
    time.sleep(min_wait)
    while True:
        got: dict[str, list[float]] = {}
        for q in PROM_CHECKS.values():
            try:
                r = requests.get(f"{url}/api/v1/query", params={"query": q}, timeout=10).json()
                got[q] = [float(x["value"][1]) for x in r["data"]["result"]]
            except (requests.RequestException, KeyError, ValueError):
                got[q] = []
        if all(got.values()) or time.monotonic() - t0 > max_wait:
            return got
        time.sleep(3)


def _print_prometheus_check(got: dict[str, list[float]], con: Console | None = None,
                            withheld: list[str] | None = None) -> None:
    """Show that Prometheus scraped the exporter and evaluated the recording rules (:func:`_query_prometheus`'s
    values); ``withheld``: the exporter's reasons for serving no recommended k (:func:`withheld_reasons`)."""
    con = console if con is None else con
    t = Table(title="what Prometheus held at the end of the speculative run")
    t.add_column("series")
    t.add_column("value", justify="right")
    for label, q in PROM_CHECKS.items():
        vals = got.get(q, [])
        t.add_row(label, ", ".join(f"{v:.3f}" for v in vals)
                  or (_withheld_text(withheld or []) if "recommended" in label else "(no data)"))
    con.print(t)
