"""Issue #38 item 7 (the options outside the exporter's window labels): NaN is refused wherever a
float range is checked (click's FloatRange lets NaN through: it compares false with every bound),
``--speculative-method ''`` is refused like ``,method=`` empty, ``advise --mix`` is parsed strictly
and blames the mix, not the sweep file; the exporter's request-head cap is exact, and a body that
is not the exposition format is ``parse``, not ``truncated``."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from specwatch.cli import main

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "tests" / "fixtures" / "sweeps" / "embedded-ngram-draft-sweep.json"


@pytest.mark.parametrize("argv", [
    ["sweep", "--startup-timeout", "nan"],
    ["sweep", "--startup-timeout", "NaN"],
    ["calibrate", "--duration", "nan"],
    ["calibrate", "--interval", "nan"],
    ["vllm", "--startup-timeout", "nan"],
    ["bench", "--timeout", "nan"],
    ["bench", "--read-timeout", "nan"],
    ["bench", "--metrics-linger", "nan"],
    ["bench", "--temperature", "nan"],
    ["top", "--interval", "nan"],
    ["top", "--timeout", "nan"],
])
def test_nan_is_refused_by_every_float_range(argv):
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 2, r.output
    flag = argv[1]
    assert re.search(rf"Invalid value for '{re.escape(flag)}'.*'nan' is not a number", r.output, re.I | re.S), r.output


def test_no_float_option_uses_clicks_floatrange_directly():
    """Every ranged float option goes through specwatch.common.params.FloatRange (NaN refused)."""
    found = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "exporter" / "specwatch").rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if "click.FloatRange(" in line and p.name != "params.py"]
    assert not found, found


@pytest.mark.parametrize("flag", ["--speculative-method", "--drafter"])
def test_an_empty_speculative_method_or_drafter_is_refused(flag):
    r = CliRunner().invoke(main, ["serve", "--upstream", "http://127.0.0.1:9/metrics", flag, "", "--once"])
    assert r.exit_code == 2, r.output
    assert r.output.strip() == f"Error: {flag}: expected a non-empty value"


@pytest.mark.parametrize(("mix", "says"), [
    ("copy=1,", "--mix: an empty item in 'copy=1,' (a comma too many?)"),
    ("copy=1,,random-output=2", "--mix: an empty item"),
    ("copy=1e308,random-output=1e308", "--mix: the weights add up to more than a float holds"),
])
def test_mix_is_parsed_strictly_and_blames_the_mix(mix, says):
    r = CliRunner().invoke(main, ["advise", str(SWEEP), "--mix", mix])
    assert r.exit_code == 2, r.output
    line = r.output.strip().splitlines()[-1]
    assert line.startswith(f"Error: {says}"), line
    assert str(SWEEP) not in line and "was it edited by hand" not in line


def test_a_large_but_finite_mix_still_works():
    r = CliRunner().invoke(main, ["advise", str(SWEEP), "--mix", "copy=1e307,random-output=1e307"])
    assert r.exit_code == 0, r.output


# ------------------------------------------------------------------------------------------------
# the exporter: the request-head cap is exact; a body that is no exposition is "parse"


@pytest.mark.parametrize(("head_bytes", "expected"), [(16384, "head"), (16385, 431), (20000, 431)])
def test_the_request_head_cap_is_exact(head_bytes, expected):
    from specwatch.exporter.listener import Listener

    listener = Listener("127.0.0.1", 0, lambda environ, start: [])
    a, b = socket.socketpair()
    try:
        line = b"GET /metrics HTTP/1.1\r\nX-Pad: "
        head = line + b"a" * (head_bytes - len(line))
        assert len(head) == head_bytes
        b.sendall(head + b"\r\n\r\n")  # all of it at once: one read may hold more than the cap
        got = listener._read_head(a, time.monotonic() + 5)
        assert (got if isinstance(got, int) else "head") == expected
        if expected == "head":
            assert got == head
    finally:
        a.close()
        b.close()
        listener.socket.close()


@pytest.mark.parametrize(("tail", "reason"), [
    ("</html>", "parse"), ('{"status": "ok"}', "parse"), ("hello world", "parse"),
    ('vllm:x{a="b', "truncated"), ("vllm:x 12", "truncated"),
    ("# HELP vllm:x", "truncated"),
])
def test_a_last_line_that_is_no_exposition_is_parse_not_truncated(tail, reason):
    from specwatch.exporter.fetching import FetchError, parse_body

    good = (ROOT / "tests" / "fixtures" / "metrics" / "llamacpp-ngram-k4-constructed.txt").read_text()
    with pytest.raises(FetchError) as err:
        parse_body(good + tail, 1 << 24)
    assert err.value.reason == reason, err.value


def test_the_fixture_bodies_still_parse():
    from specwatch.exporter.fetching import parse_body

    for f in sorted((ROOT / "tests" / "fixtures" / "metrics").glob("*.txt")):
        text = f.read_text()
        if "vllm:" in text or "llamacpp:" in text:
            try:
                parse_body(text, 1 << 24)
            except Exception as exc:  # a fixture of a broken body is not this test's business
                assert getattr(exc, "reason", None) not in ("truncated",), (f, exc)
