"""The wait queue: the fair queue's waiters (``pharos.fairq``), the leases granted from it,
and the KV a lease takes on its target. Every freed slot (and scrape round) re-runs the next
waiters through the scheduler's placement (``Placer``)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IDelayedCall

from pharos.config import DEFAULT_TENANT
from pharos.fairq import FairQueue, Shares
from pharos.prefix import BYTES_PER_TOKEN
from pharos.sched.lease import Lease
from pharos.sched.request import PACE_MAX_SEC, PASS_LIMIT, Placement, QueueFull, SchedRequest
from pharos.state.registry import Target
from pharos.state.state import State

#: The fair queue's cost of a request (``request_cost``), in decode tokens: this many prompt
#: tokens cost one (assumed: batched prefill runs about ten tokens in a decode step's time); an
#: output limit counts at most ``MAX_COST_OUTPUT_TOKENS`` and, unset, ``DEFAULT_OUTPUT_TOKENS``.
PREFILL_TOKENS_PER_DECODE_TOKEN = 10
MAX_COST_OUTPUT_TOKENS = 4096
DEFAULT_OUTPUT_TOKENS = 256


def request_cost(req: SchedRequest) -> float:
    """A request's work for the fair queue, in decode tokens: its output plus its prompt."""
    out = req.output_tokens
    output = DEFAULT_OUTPUT_TOKENS if out is None else min(out, MAX_COST_OUTPUT_TOKENS)
    return 1.0 + output + req.prompt_tokens / PREFILL_TOKENS_PER_DECODE_TOKEN


@dataclass(eq=False)
class Waiter:
    key: str
    weight: int
    req: SchedRequest
    tenant: str = DEFAULT_TENANT
    tenant_weight: int = 1
    cost: float = 1.0  # the fair queue's charge (``request_cost``)
    queued_at: float = 0.0  # when it joined the queue (placement's wait bound)
    d: Deferred[Lease] = field(default_factory=Deferred)
    arriving: bool = True  # still inside acquire: a grant now did not wait


class Placer(Protocol):
    """What the queue asks of the scheduler."""

    def place(self, w: Waiter) -> Lease | None:
        """A lease for the waiter now, or None (it waits)."""

    def decide(self, req: SchedRequest, targets: list[Target], waited: float = 0.0
               ) -> Placement:
        """The policy's decision over ``targets`` as they are now."""

    def passing(self) -> bool:
        """A waiter of another model may pass a key's blocked head (swap grouping)."""

    def kick(self) -> None:
        """Something may have freed a slot."""


class WaitQueue:
    """The waiters, by key in the fair queue and by model, and the leases granted."""

    def __init__(self, state: State, placer: Placer, limit: int) -> None:
        self.state = state
        self.placer = placer
        self.limit = limit
        self.fair: FairQueue[Waiter] = FairQueue()
        self.shares = Shares()
        #: Waiters by model with when each queued (oldest first): the wait bound's clock.
        self.model_waiters: dict[str, dict[Waiter, float]] = {}
        self.waiting_models: Counter[str] = Counter()  # waiters by model (the policy's queued)
        self._serving = False
        #: Grants held back by pacing, and the call that retries them if no first byte comes.
        self.paced = 0
        self._pace_call: IDelayedCall | None = None
        #: Leases held now, for the watchdog; when a request last started or a lease came
        #: back (a queue with neither for long is wedged: /healthz).
        self.leases: set[Lease] = set()
        self.granted_at: float | None = None
        self.released_at: float | None = None
        self.waiting_since: float | None = None
        #: Leases the watchdog found stuck (held past the drain timeout, no byte moving).
        self.stuck = 0
        #: Leases in flight by (target, root prefix): the root's blocks are counted once.
        self.roots_inflight: Counter[tuple[int, int]] = Counter()
        #: The root tokens the first of them was charged, given back when the last one ends.
        self.root_charge: dict[tuple[int, int], int] = {}

    @property
    def waiting(self) -> int:
        """Requests in the fair queue now."""
        return self.fair.waiting

    def acquire(self, key: str, weight: int, req: SchedRequest, front: bool, tenant: str,
                tenant_weight: int) -> Deferred[Lease]:
        """A lease now, or a place in the fair queue (see ``Scheduler.acquire``)."""
        now = self.state.clock.seconds()
        w = Waiter(key, max(1, weight), req, tenant, max(1, tenant_weight), request_cost(req),
                   queued_at=now)
        self.shares.seen(key, w.weight, now, w.tenant, w.tenant_weight)
        w.d = Deferred(lambda _: self.leave(w))
        if not self.waiting:
            self.waiting_since = now
        self.fair.push(w, front)
        self.waiting_models[req.model] += 1
        self.model_waiters.setdefault(req.model, {})[w] = w.queued_at
        self.serve()  # an arrival frees no slot: target sets found full stay so
        w.arriving = False
        if not w.d.called and self.waiting > self.limit:
            self.leave(w)
            return fail(QueueFull())
        return w.d

    def stuck_for(self, now: float) -> float | None:
        """How long requests have waited with no request starting and no lease given back;
        None while nothing waits."""
        if not self.waiting:
            return None
        last = max(x for x in (self.granted_at, self.released_at, self.waiting_since)
                   if x is not None)
        return now - last

    def leave(self, w: Waiter) -> None:
        if self.fair.remove(w):
            self._unwait(w)

    def fail(self, w: Waiter, e: Exception) -> None:
        """A waiter whose model no up backend serves any more fails instead of waiting."""
        self.leave(w)
        w.d.errback(e)

    def _unwait(self, w: Waiter) -> None:
        waiters = self.model_waiters.get(w.req.model)
        if waiters is not None:
            waiters.pop(w, None)
            if not waiters:
                del self.model_waiters[w.req.model]
        n = self.waiting_models[w.req.model] - 1
        if n:
            self.waiting_models[w.req.model] = n
        else:
            del self.waiting_models[w.req.model]

    # --- serving the fair queue ----------------------------------------------------------

    def serve(self) -> None:
        """Serve waiters while slots allow (``Scheduler.kick``)."""
        if self._serving:
            return
        self._serving = True
        try:
            blocked: set[str] = set()
            while self.waiting:
                if not self._grant_one(blocked):
                    break
        finally:
            self._serving = False

    def _grant_one(self, blocked: set[str]) -> bool:
        place = self.placer.place
        for w in self.fair.heads():
            if w.key in blocked:
                continue
            lease = place(w)
            if lease is None:
                lease, w = self._pass(w)
                if lease is None:
                    blocked.add(w.key)
                    continue
            self.fair.served(w)
            self._unwait(w)
            w.d.callback(lease)
            return True
        return False

    def _pass(self, head: Waiter) -> tuple[Lease | None, Waiter]:
        """Swap grouping: a key whose head cannot be placed (its model cold where the loaded
        model is busy, or its swap held) lets a later waiter of another model go first, so
        the loaded model's queued requests are served before a swap; the head keeps its
        place, and the wait bound (``placement.drain_hold``) bounds its wait."""
        if len(self.model_waiters) < 2 or not self.placer.passing():
            return None, head  # (every waiter is of the head's model: none may pass it)
        tried: set[str] = {head.req.model}
        for w in self.fair.behind(head, PASS_LIMIT):
            if w.req.model in tried:
                continue
            tried.add(w.req.model)
            lease = self.placer.place(w)
            if lease is not None:
                return lease, w
        return None, head

    def pace(self, w: Waiter, req: SchedRequest, targets: list[Target], placed: Placement,
             target: Target) -> tuple[Placement, Target] | None:
        """Pacing: a key over its share, while a key under its share is active, sends a
        target no prefill while the prefills already sent there have not started. A
        vLLM-like engine runs the prompts joining a step with its decodes, so each prefill a
        flooding key adds to a step delays the light key's requests; one at a time per target
        bounds that to one prompt (the light key's own unstarted request holds its target
        too). Streamed requests only: their first byte says their prefill ended. The request
        goes to the best target not held, or waits (at most ``PACE_MAX_SEC``): None."""
        now = self.state.clock.seconds()
        if now >= target.pace_until or not self.shares.over_share(
                w.key, sum(c.capacity for c in placed.candidates), now):
            return placed, target
        self.paced += 1
        ts = self.state.targets
        held = frozenset(c.target_id for c in placed.candidates
                         if ts[c.target_id].unstarted_streams
                         and now < ts[c.target_id].pace_until)
        if len(held) < len(targets):
            other = self.placer.decide(dataclasses.replace(req, exclude=req.exclude | held),
                                       [t for t in targets if t.id not in held],
                                       now - w.queued_at)
            d = other.decision
            if d.target_id is not None and not d.enqueue:
                return other, ts[d.target_id]
        until = min(ts[i].pace_until for i in held)
        call = self._pace_call
        if call is None or not call.active() or call.getTime() > until:
            if call is not None and call.active():
                call.cancel()
            self._pace_call = self.state.clock.callLater(until - now, self.placer.kick)
        return None

    # --- leases --------------------------------------------------------------------------

    def granted(self, lease: Lease, req: SchedRequest, now: float) -> None:
        """A lease given: its prefill queued on its target, its KV counted there."""
        target = lease.target
        target.queued_prefill += lease.prefill_sec
        if req.stream:
            lease.stream = True
            target.unstarted_streams += 1
            target.pace_until = now + PACE_MAX_SEC
        target.unstarted += 1
        lease.kv_tokens, lease.kv_root = self._kv_tokens(req, target.id, lease.predicted_tokens)
        target.kv_sent_tokens += lease.kv_tokens
        target.kv_unstarted_tokens += lease.kv_tokens
        lease.granted_at = self.granted_at = now
        self.leases.add(lease)

    def _kv_tokens(self, req: SchedRequest, tid: int, predicted: int) -> tuple[int, int]:
        """The KV a prompt takes on its target that the engine's last usage does not show, and
        its root's part: all its tokens, less its predicted cached ones when another request
        in flight there has the same root. vLLM's usage counts running requests' blocks: a
        cached prefix none holds is free there, and held once this prompt runs."""
        tokens = max(0, req.prompt_tokens)
        if not req.chain:
            return tokens, 0
        key = (tid, req.chain.keys[0])
        held = self.roots_inflight[key] > 0
        self.roots_inflight[key] += 1
        if held:
            return max(0, req.prompt_tokens - predicted), 0
        root = min(tokens, req.chain.ends[0] // BYTES_PER_TOKEN)
        self.root_charge[key] = root
        return tokens, root

    def root_ended(self, tid: int, root: int) -> int:
        """A lease with this root on this target ended: the root's charge if it was the last."""
        key = (tid, root)
        n = self.roots_inflight[key] - 1
        if n > 0:
            self.roots_inflight[key] = n
            return 0
        self.roots_inflight.pop(key, None)
        return self.root_charge.pop(key, 0)

    def unqueue(self, lease: Lease) -> None:
        """The lease's prefill is done (or abandoned): off its target's queue."""
        t = lease.target
        t.unstarted -= 1
        if lease.stream:
            t.unstarted_streams -= 1
        t.queued_prefill = t.queued_prefill - lease.prefill_sec if t.unstarted > 0 else 0.0
        t.kv_unstarted_tokens = (max(0, t.kv_unstarted_tokens - lease.kv_tokens)
                                 if t.unstarted > 0 else 0)

    def ended(self, lease: Lease, now: float) -> None:
        """A lease given back: off its key's share, the watchdog's set and (no first byte
        yet) its target's queue."""
        self.shares.ended(lease.key)
        self.leases.discard(lease)
        self.released_at = now
        if not lease.started:
            lease.started = True
            self.unqueue(lease)
