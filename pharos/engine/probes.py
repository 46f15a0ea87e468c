"""Probes: one way to read one signal from one feed, and their generic constructors.

A probe's ``parse`` gets a whole HTTP body (or one log line) and returns a Snapshot in which
only its own signal is read. A missing field or metric is an unknown value; a present value
that cannot be its signal is a ``ProbeError``, never a guess.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families

from pharos.engine.signals import (
    COUNT_SIGNALS,
    LOAD_SIGNALS,
    LOG_SIGNALS,
    WHOLE_BACKEND,
    Residency,
    Signal,
    Snapshot,
    load_of,
)


class ProbeError(Exception):
    """A feed that answered with something that cannot be read as the probe's signal."""


@dataclass(frozen=True, slots=True, eq=False)
class Probe:
    """One way to read one signal: an HTTP path (``path``) or the backend's log (``path=None``).
    ``when`` guards a probe to the engine versions where its field means what it parses; with
    an unknown version a guarded probe does not run."""

    name: str
    signal: Signal
    parse: Callable[[bytes], Snapshot]
    path: str | None = None
    when: Callable[[str], bool] | None = None
    guard: str = ""
    own: bool = False

    @property
    def is_log(self) -> bool:
        """Whether the probe reads log lines instead of an HTTP path."""
        return self.path is None

    @property
    def feed(self) -> str:
        """Where the probe reads from, as doctor shows it."""
        return "log" if self.path is None else self.path


# --- values -----------------------------------------------------------------------------


def count_value(raw: float | int | str, what: str) -> int:
    """A request count: a non-negative integer, or a ``ProbeError``."""
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise ProbeError(f"{what}: {raw!r} is not a number") from None
    if math.isnan(v) or math.isinf(v) or v < 0 or v != int(v):
        raise ProbeError(f"{what}: {raw!r} is not a count")
    return int(v)


def ratio_value(raw: float, what: str) -> float:
    """A KV usage ratio in 0..1, or a ``ProbeError``."""
    if not 0.0 <= raw <= 1.0:
        raise ProbeError(f"{what}: {raw!r} is outside 0..1")
    return float(raw)


def load_snapshot(signal: Signal, values: Mapping[str, int | float]) -> Snapshot:
    """A snapshot holding one load signal per model (``""`` = the whole backend)."""
    return Snapshot(load={m: load_of({signal.value: v}) for m, v in values.items()})


# --- Prometheus text ----------------------------------------------------------------------


Sample = tuple[Mapping[str, str], float]


@lru_cache(maxsize=8)
def prom_samples(body: bytes) -> Mapping[str, tuple[Sample, ...]]:
    """Every sample of a Prometheus text page by sample name; parsed once per body."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ProbeError("metrics page is not UTF-8") from None
    out: dict[str, list[Sample]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.setdefault(s.name, []).append((s.labels, float(s.value)))
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise ProbeError(f"malformed metrics page: {e}") from None
    return {k: tuple(v) for k, v in out.items()}


@lru_cache(maxsize=16)
def prom_series(body: bytes, name: str) -> tuple[Sample, ...]:
    """The samples of the one metric ``name``: only its lines are parsed (a whole engine page
    through prometheus_client's pure-Python parser stalls the reactor for tens of ms)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ProbeError("metrics page is not UTF-8") from None
    # The parser names a counter's sample ``X_total`` whatever its line says, from the TYPE
    # line: both spellings are read, with their TYPE lines.
    names = (name, name[:-6]) if name.endswith("_total") else (name,)
    if names[-1] not in text:
        return ()
    types = tuple(f"# TYPE {n} " for n in names)
    lines = [line for line in text.split("\n")
             if (line.startswith(names) and line[len(_stem(line, names)):][:1] in ("{", " ", "\t"))
             or line.startswith(types)]
    if not lines:
        return ()
    out: list[Sample] = []
    try:
        for family in text_string_to_metric_families("\n".join(lines) + "\n"):
            out.extend((s.labels, float(s.value)) for s in family.samples if s.name == name)
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise ProbeError(f"malformed metrics page: {e}") from None
    return tuple(out)


def _stem(line: str, names: tuple[str, ...]) -> str:
    """The longest of ``names`` the line starts with."""
    return max((n for n in names if line.startswith(n)), key=len)


def prom(
    name: str,
    path: str,
    signal: Signal,
    metric: str,
    *,
    per_model: str | None = None,
    scale: Literal["ratio", "percent"] = "ratio",
    sum_labels: tuple[str, ...] = (),
    replica_labels: tuple[str, ...] = (),
    average: bool = False,
    when: Callable[[str], bool] | None = None,
    guard: str = "",
    own: bool = False,
) -> Probe:
    """A probe reading one metric of a Prometheus text page.

    ``per_model`` names the label that splits the metric per model (else the whole backend's).
    Series differing only in ``sum_labels`` add up (data-parallel ranks serve different
    requests), or are averaged with ``average`` (a usage ratio of equal pools); series
    differing only in ``replica_labels`` are copies (tensor-parallel ranks see the same batch)
    and must agree. Any other second series for one model is an error. NaN is unknown.
    """
    if signal not in LOAD_SIGNALS:
        raise ValueError(f"{name}: a Prometheus probe reads load signals only, not {signal.value}")
    if scale == "percent" and signal is not Signal.KV_USAGE:
        raise ValueError(f"{name}: scale applies to kv_usage only")
    folded = set(sum_labels) | set(replica_labels)

    def parse(body: bytes) -> Snapshot:
        samples = prom_series(body, metric)
        groups: dict[tuple[str, tuple[tuple[str, str], ...]], list[Sample]] = {}
        for labels, value in samples:
            model = WHOLE_BACKEND
            if per_model is not None:
                if per_model not in labels:
                    raise ProbeError(f"{metric}: a series without label {per_model!r}")
                model = labels[per_model]
            ident = tuple(
                sorted((k, v) for k, v in labels.items() if k != per_model and k not in folded)
            )
            groups.setdefault((model, ident), []).append((labels, value))
        values: dict[str, int | float] = {}
        for (model, _), series in groups.items():
            if model in values:
                raise ProbeError(f"{metric}: two series for model {model or '(backend)'!r}")
            v = _fold(metric, series, sum_labels, replica_labels, average)
            if v is None:
                continue
            if scale == "percent":
                v = v / 100.0
            if signal in COUNT_SIGNALS:
                values[model] = count_value(v, metric)
            else:
                values[model] = ratio_value(v, metric)
        return load_snapshot(signal, values)

    return Probe(name, signal, parse, path=path, when=when, guard=guard, own=own)


def _fold(
    metric: str,
    series: list[Sample],
    sum_labels: tuple[str, ...],
    replica_labels: tuple[str, ...],
    average: bool = False,
) -> float | None:
    """One value from the series of one model: ranks in ``sum_labels`` add up (or are
    averaged); of the replicas (``replica_labels``) the lowest rank speaks for all (SGLang:
    tp_rank 0)."""
    if len(series) > 1 and not sum_labels and not replica_labels:
        raise ProbeError(f"{metric}: two series for one model")
    by_sum: dict[tuple[str, ...], list[Sample]] = {}
    for labels, value in series:
        key = tuple(labels.get(k, "") for k in sum_labels)
        by_sum.setdefault(key, []).append((labels, value))
    total = 0.0
    for replicas in by_sum.values():
        _, value = min(
            replicas, key=lambda s: tuple(_rank(s[0].get(k, "")) for k in replica_labels)
        )
        if math.isnan(value):
            return None  # one rank unknown: the sum is unknown
        total += value
    return total / len(by_sum) if average else total


def _rank(label: str) -> tuple[int, str]:
    return (int(label), "") if label.isdigit() else (1 << 30, label)


# --- log lines ----------------------------------------------------------------------------


def log_value(signal: Signal, raw: str, what: str) -> object:
    """Convert a captured or fixed log value to its signal's type, or raise ``ProbeError``."""
    if signal is Signal.VERSION:
        if not raw:
            raise ProbeError(f"{what}: empty version")
        return raw
    if signal is Signal.RESIDENCY:
        try:
            state = Residency(raw)
        except ValueError:
            raise ProbeError(f"{what}: {raw!r} is not loaded, loading or cold") from None
        if state is Residency.UNKNOWN:
            raise ProbeError(f"{what}: unknown is not a residency")
        return state
    if signal in COUNT_SIGNALS:
        return count_value(raw, what)
    try:
        return ratio_value(float(raw), what)
    except ValueError:
        raise ProbeError(f"{what}: {raw!r} is not a number") from None


def log_line(
    name: str,
    signal: Signal,
    pattern: str | re.Pattern[str],
    value: str | None = None,
    *,
    own: bool = False,
) -> Probe:
    """A probe reading one regular expression over log lines: the named group ``value`` (or
    a fixed ``value`` a matching line reports), keyed per model by a group ``model`` (a
    residency line must name its model)."""
    if signal not in LOG_SIGNALS:
        raise ValueError(f"{name}: log probes read {sorted(s.value for s in LOG_SIGNALS)}")
    rx = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern)
    has_group = "value" in rx.groupindex
    if has_group == (value is not None):
        raise ValueError(f"{name}: needs exactly one of a 'value' group or a fixed value")
    if signal is Signal.RESIDENCY and "model" not in rx.groupindex:
        raise ValueError(f"{name}: a residency line must name its model (group 'model')")
    if value is not None:
        try:
            log_value(signal, value, name)
        except ProbeError as e:
            raise ValueError(str(e)) from None

    def parse(line: bytes) -> Snapshot:
        m = rx.search(line.decode("utf-8", "replace"))
        if m is None:
            return Snapshot()
        raw = m.group("value") if has_group else value
        assert raw is not None
        v = log_value(signal, raw, name)
        model = m.group("model") if "model" in rx.groupindex else WHOLE_BACKEND
        if signal is Signal.VERSION:
            return Snapshot(version=str(v))
        if signal is Signal.RESIDENCY:
            assert isinstance(v, Residency)
            return Snapshot(residency={model: v})
        assert isinstance(v, int | float)
        return load_snapshot(signal, {model: v})

    return Probe(name, signal, parse, path=None, own=own)


# --- JSON ---------------------------------------------------------------------------------


def json_body(body: bytes) -> Any:
    """Decode a JSON body or raise ``ProbeError``."""
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ProbeError(f"not JSON: {e}") from None


def field(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``obj[key]`` checked for type; absent or null is ``None``, a wrong type an error."""
    if not isinstance(obj, dict):
        raise ProbeError(f"{where}: expected an object")
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ProbeError(f"{where}.{key}: expected {kind}, got a boolean")
    if not isinstance(v, kind):
        raise ProbeError(f"{where}.{key}: expected {kind}, got {type(v).__name__}")
    return v
