"""Issue #38 item 8: one spelling of a drafter. ``calibrate --from-sweep`` records a draft model
directory by its last path component; the docs tell users to pass the speculative config's
``model`` (the path). The exporter (and every cost-profile lookup) takes the path and its last
component alike, and ``specwatch_cost_profile_info`` says which it matched."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter_helpers import fixture, make_exporter, series
from specwatch.specdecode.costprofile import load_profile

PROFILES = Path(__file__).resolve().parents[2] / "exporter" / "specwatch" / "data" / "cost-profiles"
DRAFTERS = PROFILES / "cpu-2core-smollm2-135m-drafters-vllm0.32.yaml"  # draft_model curves for drafters close, far
CLOSE_AFTER = "vllm-0.32-draft-close-k3-after-traffic.txt"  # real: draft_model, drafter close, k = 3


def _profile_with_paths(tmp_path: Path) -> Path:
    """The drafters profile as a calibration that recorded the drafters' full paths."""
    out = tmp_path / "paths.yaml"
    out.write_text(DRAFTERS.read_text().replace("drafter: close", "drafter: /models/drafters/close")
                   .replace("drafter: far", "drafter: /models/drafters/far"))
    return out


@pytest.mark.parametrize(("asked", "found", "how"), [
    ("close", "close", "exact"),
    ("/home/u/.cache/specwatch/drafters/close", "close", "last_path_component"),
    ("/home/u/.cache/specwatch/drafters/close/", "close", "last_path_component"),
    ("org/close", "close", "last_path_component"),
    ("closer", None, "none"),
    ("/models/far", "far", "last_path_component"),
])
def test_the_path_and_its_last_component_name_one_drafter(asked, found, how):
    profile = load_profile(DRAFTERS)
    assert profile.match_drafter("draft_model", asked) == (found, how)
    assert profile.has_curve("draft_model", asked) is (found is not None)
    assert bool(profile.measured_ks("draft_model", asked)) is (found is not None)
    if found is not None:
        assert profile.cost_ratio(1.0, 3, "draft_model", asked) == profile.cost_ratio(1.0, 3, "draft_model", found)


def test_a_profile_that_recorded_paths_matches_the_name(tmp_path):
    profile = load_profile(_profile_with_paths(tmp_path))
    assert profile.match_drafter("draft_model", "close") == ("/models/drafters/close", "last_path_component")
    assert profile.match_drafter("draft_model", "/models/drafters/close") == ("/models/drafters/close", "exact")
    assert profile.has_curve("draft_model", "close")


def _info(reg) -> dict:
    got = series(reg, "specwatch_cost_profile_info")
    return {dict(k)["drafter"]: dict(k)["drafter_match"] for k in got}


@pytest.mark.parametrize(("drafter", "how"), [
    ("close", "exact"),
    ("/home/u/.cache/specwatch/drafters/close", "last_path_component"),
])
def test_the_exporter_serves_the_speedups_for_either_spelling_and_says_which(drafter, how):
    reg, _, _ = make_exporter({"d": fixture(CLOSE_AFTER)}, cost_profile=str(DRAFTERS), speculative_method="draft_model",
                              drafter=drafter)
    sel = {"upstream": "d", "window": "lifetime"}
    got = {(dict(k)["k"], dict(k)["basis"]) for k in series(reg, "specwatch_speedup", **sel)}
    assert ("3", "calibrated") in got, got
    assert not any(dict(k)["reason"] == "no_cost_curve" for k in series(reg, "specwatch_recommendation_withheld", **sel))
    assert _info(reg) == {drafter: how}


def test_the_exporter_says_when_no_curve_matches_the_drafter():
    reg, _, _ = make_exporter({"d": fixture(CLOSE_AFTER)}, cost_profile=str(DRAFTERS), speculative_method="draft_model",
                              drafter="/models/another")
    assert _info(reg) == {"/models/another": "none"}
    withheld = series(reg, "specwatch_recommendation_withheld", upstream="d", window="lifetime")
    assert [dict(k)["reason"] for k in withheld] == ["no_cost_curve"]


def test_without_a_drafter_the_info_keeps_its_labels():
    reg, _, _ = make_exporter({"d": fixture(CLOSE_AFTER)}, cost_profile=str(DRAFTERS))
    (labels,) = series(reg, "specwatch_cost_profile_info")
    assert "drafter" not in dict(labels) and "drafter_match" not in dict(labels)
