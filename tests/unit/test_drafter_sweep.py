"""Drafters as a sweep dimension (specwatch sweep --drafter, advise's drafter pick, report's
per-drafter charts) on the stub server, plus the pick and table maths on hand-built inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specwatch.choosek.drafterstudy import acceptance_by_drafter, drafter_labels, family_labels, pick_drafters, study_markdown, study_rows
from specwatch.choosek.model import Advice, Measurement, Recommendation
from specwatch.choosek.resultfile import measurements
from records import sweep_document, sweep_record
from specwatch.specdecode.decision import Candidate, decide
from specwatch.choosek.sweep import build_configs

from sweep_stub import make_stub


def test_build_configs_with_drafters():
    cfgs = build_configs((1, 3), (), True, [("close", "/m/close"), ("far", "/m/far")])
    assert [(c.name, c.k, c.drafter) for c in cfgs] == [
        ("baseline", 0, None), ("draft-close-k1", 1, "close"), ("draft-close-k3", 3, "close"),
        ("draft-far-k1", 1, "far"), ("draft-far-k3", 3, "far")]
    assert cfgs[2].speculative_config == {"method": "draft_model", "model": "/m/close", "num_speculative_tokens": 3}
    assert cfgs[1].family == cfgs[2].family != cfgs[3].family
    assert cfgs[1].to_dict()["drafter"] == "close" and "drafter" not in cfgs[0].to_dict()


def _advice(family: str, recs: list[Recommendation]) -> Advice:
    return Advice(family=family, tolerance=0.02, acceptance=[], throughput=[], fits=[], recommendations=recs, accuracy=[])


def _rec(c: int, speedups: dict[int, float]) -> Recommendation:
    cands = [Candidate(f"k={k}", k, v, v * 0.99, v * 1.01) for k, v in speedups.items()]
    p = decide(cands, 0.02)
    return Recommendation("copy", c, p.pick.k, p.best.k, 0.02, {x.name: x.value for x in p.candidates}, p.pick.value,
                          pick=p, config=p.pick.name)


def test_pick_drafters_hand_computed():
    # concurrency 1: close k=2 1.5x, far k=1 1.1x -> close k=2
    # concurrency 8: close k=1 0.995x, the baseline 1 (within 2 %) -> speculation off
    a = _advice("F-close", [_rec(1, {1: 1.25, 2: 1.5}), _rec(8, {1: 0.995, 2: 0.8})])
    b = _advice("F-far", [_rec(1, {1: 1.1, 2: 1.05}), _rec(8, {1: 0.9, 2: 0.7})])
    picks = {p.concurrency: p for p in pick_drafters([a, b, _advice("ngram", [])], {"F-close": "close", "F-far": "far"}, 0.02)}
    assert (picks[1].drafter, picks[1].k, picks[1].speedup) == ("close", 2, pytest.approx(1.5))
    assert picks[1].candidates["far k=1"] == 1.1 and len(picks[1].candidates) == 5
    assert picks[1].pick["runner_up"] == "close k=1" and "close k=1" in picks[1].confidence
    assert (picks[8].drafter, picks[8].k) == (None, 0)
    assert picks[8].best == (None, 0, 1.0)
    # 3 % ahead of off (beyond the 2 % tolerance): close k=2 is the pick, not off
    a2 = _advice("F-close", [_rec(1, {2: 1.03})])
    (p,) = pick_drafters([a2], {"F-close": "close"}, 0.02)
    assert (p.drafter, p.k) == ("close", 2)


def _m(config, k, c, thr, tpot, ttft, acc=None, drafted=None) -> Measurement:
    return Measurement(config=config, k=k, workload="copy", concurrency=c, output_throughput=thr, mean_tpot_ms=tpot,
                       mean_ttft_ms=ttft, accepted_tokens=acc, draft_tokens=drafted)


def test_study_table_and_acceptance_sum_before_dividing():
    labels = {"draft-a-k3": "a", "draft-a-k1": "a"}
    ms = [_m("baseline", 0, 1, 10, 100, 50), _m("draft-a-k3", 3, 1, 12, 80, 70, 30, 60),
          _m("draft-a-k3", 3, 2, 20, 90, 90, 10, 60), _m("draft-a-k1", 1, 1, 11, 90, 60, 15, 20)]
    cols, rows = study_rows(ms, labels, 3)
    assert cols == ["baseline", "a"]
    assert rows[1] == {"baseline": (10, 100, 50), "a": (12, 80, 70)} and rows[2] == {"a": (20, 90, 90)}
    acc = acceptance_by_drafter(ms, labels)
    assert acc == {"a": {1: 15 / 20, 3: (30 + 10) / (60 + 60)}}  # not the mean of 0.5 and 0.1667
    md = study_markdown(ms, labels, 3)
    assert "| 1 | 10.0 | 12.0 |" in md and "| a | 75.0 % | 33.3 % |" in md


@pytest.fixture
def drafter_stub(tmp_path, monkeypatch):
    template, log = make_stub(tmp_path, monkeypatch)
    script = tmp_path / "stub.py"
    text = script.read_text()
    new = text.replace("accept_pattern=(3, 1, 0, 2)",
                       "accept_pattern=((3, 1, 0, 2) if 'close' in (a.speculative_config or '') else (1, 0, 0, 0))")
    assert new != text
    script.write_text(new)
    return template


def test_sweep_advise_report_with_two_drafters_on_the_stub(tmp_path, drafter_stub):
    from specwatch.choosek.cli import advise, report, sweep

    out = tmp_path / "s.json"
    r = CliRunner().invoke(sweep, ["--result-file", str(out), "--k", "1,2", "--drafter", "org/close-model",
                                   "--drafter", "org/far-model", "--workloads", "copy", "--concurrency", "1,2",
                                   "--output-len", "8", "--num-batches", "1", "--server-command", drafter_stub,
                                   "--no-lock", "--no-progress"])
    assert r.exit_code == 0, r.output
    doc = sweep_document(out)
    labels = drafter_labels(sweep_record(doc))
    assert sorted(set(labels.values())) == ["close-model", "far-model"] and len(labels) == 4
    assert {c["speculative_config"]["model"] for c in doc["configs"] if c["name"] in labels} == {"org/close-model", "org/far-model"}
    acc = acceptance_by_drafter(measurements(sweep_record(doc)), labels)
    assert acc["close-model"][2] > acc["far-model"][2]  # the stub accepts more of close's drafts

    adv = tmp_path / "a.json"
    r = CliRunner().invoke(advise, [str(out), "--json", str(adv)])
    assert r.exit_code == 0, r.output
    assert "Drafter and k per concurrency" in r.output and "drafter close-model" in r.output
    a = json.loads(adv.read_text())
    assert len(a["families"]) == 2 and set(family_labels(sweep_record(doc)).values()) == {"close-model", "far-model"}
    picks = [p for p in a["drafter_picks"] if p["workload"] == "*"]
    assert sorted(p["concurrency"] for p in picks) == [1, 2]
    for p in picks:
        assert p["drafter"] in (None, "close-model", "far-model")
        assert p["score"] >= max(p["candidates"].values()) * (1 - a["tolerance"]) - 1e-12
        assert set(p["candidates"]) == {"baseline", "close-model k=1", "close-model k=2", "far-model k=1", "far-model k=2"}

    html = tmp_path / "r.html"
    r = CliRunner().invoke(report, [str(out), "-o", str(html)])
    assert r.exit_code == 0, r.output
    text = html.read_text()
    assert "Drafter close-model" in text and "Drafter far-model" in text
    assert "Draft acceptance rate against k per drafter" in text
    assert text.count("data:image/png;base64,") >= 5 + 2 * 3 + 1


def test_sweep_rejects_an_unknown_embedded_drafter_before_anything_starts(tmp_path):
    from specwatch.choosek.cli import sweep

    out = tmp_path / "s.json"
    r = CliRunner().invoke(sweep, ["--result-file", str(out), "--drafter", "nope", "--no-progress"])
    assert r.exit_code == 2, r.output
    assert "unknown drafter 'nope'" in r.output and not out.exists()


STUDY = Path(__file__).resolve().parents[2] / "docs" / "drafter-study" / "sweep.json"


def test_advise_and_report_on_the_real_drafter_study():
    """The real run of scripts/drafter_study.sh (docs/drafter-study/sweep.json): advise picks no
    speculation exactly where no speculative cell beat the baseline, and the acceptance per drafter
    and k is the sum of the cells' counters."""
    from specwatch.choosek.advise import advise_sweep
    from specwatch.choosek.report import render_report

    doc = sweep_record(sweep_document(STUDY))
    ms = measurements(doc)
    labels = drafter_labels(doc)
    assert sorted(set(labels.values())) == ["close", "far"] and len(ms) == 36
    picks = {p.concurrency: p for p in pick_drafters(advise_sweep(doc), family_labels(doc), 0.02) if p.workload == "*"}
    for c in (1, 2, 4, 8):
        base = next(m.output_throughput for m in ms if m.k == 0 and m.concurrency == c)
        best = max(m.output_throughput for m in ms if m.k > 0 and m.concurrency == c)
        assert (picks[c].drafter is None) == (best < base * 0.98)
    acc = acceptance_by_drafter(ms, labels)
    cells = [m for m in ms if labels.get(m.config) == "close" and m.k == 3]
    assert acc["close"][3] == pytest.approx(sum(m.accepted_tokens for m in cells) / sum(m.draft_tokens for m in cells))
    assert all(acc[d][k] > acc[d][k + 1] for d in acc for k in (1, 2, 3))  # acceptance falls with k
    html = render_report(doc)
    assert "Drafter close" in html and "Drafter far" in html
