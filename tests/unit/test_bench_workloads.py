"""Request shapes of every workload of ``specwatch bench`` (built objects and what reaches a server)."""

from __future__ import annotations

import json
import math

import pytest

from specwatch.bench.runner import BenchConfig, run_bench
from specwatch.testing.stubserver import StubConfig, ThreadedStub
from specwatch.bench.workloads import (
    COPY_TEXTS,
    EXPLAIN_PROMPT,
    RANDOM_WORDS,
    WORD_CHAIN_WORDS,
    WORKLOADS,
    WorkloadError,
    WorkloadOptions,
    build_requests,
    equivalence_requests,
    load_sharegpt,
    parse_workloads,
    sample_sharegpt_path,
)

SAMPLE = str(sample_sharegpt_path())


def opts(**kw):
    return WorkloadOptions(dataset_path=SAMPLE, **kw)


def test_copy_prompt_holds_text_and_first_copy():
    reqs = build_requests("copy", 6, opts())
    assert {r.endpoint for r in reqs} == {"completions"}
    for r in reqs:
        assert (r.max_tokens, r.temperature, r.ignore_eos) == (256, 0.0, True)
    # the six texts are all used, each appearing twice (text + "Copy 1:"), then "Copy 2:" ends the prompt
    for r in reqs:
        assert r.prompt.endswith("Copy 2:\n")
        matches = [p for p, code in COPY_TEXTS if p in r.prompt and code in r.prompt]
        assert len(matches) == 1 and r.prompt.count(matches[0]) == 2
    assert len({r.prompt for r in reqs}) == 6


def test_word_chain_draws_200_words_from_30():
    assert len(WORD_CHAIN_WORDS) == 30 == len(set(WORD_CHAIN_WORDS))
    r = build_requests("word-chain", 3, opts())
    for req in r:
        words = req.prompt.split("\n", 1)[1].split()
        assert len(words) == 200 and set(words) <= set(WORD_CHAIN_WORDS)
        assert (req.max_tokens, req.temperature, req.ignore_eos) == (256, 0.0, True)
    assert len({req.prompt for req in r}) == 3


def test_random_output_token_ids_uniform_and_seeded():
    a = build_requests("random-output", 4, opts(vocab_size=1000), batch=2)
    b = build_requests("random-output", 4, opts(vocab_size=1000), batch=2)
    c = build_requests("random-output", 4, opts(vocab_size=1000), batch=3)
    d = build_requests("random-output", 4, opts(vocab_size=1000, seed=1), batch=2)
    assert a == b  # the same prompts on every server
    assert [r.prompt for r in a] != [r.prompt for r in c]
    assert [r.prompt for r in a] != [r.prompt for r in d]
    ids = [t for r in a for t in r.prompt]
    assert all(isinstance(t, int) and 0 <= t < 1000 for t in ids)
    assert all(len(r.prompt) == 200 and r.prompt_len == 200 for r in a)
    # uniform: 800 draws over 1000 ids leave no id drawn very often
    assert max(ids.count(t) for t in set(ids)) < 8
    assert (a[0].temperature, a[0].ignore_eos, a[0].max_tokens) == (1.0, True, 256)
    payload = a[0].payload("m")
    assert payload["prompt"] == list(a[0].prompt)


def test_default_vocab_is_smollm2():
    r = build_requests("random-output", 50, opts())
    assert max(t for q in r for t in q.prompt) < 49152
    assert max(t for q in r for t in q.prompt) > 40000  # drawn from the whole vocabulary


def test_chat_workloads():
    code = build_requests("code-return", 3, opts())
    assert all(r.endpoint == "chat" and r.max_tokens is None and r.ignore_eos is False for r in code)
    for r in code:
        (role, content), = r.messages
        assert role == "user" and "`budget`" in content and "`token_budget`" in content and "```python" in content
        body = r.payload("m")
        assert body["messages"] == [{"role": "user", "content": content}]
        assert "max_completion_tokens" not in body and "ignore_eos" not in body and body["temperature"] == 0.0
    ex = build_requests("explain", 2, opts())
    assert all(r.messages == (("user", EXPLAIN_PROMPT),) for r in ex)
    assert "three short paragraphs" in EXPLAIN_PROMPT


def test_random_words():
    assert len(RANDOM_WORDS) == 200
    r = build_requests("random-words", 2, opts())
    words = r[0].prompt.split()
    assert len(words) == 200 and set(words) <= set(RANDOM_WORDS)
    assert r[0].prompt != r[1].prompt


def test_sharegpt_loader_and_requests(tmp_path):
    items = load_sharegpt(SAMPLE)
    with open(SAMPLE, encoding="utf-8") as f:
        raw = json.loads(f.read())
    assert len(items) == len(raw) - 2  # the single-turn and gpt-first entries are skipped
    reqs = build_requests("sharegpt", 30, opts())  # more requests than conversations: reused
    prompts = {i.prompt: i for i in items}
    assert all(r.prompt in prompts and r.endpoint == "completions" for r in reqs)
    assert all(r.max_tokens == prompts[r.prompt].estimated_output_len for r in reqs)
    assert reqs[0].temperature is None and "temperature" not in reqs[0].payload("m")
    assert {r.max_tokens for r in build_requests("sharegpt", 5, opts(output_len=7))} == {7}

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(WorkloadError, match="cannot read"):
        load_sharegpt(bad)
    with pytest.raises(WorkloadError, match="not found"):
        load_sharegpt(tmp_path / "missing.json")
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps([{"conversations": [{"from": "gpt", "value": "x"}, {"from": "human", "value": "y"}]}]))
    with pytest.raises(WorkloadError, match="no usable"):
        load_sharegpt(empty)
    with pytest.raises(WorkloadError, match="dataset-path"):
        build_requests("sharegpt", 1, WorkloadOptions())


def test_overrides_and_validation():
    r = build_requests("explain", 1, opts(output_len=33, ignore_eos=True, temperature=0.7))[0]
    body = r.payload("m")
    assert body["max_completion_tokens"] == 33 and body["ignore_eos"] is True and body["temperature"] == 0.7
    r = build_requests("copy", 1, opts(ignore_eos=False, output_len=5))[0].payload("m")
    assert "ignore_eos" not in r and r["max_tokens"] == 5
    assert r["stream"] is True and r["stream_options"] == {"include_usage": True}
    with pytest.raises(WorkloadError):
        WorkloadOptions(output_len=0)
    with pytest.raises(WorkloadError, match="unknown workload"):
        parse_workloads("copy,nope")
    assert parse_workloads(" copy , explain ") == ("copy", "explain")
    with pytest.raises(WorkloadError):
        build_requests("copy", 0, opts())


def test_equivalence_prompts_are_the_seeds():
    reqs = equivalence_requests()
    assert [r.workload for r in reqs] == ["copy"] * 6 + ["word-chain"] * 6
    assert all(r.temperature == 0.0 and r.max_tokens == 128 and r.ignore_eos for r in reqs)
    assert len({r.prompt for r in reqs}) == 12


def test_every_workload_reaches_the_server_in_shape(tmp_path):
    """Run every workload against the stub and check the JSON bodies it received."""
    with ThreadedStub(StubConfig(k=0, default_tokens=3)) as stub:
        cfg = BenchConfig(base_url=stub.url, workloads=tuple(WORKLOADS), concurrencies=(2,), num_prompts=2,
                          num_batches=1, warmup_batches=0, options=opts(output_len=4), result_dir=str(tmp_path),
                          progress=False)
        res = run_bench(cfg)
        payloads = stub.state.payloads
    assert res.status == "complete"
    assert all(b.completed == 2 and b.failed == 0 for b in res.batches)
    assert len(payloads) == 2 * len(WORKLOADS)
    for p in payloads:
        assert p["model"] == "stub-model" and p["stream"] is True
        assert p["stream_options"] == {"include_usage": True}
    chat = [p for p in payloads if "messages" in p]
    comp = [p for p in payloads if "prompt" in p]
    assert len(chat) == 4 and all(p["max_completion_tokens"] == 4 for p in chat)
    assert len(comp) == 10 and all(p["max_tokens"] == 4 for p in comp)
    token_prompts = [p for p in comp if isinstance(p["prompt"], list)]
    assert len(token_prompts) == 2 and all(p["temperature"] == 1.0 and p["ignore_eos"] for p in token_prompts)
    # sharegpt leaves temperature to the server, like vllm bench serve
    assert sum(1 for p in comp if "temperature" not in p) == 2
    assert not math.isnan(res.batches[0].output_throughput)


def test_a_sharegpt_path_that_is_not_a_regular_file_is_refused_before_reading(tmp_path):
    """A FIFO would block forever and /dev/zero would fill the memory: one line instead."""
    import os

    from specwatch.bench.workloads import WorkloadError, load_sharegpt

    fifo = tmp_path / "share.json"
    os.mkfifo(fifo)
    with pytest.raises(WorkloadError, match="must be a regular file, this is a FIFO"):
        load_sharegpt(fifo)
    with pytest.raises(WorkloadError, match="must be a regular file, this is a device"):
        load_sharegpt("/dev/zero")
    with pytest.raises(WorkloadError, match="this is a directory"):
        load_sharegpt(tmp_path)
