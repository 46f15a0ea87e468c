"""Hot root prefixes: which shared prompt heads need more than one engine.

A root prefix (a request chain's first link: the tools and system message) whose demand is more
than one engine can serve would, under a cache-aware cost, pile onto the one engine holding it
until its queue outweighs the prefill saved elsewhere. Demand is a decaying sum of the
slot-seconds the root's requests asked for, so ``demand(root)`` is about the slots it keeps busy
(Little's law); the scheduler prices a root's extra ``owners(...)`` as holding it, so the cost
model shares it among them by their queues. Pure: no clock, bounded (LRU).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Final

#: Seconds over which demand decays to a half (assumed: long enough to see a burst's rate,
#: short enough to let a prompt cool down within a minute).
HALF_LIFE_SEC: Final = 10.0
#: Roots tracked at once.
CAPACITY: Final = 4096
#: A root gets another owner once it would keep one owner's slots busier than this (assumed).
UTILIZATION: Final = 0.7

_LN2: Final = math.log(2)


class HotPrefixes:
    """A decaying demand counter per root prefix, bounded to ``capacity`` roots."""

    def __init__(self, half_life: float = HALF_LIFE_SEC, capacity: int = CAPACITY) -> None:
        if half_life <= 0 or capacity < 1:
            raise ValueError("half_life > 0 and capacity >= 1")
        self._tau = half_life / _LN2
        self.capacity = capacity
        self._roots: OrderedDict[int, tuple[float, float]] = OrderedDict()  # value, at

    def __len__(self) -> int:
        return len(self._roots)

    def add(self, root: int, slot_seconds: float, now: float) -> None:
        """A request with this root was dispatched, expected to hold a slot this long."""
        value = self._decayed(root, now) + slot_seconds
        self._roots[root] = (value, now)
        self._roots.move_to_end(root)
        while len(self._roots) > self.capacity:
            self._roots.popitem(last=False)

    def demand(self, root: int, now: float) -> float:
        """Slots the root keeps busy, on average over the recent past."""
        return self._decayed(root, now) / self._tau

    def owners(self, root: int, now: float, slots_per_owner: float,
               utilization: float = UTILIZATION) -> int:
        """How many targets the root needs: ``ceil(demand / (slots × utilization))``, >= 1."""
        per_owner = max(slots_per_owner * utilization, 1e-9)
        return max(1, math.ceil(self.demand(root, now) / per_owner))

    def _decayed(self, root: int, now: float) -> float:
        entry = self._roots.get(root)
        if entry is None:
            return 0.0
        value, at = entry
        if now <= at:
            return value
        return value * math.exp(-(now - at) / self._tau)
