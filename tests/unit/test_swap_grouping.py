"""Layer 1: swap-thrash grouping on a host that holds one model at a time (issue 15 item 4),
on a Clock. The host here is an in-memory Ollama whose ``/api/ps`` lists the one model it
loaded last (``OLLAMA_MAX_LOADED_MODELS=1``, or memory for one model as Pharos is told); a
swap is a dispatch of another model than the host's loaded one. Counting swaps is behaviour,
not timing: the ratio against FIFO dispatch is asserted."""

from __future__ import annotations

from collections.abc import Iterable

from twisted.internet.task import Clock

from pharos.config import Backend as BackendSpec
from pharos.placement import ReplicaRule
from pharos.policy import PolicyConfig
from pharos.sched import Guards, Lease, SchedRequest, Scheduler
from pharos.state.state import State
from tests.unit.test_plan import FakeBackend
from tests.unit.test_sched import GB

URL = "http://one:1"
SIZES = {"a": 4 * GB, "b": 4 * GB, "c": 4 * GB}
#: Seconds each request holds its slot.
SERVICE = 1.0


class OneModelHost(FakeBackend):
    """An Ollama that holds one model: each dispatch of another model swaps it in."""

    def __init__(self) -> None:
        tags = ",".join(f'{{"name":"{m}","size":{s}}}' for m, s in SIZES.items())
        super().__init__({
            "/api/version": (200, b'{"version":"0.32.15"}'),
            "/v1/models": (200, b'{"data":[%s]}' % ",".join(
                f'{{"id":"{m}"}}' for m in SIZES).encode()),
            "/api/tags": (200, b'{"models":[%s]}' % tags.encode()),
            "/api/ps": (200, b'{"models":[]}'),
        })
        self.loaded: str | None = None
        self.swaps = 0
        self.order: list[str] = []

    def dispatch(self, model: str) -> None:
        self.order.append(model)
        if model != self.loaded:
            if self.loaded is not None:
                self.swaps += 1
            self.loaded = model
            self.answers["/api/ps"] = (
                200, b'{"models":[{"name":"%s","size_vram":%d}]}' % (model.encode(),
                                                                      SIZES[model]))


def one_host(rule: ReplicaRule, slots: int = 2) -> tuple[Scheduler, OneModelHost, Clock]:
    clock = Clock()
    host = OneModelHost()
    state = State(clock, None, rng=lambda: 0.5, fetcher_for=lambda spec: host)
    seeds = iter(range(1, 100_000))
    sched = Scheduler(state, PolicyConfig(), seed=lambda: next(seeds),
                      guards=Guards(placement=rule))
    state.on_round = lambda b: sched.kick()
    state.set_backends([BackendSpec(url=URL, kind="ollama", memory_gb=5, capacity=slots)])
    state.service.startService()
    clock.advance(0.6)
    return sched, host, clock


def run(rule: ReplicaRule, arrivals: Iterable[tuple[float, str]], key: str | None = "k",
        until: float = 600.0, slots: int = 2
        ) -> tuple[OneModelHost, dict[int, float], list[float]]:
    """Requests arriving at (time, model), all under one key (``key=None``: one key each);
    every grant is a dispatch to the host, held ``SERVICE`` seconds. Returns the host, each
    request's wait by arrival index, and the arrival times."""
    sched, host, clock = one_host(rule, slots)
    waits: dict[int, float] = {}
    times: list[float] = []
    start = clock.seconds()

    def granted(lease: Lease, i: int, at: float) -> None:
        host.dispatch(lease.target.model)
        waits[i] = clock.seconds() - at
        clock.callLater(SERVICE, lease.release)

    def arrive(i: int, model: str) -> None:
        at = clock.seconds()
        d = sched.acquire(key if key is not None else f"k{i}", 1, SchedRequest(model, 100, i))
        d.addCallback(granted, i, at)

    for i, (t, model) in enumerate(arrivals):
        times.append(t)
        clock.callLater(t, arrive, i, model)
    while clock.seconds() - start < until:
        clock.advance(0.05)
    sched.state.service.stopService()
    return host, waits, times


def pattern(repeats: int) -> list[tuple[float, str]]:
    """A-B-A-A-C, ``repeats`` times, a request every 0.1 s (faster than the host serves)."""
    models = list("abaac") * repeats
    return [(0.1 * i, m) for i, m in enumerate(models)]


FIFO = ReplicaRule(swap_grouping=False)
GROUPED = ReplicaRule()


def test_grouping_swaps_at_least_three_times_less_than_fifo() -> None:
    """On A-B-A-A-C twelve times, FIFO dispatch (swap grouping off, one key: arrival order)
    swaps at every change of model, grouping serves the queued requests of the loaded model
    before a swap: at least 3x fewer swaps, and every request is served."""
    arrivals = pattern(12)
    fifo, fifo_waits, _ = run(FIFO, arrivals)
    grouped, grouped_waits, _ = run(GROUPED, arrivals)
    assert len(fifo_waits) == len(grouped_waits) == len(arrivals)
    assert fifo.order == [m for _, m in arrivals]  # FIFO is arrival order
    assert fifo.swaps >= 40
    assert grouped.swaps * 3 <= fifo.swaps, (grouped.swaps, fifo.swaps)


def test_a_swap_waits_while_the_loaded_model_has_requests_queued() -> None:
    """Every request under its own key (the fair queue's heads in arrival order) on a host
    with one slot: each time the loaded model's request ends, the next head asks for another
    model, and without grouping it swaps although requests for the loaded model are queued;
    with grouping the swap is held (``placement.swap_hold``) until they are served."""
    arrivals = pattern(12)
    grouped, waits, _ = run(GROUPED, arrivals, key=None, slots=1)
    ungrouped, _, _ = run(FIFO, arrivals, key=None, slots=1)
    assert len(waits) == len(arrivals)
    assert ungrouped.swaps >= 20
    assert grouped.swaps * 3 <= ungrouped.swaps, (grouped.swaps, ungrouped.swaps)


def test_a_tail_model_is_served_within_the_wait_bound() -> None:
    """The loaded model asked for without a pause (never idle, its queue never empty) does
    not starve a tail request: past the bound the host takes no more of the loaded model, it
    drains, and the tail model loads; without the bound's drain it would wait for ever."""
    bound = 20.0
    arrivals = [(0.4 * i, "a") for i in range(300)]
    arrivals.insert(10, (3.9, "c"))
    host, waits, _ = run(ReplicaRule(wait_bound_sec=bound), arrivals, key=None)
    assert len(waits) == len(arrivals)
    c_wait = waits[10]
    assert bound <= c_wait <= bound + 3 * SERVICE, c_wait
    assert host.swaps == 2  # a -> c -> a
