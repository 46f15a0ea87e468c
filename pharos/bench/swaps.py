"""Swap counting on a host that holds one model at a time, on a Clock.

``run_swaps`` drives the real ``Scheduler`` over a real ``State`` in front of an in-memory
Ollama whose ``/api/ps`` lists the one model it loaded last (``OLLAMA_MAX_LOADED_MODELS=1``):
each grant is a dispatch held ``service`` seconds; a swap is a dispatch of another model than
the loaded one. No sockets, no real time, so a test can assert swaps and a benchmark can sweep
``ReplicaRule`` over arrival patterns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from pharos.config import Backend as BackendSpec
from pharos.engine.fetch import Fetched
from pharos.placement import ReplicaRule
from pharos.policy import PolicyConfig
from pharos.sched import Guards, Lease, RouteSettings, SchedRequest, Scheduler
from pharos.state.state import State

URL = "http://one-model-host:11434"
#: Each model's size; the host has memory for one (5 GB, as Pharos is told).
MODEL_BYTES = 4_000_000_000
MEMORY_GB = 5.0


@dataclass
class OneModelHost:
    """An Ollama that holds one model: a dispatch of another model swaps it in."""

    models: Sequence[str]
    loaded: str | None = None
    swaps: int = 0
    order: list[str] = field(default_factory=list)

    def fetch(self, path: str) -> Deferred[Fetched]:
        """The engine's answers: version, catalogue, and the loaded model."""
        if path == "/api/version":
            body = b'{"version":"0.32.15"}'
        elif path == "/api/tags":
            body = b'{"models":[%s]}' % ",".join(
                f'{{"name":"{m}","size":{MODEL_BYTES}}}' for m in self.models).encode()
        elif path == "/v1/models":
            body = b'{"data":[%s]}' % ",".join(f'{{"id":"{m}"}}' for m in self.models).encode()
        elif path == "/api/ps":
            body = (b'{"models":[{"name":"%s","size_vram":%d}]}' % (self.loaded.encode(),
                                                                    MODEL_BYTES)
                    if self.loaded is not None else b'{"models":[]}')
        else:
            return succeed(Fetched(404, "text/plain", b"not found"))
        return succeed(Fetched(200, "application/json", body))

    def dispatch(self, model: str) -> None:
        """A request for ``model`` reached the host."""
        self.order.append(model)
        if model != self.loaded:
            if self.loaded is not None:
                self.swaps += 1
            self.loaded = model


@dataclass(frozen=True)
class SwapRun:
    """What one run did: swaps (loads after the first), the dispatch order, and each
    request's wait in the queue (by arrival index; a request never served is missing)."""

    swaps: int
    order: tuple[str, ...]
    waits: dict[int, float]

    @property
    def served(self) -> int:
        return len(self.waits)


def pattern(repeats: int, spacing: float = 0.1, models: str = "abaac"
            ) -> list[tuple[float, str]]:
    """``models`` (A-B-A-A-C by default) ``repeats`` times, a request every ``spacing`` s."""
    seq = list(models) * repeats
    return [(spacing * i, m) for i, m in enumerate(seq)]


def run_swaps(rule: ReplicaRule, arrivals: Iterable[tuple[float, str]], *, slots: int = 2,
              service: float = 1.0, key: str | None = "k", until: float = 600.0,
              memory_gb: float | None = MEMORY_GB, max_loaded_models: int | None = None
              ) -> SwapRun:
    """Requests arriving at (time, model) through the scheduler to one one-model host with
    ``slots`` slots, under one fair-queue key (``key=None``: a key each), each holding its slot
    ``service`` seconds; run for ``until`` seconds of the clock. Pharos is told the host's
    ``memory_gb`` and ``max_loaded_models`` (either says it holds one model)."""
    arrivals = list(arrivals)
    clock = Clock()
    host = OneModelHost(sorted({m for _, m in arrivals}))
    state = State(clock, None, rng=lambda: 0.5, fetcher_for=lambda spec: host)
    seeds = iter(range(1, 1 << 30))
    sched = Scheduler(state, RouteSettings(PolicyConfig(), Guards(placement=rule)),
                      seed=lambda: next(seeds))
    state.on_round = lambda b: sched.kick()
    state.set_backends([BackendSpec(url=URL, kind="ollama", memory_gb=memory_gb,
                                    capacity=slots, max_loaded_models=max_loaded_models)])
    state.service.startService()
    clock.advance(0.6)
    start = clock.seconds()
    waits: dict[int, float] = {}

    def granted(lease: Lease, i: int, at: float) -> None:
        host.dispatch(lease.target.model)
        waits[i] = clock.seconds() - at
        clock.callLater(service, lease.release)

    def arrive(i: int, model: str) -> None:
        at = clock.seconds()
        d = sched.acquire(key if key is not None else f"k{i}", 1, SchedRequest(model, 100, i))
        d.addCallback(granted, i, at)

    for i, (t, model) in enumerate(arrivals):
        clock.callLater(t, arrive, i, model)
    while clock.seconds() - start < until:
        clock.advance(0.05)
    state.service.stopService()
    return SwapRun(host.swaps, tuple(host.order), waits)
