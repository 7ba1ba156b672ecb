"""specwatch top: the view model on real captures, the renderers, bad input, and the live view
driven in a real terminal (tmux) against an exporter serving real captures and against a vLLM
upstream that goes down and comes back.

The exporter is the real one (SpecwatchCollector + serve's WSGI app) on 127.0.0.1, fed real
/metrics captures of vLLM 0.32 (tests/fixtures/metrics) by an injected fetcher; the "upstream" is
a plain HTTP server on 127.0.0.1 serving a real capture.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from click.testing import CliRunner
from prometheus_client import generate_latest
from prometheus_client.exposition import ThreadingWSGIServer

import realstack
from exporter_helpers import FetchError, fixture, make_exporter, raw_samples, raw_value, real_fixtures
from specwatch.exporter.app import make_app
from specwatch.top.cli import top
from specwatch.top.model import build_view, parse_exposition
from specwatch.top.render import MIN_WIDTH, engine_rows, pct, render_live, render_plain

REPO = Path(__file__).resolve().parents[2]
K4_BEFORE, K4_AFTER = "vllm-0.32-ngram-k4-before-traffic-constructed", "vllm-0.32-ngram-k4-after-traffic.txt"


def _partial_counters(text: str, drafts: float = 0.45, accepted: float = 0.4) -> str:
    """A body of the same server process part-way through the traffic, CONSTRUCTED from a real
    capture: drafts and draft tokens at ``drafts`` of their final values, accepted tokens (total
    and per position) at ``accepted`` of theirs (vLLM's invariants still hold, before and over the
    increase). The window's acceptance then differs from the lifetime's."""
    import re

    def scale(m):
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        f = accepted if "accepted" in name else drafts
        return f"{name}{labels} {value * f!r}"

    return re.sub(r"^(vllm:spec_decode_num_(?:drafts|draft_tokens|accepted_tokens|accepted_tokens_per_pos)_total)"
                  r"(\{[^}]*\})? ([0-9.e+]+)$", scale, text, flags=re.M)


class SequenceFetcher:
    """Returns ``bodies[upstream][i]`` on the i-th fetch of that upstream, then the last one."""

    def __init__(self, bodies: dict[str, list]):
        self.bodies, self.n = bodies, {}

    def __call__(self, upstream, timeout, max_bytes):
        seq = self.bodies[upstream.name]
        i = self.n.get(upstream.name, 0)
        self.n[upstream.name] = i + 1
        body = seq[min(i, len(seq) - 1)]
        if isinstance(body, Exception):
            raise body
        return body


def two_scrapes(bodies_before: dict, bodies_after: dict, windows=("1m", "5m")) -> str:
    """Exposition text of an exporter after two scrapes 30 s apart (windows = the increase)."""
    reg, fetcher, clock = make_exporter(bodies_before, windows=windows)
    generate_latest(reg)
    fetcher.bodies.update(bodies_after)
    clock.t += 30
    return generate_latest(reg).decode()


def value(text: str, name: str, **labels) -> float | None:
    got = [v for n, lab, v in raw_samples(text) if n == name and all(lab.get(k) == str(x) for k, x in labels.items())]
    assert len(got) <= 1
    return got[0] if got else None


# ---------------------------------------------------------------------------------------------
# the view model and the renderers
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", real_fixtures(), ids=lambda p: p.name)
@pytest.mark.parametrize("window", ["1m", "lifetime"])
def test_view_shows_what_the_exporter_serves_for_every_real_capture(path, window):
    fresh = path.name.replace("after-traffic", "fresh").replace("after-restart", "fresh")
    text = two_scrapes({"u": fixture(fresh if (path.parent / fresh).exists() else path.name)}, {"u": path.read_text()})
    view = build_view(parse_exposition(text), window)
    (u,) = view.upstreams
    assert u.up is True
    assert [u.schema] == [lab["schema"] for n, lab, _ in raw_samples(text) if n == "specwatch_upstream_info"]
    if "nospec" in path.name:
        # no speculation: no acceptance values (a block may still show the engine's step time)
        assert u.spec_decode_enabled is False and all(not e.positions and e.draft_acceptance_rate is None for e in u.engines)
        assert "no speculation" in render_plain(view, "t")
        return
    (e,) = u.engines
    used = e.window
    assert used == window or (e.fell_back and used == "lifetime")
    lab = dict(upstream="u", model_name="smollm2", engine="0", window=used)
    for field_name, metric in (("draft_acceptance_rate", "specwatch_draft_acceptance_rate"),
                               ("mean_acceptance_length", "specwatch_mean_acceptance_length"),
                               ("effective_k", "specwatch_draft_tokens_per_draft"),
                               ("recommended_k", "specwatch_recommended_num_speculative_tokens")):
        served = value(text, metric, **lab)
        got = getattr(e, field_name)
        assert (got.value if got else None) == served, field_name
    assert e.num_speculative_tokens == value(text, "specwatch_num_speculative_tokens", upstream="u")
    for p in e.positions:
        assert p.rate.value == value(text, "specwatch_position_acceptance_rate", position=p.position, **lab)
        assert p.conditional.value == value(text, "specwatch_position_conditional_acceptance_rate",
                                            position=p.position, **lab)
    k = e.num_speculative_tokens
    served = value(text, "specwatch_speedup", k=k, **lab)
    assert [s.value.value for s in e.speedup_at(k)] == ([] if served is None else [served])
    # running requests: the exporter's window mean of the gauge (not served for lifetime: unknown, not 0)
    served_running = value(text, "specwatch_running_requests", **lab)
    assert e.running == served_running
    plain = render_plain(view, "t")
    # the ragged-draft label and the withheld k are the exporter's series, shown as served
    ragged = value(text, "specwatch_ragged_drafts", **lab)
    assert e.ragged == (ragged == 1.0) and ("ragged drafts" in plain) == (ragged == 1.0)
    served_reasons = tuple(sorted(r for r in ("uncertain", "insufficient_data", "no_cost_curve", "default_contradicted")
                                  if value(text, "specwatch_recommendation_withheld", reason=r, **lab) == 1.0))
    assert e.withheld == served_reasons
    assert ("recommended k" in plain and "withheld (" in plain) == bool(served_reasons) or not served_reasons
    if e.draft_acceptance_rate:
        assert pct(e.draft_acceptance_rate) in plain


K8_FRESH, K8_AFTER = "vllm-0.32-ngram-k8-fresh.txt", "vllm-0.32-ngram-k8-after-traffic.txt"


def _live_text(view, width: int = 130, height: int | None = None) -> str:
    from rich.console import Console

    con = Console(width=width, record=True, force_terminal=True, color_system=None)
    con.print(render_live(view, "t", width, refreshed="12:00:00", height=height))
    return con.export_text()


def _set(text: str, name: str, window: str, new: str) -> str:
    """``text`` with the value of the one ``name{…window=…}`` sample replaced by ``new``."""
    pattern = re.compile(rf'^({re.escape(name)}\{{[^}}]*window="{window}"[^}}]*\}}) \S+$', re.M)
    out, n = pattern.subn(rf"\g<1> {new}", text)
    assert n == 1, (name, window, n)
    return out


def test_ragged_label_and_withheld_k_follow_the_exporters_series():
    """top shows what the exporter says about ragged drafts (specwatch_ragged_drafts, with its
    tolerance of max(1, 0.5 % of drafts) missing tokens) and the recommended k it withheld; it
    applies no threshold of its own."""
    # the real k8 capture through the exporter: drafts 2 % short, so the curve is a lower bound
    text = two_scrapes({"u": fixture(K8_FRESH)}, {"u": fixture(K8_AFTER)})
    for window in ("1m", "lifetime"):
        lab = dict(upstream="u", model_name="smollm2", engine="0", window=window)
        assert value(text, "specwatch_ragged_drafts", **lab) == 1.0
        # ragged is no blanket reason any more: the decision is withheld only when uncertain
        assert value(text, "specwatch_recommendation_withheld", reason="ragged_drafts", **lab) is None
        withheld = value(text, "specwatch_recommendation_withheld", reason="uncertain", **lab) == 1.0
        assert withheld == (value(text, "specwatch_recommended_num_speculative_tokens", **lab) is None)
        view = build_view(parse_exposition(text), window)
        e = view.upstreams[0].engines[0]
        assert e.window == window and e.ragged and e.withheld == (("uncertain",) if withheld else ())
        plain = render_plain(view, "t")
        missing = pct(value(text, "specwatch_missing_draft_tokens_ratio", **lab))
        assert f"ragged drafts ({missing} of the k × drafts positions never drafted)" in plain
        if withheld:
            assert re.search(r"recommended k: +withheld", plain), plain
        live = _live_text(view)
        assert "ragged drafts: drafts that never proposed" in live

    # k4: full drafts. A synthetic exposition where draft tokens per draft is 3.99 (below k - 0.005)
    # but the exporter says the drafts were full (its tolerance): no ragged label
    text = two_scrapes({"u": _partial_counters(fixture(K4_AFTER))}, {"u": fixture(K4_AFTER)})
    assert value(text, "specwatch_ragged_drafts", upstream="u", window="1m") == 0.0
    full = _set(text, "specwatch_draft_tokens_per_draft", "1m", "3.99")
    view = build_view(parse_exposition(full), "1m")
    e = view.upstreams[0].engines[0]
    assert e.num_speculative_tokens == 4 and e.effective_k.value == 3.99 and not e.ragged
    assert "ragged" not in render_plain(view, "t") and "ragged" not in _live_text(view)
    # and the other way round: full-looking drafts (4.00 per draft) that the exporter calls ragged
    ragged = _set(_set(text, "specwatch_draft_tokens_per_draft", "1m", "4.0"), "specwatch_ragged_drafts", "1m", "1.0")
    view = build_view(parse_exposition(ragged), "1m")
    assert view.upstreams[0].engines[0].ragged
    assert "ragged drafts (" in render_plain(view, "t") and "ragged drafts: drafts that never proposed" in _live_text(view)
    # an exporter without specwatch_ragged_drafts: the per-position basis label says it
    old = re.sub(r"^specwatch_ragged_drafts\{.*\n", "", text, flags=re.M)
    old = old.replace('basis="exact"', 'basis="lower_bound"')
    e = build_view(parse_exposition(old), "1m").upstreams[0].engines[0]
    assert e.ragged_drafts is None and e.ragged


def test_windows_differ_and_fall_back_to_lifetime():
    text = two_scrapes({"spec": _partial_counters(fixture(K4_AFTER))}, {"spec": fixture(K4_AFTER)})
    one = build_view(parse_exposition(text), "1m").upstreams[0].engines[0]
    life = build_view(parse_exposition(text), "lifetime").upstreams[0].engines[0]
    assert one.window == "1m" and life.window == "lifetime"
    assert one.draft_acceptance_rate.value == value(text, "specwatch_draft_acceptance_rate", window="1m")
    assert life.draft_acceptance_rate.value == value(text, "specwatch_draft_acceptance_rate", window="lifetime")
    assert one.draft_acceptance_rate.value != life.draft_acceptance_rate.value  # the increase, not the total
    # a window the exporter does not serve shows lifetime, and says so
    other = build_view(parse_exposition(text), "30s").upstreams[0].engines[0]
    assert other.fell_back and other.window == "lifetime"
    assert "no 30s values (no drafts in it yet): showing lifetime" in render_plain(build_view(parse_exposition(text), "30s"), "t")


def test_basis_labels_and_new_series_names_are_shown_generically():
    """Series other engineers add (specwatch_speedup{basis}, specwatch_step_duration_seconds,
    per-position basis) are shown with their labels; the old name still works beside them."""
    text = two_scrapes({"spec": _partial_counters(fixture(K4_AFTER))}, {"spec": fixture(K4_AFTER)})
    lab = 'engine="0",model_name="smollm2",upstream="spec",window="1m"'
    extra = (
        "# TYPE specwatch_speedup gauge\n"
        f'specwatch_speedup{{{lab},k="4",basis="measured"}} 1.7\n'
        f'specwatch_speedup{{{lab},k="2",basis="extrapolated"}} 1.3\n'
        "# TYPE specwatch_step_duration_seconds gauge\n"
        'specwatch_step_duration_seconds{upstream="spec",window="1m"} 0.0123\n'
    )
    text = text.replace('specwatch_position_acceptance_rate{basis="exact",engine="0",model_name="smollm2",position="3",'
                        'upstream="spec",window="1m"}',
                        'specwatch_position_acceptance_rate{basis="lower_bound",engine="0",model_name="smollm2",position="3",'
                        'upstream="spec",window="1m"}')
    text = text.replace("# HELP specwatch_recommended", extra + "# HELP specwatch_recommended")
    text = text.replace("# HELP specwatch_recommended", (
        "# TYPE specwatch_running_requests gauge\n"
        f'specwatch_running_requests{{{lab}}} 3.5\n'
        f'specwatch_running_requests{{{lab.replace("1m", "lifetime")}}} 1.25\n') + "# HELP specwatch_recommended")
    view = build_view(parse_exposition(text), "1m")
    e = view.upstreams[0].engines[0]
    assert e.running == 3.5 and e.waiting is None  # the 1m mean, not the lifetime one
    assert build_view(parse_exposition(text), "lifetime").upstreams[0].engines[0].running == 1.25
    assert {(s.metric, s.k, s.basis_text) for s in e.speedup_at(4)} == {
        ("specwatch_speedup", 4, "basis=measured"), ("specwatch_speedup", 4, "basis=default")}
    assert [v.value for v in e.step_time] == [0.0123]
    assert e.positions[3].rate.extra == (("basis", "lower_bound"),)
    plain = render_plain(view, "t")
    assert "12.3 ms" in plain and "basis=measured" in plain and "[basis=lower_bound]" in plain
    # and their absence is no error (the plain exporter output above had none)
    assert "not served by the exporter" in render_plain(build_view(parse_exposition(two_scrapes(
        {"spec": _partial_counters(fixture(K4_AFTER))}, {"spec": fixture(K4_AFTER)})), "1m"), "t")


# ---------------------------------------------------------------------------------------------
# issue #25: rounding, notes, labels once, nothing cut; intervals, verdict and drift (the series the
# exporter serves after the cost-uncertainty work: constructed here beside a real capture)
# ---------------------------------------------------------------------------------------------

LAB_1M = 'engine="0",model_name="smollm2",upstream="spec",window="1m"'


def _k4_text() -> str:
    """The exporter's exposition after two scrapes of the real k = 4 captures (1m = the increase)."""
    return two_scrapes({"spec": _partial_counters(fixture(K4_AFTER))}, {"spec": fixture(K4_AFTER)})


def _with_series(text: str, *blocks: str) -> str:
    """``text`` with exposition ``blocks`` (``# TYPE`` line + samples) inserted before the
    recommended-k family (the parser needs each family's samples together)."""
    return text.replace("# HELP specwatch_recommended", "".join(blocks) + "# HELP specwatch_recommended", 1)


def _uncertainty_series(drift: float, verdict: str = "pays", withheld: str | None = None) -> tuple[str, ...]:
    """The series the exporter serves with a cost profile's intervals (names and labels as the
    lead's exporter change defines them): a calibrated k = 4 speedup with its interval, a profile
    what-if at k = 2 with its interval, the drift, the verdict, and optionally a withheld reason."""
    sp = lambda k, b: f'{LAB_1M},k="{k}",basis="{b}"'
    out = [
        "# TYPE specwatch_speedup gauge\n"
        f"specwatch_speedup{{{sp(4, 'calibrated')}}} 2.3125\nspecwatch_speedup{{{sp(2, 'profile')}}} 1.5\n",
        "# TYPE specwatch_speedup_lower gauge\n"
        f"specwatch_speedup_lower{{{sp(4, 'calibrated')}}} 2.05\nspecwatch_speedup_lower{{{sp(2, 'profile')}}} 1.21\n",
        "# TYPE specwatch_speedup_upper gauge\n"
        f"specwatch_speedup_upper{{{sp(4, 'calibrated')}}} 2.6\nspecwatch_speedup_upper{{{sp(2, 'profile')}}} 1.84\n",
        "# TYPE specwatch_cost_profile_error_ratio gauge\n"
        f'specwatch_cost_profile_error_ratio{{{LAB_1M},basis="calibrated"}} {drift}\n',
        "# TYPE specwatch_speculation_verdict gauge\n"
        f'specwatch_speculation_verdict{{{LAB_1M},basis="calibrated",verdict="{verdict}"}} 1.0\n',
    ]
    if withheld:
        out.append("# TYPE specwatch_recommendation_withheld gauge\n"
                   f'specwatch_recommendation_withheld{{{LAB_1M},reason="{withheld}"}} 1.0\n')
    return tuple(out)


def test_window_mean_of_running_requests_is_rounded_and_its_note_names_the_exporter():
    """Issue #25: ``running 1.52632``. The exporter's window mean is shown with one decimal, a
    whole number without one, and the note says where it came from (never "--upstream")."""
    text = _with_series(_k4_text(), f"# TYPE specwatch_running_requests gauge\nspecwatch_running_requests{{{LAB_1M}}} 1.5263157894736843\n")
    view = build_view(parse_exposition(text), "1m")
    plain, live = render_plain(view, "t"), _live_text(view, 160)
    for out in (plain, live):
        assert "running 1.5 · waiting –" in out and "1.526" not in out
        assert "mean of vllm:num_requests_running over the window" in out and "--upstream" not in out
    whole = _with_series(_k4_text(), f"# TYPE specwatch_running_requests gauge\nspecwatch_running_requests{{{LAB_1M}}} 3.0\n")
    assert "running 3 · waiting –" in render_plain(build_view(parse_exposition(whole), "1m"), "t")


def test_exporter_mode_without_request_gauges_does_not_point_at_upstream_mode():
    """Issue #25: in exporter mode the requests row said "not served by the exporter (--upstream
    reads vLLM's gauges)". It now says only that the window has none."""
    for path in ("golden",):
        text = (REPO / "tests/fixtures/golden/exporter-k4-after-traffic.prom").read_text() if path == "golden" else ""
        view = build_view(parse_exposition(text), "lifetime")
        for out in (render_plain(view, "t"), _live_text(view, 160)):
            assert "--upstream" not in out
            assert re.search(r"requests:? +running – · waiting – +not served for this window", out), out


def test_lower_bound_label_is_printed_once_per_position_row():
    """Issue #25: ``[basis=lower_bound] [basis=lower_bound]`` on every row of ``--once`` (one for
    the rate, one for the conditional rate). The real ragged k = 8 capture through the exporter."""
    text = two_scrapes({"u": fixture(K8_FRESH)}, {"u": fixture(K8_AFTER)}).replace('basis="exact"', 'basis="lower_bound"')
    view = build_view(parse_exposition(text), "1m")
    rows = [ln for ln in render_plain(view, "t").splitlines() if re.match(r"\s+\d+\s+[\d.]+ %", ln)]
    assert len(rows) == 8
    assert all(ln.count("[basis=lower_bound]") == 1 for ln in rows), rows
    live_rows = [ln for ln in _live_text(view, 160).splitlines() if "lower_bound" in ln]
    assert live_rows and all(ln.count("[basis=lower_bound]") == 1 for ln in live_rows), live_rows


def _squash(text: str) -> str:
    return re.sub(r"[\s│╭╮╰╯─]", "", text)


@pytest.mark.parametrize("width", [160, 130, 100])
def test_no_note_is_cut_at_the_panel_edge(width):
    """Issue #25: at 160 columns the right (note) column was cut with "…". Every note of every
    row is now shown whole (wrapped), with the longest notes top has: the new withheld reasons,
    a verdict, a drift warning."""
    for reason in ("uncertain", "no_cost_curve", "default_contradicted", "insufficient_data"):
        text = _with_series(_k4_text(), *_uncertainty_series(2.25, "cannot_tell", withheld=reason))
        text = re.sub(r"^specwatch_recommended_num_speculative_tokens\{.*\n", "", text, flags=re.M)
        view = build_view(parse_exposition(text), "1m")
        out = _live_text(view, width)
        assert "…" not in out, out
        assert all(len(ln) <= width for ln in out.splitlines())
        squashed = _squash(out)
        for r in engine_rows(view.upstreams[0].engines[0]):
            assert _squash(r.note) in squashed, (r.note, out)
        assert f"withheld ({reason.replace('_', ' ')})" in out


def test_speedups_show_their_interval_verdict_and_drift():
    """Beside every speedup the exporter serves with an interval (specwatch_speedup_lower/_upper,
    same labels) top shows it; the verdict at the current k; the drift as a warning line when it is
    outside 0.8-1.25 and as a plain row inside. A real capture through the exporter plus those series."""
    text = _with_series(_k4_text(), *_uncertainty_series(2.25))
    text = _set(text, "specwatch_recommended_num_speculative_tokens", "1m", "2.0")
    view = build_view(parse_exposition(text), "1m")
    e = view.upstreams[0].engines[0]
    cal = next(s for s in e.speedup_at(4) if s.basis_text == "basis=calibrated")
    assert (cal.value.value, cal.lower, cal.upper) == (2.3125, 2.05, 2.6)
    default = next(s for s in e.speedup_at(4) if s.basis_text == "basis=default")
    # the exporter serves the built-in guess with its factor-2 interval: shown as served
    assert default.lower is not None and default.upper / default.lower == pytest.approx(4.0) and default.interval_text
    assert e.drift.value == 2.25 and e.verdicts == (("pays", "calibrated"),)
    warning = "drift 2.25: the cost profile does not fit this machine (its step times are 2.25x off); intervals widened"
    plain = render_plain(view, "t")
    assert re.search(r"speedup at k = 4: +2\.31× \[2\.05-2\.60\] +basis=calibrated", plain), plain
    assert re.search(r"speedup at k = 4: +\d\.\d\d× \[[0-9.]+-[0-9.]+\] +basis=default", plain), plain
    assert re.search(r"speedup at recommended k = 2: +1\.50× \[1\.21-1\.84\] +basis=profile", plain), plain
    assert re.search(r"verdict at k = 4: +speculation pays +basis=calibrated", plain), plain
    assert plain.count(warning) == 1 and "cost profile drift" not in plain
    live = _live_text(view, 160)
    assert "2.31× [2.05-2.60]" in live and "1.50× [1.21-1.84]" in live and warning in live
    # a drift below 1 is as far off the other way; inside 0.8-1.25 it is a row, no warning
    low = build_view(parse_exposition(_with_series(_k4_text(), *_uncertainty_series(0.5, "loses"))), "1m")
    assert "drift 0.50: the cost profile does not fit this machine (its step times are 2.00x off)" in render_plain(low, "t")
    assert "speculation loses" in render_plain(low, "t")
    fits = build_view(parse_exposition(_with_series(_k4_text(), *_uncertainty_series(1.1, "cannot_tell"))), "1m")
    out = render_plain(fits, "t")
    assert "does not fit" not in out and re.search(r"cost profile drift: +1\.10 +the profile fits", out), out
    assert "cannot tell (the interval straddles 1)" in out


def test_down_and_nospec_upstreams_and_narrow_terminals():
    from rich.console import Console

    text = two_scrapes({"spec": _partial_counters(fixture(K4_AFTER)), "plain": fixture("vllm-0.32-nospec-fresh.txt"),
                        "gone": FetchError("connect", "connection failed: ConnectionError")},
                       {"spec": fixture(K4_AFTER)})
    view = build_view(parse_exposition(text), "1m", errors={"gone": "connect: connection failed"})
    by = {u.name: u for u in view.upstreams}
    assert by["gone"].up is False and by["gone"].engines == () and view.any_down
    assert by["gone"].last_error == "connect: connection failed"
    assert by["gone"].fetch_errors == {"connect": value(text, "specwatch_upstream_fetch_errors_total", upstream="gone")}
    assert by["plain"].spec_decode_enabled is False
    plain = render_plain(view, "t")
    assert "upstream gone: DOWN: connect: connection failed" in plain
    assert "no values while the upstream is down" in plain
    for width in (160, 80, 50, MIN_WIDTH, 20):
        con = Console(width=width, record=True, force_terminal=True, color_system=None)
        con.print(render_live(view, "t", width, refreshed="12:00:00"))
        out = con.export_text()
        assert all(len(line) <= width for line in out.splitlines())
        if width < MIN_WIDTH:
            assert "terminal too narrow" in out
        else:
            assert "DOWN" in out and pct(by["spec"].engines[0].draft_acceptance_rate) in out
    # the source itself unreachable: the error, and no stale values
    con = Console(width=100, record=True, color_system=None)
    con.print(render_live(view, "t", 100, error="cannot read the exporter at X: connect: refused"))
    out = con.export_text()
    assert "cannot read the exporter" in out and "%" not in out


def test_a_short_terminal_says_how_many_blocks_are_hidden():
    text = two_scrapes({"spec": _partial_counters(fixture(K4_AFTER)), "plain": fixture("vllm-0.32-nospec-fresh.txt"),
                        "gone": FetchError("connect", "connection failed: ConnectionError")},
                       {"spec": fixture(K4_AFTER)})
    view = build_view(parse_exposition(text), "1m")
    tall = _live_text(view, 100)
    blocks = tall.count("╭")  # one top border per block: spec, plain (no speculation; and its step-time block), gone
    assert blocks >= 3 and "hidden" not in tall and "cropped" not in tall
    assert _live_text(view, 100, height=len(tall.splitlines()) + 1) == tall  # everything fits: nothing hidden
    for height in (len(tall.splitlines()) - 1, 20, 8):  # the last block does not fit; the first does not
        out = _live_text(view, 100, height=height)
        lines = out.splitlines()
        assert len(lines) <= height or "cropped" in out  # only a block taller than the screen is cropped (by Live)
        shown = out.count("╭")
        m = re.search(rf"(\d+) of {blocks} blocks hidden", out)
        hidden = int(m.group(1)) if m else 0
        if "the block below is cropped" in out:
            assert shown == 1 and hidden == blocks - 1
        else:
            assert hidden and shown + hidden == blocks, out
        assert "the terminal is too short" in lines[2]  # right under the header: never cropped away


def test_engine_rows_say_unknown_not_zero():
    text = two_scrapes({"spec": fixture("vllm-0.32-ngram-k4-fresh.txt")}, {"spec": fixture("vllm-0.32-ngram-k4-fresh.txt")})
    e = build_view(parse_exposition(text), "lifetime").upstreams[0].engines[0]
    rows = {r.label: r.text for r in engine_rows(e)}
    assert rows["draft acceptance rate"] == "–" and rows["mean acceptance length"] == "–"
    assert e.num_speculative_tokens == 4


# ---------------------------------------------------------------------------------------------
# servers on 127.0.0.1 for the command tests
# ---------------------------------------------------------------------------------------------


class _Quiet(WSGIRequestHandler):
    def log_message(self, *a):
        pass


class ExporterServer:
    """The real exporter app serving real captures through an injected fetcher."""

    def __init__(self, bodies: dict[str, list], windows=("1m", "5m")):
        from prometheus_client import CollectorRegistry

        from specwatch.exporter.collector import SpecwatchCollector
        from specwatch.exporter.config import build_config

        cfg = build_config([f"{n}=http://127.0.0.1:9/{n}" for n in bodies], windows, "127.0.0.1:1")
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SpecwatchCollector(cfg, fetch=SequenceFetcher(bodies)))
        self.httpd = make_server("127.0.0.1", 0, make_app(cfg, self.registry), ThreadingWSGIServer, handler_class=_Quiet)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/metrics"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class BodyServer:
    """A plain HTTP server on 127.0.0.1:``port`` answering every GET with ``body`` (a vLLM /metrics
    capture, or an HTML page); ``stop()`` and ``start()`` again on the same port."""

    def __init__(self, body: str, port: int = 0, content_type: str = "text/plain; version=0.0.4"):
        self.body, self.port, self.content_type = body.encode(), port, content_type
        self.httpd = None
        self.start()

    def start(self):
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", outer.content_type)
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *a):
                pass

        http.server.ThreadingHTTPServer.allow_reuse_address = True
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), H)
        self.port = self.httpd.server_port
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def exporter_server():
    srv = ExporterServer({"spec": [_partial_counters(fixture(K4_AFTER)), fixture(K4_AFTER)],
                          "baseline": [fixture("vllm-0.32-nospec-after-traffic.txt")]})
    yield srv
    srv.close()


# ---------------------------------------------------------------------------------------------
# the command: --once, bad input
# ---------------------------------------------------------------------------------------------


def test_once_against_the_exporter(exporter_server):
    r = CliRunner().invoke(top, ["--exporter", exporter_server.url, "--once", "--window", "lifetime"])
    assert r.exit_code == 0, r.output
    assert "upstream spec: up · schema v1" in r.output and "upstream baseline: up · schema none" in r.output
    # the exporter's first scrape saw the part-way body: accepted / draft tokens of it
    body = _partial_counters(fixture(K4_AFTER))
    rate = raw_value(body, "vllm:spec_decode_num_accepted_tokens_total") / raw_value(body, "vllm:spec_decode_num_draft_tokens_total")
    assert re.search(rf"draft acceptance rate: +{re.escape(pct(rate))}", r.output), r.output
    assert "Traceback" not in r.output


def test_once_against_upstreams_reads_request_gauges_and_reports_down():
    up = BodyServer(fixture(K4_AFTER))
    try:
        r = CliRunner().invoke(top, ["--upstream", f"spec={up.url}", "--upstream", "gone=http://127.0.0.1:9",
                                     "--once"])
    finally:
        up.stop()
    assert r.exit_code == 1, r.output  # an upstream is down: printed, and the exit status says so
    assert "upstream spec: up · schema v1" in r.output
    assert "running 0 · waiting 0" in r.output  # vLLM's own gauges, read from the upstream
    assert "upstream gone: DOWN: connect: connection failed" in r.output
    assert "no 1m values (no drafts in it yet): showing lifetime" in r.output


def test_once_shows_the_uncertain_k_with_its_confidence_on_the_real_k8_capture(tmp_path):
    """The real k8 capture (ragged drafts, no profile: factor-2 guesses): through the exporter and
    in --upstream mode (the collector in-process), the recommended k is the best estimate, served
    with how sure it is (not certain, the runner-up named), never "withheld (uncertain)" (#36)."""
    srv = ExporterServer({"spec": [fixture(K8_AFTER)]})
    try:
        r = CliRunner().invoke(top, ["--exporter", srv.url, "--once", "--window", "lifetime"])
    finally:
        srv.close()
    assert r.exit_code == 0, r.output
    assert "withheld" not in r.output
    assert re.search(r"recommended k: +[1-8]  \[basis=default\]", r.output), r.output
    assert re.search(r"how sure: +best estimate, not certain +(off|k=[1-8]) within \[[0-9.]+–[0-9.]+\]", r.output), r.output
    assert "ragged drafts (" in r.output
    up = BodyServer(fixture(K8_AFTER))
    try:
        r = CliRunner().invoke(top, ["--upstream", f"spec={up.url}", "--once"])
    finally:
        up.stop()
    assert r.exit_code == 0, r.output
    assert "withheld" not in r.output
    assert re.search(r"how sure: +best estimate, not certain", r.output), r.output


def _serve_once(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "specwatch", "serve", "--once", *args], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHONPATH": str(REPO / "exporter")})
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_upstream_mode_takes_serves_cost_profile_flags():
    """--upstream runs serve's collector with serve's --cost-profile (and the other flags that change
    what is shown): the speedups are the ones `specwatch serve --once` serves with the same flags."""
    from specwatch.exporter.server import serve

    profile = REPO / "exporter" / "specwatch" / "data" / "cost-profiles" / "cpu-2core-smollm2-135m-vllm0.32.yaml"
    up = BodyServer(fixture(K4_AFTER))
    try:
        flags = ["--upstream", f"spec={up.url}", "--cost-profile", str(profile), "--speculative-method", "ngram"]
        r = CliRunner().invoke(top, [*flags, "--once", "--window", "lifetime"])
        plain = CliRunner().invoke(top, ["--upstream", f"spec={up.url}", "--once", "--window", "lifetime"])
        served = _serve_once(*flags)
    finally:
        up.stop()
    assert r.exit_code == 0 and plain.exit_code == 0, r.output + plain.output
    lab = dict(upstream="spec", model_name="smollm2", engine="0", window="lifetime", k=4)
    bases = {lab_["basis"]: v for n, lab_, v in raw_samples(served) if n == "specwatch_speedup"
             and all(lab_.get(k) == str(x) for k, x in lab.items())}
    assert bases and "default" not in bases  # the profile applies: measured / profile
    (basis, v), = bases.items()
    assert re.search(rf"speedup at k = 4: +{v:.2f}×( \[[0-9.]+-[0-9.]+\])? +basis={basis}", r.output), r.output
    assert f"cost profile {profile}" in r.output
    # without it: serve's built-in guess, labelled so
    assert re.search(r"speedup at k = 4: +\S+×( \[[0-9.]+-[0-9.]+\])? +basis=default", plain.output), plain.output
    # the flags are serve's own definitions
    # (compared without whitespace: click may wrap a long word such as a series name mid-word)
    help_text = "".join(CliRunner().invoke(top, ["--help"]).output.split())
    for name in ("cost_profile", "baseline_upstream", "speculative_method", "drafter"):
        (opt,) = [o for o in serve.params if o.name == name]
        assert "".join(opt.help.split()) in help_text


@pytest.mark.parametrize("args, hint", [
    (["--window", "7x"], "--window"),
    (["--interval", "0"], "--interval"),
    (["--exporter", "ftp://x"], "--exporter"),
    (["--upstream", "not a url"], "--upstream"),
    (["--exporter", "http://127.0.0.1:1", "--upstream", "http://127.0.0.1:2"], "not both"),
    (["--cost-profile", "/nonexistent/profile.yaml"], "only with --upstream"),
    (["--upstream", "http://127.0.0.1:9", "--cost-profile", "/nonexistent/profile.yaml"], "--cost-profile:"),
    (["--upstream", "a=http://127.0.0.1:9", "--baseline-upstream", "b"], "--baseline-upstream 'b'"),
])
def test_bad_flags_exit_2(args, hint):
    r = CliRunner().invoke(top, args + ["--once"])
    assert r.exit_code == 2 and hint in r.output and "Traceback" not in r.output
    assert len([line for line in r.output.splitlines() if line.startswith("Error")]) == 1


def test_upstream_mode_failures_are_not_logged_twice():
    """--once against a down upstream: the snapshot says DOWN on stdout; the in-process collector's
    log line does not repeat it on stderr."""
    r = _cli("--upstream", "gone=http://127.0.0.1:9", "--once", "--timeout", "1")
    assert r.returncode == 1 and "upstream gone: DOWN: connect" in r.stdout
    assert r.stderr == ""


def _cli(*args, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
    return subprocess.run([sys.executable, "-m", "specwatch", "top", *args], capture_output=True, text=True,
                          timeout=60, env=env, **kw)


def test_unreachable_exporter_is_one_line(free_port):
    for args in ([], ["--once"]):
        r = _cli("--exporter", f"http://127.0.0.1:{free_port}", "--timeout", "2", *args, stdin=subprocess.DEVNULL)
        lines = r.stderr.strip().splitlines()
        assert r.returncode in (1, 2) and len(lines) == 1, r.stderr
        if args:  # --once: the source itself
            assert r.returncode == 1 and "cannot read the exporter" in lines[0] and "connect" in lines[0]
        else:  # no TTY: says so before anything else
            assert r.returncode == 2 and "not a terminal" in lines[0] and "--once" in lines[0]
        assert r.stdout == ""


def test_non_specwatch_urls_are_one_line():
    vllm = BodyServer(fixture(K4_AFTER))
    html = BodyServer("<!doctype html><html><body><h1>hello</h1></body></html>", content_type="text/html")
    try:
        r = _cli("--exporter", vllm.url, "--once")
        assert r.returncode == 1 and "vLLM /metrics page" in r.stderr and "--upstream" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        r = _cli("--exporter", html.url, "--once")
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        assert any(x in r.stderr for x in ("not a specwatch exporter", "not Prometheus exposition text", "truncated"))
        r = _cli("--upstream", f"page={html.url}", "--once")
        assert r.returncode == 1 and ("DOWN: parse:" in r.stdout or "DOWN: truncated:" in r.stdout) and "Traceback" not in r.stderr
    finally:
        vllm.stop()
        html.stop()


# ---------------------------------------------------------------------------------------------
# the live view in a real terminal (tmux)
# ---------------------------------------------------------------------------------------------

TMUX = shutil.which("tmux")


class Tmux:
    """A private tmux server (own socket) running one command in a 130x60 pane."""

    def __init__(self, tmp_path: Path, command: str, width: int = 130, height: int = 60):
        self.base = ["tmux", "-L", f"specwatch-test-{os.getpid()}-{id(self)}", "-f", "/dev/null"]
        script = tmp_path / f"run-{id(self)}.sh"
        # after top exits: its exit status and the terminal mode (icanon/echo must be back on)
        script.write_text(f"#!/bin/sh\ntrap : INT\n{command}\necho EXIT=$?\n"
                          "stty -a | tr ' ' '\\n' | grep -E '^-?(icanon|echo)$' | tr '\\n' ' '\necho\nsleep 600\n")
        script.chmod(0o755)
        # The pane's own size, not a COLUMNS/LINES of the caller (pytest-xdist's workers set 80x24,
        # which rich would take over the terminal's).
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        env.update(PYTHONPATH=str(REPO / "exporter"), TERM="xterm-256color")
        subprocess.run(self.base + ["new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height), str(script)],
                       check=True, env=env)

    def screen(self) -> str:
        return subprocess.run(self.base + ["capture-pane", "-p", "-t", "t"], capture_output=True, text=True).stdout

    def keys(self, *keys: str) -> None:
        subprocess.run(self.base + ["send-keys", "-t", "t", *keys], check=True)

    def wait_for(self, pattern: str, timeout: float = 40.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if re.search(pattern, screen):
                return screen
            time.sleep(0.3)
        raise AssertionError(f"{pattern!r} not on screen within {timeout} s; screen:\n{screen}")

    def kill(self) -> None:
        subprocess.run(self.base + ["kill-server"], capture_output=True)


def _top_cmd(*args: str) -> str:
    return " ".join([sys.executable, "-m", "specwatch", "top", "--interval", "0.5", *args])


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (scripts/setup.sh installs it)")
def test_live_view_in_a_terminal_against_the_exporter(tmp_path, exporter_server):
    t = Tmux(tmp_path, _top_cmd("--exporter", exporter_server.url, "--window", "1m"))
    try:
        # what the exporter serves right now for each window (the same collector top reads)
        t.wait_for(r"window 1m")
        lab = dict(upstream="spec", model_name="smollm2", engine="0")

        def served_1m():  # a second fetch round (concurrent scrapes share one per --min-fetch-interval)
            text = generate_latest(exporter_server.registry).decode()
            return text if value(text, "specwatch_draft_acceptance_rate", window="1m", **lab) is not None else None

        text = realstack.wait_for("a 1m window at the exporter", served_1m, 20, interval=0.5)
        r1m = value(text, "specwatch_draft_acceptance_rate", window="1m", **lab)
        rlife = value(text, "specwatch_draft_acceptance_rate", window="lifetime", **lab)
        assert f"{r1m:.3f}" != f"{rlife:.3f}"
        s = t.wait_for(re.escape(pct(r1m)))
        assert "spec · smollm2 · engine 0" in s and "baseline" in s and "no speculation" in s
        assert "█" in s  # the bars
        assert pct(value(text, "specwatch_position_acceptance_rate", window="1m", position=0, **lab)) in s
        t.keys("l")
        s = t.wait_for(r"window lifetime")
        s = t.wait_for(re.escape(pct(rlife)))
        assert f"{value(text, 'specwatch_mean_acceptance_length', window='lifetime', **lab):.2f} of 5 (k+1)" in s
        t.keys("5")
        t.wait_for(r"window 5m")
        t.keys("q")
        s = t.wait_for(r"EXIT=\d+")
        assert "EXIT=0" in s
        t.wait_for(r"(?<!-)icanon (?<!-)echo|(?<!-)echo (?<!-)icanon")  # the terminal mode is restored
        assert "specwatch top" not in s  # the alternate screen is gone
    finally:
        t.kill()


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (scripts/setup.sh installs it)")
def test_live_view_in_a_terminal_upstream_goes_down_and_comes_back(tmp_path):
    up = BodyServer(fixture(K4_AFTER))
    # lifetime draft acceptance rate of the capture, computed from its raw counters
    LIFE_RATE = pct(raw_value(fixture(K4_AFTER), "vllm:spec_decode_num_accepted_tokens_total")
                    / raw_value(fixture(K4_AFTER), "vllm:spec_decode_num_draft_tokens_total"))
    t = Tmux(tmp_path, _top_cmd("--upstream", f"spec={up.url}", "--timeout", "1"))
    try:
        s = t.wait_for(r"up · schema v1")
        assert LIFE_RATE in s and "running 0 · waiting 0" in s
        up.stop()
        s = t.wait_for(r"DOWN: connect")
        assert LIFE_RATE not in s  # no stale values while it is down
        up.start()  # the same port again
        s = t.wait_for(r"up · schema v1")
        assert LIFE_RATE in s
        t.keys("C-c")  # Ctrl-C also restores the terminal
        s = t.wait_for(r"EXIT=\d+")
        assert "EXIT=130" in s
        t.wait_for(r"(?<!-)icanon (?<!-)echo|(?<!-)echo (?<!-)icanon")
    finally:
        t.kill()
        if up.httpd is not None:
            with contextlib.suppress(Exception):
                up.stop()


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (scripts/setup.sh installs it)")
def test_live_view_in_a_narrow_terminal(tmp_path, exporter_server):
    t = Tmux(tmp_path, _top_cmd("--exporter", exporter_server.url), width=30, height=20)
    try:
        t.wait_for(r"terminal too narrow")
        t.keys("q")
        assert "EXIT=0" in t.wait_for(r"EXIT=\d+")
    finally:
        t.kill()


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (scripts/setup.sh installs it)")
def test_live_view_in_a_short_terminal_says_what_is_hidden(tmp_path, exporter_server):
    t = Tmux(tmp_path, _top_cmd("--exporter", exporter_server.url), width=130, height=20)
    try:
        s = t.wait_for(r"blocks? hidden|cropped")
        assert "the terminal is too short" in s
        t.keys("q")
        assert "EXIT=0" in t.wait_for(r"EXIT=\d+")
    finally:
        t.kill()


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (scripts/setup.sh installs it)")
def test_live_view_upstream_mode_leaves_no_log_line_behind(tmp_path):
    """--upstream with a down upstream: the screen says DOWN; after q the terminal holds nothing of
    the in-process collector's log (its first fetch happens before the screen is taken over)."""
    up = BodyServer(fixture(K4_AFTER))
    t = Tmux(tmp_path, _top_cmd("--upstream", f"spec={up.url}", "--upstream", "gone=http://127.0.0.1:9", "--timeout", "1"))
    try:
        t.wait_for(r"DOWN: connect")
        t.keys("q")
        s = t.wait_for(r"EXIT=\d+")
        before = s[:s.index("EXIT=")]
        assert "EXIT=0" in s and before.strip() == "", s
    finally:
        t.kill()
        up.stop()


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (scripts/setup.sh installs it)")
def test_live_view_waits_for_an_exporter_that_is_not_up_yet(tmp_path, free_port):
    """Issue #25: started before the demo's exporter is up (as the README suggests, in a second
    terminal), the live view says it cannot read the exporter and waits, instead of exiting; when
    the exporter answers, its values appear; q leaves the terminal as it was."""
    text = two_scrapes({"spec": _partial_counters(fixture(K4_AFTER))}, {"spec": fixture(K4_AFTER)})
    rate = pct(value(text, "specwatch_draft_acceptance_rate", upstream="spec", window="1m"))
    t = Tmux(tmp_path, _top_cmd("--exporter", f"http://127.0.0.1:{free_port}", "--timeout", "1"))
    srv = None
    try:
        s = t.wait_for(r"source unreachable")
        assert "cannot read the exporter" in s and "waiting for it" in s and "Traceback" not in s and "EXIT=" not in s
        srv = BodyServer(text, port=free_port)
        t.wait_for(re.escape(rate))
        t.keys("q")
        assert "EXIT=0" in t.wait_for(r"EXIT=\d+")
    finally:
        t.kill()
        if srv is not None:
            srv.stop()


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (scripts/setup.sh installs it)")
def test_live_view_of_a_non_specwatch_url_is_one_line_and_leaves_the_terminal_alone(tmp_path):
    """An address that answers with something else than a specwatch exporter fails fast, one
    line, before the screen is taken over."""
    srv = BodyServer("<html>not an exporter</html>", content_type="text/html")
    t = Tmux(tmp_path, _top_cmd("--exporter", srv.url, "--timeout", "1"))
    try:
        s = t.wait_for(r"EXIT=\d+\s*\n.*(icanon|echo)")  # the stty line too: the slice below drops two lines
        assert "EXIT=1" in s
        errors = [line for line in s.splitlines() if line.strip()][:-2]  # before EXIT= and the stty line
        assert len(errors) == 1 and srv.url in errors[0] and "Traceback" not in s
    finally:
        t.kill()
        srv.stop()


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (scripts/setup.sh installs it)")
def test_live_view_in_a_terminal_exporter_goes_away_and_comes_back(tmp_path):
    """The exporter stops answering mid-run: the screen says so and shows no stale value; when it
    is back, so are the values. (The "exporter" serves the real exporter's output on real captures.)"""
    text = two_scrapes({"spec": _partial_counters(fixture(K4_AFTER))}, {"spec": fixture(K4_AFTER)})
    rate = pct(value(text, "specwatch_draft_acceptance_rate", upstream="spec", window="1m"))
    srv = BodyServer(text)
    t = Tmux(tmp_path, _top_cmd("--exporter", srv.url, "--timeout", "1"))
    try:
        assert rate in t.wait_for(re.escape(rate))
        srv.stop()
        s = t.wait_for(r"source unreachable")
        assert "cannot read the exporter" in s and rate not in s and "window 1m" in s
        srv.start()
        t.wait_for(re.escape(rate))
        t.keys("q")
        assert "EXIT=0" in t.wait_for(r"EXIT=\d+")
    finally:
        t.kill()


def test_one_block_per_engine_with_its_own_request_gauges():
    """Data-parallel vLLM (constructed from the documented format: two engines under one model)."""
    from specwatch.top.sources import _request_gauges

    body = fixture("vllm-0.32-v1-dp2-ngram-k4-constructed.txt")
    text = two_scrapes({"dp": body}, {"dp": body})
    reqs = _request_gauges("dp", body)
    view = build_view(parse_exposition(text), "lifetime", requests=reqs)
    engines = view.upstreams[0].engines
    assert [e.engine for e in engines] == sorted({lab["engine"] for n, lab, _ in raw_samples(body)
                                                   if n == "vllm:spec_decode_num_drafts_total"})
    for e in engines:
        assert e.draft_acceptance_rate.value == value(text, "specwatch_draft_acceptance_rate", upstream="dp",
                                                      engine=e.engine, window="lifetime")
        assert e.running == raw_value(body, "vllm:num_requests_running", engine=e.engine)
        assert e.waiting == raw_value(body, "vllm:num_requests_waiting", engine=e.engine)
    plain = render_plain(view, "t")
    assert plain.count("model ") == len(engines) == 2
