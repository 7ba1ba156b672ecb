"""The machinery of specwatch's typed result records (:mod:`specwatch.bench.records`,
:mod:`specwatch.choosek.records`): frozen dataclasses whose fields carry their JSON key and kind,
one generic reader and one generic writer.

A record field is declared with :func:`jfield` (its JSON key, its :class:`Kind`, and whether it
is required); :meth:`JsonRecord.read` checks a JSON object field by field and keeps every key it
does not know verbatim in ``extra``, together with the object's key order (``keys``), so that
``read(x).to_json() == x`` for every document a specwatch version wrote, old or new, and a
record built in code (``keys`` None) writes its fields in declaration order. A value of the
wrong kind raises :class:`RecordError`, whose message names the file (or document) and the
field, e.g. ``s.json is a damaged sweep result: cells[3]: 'k' is missing or not an integer``.

Field paths read like the documents: ``'configs'`` (top level), ``settings 'workloads'`` (a key
of an object), ``cells[0]: 'config'`` (a key of a list item), ``cells[0]: summary
'output_throughput'`` (a key of an object inside a list item).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from specwatch.common.files import NotARegularFile, read_regular_file

R = TypeVar("R", bound="JsonRecord")


class RecordError(ValueError):
    """A result document that does not have its record's shape (or cannot be read): the message
    names the file, or the document when there is no file, and the field."""


class _Bad(Exception):
    """Internal: what is wrong, relative to the document (turned into the record's error);
    ``field``: (path, key) when the value under that key is of the wrong kind."""

    def __init__(self, message: str, field: tuple[str, str] | None = None) -> None:
        super().__init__(message)
        self.field = field


def field_text(path: str, key: str) -> str:
    """How a key is named in messages: ``'k'``, ``settings 'workloads'``, ``cells[0]: 'config'``."""
    if not path:
        return f"'{key}'"
    return f"{path}{': ' if path.endswith(']') else ' '}'{key}'"


def child_path(path: str, key: str) -> str:
    """The path of the object or list under ``key``: ``settings``, ``cells[0]: summary``."""
    if not path:
        return key
    return f"{path}{': ' if path.endswith(']') else ' '}{key}"


# --------------------------------------------------------------------------------------------
# Kinds of values
# --------------------------------------------------------------------------------------------


class Kind:
    """How a JSON value becomes a field's value (:meth:`read`) and back (:meth:`write`).
    ``what``: the kind in messages ("a string", "a number")."""

    what = "a value"

    def read(self, v: Any, path: str, key: str) -> Any:
        return v

    def write(self, v: Any) -> Any:
        return v

    def bad(self, path: str, key: str, required: bool = False) -> _Bad:
        return _Bad(f"{field_text(path, key)} is {'missing or ' if required else ''}not {self.what}", (path, key))


class Str(Kind):
    what = "a string"

    def read(self, v, path, key):
        if not isinstance(v, str):
            raise self.bad(path, key)
        return v


class Bool(Kind):
    what = "true or false"

    def read(self, v, path, key):
        if not isinstance(v, bool):
            raise self.bad(path, key)
        return v


class Int(Kind):
    """An integer (not a bool), within ``lo`` … ``hi`` when given."""

    what = "an integer"

    def __init__(self, lo: int | None = None, hi: int | None = None) -> None:
        self.lo, self.hi = lo, hi

    def read(self, v, path, key):
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.bad(path, key)
        if (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi):
            raise _Bad(f"{field_text(path, key)} {v} is out of range ({self.lo} to {self.hi})")
        return v


class Num(Kind):
    """A finite number (int or float as written: the type survives a round trip)."""

    what = "a number"

    def read(self, v, path, key):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.bad(path, key)
        if isinstance(v, float) and not math.isfinite(v):
            raise _Bad(f"{field_text(path, key)} is not a finite number")
        return v


def percent_to_fraction(pct: float) -> float:
    """The fraction r (0–1) that a file's percentage ``pct`` was written from (``r * 100``): pct /
    100, moved by a few units in the last place when needed so that ``r * 100 == pct`` again (a
    round trip through a record rewrites the same bytes)."""
    r = pct / 100.0
    if r * 100.0 == pct:
        return r
    for direction in (math.inf, -math.inf):
        x = r
        for _ in range(8):
            x = math.nextafter(x, direction)
            if x * 100.0 == pct:
                return x
    return r


class Percent(Num):
    """A rate the file stores in percent (vLLM's ``spec_decode_acceptance_rate``): 0–1 inside."""

    def read(self, v, path, key):
        return percent_to_fraction(float(super().read(v, path, key)))

    def write(self, v):
        return v * 100.0


class Anything(Kind):
    """Any JSON value, kept verbatim (documents that belong to another module, e.g. the per-request
    outliers of :mod:`specwatch.bench.perrequest`, or the bench configuration)."""


class Obj(Kind):
    """A JSON object kept verbatim (a mapping)."""

    what = "an object"

    def read(self, v, path, key):
        if not isinstance(v, Mapping):
            raise self.bad(path, key)
        return v


class ListOf(Kind):
    """A JSON list of one kind (a tuple inside)."""

    what = "a list"

    def __init__(self, item: Kind, nullable_items: bool = False) -> None:
        self.item, self.nullable_items = item, nullable_items

    def read(self, v, path, key):
        if not isinstance(v, list):
            raise self.bad(path, key)
        lp = child_path(path, key)
        out = []
        for i, x in enumerate(v):
            if x is None and self.nullable_items:
                out.append(None)
            elif isinstance(self.item, Rec):
                out.append(self.item.read_item(x, f"{lp}[{i}]"))
            else:
                try:
                    out.append(self.item.read(x, lp, str(i)))
                except _Bad:
                    raise _Bad(f"{lp}[{i}] is not {self.item.what}") from None
        return tuple(out)

    def write(self, v):
        return [None if x is None else self.item.write(x) for x in v]


class MapOf(Kind):
    """A JSON object whose values are of one kind, keyed by text (a dict inside, in the file's
    order); ``nullable_items``: a value may be null (None inside)."""

    what = "an object"

    def __init__(self, item: Kind, nullable_items: bool = False) -> None:
        self.item, self.nullable_items = item, nullable_items

    def read(self, v, path, key):
        if not isinstance(v, Mapping):
            raise self.bad(path, key)
        mp = child_path(path, key)
        out = {}
        for k, x in v.items():
            if x is None and self.nullable_items:
                out[k] = None
            elif isinstance(self.item, Rec):
                out[k] = self.item.read_item(x, f"{mp}[{k!r}]")
            else:
                out[k] = self.item.read(x, mp, str(k))
        return out

    def write(self, v):
        return {k: None if x is None else self.item.write(x) for k, x in v.items()}


class Rec(Kind):
    """A nested record (:class:`JsonRecord` subclass)."""

    what = "an object"

    def __init__(self, cls: type[JsonRecord]) -> None:
        self.cls = cls

    def read(self, v, path, key):
        if not isinstance(v, Mapping):
            raise self.bad(path, key)
        return self.cls.read(v, child_path(path, key))

    def read_item(self, v, path):
        if not isinstance(v, Mapping):
            raise _Bad(f"{path} is not an object")
        return self.cls.read(v, path)

    def write(self, v):
        return v.to_json()


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


def jfield(key: str, kind: Kind, *, required: bool = False, nullable: bool = True, omit_none: bool = False,
           default: Any = None, default_factory: Any = None) -> Any:
    """A record field stored under JSON ``key``. ``required``: the key must be there;
    ``nullable``: null is allowed (the field is None); ``omit_none``: a record built in code
    leaves the key out while the field is None (optional keys such as a config's ``drafter``)."""
    meta = {"key": key, "kind": kind, "required": required, "nullable": nullable, "omit_none": omit_none}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    if required and default is None and not nullable:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _default_of(f: dataclasses.Field) -> Any:
    """The value a field has when its key is absent: its ``default``, or a fresh value of its
    ``default_factory`` (an empty ``servers`` mapping), else None."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def record_field(**kw: Any) -> Any:
    """A bookkeeping field of :class:`JsonRecord` (``extra``, ``keys``): not compared, not shown."""
    return dataclasses.field(**kw, compare=False, repr=False)


@dataclasses.dataclass(frozen=True, kw_only=True)
class JsonRecord:
    """Base of the result records: frozen ``kw_only`` dataclasses whose :func:`jfield` fields are
    read and written generically. The base owns the two bookkeeping fields every record has:
    ``extra`` (keys it does not know, verbatim) and ``keys`` (the JSON key order it was read with;
    None for a record built in code). A record is declared
    ``@dataclass(frozen=True, kw_only=True) class X(JsonRecord)`` with its :func:`jfield` fields only."""

    extra: Mapping[str, Any] = record_field(default_factory=dict)
    keys: tuple[str, ...] | None = record_field(default=None)

    #: The JSON key order of a record built in code (keys not named follow in declaration order):
    #: the order its writer has always used, where that differs from the declaration order.
    write_order: ClassVar[tuple[str, ...]] = ()

    _fields_cache: ClassVar[dict[type, tuple[tuple[str, Mapping[str, Any]], ...]]] = {}

    @classmethod
    def _jfields(cls) -> tuple[tuple[str, Mapping[str, Any]], ...]:
        got = JsonRecord._fields_cache.get(cls)
        if got is None:
            got = tuple((f.name, {**f.metadata, "default": _default_of(f)})
                        for f in dataclasses.fields(cls) if "key" in f.metadata)
            JsonRecord._fields_cache[cls] = got
        return got

    @classmethod
    def read(cls: type[R], data: Mapping[str, Any], path: str = "") -> R:
        """The record of JSON object ``data`` found at ``path`` (raises the internal _Bad; the
        top-level readers turn it into their RecordError)."""
        values: dict[str, Any] = {}
        known = set()
        for name, meta in cls._jfields():
            key, kind = meta["key"], meta["kind"]
            known.add(key)
            if key not in data:
                if meta["required"]:
                    raise kind.bad(path, key, required=True)
                continue
            v = data[key]
            if v is None:
                if not meta["nullable"]:
                    raise kind.bad(path, key, required=meta["required"])
                values[name] = None
                continue
            try:
                values[name] = kind.read(v, path, key)
            except _Bad as exc:
                if meta["required"] and exc.field == (path, key):  # say "missing or not …" as for a missing key
                    raise kind.bad(path, key, required=True) from None
                raise
        extra = {k: v for k, v in data.items() if k not in known}
        return cls(**values, extra=extra, keys=tuple(data))  # type: ignore[call-arg]

    @classmethod
    def json_of_fields(cls, **values: Any) -> dict[str, Any]:
        """The JSON keys and written values of just the fields ``values`` names (field names, as
        in Python), in declaration order: a part of a record's document (e.g. the spec-decode
        fields a batch and a cell share)."""
        out: dict[str, Any] = {}
        for name, meta in cls._jfields():
            if name in values:
                v = values[name]
                out[meta["key"]] = None if v is None else meta["kind"].write(v)
        unknown = set(values) - {name for name, _ in cls._jfields()}
        if unknown:
            raise TypeError(f"{cls.__name__} has no field {', '.join(sorted(unknown))}")
        return out

    def with_keys(self: R, *json_keys: str) -> R:
        """The record, with ``json_keys`` written even when their fields are unset (appended, in this
        order, to the keys it was read with; a record built in code writes every key anyway)."""
        if self.keys is None:
            return self
        return dataclasses.replace(self, keys=self.keys + tuple(k for k in json_keys if k not in self.keys))

    def to_json(self) -> dict[str, Any]:
        """The JSON object of the record: the keys it was read with, in their order (fields changed
        since then with their new values, fields set since then added: a field that is None or
        equal to its default or default_factory's value is not set), else (a record built in
        code) every field in :attr:`write_order`, then in declaration order (an ``omit_none`` one
        only when set), then ``extra``."""
        out: dict[str, Any] = {}
        vals: dict[str, Any] = {}
        omit: set[str] = set()
        unset: set[str] = set()
        for name, meta in self._jfields():
            v = getattr(self, name)
            vals[meta["key"]] = None if v is None else meta["kind"].write(v)
            if v is None and meta["omit_none"]:
                omit.add(meta["key"])
            if v is None or v == meta["default"]:
                unset.add(meta["key"])
        if self.keys is None:
            order = [k for k in self.write_order if k in vals] + [k for k in vals if k not in self.write_order]
            out = {k: vals[k] for k in order if k not in omit}
        else:
            for k in self.keys:
                if k in vals:
                    out[k] = vals[k]
                elif k in self.extra:
                    out[k] = self.extra[k]
            for k, v in vals.items():
                if k not in out and k not in unset:
                    out[k] = v
        for k, v in self.extra.items():
            out.setdefault(k, v)
        return out


#: The largest JSON result file read (a sweep of thousands of cells is a few MiB).
MAX_JSON_BYTES = 256 * 1024 * 1024


def read_json_file(path: str | Path, what: str, error: type[RecordError] = RecordError, *,
                   max_bytes: int = MAX_JSON_BYTES, shape_error: type[Exception] | None = None) -> Any:
    """The parsed JSON of ``path``; ``error`` (one line naming the file) when it cannot be read,
    is not UTF-8 or not JSON. ``what``: the document in messages ("sweep result"). Only a regular
    file of at most ``max_bytes`` is read (:func:`specwatch.common.files.read_regular_file`: a
    FIFO would block, ``/dev/zero`` never ends); otherwise ``shape_error`` (default ``error``)."""
    p = Path(path)
    text = ""
    try:
        text = read_regular_file(p, max_bytes, what).decode("utf-8")
        return json.loads(text)
    except NotARegularFile as exc:
        raise (shape_error or error)(str(exc)) from None
    except OSError as exc:
        raise error(f"cannot read {p}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{p} is not a specwatch {what} (not UTF-8 text: {exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise error(_not_json(p, text, what, exc)) from None
    except (ValueError, RecursionError) as exc:  # an integer of > 4300 digits, nesting too deep
        raise error(f"{p} is not a usable {what}: {type(exc).__name__}: {exc}") from None


#: The first key of a cost profile (YAML, :mod:`specwatch.specdecode.costprofile`).
_COST_PROFILE_KEY = re.compile(r"^specwatch_cost_profile\s*:", re.M)


def _not_json(p: Path, text: str, what: str, exc: json.JSONDecodeError) -> str:
    """The one line for a file that does not parse as JSON, saying why where it can: empty, cut
    short (the text ends where the JSON still expected more: a partial copy), a cost profile (the
    only YAML specwatch writes); else the parser's own words with the position."""
    if not text.strip():
        return f"{p} is not valid JSON: the file is empty ({len(text.encode())} bytes), not a specwatch {what}"
    if _COST_PROFILE_KEY.search(text[:65536]):
        return f"{p} is not valid JSON: it is a specwatch cost profile (YAML), not a {what}"
    if (exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string")) and text.lstrip()[:1] in "{[":
        return (f"{p} is not valid JSON: it is cut short (it ends at byte {len(text.encode())}, inside the document: "
                f"a partial copy?), not a usable {what}")
    return f"{p} is not valid JSON: {exc}"


def read_document(cls: type[R], data: Any, where: str | None, what: str,
                  error: type[RecordError] = RecordError) -> R:
    """``cls.read(data)`` for a whole document: ``error`` "<where> is a damaged <what>: <field
    problem>" (or "damaged <what>: …" without ``where``) when a field is of the wrong kind."""
    prefix = f"{where} is a damaged {what}" if where else f"damaged {what}"
    if not isinstance(data, Mapping):
        raise error(f"{prefix}: not a JSON object")
    try:
        return cls.read(data)
    except _Bad as exc:
        raise error(f"{prefix}: {exc}") from None


def tuple_of(values: Sequence[Any] | None) -> tuple[Any, ...]:
    return () if values is None else tuple(values)


__all__ = ["Anything", "Bool", "Int", "JsonRecord", "Kind", "ListOf", "MapOf", "Num", "Obj", "Percent", "Rec", "RecordError", "Str",
           "child_path", "field_text", "jfield", "percent_to_fraction", "read_document", "read_json_file", "record_field"]
