"""Issue #38: `serve` and `top --upstream` classify the same upstream /metrics body the same way.

A fake upstream on 127.0.0.1 serves a real vLLM capture whose first line is junk (text, control
characters, an HTML line), the same capture without its final newline, and bodies that are no
exposition at all (an HTML page, a JSON answer, with and without a final newline).
``specwatch serve --once`` and ``specwatch top --once --upstream`` run against it as a user runs
them. Before: a junk first line was ignored by serve (``specwatch_up 1``, every series served) while
top called the upstream down (``parse``, with no message); a page that is no exposition and has no
final newline was ``parse`` in serve and ``truncated`` in top; a junk line followed by a capture
without its final newline was ``truncated`` in both. Now both fetch through serve's own path
(``AsyncHttpRunner`` → ``parse_body``): a body with a line that is no exposition line is ``parse``,
wherever the line stands (docs/exporter.md, "Bad input, truncation"), with the same message.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from exporter_helpers import fixture, serve_pages
from specwatch.exporter.fetching import FetchError, parse_body
from specwatch.specdecode.metrics import find_non_exposition_line

REPO = Path(__file__).resolve().parents[2]
CAPTURE = "vllm-0.32-ngram-k4-after-traffic.txt"


def _capture() -> bytes:
    return fixture(CAPTURE).encode()


def _junk_first(junk: bytes) -> bytes:
    body = _capture()
    return junk + body[body.index(b"\n"):]


def _cut_mid_line() -> bytes:
    body = _capture()
    i = body.index(b"vllm:spec_decode_num_accepted_tokens_total{")
    return body[: body.index(b" ", i) + 3]  # inside the value of a real sample


#: name -> (body, Content-Type, the reason both must give; None: up)
CASES = {
    "capture": (_capture(), "text/plain; version=0.0.4; charset=utf-8", None),
    "junk-text-first-line": (_junk_first(b"garbage here"), "text/plain; version=0.0.4", "parse"),
    "junk-control-first-line": (_junk_first(b"\x00\x01\x02\x7f binary"), "text/plain", "parse"),
    "html-first-line": (_junk_first(b"<html><body>oops</body></html>"), "text/plain", "parse"),
    "junk-first-line-no-final-newline": (_junk_first(b"garbage here").rstrip(b"\n"), "text/plain", "parse"),
    "html-page": (b"<!doctype html><html><body><h1>Welcome</h1></body></html>\n", "text/html", "parse"),
    "html-page-no-final-newline": (b"<!doctype html><html><body><h1>Welcome</h1></body></html>", "text/html", "parse"),
    "json-no-final-newline": (b'{"status": "ok"}', "application/json", "parse"),
    "not-utf8-first-line": (_junk_first(b"\xfe\xff\x80 binary"), "text/plain", "decode"),
    "capture-cut-mid-line": (_cut_mid_line(), "text/plain; version=0.0.4", "truncated"),
}


def _run(command: str, url: str) -> subprocess.CompletedProcess:
    args = {"serve": ["serve", "--once", "--upstream", f"u={url}", "--timeout", "5"],
            "top": ["top", "--once", "--upstream", f"u={url}", "--timeout", "5"]}[command]
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
    return subprocess.run([sys.executable, "-m", "specwatch", *args], capture_output=True, text=True, timeout=60, env=env)


def _serve_verdict(r: subprocess.CompletedProcess) -> tuple[float, str | None, str | None]:
    """(specwatch_up, the counted reason, the logged message) of one `serve --once` run."""
    up = float(re.search(r'^specwatch_up\{upstream="u"\} (\S+)$', r.stdout, re.M).group(1))
    reasons = re.findall(r'^specwatch_upstream_fetch_errors_total\{reason="(\w+)",upstream="u"\} 1\.0$', r.stdout, re.M)
    assert len(reasons) <= 1, r.stdout
    logged = re.search(r"upstream u: (\w+: .*)$", r.stderr, re.M)
    return up, (reasons[0] if reasons else None), (logged.group(1) if logged else None)


def _top_verdict(r: subprocess.CompletedProcess) -> tuple[bool, str | None]:
    """(up?, "reason: message" of the DOWN line) of one `top --once --upstream` run."""
    if re.search(r"^upstream u: up ", r.stdout, re.M):
        return True, None
    down = re.search(r"^upstream u: DOWN: (.*) \(failed fetches: ", r.stdout, re.M)
    assert down is not None, r.stdout
    return False, down.group(1)


@pytest.mark.parametrize("case", list(CASES))
def test_serve_and_top_classify_the_same_body_the_same_way(case):
    body, ctype, reason = CASES[case]
    with serve_pages({"/metrics": (200, ctype, body)}) as url:
        served = _run("serve", url)
        shown = _run("top", url)
    for r in (served, shown):
        assert "Traceback" not in r.stderr, r.stderr
    up, counted, logged = _serve_verdict(served)
    top_up, top_error = _top_verdict(shown)
    if reason is None:
        assert (served.returncode, up, counted) == (0, 1.0, None), served.stderr
        assert (shown.returncode, top_up) == (0, True), shown.stdout
        assert "specwatch_draft_acceptance_rate{" in served.stdout and "draft acceptance rate" in shown.stdout
        return
    # serve: down with the reason, no derived series; exit 3 (every upstream down)
    assert (served.returncode, up, counted) == (3, 0.0, reason), (served.stdout[-2000:], served.stderr)
    assert "specwatch_draft_acceptance_rate{" not in served.stdout
    # top: down (exit 1), the same reason and the same one-line message as serve's log line
    assert (shown.returncode, top_up) == (1, False), shown.stdout
    assert top_error is not None and top_error.startswith(f"{reason}: "), top_error
    assert top_error == logged, (top_error, logged)


@pytest.mark.parametrize("junk", ["garbage here", "<html>", "\x00\x01 binary", "vllm:spec_decode_num_drafts_total",
                                  "vllm:spec_decode_num_drafts_total{engine=\"0\"} lots", "a 1 2 3"])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_junk_line_anywhere_in_a_real_capture_is_parse(junk, where):
    """The classification itself (parse_body, the one path of both commands): the junk line's place
    does not matter, and the message names it."""
    lines = fixture(CAPTURE).splitlines(keepends=True)
    at = {"first": 0, "middle": len(lines) // 2, "last": len(lines) - 1}[where]
    lines[at] = junk + "\n"
    with pytest.raises(FetchError) as ei:
        parse_body("".join(lines), 1 << 24)
    assert ei.value.reason == "parse"
    assert "not a /metrics exposition" in str(ei.value)


@pytest.mark.parametrize("line", ["a 1", "a{b=\"c d\"} 1.5e+3 1700000000000", "a NaN", "a +Inf", "a -inf",
                                  "# HELP a anything at all", "# EOF", "", "   ", "a 1\r",
                                  "x{a=\"1\"} 2 # {trace_id=\"t\"} 1 1.5", "{\"my.metric\",a=\"b\"} 1"])
def test_exposition_lines_are_not_junk(line):
    assert find_non_exposition_line(line + "\n") is None
    assert find_non_exposition_line(line) is None  # a last line without its newline too


def test_every_real_capture_reads_as_exposition():
    for path in sorted((REPO / "tests" / "fixtures" / "metrics").glob("*.txt")):
        assert find_non_exposition_line(path.read_text()) is None, path.name
        parse_body(path.read_text(), 1 << 24)  # and parses (no FetchError)


def test_a_long_body_of_other_families_is_scanned_in_linear_time():
    """The scan is possessive (no backtracking state kept per line): 4 MiB of short lines of
    other families is read without the memory or time growing beyond linear."""
    import time

    body = fixture(CAPTURE) + "node_x 1\n" * 500_000
    t0 = time.process_time()
    assert find_non_exposition_line(body) is None
    assert time.process_time() - t0 < 5.0
