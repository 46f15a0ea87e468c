"""Model placement on multi-model hosts: what a load costs and what it evicts.

A cold dispatch on a host whose memory is full evicts idle models, and the next requests
for them pay a reload, which the scheduler prices (``Candidate.reload_sec``). ``ReplicaRule``
says when a request for a model warm somewhere queues for a warm slot instead of loading a
copy, and when a single-model host serves its loaded model's queue before it swaps, both
within ``wait_bound_sec`` so no request waits for ever. Pure: no clock, no I/O, bounded.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

#: Bytes per second a load reads when no host has learned one: 500 MB/s, a 4 GB model in 8 s
#: (assumed [U]: NVMe to GPU memory reads 1-3 GB/s, a SATA disk or a cold page cache far less).
LOAD_BYTES_PER_SEC_DEFAULT: Final = 500e6
#: Weight of a new load-rate sample (loads are rare: a few count).
RATE_ALPHA: Final = 0.3
#: How long an evicted model would have stayed loaded without the eviction: Ollama's default
#: ``OLLAMA_KEEP_ALIVE`` (5 minutes).
KEEP_ALIVE_SEC: Final = 300.0
#: Seconds over which a model's demand decays to a half (assumed: long enough to see a tail
#: model's rate of a request a minute, short enough to follow a shift within minutes).
DEMAND_HALF_LIFE_SEC: Final = 60.0
#: Models (and hosts) tracked at once; the least recently seen go first.
CAPACITY: Final = 4096

_LN2: Final = math.log(2)


def _median(values: list[float]) -> float:
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


class LoadRates:
    """Bytes per second of model loads, an EWMA per host (its URL)."""

    def __init__(self, default: float = LOAD_BYTES_PER_SEC_DEFAULT) -> None:
        if not default > 0:
            raise ValueError("default load rate must be > 0")
        self.default = default
        self._hosts: OrderedDict[str, float] = OrderedDict()

    def learn(self, host: str, size_bytes: int | None, load_sec: float | None) -> None:
        """A load of ``size_bytes`` took ``load_sec`` on ``host`` (unknown: nothing learned)."""
        if size_bytes is None or size_bytes <= 0 or load_sec is None or not load_sec > 0:
            return
        rate = size_bytes / load_sec
        old = self._hosts.pop(host, None)
        self._hosts[host] = rate if old is None else old + RATE_ALPHA * (rate - old)
        while len(self._hosts) > CAPACITY:
            self._hosts.popitem(last=False)

    def rate(self, host: str) -> tuple[float, str]:
        """The host's bytes per second and where it came from: ``host``, ``fleet`` (the
        median over hosts) or ``default``."""
        own = self._hosts.get(host)
        if own is not None:
            return own, "host"
        if self._hosts:
            return _median(list(self._hosts.values())), "fleet"
        return self.default, "default"

    def estimate(self, host: str, size_bytes: int | None) -> tuple[float, str] | None:
        """Seconds to load ``size_bytes`` on ``host``, and the rate's source; None: unknown."""
        if size_bytes is None or size_bytes <= 0:
            return None
        rate, source = self.rate(host)
        return size_bytes / rate, source


class ModelDemand:
    """A decaying count of requests per model: ``rate`` is about its requests per second."""

    def __init__(self, half_life: float = DEMAND_HALF_LIFE_SEC, capacity: int = CAPACITY
                 ) -> None:
        if half_life <= 0 or capacity < 1:
            raise ValueError("half_life > 0 and capacity >= 1")
        self._tau = half_life / _LN2
        self.capacity = capacity
        self._models: OrderedDict[str, tuple[float, float]] = OrderedDict()  # value, at

    def add(self, model: str, now: float, amount: float = 1.0) -> None:
        """A request for ``model`` was dispatched (``amount``: 1, or its slot-seconds)."""
        value = self._decayed(model, now) + amount
        self._models.pop(model, None)
        self._models[model] = (value, now)
        while len(self._models) > self.capacity:
            self._models.popitem(last=False)

    def rate(self, model: str, now: float) -> float:
        """Requests per second for ``model`` recently (with slot-seconds: the slots it keeps
        busy, by Little's law)."""
        return self._decayed(model, now) / self._tau

    def _decayed(self, model: str, now: float) -> float:
        entry = self._models.get(model)
        if entry is None:
            return 0.0
        value, at = entry
        return value if now <= at else value * math.exp(-(now - at) / self._tau)


def horizon(keep_alive: float = KEEP_ALIVE_SEC) -> float:
    """How far ahead an eviction is priced: the keep-alive (a later request would have found
    the model unloaded anyway), capped at the demand counters' half-life (beyond it they say
    little of the next request: over 300 s a model asked for once lately costs about a whole
    reload, as much as the most popular one)."""
    return min(keep_alive, DEMAND_HALF_LIFE_SEC)


def reload_price(rate: float, load_sec: float, horizon: float = DEMAND_HALF_LIFE_SEC) -> float:
    """Seconds of waiting an eviction costs the evicted model's next requests: the first
    within ``horizon`` pays the whole reload, those arriving during it half on average."""
    if rate <= 0 or load_sec <= 0:
        return 0.0
    return load_sec * (1.0 - math.exp(-rate * horizon)) + rate * load_sec * load_sec / 2.0


@dataclass(frozen=True, slots=True)
class Resident:
    """A model loaded on the host a cold load would go to."""

    model: str
    bytes: int  # its memory (VRAM when reported, else its size; 0: unknown)
    idle: bool  # no request in flight: the engine may unload it
    last_used: float  # when a request for it last ended (-inf: never seen)
    #: What evicting it costs its next requests (``reload_price``), when Pharos names the
    #: victim (``victims(named=True)``).
    price: float = 0.0


def victims(size_bytes: int, memory_bytes: float, resident: Sequence[Resident],
            named: bool = False) -> list[Resident] | None:
    """The idle models a load of ``size_bytes`` pushes out of ``memory_bytes`` until it fits;
    None when even all idle ones are not enough (the load waits). ``named``: Pharos tells
    the engine which to unload (Ollama: ``keep_alive: 0``, ``Lease.unload``), so the cheapest
    go first (the lowest ``price``, then the least recently used), which keeps the most
    requested resident (optimal for independent requests: Aho, Denning and Ullman's A0).
    Otherwise the host chooses and the least recently used go first: a guess (Ollama takes
    the shortest keep-alive, then the lowest model path, server/sched.go
    ``findRunnerToUnload``; hence Pharos names them there)."""
    free = memory_bytes - sum(r.bytes for r in resident)
    if size_bytes <= free:
        return []
    out: list[Resident] = []
    idle = [r for r in resident if r.idle]
    idle.sort(key=(lambda r: (r.price, r.last_used)) if named else (lambda r: r.last_used))
    for r in idle:
        out.append(r)
        free += r.bytes
        if size_bytes <= free:
            return out
    return None


# --- replicas follow demand, single-model hosts group their swaps -------------

#: A model warm on some hosts gets another only once its slot demand exceeds this share of
#: their slots (the demand its hosts cannot serve; a lower share loads copies whatever the
#: eviction costs), or once waiting costs more than the load and its eviction (a burst's
#: queue). The demand counts waiting requests too (``Hosts.demanded``).
REPLICA_UTILIZATION: Final = 1.0
#: The longest a request waits, for a warm slot or behind another model's queue on a
#: single-model host, before a load is allowed for it (assumed: about ten loads of a 4 GB
#: model; long enough to group a burst, short enough that a tail model is served).
LOAD_WAIT_BOUND_SEC: Final = 30.0
#: Seconds over which a model's slot demand decays to a half: the demand rule is for demand
#: that lasts (a burst's queue is the cost rule's), so a burst loads no copy over a model
#: asked for again soon.
SLOT_DEMAND_HALF_LIFE_SEC: Final = 30.0


@dataclass(frozen=True, slots=True)
class ReplicaRule:
    """The placement rule's parameters (config ``routing.replica_utilization``,
    ``routing.load_wait_bound_sec``, ``routing.swap_grouping``)."""

    #: None: no demand rule (each decision's cost alone decides whether to load a copy).
    utilization: float | None = REPLICA_UTILIZATION
    wait_bound_sec: float = LOAD_WAIT_BOUND_SEC
    swap_grouping: bool = True

    def __post_init__(self) -> None:
        if self.utilization is not None and not 0 < self.utilization <= 1:
            raise ValueError("replica utilization must be within (0, 1] (or None: off)")
        if not self.wait_bound_sec > 0:
            raise ValueError("wait_bound_sec must be > 0")


def _s(x: float) -> str:
    return f"{x:.1f}s"


def replica_needed(rule: ReplicaRule, demand: float, warm_slots: int) -> str | None:
    """Whether a model's slot demand is more than its ``warm_slots`` serve at ``utilization``:
    then a request finding them full loads a copy rather than join a queue that only grows."""
    if rule.utilization is None or warm_slots <= 0:
        return None
    served = warm_slots * rule.utilization
    if demand <= served:
        return None
    return f"replica needed: demand {demand:.2f} > {served:.2f} of {warm_slots} warm slots"


def replica_hold(rule: ReplicaRule, demand: float, warm_slots: int, warm_wait: float,
                 load_cost: float, waited: float) -> str | None:
    """Whether a request for a model warm on hosts with ``warm_slots`` slots should queue for
    one instead of loading a copy elsewhere: the reason it waits, or None (cost decides).
    Another copy is allowed when the model's slot demand exceeds ``warm_slots ×
    utilization``, when waiting for a warm slot (``warm_wait``) costs more than the cheapest
    load with its eviction price (``load_cost``), or when the request has already waited
    ``wait_bound_sec``. Otherwise the copy would evict a model someone else asks for."""
    if rule.utilization is None or warm_slots <= 0 or waited >= rule.wait_bound_sec:
        return None
    served = warm_slots * rule.utilization
    if demand > served or warm_wait > load_cost:
        return None
    return (f"no copy, a warm slot costs less: wait {_s(warm_wait)} < load+evict "
            f"{_s(load_cost)}, demand {demand:.2f} <= {served:.2f} of {warm_slots} warm slots")


def swap_hold(rule: ReplicaRule, loaded: str, loaded_waiting: int, waited: float,
              batch: bool = False) -> str | None:
    """Whether a load that would swap out ``loaded`` waits while ``loaded_waiting`` requests
    for it are queued: they are served first (a swap now and one back later is two loads for
    nothing), until this request has waited ``wait_bound_sec``; past it, only while
    ``batch`` (requests for ``loaded`` queued before the host swapped to it: under overload
    every waiter is past the bound, and oldest first is a swap per request). None: swap now."""
    if not rule.swap_grouping or loaded_waiting <= 0:
        return None
    if waited < rule.wait_bound_sec:
        return (f"swap held: {loaded_waiting} queued for loaded {loaded} first "
                f"(waited {_s(waited)} of {_s(rule.wait_bound_sec)})")
    if batch:
        return (f"swap held: {loaded} serves the requests queued before it loaded first "
                f"(waited {_s(waited)}, past the {_s(rule.wait_bound_sec)} bound)")
    return None


def drain_hold(rule: ReplicaRule, starving: str, waited: float) -> str | None:
    """A request for ``starving`` has waited ``waited`` for a host busy with another model:
    past ``wait_bound_sec`` that host takes no more of the other model's requests, so it
    drains and the load goes ahead. None: not yet."""
    if waited < rule.wait_bound_sec:
        return None
    return f"held for a swap to {starving} (waited {_s(waited)} >= {_s(rule.wait_bound_sec)})"
