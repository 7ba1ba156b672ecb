"""The demo's report.html (specwatch.demo.report), rendered from the result files of a real
`specwatch demo` run (tests/fixtures/demo, see its README): self-contained, its plots decode and
render in headless Chromium, and its numbers are the result files' numbers."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from specwatch.demo.records import DemoSummary
from specwatch.demo.report import demo_measurements, is_demo_summary_file, render_demo_report, write_demo_report
from records import demo_documents, record
from specwatch.choosek.cli import report
from reportcheck import (CHROMIUM, check_decision_table_first,
                         check_latency_charts_are_the_result_files, check_report_opens_in_chromium)

DEMO = Path(__file__).parents[1] / "fixtures" / "demo"
IMAGES = 6  # throughput, TTFT, TPOT, whole-run curve with E(k), per-cell curve, per-cell E(k)


def pngs(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)]


@pytest.fixture
def demo_dir(tmp_path) -> Path:
    d = tmp_path / "demo-result"
    shutil.copytree(DEMO, d)
    return d


@pytest.fixture(scope="module")
def demo_report_bytes(tmp_path_factory) -> bytes:
    """report.html of the unchanged demo result as write_demo_report writes it, rendered once for
    the module (the same result files give the same bytes, wherever the folder is)."""
    d = tmp_path_factory.mktemp("demo-report") / "demo-result"
    shutil.copytree(DEMO, d)
    return write_demo_report(d).read_bytes()


@pytest.fixture
def reported_demo_dir(demo_dir, demo_report_bytes) -> Path:
    """``demo_dir`` after ``write_demo_report(demo_dir)``: its report.html written."""
    (demo_dir / "report.html").write_bytes(demo_report_bytes)
    return demo_dir


def test_report_of_a_real_demo_result(demo_dir):
    import matplotlib.image as mpimg

    summary, benches = demo_documents(demo_dir)
    assert set(benches) == {"baseline", "speculative"}
    html = render_demo_report(record(DemoSummary, summary), benches)
    images = pngs(html)
    assert len(images) == IMAGES == len(re.findall(r"<img ", html))
    assert not re.search(r'(src|href)="(https?:)?//', html), "the report must not fetch anything"
    for png in images:
        arr = mpimg.imread(io.BytesIO(png))
        assert arr.shape[0] > 100 and arr.shape[1] > 100 and arr[..., :3].std() > 0.01
    # the numbers are the result files' numbers
    for row in summary["comparison"]:
        assert f"{row['ratio']:.2f}×" in html
        assert f"{row['baseline_output_throughput']:.1f}" in html and f"{row['speculative_output_throughput']:.1f}" in html
    eq = summary["equivalence"]
    assert f"<b>{eq['matched']}/{eq['total']}</b>" in html
    curve = summary["per_position"]
    for i, r in enumerate(curve["per_position_acceptance_rate"]):
        assert f"{r * 100:.1f} %" in html and f"{curve['expected_acceptance_length_by_k'][str(i + 1)]:.2f}" in html
    assert f"mean acceptance length {curve['mean_acceptance_length']:.2f}" in html
    # one measurement per (role, workload, concurrency) cell of the bench files
    ms = demo_measurements(record(DemoSummary, summary), benches)
    assert {(m.config, m.workload) for m in ms} == {(role, rec.workload) for role, doc in benches.items()
                                                  for rec in doc.cells}


def test_equivalence_section_says_it_is_measured_and_shows_the_first_differing_token(demo_dir):
    """Issue #25: a run with 11/12 said only "speculation changed some outputs". The section now
    says that vLLM documents floating-point differences under batched verification, that the count
    is this run's, and shows each differing prompt's first differing token. The real demo result
    (12/12) with one prompt changed as the fresh-clone run saw it (word-chain-7 from character 54)."""
    summary, benches = demo_documents(demo_dir)
    eq = summary["equivalence"]
    p = next(x for x in eq["prompts"] if x["name"] == "word-chain-7")
    p.update(identical=False, first_difference=54,
             first_differing_token={"index": 12, "baseline": " lantern", "speculative": " harbor", "source": "tokenizer"})
    eq["matched"] = 11
    html = render_demo_report(record(DemoSummary, summary), benches)
    assert "<b>11/12</b>" in html and "speculation changed some outputs" not in html
    assert "batched verification" in html and "can change floating-point results" in html
    assert "this run measured" in html
    assert "&#39; lantern&#39; → &#39; harbor&#39; (token 12)" in html, html[html.index("equivalence"):][:3000]
    # an older result file without the field still renders (empty cell)
    del p["first_differing_token"]
    assert "<b>11/12</b>" in render_demo_report(record(DemoSummary, summary), benches)


def _capture_figures(monkeypatch) -> list:
    """Make every chart function hand its matplotlib figure to the returned list (instead of a PNG)."""
    from specwatch.choosek import charts
    from specwatch.demo import report as demoreport

    figs = []

    def keep(fig):
        figs.append(fig)
        return "data:image/png;base64,"

    monkeypatch.setattr(charts, "png_data_uri", keep)
    monkeypatch.setattr(demoreport, "png_data_uri", keep)
    return figs


def test_charts_fit_the_page_unscaled_and_no_legend_covers_a_plot(demo_dir, monkeypatch):
    """Issue #25: the demo report's bar chart of 12 cells was 38 in (3800 px) wide, shown at
    1200 px (the page's width): labels unreadable in a 1400 px window; a legend covered its plot.
    Every chart of the demo report (and the per-workload charts of the sweep report on the same
    measurements) is now at most 1250 px wide at its 100 dpi, its tick labels >= 8 pt, and no
    legend overlaps any plot area."""
    from specwatch.choosek.charts import plot_metric_vs_concurrency

    figs = _capture_figures(monkeypatch)
    summary, benches = demo_documents(demo_dir)
    render_demo_report(record(DemoSummary, summary), benches)
    ms = demo_measurements(record(DemoSummary, summary), benches)
    plot_metric_vs_concurrency(ms, "output_throughput", "tok/s", "Output throughput")
    # the README's demo has six workloads at two concurrencies: the same cells under six names
    six = [dataclasses.replace(m, workload=f"{m.workload}-{i}") for i in range(6) for m in ms]
    assert len({(m.workload, m.concurrency) for m in six}) >= 12
    from specwatch.demo.report import plot_cells
    plot_cells(six, "output_throughput", "output tokens/s", "Output throughput, six workloads")
    plot_metric_vs_concurrency(six, "output_throughput", "tok/s", "Output throughput, six workloads")
    assert len(figs) >= IMAGES + 3
    for fig in figs:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        width_px = fig.get_tightbbox(renderer).width * 100  # inches at savefig's dpi=100
        title = fig._suptitle.get_text() if fig._suptitle else [ax.get_title() for ax in fig.axes]
        assert width_px <= 1250, (title, width_px)
        plots = [ax for ax in fig.axes if ax.get_visible()]
        for ax in plots:
            for lab in ax.get_xticklabels() + ax.get_yticklabels():
                if lab.get_text():
                    assert lab.get_fontsize() >= 8, (title, lab.get_text(), lab.get_fontsize())
        legends = list(fig.legends) + [ax.get_legend() for ax in plots if ax.get_legend() is not None]
        for leg in legends:
            box = leg.get_window_extent(renderer)
            for ax in plots:
                assert not box.overlaps(ax.get_window_extent(renderer)), (title, "legend over a plot")


def test_write_and_report_command(demo_dir):
    out = write_demo_report(demo_dir)
    assert out == demo_dir / "report.html" and len(pngs(out.read_text())) == IMAGES
    out.unlink()
    assert is_demo_summary_file(demo_dir / "demo-summary.json")
    assert not is_demo_summary_file(demo_dir / "bench-baseline.json")
    r = CliRunner().invoke(report, [str(demo_dir / "demo-summary.json")])
    assert r.exit_code == 0, r.output
    assert "report written" in r.output and (demo_dir / "report.html").exists()


def test_interrupted_demo_still_reports(demo_dir):
    """A demo stopped after the baseline: no speculative bench file, no curve, no equivalence."""
    (demo_dir / "bench-speculative.json").unlink()
    doc = json.loads((demo_dir / "demo-summary.json").read_text())
    for key in ("per_position", "equivalence", "comparison", "prometheus"):
        doc.pop(key, None)
    doc["status"] = "interrupted"
    (demo_dir / "demo-summary.json").write_text(json.dumps(doc))
    html = write_demo_report(demo_dir).read_text()
    assert "interrupted" in html and "Not run" in html and "</html>" in html
    assert len(pngs(html)) == 3  # baseline throughput, TTFT, TPOT


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/setup.sh installs it)")
def test_demo_report_renders_in_headless_chromium(reported_demo_dir, tmp_path):
    demo_dir = reported_demo_dir  # write_demo_report(demo_dir) done
    sizes = check_report_opens_in_chromium(demo_dir, tmp_path)
    assert len(sizes) == IMAGES
    for w, h in sizes:
        assert w > 100 and h > 100
    # it opens with the decision table, which is demo-summary.json's decision
    summary = json.loads((demo_dir / "demo-summary.json").read_text())
    assert check_decision_table_first(demo_dir, tmp_path) == len(summary["comparison"]) == len(summary["decision"]["rows"])


def test_latency_charts_are_the_bench_files_values(reported_demo_dir):
    demo_dir = reported_demo_dir  # write_demo_report(demo_dir) done
    comparison = json.loads((demo_dir / "demo-summary.json").read_text())["comparison"]
    assert check_latency_charts_are_the_result_files(demo_dir) == 2 * len(comparison) >= 12  # both roles, every cell
    # a report whose TTFT chart is not the bench file's values fails the check
    bench = demo_dir / "bench-baseline.json"
    doc = json.loads(bench.read_text())
    doc["summary"][0]["mean_ttft_ms"] *= 1.2
    bench.write_text(json.dumps(doc))
    with pytest.raises(AssertionError, match="Mean TTFT by cell: not the bench files' values"):
        check_latency_charts_are_the_result_files(demo_dir)


def test_damaged_demo_result_is_one_line(demo_dir):
    doc = json.loads((demo_dir / "demo-summary.json").read_text())
    doc["comparison"] = [{"workload": "copy", "ratio": "fast"}]
    doc["per_position"] = {"per_position_acceptance_rate": ["x"]}
    (demo_dir / "demo-summary.json").write_text(json.dumps(doc))
    r = CliRunner().invoke(report, [str(demo_dir / "demo-summary.json")])
    assert r.exit_code == 1 and "damaged demo result" in r.output and len(r.output.strip().splitlines()) == 1
    assert not (demo_dir / "report.html").exists()


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/setup.sh installs it)")
def test_decision_check_fails_on_a_report_that_does_not_open_with_it(reported_demo_dir, tmp_path):
    """The Chromium check is not vacuous: a decision that differs from the summary's, or a report
    whose decision table comes after the settings, fails it."""
    demo_dir = reported_demo_dir
    out = demo_dir / "report.html"  # as write_demo_report(demo_dir) wrote it
    summary_path = demo_dir / "demo-summary.json"
    doc = json.loads(summary_path.read_text())
    original = summary_path.read_text()
    row = doc["decision"]["rows"][0]
    row["choice"] = {**row["choice"], "k": 2, "run": "k=2", "reason": None, "basis": "profile"}
    summary_path.write_text(json.dumps(doc))
    with pytest.raises(AssertionError):
        check_decision_table_first(demo_dir, tmp_path)
    summary_path.write_text(original)
    html = out.read_text()
    start, settings = html.index("<h2 id='decision'>"), html.index("<p>Started ")
    moved = html[:start] + html[settings:html.index("<h2>Baseline vs speculative</h2>")] + html[start:settings] \
        + html[html.index("<h2>Baseline vs speculative</h2>"):]
    assert moved != html and len(moved) == len(html)
    out.write_text(moved)
    with pytest.raises(AssertionError):
        check_decision_table_first(demo_dir, tmp_path)
