"""specwatch report: a self-contained HTML file whose PNG plots render in headless Chromium.

The sweep document is *constructed*: cell summaries are made by the load generator's own result
classes from counter deltas of an i.i.d.-acceptance chain drafter (α = 0.8), so the report's
inputs have exactly the shape a real sweep writes.
"""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess

import pytest
from click.testing import CliRunner

from specwatch.bench.results import BatchResult, CellSummary, SpecDecodeStats
from specwatch.choosek.model import iid_curve
from specwatch.choosek.charts import BASELINE_COLOR, config_colors
from specwatch.choosek.report import render_report
from specwatch.choosek.cli import report
from specwatch.specdecode.metrics import SpecDecodeCounters
from records import sweep_record
from reportcheck import CHROME_FLAGS, CHROMIUM, chromium_image_sizes


def cell(k: int, wl: str, c: int, alpha: float = 0.8) -> dict:
    drafts, out_tokens = 100.0, 64 * 2 * c
    delta = None
    if k:
        pp = tuple(drafts * r for r in iid_curve(alpha, k))
        delta = SpecDecodeCounters("m", "0", drafts, drafts * k, sum(pp), pp, drafts + sum(pp))
    thr = 20.0 * c * (1 + (0.5 * k if c == 1 else 0.1 * k - 0.05 * k * k))
    batch = BatchResult("speculative" if k else "baseline", wl, c, 1, False, "2026-01-01T00:00:00+00:00",
                        out_tokens / thr, 2 * c, 2 * c, 0, 100 * c, out_tokens, True, None,
                        SpecDecodeStats("v1" if k else "none", delta),
                        ttfts=[0.05 + 0.01 * k] * (2 * c), tpots=[0.05 / (1 + 0.3 * k)] * (2 * c))
    return {"config": "baseline" if k == 0 else f"ngram-k{k}", "k": k,
            "family": "" if k == 0 else '{"method":"ngram"}', "workload": wl, "max_concurrency": c,
            "finished_at": "2026-01-01T00:00:00+00:00",
            "summary": CellSummary(batch.role, wl, c, [batch]).to_record().to_json(), "batches": [batch.to_record().to_json()]}


@pytest.fixture
def sweep_doc() -> dict:
    return make_sweep_doc()


@pytest.fixture(scope="module")
def sweep_report() -> str:
    """``render_report(sweep_doc)`` of the unchanged document, rendered once for the module."""
    return render_report(sweep_record(make_sweep_doc()))


def make_sweep_doc() -> dict:
    ks = (0, 1, 2, 4)
    return {
        "specwatch_sweep_format": 1, "status": "complete", "created_at": "2026-01-01T00:00:00+00:00",
        "updated_at": "2026-01-01T00:10:00+00:00",
        "settings": {"workloads": ["copy", "explain"], "concurrencies": [1, 4], "output_len": 64},
        "server": {"kind": "embedded"},
        "configs": [{"name": "baseline" if k == 0 else f"ngram-k{k}", "k": k,
                     "speculative_config": None if k == 0 else {"method": "ngram", "num_speculative_tokens": k}} for k in ks],
        "servers": [{"config": "baseline" if k == 0 else f"ngram-k{k}", "k": k, "startup_seconds": 30.0 + 5 * k,
                     "kv_cache_tokens": 46592 - 128 * k, "num_gpu_blocks": 364 - k, "block_size": 128} for k in ks],
        "cells": [cell(k, wl, c) for k in ks for wl in ("copy", "explain") for c in (1, 4)],
    }


def pngs(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)]


def test_report_is_self_contained_with_decodable_plots(sweep_report):
    import matplotlib.image as mpimg

    html = sweep_report
    images = pngs(html)
    assert len(images) == 6  # servers, throughput, TPOT, TTFT, per-position, E(k)
    assert len(re.findall(r"<img ", html)) == 6
    assert not re.search(r'(src|href)="(https?:)?//', html), "the report must not fetch anything"
    for png in images:
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        arr = mpimg.imread(io.BytesIO(png))
        assert arr.shape[0] > 100 and arr.shape[1] > 100
        assert arr[..., :3].std() > 0.01  # not a blank image
    # tables: start-up time, KV capacity, comparison and the advice
    assert "46592" in html and "30.0" in html
    assert "Output throughput vs concurrency" in html and "Mean TPOT vs concurrency" in html and "Mean TTFT" in html
    assert "vs baseline (paired 95 %)" in html and "confidence / note" in html
    assert "--speculative-config" in html or "run without" in html


def test_baseline_is_black_and_configs_are_distinct():
    colors = config_colors([("baseline", 0), ("ngram-k1", 1), ("ngram-k2", 2), ("ngram-k4", 4)])
    assert colors["baseline"] == BASELINE_COLOR == "black"
    spec = [colors[n] for n in ("ngram-k1", "ngram-k2", "ngram-k4")]
    assert len({tuple(c) for c in spec}) == 3


def test_report_of_an_empty_sweep(sweep_doc):
    sweep_doc["cells"] = []
    sweep_doc["status"] = "running"
    html = render_report(sweep_record(sweep_doc))
    assert "No finished cell yet" in html and "</html>" in html


def test_report_cli(tmp_path, sweep_doc):
    src = tmp_path / "s.json"
    src.write_text(json.dumps(sweep_doc))
    r = CliRunner().invoke(report, [str(src)])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "s.html").exists() and len(pngs((tmp_path / "s.html").read_text())) == 6
    bad = tmp_path / "b.json"
    bad.write_text('{"cells": []}')
    r = CliRunner().invoke(report, [str(bad)])
    assert r.exit_code != 0 and "not a specwatch sweep result" in r.output


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/setup.sh installs it)")
def test_report_renders_in_headless_chromium(tmp_path, sweep_report):
    html = sweep_report
    sizes = chromium_image_sizes(html, tmp_path)
    assert len(sizes) == 6
    for w, h in sizes:
        assert w > 100 and h > 100

    # and the real report (no probe) paints: a screenshot that is not blank
    real = tmp_path / "report.html"
    real.write_text(html)
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, *CHROME_FLAGS, f"--user-data-dir={tmp_path / 'profile2'}", f"--screenshot={shot}",
                    "--window-size=1200,2000", "--virtual-time-budget=10000", real.as_uri()],
                   capture_output=True, timeout=120)
    import matplotlib.image as mpimg

    arr = mpimg.imread(str(shot))
    assert arr.shape[0] >= 1000
    assert arr[..., :3].std() > 0.05


def _write(tmp_path, doc, name="s.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def test_report_refuses_a_sweep_without_finished_cells(tmp_path, sweep_doc):
    from specwatch.choosek.cli import advise

    sweep_doc["cells"], sweep_doc["status"] = [], "running"
    src = _write(tmp_path, sweep_doc)
    r = CliRunner().invoke(report, [str(src)])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
    assert "no finished cell" in r.output and not (tmp_path / "s.html").exists()
    assert CliRunner().invoke(advise, [str(src)]).exit_code == 1  # advise refuses the same sweep


def test_unwritable_outputs_are_one_line_click_errors(tmp_path, sweep_doc):
    from specwatch.choosek.cli import advise

    src = _write(tmp_path, sweep_doc)
    afile = tmp_path / "afile"
    afile.write_text("x")
    for cmd, args in ((report, [str(src), "-o", str(afile / "r.html")]),
                      (advise, [str(src), "--json", str(afile / "a.json")])):
        r = CliRunner().invoke(cmd, args)
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (r.output, r.exception)
        assert "cannot write" in r.output and str(afile) in r.output and "Traceback" not in r.output
    assert afile.read_text() == "x"


def test_advise_fit_k_without_runs_at_that_k_fails(tmp_path, sweep_doc):
    from specwatch.choosek.cli import advise

    src = _write(tmp_path, sweep_doc)  # runs at k = 1, 2, 4
    r = CliRunner().invoke(advise, [str(src), "--fit-k", "3"])
    assert r.exit_code == 2, r.output
    assert "no finished run at k = 3" in r.output and "Recommended k" not in r.output
    r = CliRunner().invoke(advise, [str(src), "--fit-k", "abc"])
    assert r.exit_code == 2 and "Usage:" in r.output and "--fit-k" in r.output
    r = CliRunner().invoke(advise, [str(src), "--fit-k", "0"])
    assert r.exit_code == 2 and "--fit-k" in r.output
    r = CliRunner().invoke(advise, [str(src), "--fit-k", "1,4"])
    assert r.exit_code == 0, r.output


def test_advise_says_exact_fit_instead_of_zero_error_for_two_runs(tmp_path, sweep_doc):
    from specwatch.choosek.cli import advise

    sweep_doc["cells"] = [c for c in sweep_doc["cells"] if c["k"] in (0, 1, 2)]
    src = _write(tmp_path, sweep_doc)
    js = tmp_path / "a.json"
    r = CliRunner().invoke(advise, [str(src), "--json", str(js)])
    assert r.exit_code == 0, r.output
    assert "exact fit: 2 runs, 2 parameters" in r.output and "no error estimate" in r.output
    assert "throughput prediction error (" not in r.output
    assert json.loads(js.read_text())["families"][0]["throughput_error"]["exact_fit"] is True
    # three runs per cell: a real error estimate again
    src = _write(tmp_path, {**sweep_doc, "cells": [cell(k, "copy", 1) for k in (0, 1, 2, 4)]}, "t.json")
    r = CliRunner().invoke(advise, [str(src), "--json", str(js)])
    assert r.exit_code == 0, r.output
    assert "exact fit" not in r.output and "throughput prediction error (3 measured runs)" in r.output
    assert json.loads(js.read_text())["families"][0]["throughput_error"]["exact_fit"] is False


def test_advise_tables_are_not_cut_when_piped(tmp_path, sweep_doc):
    from specwatch.choosek.cli import advise

    src = _write(tmp_path, sweep_doc)
    r = CliRunner().invoke(advise, [str(src)], env={"COLUMNS": None})  # CliRunner's stdout is not a TTY
    assert r.exit_code == 0, r.output
    assert "…" not in r.output
    assert "speedup vs baseline" in r.output and "best measured" in r.output


def _invoke_with_fifo_reader(cmd, args, fifo):
    """Make ``fifo`` a FIFO, run ``cmd args`` while a thread reads it; (click result, [text read])."""
    import os
    import threading

    os.mkfifo(fifo)
    got: list[str] = []
    def read():  # blocks until the command opens the FIFO for writing, returns at its close
        with open(fifo) as f:
            got.append(f.read())

    reader = threading.Thread(target=read)
    reader.start()
    r = CliRunner().invoke(cmd, args)
    reader.join(20)
    return r, got


def test_outputs_never_overwrite_the_sweep_and_keep_links_and_special_files(tmp_path, sweep_doc):
    from specwatch.choosek.cli import advise

    src = _write(tmp_path, sweep_doc)
    before = src.read_text()
    link = tmp_path / "link.json"
    link.symlink_to(src)
    for cmd, args, flag in ((advise, [str(src), "--json", str(src)], "--json"),
                            (advise, [str(src), "--json", str(link)], "--json"),
                            (report, [str(src), "-o", str(src)], "--output")):
        r = CliRunner().invoke(cmd, args)
        assert r.exit_code == 2 and flag in r.output and "sweep result itself" in r.output, r.output
    assert src.read_text() == before
    # a symlinked output: the link stays a link, its target gets the advice
    target = tmp_path / "advice-target.json"
    target.write_text("{}")
    out_link = tmp_path / "advice-link.json"
    out_link.symlink_to(target)
    r = CliRunner().invoke(advise, [str(src), "--json", str(out_link)])
    assert r.exit_code == 0, r.output
    assert out_link.is_symlink() and "families" in json.loads(target.read_text())
    # a FIFO is written in place (a reader gets the JSON), never replaced by a regular file
    fifo = tmp_path / "fifo.json"
    r, got = _invoke_with_fifo_reader(advise, [str(src), "--json", str(fifo)], fifo)
    assert r.exit_code == 0, r.output
    assert fifo.is_fifo() and "families" in json.loads(got[0])


def test_advise_without_spec_decode_counters_says_why(tmp_path, sweep_doc):
    from specwatch.choosek.cli import advise

    for c in sweep_doc["cells"]:  # as from servers that ran without speculation (no counters)
        for rec in [c["summary"], *c["batches"]]:
            for key in list(rec):
                if key.startswith("spec_decode_"):
                    rec[key] = None
    src = _write(tmp_path, sweep_doc)
    out = tmp_path / "a.json"
    r = CliRunner().invoke(advise, [str(src), "--json", str(out)])
    assert r.exit_code == 0, r.output
    # issue 23: the runs' measured throughputs still score their own k (no model, said so)
    assert "no model for" in r.output and "spec-decode" in r.output, r.output
    fam = json.loads(out.read_text())["families"]
    assert fam and all(f["recommendations"] and all(x["k"] is not None for x in f["recommendations"]) for f in fam)
    assert all(p["curve_basis"] == "none" for f in fam for p in f["throughput_predictions"] if p["k"] > 0)


def test_report_basis_option(tmp_path, sweep_doc):
    src = _write(tmp_path, sweep_doc)
    for basis in ("measured", "model"):
        r = CliRunner().invoke(report, [str(src), "-o", str(tmp_path / f"{basis}.html"), "--basis", basis])
        assert r.exit_code == 0, r.output
    r = CliRunner().invoke(report, [str(src), "--basis", "guess"])
    assert r.exit_code == 2


def test_advise_and_report_name_the_cells_left_out_for_failed_requests(tmp_path, sweep_doc):
    from specwatch.choosek.cli import advise

    bad = next(c for c in sweep_doc["cells"] if c["config"] == "ngram-k2" and c["workload"] == "copy" and c["max_concurrency"] == 4)
    bad["summary"]["failed"] = 3
    src = _write(tmp_path, sweep_doc)
    out = tmp_path / "a.json"
    r = CliRunner().invoke(advise, [str(src), "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "left out: 1 cell(s)" in r.output and "ngram-k2/copy/c=4: 3 of" in r.output
    doc = json.loads(out.read_text())
    assert doc["left_out_cells"] and doc["left_out_cells"][0].startswith("ngram-k2/copy/c=4")
    fam = doc["families"][0]
    assert not any(p["k"] == 2 and p["workload"] == "copy" and p["concurrency"] == 4 and p["measured"] is not None
                   for p in fam["throughput_predictions"])
    html = render_report(sweep_record(json.loads(src.read_text())))
    assert "Left out: 1 cell(s)" in html and "ngram-k2/copy/c=4" in html


def test_report_output_keeps_links_and_special_files_and_never_replaces_the_sweep(tmp_path, sweep_doc):
    src = _write(tmp_path, sweep_doc)
    target = tmp_path / "real.html"
    link = tmp_path / "link.html"
    link.symlink_to(target)  # dangling until written
    r = CliRunner().invoke(report, [str(src), "-o", str(link)])
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and "<html" in target.read_text()
    fifo = tmp_path / "fifo.html"
    r, got = _invoke_with_fifo_reader(report, [str(src), "-o", str(fifo)], fifo)
    assert r.exit_code == 0, r.output
    assert fifo.is_fifo() and got and "<html" in got[0]
    # a sweep saved with a .html name: the default output would be the sweep itself
    sw = tmp_path / "sw.html"
    sw.write_text(json.dumps(sweep_doc))
    before = sw.read_text()
    r = CliRunner().invoke(report, [str(sw)])
    assert r.exit_code == 2 and "sweep result itself" in r.output
    assert sw.read_text() == before


def test_advise_json_to_dev_stdout_through_a_pipe(tmp_path, sweep_doc):
    import sys

    src = _write(tmp_path, sweep_doc)
    p = subprocess.run([sys.executable, "-m", "specwatch", "advise", str(src), "--json", "/dev/stdout"],
                       capture_output=True, text=True, timeout=300)  # stdout is a pipe
    assert p.returncode == 0, p.stderr
    start = p.stdout.index('{\n "source"')
    assert "families" in json.loads(p.stdout[start:])


def ragged_cell(wl: str, c: int, per_request: dict | None = None) -> dict:
    """Constructed ngram k = 8 cell whose drafts were ragged (70 % of the draft tokens drafted: the
    counter curve is a lower bound), optionally with an exact per-request record."""
    k, drafts = 8, 100.0
    pp = tuple(drafts * r for r in iid_curve(0.8, k))
    pp = tuple(min(p, drafts * 0.7 ** i) for i, p in enumerate(pp))  # undrafted positions read as rejected
    delta = SpecDecodeCounters("m", "0", drafts, drafts * k * 0.7, sum(pp), pp, drafts + sum(pp))
    out_tokens = 64 * 2 * c
    batch = BatchResult("speculative", wl, c, 1, False, "2026-01-01T00:00:00+00:00", out_tokens / (30.0 * c), 2 * c, 2 * c,
                        0, 100 * c, out_tokens, True, None, SpecDecodeStats("v1", delta),
                        ttfts=[0.1] * (2 * c), tpots=[0.02] * (2 * c))
    summary = CellSummary(batch.role, wl, c, [batch]).to_record().to_json()
    assert summary["spec_decode_curve_basis"] == "lower_bound"
    if per_request is not None:
        summary["spec_decode_per_request"] = per_request
    return {"config": "ngram-k8", "k": k, "family": '{"method":"ngram"}', "workload": wl, "max_concurrency": c,
            "finished_at": "2026-01-01T00:00:00+00:00", "summary": summary, "batches": [batch.to_record().to_json()]}


def test_charts_skip_lower_bound_cells_and_label_the_curve_basis(sweep_doc):
    """A sweep with ngram k = 8 cells whose drafts were ragged: on copy (k = 1, 2, 4 exact beside
    it) the charts draw the k = 4 curve, not the k = 8 lower bound; on explain the k = 8 cell has an
    exact per-request curve, drawn and labelled as such; on a workload with only the ragged k = 8
    the lower bound is drawn labelled "lower bound". Measured markers never include a ragged run
    (its mean acceptance length is not E(8))."""
    from specwatch.choosek.charts import expected_length_series, largest_k_runs
    from specwatch.choosek.resultfile import measurements

    exact_pr = {"status": "measured", "per_position_acceptance_rates": list(iid_curve(0.8, 8))}
    sweep_doc["configs"].append({"name": "ngram-k8", "k": 8, "speculative_config": {"method": "ngram", "num_speculative_tokens": 8}})
    sweep_doc["cells"] += [ragged_cell("copy", 4), ragged_cell("explain", 4, exact_pr), ragged_cell("short", 4)]
    ms = measurements(sweep_record(sweep_doc))
    src = largest_k_runs(ms)
    assert (src[("copy", 4)].k, src[("copy", 4)].curve_basis) == (4, "exact")
    assert (src[("explain", 4)].k, src[("explain", 4)].curve_basis) == (8, "exact_per_request")
    assert (src[("short", 4)].k, src[("short", 4)].curve_basis) == (8, "lower_bound")
    series = {(s["workload"], s["concurrency"]): s for s in expected_length_series(ms)}
    for key in (("copy", 4), ("explain", 4), ("short", 4)):
        assert 8 not in [k for k, _ in series[key]["measured"]], key
    assert [k for k, _ in series[("copy", 4)]["measured"]] == [1, 2, 4]
    assert "predicted from k=4" in series[("copy", 4)]["label"] and not series[("copy", 4)]["lower_bound"]
    assert "exact, per-request data" in series[("explain", 4)]["label"]
    assert series[("short", 4)]["lower_bound"] and "lower bound from k=8" in series[("short", 4)]["label"]
    assert "ragged drafts" in series[("short", 4)]["label"]
    html = render_report(sweep_record(sweep_doc))
    assert len(pngs(html)) == 6
