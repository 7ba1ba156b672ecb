"""Checks of a rendered report shared by the report tests and the demo end to end: headless
Chromium (image sizes, what the page shows first) and the demo report's charts against its result
files. Moved verbatim from tests/unit/test_report.py and tests/unit/test_demo_report.py."""

from __future__ import annotations

import base64
import dataclasses
import html as html_lib
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

from specwatch.demo.decision import TABLE_COLUMNS, table_rows
from specwatch.demo.decisionrecords import Decision

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage"]


def chromium_image_sizes(html: str, tmp_path: Path) -> list[tuple[int, int]]:
    """Load ``html`` in headless Chromium and return every image's natural (width, height) once
    the page has loaded (a probe script writes them into the title; fails if it did not run)."""
    probe = ("<script>window.addEventListener('load', function () {"
             "var s = Array.prototype.map.call(document.images, function (i) {"
             "return i.complete ? i.naturalWidth + 'x' + i.naturalHeight : 'pending'; });"
             "document.title = 'IMAGES:' + s.join(',');});</script>")
    page = tmp_path / "probe.html"
    page.write_text(html.replace("</body>", probe + "</body>"))
    dom = subprocess.run(
        [CHROMIUM, *CHROME_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000",
         "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    ).stdout
    m = re.search(r"<title>IMAGES:([^<]*)</title>", dom)
    assert m, f"probe did not run; DOM head: {dom[:300]!r}"
    sizes = m.group(1).split(",")
    assert "pending" not in sizes, sizes
    return [tuple(int(x) for x in s.split("x")) for s in sizes]


def _pixels(png_or_uri: bytes | str):
    import matplotlib.image as mpimg

    if isinstance(png_or_uri, str):
        png_or_uri = base64.b64decode(png_or_uri.split(",", 1)[1])
    return mpimg.imread(io.BytesIO(png_or_uri))


#: The report's TTFT and TPOT charts: (Measurement field = bench-file field, figure alt text, chart title).
LATENCY_CHARTS = (("mean_ttft_ms", "Mean TTFT by cell", "Mean TTFT (time to first token)"),
                  ("mean_tpot_ms", "Mean TPOT by cell", "Mean TPOT (time per output token)"))


def check_latency_charts_are_the_result_files(result_dir: Path) -> int:
    """The TTFT and TPOT charts in ``result_dir/report.html`` are drawn from the values in the
    folder's bench-*.json files: each embedded chart is pixel for pixel the chart of Measurements
    built here straight from those files (cell = role, workload, max_concurrency), and a chart of
    other values would not be. Returns how many cells were checked."""
    import numpy as np

    from specwatch.demo.report import plot_cells
    from specwatch.choosek.model import Measurement

    html = (result_dir / "report.html").read_text()
    k = json.loads((result_dir / "demo-summary.json").read_text())["k"]
    ms = [Measurement(config=role, k=0 if role == "baseline" else k, workload=rec["workload"],
                      concurrency=rec["max_concurrency"], output_throughput=rec["output_throughput"],
                      mean_ttft_ms=rec["mean_ttft_ms"], mean_tpot_ms=rec["mean_tpot_ms"])
          for role in ("baseline", "speculative")
          for rec in json.loads((result_dir / f"bench-{role}.json").read_text())["summary"]]
    assert ms and all(m.mean_ttft_ms > 0 and m.mean_tpot_ms > 0 for m in ms)
    for attr, alt, title in LATENCY_CHARTS:
        (uri,) = re.findall(rf'<img src="(data:image/png;base64,[A-Za-z0-9+/=]+)" alt="{alt}">', html)
        shown = _pixels(uri)
        assert np.array_equal(shown, _pixels(plot_cells(ms, attr, "ms", title))), f"{alt}: not the bench files' values"
        other = [dataclasses.replace(m, **{attr: getattr(m, attr) * 1.5}) if m.config == "baseline" else m for m in ms]
        other_px = _pixels(plot_cells(other, attr, "ms", title))
        assert other_px.shape != shown.shape or not np.array_equal(shown, other_px)
    return len(ms)


def check_report_opens_in_chromium(result_dir: Path, tmp_path: Path) -> list[tuple[int, int]]:
    """Open ``result_dir/report.html`` in headless Chromium: every <img> of it has loaded with a
    non-zero natural size. Returns the sizes."""
    html = (result_dir / "report.html").read_text()
    sizes = chromium_image_sizes(html, tmp_path)
    assert len(sizes) == len(re.findall(r"<img ", html)) > 0
    assert all(w > 0 and h > 0 for w, h in sizes), sizes
    return sizes


def chromium_first_section(result_dir: Path, tmp_path: Path) -> dict:
    """Open ``result_dir/report.html`` in headless Chromium and return what the page shows first:
    the first h2's text, the first table's class and cell texts (as rendered, ``innerText``), and
    whether that table lies above every other table and image on the page (layout positions)."""
    probe = ("<script>window.addEventListener('load', function () {"
             "var t = document.querySelector('table'), h = document.querySelector('h2');"
             "var top = t.getBoundingClientRect().top;"
             "var others = Array.prototype.slice.call(document.querySelectorAll('table, img')).filter(function (e) {"
             "return e !== t; });"
             "var out = {h2: h.innerText, cls: t.className, above: others.every(function (e) {"
             "return e.getBoundingClientRect().top > top; }),"
             "head: Array.prototype.map.call(t.querySelectorAll('th'), function (c) { return c.innerText; }),"
             "rows: Array.prototype.map.call(t.querySelectorAll('tbody tr'), function (r) {"
             "return Array.prototype.map.call(r.cells, function (c) { return c.innerText; }); })};"
             "var pre = document.createElement('pre'); pre.id = 'probe-out';"
             "pre.textContent = JSON.stringify(out); document.body.appendChild(pre);});</script>")
    page = tmp_path / "probe-decision.html"
    page.write_text((result_dir / "report.html").read_text().replace("</body>", probe + "</body>"))
    dom = subprocess.run(
        [CHROMIUM, *CHROME_FLAGS, f"--user-data-dir={tmp_path / 'profile-decision'}", "--virtual-time-budget=10000",
         "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'<pre id="probe-out">([^<]*)</pre>', dom)
    assert m, f"probe did not run; DOM head: {dom[:300]!r}"
    return json.loads(html_lib.unescape(m.group(1)))


def check_decision_table_first(result_dir: Path, tmp_path: Path) -> int:
    """report.html opens (in headless Chromium) with the decision table, above every other table
    and image, and its cells are demo-summary.json's decision (the console's text). Returns the
    number of rows checked."""
    decision = json.loads((result_dir / "demo-summary.json").read_text())["decision"]
    shown = chromium_first_section(result_dir, tmp_path)
    assert shown["h2"].startswith("The decision") and shown["cls"] == "decision" and shown["above"], shown
    assert shown["head"] == list(TABLE_COLUMNS)
    expected = table_rows(Decision.from_json(decision))
    assert shown["rows"] == expected, (shown["rows"], expected)
    assert [r[:2] for r in shown["rows"]] == [[r["workload"], str(r["concurrency"])] for r in decision["rows"]]
    return len(expected)
