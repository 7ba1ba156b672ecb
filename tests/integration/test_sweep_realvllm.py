"""A tiny sweep on the real embedded vLLM (moved from tests/unit/test_sweep.py: it starts real vLLM
servers of its own, under the machine-wide lock, before the session's ``real_vllm``)."""

from __future__ import annotations

import pytest

from specwatch.choosek.resultfile import measurements
from specwatch.choosek.sweep import SweepPlan, build_configs, run_sweep
from records import sweep_record


def _need_real_vllm() -> None:
    """Skip unless a real vLLM can run here and the embedded model is prepared."""
    import realstack

    reason = realstack.skip_real_reason()
    if reason:
        pytest.skip(reason)
    from specwatch.localvllm.model import default_model_dir, model_dir_is_complete

    if not model_dir_is_complete(default_model_dir()):
        pytest.skip("the embedded model is not prepared (specwatch prepare-model)")


@pytest.mark.realvllm
def test_tiny_sweep_on_the_real_embedded_vllm(tmp_path):
    """Baseline + ngram k=2, copy, concurrency 1, a few prompts, on the real vLLM (holds the lock)."""
    _need_real_vllm()
    out = tmp_path / "real.json"
    p = SweepPlan(build_configs((2,), (), True), ("copy",), (1,), 32, 2, 1, 1, 1, 0)
    doc = run_sweep(p, out, progress=False, echo=lambda *a, **k: None).to_json()
    assert doc["status"] == "complete"
    servers = {s["config"]: s for s in doc["servers"]}
    assert set(servers) == {"baseline", "ngram-k2"}
    for s in servers.values():
        assert s["startup_seconds"] > 1 and s["kv_cache_tokens"] > 0
    ms = {m.config: m for m in measurements(sweep_record(doc))}
    assert ms["baseline"].output_throughput > 0 and ms["baseline"].position_rates == ()
    spec = ms["ngram-k2"]
    assert len(spec.position_rates) == 2 and spec.drafts > 0
    assert spec.position_rates[0] >= spec.position_rates[1]
    assert 1 <= spec.acceptance_length <= 3
    assert spec.request_steps and spec.tokens_per_step >= 1


@pytest.mark.realvllm
def test_an_aa_start_on_the_real_embedded_vllm(tmp_path):
    """--aa-starts 1 with no speculative configuration: the baseline, and aa-1 (the same server
    started again, no speculation) measured beside it in paired rounds; its cell gives the
    between-starts spread and is never a measurement of its own."""
    _need_real_vllm()
    from specwatch.choosek.resultfile import aa_measurements, start_spread

    out = tmp_path / "aa.json"
    p = SweepPlan(build_configs((), (), True, aa_starts=1), ("copy",), (1,), 32, 2, 1, 2, 1, 0)
    rec = sweep_record(run_sweep(p, out, progress=False, echo=lambda *a, **k: None).to_json())
    assert rec.status == "complete"
    assert [s.config for s in rec.servers] == ["baseline", "aa-1"]
    (cell,) = rec.aa_cells()
    assert cell.paired and cell.k == 0 and len(cell.baseline_batches) == len(cell.batches) == 3  # 1 warm-up + 2
    (aa,) = aa_measurements(rec)
    assert aa.drafts in (None, 0) and aa.position_rates == ()  # no speculation on the A/A start
    assert [m.config for m in measurements(rec)] == ["baseline"]
    spread = start_spread(rec, str(out))
    assert spread is not None and spread.cells == 1 and spread.log_sd >= 0.0
