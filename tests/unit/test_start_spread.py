"""The between-server-starts term (issue #37; docs/choosing-k.md): an A/A start's spread beyond its
paired interval (specwatch.specdecode.decision.StartSpread), and how the one decision rule uses it:
added to every measured ratio over the baseline and to every comparison of two starts, never to a
comparison within one start (a what-if k′ against its anchor)."""

from __future__ import annotations

import math

import pytest

from specwatch.specdecode.decision import (CANNOT_TELL, PAYS, Candidate, StartSpread, decide, ratio_from_logs,
                                           t975)


def test_the_excess_variance_of_the_cells_means_beyond_their_own_intervals():
    # m = 0.11 and -0.09; se^2 = var/n = 0.0002/2 each; mean m^2 = 0.0101; excess 0.0100 -> sd 0.1
    s = StartSpread.from_cells([[0.10, 0.12], [-0.10, -0.08]], "two A/A cells")
    assert s.log_sd == pytest.approx(0.1)
    assert s.cells == 2
    assert s.log_halfwidth == pytest.approx(t975(2) * 0.1)
    assert s.covered == 2  # two pairs: t(1) = 12.7, each interval holds 1
    # four pairs a cell: the intervals miss 1, the offsets are real
    cells = [[0.10, 0.12, 0.10, 0.12], [-0.10, -0.08, -0.10, -0.08]]
    s = StartSpread.from_cells(cells, "x")
    se2 = (0.0004 / 3) / 4
    assert s.log_sd == pytest.approx(math.sqrt(0.0101 - se2))
    assert s.covered == 0 == sum(ratio_from_logs(c).lower <= 1.0 <= ratio_from_logs(c).upper for c in cells)
    assert "over 2 A/A cells" in s.percent_text() and "held 1 in 0 of 2" in s.percent_text()


def test_no_excess_is_no_spread_and_too_few_pairs_are_none():
    # the means are what the within-cell noise explains: no between-starts term
    s = StartSpread.from_cells([[0.05, -0.05, 0.04, -0.04], [0.03, -0.03, 0.02, -0.02]], "x")
    assert s.log_sd == 0.0 and s.log_halfwidth == 0.0 and s.covered == 2
    assert StartSpread.from_cells([[0.1], []], "x") is None  # one pair says nothing of its own noise
    assert StartSpread.from_cells([[0.1], [0.1, 0.1]], "x").cells == 1
    with pytest.raises(ValueError):
        StartSpread(-0.1, 2, 0, "x")
    with pytest.raises(ValueError):
        StartSpread(0.1, 0, 0, "x")
    with pytest.raises(ValueError):
        StartSpread(0.1, 2, 3, "x")
    with pytest.raises(ValueError):
        StartSpread.from_cells([[0.1, math.inf]], "x")


def _cand(name: str, k: int, logs: list[float]) -> Candidate:
    return Candidate.from_ratio(name, k, ratio_from_logs(logs), log_ratios=logs)


def test_the_start_term_widens_the_interval_over_the_baseline_in_quadrature():
    c = _cand("k=2", 2, [0.05, 0.06, 0.055, 0.045])  # ≈1.05×, a tight interval: pays
    assert c.verdict == PAYS
    spread = StartSpread(0.03, 8, 6, "x")
    w = c.with_start_spread(spread, "ngram-k2")
    h_batches = math.log(c.upper / c.value)
    assert math.log(w.upper / w.value) == pytest.approx(math.hypot(h_batches, spread.log_halfwidth))
    assert w.value == c.value and w.log_ratios == c.log_ratios and w.start == "ngram-k2"
    assert w.verdict == CANNOT_TELL  # 5 % over one start each, ±7 % between starts
    assert Candidate.speculation_off().with_start_spread(spread) == Candidate.speculation_off()
    assert c.with_start_spread(None) is c
    one = Candidate("k=3", 3, 1.2)  # one batch: no interval to widen
    assert one.with_start_spread(spread).lower is None


def test_two_starts_are_compared_with_the_term_one_start_without():
    a = _cand("k=4", 4, [0.30, 0.31, 0.29, 0.30])
    b = _cand("k=2", 2, [0.20, 0.21, 0.19, 0.20])
    assert decide([a, b]).separated  # 10 % apart, batch by batch
    spread = StartSpread(0.05, 8, 5, "x")
    p = decide([a.with_start_spread(spread, "ngram-k4"), b.with_start_spread(spread, "ngram-k2")])
    assert p.pick.name == "k=4"  # uncertainty never changes the pick
    assert not p.separated and p.start_limited and p.more_batches is None
    assert "more batches cannot separate them" in p.confidence_text()
    vs = p.versus_runner_up
    assert math.log(vs.upper / vs.value) == pytest.approx(spread.log_halfwidth)  # the term counted once, not twice
    assert math.log(vs.upper / vs.value) < math.sqrt(2) * spread.log_halfwidth
    # the same start (a what-if k′ shifted from its anchor's batches): no start term between them
    q = decide([a.with_start_spread(spread, "ngram-k4"), b.with_start_spread(spread, "ngram-k4")])
    assert q.separated and not q.start_limited
    assert p.to_json()["start_limited"] is True


def test_more_batches_counts_the_term_batches_cannot_shrink():
    logs = [0.10, 0.02, 0.12, 0.00]  # ≈ 6 % ahead, a wide spread: not separated at 4 batches
    r = ratio_from_logs(logs)
    plain = r.more_batches()
    assert plain is not None and plain > 0
    with_term = r.more_batches(extra=0.04)
    assert with_term is not None and with_term > plain  # the start term needs more batches to beat
    assert r.more_batches(extra=abs(math.log(r.value))) is None  # a term as large as the gap: never
    spread = StartSpread(0.04 / t975(8), 8, 6, "x")
    p = decide([_cand("k=2", 2, logs).with_start_spread(spread, "ngram-k2")])
    assert not p.separated and not p.start_limited and p.more_batches == with_term


def test_over_all_workloads_the_term_is_taken_whole_whatever_the_batch_counts():
    """Two workloads with 3 and 4 batches (no batch-by-batch combination): the combined interval
    holds the start term once and whole, not the parts' terms shrunk by the propagation."""
    from specwatch.choosek.model import _with_start, combine_ratios_by_time
    spread = StartSpread(0.06, 8, 6, "x")
    parts = {"copy": _cand("k=2", 2, [0.10, 0.12, 0.11]).with_start_spread(spread, "ngram-k2"),
             "explain": _cand("k=2", 2, [0.11, 0.10, 0.12, 0.11]).with_start_spread(spread, "ngram-k2")}
    assert all(p.verdict == CANNOT_TELL for p in parts.values())
    comb = _with_start(combine_ratios_by_time({w: p.without_start() for w, p in parts.items()},
                                              {"copy": 1.0, "explain": 1.0}, "k=2", 2),
                       list(parts.values()), spread)
    assert comb.log_ratios is None  # propagated, not rebuilt batch by batch
    assert math.log(comb.upper / comb.value) >= spread.log_halfwidth
    assert comb.verdict == CANNOT_TELL and comb.start == "ngram-k2"


def test_an_unpaired_comparison_counts_the_term_once_and_not_within_one_start():
    spread = StartSpread(0.06, 8, 6, "x")
    k2 = _cand("k=2", 2, [0.30, 0.33, 0.31, 0.32]).with_start_spread(spread, "ngram-k2")
    h_batches = math.log(k2.without_start().upper / k2.value)
    # a what-if k=3 with k2's interval, computed from k2's start (no batches of its own: unpaired)
    k3 = Candidate("k=3", 3, k2.value * 1.05, k2.lower * 1.05, k2.upper * 1.05, "calibrated",
                   start_log_halfwidth=k2.start_log_halfwidth, start="ngram-k2")
    from specwatch.specdecode.decision import _versus
    vs = _versus(k3, k2)
    assert not vs.paired
    assert math.log(vs.upper / vs.value) == pytest.approx(math.sqrt(2) * h_batches)  # the same start: no term
    k4 = _cand("k=4", 4, [0.40, 0.41, 0.39, 0.42]).with_start_spread(spread, "ngram-k4")
    vs = _versus(k3, k4)  # another start: the term once
    h4 = math.log(k4.without_start().upper / k4.value)
    assert math.log(vs.upper / vs.value) == pytest.approx(math.sqrt(h_batches ** 2 + h4 ** 2 + spread.log_halfwidth ** 2))
