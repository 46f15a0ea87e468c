"""The fixed vocabulary of engine signals and the snapshot types that hold them.

Every signal value is ``None`` when unknown: a probe that does not find its field or metric
reports nothing, and nothing downstream may read ``None`` as 0.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


class Signal(enum.Enum):
    """One piece of engine state Pharos routes on; each maps to one Snapshot field."""

    VERSION = "version"
    MODELS = "models"
    RESIDENCY = "residency"
    VRAM_BYTES = "vram_bytes"
    SIZE_BYTES = "size_bytes"
    RUNNING = "running"
    WAITING = "waiting"
    CAPACITY = "capacity"
    KV_USAGE = "kv_usage"
    KV_POOL_TOKENS = "kv_pool_tokens"


#: Signals read every fast (1 s) round; the rest only on full rounds.
LOAD_SIGNALS: frozenset[Signal] = frozenset(
    {Signal.RUNNING, Signal.WAITING, Signal.CAPACITY, Signal.KV_USAGE, Signal.KV_POOL_TOKENS}
)
#: Signals that are integer counts (a fractional or negative value is an error).
COUNT_SIGNALS: frozenset[Signal] = frozenset(
    {Signal.RUNNING, Signal.WAITING, Signal.CAPACITY, Signal.KV_POOL_TOKENS})
#: The load signals in the order of ``Load``'s fields.
LOAD_ORDER: tuple[Signal, ...] = (Signal.RUNNING, Signal.WAITING, Signal.CAPACITY, Signal.KV_USAGE,
                                   Signal.KV_POOL_TOKENS)
#: Signals a log probe may read (LogLine).
LOG_SIGNALS: frozenset[Signal] = frozenset(
    {Signal.VERSION, Signal.RESIDENCY} | LOAD_SIGNALS
)
#: Signals re-read on every fast round (capacity changes only with a restart).
FAST_SIGNALS: frozenset[Signal] = frozenset({Signal.RUNNING, Signal.WAITING, Signal.KV_USAGE})


class Residency(enum.Enum):
    """Where a model is: in memory, on its way there, or not loaded."""

    UNKNOWN = "unknown"
    LOADED = "loaded"
    LOADING = "loading"
    COLD = "cold"


#: Key of the whole-backend entry in ``Snapshot.load``.
WHOLE_BACKEND = ""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What a snapshot says about one model, derived from its per-signal fields."""

    state: Residency = Residency.UNKNOWN
    vram_bytes: int | None = None
    size_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Load:
    """Occupancy of one model, or of the whole backend under key ``""``."""

    running: int | None = None
    waiting: int | None = None
    capacity: int | None = None
    kv_usage: float | None = None
    #: Tokens the KV pool holds (vLLM: num_gpu_blocks x block_size); with kv_usage, the room.
    kv_pool_tokens: int | None = None

    def get(self, signal: Signal) -> int | float | None:
        """The value of one load signal."""
        value: int | float | None = getattr(self, signal.value)
        return value


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Signals from one scrape round (or one log line) of one backend, ``None`` when unknown.
    A known empty value is a value: ``models == ()`` serves nothing, ``residency == {}`` has
    every model cold. ``sources`` names, per signal, the probe that filled it."""

    version: str | None = None
    models: tuple[str, ...] | None = None
    residency: Mapping[str, Residency] | None = None
    vram_bytes: Mapping[str, int] | None = None
    size_bytes: Mapping[str, int] | None = None
    load: Mapping[str, Load] = field(default_factory=dict)
    sources: Mapping[Signal, str] = field(default_factory=dict)
    #: ``model_info`` and ``load_for`` answers, kept: a snapshot never changes, and every
    #: decision asks both of every candidate.
    _infos: dict[str, ModelInfo] = field(default_factory=dict, init=False, repr=False,
                                         compare=False)
    _loads: dict[str, Load] = field(default_factory=dict, init=False, repr=False, compare=False)

    def known(self, signal: Signal) -> bool:
        """Whether this snapshot holds a known value for ``signal``."""
        if signal in LOAD_SIGNALS:
            return any(load.get(signal) is not None for load in self.load.values())
        return getattr(self, signal.value) is not None

    def value(self, signal: Signal) -> object:
        """The raw value of ``signal`` (a mapping per model for per-model signals)."""
        if signal in LOAD_SIGNALS:
            return {
                model: v
                for model, load in self.load.items()
                if (v := load.get(signal)) is not None
            } or None
        return getattr(self, signal.value)

    def model_info(self, model: str) -> ModelInfo:
        """Residency and sizes of one model, as far as this snapshot knows them."""
        info = self._infos.get(model)
        if info is None:
            info = self._infos[model] = self._model_info(model)
        return info

    def _model_info(self, model: str) -> ModelInfo:
        if self.residency is None:
            state = Residency.UNKNOWN
        else:
            state = self.residency.get(model, Residency.COLD)
        vram = None if self.vram_bytes is None else self.vram_bytes.get(model)
        if vram is None and self.vram_bytes is not None and state is Residency.COLD:
            vram = 0
        size = None if self.size_bytes is None else self.size_bytes.get(model)
        return ModelInfo(state=state, vram_bytes=vram, size_bytes=size)

    def load_for(self, model: str) -> Load:
        """The load of one model: per signal its own entry's, else the whole backend's."""
        load = self._loads.get(model)
        if load is None:
            load = self._loads[model] = self._load_for(model)
        return load

    def _load_for(self, model: str) -> Load:
        """Field by field rather than through ``load_of`` (a vLLM snapshot has both entries:
        cache_config_info is the whole backend's); both are already converted ``Load``s."""
        own = self.load.get(model)
        whole = self.load.get(WHOLE_BACKEND)
        if own is None:
            return whole or Load()
        if whole is None:
            return own
        return Load(
            running=own.running if own.running is not None else whole.running,
            waiting=own.waiting if own.waiting is not None else whole.waiting,
            capacity=own.capacity if own.capacity is not None else whole.capacity,
            kv_usage=own.kv_usage if own.kv_usage is not None else whole.kv_usage,
            kv_pool_tokens=(own.kv_pool_tokens if own.kv_pool_tokens is not None
                            else whole.kv_pool_tokens),
        )


def merge(parts: Sequence[tuple[str, Signal, Snapshot]]) -> Snapshot:
    """Merge probe results in priority order: per signal, the first known value wins.
    ``parts``: ``(probe name, its signal, its result)``; only that signal is read."""
    fields: dict[str, object] = {}
    sources: dict[Signal, str] = {}
    loads: dict[str, dict[str, int | float]] = {}
    for name, signal, snap in parts:
        if signal in sources or not snap.known(signal):
            continue
        sources[signal] = name
        if signal in LOAD_SIGNALS:
            for model, load in snap.load.items():
                v = load.get(signal)
                if v is not None:
                    loads.setdefault(model, {})[signal.value] = v
        else:
            fields[signal.value] = getattr(snap, signal.value)
    merged = {model: load_of(vals) for model, vals in loads.items()}
    return Snapshot(load=merged, sources=sources, **fields)  # type: ignore[arg-type]


def load_of(values: Mapping[str, int | float]) -> Load:
    """A ``Load`` from signal-name keyed values; counts are ints, KV usage a float."""
    def count(name: str) -> int | None:
        v = values.get(name)
        return None if v is None else int(v)

    kv = values.get(Signal.KV_USAGE.value)
    return Load(
        running=count(Signal.RUNNING.value),
        waiting=count(Signal.WAITING.value),
        capacity=count(Signal.CAPACITY.value),
        kv_usage=None if kv is None else float(kv),
        kv_pool_tokens=count(Signal.KV_POOL_TOKENS.value),
    )
