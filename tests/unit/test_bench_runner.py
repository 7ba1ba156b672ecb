"""Runs against the stub: spec-decode deltas, result files, the bench's own metrics, the
equivalence check, secrets, and the baseline/speculative comparison."""

from __future__ import annotations

import csv
import json
import math
import statistics
import urllib.request

import pytest
from prometheus_client import generate_latest

from specwatch.bench.equivalence import compare_outputs, first_difference
from specwatch.bench.metrics import BenchMetrics
from specwatch.bench.results import latency_stats, percentile
from specwatch.bench.runner import BenchConfig, BenchConfigError, run_bench, spec_stats
from specwatch.testing.stubserver import StubConfig, ThreadedStub, prompt_key, token_text
from specwatch.bench.workloads import WorkloadOptions, equivalence_requests
from specwatch.specdecode.decision import t975
from specwatch.specdecode.metrics import parse_metrics


def cfg(url, tmp_path, **kw):
    base = dict(base_url=url, workloads=("copy",), concurrencies=(1,), num_prompts=3, num_batches=2,
                warmup_batches=1, options=WorkloadOptions(output_len=10), result_dir=str(tmp_path),
                progress=False, equivalence=False)
    base.update(kw)
    return BenchConfig(**base)


def test_spec_decode_deltas_equal_counter_differences(tmp_path):
    with ThreadedStub(StubConfig(k=4, accept_pattern=(4, 1, 0, 3, 2))) as stub:
        res = run_bench(cfg(stub.url, tmp_path, concurrencies=(1, 3), workloads=("copy", "explain")))
        snaps = list(stub.state.metrics_snapshots)
    assert len(res.batches) == 2 * 2 * 3
    assert len(snaps) == 2 * len(res.batches)  # read before and after every batch
    for i, b in enumerate(res.batches):
        before, after = snaps[2 * i], snaps[2 * i + 1]
        d = {k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted", "generation_tokens")}
        pp = [a - c for a, c in zip(after["per_pos"], before["per_pos"], strict=True)]
        rec = b.to_record().to_json()
        assert d["drafts"] > 0
        assert rec["spec_decode_num_drafts"] == d["drafts"]
        assert rec["spec_decode_draft_tokens"] == d["draft_tokens"]
        assert rec["spec_decode_accepted_tokens"] == d["accepted"]
        assert rec["spec_decode_generation_tokens"] == d["generation_tokens"] == b.total_output_tokens
        assert rec["spec_decode_acceptance_rate"] == pytest.approx(100 * d["accepted"] / d["draft_tokens"])
        assert rec["spec_decode_acceptance_length"] == pytest.approx(1 + d["accepted"] / d["drafts"])
        assert rec["spec_decode_per_position_acceptance_rates"] == pytest.approx([p / d["drafts"] for p in pp])
        assert rec["spec_decode_num_speculative_tokens"] == 4
    # pooled over the measured batches of a cell = the summed deltas
    cell = res.summary()[0].to_record().to_json()
    measured = [i for i, b in enumerate(res.batches[:3]) if not b.warmup]
    acc = sum(snaps[2 * i + 1]["accepted"] - snaps[2 * i]["accepted"] for i in measured)
    dt = sum(snaps[2 * i + 1]["draft_tokens"] - snaps[2 * i]["draft_tokens"] for i in measured)
    assert cell["spec_decode_acceptance_rate"] == pytest.approx(100 * acc / dt)
    assert cell["num_batches"] == 2


def test_spec_stats_without_speculation_and_on_reset():
    """A baseline (no spec-decode series) has no acceptance; a restarted server counts from 0."""
    base = StubConfig(k=0)
    from specwatch.testing.stubserver import StubServer

    s = StubServer(base)
    none = parse_metrics(s.metrics_text())
    st = spec_stats(none, none, "stub-model")
    assert st.schema == "none" and st.delta is None and st.acceptance_rate is None
    spec = StubServer(StubConfig(k=2, accept_pattern=(2,)))
    spec._generate(30)
    high = parse_metrics(spec.metrics_text())
    spec2 = StubServer(StubConfig(k=2, accept_pattern=(1,)))
    spec2._generate(6)
    low = parse_metrics(spec2.metrics_text())
    st = spec_stats(high, low, "stub-model")  # counters went down: restart, delta = after
    assert st.delta.accepted_tokens == spec2.state.accepted
    err = spec_stats(None, low, "m", "GET failed")
    assert err.delta is None and err.metrics_error == "GET failed"


def test_result_files_written_per_batch_and_complete(tmp_path):
    with ThreadedStub(StubConfig(k=4)) as stub:
        res = run_bench(cfg(stub.url, tmp_path, result_filename="run.json"))
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["status"] == "complete"
    assert len(doc["batches"]) == 3 and [b["warmup"] for b in doc["batches"]] == [True, False, False]
    b = doc["batches"][1]
    for k in ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
              "output_throughput", "mean_ttft_ms", "median_tpot_ms", "p90_itl_ms", "p99_e2el_ms",
              "spec_decode_acceptance_rate", "spec_decode_acceptance_length", "spec_decode_per_position_acceptance_rates"):
        assert k in b
    assert b["total_output_tokens"] == 30 and b["output_throughput"] == pytest.approx(30 / b["duration"])
    assert len(doc["summary"]) == 1 and doc["summary"][0]["num_batches"] == 2
    with open(tmp_path / "run.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and rows[2]["workload"] == "copy"
    assert float(rows[2]["output_throughput"]) == pytest.approx(doc["batches"][2]["output_throughput"])
    assert res.json_path == tmp_path / "run.json"


def test_latency_statistics_match_definitions():
    vals = [0.010, 0.020, 0.030, 0.040, 0.100]
    s = latency_stats("ttft", vals)
    assert s["mean_ttft_ms"] == pytest.approx(40.0)
    assert s["median_ttft_ms"] == pytest.approx(30.0)
    assert s["p90_ttft_ms"] == pytest.approx(76.0)  # numpy linear: 40 + 0.6 * 60
    assert s["p99_ttft_ms"] == pytest.approx(97.6)
    assert latency_stats("itl", [])["p99_itl_ms"] is None
    assert percentile([5.0], 99) == 5.0


def test_bench_metrics_exported(tmp_path):
    bm = BenchMetrics()
    with ThreadedStub(StubConfig(k=4, error_every=5)) as stub:
        res = run_bench(cfg(stub.url, tmp_path, num_prompts=4, concurrencies=(2,)), metrics=bm)
    g = bm.registry.get_sample_value
    lab = {"role": "speculative", "workload": "copy", "concurrency": "2"}
    assert g("specwatch_bench_requests_total", {**lab, "outcome": "error"}) == sum(b.failed for b in res.batches) == 2
    assert g("specwatch_bench_requests_total", {**lab, "outcome": "success"}) == 10
    assert g("specwatch_bench_output_tokens_total", lab) == sum(b.total_output_tokens for b in res.batches) == 100
    assert g("specwatch_bench_ttft_seconds_count", lab) == 10
    assert g("specwatch_bench_itl_seconds_count", lab) == 10 * 9
    assert g("specwatch_bench_active", lab) == 0  # run over
    assert g("specwatch_bench_in_flight_requests", {"role": "speculative"}) == 0
    last = res.batches[-1]
    assert g("specwatch_bench_output_throughput_tokens_per_second", lab) == pytest.approx(last.output_throughput)
    assert g("specwatch_bench_spec_decode_acceptance_rate", lab) == pytest.approx(last.spec.acceptance_rate)
    assert 0 < last.spec.acceptance_rate <= 1
    text = generate_latest(bm.registry).decode()
    assert "specwatch_bench_e2e_latency_seconds_bucket" in text


def test_bench_metrics_served_over_http():
    bm = BenchMetrics()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bm.serve(port, addr="127.0.0.1")
    try:
        bm.set_active("baseline", "copy", 8)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        bm.shutdown()
    assert 'specwatch_bench_active{concurrency="8",role="baseline",workload="copy"} 1.0' in body


def test_baseline_then_speculative_comparison_and_equivalence(tmp_path):
    marker = "Continue this list of words"
    with ThreadedStub(StubConfig(k=0)) as base, \
            ThreadedStub(StubConfig(k=4, diverge_marker=marker, diverge_at=5)) as spec:
        res = run_bench(cfg(spec.url, tmp_path, baseline_url=base.url, equivalence=True,
                            equivalence_output_len=12, workloads=("copy", "random-output")))
        base_payloads, spec_payloads = list(base.state.payloads), list(spec.state.payloads)
    # baseline ran first, entirely; then the speculative server
    assert [b.role for b in res.batches] == ["baseline"] * 6 + ["speculative"] * 6
    assert base_payloads[: 6 * 3] and all("prompt" in p for p in base_payloads)
    # the same prompts went to both servers (seeded)
    assert [p["prompt"] for p in base_payloads[:18]] == [p["prompt"] for p in spec_payloads[:18]]
    rows = res.comparison()
    assert [(r["workload"], r["max_concurrency"]) for r in rows] == [("copy", 1), ("random-output", 1)]
    for r in rows:
        assert r["ratio"] == pytest.approx(r["speculative_output_throughput"] / r["baseline_output_throughput"])
        assert 0 < r["spec_decode_acceptance_rate"] <= 100
        # the per-batch paired ratio: batch i of both roles, geometric mean and its t interval
        by = {(b.role, b.batch_index): b.output_throughput for b in res.batches
              if not b.warmup and b.workload == r["workload"] and b.max_concurrency == r["max_concurrency"]}
        idx = sorted(i for role, i in by if role == "speculative")
        logs = [math.log(by[("speculative", i)] / by[("baseline", i)]) for i in idx]
        half = t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
        assert r["paired_batches"] == len(idx) >= 2
        assert r["paired_ratio"] == pytest.approx(math.exp(statistics.fmean(logs)))
        assert r["paired_ratio_lower"] == pytest.approx(math.exp(statistics.fmean(logs) - half))
        assert r["paired_ratio_upper"] == pytest.approx(math.exp(statistics.fmean(logs) + half))
    eq = res.equivalence.to_json()
    assert eq["total"] == 12 and eq["matched"] == 6
    reqs = equivalence_requests(output_len=12)
    for p, r in zip(eq["prompts"], reqs, strict=True):
        if r.workload == "copy":
            assert p["identical"] and p["first_difference"] is None
        else:
            key = prompt_key(r.payload("stub-model"))
            same = "".join(token_text(key, i) for i in range(5))
            assert not p["identical"] and p["first_difference"] == len(same) + 1  # " t…" vs " x…"
    doc = json.loads(res.json_path.read_text())
    assert doc["equivalence"]["matched"] == 6 and len(doc["comparison"]) == 2


@pytest.mark.parametrize("tokenizer", [True, False], ids=["server-tokenizer", "text-only"])
def test_equivalence_names_the_first_differing_token(tmp_path, tokenizer):
    """Issue #25: the report said only "speculation changed some outputs". Each differing prompt
    now carries its first differing token: from the baseline server's /tokenize + /detokenize
    (vLLM's endpoints; the stub serves them when asked), else the piece of text there."""
    marker = "Continue this list of words"  # the word-chain equivalence prompts
    with ThreadedStub(StubConfig(k=0, tokenizer=tokenizer)) as base, \
            ThreadedStub(StubConfig(k=4, diverge_marker=marker, diverge_at=5)) as spec:
        res = run_bench(cfg(spec.url, tmp_path, baseline_url=base.url, equivalence=True,
                            equivalence_output_len=12, workloads=("copy",)))
    reqs = equivalence_requests(output_len=12)
    differing = [(p, r) for p, r in zip(res.equivalence.to_json()["prompts"], reqs, strict=True) if not p["identical"]]
    assert len(differing) == 6
    for p, r in differing:
        key = prompt_key(r.payload("stub-model"))
        tok = p["first_differing_token"]
        assert (tok["baseline"], tok["speculative"]) == (token_text(key, 5), token_text(key, 5, diverged=True)), tok
        assert tok["source"] == ("tokenizer" if tokenizer else "text")
        assert tok["index"] == (5 if tokenizer else None)
    assert all(p["first_differing_token"] is None for p in res.equivalence.to_json()["prompts"] if p["identical"])


def test_first_difference_and_failed_prompts():
    assert first_difference("abc", "abc") is None
    assert first_difference("abc", "abd") == 2
    assert first_difference("ab", "abc") == 2
    from specwatch.bench.backend import RequestOutcome

    reqs = equivalence_requests()[:2]
    ok = RequestOutcome(0, success=True, generated_text="same")
    bad = RequestOutcome(1, success=False, error="HTTP 500")
    out = compare_outputs(reqs, [ok, ok], [ok, bad]).to_json()
    assert out["matched"] == 1 and out["prompts"][1]["error"].startswith("speculative: HTTP 500")


def test_api_key_never_in_results(tmp_path):
    key = "sk-specwatch-TOPSECRET-42"
    with ThreadedStub(StubConfig(k=4, require_api_key=key)) as stub:
        c = cfg(stub.url, tmp_path, api_key=key, result_filename="r.json")
        res = run_bench(c)
        seen = set(stub.state.auth_headers)
    assert seen == {f"Bearer {key}"}
    assert all(b.failed == 0 for b in res.batches)
    for f in tmp_path.iterdir():
        assert key not in f.read_text(), f
    assert key not in repr(c)
    assert json.loads((tmp_path / "r.json").read_text())["config"]["api_key_set"] is True


def test_request_rate_and_config_errors(tmp_path):
    with ThreadedStub(StubConfig(k=0)) as stub:
        res = run_bench(cfg(stub.url, tmp_path, request_rate=200.0, num_prompts=5, concurrencies=(2,),
                            warmup_batches=0, num_batches=1))
    assert res.batches[0].completed == 5 and res.batches[0].to_record().to_json()["request_rate"] == 200.0
    with pytest.raises(BenchConfigError, match="concurrencies"):
        cfg("http://x", tmp_path, concurrencies=(0,))
    with pytest.raises(BenchConfigError, match="dataset"):
        cfg("http://x", tmp_path, workloads=("sharegpt",), options=WorkloadOptions())
    with pytest.raises(BenchConfigError, match="http"):
        cfg("localhost:8000", tmp_path)
    with pytest.raises(BenchConfigError):
        cfg("http://x", tmp_path, request_rate=0.0)
    assert math.isinf(cfg("http://x", tmp_path).request_rate)


def test_default_result_names_never_collide(tmp_path):
    """Runs started in the same second get -2, -3 … names; an existing file is left alone."""
    c = cfg("http://127.0.0.1:9", tmp_path)
    first = tmp_path / "specwatch-bench-20260101-000000.json"
    first.write_text("earlier run\n")
    p2, c2 = c.claim_result_paths("20260101-000000")
    p3, c3 = c.claim_result_paths("20260101-000000")
    assert p2.name == "specwatch-bench-20260101-000000-2.json" and c2 == p2.with_suffix(".csv")
    assert p3.name == "specwatch-bench-20260101-000000-3.json"
    assert first.read_text() == "earlier run\n"
    # a CSV left alone by an earlier run also blocks the name
    (tmp_path / "specwatch-bench-20260101-000001.csv").write_text("x\n")
    p4, _ = c.claim_result_paths("20260101-000001")
    assert p4.name == "specwatch-bench-20260101-000001-2.json"
    # an explicit name is used as given (overwritten)
    named = cfg("http://127.0.0.1:9", tmp_path, result_filename="run.json")
    (tmp_path / "run.json").write_text("old\n")
    assert named.claim_result_paths("20260101-000000")[0] == tmp_path / "run.json"


def test_two_quick_runs_keep_both_files(tmp_path):
    with ThreadedStub(StubConfig(k=4)) as stub:
        a = run_bench(cfg(stub.url, tmp_path, num_batches=1, warmup_batches=0, num_prompts=1))
        b = run_bench(cfg(stub.url, tmp_path, num_batches=1, warmup_batches=0, num_prompts=1))
    assert a.json_path != b.json_path
    for r in (a, b):
        doc = json.loads(r.json_path.read_text())
        assert doc["status"] == "complete" and len(doc["batches"]) == 1


@pytest.mark.parametrize("where", ["refused", "404"])
def test_failure_at_start_recorded_as_failed(tmp_path, where):
    """An unreachable server or a 404 on /v1/models: the result file says "failed" and why."""
    import socket

    if where == "refused":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(RuntimeError) as ei:
            run_bench(cfg(url, tmp_path, result_filename="r.json"))
    else:
        with ThreadedStub(StubConfig(k=4, models_status=404)) as stub, pytest.raises(RuntimeError) as ei:
            run_bench(cfg(stub.url, tmp_path, result_filename="r.json"))
        assert "HTTP 404" in str(ei.value)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["status"] == "failed"
    assert doc["error"] == str(ei.value) and "/v1/models" in doc["error"]
    assert doc["batches"] == []


def test_response_cap_and_read_timeout_reach_the_backend(tmp_path):
    with ThreadedStub(StubConfig(k=0, flood_bytes=2 * 1024 * 1024)) as stub:
        res = run_bench(cfg(stub.url, tmp_path, num_batches=1, warmup_batches=0, num_prompts=2,
                            max_response_bytes=100_000, read_timeout=5.0, timeout=60.0))
    b = res.batches[0]
    assert b.failed == 2 and all(e["error"] == "response exceeded 100000 bytes (--max-response-bytes)"
                                 for e in b.errors)
    assert res.request_counts() == (2, 2)
    for bad in (dict(read_timeout=0), dict(timeout=-1), dict(max_response_bytes=0)):
        with pytest.raises(BenchConfigError):
            cfg("http://x", tmp_path, **bad)


def test_paired_rounds_alternate_the_servers_on_the_same_prompts(tmp_path):
    """--paired: per cell, warm-ups on both, then measured pairs in ABBA order (issue #37)."""
    with ThreadedStub(StubConfig(k=0)) as base, ThreadedStub(StubConfig(k=4)) as spec:
        res = run_bench(cfg(spec.url, tmp_path, baseline_url=base.url, paired=True, num_batches=4,
                            workloads=("copy", "random-output")))
        base_payloads, spec_payloads = list(base.state.payloads), list(spec.state.payloads)
    per_cell = [(b.role[0], b.batch_index, b.warmup) for b in res.batches[:10]]
    assert per_cell == [("b", 0, True), ("s", 0, True),
                        ("b", 1, False), ("s", 1, False), ("s", 2, False), ("b", 2, False),
                        ("b", 3, False), ("s", 3, False), ("s", 4, False), ("b", 4, False)]
    assert [b.workload for b in res.batches] == ["copy"] * 10 + ["random-output"] * 10
    # each measured batch on a server that did not serve the batch before it is preceded by one
    # unmeasured settle batch of the same size on that server (copy: b1 s1 | s2 b2 | b3 s3 | s4 b4
    # -> settles before b1, s1, b2, s3, b4), with prompts no measured batch serves; it is in no
    # batch's counts
    from specwatch.bench.runner import settle_requests
    from specwatch.bench.workloads import WorkloadOptions, build_requests

    n = res.batches[0].num_prompts
    settle = [p["prompt"] for p in (r.payload("x") for r in settle_requests(n, WorkloadOptions()))]

    def groups(payloads):
        """Per batch-sized group of a server's requests: 'S' for a settle batch, '.' otherwise."""
        gs = [payloads[i:i + n] for i in range(0, len(payloads), n)]
        return ["S" if [p["prompt"] for p in g] == settle else "." for g in gs], gs

    (bm, bg), (sm, sg) = groups(base_payloads), groups(spec_payloads)
    # per server, its batches in order: the warm-up, then a settle batch before each measured batch
    # that follows the other server's
    assert n == 3 and "".join(bm) == ".S.S..S." * 2 and "".join(sm) == ".S..S.." * 2
    # batch i of both servers served the same seeded prompts
    base_batches = [g for m, g in zip(bm, bg, strict=True) if m == "."]
    spec_batches = [g for m, g in zip(sm, sg, strict=True) if m == "."]
    assert [[p["prompt"] for p in g] for g in base_batches] == [[p["prompt"] for p in g] for g in spec_batches]
    assert sum(b.num_prompts for b in res.batches) == n * (len(base_batches) + len(spec_batches))
    # a settle prompt shares no text, not even its first 20 characters, with any measured prompt
    # of any workload (copy rotates six texts: settling with them would fill the prefix cache)
    measured = [str(r.payload("x")["prompt"]) for wl in ("copy", "random-output", "word-chain")
                for i in range(8) for r in build_requests(wl, n, WorkloadOptions(), batch=i)]
    assert not {str(p)[:20] for p in settle} & {p[:20] for p in measured}
    rows = res.comparison()
    assert [(r["workload"], r["max_concurrency"]) for r in rows] == [("copy", 1), ("random-output", 1)]


def test_paired_needs_a_baseline_and_stops_on_the_paired_interval(tmp_path):
    with pytest.raises(BenchConfigError, match="baseline server"):
        cfg("http://127.0.0.1:9", tmp_path, paired=True)
    from specwatch.bench.runner import paired_relative_half_width
    assert paired_relative_half_width([100.0], [200.0]) == math.inf
    # a constant ratio has no spread: exactly 0, whatever the throughputs did
    assert paired_relative_half_width([100.0, 50.0, 80.0], [200.0, 100.0, 160.0]) == pytest.approx(0.0)
    with ThreadedStub(StubConfig(k=0)) as base, ThreadedStub(StubConfig(k=4)) as spec:
        res = run_bench(cfg(spec.url, tmp_path, baseline_url=base.url, paired=True, num_batches=2,
                            target_ci=0.5, max_batches=6))
    measured = [b for b in res.batches if not b.warmup]
    n = len(measured) // 2
    assert 2 <= n <= 6 and len(measured) == 2 * n
    thr = {(b.role, b.batch_index): b.output_throughput for b in measured}
    idx = sorted({b.batch_index for b in measured})
    rel = paired_relative_half_width([thr[("baseline", i)] for i in idx], [thr[("speculative", i)] for i in idx])
    assert rel <= 0.5 or n == 6


def test_cache_salt_goes_with_every_request_to_both_servers(tmp_path):
    """BenchConfig.cache_salt is sent as vLLM's ``cache_salt`` with every request (warm-up,
    settle and measured batches, both servers of a paired run); without it no request carries one."""
    with ThreadedStub(StubConfig(k=4)) as spec, ThreadedStub(StubConfig(k=0)) as base:
        cfg = BenchConfig(base_url=spec.url, baseline_url=base.url, paired=True, workloads=("copy",),
                          concurrencies=(2,), num_prompts=2, num_batches=2, warmup_batches=1,
                          result_dir=str(tmp_path), progress=False, equivalence=False, cache_salt="specwatch-sweep-x",
                          options=WorkloadOptions(output_len=4))
        res = run_bench(cfg)
        assert res.status == "complete"
        for srv in (spec, base):
            assert srv.state.payloads and all(p.get("cache_salt") == "specwatch-sweep-x" for p in srv.state.payloads)
    with ThreadedStub(StubConfig(k=4)) as spec:
        run_bench(BenchConfig(base_url=spec.url, workloads=("copy",), concurrencies=(1,), num_batches=1, warmup_batches=0,
                              result_dir=str(tmp_path), progress=False, options=WorkloadOptions(output_len=4)))
        assert spec.state.payloads and not any("cache_salt" in p for p in spec.state.payloads)


@pytest.mark.parametrize("salt", ["", "a\nb", "x" * 1025])
def test_a_bad_cache_salt_is_refused(salt):
    with pytest.raises(BenchConfigError, match="cache_salt must be 1-1024 printable characters"):
        BenchConfig(base_url="http://127.0.0.1:9", cache_salt=salt)
