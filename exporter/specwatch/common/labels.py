"""Checks for text that becomes a Prometheus label value, applied once where the text enters.

prometheus_client encodes the whole exposition as UTF-8 when a scrape is rendered: one label
value that cannot be encoded (a lone surrogate U+D800–U+DFFF, which Python produces for a byte
that is not UTF-8 in ``sys.argv`` or from a JSON ``"\\ud800"`` escape) makes *every* scrape fail,
for every upstream. A label value of megabytes is served on every scrape. So every string that
becomes a label — from the operator (``--drafter``, ``--speculative-method``, ``,method=``,
``,drafter=``), from a cost profile (its name, provenance, methods and drafters) or from an
upstream (``/server_info``'s method and drafter) — is checked here first:

- it is a ``str`` that encodes as UTF-8 (no lone surrogates);
- it holds no control characters (C0 ``\\x00``–``\\x1f``, DEL ``\\x7f``, C1 ``\\x80``–``\\x9f``);
- it is at most ``max_len`` characters (:data:`MAX_LABEL_CHARS` unless the caller says otherwise;
  :data:`MAX_METHOD_CHARS` for a method or drafter, as ``,method=`` always allowed).

Operator and profile input that fails is refused (:class:`BadLabelValue`, a ``ValueError``:
one line, exit 2 from the CLI); upstream text goes through :func:`sanitize_or_none` or
:func:`check_label_value` and a failure is a failed read of that source.
"""

from __future__ import annotations

import re

#: The longest label value accepted by default (characters). vLLM's model names and paths are
#: well under it; it keeps one value from becoming a label of megabytes served on every scrape.
MAX_LABEL_CHARS = 1024
#: The longest speculative method or drafter name (characters): the limit ``,method=`` and
#: ``,drafter=`` always had; a drafter may be a local path.
MAX_METHOD_CHARS = 300
#: The longest cost-profile name (characters).
MAX_PROFILE_NAME_CHARS = 200

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class BadLabelValue(ValueError):
    """A string that cannot be a label value; the message (one line) says what and why."""


def _show(value: str, limit: int = 60) -> str:
    """``value`` safe for one message line: escaped (ascii), cut to about ``limit`` characters."""
    out = ascii(value[: limit + 1])[1:-1]
    return out[:limit] + "…" if len(out) > limit or len(value) > limit else out


def check_label_value(value: object, *, what: str, max_len: int = MAX_LABEL_CHARS) -> str:
    """``value`` unchanged when it can be a label value: a ``str`` of at most ``max_len``
    characters that encodes as UTF-8 and holds no control characters.

    ``what`` names the value in the message (``"--drafter"``, ``"provenance.model"``…). Raises
    :class:`BadLabelValue` (one line, the value escaped and cut) otherwise."""
    if not isinstance(value, str):
        raise BadLabelValue(f"{what}: expected a string, got {type(value).__name__}")
    if len(value) > max_len:
        raise BadLabelValue(f"{what}: {len(value)} characters, more than the {max_len} accepted ('{_show(value)}')")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadLabelValue(f"{what}: not valid UTF-8 text ('{_show(value)}': a byte that is not UTF-8, "
                            "or a lone surrogate)") from None
    m = _CONTROL.search(value)
    if m is not None:
        raise BadLabelValue(f"{what}: holds the control character {ascii(m.group())[1:-1]} ('{_show(value)}')")
    return value


#: What must not reach a terminal raw: C0/DEL/C1 control characters (ESC starts terminal escape
#: sequences), zero-width and bidirectional formatting characters (text that reads otherwise than
#: it is), line and paragraph separators, lone surrogates.
_NOT_FOR_TERMINAL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]")


def for_terminal(text: object) -> str:
    """``text`` (from an upstream: a model name, a label, an error message) safe to print: each
    character of :data:`_NOT_FOR_TERMINAL` written as its Python escape (``\\x1b``,
    ``\\u202e``), everything else unchanged. Idempotent on its own output."""
    return _NOT_FOR_TERMINAL.sub(lambda m: ascii(m.group())[1:-1], str(text))


def sanitize_or_none(value: object, *, max_len: int = MAX_LABEL_CHARS) -> str | None:
    """Upstream-supplied text as a label value, or None when it cannot be one (see
    :func:`check_label_value`; not a string, too long, not encodable, control characters). The
    caller treats None as "no usable value" (e.g. a failed read of that source)."""
    try:
        return check_label_value(value, what="value", max_len=max_len)
    except BadLabelValue:
        return None
