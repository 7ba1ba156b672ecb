"""``specwatch bench`` as a command: flags, an interrupted (killed / Ctrl-C'd) run keeps every
finished batch, and the API key from the environment never reaches output or files."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from specwatch.bench.cli import bench
from specwatch.bench.stubserver import StubConfig, ThreadedStub


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


def _check_files(out: Path, min_batches: int) -> dict:
    doc = json.loads((out / "run.json").read_text())  # always a complete JSON document
    rows = list(csv.DictReader(open(out / "run.csv", newline="")))
    assert len(doc["batches"]) >= min_batches
    assert len(rows) == len(doc["batches"])
    assert all(b["completed"] == 2 for b in doc["batches"])
    assert [int(r["batch_index"]) for r in rows] == [b["batch_index"] for b in doc["batches"]]
    return doc


def test_killed_run_keeps_finished_batches(tmp_path):
    with ThreadedStub(StubConfig(k=4, token_delay=0.01)) as stub:
        proc = _start(stub.url, tmp_path)
        try:
            _wait_batches(tmp_path / "run.json", 3, proc)
        finally:
            proc.kill()
            proc.wait(10)
    doc = _check_files(tmp_path, 3)
    assert doc["status"] == "running"  # it never got to finish
    assert doc["summary"] and doc["summary"][0]["num_batches"] == len(doc["batches"]) - 1


def test_ctrl_c_marks_run_interrupted(tmp_path):
    with ThreadedStub(StubConfig(k=4, token_delay=0.01)) as stub:
        proc = _start(stub.url, tmp_path)
        try:
            _wait_batches(tmp_path / "run.json", 2, proc)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in out
    doc = _check_files(tmp_path, 2)
    assert doc["status"] == "interrupted"


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
