"""A vLLM-like behaviour model: continuous batching in steps over one ref-counted KV block pool.

``BatchModel`` runs the one served model as vLLM's V1 scheduler does (FCFS, chunked prefill,
prefix caching on), so a vLLM double's TTFT, queueing, KV usage and cache hits move as a real
engine's do under load:

- Each step has a token budget (``Knobs.batch_tokens``, vLLM's ``--max-num-batched-tokens``).
  Running requests come first, in start order: each decodes one token or computes its next
  prompt chunk. Then waiting requests are admitted in arrival order while the sequence cap
  (``slots``, ``--max-num-seqs``) and the budget last; one whose blocks do not fit blocks
  those behind it. No request is admitted in a step that preempted.
- KV memory is a ``BlockPool`` of ``cache_tokens // block_tokens`` blocks. Prompts (and their
  generated text) are cut into full blocks hashed as a chain; a block is findable by its hash
  as soon as its computation is scheduled, and after its request ends until the pool hands it
  out again. A new request starts from its longest cached prefix, at most its length minus
  one token, rounded down to blocks.
- A running request that needs a block when none is free preempts the newest running request
  (its blocks go back; it goes to the head of the queue, to be recomputed).
- A step costs its prefill chunks plus, when any sequence decodes,
  ``decode_s + decode_seq_s·(n-1)``. One prompt's chunks telescope to exactly
  ``Knobs.prefill_seconds(u, c)`` (``d`` once), so an idle engine's TTFT is P(u, c). Steps lie
  on a virtual timeline, so timer overshoot never accumulates; an idle engine starts a step
  when a request arrives. The first token comes at the end of the step completing the prompt,
  then one per step.

Deviations, on purpose: no null block (the pool has exactly ``capacity`` usable blocks);
hashes are over decoded prompt bytes (4 per token), not token ids; requests arriving at the
instant a step is planned join it; a cancelled running request leaves at once (the step in
flight keeps its cost); ``prompt_tokens_total`` and the cached-token counters count at a
request's first scheduling (vLLM: at its first token). vLLM's prefix-cache counters are kept
as vLLM keeps them: every lookup for a never-preempted waiting request adds its tokens queried
and hit, even when it then does not fit and is looked up again next step.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from hashlib import blake2b
from types import MappingProxyType

from twisted.internet.interfaces import IReactorTime

from pharos.sim.engine import ModelCore, forget, tell
from pharos.sim.model import (
    CANCELLED,
    DEFAULT_SLOTS,
    DONE,
    LENGTH,
    LOADED,
    RUNNING,
    WAITING,
    EngineStatus,
    GenRequest,
    Job,
    JobListener,
    Knobs,
    ModelStatus,
    PromptTooLong,
    UnknownModel,
    _Timer,
    token_text,
)
from pharos.sim.prompt import BYTES_PER_TOKEN

#: The vLLM double's knobs where its caller sets none. Assumed, as the related system's
#: simulator defaults for vLLM (8B model, 24 GB GPU, 4096 blocks of 16 tokens).
VLLM_KNOBS: Mapping[str, float | int] = MappingProxyType({
    "prefill_s": 100e-6,
    "prefill_pair_s": 3.3e-9,
    "prefill_fixed_s": 0.005,
    "decode_s": 0.020,
    "decode_seq_s": 0.0001,
    "block_tokens": 16,
    "cache_tokens": 4096 * 16,
    "batch_tokens": 2048,
})


# --- hashing ---------------------------------------------------------------------------------


class Chain:
    """The chained hashes of a growing text's full blocks of ``block_bytes``: hash ``i`` names every
    byte up to block ``i``'s end. With 64-byte blocks, ``prompt.chain_blocks``."""

    __slots__ = ("_size", "_tail", "hashes")

    def __init__(self, block_bytes: int, text: bytes = b"") -> None:
        self._size = block_bytes
        self._tail = b""
        self.hashes: list[bytes] = []
        self.extend(text)

    def extend(self, data: bytes) -> None:
        """Append ``data``; every block it completes gets its hash."""
        buf = self._tail + data
        size = self._size
        whole = len(buf) - len(buf) % size
        prev = self.hashes[-1] if self.hashes else b""
        for start in range(0, whole, size):
            prev = blake2b(prev + buf[start : start + size], digest_size=16).digest()
            self.hashes.append(prev)
        self._tail = buf[whole:]


# --- the block pool --------------------------------------------------------------------------


@dataclass(slots=True)
class _Held:
    blocks: list[int]
    cached: int  # leading blocks already findable by hash


class BlockPool:
    """One ref-counted pool of KV blocks, as vLLM's ``BlockPool`` keeps it.

    Owners (requests, by id) hold blocks by reference, so a shared prefix is held once. A free
    block keeps its hash and serves prefix hits until handed out again. Free blocks leave from
    the head of one queue (at start in id order); a freed block without a hash goes to the head,
    a cached one to the tail, and an owner's blocks are freed tail first, so a prompt's head
    outlives its tail.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a block pool needs at least one block")
        self.capacity = capacity
        self._ref = [0] * capacity
        self._hash: list[bytes | None] = [None] * capacity
        #: hash → the blocks caching it (vLLM does not deduplicate), first one served.
        self._cached: dict[bytes, dict[int, None]] = {}
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(capacity))
        self._owners: dict[int, _Held] = {}

    # -- reading --

    @property
    def held(self) -> int:
        """Blocks some owner holds."""
        return self.capacity - len(self._free)

    def usage(self) -> float:
        """Share of the pool held (vLLM's ``kv_cache_usage_perc``)."""
        return self.held / self.capacity

    @property
    def filled(self) -> int:
        """Blocks held, plus free blocks that still cache a prefix (the cache's fill)."""
        hashes = self._hash
        return self.held + sum(1 for b in self._free if hashes[b] is not None)

    def lookup(self, hashes: Iterable[bytes], limit: int | None = None) -> list[int]:
        """The blocks of the longest cached prefix of ``hashes`` (at most ``limit`` blocks),
        without touching them."""
        out: list[int] = []
        cached = self._cached
        for h in hashes:
            if limit is not None and len(out) >= limit:
                break
            ids = cached.get(h)
            if not ids:
                break
            out.append(next(iter(ids)))
        return out

    def blocks_of(self, owner: int) -> tuple[int, ...]:
        """The blocks ``owner`` holds, head first."""
        held = self._owners.get(owner)
        return tuple(held.blocks) if held is not None else ()

    def owners(self) -> list[int]:
        """Who holds blocks."""
        return list(self._owners)

    def hash_of(self, block: int) -> bytes | None:
        """The hash block ``block`` is cached under, if any."""
        return self._hash[block]

    def refs(self, block: int) -> int:
        """How many owners hold ``block``."""
        return self._ref[block]

    def free_order(self) -> list[int]:
        """The free queue, next handed out first (for tests: O(capacity))."""
        return list(self._free)

    # -- changing --

    def allocate(self, owner: int, hits: Sequence[int], new: int) -> bool:
        """Give ``owner`` the cached blocks ``hits`` (from ``lookup``) and ``new`` fresh ones,
        or nothing and ``False`` when they do not fit."""
        if owner in self._owners:
            raise ValueError(f"owner {owner} already holds blocks")
        ref = self._ref
        evictable = sum(1 for b in hits if ref[b] == 0)
        if new < 0 or new + evictable > len(self._free):
            return False
        for b in hits:
            if ref[b] == 0:
                del self._free[b]
            ref[b] += 1
        blocks = list(hits)
        blocks.extend(self._take(new))
        self._owners[owner] = _Held(blocks, len(hits))
        return True

    def grow(self, owner: int, new: int) -> bool:
        """Append ``new`` fresh blocks to ``owner``'s (decode or a next chunk), or ``False``."""
        if new > len(self._free):
            return False
        self._owners[owner].blocks.extend(self._take(new))
        return True

    def cache(self, owner: int, hashes: Sequence[bytes], full: int) -> None:
        """Make ``owner``'s first ``full`` blocks findable under ``hashes`` (as far as there
        are hashes): their contents are being computed."""
        held = self._owners[owner]
        end = min(full, len(hashes), len(held.blocks))
        if end <= held.cached:
            return
        for i in range(held.cached, end):
            b = held.blocks[i]
            h = hashes[i]
            self._hash[b] = h
            ids = self._cached.get(h)
            if ids is None:
                self._cached[h] = {b: None}
            else:
                ids[b] = None
        held.cached = end

    def free(self, owner: int) -> None:
        """``owner`` lets go of its blocks, tail first; unheld cached ones stay findable."""
        held = self._owners.pop(owner, None)
        if held is None:
            return
        ref = self._ref
        unhashed: list[int] = []
        hashed: list[int] = []
        for b in reversed(held.blocks):
            ref[b] -= 1
            if ref[b] == 0:
                (hashed if self._hash[b] is not None else unhashed).append(b)
        queue = self._free
        for b in reversed(unhashed):  # the first one freed ends at the very head
            queue[b] = None
            queue.move_to_end(b, last=False)
        for b in hashed:
            queue[b] = None

    def reset(self) -> bool:
        """Forget every cached hash (``POST /reset_prefix_cache``); like vLLM, refused
        (``False``, nothing changed) while any block is held."""
        if self.held:
            return False
        self._cached.clear()
        self._hash = [None] * self.capacity
        return True

    def _take(self, n: int) -> list[int]:
        out: list[int] = []
        queue = self._free
        for _ in range(n):
            b, _ = queue.popitem(last=False)
            h = self._hash[b]
            if h is not None:
                ids = self._cached[h]
                del ids[b]
                if not ids:
                    del self._cached[h]
                self._hash[b] = None
            self._ref[b] = 1
            out.append(b)
        return out


# --- the engine ------------------------------------------------------------------------------


class _Seq:
    """A request inside the engine: its hash chain and how far its KV is computed."""

    __slots__ = ("base", "chain", "computed", "job", "nblocks", "target")

    def __init__(self, job: Job, chain: Chain) -> None:
        self.job = job
        self.chain = chain
        self.computed = 0  # tokens whose KV is computed (or scheduled in the step in flight)
        self.target = 0  # tokens the current prefill (first or recompute) computes
        self.base = 0  # tokens found cached when this prefill started
        self.nblocks = 0

    @property
    def num_tokens(self) -> int:
        return self.job.prompt_tokens + self.job.tokens_done


@dataclass(slots=True, eq=False)
class _Step:
    start: float
    budget: int
    plan: list[_Seq] = field(default_factory=list)
    prefill: float = 0.0
    decoding: int = 0
    preempted: bool = False
    joinable: bool = False
    end: float = 0.0
    timer: _Timer | None = None


class BatchModel(ModelCore):
    """vLLM's V1 scheduler over a ``BlockPool`` (see the module docstring).

    ``models``: the one served model (name → size). ``slots``: vLLM's ``--max-num-seqs``.
    ``max_model_len``: the longest request (prompt and output) accepted, default the pool's
    size; a smaller pool is refused, as is ``batch_tokens < slots`` (vLLM refuses both at
    start). ``loaded`` is ignored: the model is always loaded.
    """

    def __init__(
        self,
        clock: IReactorTime,
        models: Mapping[str, int],
        slots: int = DEFAULT_SLOTS,
        knobs: Knobs | None = None,
        loaded: Iterable[str] = (),
        max_model_len: int | None = None,
    ) -> None:
        if slots < 1:
            raise ValueError("slots (max_num_seqs) must be at least 1")
        if len(models) != 1:
            raise ValueError("a vLLM-like engine serves exactly one model")
        k = knobs or Knobs()
        if k.batch_tokens < slots:
            raise ValueError(f"max_num_batched_tokens ({k.batch_tokens}) must be greater than "
                             f"or equal to max_num_seqs ({slots})")
        capacity = k.cache_tokens // k.block_tokens
        pool_tokens = capacity * k.block_tokens
        self.max_model_len = pool_tokens if max_model_len is None else max_model_len
        if capacity < 1 or self.max_model_len < 2 or self.max_model_len > pool_tokens:
            raise ValueError(f"a KV pool of {capacity} blocks of {k.block_tokens} tokens cannot "
                             f"hold one request of max_model_len {self.max_model_len}")
        super().__init__(clock, slots, k)
        ((self._name, self._size),) = models.items()
        self._bt = k.block_tokens
        self._block_bytes = k.block_tokens * BYTES_PER_TOKEN
        self._pool = BlockPool(capacity)
        self._running: list[_Seq] = []
        self._waiting: deque[_Seq] = deque()
        self._seqs: dict[int, _Seq] = {}
        self._free_slots = list(range(slots))
        self._step: _Step | None = None
        self._last_used = clock.seconds()
        self._preemptions = 0
        self._queries = 0
        self._hits = 0

    # -- the interface --

    def submit(self, request: GenRequest, listener: JobListener) -> Job:
        """Queue a request (see ``EngineModel.submit``); ``PromptTooLong`` when it cannot fit
        in ``max_model_len``."""
        if request.model != self._name:
            raise UnknownModel(request.model)
        now = self.clock.seconds()
        self._next_id += 1
        if request.control:
            job = Job(id=self._next_id, request=request, listener=listener, queued_at=now,
                      prompt_tokens=0, output_tokens=0, state=RUNNING,
                      control_reason=request.control)
            self._control(job)
            return job
        prompt = request.prompt_tokens
        want = request.max_tokens
        asked = want is not None and want > 0
        if prompt >= self.max_model_len or (asked and prompt + (want or 0) > self.max_model_len):
            raise PromptTooLong(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {prompt + (want or 0) if asked else prompt} tokens ({prompt} in "
                "the messages). Please reduce the length of the messages or completion.")
        output, reason = self._output(request)
        if prompt + output > self.max_model_len:
            output, reason = self.max_model_len - prompt, LENGTH
        job = Job(id=self._next_id, request=request, listener=listener, queued_at=now,
                  prompt_tokens=prompt, output_tokens=output, finish_reason=reason)
        seq = _Seq(job, Chain(self._block_bytes, request.prompt))
        self._seqs[job.id] = seq
        self._waiting.append(seq)
        self._last_used = now
        step = self._step
        if step is None:
            self._begin(now)
        elif step.joinable and now <= step.start:
            self._join(step)
        return job

    def cancel(self, job: Job) -> None:
        """The client left: the request leaves at once, its sequence and blocks freed, counted
        as an abort (no listener calls after)."""
        if job.state in (DONE, CANCELLED):
            return
        now = self.clock.seconds()
        if self._drop_control(job):
            job.state = CANCELLED
            job.finished_at = now
            return
        seq = self._seqs.pop(job.id)
        if job.state == WAITING:
            self._waiting.remove(seq)
        else:
            self._running.remove(seq)
            self._pool.free(job.id)
            heapq.heappush(self._free_slots, job.slot if job.slot is not None else 0)
        self._cancelled(job, now)
        self._last_used = now

    def status(self) -> EngineStatus:
        """Gauges and counters now."""
        pool = self._pool
        jobs = sorted((s.job for s in self._running), key=lambda j: j.slot or 0)
        blocks = pool.filled if self.knobs.kv_usage_counts == "fill" else pool.held
        model = ModelStatus(self._name, self._size, LOADED, len(self._running),
                            len(self._waiting), blocks * self._bt, self._last_used, None)
        return self._status((model,), jobs, pool.capacity * self._bt,
                            preemptions=self._preemptions, prefix_queries_total=self._queries,
                            prefix_hits_total=self._hits, kv_block_tokens=self._bt)

    def release(self) -> None:
        """Resume: the step in flight ends after what remained of it, later ones follow."""
        if not self._timers.held:
            return
        self._timers.release()
        step = self._step
        if step is not None and step.timer is not None and step.timer.call is not None:
            end = step.timer.call.getTime()
            step.start += end - step.end
            step.end = end

    def stop(self) -> None:
        """Cancel every pending step."""
        super().stop()
        self._step = None

    # -- extras for tests and the wire layer --

    @property
    def pool(self) -> BlockPool:
        """The KV block pool."""
        return self._pool

    def cached_prefix(self, model: str, prompt: bytes) -> int:
        """Tokens of ``prompt`` the pool holds cached now (does not touch anything)."""
        if model != self._name:
            raise UnknownModel(model)
        return len(self._pool.lookup(Chain(self._block_bytes, prompt).hashes)) * self._bt

    def reset_prefix_cache(self) -> bool:
        """vLLM's ``POST /reset_prefix_cache``: ``False`` while requests hold blocks."""
        return self._pool.reset()

    # -- the steps --

    def _begin(self, start: float) -> None:
        """Plan the step starting at virtual time ``start`` and time its end."""
        step = _Step(start, self.knobs.batch_tokens)
        self._schedule_running(step)
        if not step.preempted:
            self._schedule_waiting(step)
        if not step.plan:
            self._step = None  # idle: the next arrival starts a step
            return
        self._step = step
        step.end = start + self._cost(step)
        step.timer = self._timers.after(step.end - self.clock.seconds(), self._end_step)

    def _join(self, step: _Step) -> None:
        """Requests that arrived as ``step`` was planned join it if they fit."""
        before = len(step.plan)
        self._schedule_waiting(step)
        if len(step.plan) == before:
            return
        step.end = step.start + self._cost(step)
        if step.timer is not None:
            step.timer.cancel()
        step.timer = self._timers.after(step.end - self.clock.seconds(), self._end_step)

    def _cost(self, step: _Step) -> float:
        k = self.knobs
        decode = k.decode_s + k.decode_seq_s * (step.decoding - 1) if step.decoding else 0.0
        return step.prefill + decode

    def _schedule_running(self, step: _Step) -> None:
        bt = self._bt
        running = self._running
        pool = self._pool
        i = 0
        while i < len(running) and step.budget > 0:
            seq = running[i]
            n = min(seq.num_tokens - seq.computed, step.budget)
            if n <= 0:
                i += 1
                continue
            need = -(-(seq.computed + n) // bt) - seq.nblocks
            if need > 0:
                while not pool.grow(seq.job.id, need):
                    victim = running.pop()
                    self._preempt(victim)
                    step.preempted = True
                    if victim is seq:
                        break
                if seq.job.state != RUNNING:
                    break  # it had to give its own blocks back
                seq.nblocks += need
            self._schedule(step, seq, n)
            i += 1

    def _schedule_waiting(self, step: _Step) -> None:
        bt = self._bt
        waiting = self._waiting
        running = self._running
        pool = self._pool
        while waiting and step.budget > 0:
            if len(running) >= self.slots:
                break
            seq = waiting[0]
            job = seq.job
            total = seq.num_tokens
            hits = pool.lookup(seq.chain.hashes, (total - 1) // bt)
            cached = len(hits) * bt
            if job.admitted_at is None:  # vLLM counts a preempted request's lookups apart
                self._queries += total
                self._hits += cached
            n = min(total - cached, step.budget)
            need = -(-(cached + n) // bt) - len(hits)
            if not pool.allocate(job.id, hits, need):
                break
            waiting.popleft()
            running.append(seq)
            seq.nblocks = len(hits) + need
            seq.target = total
            seq.base = seq.computed = cached
            job.state = RUNNING
            job.slot = heapq.heappop(self._free_slots)
            if job.admitted_at is None:
                # The step's virtual start, not the clock after this planning work: the
                # prefill time vLLM reports runs from there (calibration fits it).
                job.admitted_at = step.start
                job.cached_tokens = cached
                self._count_admit(job)
            self._schedule(step, seq, n)
        step.joinable = not waiting

    def _schedule(self, step: _Step, seq: _Seq, n: int) -> None:
        """``seq`` computes ``n`` more tokens in ``step``; their full blocks become cached."""
        c = seq.computed
        if c < seq.target:
            k = self.knobs
            base = seq.base
            step.prefill += (k.prefill_seconds(c + n - base, base)
                             - k.prefill_seconds(c - base, base))
        else:
            step.decoding += 1
        seq.computed = c + n
        self._pool.cache(seq.job.id, seq.chain.hashes, seq.computed // self._bt)
        step.plan.append(seq)
        step.budget -= n

    def _preempt(self, seq: _Seq) -> None:
        job = seq.job
        self._pool.free(job.id)
        seq.nblocks = 0
        seq.computed = 0
        job.state = WAITING
        heapq.heappush(self._free_slots, job.slot if job.slot is not None else 0)
        job.slot = None
        self._waiting.appendleft(seq)
        self._preemptions += 1

    def _end_step(self) -> None:
        """The step in flight is over: its tokens come out, the next step is planned before
        anyone hears of them (a freed sequence is taken at once)."""
        step = self._step
        assert step is not None
        self._step = None
        now = self.clock.seconds()
        events: list[tuple[Job, int, bool]] = []
        finished = False
        for seq in step.plan:
            job = seq.job
            if job.state != RUNNING or seq.computed < seq.num_tokens:
                continue  # cancelled meanwhile, or a chunk that did not end its prompt
            index = job.tokens_done
            job.tokens_done = index + 1
            self._generated_total += 1
            if index == 0:
                job.first_token_at = now
                # Stamped at the step's planned end, as vLLM stamps its engine core's first
                # token, so an idle engine's prefill time is P(u, c) to the microsecond
                # whatever the reactor's lateness (calibration reads it).
                job.prefill_seconds = step.end - (job.admitted_at if job.admitted_at is not None
                                                  else step.end)
                self._prefill_total += job.prefill_seconds
                self._prefills += 1
            last = job.tokens_done >= job.output_tokens
            if last:
                self._finish(seq, now)
                finished = True
            else:
                seq.chain.extend(token_text(index).encode())
            events.append((job, index, last))
        if finished:
            self._running = [s for s in self._running if s.job.state == RUNNING]
        self._last_used = now
        self._begin(step.end)
        tell(events)

    def _finish(self, seq: _Seq, now: float) -> None:
        """``seq`` produced its last token: its blocks and sequence go back (the caller drops
        it from the running list)."""
        job = seq.job
        self._done(job, now)
        self._pool.free(job.id)
        heapq.heappush(self._free_slots, job.slot if job.slot is not None else 0)
        del self._seqs[job.id]
        forget(job)
