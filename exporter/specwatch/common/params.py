"""Parameter parsing shared by the commands and configs: float ranges that refuse NaN
(:class:`FloatRange`), comma-separated integer lists (``--k 1,2,4``, ``--concurrency 1,4``,
``--max-concurrency 1,8``, ``--fit-k 1,8``) and Prometheus durations (the exporter's
``--window``, the mixin's windows and intervals)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import click


_DURATION_RE = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_DURATION_UNITS = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration such as ``"5m"``, ``"1h30m"``, ``"15s"``, ``"500ms"``.

    Raises ValueError for anything Prometheus would reject: empty text, a missing or unknown unit,
    units out of order (``"5m1h"``).
    """
    if not isinstance(text, str) or not text:
        raise ValueError(f"not a Prometheus duration: {text!r}")
    m = _DURATION_RE.match(text)
    if not m or not any(m.groups()):
        raise ValueError(f"not a Prometheus duration: {text!r} (e.g. 15s, 5m, 1h30m)")
    return sum(int(g) * unit for g, unit in zip(m.groups(), _DURATION_UNITS, strict=True) if g)


class FloatRange(click.FloatRange):
    """:class:`click.FloatRange` that also refuses NaN: click's range checks compare, and NaN
    compares false with every bound, so ``--startup-timeout nan`` would pass ``min=0`` and never
    time out. Every float option with a range uses this one (a test checks); infinity stays as
    click treats it (refused by a finite ``max``, accepted by a ``min`` alone)."""

    def convert(self, value, param, ctx):
        """The float of ``value`` within the range; exit 2 naming the option for NaN."""
        rv = super().convert(value, param, ctx)
        if isinstance(rv, float) and math.isnan(rv):
            self.fail(f"{value!r} is not a number", param, ctx)
        return rv


def parse_int_list(text: str, what: str) -> tuple[int, ...]:
    """``"1,2, 4"`` → ``(1, 2, 4)``.

    Raises ValueError (message prefixed with ``what``, e.g. ``"--k: empty list"``) for anything
    that is not a non-empty comma-separated list of integers."""
    try:
        vals = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated integers such as 1,8,32, got {text!r}") from None
    if not vals:
        raise ValueError(f"{what}: empty list")
    return vals


def int_list(minimum: int = 1, *, dedupe: bool = True,
             message: str | None = None) -> Callable[[click.Context, click.Parameter, str | None], tuple[int, ...] | None]:
    """A click callback parsing a comma-separated integer list, every value ≥ ``minimum``.

    Bad input exits 2 with click's usage line naming the option; ``message`` replaces the specific
    reasons with one text for every bad input (formatted with ``value``, the text given, e.g.
    ``"{value!r}: expected …"``). With ``dedupe`` repeated values are measured once ("1,1" →
    (1,)), order kept. ``None`` passes through (option not given)."""

    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
        if value is None:
            return None
        flag = param.opts[0] if param.opts else param.name
        try:
            vals = parse_int_list(value, flag)
        except ValueError as exc:
            raise click.BadParameter(message.format(value=value) if message else str(exc).removeprefix(f"{flag}: ")) from None
        bad = [v for v in vals if v < minimum]
        if bad:
            raise click.BadParameter(message.format(value=value) if message
                                     else f"every value must be >= {minimum}, got {', '.join(map(str, bad))}")
        return tuple(dict.fromkeys(vals)) if dedupe else vals

    return callback
