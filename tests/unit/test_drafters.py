"""Drafters for the embedded default (specwatch.localvllm.drafters) and their CLI checks.

A tiny stand-in target (a few small tensors, the real file layout) keeps these fast; the real
acceptance of the derived drafters is measured in tests/integration/test_drafters_realvllm.py. The vocabulary
check is also run on a throwaway copy of the real embedded model and its close drafter (the
tokenizer.json of SmolLM2-135M-Instruct, 49 152 tokens) with two token ids swapped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from specwatch.cli import main
from specwatch.common.processes import free_port
from specwatch.localvllm import cli as lvcli, server as lvserver
from specwatch.localvllm.drafters import (
    DRAFTERS,
    DrafterError,
    check_drafter_dir,
    derive_drafter,
    draft_model_config,
    drafter_dir,
    resolve_drafter,
)
from specwatch.localvllm.model import default_model_dir, model_dir_is_complete

# The cpu extra's torch, safetensors and tokenizers are imported where they are used, not at the
# top: every worker of scripts/test.sh's fast stage collects (imports) this module before -m
# leaves its tests out, and importing torch costs each of them seconds.
pytestmark = pytest.mark.vllmpkg


@pytest.fixture(scope="module", autouse=True)
def cpu_extra():
    pytest.importorskip("torch", reason="needs the cpu extra (torch): pip install -e '.[cpu]'", exc_type=ImportError)


def write_tokenizer(path: Path, vocab: dict[str, int], merges=(), added=()) -> None:
    """A real tokenizer.json (written by the tokenizers library): BPE over ``vocab`` with ``merges``
    and ``added`` special tokens (appended after the vocabulary)."""
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    if added:
        tok.add_special_tokens(list(added))
    tok.save(str(path))


def make_target(root: Path, vocab: int = 64) -> Path:
    import torch
    from safetensors.torch import save_file

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
    write_tokenizer(d / "tokenizer.json", {f"t{i}": i for i in range(vocab)})
    (d / "tokenizer_config.json").write_text("{}")
    (d / ".specwatch-prepared.json").write_text("{}")
    return d


def test_recipe_noise_is_relative_seeded_and_spares_embeddings_and_norms(tmp_path):
    import torch
    from safetensors.torch import load_file

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


def _tiny_pair(tmp_path: Path) -> tuple[Path, Path]:
    """(target, its close drafter) on the tiny stand-in (the drafter's files copied from the target)."""
    target = make_target(tmp_path)
    return target, derive_drafter("close", target)


def test_same_size_vocabulary_with_other_tokens_is_refused(tmp_path):
    target, close = _tiny_pair(tmp_path)
    vocab = {f"t{i}": i for i in range(64)}
    vocab["t0"], vocab["t1"] = 1, 0  # two ids swapped: same size, same token strings
    write_tokenizer(close / "tokenizer.json", vocab)
    with pytest.raises(DrafterError) as err:
        check_drafter_dir(close, target, "close")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("drafter close: vocabulary differs from the target's")
    assert "2 of 64 token ids differ (first: id 0 is 't1' in the drafter, 't0' in the target; 64 vs 64 tokens)" in msg


def test_added_tokens_and_merges_are_compared_and_other_fields_are_not(tmp_path):
    from tokenizers import AddedToken, Tokenizer

    target, close = _tiny_pair(tmp_path)
    base = {f"t{i}": i for i in range(62)}
    write_tokenizer(target / "tokenizer.json", base, added=[AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    write_tokenizer(close / "tokenizer.json", base, added=[AddedToken("<s>", special=True)])
    tok = Tokenizer.from_file(str(close / "tokenizer.json"))
    tok.add_tokens([AddedToken("</s>", special=False)])  # the same id and text, but not special
    tok.save(str(close / "tokenizer.json"))
    with pytest.raises(DrafterError, match=r"added token id 63: \('</s>', False\) in the drafter, \('</s>', True\) in the target"):
        check_drafter_dir(close, target, "close")

    letters = {"a": 0, "b": 1, "ab": 2, **{f"t{i}": i for i in range(3, 64)}}
    write_tokenizer(target / "tokenizer.json", letters, merges=[("a", "b")])
    write_tokenizer(close / "tokenizer.json", letters)
    with pytest.raises(DrafterError, match=r"same tokens but other BPE merges \(0 vs 1 merges, first difference at merge 0\)"):
        check_drafter_dir(close, target, "close")

    tok = Tokenizer.from_file(str(target / "tokenizer.json"))
    tok.enable_padding(pad_id=0, pad_token="a")  # a field that is not the vocabulary: other bytes, same vocabulary
    tok.save(str(close / "tokenizer.json"))
    assert (close / "tokenizer.json").read_bytes() != (target / "tokenizer.json").read_bytes()
    check_drafter_dir(close, target, "close")

    (close / "tokenizer.json").write_text("{not json")
    with pytest.raises(DrafterError, match=r"^drafter close: damaged directory .*: config/tokenizer unreadable \(.+\)$"):
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


# -- the real embedded model: a throwaway copy whose close drafter's tokenizer has two ids swapped --


@pytest.fixture(scope="module")
def swapped_copy(tmp_path_factory):
    """``(target, close, (id_a, id_b))``: a copy of the prepared embedded model (its small files;
    ``model.safetensors`` a symlink to the prepared one, only ever read) and, as its sibling, a full
    copy of its close drafter (copied from the prepared one, or derived from the copy when there is
    none) whose tokenizer.json has the tokens of ids 100 and 101 swapped: the same 49 152 tokens,
    the same merges and size, other ids. The prepared model cache is not modified."""
    real = default_model_dir()
    if not model_dir_is_complete(real):
        pytest.skip(f"the embedded model is not prepared in {real} (bash scripts/setup.sh)")
    root = tmp_path_factory.mktemp("models")
    target = root / real.name
    target.mkdir()
    for f in real.iterdir():
        if f.name == "model.safetensors":
            (target / f.name).symlink_to(f)
        elif f.is_file():
            shutil.copy2(f, target / f.name)
    close = drafter_dir("close", target)
    real_close = drafter_dir("close", real)
    try:
        check_drafter_dir(real_close, real, "close")
        shutil.copytree(real_close, close)
    except DrafterError:
        derive_drafter("close", target)
    tok = json.loads((close / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    vocab[by_id[100]], vocab[by_id[101]] = 101, 100
    (close / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    return target, close, (by_id[100], by_id[101])


def _one_line(r, want: str) -> str:
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    assert want in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("path", ["prepare-model", "vllm", "sweep", "demo"])
def test_real_drafter_with_swapped_token_ids_exits_2_on_every_path(swapped_copy, monkeypatch, tmp_path, path):
    """The same vocabulary size, other tokens: each command names the drafter and the first
    differing id in one line, exits 2 and starts nothing (sizes alone would have passed: both
    tokenizers hold 49 152 tokens and config vocab_size 49 152)."""
    target, close, (tok_a, tok_b) = swapped_copy
    monkeypatch.setenv("SPECWATCH_MODEL_DIR", str(target))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("something was started"))
    monkeypatch.setattr(lvcli, "VllmServer", lambda *a, **k: pytest.fail("server started"))
    before = (close / "tokenizer.json").read_bytes()
    if path == "prepare-model":
        args = ["prepare-model", "--drafter", "close"]
    elif path == "vllm":
        args = ["vllm", "--drafter", "close", "-k", "3", "--port", "1"]
    elif path == "sweep":
        args = ["sweep", "--result-file", str(tmp_path / "s.json"), "--drafter", "close", "--no-progress"]
    else:
        args = ["demo", "--method", "draft_model", "--drafter", "close", "--result-dir", str(tmp_path / "demo")]
    line = _one_line(CliRunner().invoke(main, args), "drafter close: vocabulary differs from the target's: ")
    assert f"2 of 49152 token ids differ (first: id 100 is {tok_b!r} in the drafter, {tok_a!r} in the target" in line
    assert (close / "tokenizer.json").read_bytes() == before
    assert not (tmp_path / "s.json").exists() and not (tmp_path / "demo").exists()


# -- the happy path of `specwatch vllm --drafter`: what reaches vLLM's command line --


def test_vllm_with_a_drafter_serves_draft_model_with_per_request_metrics(tmp_path, monkeypatch):
    """`specwatch vllm --drafter close -k 2` builds vLLM's argv with a draft_model speculative
    config (model = the close drafter's directory, num_speculative_tokens 2) and
    ``--per-request-spec-decode-metrics detailed``. The real VllmServer runs; only the process
    start (subprocess.Popen, which records the argv and then acts as Ctrl-C), the machine-wide lock
    and the signal handlers are replaced."""
    target = make_target(tmp_path)
    argv: list[list[str]] = []

    class NoLock:
        def __init__(self, *a, **k): pass
        def acquire(self): pass
        def release(self): pass

    def popen(cmd, **kwargs):
        argv.append(list(cmd))
        raise KeyboardInterrupt  # the CLI's Ctrl-C path: "stopping", exit 0

    monkeypatch.setattr(lvserver, "VllmLock", NoLock)
    monkeypatch.setattr(lvserver.subprocess, "Popen", popen)
    monkeypatch.setattr(lvcli, "install_stop_signals", lambda: None)
    r = CliRunner().invoke(main, ["vllm", "--model-dir", str(target), "--drafter", "close", "-k", "2", "--port", str(free_port())])
    assert r.exit_code == 0, r.output
    assert "stopping" in r.output
    (cmd,) = argv
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec == {"method": "draft_model", "model": str(drafter_dir("close", target)), "num_speculative_tokens": 2}
    assert cmd[cmd.index("--per-request-spec-decode-metrics") + 1] == "detailed"
    assert cmd[cmd.index("--model") + 1] == str(target)
    check_drafter_dir(drafter_dir("close", target), target, "close")  # derived on first use
