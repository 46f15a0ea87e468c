"""The scheduler: its parts composed, and the decision that runs through them. Picking a
target and taking a slot on it is one synchronous step, so two requests never both see one
slot as free."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Callable

from twisted.internet.defer import Deferred, fail

from pharos import policy, reasons
from pharos.config import DEFAULT_TENANT
from pharos.policy import Candidate, PolicyConfig, RouteReq, pick
from pharos.prefix import BYTES_PER_TOKEN, PrefixIndex, PrefixOp
from pharos.sched.candidates import Candidates
from pharos.sched.hosts import Hosts, max_loaded
from pharos.sched.learning import Learning, release_sec
from pharos.sched.lease import Lease
from pharos.sched.peers import PeerLoad
from pharos.sched.queue import Waiter, WaitQueue
from pharos.sched.request import (
    DEFAULT_CAPACITY,
    QUEUE_LIMIT,
    Guards,
    Placement,
    RouteSettings,
    SchedRequest,
    Selection,
    Unavailable,
    UnknownModel,
)
from pharos.state.registry import BackendState, Target
from pharos.state.state import State
from pharos.state.stats import Sample, load_sample

#: The decisions the scheduler hands out are worded (``Decision.reason``) by ``pharos.reasons``.
reasons.install(policy)


class Scheduler:
    """Admission and the fair queue over the state's targets, composed of its parts: ``queue``,
    ``cands``, ``hosts``, ``learning`` and ``gauges``. ``routing`` is read afresh by every
    decision. ``on_route`` is told of every decision that placed a request (shadow policies,
    ``pharos.shadow``: it must return at once); ``on_prefix`` of every prefix record,
    correction and dispatch, for the peers."""

    def __init__(
        self,
        state: State,
        routing: RouteSettings,
        *,
        queue_limit: int = QUEUE_LIMIT,
        default_capacity: int = DEFAULT_CAPACITY,
        seed: Callable[[], int] = lambda: random.getrandbits(63),
        index: PrefixIndex | None = None,
        on_route: Callable[[SchedRequest, Placement], None] | None = None,
        on_prefix: Callable[[PrefixOp], None] | None = None,
    ) -> None:
        self.state = state
        self.routing = routing
        self.seed = seed
        self.on_route = on_route
        self.queue = WaitQueue(state, self, queue_limit)
        self.learning = Learning(state, index if index is not None else PrefixIndex(),
                                 on_prefix)
        self.gauges = PeerLoad(state, self.learning, self.queue, self.kick)
        self.hosts = Hosts(state, self.queue, self.gauges)
        self.cands = Candidates(state, self.hosts, default_capacity, routing.model_costs)
        # The parts' state and methods the rest of Pharos reads and calls.
        learning = self.learning
        self.index, self.roots, self.hot = learning.index, learning.roots, learning.hot
        self.sessions, self.outcomes = learning.sessions, learning.outcomes
        self.predictions, self.unfollowed = learning.predictions, learning.unfollowed
        self.leases, self.peers = self.queue.leases, self.gauges.peers
        g = self.gauges
        self.export_gauges, self.merge_gauges, self.forget = g.export, g.merge, g.forget
        self.peer_inflight, self.peer_waiting, self.target_id = g.inflight, g.waiting, g.target_id
        self.merge_prefix, self.capacity_of = g.merge_prefix, learning.capacity_of
        #: Placement decisions run for waiters (``place``).
        self.decisions = 0
        #: Requests routed per model: round robin's turn (``RouteReq.seq``).
        self.turns: Counter[str] = Counter()

    @property
    def policy(self) -> PolicyConfig:
        """The scheduler's policy (``routing.policy``)."""
        return self.routing.policy

    @property
    def guards(self) -> Guards:
        """The scheduler's guards (``routing.guards``)."""
        return self.routing.guards

    def reconfigure(self, routing: RouteSettings) -> None:
        """A reload's routing settings, from the next decision; kept candidates are dropped."""
        self.routing = routing
        self.cands.invalidate(self.cands.default_capacity, routing.model_costs)

    @property
    def default_capacity(self) -> int:
        """Slots of a target whose engine, config and learning say nothing."""
        return self.cands.default_capacity

    @default_capacity.setter
    def default_capacity(self, value: int) -> None:
        self.cands.invalidate(value, self.routing.model_costs)

    # --- admission -----------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """Requests in the fair queue now."""
        return self.queue.fair.waiting

    def acquire(self, key: str, weight: int, req: SchedRequest, front: bool = False, *,
                tenant: str = DEFAULT_TENANT, tenant_weight: int = 1) -> Deferred[Lease]:
        """A lease on the best target now, or a place in the fair queue under ``tenant`` and
        ``key`` (at the front of its key's FIFO for a retry). Fails at once with UnknownModel,
        Unavailable or QueueFull."""
        try:
            self.targets(req)
        except (UnknownModel, Unavailable) as e:
            return fail(e)
        return self.queue.acquire(key, weight, req, front, tenant, tenant_weight)

    def stuck_for(self, now: float) -> float | None:
        """``WaitQueue.stuck_for``."""
        return self.queue.stuck_for(now)

    def kick(self) -> None:
        """Something may have freed a slot (a release, a scrape round, peers' gauges): serve
        waiters in the fair queue's order; a key whose head waiter cannot be placed now is
        passed over without losing its place."""
        self.cands.full.clear()
        self.queue.serve()

    def passing(self) -> bool:
        """Swap grouping is on, under the cost policy (``WaitQueue.serve``)."""
        routing = self.routing
        return routing.guards.placement.swap_grouping and routing.policy.name == "cost"

    def targets(self, req: SchedRequest) -> list[Target]:
        """The up targets the request may go to; raises UnknownModel or Unavailable."""
        up = self.state.targets_for(req.model)
        exclude, kind = req.exclude, req.kind
        targets = (list(up) if not exclude and kind is None else
                   [t for t in up if t.id not in exclude
                    and (kind is None or t.backend.kind == kind)])
        if not targets:
            if not self.state.listed_anywhere(req.model, req.kind):
                raise UnknownModel(req.model)
            raise Unavailable(req.model)
        return targets

    # --- placing one request -------------------------------------------------------------

    def place(self, w: Waiter) -> Lease | None:
        """A lease for the waiter now, or None (it waits, or fails with no up backend)."""
        req = w.req
        sel: Selection = (req.model, req.kind, req.exclude)
        cands = self.cands
        full = cands.full.get(sel)
        if full is not None:
            now = self.state.clock.seconds()
            if (full[0] == BackendState.changes and now < full[1]
                    and (not self.peers or now < self.gauges.until)):
                for t in full[2]:
                    t.pressed = True  # as the decision would have marked them
                return None
            del cands.full[sel]
        queue = self.queue
        try:
            targets = self.targets(req)
        except (UnknownModel, Unavailable) as e:
            queue.fail(w, e)
            return None
        self.decisions += 1
        placed = self.decide(req, targets, self.state.clock.seconds() - w.queued_at)
        free = False
        for c in placed.candidates:
            if c.free_slots <= 0:
                # A request found it full: a reason to try one more there (``learn_capacity``).
                self.state.targets[c.target_id].pressed = True
            else:
                free = True
        decision = placed.decision
        if decision.target_id is None or decision.enqueue:
            if not free:
                cands.remember_full(sel, targets)
            return None
        shares = queue.shares
        free_slots = sum(max(0, c.free_slots) for c in placed.candidates)
        capacity = sum(c.capacity for c in placed.candidates)
        if free_slots <= shares.room_limit(capacity) and shares.must_leave_room(
                w.key, w.weight, free_slots, capacity, self.state.clock.seconds(),
                release_sec(placed.candidates)):
            return None
        target = self.state.targets[decision.target_id]
        whole = placed  # the decision over every target (pacing may take one over fewer)
        if target.unstarted_streams:
            paced = queue.pace(w, req, targets, placed, target)
            if paced is None:
                return None
            placed, target = paced
            decision = placed.decision
        target.inflight += 1
        if queue.fair.waiting > 1 and placed is whole and all(
                c.free_slots <= 0 or (c.target_id == target.id and c.free_slots == 1
                                      and c.capacity - 1 <= c.inflight)
                for c in placed.candidates):
            # It took the set's last free slot (counted from our requests, not the engine's):
            # the next waiter of the set need not be decided.
            cands.remember_full(sel, targets)
        shares.started(w.key)
        self.turns[req.model] += 1
        match = placed.matches.get(target.id)
        terms = decision.target_terms
        assert terms is not None
        routing = self.routing
        lease = Lease(self, self.state.clock, target, decision, waited=not w.arriving,
                      cold=placed.cold[target.id], key=w.key, chain=req.chain,
                      predicted_tokens=min(match.tokens, req.prompt_tokens) if match else 0,
                      source=match.source if match else None, est_ttft=terms[1],
                      prefill_sec=terms[3] + terms[4],
                      policy=(req.policy or routing.policy).name)
        now = self.state.clock.seconds()
        queue.granted(lease, req, now)
        b = target.backend
        if b.spec.memory_gb is not None or max_loaded(b) is not None:  # a host that may swap
            self.hosts.dispatched(lease, placed, now)
        self.hosts.demanded(req.model, target.stats.service_sec.value
                            or routing.policy.service_sec_default, now - w.queued_at, now)
        lease.root_ahead = self.learning.dispatched(req, target, now, routing)
        if self.on_route is not None:
            self.on_route(req, placed)
        return lease

    def decide(self, req: SchedRequest, targets: list[Target], waited: float = 0.0
               ) -> Placement:
        """The policy's decision over the candidates now (no state changes); ``waited``: how
        long the request has queued."""
        routing = self.routing
        policy, guards = routing.policy, routing.guards
        queue, gauges, learning = self.queue, self.gauges, self.learning
        queued = queue.waiting_models.get(req.model, 0)
        if gauges.peers:
            gauges.refresh()
            queued += gauges.waiting_sums.get(req.model, 0)
        matches = learning.index.lookup(req.chain, learning.gen) if req.chain else {}
        stale = learning.evicted_since(req, matches, guards) if matches else ()
        held: list[int] = []  # the candidates the index predicts hold the root
        now = self.state.clock.seconds()
        cands, cold, has_cold = self.cands.assemble(
            targets, req.model, req.kind, not req.exclude, queued, now,
            gauges.inflight_sums if gauges.peers else None, matches, stale,
            req.chain.ends[0] if req.chain else 0, held)
        owners = learning.hot_owners(req, cands, held, guards)
        if owners:
            root_tokens = req.chain.ends[0] // BYTES_PER_TOKEN
            cands = [dataclasses.replace(c, matched_tokens=root_tokens)
                     if c.target_id in owners else c for c in cands]
        if req.chain and guards.eviction_pricing and len(cands) > 1:
            evict = learning.evictions(req, cands, matches, owners)
            if evict:
                cands = [dataclasses.replace(c, evict_tokens=evict[c.target_id])
                         if c.target_id in evict else c for c in cands]
        if has_cold:
            name = (req.policy or policy).name == "cost"  # the baselines: the host's
            priced = self.hosts.priced
            cands = [priced(c, now, policy, name) if cold[c.target_id] else c for c in cands]
        if policy.name == "cost" and (has_cold or queue.model_waiters):
            cands = self.hosts.holds(req, cands, cold, now, waited, routing)
        affinity = None
        if req.session is not None and policy.session_affinity:
            affinity = learning.sessions.get(req.session)
        route = RouteReq(req.prompt_tokens, req.seed, affinity, self.turns.get(req.model, 0),
                         req.chain.keys[0] if req.chain else None)
        decision = pick(route, cands, req.policy or policy)
        return Placement(decision, tuple(cands), cold, matches, owners, affinity, route)

    def candidate(self, t: Target, queued: int, matched_tokens: int = 0) -> Candidate:
        """One target as the policy sees it, with live peers' requests in flight."""
        inflight = t.inflight + self.gauges.inflight(t.id) if self.peers else t.inflight
        return self.cands.candidate(t, inflight, queued, matched_tokens)

    # --- a lease's owner (``LeaseOwner``) --------------------------------------------------

    def root_ended(self, tid: int, root: int) -> int:
        """``WaitQueue.root_ended``."""
        return self.queue.root_ended(tid, root)

    def started(self, lease: Lease) -> None:
        """The first byte of a reply: unqueue its prefill, teach the index (``first_byte``)."""
        self.queue.unqueue(lease)
        self.learning.first_byte(lease)
        # Its prefill is off the queue, but no slot is free: target sets found full stay so.
        self.queue.serve()

    def released(self, lease: Lease, sample: Sample | None) -> None:
        """A lease given back: learn from its reply, then run the next waiter."""
        now = self.state.clock.seconds()
        self.queue.ended(lease, now)
        t = lease.target
        if sample is not None and not sample.ok and lease.cold and not sample.control:
            self.hosts.failed_load(t)
        if sample is not None:
            load = load_sample(t.stats, sample)  # before feedback moves the prefill speed
            self.state.feedback(t, sample)
            self.hosts.learn_load(t, load)
            self.learning.learn(lease, sample)
        else:
            t.last_release_at = now
        self.kick()

    def learn_capacity(self, backend: BackendState) -> None:
        """After a scrape round (``Learning.learn_capacity``)."""
        self.learning.learn_capacity(backend, self.cands.default_capacity)

    def merge_dispatched(self, ops: list[PrefixOp], now: float) -> int:
        """``Peers.merge_dispatched``, under the routing settings in force."""
        return self.gauges.merge_dispatched(ops, now, self.routing)
