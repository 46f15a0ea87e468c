"""The behaviour of a simulated engine, behind one small interface.

The wire layer (``pharos.sim.double`` and the per-engine modules) only talks to an
``EngineModel``: it submits a ``GenRequest`` with a ``JobListener``, hears each token and the
end, cancels when the client leaves, and reads ``EngineStatus``. The model decides time,
capacity, memory and caching, so an engine's behaviour can change without touching how a
double speaks. Every number is a ``Knobs`` field whose default is an *assumed* value: the
doubles must not pretend to know more than that.

Time comes from an injected ``IReactorTime``; nothing here blocks, and ``hold()`` freezes the
model's clock (requests keep their slots, nothing progresses) until ``release()``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from twisted.internet.interfaces import IDelayedCall, IReactorTime

from pharos.sim.prompt import count_tokens

# --- the knobs -------------------------------------------------------------------------------

#: Assumed values, never measured.
DEFAULT_PREFILL_S = 0.0005
DEFAULT_DECODE_S = 0.030
DEFAULT_LOAD_S = 8.0
DEFAULT_HOST_MEMORY = 10 * 10**9
DEFAULT_CACHE_TOKENS = 32 * 1024
DEFAULT_SLOTS = 2
#: Assumed, as the related system's simulator defaults (8B model, 24 GB GPU).
DEFAULT_PREFILL_PAIR_S = 3.3e-9
DEFAULT_PREFILL_FIXED_S = 0.005
DEFAULT_DECODE_SEQ_S = 0.0001
#: Assumed: the cap on generated tokens when a request names none (or a larger one).
DEFAULT_MAX_OUTPUT_TOKENS = 64

#: Finish reasons, as every engine here spells them.
STOP = "stop"
LENGTH = "length"

#: Control requests (an Ollama chat or generate without messages or prompt).
LOAD = "load"
UNLOAD = "unload"


#: The ways the vLLM double can count its KV usage (``Knobs.kv_usage_counts``).
KV_USAGE_COUNTS = ("running", "fill")


@dataclass(frozen=True, slots=True)
class Knobs:
    """The numbers of the behaviour models. Defaults are assumed values.

    ``prefill_s``: seconds per uncached prompt token; ``decode_s`` per generated token;
    ``load_s`` to load a cold model. ``host_memory``: bytes the loaded models may take together.
    ``cache_tokens``: tokens the prefix cache (and the KV pool) holds, per model.
    ``keep_alive``: idle seconds before a model unloads by itself (``None``: never).
    """

    prefill_s: float = DEFAULT_PREFILL_S
    decode_s: float = DEFAULT_DECODE_S
    load_s: float = DEFAULT_LOAD_S
    host_memory: int = DEFAULT_HOST_MEMORY
    cache_tokens: int = DEFAULT_CACHE_TOKENS
    max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS
    keep_alive: float | None = None
    #: b of P(u, c) = a·u + b·u·(c + u/2) + d (a is ``prefill_s``): seconds per token pair.
    prefill_pair_s: float = DEFAULT_PREFILL_PAIR_S
    #: d of P(u, c): seconds a prefill costs whatever its size.
    prefill_fixed_s: float = DEFAULT_PREFILL_FIXED_S
    #: Seconds each further running sequence adds to a decode step (``decode_s`` is one's).
    decode_seq_s: float = DEFAULT_DECODE_SEQ_S
    #: Tokens per KV block (vLLM's --block-size) and per cached prefix block.
    block_tokens: int = 16
    #: Tokens one engine step may compute (vLLM's --max-num-batched-tokens).
    batch_tokens: int = 2048
    #: What the vLLM double's KV usage gauge counts: ``running``, the blocks running requests
    #: hold (vLLM's ``kv_cache_usage_perc``: near 0 on an idle engine however full its prefix
    #: cache), or ``fill``, those plus the free blocks still caching a prefix (the full cache a
    #: busy engine shows, near 1 once the pool has cycled).
    kv_usage_counts: str = "running"

    def __post_init__(self) -> None:
        for name in ("prefill_s", "decode_s", "load_s", "prefill_pair_s", "prefill_fixed_s",
                     "decode_seq_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.host_memory <= 0 or self.cache_tokens < 0 or self.max_output_tokens < 1:
            raise ValueError("host_memory > 0, cache_tokens >= 0 and max_output_tokens >= 1")
        if self.block_tokens < 1 or self.batch_tokens < 1:
            raise ValueError("block_tokens and batch_tokens must be at least 1")
        if self.kv_usage_counts not in KV_USAGE_COUNTS:
            raise ValueError(f"kv_usage_counts must be one of {', '.join(KV_USAGE_COUNTS)}")

    def prefill_seconds(self, uncached: int, cached: int) -> float:
        """P(u, c): the time to compute ``uncached`` prompt tokens after ``cached`` ones."""
        if uncached <= 0:
            return 0.0
        u = uncached
        return (self.prefill_s * u + self.prefill_pair_s * u * (cached + u / 2)
                + self.prefill_fixed_s)


# --- requests and jobs -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GenRequest:
    """What the model needs of one client request; the wire layer builds it.

    ``prompt``, the decoded text, is held only to find cached prefixes and never shown (``repr``
    leaves it out). ``control``: ``LOAD`` or ``UNLOAD`` for a request that only does that.
    ``keep_alive``: the request's idle time for its model (Ollama; negative: forever).
    """

    model: str
    prompt: bytes = field(default=b"", repr=False)
    max_tokens: int | None = None
    control: str | None = None
    keep_alive: float | None = None

    @property
    def prompt_tokens(self) -> int:
        """Prompt size: 4 bytes of decoded text per token, at least one."""
        return max(1, count_tokens(self.prompt))


class JobListener(Protocol):
    """Who hears a job's progress (the reply being written)."""

    def token(self, job: Job, index: int, text: str, last: bool) -> None:
        """Token ``index`` was produced; with ``last``, ``job.finish_reason`` is already set."""
        ...

    def done(self, job: Job) -> None:
        """The job finished normally (after its last token, or a control request's end)."""
        ...


WAITING = "waiting"
RUNNING = "running"
DONE = "done"
CANCELLED = "cancelled"


@dataclass(slots=True, eq=False)
class Job:
    """One request inside the model: where it is and what it cost. Times are clock seconds."""

    id: int
    request: GenRequest
    listener: JobListener = field(repr=False)
    queued_at: float
    prompt_tokens: int
    output_tokens: int
    state: str = WAITING
    slot: int | None = None
    admitted_at: float | None = None
    load_seconds: float = 0.0
    cached_tokens: int = 0
    prefill_seconds: float = 0.0
    first_token_at: float | None = None
    finished_at: float | None = None
    tokens_done: int = 0
    finish_reason: str | None = None
    control_reason: str | None = None
    _blocks: tuple[bytes, ...] = field(default=(), repr=False)

    @property
    def ttft(self) -> float | None:
        """Seconds from arrival to the first token."""
        return None if self.first_token_at is None else self.first_token_at - self.queued_at

    @property
    def decode_seconds(self) -> float:
        """Seconds spent generating after the first token."""
        if self.first_token_at is None:
            return 0.0
        end = self.finished_at if self.finished_at is not None else self.first_token_at
        return end - self.first_token_at


class UnknownModel(Exception):
    """The engine serves no model of that name."""


class PromptTooLong(Exception):
    """The request does not fit in the model's context: refused at once (vLLM answers 400)."""


class ModelTooLarge(Exception):
    """The model does not fit in host memory even with every other model unloaded."""


# --- status ----------------------------------------------------------------------------------

COLD = "cold"
LOADING = "loading"
LOADED = "loaded"


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """One model as the engine would report it."""

    name: str
    size: int
    state: str
    running: int
    waiting: int
    kv_tokens: int
    last_used: float
    expires_at: float | None


@dataclass(frozen=True, slots=True)
class EngineStatus:
    """Everything the status bodies show, read at one instant."""

    slots: int
    models: tuple[ModelStatus, ...]
    jobs: tuple[Job, ...]
    kv_capacity: int
    #: Tokens per KV block (a block pool's engine), else None.
    kv_block_tokens: int | None = None
    #: Idle slots' last jobs (finished or dropped), each with its ``slot`` (slot models).
    served: tuple[Job, ...] = ()
    prompt_tokens_total: int = 0
    computed_tokens_total: int = 0
    cached_tokens_total: int = 0
    generated_tokens_total: int = 0
    prefill_seconds_total: float = 0.0
    #: Prefills completed (first tokens produced): the count of vLLM's prefill-time histogram.
    prefills_total: int = 0
    decode_seconds_total: float = 0.0
    tokens_max: int = 0
    finished: Mapping[str, int] = field(default_factory=dict)
    #: Requests preempted (KV given back, to be recomputed) since start.
    preemptions: int = 0
    #: Prefix-cache lookups as vLLM counts them: tokens queried and found (``None``: not kept).
    prefix_queries_total: int | None = None
    prefix_hits_total: int | None = None

    @property
    def running(self) -> int:
        """Requests holding a slot."""
        return sum(m.running for m in self.models)

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot or a model load."""
        return sum(m.waiting for m in self.models)

    @property
    def kv_usage(self) -> float:
        """Share of the KV pool the running requests hold (0..1)."""
        if self.kv_capacity <= 0:
            return 0.0
        return min(1.0, sum(m.kv_tokens for m in self.models) / self.kv_capacity)

    def model(self, name: str) -> ModelStatus:
        """The status of one model."""
        for m in self.models:
            if m.name == name:
                return m
        raise UnknownModel(name)


class EngineModel(Protocol):
    """The behaviour behind a double: admits requests, says when each token is produced."""

    def submit(self, request: GenRequest, listener: JobListener) -> Job:
        """Queue a request; raises ``UnknownModel`` or ``ModelTooLarge`` at once. The listener
        is never called from inside ``submit``."""
        ...

    def cancel(self, job: Job) -> None:
        """The client left: stop generating and free the slot (no listener calls after)."""
        ...

    def status(self) -> EngineStatus:
        """Running, waiting, residency, KV usage and counters, now."""
        ...

    def hold(self) -> None:
        """Freeze progress: running requests stay running, nothing advances."""
        ...

    def release(self) -> None:
        """Resume after ``hold``, with each pending step's remaining time."""
        ...

    def stop(self) -> None:
        """Cancel every timer (the double is going away)."""
        ...


# --- timers that hold ------------------------------------------------------------------------


class _Timer:
    __slots__ = ("_owner", "call", "fn", "remaining")

    def __init__(self, owner: _Timers, fn: Callable[[], None], remaining: float) -> None:
        self._owner = owner
        self.fn = fn
        self.remaining = remaining
        self.call: IDelayedCall | None = None

    def cancel(self) -> None:
        if self.call is not None and self.call.active():
            self.call.cancel()
        self.call = None
        self._owner.live.discard(self)

    def fire(self) -> None:
        self.call = None
        self._owner.live.discard(self)
        self.fn()


class _Timers:
    """``callLater`` on the injected clock, frozen as a whole by ``hold``."""

    def __init__(self, clock: IReactorTime) -> None:
        self.clock = clock
        self.live: set[_Timer] = set()
        self.held = False

    def after(self, delay: float, fn: Callable[[], None]) -> _Timer:
        t = _Timer(self, fn, max(0.0, delay))
        self.live.add(t)
        if not self.held:
            t.call = self.clock.callLater(t.remaining, t.fire)
        return t

    def hold(self) -> None:
        if self.held:
            return
        self.held = True
        now = self.clock.seconds()
        for t in self.live:
            if t.call is not None and t.call.active():
                t.remaining = max(0.0, t.call.getTime() - now)
                t.call.cancel()
            t.call = None

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        for t in sorted(self.live, key=lambda t: t.remaining):
            t.call = self.clock.callLater(t.remaining, t.fire)

    def cancel_all(self) -> None:
        for t in list(self.live):
            t.cancel()


# --- generated text --------------------------------------------------------------------------

#: The double's generated text: token ``i`` is ``VOCABULARY[i % len]``; plain ASCII words.
VOCABULARY: tuple[str, ...] = (
    "The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".",
    " It", " was", " a", " bright", " cold", " day", " in", " April", ",", " and",
)


def token_text(index: int) -> str:
    """The text of generated token ``index``."""
    return VOCABULARY[index % len(VOCABULARY)]
