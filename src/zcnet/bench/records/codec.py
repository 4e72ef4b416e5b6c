"""Records to JSON and back: the one place where a record's fields get their JSON names and
where everything read back (a result file, a server's results) is checked.

A record is a dataclass; its annotations say what each field may hold (``int``, ``float``,
``str``, ``bool``, ``X | None``, ``int | str``, ``list[X]``, ``dict[str, X]``, another record,
or ``JSONValue`` for data that really is arbitrary) and ``field(metadata=...)`` adds what a type
cannot say (see :func:`meta`): the range of a quantity (``zcnet.quantities``), the allowed values,
a JSON name that is not an identifier, a nested record written flat into its parent, unknown keys
kept, None written as ``null``.

Writing leaves out fields that are None (a value not measured is absent, not 0) unless marked
``null``, and fields marked ``omit_default`` while they hold their default. Reading refuses
the first value of a wrong type or out of its range with a :class:`RecordError` naming its path
(``results[3].cpu.rx.usr``); keys a record does not know are ignored, so a newer writer's
additions do not stop an older reader.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import TypeVar

from zcnet import quantities
from zcnet.jsonvalue import JSONObject, JSONValue

R = TypeVar("R")


class RecordError(ValueError):
    """A value read back that its record cannot hold: where (``path``), what, and why."""

    def __init__(self, path: str, value: object, why: str) -> None:
        super().__init__(f"{path} = {_short(value)}: {why}")
        self.path, self.value, self.why = path, value, why


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclasses.dataclass(frozen=True)
class Meta:
    """What a field's type cannot say. ``q``: the quantity (zcnet.quantities) its numbers are;
    ``choices``: its allowed values; ``json``: its JSON name; ``flat``: a record written into
    the parent object; ``rest``: a ``dict`` field that keeps the keys no other field takes;
    ``null``: None is written as null; ``omit_default``: left out while it holds its default;
    ``keys``: what a dict's keys must be (a predicate and its wording)."""

    q: str | None = None
    choices: tuple[object, ...] | None = None
    json: str | None = None
    flat: bool = False
    rest: bool = False
    null: bool = False
    omit_default: bool = False
    keys: tuple[Callable[[str], bool], str] | None = None


_PLAIN = Meta()


def meta(*, q: str | None = None, choices: tuple[object, ...] | None = None,
         json: str | None = None, flat: bool = False, rest: bool = False, null: bool = False,
         omit_default: bool = False,
         keys: tuple[Callable[[str], bool], str] | None = None) -> dict[str, Meta]:
    """``field(metadata=meta(q="figure"))``: see :class:`Meta`."""
    return {"zcnet": Meta(q, choices, json, flat, rest, null, omit_default, keys)}


def _meta(f: dataclasses.Field[object]) -> Meta:
    m = f.metadata.get("zcnet")
    return m if isinstance(m, Meta) else _PLAIN


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str                # the attribute
    key: str                 # the JSON name
    tp: object               # the resolved annotation
    meta: Meta
    default: object          # dataclasses.MISSING when required
    factory: Callable[[], object] | None


_FIELDS: dict[type, tuple[_Field, ...]] = {}
_KEYS: dict[type, frozenset[str]] = {}


def _fields(cls: type) -> tuple[_Field, ...]:
    """A record's fields with their resolved types and metadata (worked out once per class)."""
    got = _FIELDS.get(cls)
    if got is None:
        hints = typing.get_type_hints(cls)
        got = _FIELDS[cls] = tuple(
            _Field(f.name, _meta(f).json or f.name, hints[f.name], _meta(f), f.default,
                   None if f.default_factory is dataclasses.MISSING else f.default_factory)
            for f in dataclasses.fields(cls))
    return got


def _keys(cls: type) -> frozenset[str]:
    """Every JSON key a record takes, those of its flat records included."""
    got = _KEYS.get(cls)
    if got is None:
        keys: set[str] = set()
        for f in _fields(cls):
            if f.meta.flat:
                keys |= _keys(_record_of(f.tp))
            elif not f.meta.rest:
                keys.add(f.key)
        got = _KEYS[cls] = frozenset(keys)
    return got


def _record_of(tp: object) -> type:
    """The record class of a (possibly optional) record annotation."""
    for t in (tp, *typing.get_args(tp)):
        if isinstance(t, type) and dataclasses.is_dataclass(t):
            return t
    raise TypeError(f"not a record type: {tp!r}")


# ---- writing -------------------------------------------------------------------------------------

def to_json(value: object) -> JSONValue:
    """A record (or a list/dict of them, or a plain value) as JSON data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _record_json(value)
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"{type(value).__name__} is not a record nor JSON data")


def _record_json(obj: object) -> JSONObject:
    out: JSONObject = {}
    for f in _fields(type(obj)):
        v = getattr(obj, f.name)
        if f.meta.flat:
            if v is not None:
                out.update(_record_json(v))
            continue
        if f.meta.rest:
            out.update({k: to_json(x) for k, x in v.items()})
            continue
        if v is None and not f.meta.null:
            continue
        if f.meta.omit_default and v == _default(f):
            continue
        out[f.key] = to_json(v)
    return out


def _default(f: _Field) -> object:
    return f.factory() if f.factory is not None else f.default


# ---- reading -------------------------------------------------------------------------------------

def parse(cls: type[R], data: object, path: str = "") -> R:
    """The record ``cls`` from JSON data; RecordError on the first value it cannot hold."""
    if not isinstance(data, dict):
        raise RecordError(path or "(top)", data, "must be an object")
    return _record(cls, data, path)


def parse_as(tp: object, data: object, path: str = "") -> object:
    """An annotation's value (``list[Rec]``, ``dict[str, Rec]`` ...) from JSON data."""
    return _value(tp, data, path, _PLAIN)


def _record(cls: type[R], data: Mapping[str, object], path: str) -> R:
    kwargs: dict[str, object] = {}
    for f in _fields(cls):
        if f.meta.flat:
            sub = _record_of(f.tp)
            present = any(k in data for k in _keys(sub))
            kwargs[f.name] = _record(sub, data, path) if present else None
            continue
        if f.meta.rest:
            known = _keys(cls)
            kwargs[f.name] = {k: v for k, v in data.items() if k not in known}
            continue
        where = f"{path}.{f.key}" if path else f.key
        if f.key not in data:
            if f.default is dataclasses.MISSING and f.factory is None:
                raise RecordError(where, None, "missing")
            continue  # the dataclass fills in the default
        kwargs[f.name] = _value(f.tp, data[f.key], where, f.meta)
    return cls(**kwargs)


_SCALARS: dict[type, str] = {int: "a whole number", float: "a number", str: "text",
                              bool: "true or false"}


def _value(tp: object, v: object, path: str, m: Meta) -> object:
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return _union(typing.get_args(tp), v, path, m)
    if origin is list:
        if not isinstance(v, list):
            raise RecordError(path, v, "must be a list")
        (item,) = typing.get_args(tp)
        return [_value(item, x, f"{path}[{i}]", m) for i, x in enumerate(v)]
    if origin is dict:
        if not isinstance(v, dict):
            raise RecordError(path, v, "must be an object")
        _, item = typing.get_args(tp)
        out = {}
        for k, x in v.items():
            if m.keys is not None and not m.keys[0](k):
                raise RecordError(path, v, f"keys must be {m.keys[1]}, not {k!r}")
            out[k] = _value(item, x, f"{path}.{k}", m)
        return out
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(v, dict):
            raise RecordError(path, v, "must be an object")
        return _record(tp, v, path)
    if isinstance(tp, type) and tp in _SCALARS:
        return _scalar(tp, v, path, m)
    raise TypeError(f"{path}: no reader for {tp!r}")


def _is_json(args: tuple[object, ...]) -> bool:
    """Whether a union is ``JSONValue``: every JSON type, lists and objects of itself."""
    kinds = {typing.get_origin(a) or a for a in args}
    return kinds == {type(None), bool, int, float, str, list, dict}


def _union(args: tuple[object, ...], v: object, path: str, m: Meta) -> object:
    if _is_json(args):
        return v  # arbitrary JSON, bounded in depth by whoever read it
    if v is None:
        if type(None) in args:
            return None
        raise RecordError(path, v, "must have a value")
    choices = [a for a in args if a is not type(None)]
    if len(choices) == 1:
        return _value(choices[0], v, path, m)
    errors = []
    for a in choices:
        try:
            return _value(a, v, path, m)
        except RecordError as e:
            errors.append(e)
    # The alternative that got furthest into the value says best what is wrong with it.
    raise max(errors, key=lambda e: len(e.path))


def _scalar(tp: type, v: object, path: str, m: Meta) -> object:
    # bool is an int in Python, never a number in a record.
    if tp is float and isinstance(v, (int, float)) and not isinstance(v, bool):
        try:
            v = float(v)
        except OverflowError:  # an integer literal of hundreds of digits
            raise RecordError(path, v, "must be a finite number") from None
        if not math.isfinite(v):
            raise RecordError(path, v, "must be a finite number")
    elif not (isinstance(v, tp) and (tp is bool or not isinstance(v, bool))):
        raise RecordError(path, v, f"must be {_SCALARS[tp]}")
    if m.q is not None and not isinstance(v, str) \
            and (why := quantities.problem(m.q, v)) is not None:
        raise RecordError(path, v, why)
    if m.choices is not None and v not in m.choices:
        raise RecordError(path, v, f"is not one of: {', '.join(map(str, m.choices))}")
    return v
