"""``specwatch bench`` as a command: flags, an interrupted (killed / Ctrl-C'd) run keeps every
finished batch, and the API key from the environment never reaches output or files."""

from __future__ import annotations

import csv
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from specwatch.bench.cli import bench
from specwatch.testing.stubserver import StubConfig, ThreadedStub


def _args(url: str, out: Path, *extra: str) -> list[str]:
    return ["--base-url", url, "--dataset-name", "copy", "--output-len", "10", "--max-concurrency", "1",
            "--num-prompts", "2", "--metrics-port", "0", "--no-progress", "--result-dir", str(out),
            "--result-filename", "run.json", *extra]


def _wait_batches(path: Path, n: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        assert proc.poll() is None, proc.communicate()
        if path.exists() and len(json.loads(path.read_text())["batches"]) >= n:
            return
        time.sleep(0.05)
    raise AssertionError("batches did not appear")


def _start(url: str, out: Path, env=None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "specwatch", "bench", *_args(url, out, "--num-batches", "200")]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _check_files(out: Path, min_batches: int, killed: bool = False) -> dict:
    """Both files are complete documents holding every finished batch. After a SIGKILL the two
    may differ by the one batch whose files were being rewritten (JSON first, then CSV)."""
    doc = json.loads((out / "run.json").read_text())  # always a complete JSON document
    with open(out / "run.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(doc["batches"]) >= min_batches
    assert all(b["completed"] == 2 for b in doc["batches"])
    json_idx = [b["batch_index"] for b in doc["batches"]]
    csv_idx = [int(r["batch_index"]) for r in rows]
    if killed:
        assert len(json_idx) - len(csv_idx) in (0, 1) and csv_idx == json_idx[:len(csv_idx)]
    else:
        assert csv_idx == json_idx
    return doc


def test_killed_run_keeps_finished_batches(tmp_path):
    with ThreadedStub(StubConfig(k=4, token_delay=0.01)) as stub:
        proc = _start(stub.url, tmp_path)
        try:
            _wait_batches(tmp_path / "run.json", 3, proc)
        finally:
            proc.kill()
            proc.wait(10)
    doc = _check_files(tmp_path, 3, killed=True)
    assert doc["status"] == "running"  # it never got to finish
    assert doc["summary"] and doc["summary"][0]["num_batches"] == len(doc["batches"]) - 1


import pytest


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_marks_run_interrupted(tmp_path, sig):
    """Ctrl-C, and SIGTERM (``docker stop``, ``timeout``), end the run with every finished batch
    kept and the files marked "interrupted"."""
    with ThreadedStub(StubConfig(k=4, token_delay=0.01)) as stub:
        proc = _start(stub.url, tmp_path)
        try:
            _wait_batches(tmp_path / "run.json", 2, proc)
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in out
    m = re.search(r"(\d+) measured \+ (\d+) warm-up batches kept", out)
    assert m, out
    doc = _check_files(tmp_path, 2)
    assert doc["status"] == "interrupted"
    warm = sum(1 for x in doc["batches"] if x["warmup"])
    assert (int(m.group(1)), int(m.group(2))) == (len(doc["batches"]) - warm, warm) and warm == 1


def test_cli_complete_run_and_env_api_key(tmp_path):
    key = "sk-env-KEY-do-not-print"
    with ThreadedStub(StubConfig(k=4, require_api_key=key)) as stub:
        r = CliRunner().invoke(bench, _args(stub.url, tmp_path, "--num-batches", "1", "--warmup-batches", "1",
                                            "--max-concurrency", "1,2"), env={"OPENAI_API_KEY": key})
    assert r.exit_code == 0, r.output
    assert key not in r.output
    assert "copy" in r.output and "measured batches" in r.output
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["status"] == "complete" and len(doc["batches"]) == 4
    assert {b["max_concurrency"] for b in doc["batches"]} == {1, 2}
    assert all(b["failed"] == 0 for b in doc["batches"])
    for f in tmp_path.iterdir():
        assert key not in f.read_text()


def test_cli_creates_missing_result_dir(tmp_path):
    out = tmp_path / "new" / "deeper"
    with ThreadedStub(StubConfig(k=4)) as stub:
        r = CliRunner().invoke(bench, _args(stub.url, out, "--num-batches", "1", "--warmup-batches", "0"))
    assert r.exit_code == 0, r.output
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    assert (out / "run.csv").exists()


def test_cli_start_errors_name_the_option(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with ThreadedStub(StubConfig(k=4)) as stub:
            args = _args(stub.url, tmp_path, "--num-batches", "1")
            args[args.index("--metrics-port") + 1] = str(port)
            r = CliRunner().invoke(bench, args)
    assert r.exit_code == 1 and f"--metrics-port {port}: cannot listen" in r.output, r.output
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with ThreadedStub(StubConfig(k=4)) as stub:
        r = CliRunner().invoke(bench, _args(stub.url, not_a_dir / "sub", "--num-batches", "1"))
    assert r.exit_code == 1 and "--result-dir" in r.output, r.output
    assert isinstance(r.exception, SystemExit), r.exception  # a clean error, not a traceback


def test_cli_bad_input():
    r = CliRunner().invoke(bench, ["--dataset-name", "copy,bogus"])
    assert r.exit_code == 2 and "bogus" in r.output
    r = CliRunner().invoke(bench, ["--max-concurrency", "1,x"])
    assert r.exit_code == 2 and "comma-separated" in r.output
    r = CliRunner().invoke(bench, ["--dataset-name", "sharegpt", "--metrics-port", "0"])
    assert r.exit_code == 2 and "dataset" in r.output


def test_cli_help_lists_vllm_style_flags():
    r = CliRunner().invoke(bench, ["--help"])
    assert r.exit_code == 0
    for flag in ("--base-url", "--baseline-url", "--served-model-name", "--dataset-name", "--dataset-path",
                 "--max-concurrency", "--num-prompts", "--num-batches", "--warmup-batches", "--request-rate",
                 "--save-result", "--result-dir", "--result-filename", "--output-len", "--ignore-eos",
                 "--temperature", "--seed", "--api-key", "--metrics-port", "--equivalence"):
        assert flag in r.output
    assert "OPENAI_API_KEY" in r.output


def test_cli_errors_name_the_flag():
    for args, flag in ((["--request-rate", "0"], "--request-rate must be > 0"),
                       (["--request-rate", "nan"], "--request-rate must be > 0"),
                       (["--base-url", "ftp://x"], "--base-url: base URL must start")):
        r = CliRunner().invoke(bench, [*args, "--metrics-port", "0", "--no-progress"])
        assert r.exit_code == 2, r.output
        assert flag in r.output and "request_rate" not in r.output and "base_url" not in r.output


def test_cli_failed_requests_exit_1_with_summary(tmp_path):
    """Every 3rd request answered 500: all batches still written, exit 1, one summary line."""
    with ThreadedStub(StubConfig(k=4, error_every=3)) as stub:
        r = CliRunner().invoke(bench, _args(stub.url, tmp_path, "--num-batches", "2", "--warmup-batches", "1",
                                            "--num-prompts", "3"))
    assert r.exit_code == 1, r.output
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["status"] == "complete" and len(doc["batches"]) == 3
    measured = [b for b in doc["batches"] if not b["warmup"]]
    failed, total = sum(b["failed"] for b in measured), sum(b["num_prompts"] for b in measured)
    assert failed == 2 and total == 6
    assert f"{failed} of {total} requests failed" in r.output


def test_cli_start_failure_exit_1_and_failed_file(tmp_path):
    with ThreadedStub(StubConfig(k=4, models_status=404)) as stub:
        r = CliRunner().invoke(bench, _args(stub.url, tmp_path))
    assert r.exit_code == 1 and "HTTP 404" in r.output
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["status"] == "failed" and "HTTP 404" in doc["error"]


def test_cli_help_documents_exit_codes_and_file_names():
    r = CliRunner().invoke(bench, ["--help"])
    text = " ".join(r.output.split())
    assert "0 all requests ok" in text and "1 some measured requests failed" in text
    assert "2 bad flags" in text and "130 interrupted" in text
    assert "-2, -3" in text and "overwritten" in text
    for flag in ("--timeout", "--read-timeout", "--max-response-bytes"):
        assert flag in text


def test_metrics_linger_keeps_serving_after_a_complete_run(tmp_path):
    """--metrics-linger: the result file already says complete while /metrics still answers with
    the last batch's values; the process then exits 0 on its own."""
    import requests

    from specwatch.common.processes import free_port

    port = free_port()
    with ThreadedStub(StubConfig(k=4)) as stub:
        args = _args(stub.url, tmp_path, "--num-batches", "1", "--warmup-batches", "0", "--metrics-linger", "30")
        args[args.index("--metrics-port") + 1] = str(port)
        proc = subprocess.Popen([sys.executable, "-m", "specwatch", "bench", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 60
            while time.time() < deadline:
                assert proc.poll() is None, proc.communicate()
                path = tmp_path / "run.json"
                if path.exists() and json.loads(path.read_text())["status"] == "complete":
                    break
                time.sleep(0.05)
            else:
                raise AssertionError("the run did not complete")
            body = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            assert 'specwatch_bench_requests_total{' in body and 'outcome="success"' in body
            assert proc.poll() is None  # still lingering
            proc.send_signal(signal.SIGINT)  # Ctrl-C cuts the wait; the run stays complete
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, out + err
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "complete"


@pytest.mark.parametrize("content", [None, "not json", "{}", "[]"], ids=["missing", "not-json", "not-a-list", "empty"])
def test_cli_bad_sharegpt_file_is_one_line_exit_2_and_writes_no_result(content, tmp_path, monkeypatch):
    """Issue #25: a missing ShareGPT file used to write a "failed" result file into the current
    directory. Now the file is read before the run: one line, exit 2, nothing written (neither in
    the current directory nor in --result-dir)."""
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data" / "ShareGPT.json"
    if content is not None:
        data.parent.mkdir()
        data.write_text(content)
    results = tmp_path / "results"
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    r = CliRunner().invoke(bench, ["--base-url", "http://127.0.0.1:9", "--dataset-name", "copy,sharegpt",
                                   "--dataset-path", str(data), "--metrics-port", "0", "--no-progress",
                                   "--result-dir", str(results)])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: --dataset-path: ") and str(data) in lines[0], r.output
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
