"""A scheduler over a real State on a Clock with in-memory backends."""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from pharos.config import Backend as BackendSpec
from pharos.engine.fetch import Fetcher
from pharos.policy import PolicyConfig
from pharos.sched import Lease, RouteSettings, SchedRequest, Scheduler
from pharos.state.state import State
from tests.support.plan import FakeBackend

GB = 1_000_000_000


def ollama(loaded: list[str], sizes: dict[str, int] | None = None) -> FakeBackend:
    sizes = sizes or {"a": 4 * GB, "b": 4 * GB, "c": 4 * GB}
    tags = ",".join(f'{{"name":"{m}","size":{s}}}' for m, s in sizes.items())
    ps = ",".join(f'{{"name":"{m}","size_vram":{sizes[m]}}}' for m in loaded)
    models = ",".join(f'{{"id":"{m}"}}' for m in sizes)
    return FakeBackend({
        "/api/version": (200, b'{"version":"0.32.15"}'),
        "/v1/models": (200, b'{"data":[%s]}' % models.encode()),
        "/api/ps": (200, b'{"models":[%s]}' % ps.encode()),
        "/api/tags": (200, b'{"models":[%s]}' % tags.encode()),
    })


def llamacpp(slots: int = 1, running: int = 0, waiting: int = 0) -> FakeBackend:
    return FakeBackend({
        "/props": (200, b'{"total_slots":%d,"build_info":"b11312-0c1e570"}' % slots),
        "/v1/models": (200, b'{"data":[{"id":"m"}]}'),
        "/metrics": (200, b"llamacpp:requests_processing %d\nllamacpp:requests_deferred %d\n"
                     % (running, waiting)),
    })


def fleet(backends: dict[str, tuple[FakeBackend, BackendSpec]],
          policy: str = "cost") -> tuple[Scheduler, State, Clock]:
    clock = Clock()

    def fetcher_for(spec: BackendSpec) -> Fetcher:
        return backends[spec.url][0]

    state = State(clock, None, rng=lambda: 0.5, fetcher_for=fetcher_for)
    seeds = iter(range(1, 10_000))
    sched = Scheduler(state, RouteSettings(PolicyConfig(name=policy)), seed=lambda: next(seeds))  # type: ignore[arg-type]
    state.on_round = lambda b: sched.kick()
    state.set_backends([spec for _, spec in backends.values()])
    state.service.startService()
    clock.advance(0.6)
    return sched, state, clock


def req(model: str = "m", seed: int = 1, exclude: frozenset[int] = frozenset()) -> SchedRequest:
    return SchedRequest(model, 100, seed, exclude)


def granted(d: Deferred[Lease]) -> Lease:
    out: list[Lease] = []
    d.addCallback(out.append)
    assert out, "not granted"
    return out[0]
