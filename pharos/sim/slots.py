"""The slot model: how llama.cpp's server and Ollama's runners run requests.

Slots. Each model has ``slots`` (llama.cpp's ``--parallel``, Ollama's ``OLLAMA_NUM_PARALLEL``),
and each caches on its own: it keeps the 16-token blocks of the last prompt and reply it
served, up to ``cache_tokens // slots`` (llama.cpp splits ``-c`` among its slots); on both
engines a request sent beside one holding its prefix prefills it in full. A request takes the
*free* slot sharing the longest prefix with its prompt (lowest id on a tie), else the least
recently used free slot (highest id on a tie: llama.cpp's ``get_available_slot`` compares
with ``<=``, and the b11312 prefix capture shows its first request in slot 1). Its cached
tokens are that common prefix, at most the prompt less one token (an engine always computes
the last). Not modelled: llama.cpp's ``--slot-prompt-similarity`` and ``--cache-ram``, and
Ollama's copying of a prefix from another slot.

Steps. A model's slots run together as llama.cpp's batch (Ollama runs one runner per model,
so each model steps on its own). One step computes, per occupied slot in id order, its next
token if decoding, else the next chunk of its uncached prompt, within ``batch_tokens``
(decode tokens first, as llama.cpp fills its batch). A step lasts
``decode_s + decode_seq_s·(n - 1)`` for ``n`` decoding slots, plus each prompt chunk's share
of P(u, c) (``d`` with a prompt's first chunk), so a prompt's chunks add up to P(u, c) and an
idle engine's TTFT is P(u, c). Tokens come out at the end of their step. Steps lie on a
virtual timeline (the next starts when the previous ends, whenever the timer fired), so
overshoot never accumulates; an idle engine starts one on the turn after work arrives, so
requests arriving together share it. A request admitted mid-step starts in the next step.

Cancellation frees the slot at once; the slot keeps what its finished steps computed; a
running step completes without it.

Residency (Ollama): a cold model loads first (``load_s``), after unloading idle models when
host memory is short, in Ollama's order (``EVICT_OLLAMA``: shortest keep-alive first, then
the lowest model path, stood in for by its name's SHA-256: server/sched.go
``findRunnerToUnload``, ``ByDurationAndName``) or least recently used first (``EVICT_LRU``).
A model with requests in flight is never unloaded; a cold one waits instead (Ollama marks the
runner to unload once its requests end and holds its whole queue: not modelled). An idle
model unloads after its ``keep_alive``; unloading empties its slots' caches. A llama.cpp
double preloads its one model and keeps it.
Counters: prompt, computed and cached tokens at admission, prefill seconds at the first
token, decode seconds at the end.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from twisted.internet.interfaces import IReactorTime

from pharos.sim.engine import ModelCore, forget, tell
from pharos.sim.model import (
    CANCELLED,
    COLD,
    DEFAULT_SLOTS,
    DONE,
    LOAD,
    LOADED,
    LOADING,
    RUNNING,
    UNLOAD,
    EngineStatus,
    GenRequest,
    Job,
    JobListener,
    Knobs,
    ModelStatus,
    ModelTooLarge,
    UnknownModel,
    _Timer,
    token_text,
)
from pharos.sim.prompt import BLOCK_TOKENS, chain_blocks

_NEVER = float("-inf")


@dataclass(slots=True, eq=False)
class _Slot:
    """One slot: its cache, and the job it runs with that job's prompt progress."""

    id: int
    blocks: tuple[bytes, ...] = ()
    last_used: float = _NEVER
    job: Job | None = None
    #: Uncached prompt tokens of ``job`` computed so far.
    done: int = 0
    #: When ``job``'s first prompt chunk started.
    started: float | None = None
    #: The last job this slot finished or dropped (``/slots`` shows it while idle).
    last: Job | None = None


@dataclass(slots=True, eq=False)
class _Step:
    """One engine step: its virtual start, length, and each slot's work (prompt tokens, or 0
    for one decoded token)."""

    start: float
    seconds: float
    work: list[tuple[_Slot, Job, int]]
    timer: _Timer | None = field(default=None, repr=False)


class _Model:
    """One model's runner: residency, slots, queue and step."""

    def __init__(self, name: str, size: int, slots: int, knobs: Knobs) -> None:
        self.name = name
        self.size = size
        self.state = COLD
        self.slots = [_Slot(i) for i in range(slots)]
        self.waiting: deque[Job] = deque()
        self.last_used = 0.0
        self.keep_alive = knobs.keep_alive
        self.expiry: _Timer | None = None
        self.load_started = 0.0
        self.step: _Step | None = None
        self.kick: _Timer | None = None
        self.stepping = False

    @property
    def running(self) -> list[Job]:
        return [s.job for s in self.slots if s.job is not None]

    @property
    def idle(self) -> bool:
        return not self.waiting and all(s.job is None for s in self.slots)

    def free(self) -> list[_Slot]:
        return [s for s in self.slots if s.job is None]

    def holding(self, job: Job) -> _Slot | None:
        if job.slot is not None and job.slot < len(self.slots):
            s = self.slots[job.slot]
            if s.job is job:
                return s
        return None


def _common(a: Sequence[bytes], b: Sequence[bytes]) -> int:
    """Leading blocks ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


#: The order idle models unload in when memory is short: Ollama's, or least recently used.
EVICT_OLLAMA = "ollama"
EVICT_LRU = "lru"


def _path_order(name: str) -> str:
    """A stand-in for the model path Ollama breaks keep-alive ties by (a blob's digest):
    fixed per model and unrelated to its popularity."""
    return hashlib.sha256(name.encode()).hexdigest()


class SlotModel(ModelCore):
    """The slot, batch and residency model described in the module docstring."""

    def __init__(
        self,
        clock: IReactorTime,
        models: Mapping[str, int],
        slots: int = DEFAULT_SLOTS,
        knobs: Knobs | None = None,
        loaded: Iterable[str] = (),
        in_order: bool = False,
        evict: str = EVICT_LRU,
    ) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        #: Requests are admitted in arrival order across models: one waiting for its model
        #: to load holds every later request back, whatever its model (llama-swap's swaps, a
        #: request at a time through its swap lock; assumed [U]). Otherwise a loaded model
        #: takes its queued requests while a cold one waits for memory (Ollama).
        self.in_order = in_order
        if evict not in (EVICT_OLLAMA, EVICT_LRU):
            raise ValueError(f"unknown eviction order {evict!r}")
        self.evict = evict
        if not models:
            raise ValueError("a model needs at least one model name")
        super().__init__(clock, slots, knobs)
        #: Blocks one slot's cache holds: its share of the context.
        self.slot_blocks = self.knobs.cache_tokens // slots // BLOCK_TOKENS
        self._held_at = 0.0
        #: Loads started (on a one-model host, a swap after the first): placement makes them rare.
        self.loads = 0
        self._models = {name: _Model(name, size, slots, self.knobs)
                        for name, size in models.items()}
        now = clock.seconds()
        for name in loaded:
            m = self._model(name)
            if self._used_memory() + m.size > self.knobs.host_memory:
                raise ModelTooLarge(f"{name}: the preloaded models do not fit in host memory")
            m.state = LOADED
            m.last_used = now
            self._idle(m)

    # -- the interface --

    def submit(self, request: GenRequest, listener: JobListener) -> Job:
        """Queue a request (see ``EngineModel.submit``)."""
        m = self._model(request.model)
        if m.size > self.knobs.host_memory:
            raise ModelTooLarge(f"{m.name} needs {m.size} bytes, the host has "
                                f"{self.knobs.host_memory}")
        self._next_id += 1
        output, reason = self._output(request)
        job = Job(
            id=self._next_id,
            request=request,
            listener=listener,
            queued_at=self.clock.seconds(),
            prompt_tokens=0 if request.control else request.prompt_tokens,
            output_tokens=0 if request.control else output,
        )
        job.finish_reason = None if request.control else reason
        if not request.control:
            job._blocks = chain_blocks(request.prompt)
        if request.keep_alive is not None:
            m.keep_alive = None if request.keep_alive < 0 else request.keep_alive
        self._cancel_expiry(m)
        if request.control == UNLOAD:
            m.keep_alive = 0.0
            job.control_reason = UNLOAD
            job.state = RUNNING
            self._control(job)
            if m.idle:
                self._idle(m)
            return job
        m.waiting.append(job)
        self._pump()
        return job

    def cancel(self, job: Job) -> None:
        """Forget a job: out of the queue or out of its slot, no more callbacks."""
        if job.state in (DONE, CANCELLED):
            return
        now = self.clock.seconds()
        self._drop_control(job)
        m = self._models[job.request.model]
        if job in m.waiting:
            m.waiting.remove(job)
        slot = m.holding(job)
        if slot is not None:
            self._vacate(slot, job, now, self._computed(slot, job))
        self._cancelled(job, now)
        m.last_used = now
        if m.idle:
            self._idle(m)
        self._pump()

    def status(self) -> EngineStatus:
        """Gauges and counters now."""
        models = []
        jobs: list[Job] = []
        served: list[Job] = []
        now = self.clock.seconds()
        for m in self._models.values():
            running = m.running
            kv = sum(j.prompt_tokens + j.tokens_done for j in running)
            expires: float | None = None
            if m.state == LOADED:
                if m.keep_alive is None:
                    expires = None
                elif m.idle:
                    expires = m.last_used + m.keep_alive
                else:
                    expires = now + m.keep_alive
            models.append(ModelStatus(m.name, m.size, m.state, len(running), len(m.waiting),
                                      kv, m.last_used, expires))
            jobs.extend(running)
            served.extend(s.last for s in m.slots if s.job is None and s.last is not None)
        return self._status(models, sorted(jobs, key=lambda j: j.slot or 0),
                            self.knobs.cache_tokens, served=served)

    def hold(self) -> None:
        """Freeze the model's clock."""
        if not self._timers.held:
            self._held_at = self.clock.seconds()
        super().hold()

    def release(self) -> None:
        """Unfreeze the model's clock: steps in flight end as much later as the hold lasted."""
        if self._timers.held:
            shift = self.clock.seconds() - self._held_at
            for m in self._models.values():
                if m.step is not None:
                    m.step.start += shift
                for s in m.slots:
                    if s.started is not None and s.job is not None \
                            and s.job.first_token_at is None:
                        s.started += shift
        self._timers.release()

    def stop(self) -> None:
        """Cancel every pending step."""
        super().stop()
        for m in self._models.values():
            m.expiry = None
            m.step = None
            m.kick = None

    # -- extras for tests --

    def cached_prefix(self, model: str, prompt: bytes) -> int:
        """Tokens of ``prompt`` the free slot it would take holds now (0 with none free)."""
        blocks = chain_blocks(prompt)
        free = self._model(model).free()
        return max((_common(s.blocks, blocks) for s in free), default=0) * BLOCK_TOKENS

    # -- residency --

    def _model(self, name: str) -> _Model:
        m = self._models.get(name)
        if m is None:
            raise UnknownModel(name)
        return m

    def _used_memory(self) -> int:
        return sum(m.size for m in self._models.values() if m.state != COLD)

    def _pump(self, now: float | None = None) -> None:
        """Admit what can run: load cold models that fit, fill free slots in arrival order."""
        at = self.clock.seconds() if now is None else now
        queued = [m for m in self._models.values() if m.waiting]
        queued.sort(key=lambda m: (m.waiting[0].queued_at, m.waiting[0].id))
        # In order: the oldest request whose model is not loaded goes first (its model's
        # load), and no request after it is admitted.
        barrier = min(((m.waiting[0].queued_at, m.waiting[0].id) for m in queued
                       if m.state != LOADED), default=None) if self.in_order else None
        for m in queued:
            if m.state == COLD:
                if barrier is not None and (m.waiting[0].queued_at, m.waiting[0].id) > barrier:
                    continue  # not its turn
                self._try_load(m)
            if m.state != LOADED:
                continue
            admitted = False
            while m.waiting and (m.waiting[0].request.control or m.free()) and (
                    barrier is None
                    or (m.waiting[0].queued_at, m.waiting[0].id) < barrier):
                job = m.waiting.popleft()
                if job.request.control:
                    job.state = RUNNING
                    job.control_reason = LOAD
                    self._control(job)
                else:
                    self._admit(m, job, at)
                    admitted = True
            if admitted:
                self._wake(m)
            if m.idle:
                self._idle(m)

    def _try_load(self, m: _Model) -> None:
        need = m.size
        limit = self.knobs.host_memory
        # In order, a model running nothing is evictable even with requests queued: they
        # came after this one, and load it again in their turn.
        idle = sorted(
            (o for o in self._models.values() if o is not m and o.state == LOADED and (
                o.idle or (self.in_order and not any(s.job for s in o.slots)))),
            key=(lambda o: (math.inf if o.keep_alive is None else o.keep_alive,
                            _path_order(o.name)))
            if self.evict == EVICT_OLLAMA else (lambda o: o.last_used),
        )
        if self._used_memory() - sum(o.size for o in idle) + need > limit:
            return  # wait until a busy model goes idle
        for o in idle:
            if self._used_memory() + need <= limit:
                break
            self._unload(o)
        m.state = LOADING
        self.loads += 1
        m.load_started = self.clock.seconds()
        self._timers.after(self.knobs.load_s, partial(self._loaded, m))

    def _loaded(self, m: _Model) -> None:
        m.state = LOADED
        now = self.clock.seconds()
        m.last_used = now
        for job in m.waiting:
            job.load_seconds = now - max(job.queued_at, m.load_started)
        self._pump()

    def _unload(self, m: _Model) -> None:
        """Out of memory: the runner goes, and its slots' caches with it."""
        self._cancel_expiry(m)
        for t in (m.kick, m.step.timer if m.step is not None else None):
            if t is not None:
                t.cancel()
        m.kick = None
        m.step = None
        m.state = COLD
        m.slots = [_Slot(i) for i in range(self.slots)]
        m.keep_alive = self.knobs.keep_alive

    def _idle(self, m: _Model) -> None:
        """``m`` has nothing to do: start its keep-alive countdown."""
        self._cancel_expiry(m)
        if m.state != LOADED or m.keep_alive is None:
            return

        def expire() -> None:
            m.expiry = None
            if m.idle and m.state == LOADED:
                self._unload(m)
                self._pump()

        m.expiry = self._timers.after(m.keep_alive, expire)

    def _cancel_expiry(self, m: _Model) -> None:
        if m.expiry is not None:
            m.expiry.cancel()
            m.expiry = None

    # -- slots --

    def _admit(self, m: _Model, job: Job, now: float) -> None:
        """Give ``job`` the free slot holding its longest prefix (else the LRU one)."""
        free = m.free()
        best = max(free, key=lambda s: (_common(s.blocks, job._blocks), -s.id))
        common = _common(best.blocks, job._blocks)
        if common == 0:
            best = min(free, key=lambda s: (s.last_used, -s.id))
        slot = best
        slot.job = job
        slot.done = 0
        slot.started = None
        slot.last_used = now
        slot.blocks = slot.blocks[:common]  # the rest is overwritten by this prompt
        job.slot = slot.id
        job.state = RUNNING
        job.admitted_at = now
        m.last_used = now
        # An engine always computes at least the prompt's last token.
        job.cached_tokens = min(common * BLOCK_TOKENS, job.prompt_tokens - 1)
        self._count_admit(job)

    def _computed(self, slot: _Slot, job: Job) -> tuple[bytes, ...]:
        """The blocks a dropped job leaves in its slot: what its finished steps computed."""
        if job.first_token_at is None:
            return job._blocks[: (job.cached_tokens + slot.done) // BLOCK_TOKENS]
        return chain_blocks(job.request.prompt + _reply(job.tokens_done))

    def _vacate(self, slot: _Slot, job: Job, now: float, blocks: tuple[bytes, ...]) -> None:
        slot.job = None
        slot.blocks = blocks[: self.slot_blocks]
        slot.last_used = now
        slot.last = job
        slot.done = 0
        slot.started = None

    def _finish(self, m: _Model, slot: _Slot, job: Job, now: float) -> None:
        self._done(job, now)
        # The reply is cached with the prompt: a next turn that repeats it hits.
        self._vacate(slot, job, now, chain_blocks(job.request.prompt + _reply(job.tokens_done)))
        forget(job)
        m.last_used = now
        if m.idle:
            self._idle(m)

    # -- steps --

    def _wake(self, m: _Model) -> None:
        """Work arrived: an idle engine starts a step on the next turn."""
        if m.step is None and m.kick is None and not m.stepping:
            m.kick = self._timers.after(0, partial(self._kicked, m))

    def _kicked(self, m: _Model) -> None:
        m.kick = None
        self._start(m, self.clock.seconds())

    def _start(self, m: _Model, at: float) -> None:
        """Compose the step starting at ``at`` (virtual time) and schedule its end."""
        k = self.knobs
        decoding = sum(1 for s in m.slots
                       if s.job is not None and s.job.first_token_at is not None)
        seconds = k.decode_s + k.decode_seq_s * (decoding - 1) if decoding else 0.0
        budget = k.batch_tokens - decoding
        work: list[tuple[_Slot, Job, int]] = []
        for s in m.slots:
            job = s.job
            if job is None:
                continue
            if job.first_token_at is not None:
                work.append((s, job, 0))
                continue
            u = min(job.prompt_tokens - job.cached_tokens - s.done, budget)
            if u <= 0:
                continue
            budget -= u
            seconds += k.prefill_seconds(u, job.cached_tokens + s.done)
            if s.done:
                seconds -= k.prefill_fixed_s  # d is paid once, with the first chunk
            if s.started is None:
                s.started = at
            work.append((s, job, u))
        if not work:
            m.step = None
            return
        step = _Step(at, seconds, work)
        m.step = step
        step.timer = self._timers.after(at + seconds - self.clock.seconds(),
                                        partial(self._end, m, step))

    def _end(self, m: _Model, step: _Step) -> None:
        """The step is over: its tokens come out, freed slots are refilled, the next starts."""
        if m.step is not step:
            return
        m.step = None
        end = step.start + step.seconds
        events: list[tuple[Job, int, bool]] = []
        m.stepping = True
        try:
            for s, job, u in step.work:
                if s.job is not job:
                    continue  # dropped during the step
                if u:
                    s.done += u
                    if s.done < job.prompt_tokens - job.cached_tokens:
                        continue
                    job.first_token_at = end
                    job.prefill_seconds = end - (s.started if s.started is not None else
                                                 step.start)
                    self._prefill_total += job.prefill_seconds
                    self._prefills += 1
                index = job.tokens_done
                job.tokens_done += 1
                self._generated_total += 1
                last = job.tokens_done >= job.output_tokens
                if last:
                    self._finish(m, s, job, end)
                events.append((job, index, last))
            self._pump(end)  # a freed slot is taken before anyone hears of it
        finally:
            m.stepping = False
        if m.state == LOADED:
            self._start(m, end)
        tell(events)


def _reply(tokens: int) -> bytes:
    """The text of a reply's first ``tokens`` tokens."""
    return "".join(token_text(i) for i in range(tokens)).encode()

