"""Reading a small YAML file an operator names (a cost profile) without letting it hang or sink the process.

:func:`load_yaml_file` bounds everything a hostile or mistaken file could cost:

- only a regular file is read: a FIFO (which would block before the exporter listens), a device
  such as ``/dev/zero`` (which reads until memory runs out) or a directory is refused from
  ``os.stat`` before opening; the file is opened with ``O_NONBLOCK`` and checked again with
  ``fstat`` (a file swapped in between cannot block either);
- at most ``max_bytes`` are read (1 MiB by default; a real cost profile is a few KiB);
- YAML aliases (``*name``) are refused: they are how a 748-byte "billion laughs" document expands
  to gigabytes; anchors without aliases are harmless and accepted;
- nesting deeper than :data:`MAX_DEPTH` is refused before anything is built (no
  ``RecursionError``);
- every failure — not UTF-8, not YAML, an integer longer than Python's int-string limit, any other
  exception of the loader — is one :class:`YamlFileError` line naming the file (and the line where
  YAML gives one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from specwatch.common.files import NotARegularFile, read_regular_file

#: The largest file read by default, in bytes.
DEFAULT_MAX_BYTES = 1 << 20
#: The deepest nesting of mappings and lists accepted (a cost profile nests 4 deep).
MAX_DEPTH = 32

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlFileError(ValueError):
    """A YAML file that cannot be read; the message is one line naming the file and what is wrong."""


def _where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return f" (line {mark.line + 1})" if mark is not None else ""


def _read_regular(p: Path, max_bytes: int, what: str) -> bytes:
    """:func:`specwatch.common.files.read_regular_file` with its refusals as :class:`YamlFileError`."""
    try:
        return read_regular_file(p, max_bytes, what)
    except NotARegularFile as exc:
        raise YamlFileError(str(exc)) from None
    except FileNotFoundError:
        raise YamlFileError(f"{p}: no such {what}") from None
    except OSError as exc:
        raise YamlFileError(f"{p}: cannot read the {what}: {exc.strerror or exc}") from None


def _check_events(text: str, p: Path, what: str) -> None:
    """Refuse aliases and nesting deeper than :data:`MAX_DEPTH`, from the event stream (nothing built)."""
    depth = 0
    for ev in yaml.parse(text, Loader=_Loader):
        if isinstance(ev, yaml.AliasEvent):
            line = ev.start_mark.line + 1 if ev.start_mark is not None else "?"
            raise YamlFileError(f"{p}: the {what} uses a YAML alias (*{ev.anchor}, line {line}): "
                                "aliases are not accepted (write the value out)")
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                line = ev.start_mark.line + 1 if ev.start_mark is not None else "?"
                raise YamlFileError(f"{p}: the {what} nests deeper than {MAX_DEPTH} levels (line {line})")
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def load_yaml_file(path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES, what: str = "cost profile") -> Any:
    """The parsed YAML document of ``path`` (``yaml.safe_load`` semantics: plain data only).

    ``max_bytes``: the largest file accepted (bytes); ``what`` names the file's role in messages.
    Raises :class:`YamlFileError` (one line naming the file) when it is missing, not a regular
    file, larger than ``max_bytes``, not UTF-8, not YAML, uses an alias, nests deeper than
    :data:`MAX_DEPTH`, or the loader fails in any other way."""
    p = Path(path)
    data = _read_regular(p, max_bytes, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlFileError(f"{p}: the {what} is not UTF-8 text (byte {exc.start})") from None
    try:
        _check_events(text, p, what)
        return yaml.load(text, Loader=_Loader)  # a safe loader (CSafeLoader/SafeLoader)
    except YamlFileError:
        raise
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise YamlFileError(f"{p}: not valid YAML{_where(exc)}: {problem}") from None
    except RecursionError:
        raise YamlFileError(f"{p}: the {what} nests too deeply") from None
    except ValueError as exc:  # e.g. an integer longer than Python's int-string limit
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise YamlFileError(f"{p}: a value of the {what} cannot be read: {first}") from None
    except Exception as exc:  # any other loader failure is one line too
        raise YamlFileError(f"{p}: the {what} cannot be read: {type(exc).__name__}: {exc}"[:300]) from None
