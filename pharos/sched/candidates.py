"""The candidates a decision chooses among, and the one cache that keeps them between
decisions (``kept``, ``matched``, ``fleets``, ``full``), each entry with what it stays current
for; ``invalidate`` empties them all at once (a reload, a new default capacity)."""

from __future__ import annotations

import math
from collections.abc import Container, Mapping
from dataclasses import dataclass

from pharos.engine.signals import Residency
from pharos.policy import Candidate
from pharos.prefix import BYTES_PER_TOKEN, Match
from pharos.sched.hosts import Hosts
from pharos.sched.request import (
    FLEET_MIN_TARGETS,
    MAX_PLAUSIBLE_CAPACITY,
    QUEUE_ROUNDS,
    Selection,
)
from pharos.state.registry import BackendState, Target, View, new_stamp
from pharos.state.state import CachedView, State

#: ``Candidate.warm`` by residency (unknown: None).
_WARM: dict[Residency, bool] = {Residency.LOADED: True, Residency.LOADING: True,
                                Residency.COLD: False}


def with_match(c: Candidate, matched_tokens: int, holds_root: bool = False) -> Candidate:
    """``c`` with ``matched_tokens`` (``dataclasses.replace`` spelled out, being slow; a test
    checks every field is copied). ``holds_root``: the match covers the prompt's root; such a
    target full at a ``Candidate.capacity_open`` capacity gets a slot while nothing queues."""
    free = c.free_slots
    if holds_root and free <= 0 and c.capacity_open and c.queue_ahead <= 1:
        free = 1  # (the request itself is the one waiter counted)
    return Candidate(
        target_id=c.target_id, warm=c.warm, capacity=c.capacity, free_slots=free,
        queue_ahead=c.queue_ahead, kv_usage=c.kv_usage, matched_tokens=matched_tokens,
        prefill_sec_per_token=c.prefill_sec_per_token, load_sec=c.load_sec,
        service_sec=c.service_sec, fits_if_cold=c.fits_if_cold, loading=c.loading,
        inflight=c.inflight, queued_prefill_sec=c.queued_prefill_sec,
        evict_tokens=c.evict_tokens, kv_free_tokens=c.kv_free_tokens,
        reload_sec=c.reload_sec, victims=c.victims, load_basis=c.load_basis,
        held=c.held, prefill_model=c.prefill_model, capacity_open=c.capacity_open)


@dataclass(slots=True, eq=False)
class KeptCandidates:
    """The last full decision's unmatched candidates over one list of targets, current while
    the clock is in ``[lo, hi)`` with the same waiters ahead and peers' sums: a decision
    rebuilds only the targets written since ``stamp`` (under load, one or two) and those in
    ``recheck`` (a cold model; a view that read ``replied_at``, which takes no stamp)."""

    targets: list[Target]
    base: list[Candidate]
    cold: dict[int, bool]
    colds: int
    recheck: set[int]
    stamp: int
    queued: int
    peers: dict[int, int] | None
    lo: float
    hi: float
    pos: dict[int, int]  # target id to its place in ``targets``


class Candidates:
    """Builds each target's candidate and keeps what it built (see the module's docstring)."""

    def __init__(self, state: State, hosts: Hosts, default_capacity: int,
                 model_costs: Mapping[str, tuple[float, float, float]]) -> None:
        self.state = state
        self.hosts = hosts
        #: Slots of a target whose engine, config and learning say nothing.
        self.default_capacity = default_capacity
        #: ``models[].cost_model`` by model name, for backends without their own.
        self.model_costs = model_costs
        #: Each target's last candidate without a match, with what it was built from: its
        #: view's kept entry (``State.kept_view``), its stamp, the in-flight count with peers'
        #: and the waiters ahead.
        self.kept: dict[Target, tuple[CachedView, int, int, int, Candidate]] = {}
        #: Each target's last candidate with a match: (its unmatched base, the matched tokens,
        #: holds the root, the copy), served again while all are the same.
        self.matched: dict[Target, tuple[Candidate, int, bool, Candidate]] = {}
        #: Each (model, kind)'s kept candidates, for requests that exclude no target.
        self.fleets: dict[tuple[str, str | None], KeptCandidates] = {}
        #: Target sets (``Selection``) whose every target had no free slot, with the last
        #: backend write then (``BackendState.changes``), the time the views read stay current
        #: until, and the targets: a waiter of one is passed over without a decision (which
        #: could only say ``enqueue`` again) while both hold, until ``Scheduler.kick``.
        self.full: dict[Selection, tuple[int, float, tuple[Target, ...]]] = {}

    def invalidate(self, default_capacity: int,
                   model_costs: Mapping[str, tuple[float, float, float]]) -> None:
        """New inputs every candidate reads: nothing kept stays."""
        self.default_capacity, self.model_costs = default_capacity, model_costs
        self.full.clear()
        self.kept.clear()
        self.matched.clear()
        self.fleets.clear()

    def remember_full(self, sel: Selection, targets: list[Target]) -> None:
        """Every target of ``sel`` has no free slot now: remember it in ``full``. Not when a
        view reads ``replied_at`` (an up-ness that a relayed byte may change)."""
        until = math.inf
        for t in targets:
            e = self.state.kept_view(t)
            if e is None or e[5]:
                return
            until = min(until, e[4])
        self.full[sel] = (BackendState.changes, until, tuple(targets))

    def assemble(self, targets: list[Target], model: str, kind: str | None, whole: bool,
                 queued: int, now: float, peer_inflight: dict[int, int] | None,
                 matches: dict[int, Match], stale: Container[int], root_bytes: int,
                 held: list[int]) -> tuple[list[Candidate], dict[int, bool], bool]:
        """Every target's candidate as of now, priced with its match (``held``: filled with
        the targets predicted to hold the root), from the kept fleet while it is current
        (``whole``: the request excludes no target), else by a full pass."""
        fkey = (None if not whole or len(targets) < FLEET_MIN_TARGETS else (model, kind))
        fleet = self.fleets.get(fkey) if fkey is not None else None
        hosts = self.hosts
        if not (fleet is not None and not hosts.host_model and not hosts.host_evicted
                and fleet.queued == queued and fleet.peers is peer_inflight
                and fleet.lo <= now < fleet.hi and fleet.targets == targets):
            return self.full_loop(targets, queued, now, peer_inflight, matches, stale,
                                  root_bytes, held, fkey)
        cands = self.from_fleet(fleet, now, queued, peer_inflight)
        if matches:
            kept_matched, pos = self.matched, fleet.pos
            for i in sorted(pos[tid] for tid in matches if tid in pos):
                c = cands[i]
                tid = c.target_id
                m = matches[tid]
                root = m.matched_bytes >= root_bytes
                if root:
                    held.append(tid)
                if tid not in stale and (matched := m.matched_bytes // BYTES_PER_TOKEN):
                    t = targets[i]
                    km = kept_matched.get(t)
                    if km is not None and km[0] is c and km[1] == matched and km[2] == root:
                        cands[i] = km[3]
                    else:
                        cands[i] = with_match(c, matched, root)
                        kept_matched[t] = (c, matched, root, cands[i])
        return cands, dict(fleet.cold), fleet.colds > 0

    def full_loop(self, targets: list[Target], queued: int, now: float,
                   peer_inflight: dict[int, int] | None, matches: dict[int, Match],
                   stale: Container[int], root_bytes: int, held: list[int],
                   fkey: tuple[str, str | None] | None
                   ) -> tuple[list[Candidate], dict[int, bool], bool]:
        """``assemble``'s full pass, kept as ``fkey``'s fleet unless a host may have swapped a
        model out (``candidate`` and ``State.view_at``'s check of a kept view inlined)."""
        cands: list[Candidate] = []
        add = cands.append
        cold: dict[int, bool] = {}
        has_cold = False
        view_at = self.state.view_at
        hosts = self.hosts
        kept, kept_matched, host_model = self.kept, self.matched, hosts.host_model
        host_evicted = hosts.host_evicted
        capture = fkey is not None and not host_model and not host_evicted
        stamp = new_stamp() if capture else 0
        recheck: set[int] = set()
        lo, hi = -math.inf, math.inf
        unmatched: list[Candidate] = []
        for i, t in enumerate(targets):
            tid = t.id
            b = t.backend
            inflight = (t.inflight if peer_inflight is None
                        else t.inflight + peer_inflight.get(tid, 0))
            e = kept.get(t)
            # The kept candidate is current while its kept view is (``view_at``'s test).
            if (e is not None and (ve := e[0])[0] == t.view_stamp and ve[1] is b
                    and ve[2] == b.stamp and ve[3] <= now < ve[4]
                    and (not ve[5] or ve[6] == b.replied_at) and e[1] == t.stamp
                    and e[2] == inflight and e[3] == queued):
                c, v = e[4], ve[7]
            else:
                v = view_at(t, now)
                if (e is not None and e[0][7] is v and e[1] == t.stamp and e[2] == inflight
                        and e[3] == queued):
                    c = e[4]
                else:
                    c = self.keep(t, v, queued, inflight)
                if capture:
                    e = kept.get(t)
                    if e is None or e[4] is not c:
                        e = None
                        recheck.add(i)  # not kept (a cold model): built every time
            if capture:
                if e is not None:
                    ve = e[0]
                    lo, hi = max(lo, ve[3]), min(hi, ve[4])
                    if ve[5]:
                        recheck.add(i)  # its view read ``replied_at``, which takes no stamp
                unmatched.append(c)
            if (host_model and c.warm is not False and not inflight
                    and (hm := host_model.get(b.url)) is not None
                    and hm[0] != t.model and hosts.swapped_out(t, v, hm)):
                c = hosts.as_cold(t, v, c)
            elif (host_evicted and c.warm is not False and not inflight
                    and (he := host_evicted.get(b.url)) is not None and t.model in he[0]
                    and (b.full_at is None or b.full_at <= he[1])):
                c = hosts.as_cold(t, v, c)  # priced as pushed out by a load since the round
            if matches and (m := matches.get(tid)) is not None:
                root = m.matched_bytes >= root_bytes
                if root:
                    held.append(tid)
                if tid not in stale and (matched := m.matched_bytes // BYTES_PER_TOKEN):
                    km = kept_matched.get(t)
                    if km is not None and km[0] is c and km[1] == matched and km[2] == root:
                        c = km[3]
                    else:
                        base, c = c, with_match(c, matched, root)
                        kept_matched[t] = (base, matched, root, c)
            if c.warm is False and not c.loading:
                cold[tid] = has_cold = True
            else:
                cold[tid] = False
            add(c)
        if capture:
            assert fkey is not None
            self.fleets[fkey] = KeptCandidates(
                list(targets), unmatched, dict(cold), sum(cold.values()), recheck, stamp,
                queued, peer_inflight, lo, hi, {t.id: i for i, t in enumerate(targets)})
        elif fkey is not None:
            self.fleets.pop(fkey, None)
        return cands, cold, has_cold

    def from_fleet(self, fleet: KeptCandidates, now: float, queued: int,
                    peer_inflight: dict[int, int] | None) -> list[Candidate]:
        """The kept fleet's unmatched candidates as of now: those written since or to
        recheck are rebuilt, and kept in it."""
        last, targets = fleet.stamp, fleet.targets
        dirty = [i for i, t in enumerate(targets)
                 if t.stamp > last or t.backend.stamp > last]
        if dirty or fleet.recheck:
            fleet.stamp = new_stamp()
            kept, base, cold, recheck = self.kept, fleet.base, fleet.cold, fleet.recheck
            for i in {*dirty, *recheck}:
                t = targets[i]
                inflight = (t.inflight if peer_inflight is None
                            else t.inflight + peer_inflight.get(t.id, 0))
                v = self.state.view_at(t, now)
                e = kept.get(t)
                if (e is not None and e[0][7] is v and e[1] == t.stamp and e[2] == inflight
                        and e[3] == queued):
                    c = e[4]
                else:
                    c = self.keep(t, v, queued, inflight)
                    e = kept.get(t)
                if e is not None and e[4] is c:
                    ve = e[0]
                    fleet.lo, fleet.hi = max(fleet.lo, ve[3]), min(fleet.hi, ve[4])
                    if ve[5]:
                        recheck.add(i)
                    else:
                        recheck.discard(i)
                else:
                    recheck.add(i)
                is_cold = c.warm is False and not c.loading
                fleet.colds += is_cold - cold[t.id]
                cold[t.id] = is_cold
                base[i] = c
        return list(fleet.base)

    def candidate(self, t: Target, inflight: int, queued: int, matched_tokens: int = 0
                  ) -> Candidate:
        """One target as the policy sees it (``build``), kept per target while its view is the
        same object, the target has had no write it reads (``Target.stamp``) and the in-flight
        count (ours and live peers') and the waiters ahead are as they were; a match makes a
        copy (``with_match``). A cold target is built each time: whether it fits reads the
        other targets."""
        v = self.state.view(t)
        e = self.kept.get(t)
        if (e is not None and e[0][7] is v and e[1] == t.stamp and e[2] == inflight
                and e[3] == queued):
            c = e[4]
        else:
            c = self.keep(t, v, queued, inflight)
        return with_match(c, matched_tokens) if matched_tokens else c

    def keep(self, t: Target, v: View, queued: int, inflight: int) -> Candidate:
        """A new unmatched candidate, kept unless the target's model is cold."""
        c = self.build(t, v, queued, inflight)
        if c.warm is not False and (ve := self.state.kept_view(t)) is not None and ve[7] is v:
            self.kept[t] = (ve, t.stamp, inflight, queued, c)
        return c

    def build(self, t: Target, v: View, queued: int, inflight: int) -> Candidate:
        """``candidate`` without a match, from the target's view as of now: occupancy =
        max(our in-flight, the engine's fresh Running); capacity from the engine, else config,
        else learned, else the saturation fallback. An engine that has queued for
        ``QUEUE_ROUNDS`` rounds and still reports a queue is full at what it runs: vLLM admits
        no request its KV pool cannot hold, so a 64-sequence engine with a small pool queues
        at 4."""
        engine_running = v.running if v.load_fresh else None
        if engine_running is not None and engine_running > MAX_PLAUSIBLE_CAPACITY:
            engine_running = None  # no engine runs that many: unknown this round, not "full"
        engine_waiting = v.waiting if v.load_fresh else None
        occupied = max(inflight, engine_running or 0)
        capacity = v.capacity or t.backend.spec.capacity or t.learned_capacity
        capacity_open = (not v.capacity and not t.backend.spec.capacity
                         and not t.capacity_seen_queue and v.waiting is not None
                         and not engine_waiting)
        if capacity is None:
            capacity = self.default_capacity
            saturated = (engine_waiting or 0) > 0 or inflight >= capacity
            free = 0 if saturated else capacity - occupied
        else:
            free = capacity - occupied
            if (engine_waiting or 0) > 0 and t.queue_rounds >= QUEUE_ROUNDS and engine_running:
                capacity, free = min(capacity, engine_running), 0
        warm = _WARM.get(v.residency)
        loading = v.residency is Residency.LOADING or (
            v.residency is Residency.COLD and t.inflight > 0)
        load_sec, load_basis = t.stats.load_sec.value, None
        size = v.size_bytes
        if warm is False and size is None:
            size = self.hosts.median_size()  # unknown: the load still counts, at the fleet median
        if load_sec is None and warm is False:  # a cold candidate is never kept: always fresh
            load_sec, load_basis = self.hosts.load_estimate(t, size)
            if load_basis is not None and v.size_bytes is None:
                load_basis += " (size=fleet median)"
        return Candidate(
            target_id=t.id,
            warm=warm,
            capacity=capacity,
            free_slots=free,
            queue_ahead=queued + (engine_waiting or 0),
            kv_usage=v.kv_usage,
            matched_tokens=0,
            prefill_sec_per_token=t.stats.prefill_sec_per_token.value,
            load_sec=load_sec,
            service_sec=t.stats.service_sec.value,
            fits_if_cold=self.hosts.fits_if_cold(t, size) if warm is False else None,
            loading=loading,
            inflight=inflight,
            queued_prefill_sec=t.queued_prefill,
            kv_free_tokens=self.kv_free(t, v),
            load_basis=load_basis,
            prefill_model=t.backend.spec.cost_model_terms or self.model_costs.get(t.model),
            capacity_open=capacity_open,
        )

    @staticmethod
    def kv_free(t: Target, v: View) -> int | None:
        """Tokens the engine's KV pool can still give a new prompt: the pool less what its
        running requests hold (vLLM's usage) less the prompts Pharos sent since, plus what
        its requests then running have freed since. None unless the engine reports both, and
        where its usage counts its cache's fill (``Target.kv_counts_cache``)."""
        if v.kv_usage is None or v.kv_pool_tokens is None or t.kv_counts_cache:
            return None
        pool = v.kv_pool_tokens
        return max(0, min(pool, int((1.0 - v.kv_usage) * pool) - t.kv_sent_tokens
                          + t.kv_freed_tokens))
