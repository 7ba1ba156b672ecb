"""The streaming client: timing, token counting, and failures recorded (never raised)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from specwatch.bench.backend import OpenAIBackend, normalize_base_url
from specwatch.bench.runner import BenchConfig, run_bench
from specwatch.testing.stubserver import StubConfig, ThreadedStub, prompt_key, token_text
from specwatch.bench.workloads import BenchRequest, WorkloadOptions

from polling import wait_until


def send_all(url: str, reqs, api_key=None, read_timeout=30.0):
    async def go():
        async with OpenAIBackend(url, "stub-model", api_key=api_key, read_timeout=read_timeout) as be:
            return [await be.send(r) for r in reqs]

    return asyncio.run(go())


COMP = BenchRequest("copy", 0, "completions", prompt="hello world", max_tokens=6, temperature=0.0)
CHAT = BenchRequest("explain", 1, "chat", messages=(("user", "hi there"),), max_tokens=5, temperature=0.0)


def test_completion_timing_and_usage():
    with ThreadedStub(StubConfig(k=0, token_delay=0.002)) as stub:
        (o,) = send_all(stub.url, [COMP])
    assert o.success and o.error == ""
    assert o.output_tokens == 6 and o.tokens_from_usage and o.chunks == 6
    assert o.prompt_tokens == 2  # usage.prompt_tokens from the stub (2 words)
    key = prompt_key(COMP.payload("stub-model"))
    assert o.generated_text == "".join(token_text(key, i) for i in range(6))
    assert len(o.itl) == 5 and all(g >= 0 for g in o.itl)
    assert 0 < o.ttft <= o.latency
    # TTFT + the gaps never exceed E2E, and TPOT follows its definition
    assert o.ttft + sum(o.itl) <= o.latency + 1e-9
    assert o.tpot == pytest.approx((o.latency - o.ttft) / 5)
    assert o.finish_reason == "length"


def test_chat_role_chunk_is_not_a_token_and_chunks_counted_without_usage():
    with ThreadedStub(StubConfig(k=0, send_usage=False)) as stub:
        (o,) = send_all(stub.url, [CHAT])
    assert o.success
    assert o.tokens_from_usage is False and o.output_tokens == 5 == o.chunks  # role-only chunk excluded
    assert len(o.itl) == 4
    assert o.prompt_tokens is None


def test_http_500_recorded():
    with ThreadedStub(StubConfig(k=0, error_every=1)) as stub:
        (o,) = send_all(stub.url, [COMP])
    assert not o.success and o.status == 500
    assert "HTTP 500" in o.error and "injected failure" in o.error
    assert o.tpot is None


def test_dropped_connection_mid_stream_recorded():
    with ThreadedStub(StubConfig(k=0, drop_every=1, drop_after=3)) as stub:
        (o,) = send_all(stub.url, [COMP])
    assert not o.success
    assert o.chunks == 3 and o.error  # three chunks arrived, then the connection died
    assert "[DONE]" in o.error or "Payload" in o.error or "Disconnected" in o.error


def test_connection_refused_recorded():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (o,) = send_all(f"http://127.0.0.1:{port}", [COMP])
    assert not o.success and "Connect" in o.error


def test_api_key_sent_as_bearer_and_not_in_repr():
    with ThreadedStub(StubConfig(k=0, require_api_key="sk-sekrit-123")) as stub:
        ok, = send_all(stub.url, [COMP], api_key="sk-sekrit-123")
        bad, = send_all(stub.url, [COMP], api_key="wrong")
        seen = list(stub.state.auth_headers)
    assert ok.success and not bad.success and bad.status == 401
    assert seen == ["Bearer sk-sekrit-123", "Bearer wrong"]
    assert "sk-sekrit" not in repr(OpenAIBackend("http://x", "m", api_key="sk-sekrit-123"))


def test_normalize_base_url():
    assert normalize_base_url("http://h:8000/v1/") == "http://h:8000"
    assert normalize_base_url(" http://h:8000 ") == "http://h:8000"
    with pytest.raises(ValueError):
        normalize_base_url("h:8000")
    assert normalize_base_url("http://[::1]:8000/v1") == "http://[::1]:8000"
    for bad, why in (("http://[::1", "IPv6"), ("http://localhost:99999", "out of range"), ("http://:80", "no host")):
        with pytest.raises(ValueError, match=why):
            normalize_base_url(bad)


def test_failures_never_stop_a_run(tmp_path):
    """Every 3rd request dropped mid-stream and every 4th answered 500: the run completes and
    records each failure with its error."""
    with ThreadedStub(StubConfig(k=0, drop_every=3, error_every=4, drop_after=2)) as stub:
        cfg = BenchConfig(base_url=stub.url, workloads=("copy",), concurrencies=(1, 4), num_prompts=12,
                          num_batches=1, warmup_batches=0, result_dir=str(tmp_path), progress=False,
                          options=WorkloadOptions(output_len=8))
        res = run_bench(cfg)
    assert res.status == "complete" and len(res.batches) == 2
    total_failed = sum(b.failed for b in res.batches)
    # requests 1..24: multiples of 4 -> 500 (6); multiples of 3 not of 4 -> dropped (6)
    assert total_failed == 12
    errors = [e["error"] for b in res.batches for e in b.errors]
    assert sum("HTTP 500" in e for e in errors) == 6
    assert all(b.completed + b.failed == 12 for b in res.batches)
    assert all(b.total_output_tokens == 8 * b.completed for b in res.batches)


def test_runaway_response_capped_and_recorded():
    """A server streaming megabytes of ``data: xxx`` lines: the request fails once
    max_response_bytes were received, with an error naming the limit."""
    async def go(url):
        async with OpenAIBackend(url, "stub-model", max_response_bytes=256 * 1024) as be:
            return await be.send(COMP)

    with ThreadedStub(StubConfig(k=0, flood_bytes=4 * 1024 * 1024)) as stub:
        o = asyncio.run(go(stub.url))
    assert not o.success
    assert o.error == f"response exceeded {256 * 1024} bytes (--max-response-bytes)"
    assert o.generated_text == ""


def test_stub_counts_a_client_that_left_instead_of_logging_a_traceback(caplog):
    """Issue #25: the client hanging up mid-stream (here: the response cap) made aiohttp log
    "Error handling request" with a ConnectionResetError traceback into the test log. The stub
    now counts it (``client_disconnects``) and logs nothing."""
    import logging

    async def go(url):
        async with OpenAIBackend(url, "stub-model", max_response_bytes=64 * 1024) as be:
            return await be.send(COMP)

    caplog.set_level(logging.DEBUG)
    with ThreadedStub(StubConfig(k=0, flood_bytes=8 * 1024 * 1024)) as stub:
        o = asyncio.run(go(stub.url))
        # the stub notices the closed transport on one of its next writes (slow when loaded)
        wait_until(lambda: stub.state.client_disconnects, 30)
    assert not o.success
    assert stub.state.client_disconnects == 1
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, [(r.name, r.getMessage()) for r in loud]


def test_stalled_server_fails_on_read_timeout():
    """No byte for read_timeout seconds fails the request although the total timeout is far."""
    async def go(url):
        async with OpenAIBackend(url, "stub-model", timeout=60.0, read_timeout=0.2) as be:
            return await be.send(COMP)

    with ThreadedStub(StubConfig(k=0, stall_after=2, stall_seconds=2.0)) as stub:
        o = asyncio.run(go(stub.url))
    assert not o.success
    assert o.chunks == 2
    assert "--read-timeout" in o.error and "0.2 s" in o.error


def test_models_json_without_json_content_type():
    """/v1/models answered as text/plain JSON still gives the model id."""
    async def go(url):
        async with OpenAIBackend(url, None) as be:
            return await be.first_model()

    with ThreadedStub(StubConfig(k=0, model="plain-model", models_content_type="text/plain")) as stub:
        assert asyncio.run(go(stub.url)) == "plain-model"


@pytest.mark.parametrize("offered", [True, False])
def test_per_request_spec_decode_metrics_are_read_and_summarized(tmp_path, offered):
    """The stub sends vLLM's per-request metrics.speculative_decoding (constructed, in vLLM 0.32's
    shape) when asked: the cell's exact curve then covers exactly the verify steps its counters
    count and, drafts being full, equals the counter curve; without them the cell says
    not_offered and counts every request as missing."""
    import json

    with ThreadedStub(StubConfig(k=4, per_request_metrics=offered)) as stub:
        cfg = BenchConfig(base_url=stub.url, workloads=("copy",), concurrencies=(2,), num_prompts=6,
                          num_batches=1, warmup_batches=0, result_dir=str(tmp_path), progress=False,
                          options=WorkloadOptions(output_len=12))
        res = run_bench(cfg)
    (cell,) = res.summary()
    rec = cell.to_record().to_json()
    pr = rec["spec_decode_per_request"]
    if not offered:
        assert pr["status"] == "not_offered" and pr["problems"] == {"missing": 6}
        return
    assert pr["status"] == "measured" and pr["requests"] == 6 and pr["problems"] == {}
    assert rec["spec_decode_curve_basis"] == "exact"
    assert pr["verify_steps"] == rec["spec_decode_num_drafts"]
    assert pr["accepted_tokens"] == rec["spec_decode_accepted_tokens"]
    assert pr["per_position_acceptance_rates"] == pytest.approx(rec["spec_decode_per_position_acceptance_rates"])
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert doc["summary"][0]["spec_decode_per_request"]["per_position_acceptance_rates"] == pytest.approx(
        pr["per_position_acceptance_rates"])
    assert doc["batches"][0]["spec_decode_per_request"] == {"status": "measured", "requests": 6, "problems": {}}


def test_dropped_requests_count_as_truncated_per_request_payloads(tmp_path):
    with ThreadedStub(StubConfig(k=4, per_request_metrics=True, drop_every=5, drop_after=2)) as stub:
        cfg = BenchConfig(base_url=stub.url, workloads=("copy",), concurrencies=(2,), num_prompts=10,
                          num_batches=1, warmup_batches=0, result_dir=str(tmp_path), progress=False,
                          options=WorkloadOptions(output_len=12))
        res = run_bench(cfg)
    pr = res.summary()[0].to_record().to_json()["spec_decode_per_request"]
    assert pr["status"] == "partial" and pr["requests"] == 8 and pr["problems"] == {"truncated": 2}


# ------------------------------------------------------------------------------------------
# per-request payloads that are damaged, absent or from n > 1 (issue 13 audit), through the stub
# replaying the real captures of tests/fixtures/perrequest (damaged in memory)

def _real_payloads(name="ngram-k3-explain"):
    import copy
    import json
    from pathlib import Path

    path = Path(__file__).parents[1] / "fixtures" / "perrequest" / f"{name}.requests.json"
    return [copy.deepcopy(r["final_chunk"]["metrics"]["speculative_decoding"]) for r in json.loads(path.read_text())]


def _bench(tmp_path, stub_cfg, n, batches=1, concurrency=1):
    import json

    with ThreadedStub(stub_cfg) as stub:
        cfg = BenchConfig(base_url=stub.url, workloads=("explain",), concurrencies=(concurrency,), num_prompts=n,
                          num_batches=batches, warmup_batches=0, result_dir=str(tmp_path), progress=False,
                          options=WorkloadOptions(output_len=8))
        res = run_bench(cfg)
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    return res, doc


def test_nan_infinity_and_huge_k_payloads_are_counted_and_the_run_completes(tmp_path):
    """Real payloads with NaN, Infinity (as vLLM's JSON encoder would print them) and
    num_spec_tokens = 10**9: the bench used to raise in parse_payload and leave the result file
    "running" without batches. Now the run completes, the file holds the batches, the three
    requests are counted as inconsistent and the others give the exact curve."""
    payloads = _real_payloads()
    payloads[1]["per_step_accepted"][2] = float("nan")
    payloads[3]["per_step_drafted"][0] = float("inf")
    payloads[5]["num_spec_tokens"] = 10**9
    res, doc = _bench(tmp_path, StubConfig(k=3, per_request_payloads=tuple(payloads)), len(payloads))
    assert doc["status"] == "complete" and len(doc["batches"]) == 1
    assert doc["batches"][0]["spec_decode_per_request"] == {"status": "partial", "requests": len(payloads) - 3,
                                                            "problems": {"inconsistent": 3}}
    pr = doc["summary"][0]["spec_decode_per_request"]
    assert pr["status"] == "partial" and pr["problems"] == {"inconsistent": 3}
    assert pr["max_draft_length"] == 3 and len(pr["per_position_acceptance_rates"]) == 3


def test_non_object_payload_is_inconsistent_and_n_gt_1_is_detected(tmp_path):
    """A speculative_decoding value that is not a JSON object is a bad payload (inconsistent), not a
    server without per-request metrics (missing); a response carrying choice indexes 0 and 1 (n = 2)
    is counted as n_gt_1, whatever payload it carries."""
    payloads = _real_payloads()
    payloads[0] = "garbage"
    payloads[1] = [1, 2, 3]
    _, doc = _bench(tmp_path / "a", StubConfig(k=3, per_request_payloads=tuple(payloads)), len(payloads))
    assert doc["summary"][0]["spec_decode_per_request"]["problems"] == {"inconsistent": 2}
    _, doc = _bench(tmp_path / "b", StubConfig(k=3, per_request_payloads=tuple(_real_payloads()), num_choices=2), 4)
    pr = doc["summary"][0]["spec_decode_per_request"]
    assert pr["problems"] == {"n_gt_1": 4} and pr["status"] == "unusable"


def test_zero_step_payload_and_all_truncated_cell_status(tmp_path):
    """vLLM omits per_step_* for a request without verify steps: with num_spec_steps = 0 it counts
    as a request with zero steps, not summary_only. A cell whose requests were all dropped is
    "unusable" with truncated counted, not "not_offered" (the server did offer the metrics)."""
    zero = {"mean_acceptance_length": 1.0, "draft_acceptance_rate": 0.0, "acceptance_histogram": [0, 0, 0, 0],
            "num_spec_steps": 0, "num_accepted_draft_tokens": 0, "num_draft_tokens": 0, "num_spec_tokens": 3}
    payloads = _real_payloads()[:3] + [zero]
    _, doc = _bench(tmp_path / "a", StubConfig(k=3, per_request_payloads=tuple(payloads)), len(payloads))
    pr = doc["summary"][0]["spec_decode_per_request"]
    assert pr["status"] == "measured" and pr["problems"] == {}
    assert pr["requests"] == 4 and pr["requests_without_verify_steps"] == 1
    _, doc = _bench(tmp_path / "b", StubConfig(k=3, per_request_metrics=True, drop_every=1, drop_after=2), 4)
    pr = doc["summary"][0]["spec_decode_per_request"]
    assert pr["status"] == "unusable" and pr["problems"] == {"truncated": 4}
    assert doc["status"] == "complete"


def test_outliers_name_their_batch_and_csv_has_basis_and_exact_curve(tmp_path):
    """Two batches of the real explain payloads, request 1 damaged to accept nothing: the cell's
    outliers say batch 0 and batch 1 (request indexes restart per batch), the console table lists
    them, and the CSV carries the counter curve's basis, its missing-token ratio and each batch's
    exact per-request curve."""
    import csv

    from rich.console import Console

    from specwatch.bench.results import render_tables

    payloads = _real_payloads()
    payloads[1]["per_step_accepted"] = [0] * len(payloads[1]["per_step_accepted"])
    payloads[1]["num_accepted_draft_tokens"] = 0
    res, doc = _bench(tmp_path, StubConfig(k=3, per_request_payloads=tuple(payloads)), len(payloads), batches=2)
    pr = doc["summary"][0]["spec_decode_per_request"]
    assert [(o["batch_index"], o["index"], o["kind"]) for o in pr["outliers"]] == [(0, 1, "low"), (1, 1, "low")]
    con = Console(record=True, width=3000)
    for t in render_tables(res.batches):
        con.print(t)
    text = con.export_text()
    assert "batch 0 #1 low 0.00" in text and "batch 1 #1 low 0.00" in text and "problems: none" in text
    rows = list(csv.DictReader(next(tmp_path.glob("*.csv")).open()))
    assert len(rows) == 2
    for row, b in zip(rows, doc["batches"], strict=True):
        assert row["spec_decode_curve_basis"] == b["spec_decode_curve_basis"] == "exact"
        assert float(row["spec_decode_missing_draft_tokens_ratio"]) == b["spec_decode_missing_draft_tokens_ratio"]
        exact = [float(x) for x in row["spec_decode_exact_per_position_acceptance_rates"].split(";")]
        assert exact == pytest.approx(pr["per_position_acceptance_rates"], rel=1e-5)
        assert row["spec_decode_per_request_status"] == "measured" and row["spec_decode_per_request_problems"] == "none"
