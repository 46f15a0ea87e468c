"""Placement memory: what Pharos believes each host holds between its rounds, what loads cost
there, each model's demand, and the holds and prices derived from them (the rules themselves
are ``pharos.placement``'s)."""

from __future__ import annotations

import dataclasses
import math

from pharos.engine.library import LLAMASWAP, OLLAMA
from pharos.engine.signals import Residency
from pharos.placement import (
    KEEP_ALIVE_SEC,
    SLOT_DEMAND_HALF_LIFE_SEC,
    LoadRates,
    ModelDemand,
    ReplicaRule,
    Resident,
    drain_hold,
    horizon,
    reload_price,
    replica_hold,
    replica_needed,
    swap_hold,
    victims,
)
from pharos.policy import Candidate, PolicyConfig
from pharos.sched.lease import Lease
from pharos.sched.peers import PeerLoad
from pharos.sched.queue import WaitQueue
from pharos.sched.request import PASS_LIMIT, Placement, RouteSettings, SchedRequest
from pharos.state.registry import BackendState, Target, View
from pharos.state.state import State


def max_loaded(backend: BackendState) -> int | None:
    """Models the backend's host keeps loaded at once: its config's ``max_loaded_models``,
    else 1 for llama-swap (its default group swaps), else None (memory alone limits it)."""
    limit = backend.spec.max_loaded_models
    if limit is None and backend.kind == LLAMASWAP:
        return 1
    return limit


def names_victims(backend: BackendState) -> bool:
    """Whether Pharos tells the host which idle models a cold load pushes out (``Lease.unload``,
    under the cost policy only): Ollama unloads a model on a request with no prompt and
    ``keep_alive: 0`` (server/routes.go, sched.go ``expireRunner``: its keep-alive becomes 0,
    and a load needing room takes the shortest keep-alive first, ``findRunnerToUnload``)."""
    return backend.kind == OLLAMA


class Hosts:
    """Placement memory, per host (by URL) and per model."""

    def __init__(self, state: State, queue: WaitQueue, peers: PeerLoad) -> None:
        self.state = state
        self.queue = queue
        self.peers = peers
        #: Load rates per host, each model's demand, and the keep-alive (eviction horizon).
        self.load_rates = LoadRates()
        self.demand = ModelDemand()
        #: Each model's slot demand (slot-seconds per second): the slots it keeps busy, for
        #: the replica rule (``placement.replica_hold``).
        self.slot_demand = ModelDemand(SLOT_DEMAND_HALF_LIFE_SEC)
        self.keep_alive_sec = KEEP_ALIVE_SEC
        #: Per host, the model last dispatched there, when, and since when (its swap-in): on a
        #: one-model host, the loaded one until a round says otherwise.
        self.host_model: dict[str, tuple[str, float, float]] = {}
        #: Per host, the idle models cold dispatches there since its last round were priced as
        #: pushing out (``Candidate.victims``), and when the last was: taken as cold until a
        #: round says what is loaded.
        self.host_evicted: dict[str, tuple[frozenset[str], float]] = {}
        #: Targets whose load failed, with their host's full round then (``holds``).
        self.load_failed: dict[int, int] = {}

    def demanded(self, model: str, service_sec: float, waited: float, now: float) -> None:
        """A request for ``model`` dispatched. Its slot demand counts the request's wait in
        Pharos with its service (Little's law over the requests wanting a slot), so it can
        exceed the slots its hosts serve while a queue persists: what the replica rule asks."""
        self.demand.add(model, now)
        self.slot_demand.add(model, now, max(0.0, waited) + service_sec)

    def dispatched(self, lease: Lease, placed: Placement, now: float) -> None:
        """A lease granted on a host that may swap: its model is the one there now, and the
        idle models its load was priced as pushing out are taken as gone (``Lease.unload``
        names them where Pharos chooses)."""
        target = lease.target
        b = target.backend
        hm = self.host_model.get(b.url)
        self.host_model[b.url] = (
            target.model, now, hm[2] if hm is not None and hm[0] == target.model else now)
        he = self.host_evicted.get(b.url)
        gone = (he[0] if he is not None and (b.full_at is None or b.full_at <= he[1])
                else frozenset())  # the earlier ones, while no full round has come since
        if placed.cold[target.id]:
            won = next((c for c in placed.candidates if c.target_id == target.id), None)
            if won is not None:
                gone |= frozenset(won.victims)
                if won.victims and names_victims(b) and lease.policy == "cost":
                    served = {o.model: o.served for o in self.state.targets if o.backend is b}
                    lease.unload = tuple(served[v] for v in won.victims if v in served)
        gone -= {target.model}  # loaded there again
        if gone:
            self.host_evicted[b.url] = (gone, now)
        elif he is not None:
            del self.host_evicted[b.url]

    def failed_load(self, t: Target) -> None:
        """A cold dispatch to ``t`` failed: no load there until its next full round
        (``holds``), and its last model is no longer taken as this one."""
        self.load_failed[t.id] = t.backend.full_round
        hm = self.host_model.get(t.backend.url)
        if hm is not None and hm[0] == t.model:
            del self.host_model[t.backend.url]

    def median_size(self) -> int | None:
        """The median model size the fleet reports (None: none): an unknown size's stand-in."""
        sizes = sorted({t.model: s for t in self.state.targets
                        if (s := self.state.view(t).size_bytes)}.values())
        return sizes[len(sizes) // 2] if sizes else None

    def swapped_out(self, t: Target, v: View, host: tuple[str, float, float]) -> bool:
        """A later dispatch of another model to ``t``'s host, not yet seen by a round, pushed
        ``t``'s model out: one model at a time (llama-swap), or the two do not fit."""
        model, at, _ = host
        b = t.backend
        if b.full_at is not None and b.full_at > at:
            return False  # a round since has said what is loaded
        if max_loaded(b) == 1:
            return True
        memory_gb = b.spec.memory_gb
        if memory_gb is None or v.size_bytes is None:
            return False
        other = next((o for o in self.state.targets_for(model) if o.backend is b), None)
        size = self.state.view(other).size_bytes if other is not None else None
        return size is not None and size + v.size_bytes > memory_gb * 1e9

    def as_cold(self, t: Target, v: View, c: Candidate) -> Candidate:
        """``c`` as a cold candidate: its model was pushed out since the last round."""
        size = v.size_bytes if v.size_bytes is not None else self.median_size()
        load_sec, basis = self.load_estimate(t, size)
        return dataclasses.replace(
            c, warm=False, loading=False, fits_if_cold=self.fits_if_cold(t, size),
            load_sec=load_sec, load_basis=basis)

    def holds(self, req: SchedRequest, cands: list[Candidate], cold: dict[int, bool],
              now: float, waited: float, routing: RouteSettings) -> list[Candidate]:
        """Placement's holds (``Candidate.held``): a failed load waits for the host's next
        full round, a draining host takes no other model (``drains``), and the replica and
        swap holds of ``pharos.placement``."""
        rule, targets = routing.guards.placement, self.state.targets
        drains = self.drains(now, rule) if self.queue.model_waiters else {}
        if not drains and not any(cold.values()):
            return cands  # nothing to load and no host draining: no hold applies
        out: list[Candidate] = []
        for c in cands:
            t = targets[c.target_id]
            note = None
            if cold[c.target_id] and self.load_failed.get(t.id) == t.backend.full_round:
                note = "load failed here this round (tried again after the next round)"
            elif ((d := drains.get(t.backend.url)) is not None and d[0] != req.model
                  and not self.in_batch(t.backend.url, req.model, now - waited)):
                note = drain_hold(rule, *d)
            out.append(dataclasses.replace(c, held=note) if note else c)
        warm = [c for c in out if not cold[c.target_id] and c.held is None]
        loads = [c for c in out if cold[c.target_id] and c.held is None
                 and c.fits_if_cold is not False]
        if not loads:
            return out
        note = None
        held: dict[int, str] = {}
        if warm:
            demand = self.slot_demand.rate(req.model, now)
            slots = sum(c.capacity for c in warm)
            needed = replica_needed(rule, demand, slots)
            if needed is not None:
                # A queue for the warm hosts would only grow: a request finding them full
                # loads a copy (wherever the cost says, eviction priced).
                held = {c.target_id: needed for c in warm if c.free_slots <= 0}
            else:
                service = routing.policy.service_sec_default
                warm_wait = min(c.queued_prefill_sec + (
                    0.0 if c.free_slots > 0 else
                    (c.queue_ahead + 1) / c.capacity * (c.service_sec or service))
                    for c in warm)
                load_cost = min((c.load_sec or routing.policy.load_sec_default) + c.reload_sec
                                for c in loads)
                note = replica_hold(rule, demand, slots, warm_wait, load_cost, waited)
        for c in loads:
            if note is not None:
                held[c.target_id] = note
                continue
            url = targets[c.target_id].backend.url
            for victim in c.victims:
                n = self.queue.waiting_models.get(victim, 0) + (
                    self.peers.waiting(victim) if self.peers.peers else 0)
                waiters = self.queue.model_waiters.get(victim)
                batch = bool(waiters) and self.in_batch(
                    url, victim, next(iter(waiters.values())) if waiters else now)
                swap = swap_hold(rule, victim, n, waited, batch)
                if swap is not None:
                    held[c.target_id] = swap
                    break
        if not held:
            return out
        return [dataclasses.replace(c, held=held[c.target_id]) if c.target_id in held else c
                for c in out]

    def in_batch(self, url: str, model: str, queued_at: float) -> bool:
        """A request for ``model`` that queued at ``queued_at`` is in the batch of the host's
        loaded model (it queued before the swap): past the wait bound, the batch keeps the
        host, so swaps stay grouped under overload."""
        hm = self.host_model.get(url)
        return hm is not None and hm[0] == model and queued_at <= hm[2]

    def drains(self, now: float, rule: ReplicaRule) -> dict[str, tuple[str, float]]:
        """Hosts draining for a swap: per model whose oldest waiter (its key's head, or within
        swap grouping's reach) has waited past the bound with no host to load on now, the
        host with the fewest requests in flight (then the lowest target id), with that model
        and the wait; the longest waiting first."""
        bound = rule.wait_bound_sec
        reach = PASS_LIMIT if rule.swap_grouping else 0
        out: dict[str, tuple[str, float]] = {}
        starving = []
        for other, waiters in self.queue.model_waiters.items():
            oldest, since = next(iter(waiters.items()))
            if now - since >= bound:
                starving.append((since, other, oldest))
        for since, other, oldest in sorted(starving, key=lambda x: x[0]):
            waited = now - since
            ahead = self.queue.fair.position(oldest)
            if ahead is None or ahead > reach:
                continue  # behind its own key's head: not placeable, so nothing to drain for
            best: tuple[int, int, str] | None = None
            for t in self.state.targets_for(other):
                v = self.state.view_at(t, now)
                hm = self.host_model.get(t.backend.url)
                if t.inflight or (v.residency in (Residency.LOADED, Residency.LOADING) and not (
                        hm is not None and hm[0] != t.model and self.swapped_out(t, v, hm))):
                    best = None
                    break  # warm somewhere: it waits for a slot, not for a swap
                busy = sum(o.inflight for o in self.state.targets if o.backend is t.backend)
                if best is None or (busy, t.id) < best[:2]:
                    best = (busy, t.id, t.backend.url)
            if best is not None and best[2] not in out:
                out[best[2]] = (other, waited)
        return out

    def learn_load(self, t: Target, load_sec: float | None) -> None:
        """A measured load (``load_sample``) teaches the host's bytes per second."""
        if load_sec is not None:
            self.load_rates.learn(t.backend.url, self.state.view(t).size_bytes, load_sec)

    def load_estimate(self, t: Target, size: int | None) -> tuple[float | None, str | None]:
        """The target's load seconds, learned or from its model's size (``LoadRates``), with
        the estimate's basis; (None, None) when neither is known."""
        learned = t.stats.load_sec.value
        if learned is not None:
            return learned, None
        est = self.load_rates.estimate(t.backend.url, size)
        if est is None:
            return None, None
        return est[0], f"load_sec=size/{est[1]}"

    def priced(self, c: Candidate, now: float, policy: PolicyConfig, name: bool = True
               ) -> Candidate:
        """A cold candidate with its eviction price: the idle models its load would push out
        (``placement.victims``; nothing priced without a size or ``memory_gb``) and the
        reloads their recent demand makes likely (``placement.reload_price``). Models already
        priced as pushed out since the host's last full round (``host_evicted``) are not
        counted: the round still lists them, but they are gone."""
        if c.fits_if_cold is False:
            return c  # set aside: the load waits for a model to go idle
        t = self.state.targets[c.target_id]
        memory_gb = t.backend.spec.memory_gb
        size = self.state.view_at(t, now).size_bytes
        if size is None:
            size = self.median_size()
        limit = max_loaded(t.backend)
        if limit is None and (memory_gb is None or size is None):
            return c
        hm = self.host_model.get(t.backend.url)
        he = self.host_evicted.get(t.backend.url)
        gone = (he[0] if he is not None and (t.backend.full_at is None
                                             or t.backend.full_at <= he[1]) else frozenset())
        resident: list[Resident] = []
        by_model: dict[str, Target] = {}
        for o in self.state.targets:
            if o.backend is not t.backend or o is t:
                continue
            ov = self.state.view_at(o, now)
            inflight = o.inflight + (self.peers.inflight(o.id) if self.peers.peers else 0)
            if ov.residency not in (Residency.LOADED, Residency.LOADING) and not inflight:
                continue
            if not inflight and o.model in gone:
                continue  # pushed out by a load since the round that lists it: not there
            by_model[o.model] = o
            resident.append(Resident(
                o.model, ov.vram_bytes or ov.size_bytes or 0,
                idle=not inflight and ov.residency is Residency.LOADED,
                last_used=(o.last_release_at if o.last_release_at is not None
                           else -math.inf)))
        if hm is not None and hm[0] != t.model and hm[0] not in by_model and (
                t.backend.full_at is None or t.backend.full_at <= hm[1]):
            # Dispatched there since the last round: loaded, whatever the round said.
            h = next((o for o in self.state.targets_for(hm[0]) if o.backend is t.backend), None)
            if h is not None:
                hv = self.state.view_at(h, now)
                by_model[h.model] = h
                resident.append(Resident(h.model, hv.vram_bytes or hv.size_bytes or 0,
                                         idle=not h.inflight, last_used=hm[1]))
        reach = horizon(self.keep_alive_sec)
        fallback = policy.load_sec_default

        def price_of(r: Resident) -> float:
            o = by_model[r.model]
            load = self.load_estimate(o, self.state.view_at(o, now).size_bytes)[0]
            return reload_price(self.demand.rate(r.model, now),
                                load if load is not None else fallback, reach)

        named = name and names_victims(t.backend)
        if named:
            resident = [dataclasses.replace(r, price=price_of(r)) if r.idle else r
                        for r in resident]
        out: list[Resident] | None = []
        rest = resident
        if limit is not None and (over := len(resident) - limit + 1) > 0:
            # At its limit of loaded models: idle ones go (the cheapest when Pharos names
            # them, else the least recently used).
            idle = sorted((r for r in resident if r.idle),
                          key=(lambda r: (r.price, r.last_used)) if named
                          else (lambda r: r.last_used))
            out = idle[:over] if len(idle) >= over else None
            rest = [r for r in resident if out is None or r not in out]
        if out is not None and memory_gb is not None and size is not None:
            more = victims(size, memory_gb * 1e9, rest, named)
            out = None if more is None else out + more
        if not out:
            return c
        price = sum(r.price if named else price_of(r) for r in out)
        return dataclasses.replace(c, reload_sec=price, victims=tuple(r.model for r in out))

    def fits_if_cold(self, t: Target, size: int | None) -> bool | None:
        """Whether the model fits in the host's memory beside the models that have requests
        in flight (idle loaded models are evictable). Unknown without a size or memory_gb."""
        memory_gb = t.backend.spec.memory_gb
        limit = max_loaded(t.backend)
        if limit is not None:  # not beside as many busy models as the host holds
            busy_models = sum(1 for o in self.state.targets
                              if o.backend is t.backend and o is not t and o.inflight > 0)
            if busy_models >= limit:
                return False
            if size is None or memory_gb is None:
                return True
        if size is None or memory_gb is None:
            return None
        busy = 0
        for other in self.state.targets:
            if other.backend is t.backend and other is not t and other.inflight > 0:
                v = self.state.view(other)
                busy += v.vram_bytes or v.size_bytes or 0
        return size <= memory_gb * 1e9 - busy
