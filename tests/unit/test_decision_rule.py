"""The one decision rule (specwatch.specdecode.decision.decide) and its evidence, paired ratios,
on real measurements: the per-batch throughputs of the project's CPU sweep fixture
(tests/fixtures/sweeps/embedded-ngram-draft-sweep.json, a real vLLM run)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from specwatch.specdecode.decision import (CANNOT_TELL, LOSES, PAYS, Candidate, Estimate, decide, disagreement,
                                           format_interval, format_ratio, paired_ratio, ratio_from_logs, t975,
                                           unpaired_ratio)

SWEEP = Path(__file__).resolve().parents[1] / "fixtures" / "sweeps" / "embedded-ngram-draft-sweep.json"


def _batches(config: str, workload: str, conc: int) -> list[float]:
    doc = json.loads(SWEEP.read_text())
    for c in doc["cells"]:
        if (c["config"], c["workload"], c["max_concurrency"]) == (config, workload, conc):
            return [b["output_throughput"] for b in sorted(c["batches"], key=lambda b: b["batch_index"])
                    if not b["warmup"]]
    raise KeyError((config, workload, conc))


def _candidate(name: str, k: int, config: str, workload: str, conc: int) -> Candidate:
    spec, base = _batches(config, workload, conc), _batches("baseline", workload, conc)
    return Candidate.from_ratio(name, k, paired_ratio(spec, base),
                                log_ratios=[math.log(a / b) for a, b in zip(spec, base, strict=True)])


def test_t975_matches_the_exact_quantile():
    assert t975(1) == pytest.approx(12.7062047, rel=1e-7)
    assert t975(30) == pytest.approx(2.0422725, rel=1e-7)
    assert t975(40) == pytest.approx(2.0210754, abs=2e-5)
    assert t975(1000) == pytest.approx(1.9623391, abs=2e-5)
    with pytest.raises(ValueError):
        t975(0)


def test_paired_ratio_is_the_geometric_mean_with_a_positive_log_interval():
    spec, base = _batches("ngram-k4", "copy", 2), _batches("baseline", "copy", 2)
    r = paired_ratio(spec, base)
    logs = [math.log(a / b) for a, b in zip(spec, base, strict=True)]
    assert r.value == pytest.approx(math.exp(sum(logs) / len(logs)))
    assert 0 < r.lower < r.value < r.upper
    assert r.n == 2 and r.paired
    assert r.verdict == PAYS


def test_one_pair_has_a_value_and_no_interval():
    r = paired_ratio([120.0], [100.0])
    assert r.value == pytest.approx(1.2)
    assert r.lower is None and r.upper is None and r.verdict == CANNOT_TELL
    c = Candidate.from_ratio("k=2", 2, r)
    assert decide([c]).verdict == CANNOT_TELL


def test_paired_ratio_refuses_bad_input():
    with pytest.raises(ValueError, match="differ in length"):
        paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="finite numbers > 0"):
        paired_ratio([1.0, float("nan")], [1.0, 1.0])
    with pytest.raises(ValueError, match="no pairs"):
        ratio_from_logs([])


@pytest.mark.parametrize("conc", [2, 4, 8])
def test_fixture_copy_picks_the_measured_best_k4(conc):
    """The issue's case: the overlap rule answered k = 2 ("tie") here, 25-34 % below k = 4."""
    p = decide([_candidate("k=2", 2, "ngram-k2", "copy", conc), _candidate("k=4", 4, "ngram-k4", "copy", conc)])
    assert p.pick.name == "k=4"
    assert p.verdict == PAYS
    assert p.runner_up.name == "k=2"
    assert p.versus_runner_up.paired and p.versus_runner_up.value > 1.2
    assert all(e is None or e > 0 for e in (p.pick.lower, p.versus_runner_up.lower))


def test_tie_within_tolerance_goes_to_the_smaller_k():
    a = Candidate("k=2", 2, 1.500, 1.40, 1.60)
    b = Candidate("k=4", 4, 1.520, 1.42, 1.63)
    p = decide([a, b])
    assert p.pick.name == "k=2" and p.tie and p.best.name == "k=4"
    c = Candidate("k=4", 4, 1.60, 1.50, 1.70)
    assert decide([a, c]).pick.name == "k=4"


def test_uncertain_keeps_the_better_estimate_and_says_how_many_more_batches():
    logs2 = [math.log(x) for x in (1.30, 1.62, 1.41)]
    logs4 = [math.log(x) for x in (1.55, 1.60, 1.52)]
    a = Candidate.from_ratio("k=2", 2, ratio_from_logs(logs2), log_ratios=logs2)
    b = Candidate.from_ratio("k=4", 4, ratio_from_logs(logs4), log_ratios=logs4)
    p = decide([a, b])
    assert p.pick.name == "k=4" and not p.certain
    assert p.more_batches is not None and p.more_batches > 0
    assert "cannot tell them apart" in p.confidence_text() and "more paired batches" in p.confidence_text()


def test_physics_never_accepted_is_off_whatever_the_noise():
    c = Candidate("k=4", 4, 1.03, 0.85, 1.25, never_accepted=True)
    p = decide([c])
    assert p.pick.off and p.verdict == LOSES
    assert p.excluded == (("k=4", "no draft token was accepted in any batch: it cannot pay"),)


def test_a_table_is_a_candidate_of_its_own():
    fixed = Candidate("ngram k=4", 4, 1.74, 1.6, 1.9)
    table = Candidate("ngram table [[1,8,4],[9,32,2],[33,1024,1]]", 4, 1.51, 1.4, 1.6, table=True)
    p = decide([fixed, table])
    assert p.pick.name == "ngram k=4" and p.runner_up.table
    table2 = Candidate("ngram table", 4, 1.745, 1.6, 1.9, table=True)
    assert decide([fixed, table2]).pick.name == "ngram k=4"  # tie: the fixed k before a table of the same k


def test_bases_that_disagree_say_which_rules_at_the_deciding_precision():
    m = Estimate(1.03, 0.9989, 1.25, "measured")
    c = Estimate(0.88, 0.81, 0.95, "calibrated")
    line = disagreement(m, c)
    assert "measured rules" in line and "0.999" in line
    assert disagreement(m, Estimate(1.0, 0.9, 1.1, "calibrated")) is None


def test_format_ratio_prints_the_precision_that_decided():
    assert format_ratio(0.9989) == "0.999"
    assert format_ratio(1.0004) == "1.0004"
    assert format_ratio(1.2345) == "1.23"
    assert format_interval(None, None) == "(1 batch: no interval)"


def test_unpaired_ratio_is_labelled():
    r = unpaired_ratio(Estimate(2.0, 1.8, 2.2, "calibrated"), Estimate(1.0, 0.9, 1.1, "calibrated"))
    assert not r.paired and r.value == pytest.approx(2.0) and r.lower > 0


def test_a_what_if_from_the_same_batches_is_compared_paired_with_its_model_error():
    """A what-if k′ = the run's measured paired ratio × a modelled R: its per-batch log ratios are
    the anchor's shifted by log R, so pick / runner-up is R with the model's error only (not the
    anchor's batch noise twice, as an unpaired comparison would)."""
    spec, base = _batches("ngram-k4", "copy", 8), _batches("baseline", "copy", 8)
    logs = [math.log(a / b) for a, b in zip(spec, base, strict=True)]
    run = Candidate.from_ratio("k=4", 4, paired_ratio(spec, base), log_ratios=logs)
    r3 = 0.93  # the modelled factor of k=3 over k=4
    shifted = [x + math.log(r3) for x in logs]
    what_if = Candidate("k=3", 3, run.value * r3, run.lower * r3 * 0.97, run.upper * r3 / 0.97, "profile",
                        log_ratios=shifted, model_log_halfwidth=0.03)
    p = decide([run, what_if])
    assert p.pick.name == "k=4" and p.versus_runner_up.paired
    assert p.versus_runner_up.value == pytest.approx(1 / r3)
    assert p.versus_runner_up.lower == pytest.approx(math.exp(math.log(1 / r3) - 0.03))
    assert p.certain  # 1/0.93 = 1.075 clears a 3 % model error
    unpaired = decide([run, Candidate("k=3", 3, what_if.value, what_if.lower, what_if.upper, "profile")])
    assert not unpaired.certain and not unpaired.versus_runner_up.paired
    with pytest.raises(ValueError, match="model_log_halfwidth"):
        Candidate("k=3", 3, 1.0, model_log_halfwidth=float("nan"))
