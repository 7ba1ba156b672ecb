"""A small, structural PromQL reader for checking dashboards, rules and alerts offline.

It is NOT a PromQL parser (Python has none that is maintained): it tokenizes an expression and
finds its vector selectors, their label matchers, their range (``[...]``) and the function that
directly encloses a range selector. That is what grafana/dashboard-linter's target rules look at
(target-job-rule, target-instance-rule, target-rate-interval-rule, target-counter-agg-rule) and
what the metric cross-reference needs. Whether an expression is valid PromQL is checked against
a real Prometheus (``tests/test_dashboards_live.py``) and ``promtool`` (rules).

Errors: :class:`PromQLSyntaxError` for input the tokenizer cannot read (unbalanced brackets,
unterminated strings, unknown characters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Matcher", "Selector", "PromQLSyntaxError", "tokenize", "selectors", "metric_names"]

AGGREGATIONS = frozenset(
    {
        "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
        "bottomk", "topk", "quantile", "limitk", "limit_ratio",
    }
)
GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}) | GROUPING

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\[\]]*\])
  | (?P<duration>(?:\d+(?:ms|[smhdwy]))+(?![a-zA-Z0-9_:]))
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<op>=~|!~|==|!=|<=|>=|[-+*/%^<>=@])
  | (?P<punct>[(){},])
    """,
    re.VERBOSE,
)


class PromQLSyntaxError(ValueError):
    """The expression cannot be tokenized or its brackets do not balance."""


@dataclass(frozen=True)
class Token:
    """One lexical token: ``kind`` is string|range|duration|number|ident|op|punct; ``text`` the raw text."""

    kind: str
    text: str
    pos: int


@dataclass(frozen=True)
class Matcher:
    """A label matcher ``name op "value"`` (value unquoted, escapes left as written)."""

    name: str
    op: str
    value: str


@dataclass
class Selector:
    """A vector selector as found in the expression.

    ``name``: the metric name (from the leading identifier or an ``__name__="x"`` matcher), or
    None. ``range``: the text inside ``[...]`` directly after it, or None (instant vector).
    ``func``: the name of the function/aggregation whose parentheses directly hold the selector
    (None at top level). ``direct_arg``: True when the selector is a whole argument of ``func``
    (not part of a larger sub-expression inside the same parentheses).
    """

    name: str | None
    matchers: list[Matcher] = field(default_factory=list)
    range: str | None = None
    func: str | None = None
    direct_arg: bool = False

    def matchers_for(self, label: str) -> list[Matcher]:
        """All matchers on ``label`` (PromQL allows several on the same label)."""
        return [m for m in self.matchers if m.name == label]


def tokenize(expr: str) -> list[Token]:
    """Split ``expr`` into tokens (whitespace and comments dropped).

    Raises PromQLSyntaxError on a character no PromQL token starts with (``$`` outside a string
    or a range is one: Grafana variables must be substituted or quoted first).
    """
    tokens: list[Token] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN_RE.match(expr, pos)
        if not m:
            raise PromQLSyntaxError(f"unexpected character {expr[pos]!r} at {pos} in {expr!r}")
        kind = m.lastgroup
        if kind != "ws":
            tokens.append(Token(kind, m.group(), pos))
        pos = m.end()
    return tokens


def _unquote(s: str) -> str:
    return s[1:-1]


def selectors(expr: str) -> list[Selector]:
    """Every vector selector in ``expr``, in order of appearance.

    Raises PromQLSyntaxError for unbalanced parentheses/braces or a malformed matcher list.
    """
    toks = tokenize(expr)
    out: list[Selector] = []
    # stack of open parentheses: (function name or None, kind) where kind is "call"|"labels"|"group"
    stack: list[tuple[str | None, str]] = []
    pending_agg: str | None = None  # aggregation waiting for its argument after "by (...)"
    i = 0
    n = len(toks)

    def arg_start(idx: int) -> bool:
        """True if the token before ``idx`` opens an argument (``(`` or ``,``)."""
        return idx > 0 and toks[idx - 1].text in ("(", ",")

    def arg_end(idx: int) -> bool:
        return idx >= n or toks[idx].text in (")", ",")

    while i < n:
        t = toks[i]
        nxt = toks[i + 1] if i + 1 < n else None
        if t.kind == "ident" and t.text in GROUPING and nxt is not None and nxt.text == "(":
            stack.append((None, "labels"))
            i += 2
            continue
        if t.kind == "ident" and stack and stack[-1][1] == "labels":
            i += 1
            continue
        if t.kind == "ident" and t.text in AGGREGATIONS and nxt is not None and nxt.text in GROUPING:
            pending_agg = t.text
            i += 1
            continue
        if t.kind == "ident" and nxt is not None and nxt.text == "(" and t.text not in KEYWORDS:
            stack.append((t.text, "call"))
            i += 2
            continue
        if t.text == "(":
            if pending_agg is not None:
                stack.append((pending_agg, "call"))
                pending_agg = None
            else:
                stack.append((None, "group"))
            i += 1
            continue
        if t.text == ")":
            if not stack:
                raise PromQLSyntaxError(f"unbalanced ')' at {t.pos} in {expr!r}")
            stack.pop()
            i += 1
            continue
        if (t.kind == "ident" and t.text.lower() not in KEYWORDS) or t.text == "{":
            start = i
            name = t.text if t.kind == "ident" else None
            matchers: list[Matcher] = []
            if t.kind == "ident":
                i += 1
            if i < n and toks[i].text == "{":
                i += 1
                while True:
                    if i >= n:
                        raise PromQLSyntaxError(f"unterminated '{{' in {expr!r}")
                    if toks[i].text == "}":
                        i += 1
                        break
                    if toks[i].text == ",":
                        i += 1
                        continue
                    if (
                        i + 2 < n
                        and toks[i].kind == "ident"
                        and toks[i + 1].kind == "op"
                        and toks[i + 1].text in ("=", "!=", "=~", "!~")
                        and toks[i + 2].kind == "string"
                    ):
                        matchers.append(Matcher(toks[i].text, toks[i + 1].text, _unquote(toks[i + 2].text)))
                        i += 3
                        continue
                    raise PromQLSyntaxError(f"malformed matcher at {toks[i].pos} in {expr!r}")
            rng = None
            if i < n and toks[i].kind == "range":
                rng = toks[i].text[1:-1].strip()
                i += 1
            end = i
            if i < n and toks[i].text == "offset":
                i += 2
                end = i
            if name is None:
                for m in matchers:
                    if m.name == "__name__" and m.op == "=":
                        name = m.value
            func = stack[-1][0] if stack and stack[-1][1] == "call" else None
            out.append(
                Selector(name, matchers, rng, func, direct_arg=arg_start(start) and arg_end(end))
            )
            continue
        i += 1
    if stack:
        raise PromQLSyntaxError(f"unclosed '(' in {expr!r}")
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names selected by ``expr`` (selectors without a fixed name are skipped)."""
    return {s.name for s in selectors(expr) if s.name}
