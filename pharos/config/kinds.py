"""What every config field shares: its ``Setting`` (the value's ``Kind``, its place in the file,
live or restart, a line of documentation, an example) and the ``Parser`` that walks settings.

A config dataclass's fields are the one description of the file: ``Parser.section`` reads YAML
into the dataclass by its settings, collecting every error with its path (an unknown field is
an error, ``null`` means the same as leaving a field out unless the setting says otherwise),
and ``pharos.config.describe`` writes the JSON Schema, ``GET /admin/config``'s document and the
configuration reference from the same settings.

Why hand-written: msgspec stops at the first error; pydantic's import costs a fifth of
Pharos's memory budget; cattrs reports in its own words, and the rules that take most of this
package (durations, ``null`` turning a guard off, strports, per-kind checks, the messages)
would be hooks either way: a new dependency for no less code.
"""

# mypy: disable-error-code="func-returns-value"
# (a reader returns ``p.expected(...)``: the error reported, ``None`` read)
from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import MISSING, dataclass, field
from typing import Any, Final, TypeGuard

#: A setting's ``null``: an explicit ``null`` means the field's default (the usual case).
DEFAULT: Final = "<default>"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_UNITS: Final = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0,
}
_DURATION_PATTERN: Final = (r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)"
                            r"(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))*$")
DURATION_WHAT: Final = "a duration such as 5s, 10m or 1h30m, or a number of seconds"


class ConfigError(Exception):
    """A config file that can't be used; ``errors`` holds every problem found, not just one."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration (``5s``, ``10m``, ``1h30m``, ``250ms``); ``ValueError``
    for anything else, including a negative duration."""
    if text == "0":
        return 0.0
    total, pos = 0.0, 0
    while pos < len(text):
        part = _DURATION_PART.match(text, pos)
        if part is None:
            break
        total += float(part.group(1)) * _DURATION_UNITS[part.group(2)]
        pos = part.end()
    if pos == 0 or pos != len(text):
        raise ValueError(f"not a duration: {text!r}")
    return total


def show(value: object) -> str:
    """A value as an error message shows it: YAML spellings, not Python's."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return str(value)  # a YAML date or timestamp, as written


def is_int(value: object) -> TypeGuard[int]:
    """YAML's true is a Python int; for config it is not a number."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    return is_int(value) or (isinstance(value, float) and math.isfinite(value))


def at(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class Kind:
    """A field's value: how it is read (``None`` when bad, reported), written as JSON, described
    in the schema and named (``what``). ``blank`` stands in for a missing or bad required
    value, so the object's other fields are still checked."""

    what: str
    blank: object = None

    def parse(self, p: Parser, raw: object, path: str) -> Any:
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        return {}

    def dump(self, value: Any) -> Any:
        return list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True)
class Int(Kind):
    low: int = 1
    high: int | None = None
    label: str = ""
    blank: object = 0

    @property
    def what(self) -> str:  # type: ignore[override]
        return self.label or ("a positive integer" if self.low == 1 else "a non-negative integer")

    def parse(self, p: Parser, raw: object, path: str) -> int | None:
        if is_int(raw) and raw >= self.low and (self.high is None or raw <= self.high):
            return raw
        return p.expected(path, self.what, raw)

    def schema(self) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.low,
                **({} if self.high is None else {"maximum": self.high})}


@dataclass(frozen=True)
class Number(Kind):
    what: str
    low: float | None = None
    high: float | None = None
    above: float | None = None  # an exclusive lower bound
    blank: object = 0.0

    def parse(self, p: Parser, raw: object, path: str) -> float | None:
        if (is_number(raw) and (self.low is None or raw >= self.low)
                and (self.above is None or raw > self.above)
                and (self.high is None or raw <= self.high)):
            return float(raw)
        return p.expected(path, self.what, raw)

    def schema(self) -> dict[str, Any]:
        bounds = {"minimum": self.low, "maximum": self.high, "exclusiveMinimum": self.above}
        return {"type": "number", **{k: v for k, v in bounds.items() if v is not None}}


@dataclass(frozen=True)
class Duration(Kind):
    """Seconds: a number or a Go-style duration; ``positive``: above 0 (a zero time limit
    would refuse everything)."""

    positive: bool = False
    what: str = "a duration"

    def parse(self, p: Parser, raw: object, path: str) -> float | None:
        value = None
        if is_number(raw) and raw >= 0:
            value = float(raw)
        elif isinstance(raw, str):
            with contextlib.suppress(ValueError):
                value = parse_duration(raw)
        if value is None:
            return p.expected(path, DURATION_WHAT, raw)
        if self.positive and value <= 0:
            return p.expected(path, "a duration above 0", raw)
        return value

    def schema(self) -> dict[str, Any]:
        return {"description": DURATION_WHAT,
                "anyOf": [{"type": "number", "minimum": 0},
                          {"type": "string", "pattern": _DURATION_PATTERN}]}


@dataclass(frozen=True)
class Text(Kind):
    """A non-empty string; ``check``: a further rule, ``bad`` its expectation."""

    what: str = "a non-empty string"
    check: Callable[[str], object] | None = None
    bad: str = ""
    pattern: str | None = None  # the JSON Schema's spelling of ``check``, where it has one
    blank: object = ""

    def parse(self, p: Parser, raw: object, path: str) -> str | None:
        if not isinstance(raw, str) or not raw:
            return p.expected(path, self.what, raw)
        if self.check is not None and not self.check(raw):
            return p.expected(path, self.bad or self.what, raw)
        return raw

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "minLength": 1,
                **({} if self.pattern is None else {"pattern": self.pattern})}


@dataclass(frozen=True)
class Bool(Kind):
    what: str = "true or false"

    def parse(self, p: Parser, raw: object, path: str) -> bool | None:
        return raw if isinstance(raw, bool) else p.expected(path, self.what, raw)

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


@dataclass(frozen=True)
class Choice(Kind):
    values: Sequence[str]

    @property
    def what(self) -> str:  # type: ignore[override]
        return "one of " + ", ".join(self.values)

    def parse(self, p: Parser, raw: object, path: str) -> str | None:
        return raw if isinstance(raw, str) and raw in self.values else p.expected(
            path, self.what, raw)

    def schema(self) -> dict[str, Any]:
        return {"enum": list(self.values)}


@dataclass(frozen=True)
class Items(Kind):
    """A list of ``item``; ``check`` sees the good items with their indexes (duplicates);
    ``min_items``: an empty list is refused."""

    item: Kind
    check: Callable[[Parser, list[tuple[int, Any]], str], None] | None = None
    min_items: int = 0

    @property
    def what(self) -> str:  # type: ignore[override]
        return f"a list, each item {self.item.what}"

    def parse(self, p: Parser, raw: object, path: str) -> tuple[Any, ...]:
        items = p.items(raw, path)
        if isinstance(raw, list) and len(raw) < self.min_items:
            p.expected(path, f"a non-empty list of {self.item.what}", raw)
        good = [(i, v) for i, item in enumerate(items)
                if (v := self.item.parse(p, item, f"{path}[{i}]")) is not None]
        if self.check is not None:
            self.check(p, good, path)
        return tuple(v for _, v in good)

    def schema(self) -> dict[str, Any]:
        return {"type": "array", "items": self.item.schema(),
                **({"minItems": self.min_items} if self.min_items else {})}

    def dump(self, value: Any) -> Any:
        if not value and self.min_items:
            return None  # left out: an empty list is refused
        return [self.item.dump(v) for v in value]


@dataclass(frozen=True)
class Custom(Kind):
    """A value with a rule of its own: its reader, schema and writer given as functions."""

    what: str
    read: Callable[[Parser, object, str], Any]
    json_schema: dict[str, Any] = field(default_factory=dict)
    write: Callable[[Any], Any] | None = None
    #: The config dataclasses inside it, as (name suffix, class), for the reference.
    parts: tuple[tuple[str, type], ...] = ()

    def parse(self, p: Parser, raw: object, path: str) -> Any:
        return self.read(p, raw, path)

    def schema(self) -> dict[str, Any]:
        return self.json_schema

    def dump(self, value: Any) -> Any:
        return super().dump(value) if self.write is None else self.write(value)


@dataclass(frozen=True)
class Section(Kind):
    """A nested mapping read into a config dataclass; ``check`` runs the rules between its
    fields (on the raw mapping and the values read), reporting through the parser."""

    cls: type
    check: Callable[[Parser, dict[str, Any], dict[str, Any], str], None] | None = None
    what: str = "a mapping (below)"

    def parse(self, p: Parser, raw: object, path: str) -> Any:
        return p.section(self, raw, path)

    def schema(self) -> dict[str, Any]:
        return section_schema(self.cls)

    def dump(self, value: Any) -> Any:
        return None if value is None else section_document(value)


@dataclass(frozen=True)
class Setting:
    """One field's description for the parser, schema, admin document and reference.
    ``file``: its name in the file (``a.b``: ``b`` in the mapping ``a``; empty: not in the
    file); ``null``: what an explicit ``null`` means (``DEFAULT``: the default)."""

    kind: Kind
    doc: str
    file: str
    live: bool
    null: object
    example: object
    required: bool
    default: object


def setting(kind: Kind, doc: str, *, default: object = MISSING, file: str | None = None,
            live: bool = False, null: object = DEFAULT, example: object = None) -> Any:
    """A dataclass field described by its ``Setting`` (no ``default``: required; a default
    that is a function: made afresh by it)."""
    meta = {"setting": (kind, doc, file, live, null, example)}
    if default is MISSING:
        return field(metadata=meta)
    if callable(default):
        return field(default_factory=default, hash=False, metadata=meta)
    return field(default=default, metadata=meta)


_SETTINGS: dict[type, tuple[tuple[str, Setting], ...]] = {}


def settings(cls: type) -> tuple[tuple[str, Setting], ...]:
    """The described fields of a config dataclass, in order, as (field name, setting)."""
    if cls not in _SETTINGS:
        out = []
        for f in dataclasses.fields(cls):
            if "setting" in f.metadata:
                kind, doc, file, live, null, example = f.metadata["setting"]
                default = f.default if f.default_factory is MISSING else f.default_factory()
                out.append((f.name, Setting(kind, doc, f.name if file is None else file, live,
                                            null, example, default is MISSING, default)))
        _SETTINGS[cls] = tuple(out)
    return _SETTINGS[cls]


def json_default(s: Setting) -> object:
    """A setting's default as the file writes it; ``None``: none to show (required, a
    section of its own, or off)."""
    if s.required or s.default is None or isinstance(s.kind, Section):
        return None
    return s.kind.dump(s.default)


def file_fields(cls: type) -> dict[str, list[tuple[str, Setting]]]:
    """A dataclass's settings grouped by their first name in the file."""
    out: dict[str, list[tuple[str, Setting]]] = {}
    for name, s in settings(cls):
        if s.file:
            out.setdefault(s.file.partition(".")[0], []).append((name, s))
    return out


def section_schema(cls: type) -> dict[str, Any]:
    """The JSON Schema of a config dataclass's mapping."""
    props: dict[str, Any] = {}
    for head, group in file_fields(cls).items():
        if "." in group[0][1].file:
            props[head] = _object({s.file.partition(".")[2]: field_schema(s) for _, s in group})
        else:
            props[head] = field_schema(group[0][1])
    doc = (cls.__doc__ or "").split("\n\n")[0]
    return _object(props, [s.file for _, s in settings(cls) if s.required and s.file],
                   " ".join(doc.split()))


def field_schema(s: Setting) -> dict[str, Any]:
    out = dict(s.kind.schema())
    if s.null is not DEFAULT:
        if "type" in out:
            out["type"] = [out["type"], "null"]
        else:
            out = {"oneOf": [out, {"type": "null"}]}
    extra = {"default": json_default(s), "examples": None if s.example is None else [s.example]}
    return {**out, "description": s.doc, **{k: v for k, v in extra.items() if v is not None}}


def _object(props: dict[str, Any], required: Collection[str] = (),
            description: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = list(required)
    if description:
        out["description"] = description
    return out


def section_document(obj: Any) -> dict[str, Any]:
    """A config dataclass in the file's shape (JSON types): what its section reads back."""
    out: dict[str, Any] = {}
    for name, s in settings(type(obj)):
        if not s.file:
            continue
        value = getattr(obj, name)
        value = None if value is None else s.kind.dump(value)
        head, _, tail = s.file.partition(".")
        if tail:
            out.setdefault(head, {})[tail] = value
        elif isinstance(out.get(head), list):  # two fields sharing one list (backends)
            out[head] = out[head] + value
        else:
            out[head] = value
    return out


class Parser:
    """Walks loaded YAML by the settings, collecting every error with its path."""

    def __init__(self, library_names: frozenset[str] | None) -> None:
        self.errors: list[str] = []
        self._library_names = library_names

    def library_names(self) -> frozenset[str]:
        """The probe library's names, imported on first need, so a config without own probes
        never loads the probe library."""
        if self._library_names is None:
            from pharos.engine.library import LIBRARY_PROBE_NAMES

            self._library_names = LIBRARY_PROBE_NAMES
        return self._library_names

    def error(self, path: str, message: str) -> None:
        self.errors.append(f"{path or 'top level'}: {message}")

    def expected(self, path: str, what: str, got: object) -> None:
        """Report a value that is not ``what``; returns ``None``, what a reader returns then."""
        self.error(path, f"expected {what}, got {show(got)}")

    def mapping(self, raw: object, path: str, known: Collection[str],
                required: Collection[str] = ()) -> dict[str, object] | None:
        """The fields of a mapping, reporting unknown and missing ones; ``None`` if it isn't a
        mapping at all."""
        if not isinstance(raw, dict):
            return self.expected(path, "a mapping", raw)
        for key in raw:
            if key not in known:
                self.error(path, f"unknown field {show(key)}")
        for name in required:
            if name not in raw:
                self.error(path, f"missing required field {name!r}")
        return {k: v for k, v in raw.items() if isinstance(k, str) and k in known}

    def items(self, raw: object, path: str) -> list[object]:
        """A list's items; null is an empty list."""
        if raw is None:
            return []
        if not isinstance(raw, list):
            self.expected(path, "a list", raw)
            return []
        return raw

    def section(self, kind: Section, raw: object, path: str) -> Any:
        """``raw`` read into ``kind.cls`` by its settings; ``None`` if it is not a mapping."""
        groups = file_fields(kind.cls)
        required = [s.file for _, s in settings(kind.cls) if s.required and s.file]
        m = self.mapping(raw, path, groups, required)
        if m is None:
            return None
        inner: dict[str, dict[str, object]] = {}
        for head, group in groups.items():
            if "." in group[0][1].file and m.get(head) is not None:
                names = [s.file.partition(".")[2] for _, s in group]
                inner[head] = self.mapping(m[head], at(path, head), names) or {}
        values: dict[str, Any] = {}
        for name, s in settings(kind.cls):
            if not s.file:
                continue
            head, _, tail = s.file.partition(".")
            given = inner.get(head, {}) if tail else m
            key = tail or head
            if key in given and (given[key] is not None or s.required):
                value = s.kind.parse(self, given[key], at(path, s.file))
                if value is not None:
                    values[name] = value
            elif key in given and s.null is not DEFAULT:
                values[name] = s.null
        if kind.check is not None:
            kind.check(self, m, values, path)
        blanks = {name: s.kind.blank for name, s in settings(kind.cls) if s.required}
        return kind.cls(**{**blanks, **values})
