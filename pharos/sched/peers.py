"""Peer gauges: the other instances' last reports, summed over the live ones for occupancy,
and their prefix records and dispatches applied to this instance's index and root caches."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pharos.prefix import PrefixOp
from pharos.sched.learning import Learning
from pharos.sched.queue import WaitQueue
from pharos.sched.request import PEER_SILENCE_SEC, SHARED_CACHE_KINDS, RouteSettings
from pharos.state.state import State

#: Entries one peer's gauges may hold: far above any fleet (more is refused).
MAX_GAUGE_ENTRIES = 10_000


class GaugeError(ValueError):
    """A peer's gauges are malformed (what is wrong is in the message)."""


def _gauge_counts(raw: object, name: str) -> dict[str, int]:
    """One ``{name: count}`` part of a peer's gauges, checked: strings to non-negative ints."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise GaugeError(f"gauges.{name}: expected an object, got {type(raw).__name__}")
    if len(raw) > MAX_GAUGE_ENTRIES:
        raise GaugeError(f"gauges.{name}: {len(raw)} entries, more than {MAX_GAUGE_ENTRIES}")
    out: dict[str, int] = {}
    for k, v in raw.items():
        if not isinstance(k, str) or type(v) is not int or v < 0:
            raise GaugeError(f"gauges.{name}: expected names to non-negative integers, got "
                             f"{k!r}: {v!r}")
        if v:
            out[k] = v
    return out


@dataclass(slots=True)
class PeerGauges:
    """One peer's last report and when (on this process's clock) it arrived."""

    heard_at: float
    inflight: dict[str, int]
    waiting: dict[str, int]


class PeerLoad:
    """Peers' gauges by origin and their sums over the live ones by target id and by model,
    recomputed when a report arrives or goes stale, not per decision."""

    def __init__(self, state: State, learning: Learning, queue: WaitQueue,
                 kick: Callable[[], None]) -> None:
        self.state = state
        self.learning = learning
        self.queue = queue
        self.kick = kick
        self.peers: dict[str, PeerGauges] = {}
        self.inflight_sums: dict[int, int] = {}
        self.waiting_sums: dict[str, int] = {}
        self.until = math.inf  # when the first live report goes stale
        self._since = -math.inf  # the clock when the sums were made (a clock that jumps)
        self._key_ids: dict[str, int] = {}

    def export(self) -> dict[str, dict[str, int]]:
        """This process's own gauges: in-flight requests per target key, waiters per model."""
        return {"inflight": {t.key: t.inflight for t in self.state.targets if t.inflight > 0},
                "waiting": dict(self.queue.waiting_models)}

    def merge(self, origin: str, gauges: Mapping[str, object], now: float) -> None:
        """A peer's report replaces its previous one (a malformed one raises ``GaugeError``
        and changes nothing); targets not seen here yet count once they appear."""
        inflight = _gauge_counts(gauges.get("inflight"), "inflight")
        waiting = _gauge_counts(gauges.get("waiting"), "waiting")
        self.peers[origin] = PeerGauges(now, inflight, waiting)
        self.until = -math.inf
        self.kick()

    def forget(self, origin: str) -> None:
        """Drop a peer's gauges at once (it said it is leaving)."""
        if self.peers.pop(origin, None) is not None:
            self.until = -math.inf
            self.kick()

    def inflight(self, target_id: int) -> int:
        """Live peers' in-flight requests on a target."""
        self.refresh()
        return self.inflight_sums.get(target_id, 0)

    def waiting(self, model: str) -> int:
        """Live peers' waiters for a model."""
        self.refresh()
        return self.waiting_sums.get(model, 0)

    def target_id(self, key: str) -> int | None:
        """The id of the target a peer names by key; None for one not seen here yet."""
        targets = self.state.targets
        if len(self._key_ids) != len(targets):
            self._key_ids = {t.key: t.id for t in targets}
        return self._key_ids.get(key)

    def merge_prefix(self, ops: list[PrefixOp], now: float, *, roots: bool = True) -> int:
        """Apply a peer's prefix ops as local records and corrections (``PrefixIndex.merge``);
        returns how many were dropped. A record also notes its root as sent to its target in
        ``roots`` (each engine's cache takes every instance's prompts). ``roots=False``: the
        peer tells its sends at dispatch (``merge_dispatched``)."""
        learning = self.learning
        dropped = learning.index.merge(ops, self.target_id, learning.gen, now, source="peer")
        if not roots:
            return dropped
        for op in ops:
            if op.remove or not op.hashes:
                continue
            tid = self.target_id(op.target_key)
            gen = learning.gen(tid) if tid is not None else None
            tokens = learning.roots.tokens_of(op.hashes[0])
            if tid is None or gen is None or tokens is None:
                continue
            learning.roots_gen(tid, gen, now)
            learning.roots.sent(tid, op.hashes[0], tokens, now)
        return dropped

    def merge_dispatched(self, ops: list[PrefixOp], now: float, routing: RouteSettings) -> int:
        """A peer's dispatches, told before any byte came back: each root is sent to its
        target in ``roots``, counts in its demand (``hot``), and on a ``SHARED_CACHE_KINDS``
        engine is a peer slot (no two instances put one new root into two caches)."""
        learning = self.learning
        dropped = 0
        record: list[PrefixOp] = []
        for op in ops:
            tid = self.target_id(op.target_key) if op.hashes else None
            gen = learning.gen(tid) if tid is not None else None
            if tid is None or gen is None:
                dropped += 1
                continue
            t = self.state.targets[tid]
            root = op.hashes[0]
            tokens = (op.root_tokens if op.root_tokens is not None
                      else learning.roots.tokens_of(root))
            if tokens is not None:
                learning.roots_gen(tid, gen, now)
                learning.roots.sent(tid, root, tokens, now)
            if routing.guards.hot_prefix_utilization is not None:
                service = t.stats.service_sec.value or routing.policy.service_sec_default
                learning.hot.add(root, service, now)
            if t.backend.kind in SHARED_CACHE_KINDS:
                record.append(PrefixOp(op.target_key, op.hashes, op.last_used))
        if record:
            dropped += learning.index.merge(record, self.target_id, learning.gen, now,
                                            source="peer")
        return dropped

    def refresh(self) -> None:
        """Re-sum the live peers' gauges when needed; a peer silent ``PEER_SILENCE_SEC`` is
        dropped."""
        now = self.state.clock.seconds()
        if (self._since <= now < self.until
                and len(self._key_ids) == len(self.state.targets)):
            return
        inflight: dict[int, int] = {}
        waiting: dict[str, int] = {}
        until = math.inf
        for origin, g in list(self.peers.items()):
            if g.heard_at > now:
                g.heard_at = now  # the clock went back: silence counts from now
            if now - g.heard_at >= PEER_SILENCE_SEC:
                del self.peers[origin]
                continue
            until = min(until, g.heard_at + PEER_SILENCE_SEC)
            for key, n in g.inflight.items():
                tid = self.target_id(key)
                if tid is not None:
                    inflight[tid] = inflight.get(tid, 0) + n
            for model, n in g.waiting.items():
                waiting[model] = waiting.get(model, 0) + n
        self.target_id("")  # the key map as of now: a new target re-sums
        self.inflight_sums, self.waiting_sums = inflight, waiting
        self.until, self._since = until, now
