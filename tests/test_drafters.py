"""Drafters for the embedded default (specwatch.localvllm.drafters) and their CLI checks.

A tiny stand-in target (a few small tensors, the real file layout) keeps these fast; the real
acceptance of the derived drafters is measured in tests/test_drafters_realvllm.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from specwatch.cli import main
from specwatch.localvllm import cli as lvcli
from specwatch.localvllm.drafters import DRAFTERS, DrafterError, check_drafter_dir, derive_drafter, draft_model_config, drafter_dir, resolve_drafter


def make_target(root: Path, vocab: int = 64) -> Path:
    d = root / "SmolLM2-135M-Instruct"
    d.mkdir(parents=True)
    g = torch.Generator().manual_seed(123)
    save_file({
        "model.embed_tokens.weight": torch.randn(vocab, 8, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": torch.randn(16, 8, generator=g).to(torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": (3 * torch.randn(8, 8, generator=g)).to(torch.bfloat16),
        "model.layers.0.input_layernorm.weight": torch.ones(8).to(torch.bfloat16),
    }, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"vocab_size": vocab, "architectures": ["LlamaForCausalLM"]}))
    (d / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {f"t{i}": i for i in range(vocab)}}, "added_tokens": []}))
    (d / "tokenizer_config.json").write_text("{}")
    (d / ".specwatch-prepared.json").write_text("{}")
    return d


def test_recipe_noise_is_relative_seeded_and_spares_embeddings_and_norms(tmp_path):
    target = make_target(tmp_path)
    path = derive_drafter("close", target)
    assert path == drafter_dir("close", target) and path != target
    t, d = load_file(str(target / "model.safetensors")), load_file(str(path / "model.safetensors"))
    assert torch.equal(t["model.embed_tokens.weight"], d["model.embed_tokens.weight"])
    assert torch.equal(t["model.layers.0.input_layernorm.weight"], d["model.layers.0.input_layernorm.weight"])
    for key in ("model.layers.0.mlp.up_proj.weight", "model.layers.0.self_attn.q_proj.weight"):
        diff = (d[key].float() - t[key].float())
        ratio = float(diff.std() / t[key].float().std())
        assert 0.06 < ratio < 0.14, (key, ratio)  # sigma 0.10 of each matrix's own std (bf16 rounding aside)
    first = (path / "model.safetensors").read_bytes()
    derive_drafter("close", target, force=True)
    assert (path / "model.safetensors").read_bytes() == first  # seeded: the same bytes again
    far = load_file(str(derive_drafter("far", target) / "model.safetensors"))
    k = "model.layers.0.mlp.up_proj.weight"
    assert float((far[k].float() - t[k].float()).std()) > 1.5 * float((d[k].float() - t[k].float()).std())
    marker = json.loads((path / ".specwatch-drafter.json").read_text())
    assert marker["sigma"] == DRAFTERS["close"].sigma and marker["seed"] == DRAFTERS["close"].seed
    assert "not a distilled" in marker["note"]


def test_target_drafter_is_the_target_itself(tmp_path):
    target = make_target(tmp_path)
    assert derive_drafter("target", target) == target
    assert resolve_drafter("target", target) == ("target", target)


def test_bad_drafters_are_named_in_one_line(tmp_path):
    target = make_target(tmp_path)
    with pytest.raises(DrafterError, match="unknown drafter 'nope'"):
        resolve_drafter("nope", target)
    other = make_target(tmp_path / "other", vocab=65)
    with pytest.raises(DrafterError, match="vocabulary differs"):
        check_drafter_dir(other, target, "other")
    close = derive_drafter("close", target)
    data = (close / "model.safetensors").read_bytes()
    (close / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(DrafterError, match="drafter close: damaged directory .*truncated"):
        resolve_drafter("close", target)
    (close / "tokenizer.json").unlink()
    with pytest.raises(DrafterError, match="missing tokenizer.json"):
        check_drafter_dir(close, target, "close")


def test_draft_model_config():
    assert draft_model_config("/d", 3) == {"method": "draft_model", "model": "/d", "num_speculative_tokens": 3}
    with pytest.raises(ValueError):
        draft_model_config("/d", 0)


@pytest.fixture
def no_server(monkeypatch):
    started = []
    monkeypatch.setattr(lvcli, "VllmServer", lambda *a, **k: started.append(1) or pytest.fail("server started"))
    return started


@pytest.mark.parametrize("case", ["unknown", "vocab", "damaged"])
def test_vllm_bad_drafter_exits_2_with_one_line_and_starts_nothing(tmp_path, no_server, case):
    target = make_target(tmp_path)
    if case == "unknown":
        arg, want = "nope", "unknown drafter 'nope'"
    elif case == "vocab":
        arg, want = str(make_target(tmp_path / "other", vocab=65)), "vocabulary differs"
    else:
        close = derive_drafter("close", target)
        (close / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
        arg, want = "close", "drafter close: damaged directory"
    r = CliRunner().invoke(main, ["vllm", "--model-dir", str(target), "--drafter", arg, "-k", "3", "--port", "1"])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and want in lines[0] and "Traceback" not in r.output
    assert no_server == []


def test_prepare_model_unknown_drafter_exits_2(tmp_path):
    r = CliRunner().invoke(main, ["prepare-model", "--dest", str(tmp_path / "m"), "--drafter", "huge"])
    assert r.exit_code == 2 and "unknown drafter 'huge'" in r.output
    assert not (tmp_path / "m").exists()


def test_prepare_model_derives_named_drafters(tmp_path):
    target = make_target(tmp_path)
    r = CliRunner().invoke(main, ["prepare-model", "--dest", str(target), "--drafter", "close", "--drafter", "far"])
    assert r.exit_code == 0, r.output
    assert "drafter close (sigma 0.1, seed 1)" in r.output
    for n in ("close", "far"):
        check_drafter_dir(drafter_dir(n, target), target, n)


def test_demo_draft_model_with_a_bad_drafter_exits_2_before_anything_starts(monkeypatch):
    import subprocess

    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("something was started"))
    r = CliRunner().invoke(main, ["demo", "--method", "draft_model", "--drafter", "nope"])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "unknown drafter 'nope'" in lines[0]
