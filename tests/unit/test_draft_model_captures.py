"""The exporter on real vLLM 0.32 /metrics captured with method draft_model (drafter ``close``,
k = 3; scripts/capture_fixtures.py --only draft-close). Expected values are computed here from the
raw samples with prometheus_client's parser (independently of specwatch's own parser)."""

from __future__ import annotations

import json

import pytest

from exporter_helpers import FIXTURES, fixture, make_exporter, raw_value, series

FRESH = "vllm-0.32-draft-close-k3-fresh.txt"
AFTER = "vllm-0.32-draft-close-k3-after-traffic.txt"
LBL = {"upstream": "d", "model_name": "smollm2", "engine": "0"}


def _raw(text):
    v = lambda n, **kw: raw_value(text, "vllm:spec_decode_" + n, **kw)
    return (v("num_drafts_total"), v("num_draft_tokens_total"), v("num_accepted_tokens_total"),
            [v("num_accepted_tokens_per_pos_total", position=i) for i in range(3)])


def test_capture_is_real_and_says_what_the_server_published():
    m = json.loads((FIXTURES / "manifest.json").read_text())[AFTER]
    assert m["real"] and m["speculative_config"]["method"] == "draft_model" and m["num_speculative_tokens"] == 3
    said = m["server_says"]
    assert not any("spec" in k for k in said["v1_models_keys"])  # /v1/models: nothing about speculation
    assert said["server_info_speculative"] == {"method": "draft_model", "drafter": "DRAFTER_DIR", "num_speculative_tokens": 3}


def test_lifetime_values_match_the_raw_counters():
    drafts, tokens, accepted, pos = _raw(fixture(AFTER))
    assert drafts > 0 and tokens == 3 * drafts  # a draft model always proposes k tokens
    reg, _, _ = make_exporter({"d": fixture(AFTER)})
    get = lambda name, **kw: series(reg, name, **LBL, window="lifetime", **kw)
    assert list(get("specwatch_draft_acceptance_rate").values()) == [pytest.approx(accepted / tokens)]
    assert list(get("specwatch_mean_acceptance_length").values()) == [pytest.approx(1 + accepted / drafts)]
    for i in range(3):
        assert list(get("specwatch_position_acceptance_rate", position=i).values()) == [pytest.approx(pos[i] / drafts)]
        assert list(get("specwatch_expected_acceptance_length", k=i + 1).values()) == [
            pytest.approx(1 + sum(pos[: i + 1]) / drafts)]
    assert series(reg, "specwatch_num_speculative_tokens", **LBL) == {tuple(sorted(LBL.items())): 3.0}


def test_window_between_the_two_captures_is_their_difference():
    d0, t0, a0, p0 = _raw(fixture(FRESH))
    d1, t1, a1, p1 = _raw(fixture(AFTER))
    reg, fetcher, clock = make_exporter({"d": fixture(FRESH)}, windows=("1m",))
    series(reg, "specwatch_up")
    clock.t += 30
    fetcher.bodies["d"] = fixture(AFTER)
    rate = series(reg, "specwatch_draft_acceptance_rate", **LBL, window="1m")
    assert list(rate.values()) == [pytest.approx((a1 - a0) / (t1 - t0))]
    r0 = series(reg, "specwatch_position_acceptance_rate", **LBL, window="1m", position=0)
    assert list(r0.values()) == [pytest.approx((p1[0] - p0[0]) / (d1 - d0))]
