"""specwatch sweep: server lifecycle from a command template, result file, resume; one tiny sweep on
the real embedded vLLM.

The stub server (tests/support/sweep_stub.py) is the load generator's stub (constructed vLLM V1
spec-decode counters) wrapped by a tiny script that reads ``--speculative-config`` like vLLM,
adds a constructed ``vllm:cache_config_info`` and logs every start.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from specwatch.choosek.resultfile import SweepError, measurements
from records import sweep_document, sweep_record
from specwatch.choosek.sweep import SweepPlan, build_configs, kv_capacity, render_command, run_sweep

from sweep_stub import starts

FIX = Path(__file__).parents[1] / "fixtures" / "metrics"



def plan(ks=(2, 4), workloads=("copy", "explain"), concs=(1, 2), output_len=8, paired=False) -> SweepPlan:
    """A small sweep plan; sequential unless ``paired`` (the sequential schedule is what most tests here pin)."""
    return SweepPlan(build_configs(ks, (), True), workloads, concs, output_len, None, 1, 1, 1, 0, paired=paired)


def test_sweep_runs_every_cell_and_records_servers(tmp_path, stub):
    template, log = stub
    out = tmp_path / "sweep.json"
    doc = run_sweep(plan(), out, template=template, lock=False, progress=False, echo=lambda *a, **k: None).to_json()
    assert doc["status"] == "complete"
    saved = sweep_document(out)
    assert saved["status"] == "complete"
    keys = sorted((c["config"], c["workload"], c["max_concurrency"]) for c in saved["cells"])
    assert keys == sorted((cfg, wl, c) for cfg in ("baseline", "ngram-k2", "ngram-k4")
                          for wl in ("copy", "explain") for c in (1, 2))
    assert starts(log) == [0, 2, 4]
    servers = {s["config"]: s for s in saved["servers"]}
    assert servers["baseline"]["kv_cache_tokens"] == 16000
    assert servers["ngram-k4"]["kv_cache_tokens"] == (1000 - 40) * 16
    assert all(s["startup_seconds"] > 0 for s in servers.values())
    ms = {(m.config, m.workload, m.concurrency): m for m in measurements(sweep_record(saved))}
    k4 = ms[("ngram-k4", "copy", 2)]
    assert k4.k == 4 and len(k4.position_rates) == 4 and k4.acceptance_length > 1
    assert ms[("baseline", "copy", 1)].acceptance_length is None
    cell = next(c for c in saved["cells"] if c["config"] == "ngram-k2")
    assert cell["summary"]["num_batches"] == 1
    assert [b["warmup"] for b in cell["batches"]] == [True, False]
    assert json.loads(json.dumps(saved["configs"]))[1]["speculative_config"]["num_speculative_tokens"] == 2


def test_interrupted_sweep_resumes_where_it_stopped(tmp_path, stub):
    template, log = stub
    out = tmp_path / "sweep.json"
    seen: list[str] = []

    def interrupt_after_third_cell(msg: str, **_: object) -> None:
        seen.append(msg)
        if sum(1 for m in seen if " tok/s" in m) == 6:  # 4 baseline cells + 2 of ngram-k2
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(plan(), out, template=template, lock=False, progress=False, echo=interrupt_after_third_cell)
    partial = sweep_document(out)
    assert partial["status"] == "interrupted"
    assert len(partial["cells"]) == 6
    done_before = {(c["config"], c["workload"], c["max_concurrency"]): c["finished_at"] for c in partial["cells"]}
    assert starts(log) == [0, 2]

    msgs: list[str] = []
    doc = run_sweep(plan(), out, template=template, lock=False, progress=False, echo=lambda m, **_: msgs.append(m)).to_json()
    assert doc["status"] == "complete"
    assert starts(log) == [0, 2, 2, 4]  # the baseline was not started again
    assert any("baseline: all 4 cells already" in m for m in msgs)
    cells = doc["cells"]
    keys = [(c["config"], c["workload"], c["max_concurrency"]) for c in cells]
    assert len(keys) == len(set(keys)) == 12
    for key, finished in done_before.items():  # finished cells kept as they were
        assert next(c for c in cells if (c["config"], c["workload"], c["max_concurrency"]) == key)["finished_at"] == finished
    assert len(doc["resumed_at"]) == 1

    # extending the sweep with a new k runs only the new cells
    doc = run_sweep(plan(ks=(2, 4, 1)), out, template=template, lock=False, progress=False, echo=lambda *a, **k: None).to_json()
    assert starts(log) == [0, 2, 2, 4, 1]
    assert len(doc["cells"]) == 16


def test_resume_refuses_different_measurement_settings(tmp_path, stub):
    template, _ = stub
    out = tmp_path / "sweep.json"
    run_sweep(plan(ks=(2,), workloads=("copy",), concs=(1,)), out, template=template, lock=False, progress=False,
              echo=lambda *a, **k: None)
    before = out.read_text()
    with pytest.raises(SweepError, match="output_len"):
        run_sweep(plan(ks=(2,), workloads=("copy",), concs=(1,), output_len=9), out, template=template, lock=False,
                  progress=False, echo=lambda *a, **k: None)
    assert out.read_text() == before  # nothing lost


def test_server_that_dies_is_reported_with_its_log(tmp_path):
    out = tmp_path / "sweep.json"
    template = f"{shlex.quote(sys.executable)} -c 'import sys; print(\"boom from the server\"); sys.exit(3)' {{port}}"
    with pytest.raises(SweepError, match="boom from the server"):
        run_sweep(plan(ks=(2,), workloads=("copy",), concs=(1,)), out, template=template, lock=False,
                  progress=False, echo=lambda *a, **k: None, startup_timeout=30)
    assert sweep_document(out)["status"] == "failed"


def test_render_command_quotes_the_config():
    argv = render_command("vllm serve /m --port {port} {spec_args}", 8123,
                          {"method": "ngram", "num_speculative_tokens": 3, "note": "a b'c"})
    assert argv[:5] == ["vllm", "serve", "/m", "--port", "8123"]
    assert argv[5] == "--speculative-config"
    assert json.loads(argv[6]) == {"method": "ngram", "num_speculative_tokens": 3, "note": "a b'c"}
    assert render_command("srv --port {port} {spec_args}", 1, None) == ["srv", "--port", "1"]
    assert json.loads(render_command("x {speculative_config}", 1, {"method": "ngram", "num_speculative_tokens": 2})[1]) == {
        "method": "ngram", "num_speculative_tokens": 2}
    with pytest.raises(SweepError, match="placeholder"):
        render_command("x {prot}", 1, None)


def test_build_configs():
    cfgs = build_configs((1, 4), (), True)
    assert [(c.name, c.k) for c in cfgs] == [("baseline", 0), ("ngram-k1", 1), ("ngram-k4", 4)]
    assert cfgs[2].speculative_config["prompt_lookup_max"] == 5
    assert cfgs[1].family == cfgs[2].family != ""
    spec = build_configs((), ('{"method":"ngram","num_speculative_tokens":2}',
                              '{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":3}'), False)
    assert [c.name for c in spec] == ["ngram-k2", "ngram-k2-2"]
    for bad in ('{"method":"ngram"}', "[1]", "{nope", '{"num_speculative_tokens":2}'):
        with pytest.raises(SweepError):
            build_configs((), (bad,), True)


def test_kv_capacity_from_real_vllm_metrics():
    """Real capture of vLLM 0.32 (CPU): num_gpu_blocks × block_size equals its kv_cache_size_tokens label."""
    path = FIX / "vllm-0.32-ngram-k4-fresh.txt"
    if not path.exists():
        pytest.skip("real capture not present")
    text = path.read_text()
    from prometheus_client.parser import text_string_to_metric_families

    labels = next(s.labels for f in text_string_to_metric_families(text) if f.name == "vllm:cache_config_info" for s in f.samples)
    kv = kv_capacity(text)
    assert kv["kv_cache_tokens"] == int(labels["kv_cache_size_tokens"]) > 0
    assert kv["engines"] == 1
    assert kv_capacity("# nothing here\n")["kv_cache_tokens"] is None


def test_cli_rejects_bad_options(tmp_path):
    from specwatch.choosek.cli import sweep

    r = CliRunner().invoke(sweep, ["--result-file", str(tmp_path / "x.json"), "--k", "2,x"])
    assert r.exit_code != 0 and "comma-separated integers" in r.output
    r = CliRunner().invoke(sweep, ["--result-file", str(tmp_path / "x.json"), "--workloads", "nope"])
    assert r.exit_code != 0 and "unknown workload" in r.output
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    r = CliRunner().invoke(sweep, ["--result-file", str(bad), "--server-command", "true --port {port} {spec_args}", "--no-lock"])
    assert r.exit_code != 0 and "not a specwatch sweep result" in r.output
    assert bad.read_text() == "{}"


def test_cli_sweep_advise_report_on_the_stub(tmp_path, stub):
    """The README's three commands, end to end (stub server)."""
    from specwatch.choosek.cli import advise
    from specwatch.choosek.cli import report
    from specwatch.choosek.cli import sweep

    template, _ = stub
    out = tmp_path / "s.json"
    r = CliRunner().invoke(sweep, ["--result-file", str(out), "--k", "1,3", "--workloads", "copy", "--concurrency", "1,2",
                                   "--output-len", "8", "--num-batches", "1", "--server-command", template,
                                   "--no-lock", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "sweep complete" in r.output
    adv = tmp_path / "a.json"
    r = CliRunner().invoke(advise, [str(out), "--json", str(adv), "--candidates", "all"])
    assert r.exit_code == 0, r.output
    a = json.loads(adv.read_text())
    fam = a["families"][0]
    assert {p["k"] for p in fam["acceptance_predictions"]} == {1, 2, 3}
    assert set(fam["k_by_concurrency"]) == {"1", "2"}
    assert "--speculative-config" in r.output or "run without --speculative-config" in r.output
    html = tmp_path / "r.html"
    r = CliRunner().invoke(report, [str(out), "-o", str(html)])
    assert r.exit_code == 0, r.output
    assert html.read_text().count("data:image/png;base64,") >= 5


def test_secrets_in_server_commands_are_not_written(tmp_path, stub):
    from specwatch.choosek.sweep import redact_argv

    assert redact_argv(["vllm", "serve", "m", "--api-key", "s3cr3t", "--hf-token=abc", "HF_TOKEN=xyz", "--port", "1"]) == [
        "vllm", "serve", "m", "--api-key", "***", "--hf-token=***", "HF_TOKEN=***", "--port", "1"]
    template, _ = stub
    out = tmp_path / "sweep.json"
    doc = run_sweep(plan(ks=(2,), workloads=("copy",), concs=(1,)), out, template=template + " --api-key s3cr3t-value",
                    lock=False, progress=False, echo=lambda *a, **k: None, api_key="s3cr3t-value").to_json()
    assert doc["status"] == "complete" and all(c["summary"]["completed"] > 0 for c in doc["cells"])
    assert "s3cr3t" not in out.read_text()
    out.unlink()
    # and a server that fails to start: neither the error nor the file shows the key
    bad = f"{shlex.quote(sys.executable)} -c 'import sys; sys.exit(2)' --api-key s3cr3t-value {{port}}"
    with pytest.raises(SweepError) as info:
        run_sweep(plan(ks=(2,), workloads=("copy",), concs=(1,)), out, template=bad, lock=False, progress=False,
                  echo=lambda *a, **k: None, api_key="bearer-s3cr3t", startup_timeout=30)
    assert "s3cr3t" not in str(info.value)
    text = out.read_text()
    assert "s3cr3t" not in text and "***" in text


@pytest.mark.parametrize("args, option", [
    (["--k", "-1"], "--k"),
    (["--k", "abc"], "--k"),
    (["--k", "0"], "--k"),
    (["--speculative-config", "{bad"], "--speculative-config"),
    (["--speculative-config", '{"method": "ngram"}'], "--speculative-config"),
    (["--output-len", "-5"], "--output-len"),
    (["--num-batches", "0"], "--num-batches"),
    (["--warmup-batches", "-1"], "--warmup-batches"),
    (["--num-prompts", "0"], "--num-prompts"),
    (["--concurrency", "0"], "--concurrency"),
    (["--concurrency", "1,x"], "--concurrency"),
    (["--workloads", "bogus"], "--workloads"),
    (["--port", "-1"], "--port"),
    (["--port", "70000"], "--port"),
    (["--startup-timeout", "-1"], "--startup-timeout"),
    (["--startup-timeout", "0"], "--startup-timeout"),
    (["--server-command", "echo hi"], "--server-command"),
    (["--server-command", "serve --port {port} {nope}"], "--server-command"),
])
def test_cli_flag_errors_are_usage_errors_naming_the_option(tmp_path, args, option):
    """Bad flags exit 2 with a Usage line naming the option, before anything starts or is written."""
    from specwatch.choosek.cli import sweep

    out = tmp_path / "x.json"
    r = CliRunner().invoke(sweep, ["--result-file", str(out), "--no-lock", *args])
    assert r.exit_code == 2, r.output
    assert "Usage:" in r.output and option in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert not out.exists() and not (tmp_path / "x-logs").exists()


def test_cli_refuses_an_unwritable_result_file_before_any_server_starts(tmp_path, stub):
    from specwatch.choosek.cli import sweep

    template, log = stub
    afile = tmp_path / "afile"
    afile.write_text("a regular file, not a directory")
    for args in (["--result-file", str(afile / "s.json")],
                 ["--result-file", str(tmp_path / "s.json"), "--log-dir", str(afile / "logs")]):
        r = CliRunner().invoke(sweep, [*args, "--k", "1", "--workloads", "copy", "--concurrency", "1",
                                       "--output-len", "8", "--num-batches", "1", "--server-command", template,
                                       "--no-lock", "--no-progress"])
        assert r.exit_code == 1, r.output
        assert isinstance(r.exception, SystemExit), r.exception  # a click error, no traceback
        assert "cannot" in r.output and "not a directory" in r.output and str(afile) in r.output
        assert len(r.output.strip().splitlines()) == 1
        assert starts(log) == []  # no server was started
    assert afile.read_text() == "a regular file, not a directory"


def test_cli_reads_the_api_key_from_openai_api_key_and_writes_it_nowhere(tmp_path, stub):
    from specwatch.choosek.cli import sweep

    template, _ = stub
    out = tmp_path / "s.json"
    secret = "sk-env-s3cr3t"
    args = ["--result-file", str(out), "--k", "1", "--no-baseline", "--workloads", "copy", "--concurrency", "1",
            "--output-len", "8", "--num-batches", "1", "--warmup-batches", "0",
            "--server-command", template + " --api-key " + secret, "--no-lock", "--no-progress"]
    # the stub requires the key: without it every request fails (401)
    r = CliRunner().invoke(sweep, args, env={"OPENAI_API_KEY": secret, "SPECWATCH_API_KEY": None})
    assert r.exit_code == 0, r.output
    doc = sweep_document(out)
    assert doc["cells"][0]["summary"]["completed"] > 0 and not doc["cells"][0]["summary"].get("failed")
    assert secret not in r.output
    for f in tmp_path.rglob("*"):
        if f.is_file() and f.name != "stub.py":
            assert secret not in f.read_text(errors="replace"), f


# ------------------------------------------------------------------------------- paired mode (issue #37)


def test_paired_sweep_keeps_the_baseline_up_and_alternates_rounds(tmp_path, stub):
    template, log = stub
    out = tmp_path / "sweep.json"
    msgs: list[str] = []
    doc = run_sweep(plan(workloads=("copy",), concs=(1, 2), paired=True), out, template=template, lock=False,
                    progress=False, echo=lambda m, **_: msgs.append(m)).to_json()
    assert doc["status"] == "complete"
    assert starts(log) == [0, 2, 4]  # the baseline started once, each speculative server beside it
    saved = sweep_document(out)
    cells = {(c["config"], c["workload"], c["max_concurrency"]): c for c in saved["cells"]}
    assert len(cells) == 6
    for c in (1, 2):
        base = cells[("baseline", "copy", c)]
        assert base["mode"] == "paired" and base["paired_with"] == "ngram-k2"
        for k in (2, 4):
            cell = cells[(f"ngram-k{k}", "copy", c)]
            assert cell["mode"] == "paired"
            spec_idx = [b["batch_index"] for b in cell["batches"]]
            base_idx = [b["batch_index"] for b in cell["baseline_batches"]]
            assert spec_idx == base_idx == [0, 1]  # one warm-up and one measured batch, paired by index
            assert all(b["role"] == "baseline" for b in cell["baseline_batches"])
        # the baseline's own cell holds the batches it served beside the first configuration
        assert [b["started_at"] for b in base["batches"]] == \
            [b["started_at"] for b in cells[("ngram-k2", "copy", c)]["baseline_batches"]]
    assert any("(paired, 1 batch: no interval)" in m for m in msgs)
    # the rows of the sequential path still read: measurements of every configuration
    ms = {(m.config, m.workload, m.concurrency) for m in measurements(sweep_record(saved))}
    assert ("ngram-k4", "copy", 2) in ms and ("baseline", "copy", 1) in ms
    # ngram-k4 pairs with the baseline batches measured beside it, not with the baseline's cell
    # (those were served beside ngram-k2)
    import math
    from specwatch.choosek.model import paired_logs
    by = {(m.config, m.workload, m.concurrency): m for m in measurements(sweep_record(saved))}
    k4, base = by[("ngram-k4", "copy", 2)], by[("baseline", "copy", 2)]
    logs, unpaired = paired_logs(k4, base)
    beside = {b["batch_index"]: b["output_throughput"] for b in cells[("ngram-k4", "copy", 2)]["baseline_batches"]
              if not b["warmup"]}
    own = {b["batch_index"]: b["output_throughput"] for b in cells[("ngram-k4", "copy", 2)]["batches"] if not b["warmup"]}
    assert unpaired == [] and logs == pytest.approx([math.log(own[i] / beside[i]) for i in sorted(own)])


def test_paired_sweep_resumes_only_the_missing_cells(tmp_path, stub):
    template, log = stub
    out = tmp_path / "sweep.json"
    seen: list[str] = []

    def stop_after_two_paired_cells(msg: str, **_: object) -> None:
        seen.append(msg)
        if sum(1 for m in seen if "(paired," in m) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(plan(workloads=("copy",), concs=(1, 2), paired=True), out, template=template, lock=False,
                  progress=False, echo=stop_after_two_paired_cells)
    partial = sweep_document(out)
    assert partial["status"] == "interrupted"
    kept = {(c["config"], c["max_concurrency"]): c["finished_at"] for c in partial["cells"]}
    assert set(kept) == {("baseline", 1), ("baseline", 2), ("ngram-k2", 1), ("ngram-k2", 2)}
    doc = run_sweep(plan(workloads=("copy",), concs=(1, 2), paired=True), out, template=template, lock=False,
                    progress=False, echo=lambda *a, **k: None).to_json()
    assert doc["status"] == "complete"
    assert starts(log) == [0, 2, 0, 4]  # ngram-k2 was not started again; the baseline came back beside k4
    for c in doc["cells"]:
        if (c["config"], c["max_concurrency"]) in kept:
            assert c["finished_at"] == kept[(c["config"], c["max_concurrency"])]


def test_paired_sweep_says_to_run_sequential_when_the_second_server_cannot_start(tmp_path, stub):
    import socket
    template, log = stub
    out = tmp_path / "sweep.json"
    with socket.socket() as busy:  # the speculative server's port is taken; the baseline's is free
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(SweepError) as err:
            run_sweep(plan(ks=(2,), workloads=("copy",), concs=(1,), paired=True), out, template=template,
                      port=busy.getsockname()[1], lock=False, progress=False, echo=lambda *a, **k: None)
    assert "could not start beside the baseline" in err.value.message and "--sequential" in err.value.message
    assert starts(log) == [0]  # the baseline started, and was stopped
    assert sweep_document(out)["status"] == "failed"


def test_the_advice_says_how_the_sweep_measured(tmp_path, stub):
    from specwatch.choosek.resultfile import load_sweep
    old = load_sweep(Path(__file__).parents[1] / "fixtures" / "sweeps" / "embedded-ngram-draft-sweep.json")
    assert old.measurement_mode == "sequential"  # a file of the format before paired mode: read, labelled so
    template, _ = stub
    out = tmp_path / "sweep.json"
    from specwatch.choosek.cli import advise, sweep
    r = CliRunner().invoke(sweep, ["--result-file", str(out), "--k", "2", "--workloads", "copy",
                                   "--concurrency", "1", "--output-len", "8", "--num-batches", "2",
                                   "--server-command", template, "--no-lock", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert load_sweep(out).measurement_mode == "paired"
    r = CliRunner().invoke(advise, [str(out)])
    assert "measured paired" in r.output
    j = tmp_path / "advice.json"
    CliRunner().invoke(advise, [str(out), "--json", str(j)])
    assert json.loads(j.read_text())["measurement_mode"] == "paired"
    from specwatch.choosek.cli import report
    html = tmp_path / "r.html"
    r = CliRunner().invoke(report, [str(out), "-o", str(html)])
    assert r.exit_code == 0, r.output
    assert "measured paired" in html.read_text()  # the report says it too


def test_paired_sweep_salts_each_configurations_prefix_cache(tmp_path, stub, monkeypatch):
    """The long-lived baseline served a configuration's prompts beside the configurations before
    it, so a later configuration's baseline batches hit vLLM's prefix cache where the fresh
    speculative server did not (a real run, 2026-12-05: baseline TTFT 93-136 ms beside ngram k = 4
    against 291-336 ms beside k = 2, the ratio 0.74x paired against 0.91x sequential). Each
    configuration's paired cells send their own cache_salt to both servers; sequential cells none."""
    import specwatch.choosek.sweep as sweep_mod

    template, _ = stub
    salts: list[tuple[str, str | None, bool]] = []
    real = sweep_mod.run_bench

    def spy(bcfg):
        salts.append((bcfg.role, bcfg.cache_salt, bcfg.paired))
        return real(bcfg)

    monkeypatch.setattr(sweep_mod, "run_bench", spy)
    run_sweep(plan(workloads=("copy",), concs=(1,), paired=True), tmp_path / "p.json", template=template, lock=False,
              progress=False, echo=lambda *a, **k: None)
    assert salts == [("speculative", "specwatch-sweep-ngram-k2", True), ("speculative", "specwatch-sweep-ngram-k4", True)]
    salts.clear()
    run_sweep(plan(workloads=("copy",), concs=(1,), paired=False), tmp_path / "s.json", template=template, lock=False,
              progress=False, echo=lambda *a, **k: None)
    assert salts and all(s is None and not p for _, s, p in salts)


def test_aa_starts_are_measured_beside_the_baseline_and_widen_the_advice(tmp_path, stub):
    """--aa-starts N: N more starts of the baseline, each measured beside it in paired rounds like a
    speculative server (role speculative, k 0, marked aa); advise and report leave them out of the
    candidates and add their between-starts spread to every interval, and say so."""
    from specwatch.choosek.cli import advise, report, sweep
    from specwatch.choosek.resultfile import load_sweep, start_spread
    template, log = stub
    out = tmp_path / "sweep.json"
    r = CliRunner().invoke(sweep, ["--result-file", str(out), "--k", "2", "--workloads", "copy",
                                   "--concurrency", "1,2", "--output-len", "8", "--num-batches", "3",
                                   "--max-batches", "3", "--aa-starts", "2", "--server-command", template,
                                   "--no-lock", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert starts(log) == [0, 0, 2, 0]  # the baseline, aa-1 beside it, ngram-k2, aa-2 last
    doc = load_sweep(out)
    assert [(c.name, c.k, c.aa) for c in doc.configs] == [("baseline", 0, None), ("aa-1", 0, True),
                                                         ("ngram-k2", 2, None), ("aa-2", 0, True)]
    aa = doc.aa_cells()
    assert len(aa) == 4 and all(c.paired and c.k == 0 for c in aa)
    assert all(b.role == "speculative" for c in aa for b in c.batches)
    # the baseline's own cells were served beside aa-1 (the first configuration measured there)
    assert {c.paired_with for c in doc.cells if c.config == "baseline"} == {"aa-1"}
    # readers: no A/A start among the measurements; the spread rests on the 4 A/A cells
    assert {m.config for m in measurements(doc)} == {"baseline", "ngram-k2"}
    spread = start_spread(doc, str(out))
    assert spread is not None and spread.cells == 4 and "aa-1, aa-2" in spread.source
    j = tmp_path / "advice.json"
    r = CliRunner().invoke(advise, [str(out), "--json", str(j)])
    assert r.exit_code == 0, r.output
    assert "between server starts" in " ".join(r.output.split())
    got = json.loads(j.read_text())
    assert got["start_spread"]["cells"] == 4
    recs = json.dumps([f["recommendations"] for f in got["families"]])
    assert "k=2" in recs and "aa-1" not in recs and "aa-2" not in recs  # never a candidate
    html = tmp_path / "r.html"
    r = CliRunner().invoke(report, [str(out), "-o", str(html)])
    assert r.exit_code == 0, r.output
    text = html.read_text()
    assert "between server starts" in text and "aa-2" not in text.split("<h2>Advice</h2>")[1].split("measured by")[0]


def test_without_aa_starts_the_advice_says_the_spread_was_not_measured(tmp_path, stub):
    from specwatch.choosek.cli import advise
    template, _ = stub
    out = tmp_path / "sweep.json"
    r = CliRunner().invoke(sweep_cli(), ["--result-file", str(out), "--k", "2", "--workloads", "copy",
                                         "--concurrency", "1", "--output-len", "8", "--num-batches", "2",
                                         "--server-command", template, "--no-lock", "--no-progress"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(advise, [str(out)])
    assert "between-start spread not measured" in " ".join(r.output.split())
    assert "--aa-starts" in r.output


def sweep_cli():
    from specwatch.choosek.cli import sweep
    return sweep


def test_aa_starts_need_the_baseline():
    with pytest.raises(SweepError, match="needs the baseline"):
        build_configs((2,), (), False, aa_starts=1)
    with pytest.raises(SweepError, match="integer >= 0"):
        build_configs((2,), (), True, aa_starts=-1)
    names = [c.name for c in build_configs((1, 2), (), True, aa_starts=3)]
    assert names == ["baseline", "aa-1", "ngram-k1", "ngram-k2", "aa-2", "aa-3"]
