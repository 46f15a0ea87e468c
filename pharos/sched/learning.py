"""Learning around decisions: what each reply teaches the prefix index, the roots sent to each
engine's cache (``pharos.retention``) and the hot ones (``pharos.hot``), each session's last
target and each target's capacity."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from pharos.hot import HotPrefixes
from pharos.policy import Candidate, rank
from pharos.prefix import (
        BYTES_PER_TOKEN,
        Chain,
        Match,
        PrefixIndex,
        PrefixOp,
        classify,
        drop_oldest,
)
from pharos.retention import RootCaches
from pharos.sched.lease import Lease
from pharos.sched.request import (
        CAPACITY_CONFIG,
        CAPACITY_DEFAULT,
        CAPACITY_ENGINE,
        CAPACITY_LEARNED,
        MAX_PLAUSIBLE_CAPACITY,
        QUEUE_ROUNDS,
        SHARED_CACHE_KINDS,
        Guards,
        RouteSettings,
        SchedRequest,
)
from pharos.state.registry import BackendState, Target
from pharos.state.state import State
from pharos.state.stats import Sample

#: KV usage (vLLM's: blocks running requests hold) at or above which an engine queue waits
#: for blocks, not for a sequence slot (assumed: no room for one more prompt).
KV_BOUND_USAGE = 0.8
#: KV usage above which an idle engine counts its cache's fill: vLLM and SGLang count only
#: blocks running requests hold (0 at rest); a cache-fill count stays near 1.
KV_AT_REST_CACHE = 0.5
#: Rounds in a row with requests finding a target full and its engine queueing nothing before
#: a capacity an engine queue set is tried past again, so a queue seen once (a burst) does not
#: pin it for good. At a real --max-num-seqs the retry parks one request in the engine's queue
#: for two rounds every this many (assumed).
REPROBE_ROUNDS = 10
#: A root prefix shorter than this (estimated tokens) is not worth spreading.
HOT_MIN_TOKENS = 256


def release_sec(candidates: tuple[Candidate, ...]) -> float | None:
        """The mean seconds between releases on ``candidates`` (slots over learned service
        times), which sizes the room (``pharos.fairq.room_for``); None while none is learned."""
        known = [v for c in candidates if (v := c.service_sec)]
        if not known:
            return None
        mean = sum(known) / len(known)
        per_sec = sum(c.capacity / (c.service_sec or mean) for c in candidates)
        return 1.0 / per_sec if per_sec > 0 else None


class Learning:
    """The prefix index and root caches as replies teach them, sessions, outcomes and
    capacities. ``on_prefix`` is told of every prefix record and correction this process
    makes, for the peers (it must not wait)."""

    def __init__(self, state: State, index: PrefixIndex,
                 on_prefix: Callable[[PrefixOp], None] | None) -> None:
        self.state = state
        self.index = index
        self.on_prefix = on_prefix
        self.hot = HotPrefixes()
        self.roots = RootCaches()
        self._root_gens: dict[int, int] = {}  # target -> the gen its roots were sent to
        # A plain dict in LRU order (about half an OrderedDict's memory).
        self.sessions: dict[int, int] = {}
        #: Every finished request's prefix outcome (the ``prefix`` metric).
        self.outcomes: Counter[str] = Counter()
        #: Requests with a prediction, by (slot source, outcome): per-source accuracy.
        self.predictions: Counter[tuple[str, str]] = Counter()
        #: Requests the index could not follow, by reason.
        self.unfollowed: Counter[str] = Counter()

    def dispatched(self, req: SchedRequest, target: Target, now: float, routing: RouteSettings
                   ) -> int | None:
        """Count the root's demand, note the root in the target's cache and remember the
        session's target. Returns ``RootCaches.sent``'s answer."""
        ahead = None
        if req.chain:
            root = req.chain.keys[0]
            if routing.guards.hot_prefix_utilization is not None:
                service = target.stats.service_sec.value or routing.policy.service_sec_default
                self.hot.add(root, service, now)
            self.roots_gen(target.id, target.gen, now)
            tokens = req.chain.ends[0] // BYTES_PER_TOKEN
            moved = self.roots.pushed_out(target.id, root) or root not in self.roots.held(
                target.id)
            ahead = self.roots.sent(target.id, root, tokens, now)
            if self.on_prefix is not None:  # peers learn of it now, not at the first byte
                self.on_prefix(PrefixOp(target.key, req.chain.keys, now, dispatched=True,
                                        root_tokens=tokens, moved=moved))
        if req.session is not None and routing.policy.session_affinity:
            self.sessions.pop(req.session, None)
            self.sessions[req.session] = target.id
            if len(self.sessions) > routing.guards.sessions:
                drop_oldest(self.sessions, routing.guards.sessions)
        return ahead

    def first_byte(self, lease: Lease) -> None:
        """The first byte of a reply: a ``SHARED_CACHE_KINDS`` engine holds the prompt now."""
        t = lease.target
        if lease.chain and t.backend.kind in SHARED_CACHE_KINDS:
            now = self.state.clock.seconds()
            self.index.record(lease.chain, t.id, t.gen, now)
            self._push(lease.chain, t, now, False)

    def learn(self, lease: Lease, sample: Sample) -> None:
        """What the reply teaches the prefix index: record a success, correct a wrong
        prediction, forget an error reply; count the outcome."""
        chain = lease.chain
        if not chain:
            return
        t = lease.target
        now = self.state.clock.seconds()
        if not sample.ok:
            self.index.forget(chain, t.id)
            self._push(chain, t, now, True)
            return
        if sample.control:
            return
        self.roots.learn(t.id, chain.ends[0] // BYTES_PER_TOKEN, lease.root_ahead,
                         sample.cached_tokens, now)
        predicted = lease.predicted_tokens or None
        outcome = classify(predicted, sample.cached_tokens, sample.prompt_tokens,
                           chain.total_bytes // BYTES_PER_TOKEN)
        lease.prefix = outcome
        self.outcomes[outcome] += 1
        if predicted is not None and lease.source is not None:
            self.predictions[(lease.source, outcome)] += 1
        if outcome == "wrong_prediction":
            self.index.correct(chain, t.id)
            self._push(chain, t, now, True)
        else:
            self.index.record(chain, t.id, t.gen, now)
            self._push(chain, t, now, False)

    def _push(self, chain: Chain, t: Target, now: float, remove: bool) -> None:
        """Hand a record or correction to the peers (hashes and a target key: no text)."""
        if self.on_prefix is not None:
            self.on_prefix(PrefixOp(t.key, chain.keys, now, remove))

    def roots_gen(self, tid: int, gen: int, now: float) -> None:
        """A new engine process (another generation): its cache started empty. The first
        generation seen is taken as the one ``roots`` describes (restored from a snapshot)."""
        seen = self._root_gens.get(tid)
        if seen != gen:
            if seen is not None:
                self.roots.forget(tid, now)
            self._root_gens[tid] = gen

    def evicted_since(self, req: SchedRequest, matches: dict[int, Match], guards: Guards
                      ) -> set[int]:
        """The targets the index predicts hold the request's root but whose learned retention
        says they have pushed it out since: the index learns of an eviction only from the
        next reply, and until then the stale prediction would price them as holders."""
        if not guards.eviction_pricing or not self.roots.retained:
            return set()  # off, or no target's retention known: ``pushed_out`` is False
        root, root_bytes, roots = req.chain.keys[0], req.chain.ends[0], self.roots
        return {tid for tid, m in matches.items()
                if m.matched_bytes >= root_bytes and roots.pushed_out(tid, root)}

    def evictions(self, req: SchedRequest, cands: list[Candidate],
                   matches: dict[int, Match], owners: frozenset[int]) -> dict[int, int]:
        """Per candidate that does not hold the request's root (nor is a hot root's extra
        owner), the tokens of the live roots it would push out of its cache that no other
        candidate holds (``pharos.retention``)."""
        chain, roots = req.chain, self.roots
        retained = roots.retained
        out: dict[int, int] = {}
        if not retained:
            return out  # no target's retention is known: ``evicts`` says nothing of any
        root, root_bytes = chain.keys[0], chain.ends[0]
        now = self.state.clock.seconds()
        ids = [c.target_id for c in cands]
        for tid in ids:
            if tid not in retained:
                continue  # its retention is unknown: ``evicts`` says nothing
            m = matches.get(tid)
            if tid in owners or (m is not None and m.matched_bytes >= root_bytes):
                continue
            pushed = roots.evicts(tid, root, root_bytes // BYTES_PER_TOKEN)
            if not pushed:
                continue
            tokens = sum(n for r, n in pushed if roots.live(r, now)
                         and roots.holders(r, (o for o in ids if o != tid)) == 0)
            if tokens:
                out[tid] = tokens
        return out

    def gen(self, target_id: int) -> int | None:
        targets = self.state.targets
        return targets[target_id].gen if 0 <= target_id < len(targets) else None

    def hot_owners(self, req: SchedRequest, cands: list[Candidate], held: list[int],
                   guards: Guards) -> frozenset[int]:
        """The targets to price as holding the request's root although they do not: when its
        demand needs ``k`` owners and fewer hold it, the next in a rendezvous order of (root,
        target), so the extra owners are the same every time and their caches become real."""
        utilization = guards.hot_prefix_utilization
        chain = req.chain
        if utilization is None or not chain or len(cands) < 2:
            return frozenset()
        root_bytes = chain.ends[0]
        if root_bytes // BYTES_PER_TOKEN < HOT_MIN_TOKENS:
            return frozenset()
        if not held:
            return frozenset()
        root = chain.keys[0]
        slots = sum([c.capacity for c in cands]) / len(cands)
        k = self.hot.owners(root, self.state.clock.seconds(), slots, utilization)
        if k <= len(held):
            return frozenset()
        holders = set(held)
        others = sorted((c.target_id for c in cands if c.target_id not in holders),
                        key=lambda tid: rank(root, tid))
        return frozenset(others[: k - len(holders)])

    def capacity_of(self, t: Target) -> tuple[int | None, str]:
        """The target's capacity and its source: the engine's own, else config, else learned,
        else None (the saturation fallback applies)."""
        v = self.state.view(t)
        if v.capacity:
            return v.capacity, CAPACITY_ENGINE
        if t.backend.spec.capacity:
            return t.backend.spec.capacity, CAPACITY_CONFIG
        if t.learned_capacity is not None:
            return t.learned_capacity, CAPACITY_LEARNED
        return None, CAPACITY_DEFAULT

    def learn_capacity(self, backend: BackendState, default_capacity: int) -> None:
        """After a scrape round: learn the capacity of the backend's targets that report none
        (vLLM exports no max-num-seqs). A count seen running at once is never unlearned; a
        target found full with no engine queue tries one more slot; an engine queue (two
        rounds, KV to spare) sets the capacity to what it runs, and stops the tries until
        ``REPROBE_ROUNDS`` quiet rounds."""
        for t in self.state.targets:
            if t.backend is not backend:
                continue
            v = self.state.view(t)
            # This round's counts hold even when a reply ended since: a queue seen was a queue.
            running, queued = v.running, v.waiting
            # Counted for every target: one whose engine queues is full whatever its capacity
            # says (``candidate``).
            t.queue_rounds = t.queue_rounds + 1 if queued is not None and queued > 0 else 0
            pressed, t.pressed = t.pressed, False
            # The engine's usage counts the prompts sent since the last round, but those still
            # without a first byte only in part (queued, or prefilled in chunks so far): they
            # stay counted until their first byte.
            t.kv_sent_tokens = t.kv_unstarted_tokens
            t.kv_freed_tokens = 0
            t.kv_round += 1
            if (not t.kv_counts_cache and running == 0 and queued == 0 and t.inflight == 0
                    and v.kv_usage is not None and v.kv_usage > KV_AT_REST_CACHE):
                t.kv_counts_cache = True
            if t.capacity_seen_queue:
                t.quiet_rounds = t.quiet_rounds + 1 if pressed and queued == 0 else 0
                if t.quiet_rounds >= REPROBE_ROUNDS:
                    t.capacity_seen_queue, t.quiet_rounds = False, 0
            if v.capacity or t.backend.spec.capacity:
                continue
            if (t.backend.failing is not None or running is None
                    or not 0 <= running <= MAX_PLAUSIBLE_CAPACITY):
                # The engine's counts are unknown this round (a busy engine answering /metrics
                # late): Pharos's own are evidence. Every request of its in flight there has its
                # first byte, so the engine queues none: while replies flow, try one more.
                if (pressed and not t.capacity_seen_queue and t.inflight > 0
                        and t.unstarted == 0
                        and self.state.replying(t.backend, self.state.clock.seconds())):
                    base = (t.learned_capacity if t.learned_capacity is not None
                            else default_capacity)
                    t.capacity_seen_max = max(t.capacity_seen_max, t.inflight)
                    if t.inflight >= base:
                        t.learned_capacity = base + 1
                continue
            current = t.learned_capacity
            base = current if current is not None else default_capacity
            t.capacity_seen_max = seen = max(t.capacity_seen_max, running)
            if t.queue_rounds >= QUEUE_ROUNDS and (v.kv_usage is None
                                                   or v.kv_usage < KV_BOUND_USAGE):
                # The engine queues (two rounds running: a request waiting for the next engine
                # step is not a queue) with blocks to spare: it runs all it can.
                learned = max(seen, 1)
                t.capacity_seen_queue = True
            elif t.queue_rounds >= QUEUE_ROUNDS:
                # A queue behind a (nearly) full KV pool says nothing of the sequence cap: vLLM
                # admits no request its free blocks cannot hold. ``candidate`` takes it as full
                # while the queue lasts.
                if seen <= base:
                    continue
                learned = seen
            elif not t.capacity_seen_queue and queued == 0 and pressed:
                # A request found no free slot here since the last round and the engine has no
                # queue (leases on replies it has finished fill slots too): try one more. Once
                # it has queued, no slot is tried past its Running.
                learned = base + 1
            elif seen > base:
                learned = seen  # it ran more than that at once (clients bypassing Pharos)
            else:
                continue
            t.learned_capacity = learned
