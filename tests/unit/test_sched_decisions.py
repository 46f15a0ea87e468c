"""Layer 1: the scheduler runs a placement decision only when it can place someone (issue 16
item 2): a target set found full is not decided again until something may free a slot (a
release, a round, peers' gauges, a reload), arrivals into a full set cost no decision, and the
grants are the ones deciding every time gives, in the same fair order, with no waiter left."""

from __future__ import annotations

from collections.abc import Callable

from pharos.config import Backend as BackendSpec
from pharos.sched import Lease, Placement, SchedRequest, Scheduler
from pharos.state.registry import Target
from pharos.state.state import State
from tests.support.sched import fleet, granted, llamacpp, ollama, req


def spy(sched: Scheduler) -> list[SchedRequest]:
    """Every ``decide`` call's request, in order (the spy counts decisions, not the counter)."""
    calls: list[SchedRequest] = []
    real = sched.decide

    def decide(r: SchedRequest, targets: list[Target], waited: float = 0.0) -> Placement:
        calls.append(r)
        return real(r, targets, waited)

    sched.decide = decide  # type: ignore[method-assign,assignment]
    return calls


def closed_loop(sched: Scheduler, clients: int, keys: Callable[[int], tuple[str, int]],
                requests: int, model: Callable[[int], str] = lambda i: "m"
                ) -> list[tuple[int, str]]:
    """``clients`` clients each sending a request as soon as its last one ended, the oldest
    lease released first, until ``requests`` ended; the grants' (client, key) in order."""
    held: list[tuple[int, Lease]] = []
    order: list[tuple[int, str]] = []
    seq = iter(range(1, 1_000_000))

    def start(i: int) -> None:
        key, weight = keys(i)
        d = sched.acquire(key, weight, SchedRequest(model(i), 100, next(seq)))

        def got(lease: Lease) -> None:
            order.append((i, key))
            held.append((i, lease))

        d.addCallback(got)

    for i in range(clients):
        start(i)
    for _ in range(requests):
        i, lease = held.pop(0)
        lease.release()
        start(i)
    return order


def test_one_decision_per_request_at_32_clients() -> None:
    """32 clients on 4 slots: each request is decided about once (it was 3 with one key and
    56 with a key per client: every release re-decided every key's head after the grant, and
    every arrival re-decided the heads), and the counter agrees with the spy."""
    for keys in (1, 32):
        sched, _, _ = fleet({"http://l:1": (llamacpp(slots=4), BackendSpec(url="http://l:1"))})
        calls = spy(sched)
        def key(i: int, n: int = keys) -> tuple[str, int]:
            return f"k{i % n}", 1

        closed_loop(sched, 32, key, 1000)
        assert len(calls) == sched.decisions
        assert len(calls) <= 1.05 * (1000 + 32), (keys, len(calls))


def test_arrivals_into_a_full_set_cost_no_decision() -> None:
    """Once a waiter found every slot taken, ten more arrivals for the same targets queue
    without a decision; the next release decides again and serves the first in line."""
    sched, _, _ = fleet({"http://l:1": (llamacpp(slots=1), BackendSpec(url="http://l:1"))})
    calls = spy(sched)
    holder = granted(sched.acquire("k", 1, req()))
    first = sched.acquire("k", 1, req(seed=2))
    assert not first.called
    before = len(calls)
    later = [sched.acquire("k", 1, req(seed=10 + i)) for i in range(10)]
    assert len(calls) == before and sched.waiting == 11
    holder.release()
    assert granted(first).target.id == holder.target.id
    assert not any(d.called for d in later)
    assert len(calls) == before + 1  # the grant; the set is full again after it


def test_changes_that_free_a_slot_decide_again() -> None:
    """A set remembered full is decided again after a scrape round that raises its slots
    (the round's kick), a reload of the default capacity, and peers' gauges that drop their
    in-flight count: each serves a waiter."""
    backend = llamacpp(slots=1)
    sched, state, clock = fleet({"http://l:1": (backend, BackendSpec(url="http://l:1"))})
    granted(sched.acquire("k", 1, req()))
    waiters = [sched.acquire("k", 1, req(seed=i)) for i in range(2, 5)]
    assert not any(d.called for d in waiters)
    backend.answers["/props"] = (200, b'{"total_slots":2,"build_info":"b11312-0c1e570"}')
    for _ in range(30):
        clock.advance(1.0)  # rounds; a full one sees two slots
    assert waiters[0].called and not waiters[1].called

    sched2, state2, _ = fleet({"http://m:1": (ollama(["a"]), BackendSpec(url="http://m:1",
                                                                       kind="ollama"))})
    r = SchedRequest("a", 100, 1)
    held = [granted(sched2.acquire("k", 1, r)), granted(sched2.acquire("k", 1, r))]
    third = sched2.acquire("k", 1, r)
    assert not third.called  # the default capacity (2) is taken
    sched2.default_capacity = 3
    sched2.kick()
    assert third.called
    del held


def test_peers_gauges_that_free_a_slot_serve_a_waiter() -> None:
    """A peer's gauges holding the only slot make the set full; its next report with nothing
    in flight serves the waiter (``merge_gauges`` kicks)."""
    sched, state, clock = fleet({"http://l:1": (llamacpp(slots=1), BackendSpec(url="http://l:1"))})
    t = state.targets_for("m")[0]
    sched.merge_gauges("peer", {"inflight": {t.key: 1}, "waiting": {}}, clock.seconds())
    d = sched.acquire("k", 1, req())
    assert not d.called
    assert not sched.acquire("k", 1, req(seed=2)).called
    sched.merge_gauges("peer", {"inflight": {}, "waiting": {}}, clock.seconds())
    assert granted(d).target is t


def test_same_grants_in_the_same_fair_order_as_deciding_every_time() -> None:
    """Weighted keys, two models on two hosts and a closed loop: the grants (who, in what
    order) are exactly those of a scheduler that decides every waiter every time, and every
    client is served again and again (no waiter starves)."""
    def run(remember: bool) -> tuple[list[tuple[int, str]], int]:
        sched, _, _ = fleet({
            "http://a:1": (llamacpp(slots=3), BackendSpec(url="http://a:1")),
            "http://b:1": (llamacpp(slots=2), BackendSpec(url="http://b:1")),
            "http://o:1": (ollama(["a", "b"]), BackendSpec(url="http://o:1", kind="ollama",
                                                          memory_gb=10, capacity=2)),
        })
        if not remember:
            sched.cands.remember_full = lambda *a: None  # type: ignore[method-assign]
        weights = {"heavy": 3, "light": 1, "mid": 2}
        names = list(weights)
        order = closed_loop(sched, 24, lambda i: (names[i % 3], weights[names[i % 3]]), 600,
                            model=lambda i: "m" if i % 4 else ("a" if i % 8 else "b"))
        return order, sched.decisions

    fast, fast_decisions = run(True)
    slow, slow_decisions = run(False)
    assert fast == slow
    assert fast_decisions < slow_decisions / 2, (fast_decisions, slow_decisions)
    assert {i for i, _ in fast} == set(range(24))


def test_no_waiter_is_left_when_the_load_stops() -> None:
    """After a closed loop over weighted keys and two models, releasing the leases with no
    new arrival serves every waiter: a remembered full set never outlives a release."""
    sched, _, _ = fleet({
        "http://a:1": (llamacpp(slots=2), BackendSpec(url="http://a:1")),
        "http://o:1": (ollama(["a"]), BackendSpec(url="http://o:1", kind="ollama",
                                                  memory_gb=10, capacity=1)),
    })
    held: list[Lease] = []
    for i in range(40):
        model = "a" if i % 5 == 0 else "m"
        sched.acquire(f"k{i % 4}", 1 + i % 3, SchedRequest(model, 100, i + 1)
                      ).addCallback(held.append)
    assert sched.waiting == 40 - 3
    released = 0
    while held:
        held.pop(0).release()  # may grant a waiter, appended to ``held``
        released += 1
    assert sched.waiting == 0 and released == 40


def test_a_view_expiring_lets_a_waiter_be_decided_again() -> None:
    """The remembered set holds only while the views its decision read are current: once the
    engine's running count (which filled the slot) goes stale, the next arrival decides again
    and is served."""
    sched, state, clock = fleet({"http://l:1": (llamacpp(slots=1, running=1),
                                                BackendSpec(url="http://l:1"))})
    d = sched.acquire("k", 1, req())
    assert not d.called
    state.service.stopService()  # no more rounds: the running count goes stale
    n = sched.decisions
    clock.advance(120.0)
    later = sched.acquire("k2", 1, req(seed=2))
    assert sched.decisions > n
    assert d.called or later.called
    assert isinstance(state, State)


def test_a_first_byte_costs_no_decision_when_the_set_is_full() -> None:
    """A reply's first byte takes its prefill off the queue but frees no slot: the waiter of
    the full set is not decided again (it was, at every first byte); the release serves it."""
    sched, _, _ = fleet({"http://l:1": (llamacpp(slots=1), BackendSpec(url="http://l:1"))})
    holder = granted(sched.acquire("k", 1, req()))
    waiter = sched.acquire("k", 1, req(seed=2))
    n = sched.decisions
    holder.first_byte()
    assert sched.decisions == n and not waiter.called
    holder.release()
    assert granted(waiter).waited
