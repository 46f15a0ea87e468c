"""The scheduler (spec §8): admission, occupancy, the per-key fair queue and leases.

Picking a target and taking a slot on it is one synchronous step (the reactor is
single-threaded), so two requests never both see one slot as free. A request that cannot be
placed waits in its key's FIFO; keys are served by deficit round-robin on their weights, and
every freed slot (and every scrape round) re-runs the next waiters through the policy.
"""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from twisted.internet.defer import Deferred, fail

from pharos.engine.signals import Residency
from pharos.policy import Candidate, Decision, PolicyConfig, RouteReq, pick
from pharos.state.registry import Target
from pharos.state.state import State
from pharos.state.stats import Sample

#: Waiters per instance before a new request gets 429 (spec §8).
QUEUE_LIMIT = 1000
#: Slots of a target whose engine and config say nothing: saturated after this many requests
#: or as soon as the engine reports a queue (assumed, spec §14 ledger).
DEFAULT_CAPACITY = 2


class UnknownModel(Exception):
    """No backend has ever listed the model (404)."""


class Unavailable(Exception):
    """Backends list the model, but none of them is up (503)."""


class QueueFull(Exception):
    """The fair queue is at its limit (429)."""


@dataclass(frozen=True, slots=True)
class SchedRequest:
    """What the scheduler needs of one request; ``exclude`` holds targets already tried."""

    model: str
    prompt_tokens: int
    seed: int
    exclude: frozenset[int] = frozenset()
    kind: str | None = None  # only backends of this kind (Ollama's native routes)


@dataclass(eq=False)
class Lease:
    """A slot on a target, held for one request; released once, with its feedback."""

    sched: Scheduler
    target: Target
    decision: Decision
    waited: bool
    cold: bool  # dispatched to a target whose model was cold
    released: bool = False

    def release(self, sample: Sample | None = None) -> None:
        """Free the slot and learn from the request; the next waiter runs at once."""
        if self.released:
            return
        self.released = True
        t = self.target
        t.inflight -= 1
        if sample is not None:
            self.sched.state.feedback(t, sample)
        else:
            t.last_release_at = self.sched.state.clock.seconds()
        self.sched.kick()


@dataclass(eq=False)
class _Waiter:
    key: str
    weight: int
    req: SchedRequest
    d: Deferred[Lease] = field(default_factory=Deferred)
    arriving: bool = True  # still inside acquire: a grant now did not wait


class Scheduler:
    """Admission and the fair queue over the state's targets."""

    def __init__(
        self,
        state: State,
        policy: PolicyConfig,
        *,
        queue_limit: int = QUEUE_LIMIT,
        default_capacity: int = DEFAULT_CAPACITY,
        seed: Callable[[], int] = lambda: random.getrandbits(63),
    ) -> None:
        self.state = state
        self.policy = policy
        self.queue_limit = queue_limit
        self.default_capacity = default_capacity
        self.seed = seed
        self._queues: OrderedDict[str, deque[_Waiter]] = OrderedDict()
        # Keys keep their queue (empty or not) so the round-robin order is stable; they are
        # the configured keys, so there are few.
        self._turn: str | None = None
        self._left = 0
        self.waiting = 0
        self._kicking = False

    # --- admission -----------------------------------------------------------------------

    def acquire(self, key: str, weight: int, req: SchedRequest,
                front: bool = False) -> Deferred[Lease]:
        """A lease on the best target now, or a place in ``key``'s FIFO (front for a retry).

        Fails at once with UnknownModel, Unavailable or QueueFull.
        """
        try:
            self._targets(req)
        except (UnknownModel, Unavailable) as e:
            return fail(e)
        w = _Waiter(key, max(1, weight), req)
        w.d = Deferred(lambda _: self._leave(w))
        q = self._queues.setdefault(key, deque())
        if front:
            q.appendleft(w)
        else:
            q.append(w)
        self.waiting += 1
        self.kick()
        w.arriving = False
        if not w.d.called and self.waiting > self.queue_limit:
            self._leave(w)
            return fail(QueueFull())
        return w.d

    def _leave(self, w: _Waiter) -> None:
        q = self._queues.get(w.key)
        if q is not None and w in q:
            q.remove(w)
            self.waiting -= 1

    # --- the fair queue ------------------------------------------------------------------

    def kick(self) -> None:
        """Serve waiters while slots allow: deficit round-robin over keys by weight.

        The key whose turn it is keeps it until it has had as many grants as its weight; a
        key whose head waiter cannot be placed now is passed over without losing its turn.
        """
        if self._kicking:
            return
        self._kicking = True
        try:
            blocked: set[str] = set()
            while self.waiting:
                if not self._grant_one(blocked):
                    break
        finally:
            self._kicking = False

    def _rotation(self) -> list[str]:
        keys = list(self._queues)
        turn = self._turn
        if turn is None or turn not in self._queues:
            return keys
        i = keys.index(turn)
        start = i if self._left > 0 else i + 1
        return keys[start:] + keys[:start]

    def _grant_one(self, blocked: set[str]) -> bool:
        for key in self._rotation():
            q = self._queues[key]
            if not q or key in blocked:
                continue
            w = q[0]
            lease = self._try_place(w)
            if lease is None:
                blocked.add(key)
                continue
            q.popleft()
            self.waiting -= 1
            if key != self._turn or self._left <= 0:
                self._turn, self._left = key, w.weight
            self._left -= 1
            w.d.callback(lease)
            return True
        return False

    # --- placing one request -------------------------------------------------------------

    def _targets(self, req: SchedRequest) -> list[Target]:
        targets = [t for t in self.state.targets_for(req.model) if t.id not in req.exclude
                   and (req.kind is None or t.backend.kind == req.kind)]
        if not targets:
            if not self.state.listed_anywhere(req.model, req.kind):
                raise UnknownModel(req.model)
            raise Unavailable(req.model)
        return targets

    def _try_place(self, w: _Waiter) -> Lease | None:
        try:
            targets = self._targets(w.req)
        except (UnknownModel, Unavailable) as e:
            self._fail_later(w, e)
            return None
        decision, cold = self.decide(w.req, targets)
        if decision.target_id is None or decision.enqueue:
            return None
        target = self.state.targets[decision.target_id]
        target.inflight += 1
        return Lease(self, target, decision, waited=not w.arriving, cold=cold[target.id])

    def _fail_later(self, w: _Waiter, e: Exception) -> None:
        """A waiter whose model no up backend serves any more fails instead of waiting."""
        self._leave(w)
        w.d.errback(e)

    def decide(self, req: SchedRequest, targets: list[Target]) -> tuple[Decision, dict[int, bool]]:
        """The policy's decision over the candidates as they are now (no state changes)."""
        queued = sum(1 for q in self._queues.values() for w in q if w.req.model == req.model)
        cands = []
        cold: dict[int, bool] = {}
        for t in targets:
            c = self.candidate(t, queued)
            cold[t.id] = c.warm is False and not c.loading
            cands.append(c)
        return pick(RouteReq(req.prompt_tokens, req.seed), cands, self.policy), cold

    def candidate(self, t: Target, queued: int, matched_tokens: int = 0) -> Candidate:
        """One target as the policy sees it: occupancy = max(our in-flight, the engine's fresh
        Running); capacity from the engine, else config, else the saturation fallback."""
        v = self.state.view(t)
        engine_running = v.running if v.load_fresh else None
        engine_waiting = v.waiting if v.load_fresh else None
        occupied = max(t.inflight, engine_running or 0)
        capacity = v.capacity or t.backend.spec.capacity
        if capacity is None:
            capacity = self.default_capacity
            saturated = (engine_waiting or 0) > 0 or t.inflight >= capacity
            free = 0 if saturated else capacity - occupied
        else:
            free = capacity - occupied
        warm = {Residency.LOADED: True, Residency.LOADING: True,
                Residency.COLD: False}.get(v.residency)
        loading = v.residency is Residency.LOADING or (
            v.residency is Residency.COLD and t.inflight > 0)
        return Candidate(
            target_id=t.id,
            warm=warm,
            capacity=capacity,
            free_slots=free,
            queue_ahead=queued + (engine_waiting or 0),
            kv_usage=v.kv_usage,
            matched_tokens=matched_tokens,
            prefill_sec_per_token=t.stats.prefill_sec_per_token.value,
            load_sec=t.stats.load_sec.value,
            service_sec=t.stats.service_sec.value,
            fits_if_cold=self._fits_if_cold(t, v.size_bytes) if warm is False else None,
            loading=loading,
            inflight=t.inflight,
        )

    def _fits_if_cold(self, t: Target, size: int | None) -> bool | None:
        """Whether the model fits in the host's memory beside the models that have requests
        in flight (idle loaded models are evictable). Unknown without a size or memory_gb."""
        memory_gb = t.backend.spec.memory_gb
        if size is None or memory_gb is None:
            return None
        busy = 0
        for other in self.state.targets:
            if other.backend is t.backend and other is not t and other.inflight > 0:
                v = self.state.view(other)
                busy += v.vram_bytes or v.size_bytes or 0
        return size <= memory_gb * 1e9 - busy
