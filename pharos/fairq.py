"""The fair queue: waiters that found no free slot, served tenant first, then key, each by
weighted virtual time (hierarchical weighted fair queueing, by cost).

Each key and each tenant keeps a virtual time: the work it was served divided by its weight.
The next waiter comes from the backlogged tenant with the lowest virtual time, and within it
from the key whose head waiter would finish lowest. A request's cost is its estimated work,
so a key sending long prompts uses its share faster, and a flood of requests (or of keys)
only spends its own tenant's share.

A key or tenant that was idle does not bank credit: backlogged again, its virtual time is
raised to the one its parent last served at (start-time fair queueing's clamp), so a light
key arriving in a flood is served within about one grant.

Work-conserving: a waiter that cannot be placed now is passed over without losing its place.
Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


class Queued(Protocol):
    """What the queue reads of a waiter."""

    @property
    def key(self) -> str: ...

    @property
    def tenant(self) -> str: ...

    @property
    def weight(self) -> int: ...

    @property
    def tenant_weight(self) -> int: ...

    @property
    def cost(self) -> float: ...


W = TypeVar("W", bound=Queued)


@dataclass(eq=False, slots=True)
class _Key(Generic[W]):
    name: str
    weight: int
    vt: float = 0.0  # work served / weight
    q: deque[W] = field(default_factory=deque)

    def finish(self) -> float:
        """The virtual time at which its head waiter would be served in full."""
        return self.vt + self.q[0].cost / self.weight


@dataclass(eq=False, slots=True)
class _Tenant(Generic[W]):
    name: str
    weight: int
    vt: float = 0.0
    served_vt: float = 0.0  # the virtual time its last served key was at (the keys' clamp)
    waiting: int = 0
    keys: dict[str, _Key[W]] = field(default_factory=dict)


class FairQueue(Generic[W]):
    """Waiters by tenant and key: the caller ``served`` one of the ``heads()`` it can place."""

    def __init__(self) -> None:
        self._tenants: dict[str, _Tenant[W]] = {}
        self._served_vt = 0.0  # the virtual time the last served tenant was at
        self.waiting = 0

    def __len__(self) -> int:
        return self.waiting

    def push(self, w: W, front: bool = False) -> None:
        """Queue ``w`` at the back of its key's FIFO (the front for a retry, which already
        waited its turn), with the waiter's weights."""
        t = self._tenants.get(w.tenant)
        if t is None:
            t = self._tenants[w.tenant] = _Tenant(w.tenant, w.tenant_weight)
        t.weight = w.tenant_weight
        k = t.keys.get(w.key)
        if k is None:
            k = t.keys[w.key] = _Key(w.key, w.weight)
        k.weight = w.weight
        if not k.q:
            k.vt = max(k.vt, t.served_vt)
        if not t.waiting:
            t.vt = max(t.vt, self._served_vt)
        if front:
            k.q.appendleft(w)
        else:
            k.q.append(w)
        t.waiting += 1
        self.waiting += 1

    def remove(self, w: W) -> bool:
        """Take ``w`` out (its client left, or the queue was full); False if not queued."""
        t = self._tenants.get(w.tenant)
        k = t.keys.get(w.key) if t is not None else None
        if t is None or k is None or w not in k.q:
            return False
        k.q.remove(w)
        t.waiting -= 1
        self.waiting -= 1
        return True

    def heads(self) -> Iterator[W]:
        """Each backlogged key's head waiter, best first: tenants by virtual time, then their
        keys by the head's virtual finish (ties: the order they first queued in)."""
        tenants = sorted((t for t in self._tenants.values() if t.waiting),
                         key=lambda t: t.vt)
        for t in tenants:
            keys = sorted((k for k in t.keys.values() if k.q), key=_Key.finish)
            for k in keys:
                yield k.q[0]

    def behind(self, head: W, limit: int) -> Iterator[W]:
        """Up to ``limit`` waiters queued behind ``head`` in its key's FIFO (swap grouping)."""
        k = self._tenants[head.tenant].keys[head.key]
        for i, w in enumerate(k.q):
            if i > limit:
                return
            if i:
                yield w

    def position(self, w: W) -> int | None:
        """How many waiters are ahead of ``w`` in its key's FIFO; None if not queued."""
        t = self._tenants.get(w.tenant)
        k = t.keys.get(w.key) if t is not None else None
        if k is None:
            return None
        for i, x in enumerate(k.q):
            if x is w:
                return i
        return None

    def served(self, w: W) -> None:
        """``w`` (from ``heads`` or ``behind``) got its slot: its key and tenant pay its cost."""
        t = self._tenants[w.tenant]
        k = t.keys[w.key]
        assert k.q, "only a queued waiter is served"
        if k.q[0] is w:
            k.q.popleft()
        else:
            k.q.remove(w)
        t.waiting -= 1
        self.waiting -= 1
        self._served_vt = t.vt
        t.served_vt = k.vt
        k.vt += w.cost / k.weight
        t.vt += w.cost / t.weight

    def backlog(self) -> dict[str, dict[str, int]]:
        """Waiters by tenant and key (``/status``, tests)."""
        return {t.name: {k.name: len(k.q) for k in t.keys.values() if k.q}
                for t in self._tenants.values() if t.waiting}


#: Seconds a key counts as active after its last request arrived or ended (assumed: a key
#: sending a request every few seconds is a user in a session, one silent longer has left).
ACTIVE_SEC = 10.0
#: The room (free slots kept for active keys under their share while keys over theirs wait)
#: is the fewest slots those keys' arrivals (Poisson) within ``ROOM_RELEASES`` mean intervals
#: between releases take all of with probability at most ``ROOM_RISK``: each idle slot costs
#: the keys over their share, so a fixed room is too large when quiet.
ROOM_RELEASES = 4.0
ROOM_RISK = 0.05
#: The room is at most one in ``ROOM_SHARE`` of the fleet's slots, and none below
#: ``ROOM_MIN_FLEET`` slots (a small fleet keeps every slot busy).
ROOM_SHARE = 4
ROOM_MIN_FLEET = 8
#: The room when the fleet's release interval is unknown (one slot in eight, at most 2).
ROOM_SLOTS = 2
ROOM_EVERY = 8
#: Half-life of a key's arrival-rate estimate, s.
RATE_HALF_LIFE = ACTIVE_SEC
_TAU = RATE_HALF_LIFE / math.log(2)  # the decayed count's time constant: count = rate * tau


def room_for(rate: float, window: float, limit: int) -> int:
    """The fewest slots ``r`` (at least 1, at most ``limit``) such that Poisson arrivals at
    ``rate`` bring ``r`` or more within ``window`` with probability at most ``ROOM_RISK``."""
    mean = rate * window
    p = term = math.exp(-mean)  # P(N <= r - 1), from r = 1
    r = 1
    while r < limit and 1.0 - p > ROOM_RISK:
        term *= mean / r
        p += term
        r += 1
    return r


class Shares:
    """Each key's requests in flight and when it was last active, so a key over its share of
    the fleet leaves the last free slots to an active key under its share (the fair queue
    cannot preempt a running request: without room, a light key waits for the next release).
    Shares are two-level like the queue: tenants by weight, then keys within a tenant."""

    def __init__(self) -> None:
        self.inflight: dict[str, int] = {}
        self._keys: dict[str, tuple[str, int, int]] = {}  # key -> tenant, weights
        self._seen: dict[str, float] = {}
        #: key -> its arrivals' count decayed to the last one, that arrival, its first seen
        self._arrivals: dict[str, tuple[float, float, float]] = {}

    def seen(self, key: str, weight: int, now: float, tenant: str = "", tenant_weight: int = 1
             ) -> None:
        """A request of ``key`` (of ``tenant``) arrived."""
        self._seen[key] = now
        self._keys[key] = (tenant, weight, tenant_weight)
        a = self._arrivals.get(key)
        if a is None:
            self._arrivals[key] = (1.0, now, now)
        else:
            self._arrivals[key] = (a[0] * 2.0 ** ((a[1] - now) / RATE_HALF_LIFE) + 1.0, now,
                                   a[2])
        if len(self._seen) > 4 * 1024:
            self._forget(now)

    def started(self, key: str) -> None:
        self.inflight[key] = self.inflight.get(key, 0) + 1

    def ended(self, key: str) -> None:
        n = self.inflight.get(key, 0) - 1
        if n > 0:
            self.inflight[key] = n
        else:
            self.inflight.pop(key, None)

    def _forget(self, now: float) -> None:
        for key, at in list(self._seen.items()):
            if now - at > ACTIVE_SEC and key not in self.inflight:
                del self._seen[key]
                self._keys.pop(key, None)
                self._arrivals.pop(key, None)

    def rate(self, key: str, now: float) -> float:
        """``key``'s arrivals a second: its decayed count over the time constant, or over the
        time since it was first seen while shorter (a key that just came is not slow)."""
        a = self._arrivals.get(key)
        if a is None:
            return 0.0
        n = a[0] * 2.0 ** ((a[1] - now) / RATE_HALF_LIFE)
        return n / max(1.0, min(_TAU, now - a[2]))

    def over_share(self, key: str, capacity: int, now: float) -> bool:
        """Whether one more request of ``key`` puts it (or its tenant) over its share of
        ``capacity`` while another active key is entitled to one more: the room's test
        whatever the free slots (``Scheduler`` paces such a key's prefills)."""
        return self.must_leave_room(key, 1, -1, capacity, now)

    @staticmethod
    def room_limit(capacity: int) -> int:
        """The largest room a fleet of ``capacity`` slots keeps: a grant with more slots free
        never waits for the room (the scheduler's test before ``must_leave_room``)."""
        return capacity // ROOM_SHARE if capacity >= ROOM_MIN_FLEET else 0

    def must_leave_room(self, key: str, weight: int, free: int, capacity: int,
                        now: float, release_sec: float | None = None) -> bool:
        """Whether ``key``'s request should wait although ``free`` slots (of ``capacity``)
        are free: no more than the room are, one more request would put ``key`` (or its
        tenant) over its share among the active keys, and another active key is entitled to
        one more. ``release_sec``: the fleet's mean seconds between releases, which sizes the
        room by the entitled keys' arrival rates; unknown, the room is ``ROOM_SLOTS``."""
        limit = self.room_limit(capacity)
        if free > limit or key not in self._keys:
            return False
        active = [k for k, at in self._seen.items()
                  if k in self.inflight or now - at <= ACTIVE_SEC]
        if len(active) < 2:
            return False  # alone
        tenant_w: dict[str, int] = {}
        key_w: dict[str, int] = {}  # tenant -> its active keys' weights
        held: dict[str, int] = {}  # tenant -> its requests in flight
        for k in active:
            t, w, tw = self._keys[k]
            tenant_w[t] = tw
            key_w[t] = key_w.get(t, 0) + w
            held[t] = held.get(t, 0) + self.inflight.get(k, 0)
        total = sum(tenant_w.values())

        def entitled(k: str, more: int) -> bool:
            t, w, tw = self._keys[k]
            tenant_share = capacity * tw / total
            mine = self.inflight.get(k, 0)
            return held[t] + more <= tenant_share and (
                mine == 0 or mine + more <= tenant_share * w / key_w[t])

        if entitled(key, 1):
            return False  # one more stays within its share
        under = [k for k in active if k != key and entitled(k, 1)]
        if not under:
            return False
        if free < 0:
            return True  # ``over_share``: the room's test, whatever its size
        if release_sec is None:
            room = min(ROOM_SLOTS, capacity // ROOM_EVERY)
        else:
            left = 0.0  # what the keys under their share may still start within it
            for k in under:
                t, w, tw = self._keys[k]
                left += capacity * tw / total * w / key_w[t] - self.inflight.get(k, 0)
            room = room_for(sum(self.rate(k, now) for k in under),
                            ROOM_RELEASES * release_sec, max(1, min(limit, int(left))))
        return free <= room
