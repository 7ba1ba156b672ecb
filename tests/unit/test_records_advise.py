"""Live advice as a frozen record (:class:`specwatch.choosek.advise.LiveAdvice`): ``to_json`` is
the ``advise --json`` ``live`` item (text keys), ``from_json`` reads it back; both modes of
``specwatch advise`` make a typed result that one renderer prints."""

from __future__ import annotations

import io
import json

from rich.console import Console

from specwatch.choosek.advise import LiveAdvice, LiveAdviceResult, live_advices, render_result

CURVES = {("spec", "m", "0"): (0.9, 0.85, 0.8), ("ragged", "m", "0"): (0.9, 0.1, 0.1)}
BASES = {("ragged", "m", "0"): "lower_bound"}


def test_live_advice_round_trips_through_its_json():
    items = live_advices(CURVES, (1, 64), None, 0.02, None, bases=BASES)
    docs = [a.to_json() for a in live_advices(CURVES, (1, 64), None, 0.02, None, bases=BASES)]
    assert [a.to_json() for a in items] == docs
    assert [LiveAdvice.from_json(json.loads(json.dumps(d))) for d in docs] == items
    spec = next(a for a in items if a.series == ("spec", "m", "0"))
    assert set(spec.speedup) == {1, 64} and set(spec.speedup[1]) == {1, 2, 3}
    assert spec.name == "spec / m / 0" and spec.k_by_concurrency


def test_the_live_result_renders_and_writes_its_json():
    items = tuple(live_advices(CURVES, (1, 64), None, 0.02, None, bases=BASES))
    res = LiveAdviceResult(source="http://x/metrics", items=items, concurrencies=(1, 64), tolerance=0.02, profile=None,
                           profile_path=None, method=None, drafter=None)
    buf = io.StringIO()
    render_result(res, Console(file=buf, width=200))
    text = buf.getvalue()
    assert "spec / m / 0 (curve basis=exact)" in text and "ragged / m / 0 (curve basis=lower_bound)" in text
    # guesses (basis default) tell no k apart: the best estimate is served and says so (#36)
    assert "no k recommended" not in text and "withheld" not in text
    assert "(not certain)" in text and "cannot tell them apart" in text and "not yet the answer" in text
    assert res.to_json() == {"source": "http://x/metrics", "tolerance": 0.02, "cost_profile": None,
                             "live": [a.to_json() for a in items]}


def test_a_live_curve_whose_drafts_were_never_accepted_is_off_and_certain():
    """Physics first (#36): every position of the live curve is 0 (drafts proposed, none accepted:
    random output under ngram). Whatever the built-in guess's factor-2 interval says, off, certain,
    at every concurrency; a curve with acceptance stays uncertain under the same guess."""
    curves = {("rand", "m", "0"): (0.0, 0.0, 0.0, 0.0), ("copy", "m", "0"): (0.9, 0.85, 0.8, 0.75)}
    by = {a.series[0]: a for a in live_advices(curves, (1, 8), None, 0.02, None)}
    rand, copy = by["rand"], by["copy"]
    assert rand.k_by_concurrency == {1: 0, 8: 0} and rand.certain_by_concurrency == {1: True, 8: True}
    assert all("no draft token was accepted" in t or "excluded" in t or "only candidate" in t
               for t in rand.confidence_by_concurrency.values()), rand.confidence_by_concurrency
    assert copy.k_by_concurrency[1] > 0 and copy.certain_by_concurrency[1] is False
