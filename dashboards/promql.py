"""PromQL selectors of an expression, for checking dashboards, rules and alerts offline.

The expression is parsed by ``promql-parser`` (PyPI; Python bindings of GreptimeTeam's Rust
PromQL parser, which follows Prometheus' grammar). Grafana's interval variables
(``$__rate_interval``, ``$__interval``, ``$__range``) are not PromQL: they are replaced by
sentinel durations before parsing and reported back by name. Other Grafana variables may only
appear inside label values (strings), where they are plain text.

What the checks need (grafana/dashboard-linter's target rules — target-job-rule,
target-instance-rule, target-rate-interval-rule, target-counter-agg-rule — and the metric
cross-reference) is every vector selector with its matchers, its range, and the function or
aggregation that directly holds it. Whether an expression means what it should is checked
against a real Prometheus (``tests/integration/test_dashboards_live.py``) and ``promtool`` (rules).

Errors: :class:`PromQLSyntaxError` for anything the parser rejects.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field

import promql_parser

__all__ = ["Matcher", "Selector", "PromQLSyntaxError", "selectors", "metric_names"]

# Grafana interval variables -> sentinel durations no dashboard uses (seconds), and back.
_VARIABLES = {"$__rate_interval": 9_999_991, "$__interval": 9_999_992, "$__range": 9_999_993}
_BY_SECONDS = {v: k for k, v in _VARIABLES.items()}
_OPS = {"MatchOp.Equal": "=", "MatchOp.NotEqual": "!=", "MatchOp.Re": "=~", "MatchOp.NotRe": "!~"}


class PromQLSyntaxError(ValueError):
    """The expression is not valid PromQL (after Grafana's interval variables are substituted)."""


@dataclass(frozen=True)
class Matcher:
    """A label matcher ``name op "value"`` (value as the parser unquoted it)."""

    name: str
    op: str
    value: str


@dataclass
class Selector:
    """A vector selector as found in the expression.

    ``name``: the metric name (from the leading identifier or an ``__name__="x"`` matcher), or
    None. ``range``: the range of a range selector as written in Prometheus' duration syntax
    (``"5m"``), or the Grafana variable (``"$__rate_interval"``), or None (instant vector).
    ``func``: the function or aggregation whose argument the selector is (None at top level or
    inside a binary expression/parentheses). ``direct_arg``: True when the selector (or range
    selector) is itself an argument of ``func``.
    """

    name: str | None
    matchers: list[Matcher] = field(default_factory=list)
    range: str | None = None
    func: str | None = None
    direct_arg: bool = False

    def matchers_for(self, label: str) -> list[Matcher]:
        """All matchers on ``label`` (PromQL allows several on the same label)."""
        return [m for m in self.matchers if m.name == label]


def _duration_text(td: _dt.timedelta) -> str:
    seconds = int(round(td.total_seconds()))
    if seconds in _BY_SECONDS:
        return _BY_SECONDS[seconds]
    ms = int(round(td.total_seconds() * 1000))
    if ms % 1000:
        return f"{ms}ms"
    out = ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            out += f"{seconds // size}{unit}"
            seconds %= size
    return out or "0s"


def _substitute(expr: str) -> str:
    for var, seconds in sorted(_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, f"{seconds}s")
    return expr


def _selector(vs, rng: str | None, func: str | None, direct: bool) -> Selector:
    ms = [Matcher(m.name, _OPS.get(str(m.op), str(m.op)), m.value) for m in vs.matchers.matchers]
    name = vs.name
    if name is None:
        name = next((m.value for m in ms if m.name == "__name__" and m.op == "="), None)
    return Selector(name, ms, rng, func, direct)


def _walk(node, func: str | None, direct: bool, out: list[Selector]) -> None:
    kind = type(node).__name__
    if kind == "VectorSelector":
        out.append(_selector(node, None, func, direct))
    elif kind == "MatrixSelector":
        out.append(_selector(node.vector_selector, _duration_text(node.range), func, direct))
    elif kind == "Call":
        for arg in node.args:
            _walk(arg, node.func.name, True, out)
    elif kind == "AggregateExpr":
        op = str(node.op)
        if node.param is not None:
            _walk(node.param, op, True, out)
        _walk(node.expr, op, True, out)
    elif kind == "BinaryExpr":
        _walk(node.lhs, func, False, out)
        _walk(node.rhs, func, False, out)
    elif kind in ("ParenExpr", "UnaryExpr", "SubqueryExpr"):
        _walk(node.expr, func, False, out)
    # NumberLiteral, StringLiteral: no selector


def selectors(expr: str) -> list[Selector]:
    """Every vector selector in ``expr``, in order of appearance (left to right).

    Raises PromQLSyntaxError when ``expr`` is not valid PromQL."""
    if not isinstance(expr, str) or not expr.strip():
        raise PromQLSyntaxError(f"empty expression: {expr!r}")
    if re.search(r"\$(?!__(rate_interval|interval|range)\b)[A-Za-z_]", re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)):
        raise PromQLSyntaxError(f"a Grafana variable outside a label value in {expr!r}")
    try:
        tree = promql_parser.parse(_substitute(expr))
    except (ValueError, RuntimeError) as exc:
        raise PromQLSyntaxError(f"{exc} in {expr!r}") from None
    out: list[Selector] = []
    _walk(tree, None, False, out)
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names selected by ``expr`` (selectors without a fixed name are skipped)."""
    return {s.name for s in selectors(expr) if s.name}
