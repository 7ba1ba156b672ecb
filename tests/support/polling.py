"""Waiting for a condition instead of sleeping a fixed time: poll it until it holds or a limit passes.

- :func:`wait_for` fails (AssertionError naming what it waited for) when the limit passes;
- :func:`wait_until` returns quietly either way, for a test whose own assertion, right after,
  says what went wrong (its message stays the test's).

Readiness of a URL is the product's :func:`specwatch.common.processes.wait_http`; the compose
tests keep their own ``composestack.wait_for`` (3 s between tries, longer messages).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import requests


def wait_for(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.5):
    """Poll ``check()`` until it returns something truthy (returned) — a condition instead of a fixed
    sleep. Request, assertion and lookup errors count as "not yet". Raises AssertionError naming
    ``what`` and the last result after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (requests.RequestException, AssertionError, KeyError, IndexError, ValueError) as exc:
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def wait_until(check: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """Poll ``check()`` every ``interval`` s until it returns something truthy or ``timeout`` s pass;
    returns its last result (falsy after the timeout) and raises nothing of its own: the caller
    asserts the condition afterwards. Exceptions of ``check`` propagate."""
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if last or time.monotonic() >= deadline:
            return last
        time.sleep(interval)
