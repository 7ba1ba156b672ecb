"""Running a click command in-process and reading its one-line error (the offline readers' tests)."""

from __future__ import annotations

from click.testing import CliRunner, Result


def invoke(cmd, args) -> Result:
    """``cmd`` run with ``args`` by click's runner; an uncaught exception propagates (a traceback
    is a failure, not an output)."""
    return CliRunner().invoke(cmd, args, catch_exceptions=False)


def one_line_error(r: Result) -> str:
    """The message of a command that failed with exactly one line, ``Error: …`` (asserted)."""
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.output
    return lines[0].removeprefix("Error: ")
