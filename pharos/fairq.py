"""The fair queue (spec §8, issue 11): waiters that found no free slot, served tenant first,
then key, each by weighted virtual time (hierarchical weighted fair queueing, as the gateway
seed 003 does it; with one tenant it is spec §8's weighted round robin over keys, by cost).

Each key and each tenant keeps a virtual time: the work it was served divided by its weight.
The next waiter comes from the backlogged tenant with the lowest virtual time, and within it
from the key whose head waiter would finish lowest (its virtual time plus the waiter's cost
over the key's weight). A request's cost is its estimated work, so a key sending long prompts
uses its share faster than one sending short ones, and a flood of requests (or of keys) only
spends its own tenant's share.

A key or tenant that was idle does not bank credit: when it becomes backlogged again its
virtual time is raised to the virtual time its parent last served at (start-time fair
queueing's clamp), so a light key arriving in a flood is served within about one grant, not
after a burst of catching up, and a key that was just served a lot keeps that debt.

Work-conserving: a waiter that cannot be placed now (its model's targets are full) is passed
over without losing its place, and anyone else who can be placed is served; a key alone gets
the whole fleet. Pure: no clock, no I/O.
"""

from __future__ import annotations

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
    """Waiters by tenant and key. ``heads()`` gives the heads in service order; the caller
    takes one it can place with ``served``."""

    def __init__(self) -> None:
        self._tenants: dict[str, _Tenant[W]] = {}
        self._served_vt = 0.0  # the virtual time the last served tenant was at
        self.waiting = 0

    def __len__(self) -> int:
        return self.waiting

    def push(self, w: W, front: bool = False) -> None:
        """Queue ``w`` at the back of its key's FIFO (the front for a retry, which already
        waited its turn). Weights are the waiter's own: a reload that changed them applies to
        the next waiter."""
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

    def served(self, w: W) -> None:
        """``w`` (a head from ``heads``) got its slot: it leaves, and its key and tenant are
        charged its cost."""
        t = self._tenants[w.tenant]
        k = t.keys[w.key]
        assert k.q and k.q[0] is w, "only a head waiter is served"
        k.q.popleft()
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
