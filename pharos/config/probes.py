"""A backend's own probes and log feed: the config classes and their rules."""

# mypy: disable-error-code="func-returns-value"
# (a reader returns ``p.expected(...)``: the error reported, ``None`` read)
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias, get_args

from pharos.config.kinds import (
    Choice,
    Custom,
    Int,
    Items,
    Number,
    Parser,
    Section,
    Text,
    at,
    setting,
)
from pharos.engine.signals import COUNT_SIGNALS, LOAD_SIGNALS, LOG_SIGNALS, Residency, Signal

Scale: TypeAlias = Literal["ratio", "percent"]
LogScheme: TypeAlias = Literal["docker", "file"]
#: A log probe's fixed value, typed for its signal (``Residency``, counts, kv_usage, version).
FixedValue: TypeAlias = Residency | int | float | str

SCALES: Final[tuple[Scale, ...]] = get_args(Scale)
DEFAULT_SCALE: Final[Scale] = "ratio"
#: Residency values a log line can report; ``unknown`` is what no line says.
_FIXED_RESIDENCIES: Final = (Residency.LOADED, Residency.LOADING, Residency.COLD)
_CONTAINER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_METRIC = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class PromSpec:
    """One metric from a Prometheus text endpoint, as the library's ``Prom`` constructor takes."""

    path: str = setting(Text(check=lambda s: s.startswith("/"), bad="a path starting with /",
                             pattern="^/"), "the endpoint's path", example="/metrics")
    metric: str = setting(Text(check=_METRIC.fullmatch, bad="a Prometheus metric name"),
                          "the metric's name", example="vllm:num_requests_running")
    per_model: str | None = setting(
        Text(check=_LABEL.fullmatch, bad="a Prometheus label name"),
        "the label naming each sample's model", default=None, example="model_name")
    scale: Scale = setting(Choice(SCALES), "kv_usage only: the metric's scale",
                           default=DEFAULT_SCALE)


def _compile(p: Parser, raw: object, path: str) -> re.Pattern[str] | None:
    if (source := Text().parse(p, raw, path)) is not None:
        try:
            return re.compile(source)
        except re.error as e:
            p.error(path, f"pattern does not compile: {e}")
    return None


@dataclass(frozen=True, slots=True)
class LogSpec:
    """A log-line pattern, compiled once here; ``value`` is the fixed value a matching line
    reports, or ``None`` when the named group ``value`` in ``match`` holds it."""

    match: re.Pattern[str] = setting(
        Custom("a regular expression", _compile, {"type": "string"}, lambda m: m.pattern),
        "a line's pattern: (?P<value>...) holds the value, (?P<model>...) the model",
        example=r"OLLAMA_NUM_PARALLEL:(?P<value>\d+)")
    value: FixedValue | None = setting(
        Custom("the signal's value", lambda p, raw, path: raw, {},  # read by _log: per signal
               lambda v: v.value if isinstance(v, Residency) else v),
        "the value a matching line reports, instead of a group", default=None)


@dataclass(frozen=True, slots=True)
class OwnProbe:
    """A probe the operator adds to one backend; it goes ahead of the recipe for its
    signal."""

    name: str
    signal: Signal
    spec: PromSpec | LogSpec


@dataclass(frozen=True, slots=True)
class LogFeed:
    """Where a static backend's engine log comes from: a Docker container or a local file."""

    scheme: LogScheme
    target: str  # the container name for docker, the absolute path for file


def read_log_feed(p: Parser, raw: object, path: str) -> LogFeed | None:
    if isinstance(raw, str):
        if raw.startswith("docker://") and _CONTAINER.fullmatch(raw[len("docker://") :]):
            return LogFeed("docker", raw[len("docker://") :])
        if raw.startswith("file:///"):
            return LogFeed("file", raw[len("file://") :])
    return p.expected(path, "docker://<container> or file:///<absolute path>", raw)


LOG_FEED: Final = Custom(
    "docker://<container> or file:///<absolute path>", read_log_feed,
    {"type": "string", "pattern": "^(docker://.+|file:///.*)$"},
    lambda f: f"docker://{f.target}" if f.scheme == "docker" else f"file://{f.target}")


def _probe(p: Parser, raw: object, path: str) -> OwnProbe | None:
    """One own probe, checked against the own-probe rules."""
    m = p.mapping(raw, path, ("name", "signal", "prom", "log"), required=("name", "signal"))
    if m is None:
        return None
    name = Text().parse(p, m["name"], at(path, "name")) if "name" in m else None
    if name is not None and name in p.library_names():
        p.error(at(path, "name"), f"{name!r} is already a library probe's name")
    signal = None
    if "signal" in m:
        value = Choice([s.value for s in Signal]).parse(p, m["signal"], at(path, "signal"))
        signal = None if value is None else Signal(value)
    prom, log = m.get("prom"), m.get("log")
    spec: PromSpec | LogSpec | None = None
    if prom is not None and log is not None:
        p.error(path, "expected exactly one of prom, log, got both")
    elif prom is not None:
        spec = _prom(p, prom, at(path, "prom"), signal)
    elif log is not None:
        spec = _log(p, log, at(path, "log"), signal)
    else:
        p.error(path, "missing required field: one of prom, log")
    if name is None or signal is None or spec is None:
        return None
    return OwnProbe(name=name, signal=signal, spec=spec)


def _prom(p: Parser, raw: object, path: str, signal: Signal | None) -> PromSpec | None:
    if signal is not None and signal not in LOAD_SIGNALS:
        loads = [s.value for s in Signal if s in LOAD_SIGNALS]
        p.error(path, f"a prom probe reads only {', '.join(loads)}, not {signal.value!r}")
    if (isinstance(raw, dict) and raw.get("scale") is not None and signal is not None
            and signal is not Signal.KV_USAGE):
        p.error(at(path, "scale"), f"applies only to kv_usage, not {signal.value!r}")
    spec: PromSpec | None = Section(PromSpec).parse(p, raw, path)
    return spec if spec is not None and spec.path and spec.metric else None


def _log(p: Parser, raw: object, path: str, signal: Signal | None) -> LogSpec | None:
    m = p.mapping(raw, path, ("match", "value"), required=("match",))
    if m is None:
        return None
    if signal is not None and signal not in LOG_SIGNALS:
        readable = [s.value for s in Signal if s in LOG_SIGNALS]
        p.error(path, f"a log probe reads only {', '.join(readable)}, not {signal.value!r}")
        signal = None  # no fixed value can be right for it
    pattern = _compile(p, m["match"], at(path, "match")) if "match" in m else None
    raw_value = m.get("value")
    value: FixedValue | None = None
    if raw_value is not None and signal is not None:
        value = _fixed_value(p, raw_value, at(path, "value"), signal)
    if pattern is None:
        return None
    has_group = "value" in pattern.groupindex
    if has_group and raw_value is not None:
        p.error(path, "expected a named group 'value' in match or a fixed value, got both")
    elif not has_group and raw_value is None:
        p.error(at(path, "match"),
                "needs a named group 'value', as in (?P<value>...), or a fixed value")
    if signal is Signal.RESIDENCY and "model" not in pattern.groupindex:
        # a residency value covers only the model the line names
        p.error(at(path, "match"),
                "a residency line must name its model: add a group (?P<model>...)")
    return LogSpec(match=pattern, value=value)


def _fixed_value(p: Parser, raw: object, path: str, signal: Signal) -> FixedValue | None:
    """A log probe's fixed value, valid for its signal (checked here, not per line)."""
    if signal is Signal.RESIDENCY:
        residency = Choice([r.value for r in _FIXED_RESIDENCIES]).parse(p, raw, path)
        return None if residency is None else Residency(residency)
    if signal in COUNT_SIGNALS:
        count: int | None = Int(low=0).parse(p, raw, path)
        return count
    if signal is Signal.KV_USAGE:
        usage: float | None = Number("a number from 0 to 1", low=0, high=1).parse(p, raw, path)
        return usage
    text: str | None = Text().parse(p, raw, path)
    return text


def _unique_names(p: Parser, probes: list[tuple[int, Any]], path: str) -> None:
    names: set[str] = set()
    for i, probe in probes:
        if probe.name in names:
            p.error(f"{path}[{i}].name", f"duplicate probe name {probe.name!r}")
        names.add(probe.name)


def _dump(probe: OwnProbe) -> dict[str, Any]:
    doc = Section(type(probe.spec)).dump(probe.spec)
    if isinstance(probe.spec, PromSpec) and probe.spec.scale == DEFAULT_SCALE:
        del doc["scale"]  # only kv_usage takes a scale at all
    return {"name": probe.name, "signal": probe.signal.value,
            "prom" if isinstance(probe.spec, PromSpec) else "log": doc}


def _schema() -> dict[str, Any]:
    signals = sorted(s.value for s in Signal if s in LOAD_SIGNALS or s in LOG_SIGNALS)
    return {"type": "object", "additionalProperties": False, "required": ["name", "signal"],
            "description": "an own probe: a name, its signal, and prom or log",
            "properties": {"name": {"type": "string", "minLength": 1},
                           "signal": {"enum": signals},
                           "prom": Section(PromSpec).schema(), "log": Section(LogSpec).schema()}}


PROBES: Final = Items(Custom("an own probe", _probe, _schema(), _dump,
                             ((".prom", PromSpec), (".log", LogSpec))), check=_unique_names)
