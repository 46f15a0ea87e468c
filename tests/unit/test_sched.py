"""Layer 1: the scheduler over a real State on a Clock with in-memory backends: placement,
occupancy, capacity fallbacks, the fair queue, bounds and cancellation."""

from __future__ import annotations

from pharos.config import Backend as BackendSpec
from pharos.sched import Lease, QueueFull, SchedRequest, Unavailable, UnknownModel
from tests.support.plan import FakeBackend
from tests.support.sched import GB, fleet, granted, llamacpp, ollama, req


def test_prefers_the_warm_target() -> None:
    """A loaded model wins over the same model cold on another host."""
    sched, state, _ = fleet({
        "http://a:1": (ollama(["a"]), BackendSpec(url="http://a:1", kind="ollama",
                                                  memory_gb=10)),
        "http://b:1": (ollama([]), BackendSpec(url="http://b:1", kind="ollama",
                                               memory_gb=10)),
    })
    lease = granted(sched.acquire("k", 1, req("a")))
    assert lease.target.backend.url == "http://a:1"
    assert lease.decision.why in ("warm", "only_choice", "least_loaded")
    assert not lease.cold


def test_cold_model_goes_where_it_fits() -> None:
    """A cold model loads on the host with room beside its busy models, never on one where it
    would evict a model with requests in flight."""
    sizes = {"a": 6 * GB, "b": 6 * GB}
    sched, state, _ = fleet({
        "http://a:1": (ollama(["a"], sizes), BackendSpec(url="http://a:1", kind="ollama",
                                                          memory_gb=10, capacity=4)),
        "http://b:1": (ollama(["a"], sizes), BackendSpec(url="http://b:1", kind="ollama",
                                                          memory_gb=20, capacity=4)),
    })
    busy = [granted(sched.acquire("k", 1, req("a", seed=s))) for s in range(2)]
    assert {lease.target.backend.url for lease in busy} == {"http://a:1", "http://b:1"}
    lease = granted(sched.acquire("k", 1, req("b")))
    assert lease.target.backend.url == "http://b:1"
    assert lease.cold


def test_queues_when_busy_and_a_freed_slot_serves_the_next() -> None:
    """With every slot taken the request waits; releasing a lease serves it at once."""
    sched, state, _ = fleet({"http://l:1": (llamacpp(slots=1), BackendSpec(url="http://l:1"))})
    first = granted(sched.acquire("k", 1, req()))
    second = sched.acquire("k", 1, req())
    assert not second.called and sched.waiting == 1
    first.release()
    lease = granted(second)
    assert lease.waited
    assert sched.waiting == 0


def test_fair_queue_serves_keys_by_weight() -> None:
    """Deficit round-robin: a weight-2 key gets two grants for each one of a weight-1 key,
    also when slots free one at a time."""
    sched, state, _ = fleet({"http://l:1": (llamacpp(slots=1), BackendSpec(url="http://l:1"))})
    holder = granted(sched.acquire("x", 1, req()))
    order: list[str] = []
    leases: list[Lease] = []
    for i in range(6):
        for key, weight in (("heavy", 2), ("light", 1)):
            d = sched.acquire(key, weight, req(seed=i))

            def got(lease: Lease, k: str = key) -> None:
                order.append(k)
                leases.append(lease)

            d.addCallback(got)
    holder.release()
    while leases:
        leases.pop().release()
    assert order[:9] == ["heavy", "heavy", "light"] * 3


def test_retry_goes_to_the_front_of_its_key() -> None:
    """A retried request does not wait behind its own key's later requests."""
    sched, state, _ = fleet({"http://l:1": (llamacpp(slots=1), BackendSpec(url="http://l:1"))})
    holder = granted(sched.acquire("k", 1, req()))
    order: list[str] = []
    sched.acquire("k", 1, req(seed=2)).addCallback(lambda _: order.append("later"))
    sched.acquire("k", 1, req(seed=3), front=True).addCallback(lambda _: order.append("retry"))
    holder.release()
    assert order[0] == "retry"


def test_bounded_queue_and_cancellation() -> None:
    """Past the queue limit a request fails with QueueFull; a cancelled waiter leaves."""
    sched, state, _ = fleet({"http://l:1": (llamacpp(slots=1), BackendSpec(url="http://l:1"))})
    sched.queue.limit = 1
    granted(sched.acquire("k", 1, req()))
    waiter = sched.acquire("k", 1, req())
    over = sched.acquire("k", 1, req())
    errors: list[object] = []
    over.addErrback(lambda f: errors.append(f.value))
    assert isinstance(errors[0], QueueFull)
    waiter.addErrback(lambda f: None)
    waiter.cancel()
    assert sched.waiting == 0


def test_unknown_model_and_unavailable() -> None:
    """A model no backend ever listed is unknown (404); one only a down backend lists is
    unavailable (503)."""
    backend = llamacpp()
    sched, state, clock = fleet({"http://l:1": (backend, BackendSpec(url="http://l:1"))})
    errors: list[object] = []
    sched.acquire("k", 1, req("nope")).addErrback(lambda f: errors.append(f.value))
    state.eject(state.backends["http://l:1"])
    sched.acquire("k", 1, req("m")).addErrback(lambda f: errors.append(f.value))
    assert [type(e) for e in errors] == [UnknownModel, Unavailable]


def test_capacity_fallback_saturates_after_two_or_on_engine_waiting() -> None:
    """Without engine or config capacity a target takes 2 requests, or none more once the
    engine reports a queue."""
    fake = FakeBackend({"/v1/models": (200, b'{"data":[{"id":"m"}]}')})
    sched, state, clock = fleet({"http://o:1": (fake, BackendSpec(url="http://o:1",
                                                                  kind="openai"))})
    a = granted(sched.acquire("k", 1, req()))
    granted(sched.acquire("k", 1, req()))
    third = sched.acquire("k", 1, req())
    assert not third.called
    a.release()
    assert third.called


def test_occupancy_counts_the_engines_fresh_running() -> None:
    """Requests that bypass Pharos count: the engine's fresh Running fills the slots."""
    backend = llamacpp(slots=2, running=2)
    sched, state, clock = fleet({"http://l:1": (backend, BackendSpec(url="http://l:1"))})
    d = sched.acquire("k", 1, req())
    assert not d.called
    backend.answers["/metrics"] = (200, b"llamacpp:requests_processing 1\n"
                                        b"llamacpp:requests_deferred 0\n")
    clock.advance(1.0)  # the next round kicks the queue
    assert d.called


def test_a_prefill_window_starts_when_the_prefill_ahead_ended() -> None:
    """Two requests granted together on one slow engine: the first's window is its whole TTFT;
    the second's starts at the first's first byte (the engine prefilled it after), and one
    granted after that first byte counts from its own grant."""
    sched, state, clock = fleet({"http://l:1": (llamacpp(slots=4), BackendSpec(
        url="http://l:1", kind="llamacpp"))})
    a, b = granted(sched.acquire("k", 1, req())), granted(sched.acquire("k", 1, req(seed=2)))
    clock.advance(1.0)
    a.first_byte()
    clock.advance(0.5)
    b.first_byte()
    clock.advance(0.25)
    c = granted(sched.acquire("k", 1, req(seed=3)))
    clock.advance(0.75)
    c.first_byte()
    assert (a.prefill_window_sec, b.prefill_window_sec, c.prefill_window_sec) == (1.0, 0.5, 0.75)


def test_a_key_over_its_share_leaves_the_last_slot_to_an_active_key_under_it() -> None:
    """Eight slots (a room of one), two active keys: the heavy key takes seven and its eighth
    request waits (the light key is active and under its share), so the light key's request
    starts at once; a key alone, or once the other has been silent past ACTIVE_SEC, takes
    every slot."""
    from pharos.fairq import ACTIVE_SEC

    sched, state, clock = fleet({"http://l:1": (llamacpp(slots=8), BackendSpec(url="http://l:1"))})
    alone = [granted(sched.acquire("solo", 1, req(seed=i))) for i in range(8)]
    # Each heavy request starts as it is granted, so pacing (its own test) holds none here.
    first_byte = lambda lease: (lease.first_byte(), lease)[1]  # noqa: E731
    for lease in alone:
        lease.release()
    clock.pump([1.0] * int(ACTIVE_SEC + 1))
    light_first = granted(sched.acquire("light", 1, req(seed=9)))
    light_first.release()
    heavy = [sched.acquire("heavy", 1, req(seed=i)).addCallback(first_byte) for i in range(9)]
    assert sum(d.called for d in heavy) == 7 and sched.waiting == 2 and sched.queue.paced == 0
    light = granted(sched.acquire("light", 1, req(seed=10)))
    assert light.target is not None and sched.waiting == 2
    light.release()  # its slot is kept for it again while it stays active
    assert sum(d.called for d in heavy) == 7
    clock.pump([1.0] * int(ACTIVE_SEC + 1))  # rounds kick the queue
    # The light key has gone quiet: the heavy key gets the last slot.
    assert sum(d.called for d in heavy) == 8


def test_a_key_over_its_share_starts_one_prefill_at_a_time_per_target() -> None:
    """Sixteen slots, the light key active with a request running: the heavy key's streamed
    requests within its share (eight) go at once; past it, each waits for the prefills
    already sent to the target to start (their first byte), or PACE_MAX_SEC when none comes.
    The light key's own requests are never held, a request not streamed holds nothing (its
    first byte is its last), and a heavy key alone is not paced."""
    import dataclasses

    from pharos.fairq import ACTIVE_SEC
    from pharos.sched import PACE_MAX_SEC

    def stream(seed: int) -> SchedRequest:
        return dataclasses.replace(req(seed=seed), stream=True)

    sched, state, clock = fleet({"http://l:1": (llamacpp(slots=16),
                                                BackendSpec(url="http://l:1"))})
    light = granted(sched.acquire("light", 1, stream(99)))
    light.first_byte()
    heavy = [sched.acquire("heavy", 1, stream(i)) for i in range(10)]
    assert sum(d.called for d in heavy) == 8 and sched.waiting == 2 and sched.queue.paced > 0
    started = [granted(d) for d in heavy[:8]]
    for lease in started[:7]:
        lease.first_byte()
    assert sum(d.called for d in heavy) == 8  # one of them has not started yet
    started[7].first_byte()
    ninth = granted(heavy[8])
    assert not heavy[9].called  # the ninth's prefill is the target's now
    clock.advance(PACE_MAX_SEC * 0.9)
    assert not heavy[9].called
    clock.advance(PACE_MAX_SEC * 0.2)  # no first byte came: the hold ends
    tenth = granted(heavy[9])
    # The light key is under its share: never paced, whatever has not started.
    light_again = granted(sched.acquire("light", 1, stream(98)))
    for lease in (ninth, tenth, light_again):
        lease.first_byte()
    # Not streamed: the first holds nothing for the second, though it has no first byte.
    plain = [granted(sched.acquire("heavy", 1, req(seed=30 + i))) for i in range(2)]
    assert all(lease.target is not None for lease in plain)
    # Alone (the light key done and silent past ACTIVE_SEC), the heavy key is not paced.
    light.release()
    light_again.release()
    clock.pump([1.0] * int(ACTIVE_SEC + 1))
    more = [sched.acquire("heavy", 1, stream(20 + i)) for i in range(3)]
    assert all(d.called for d in more)


def test_pacing_sends_a_flooding_key_to_a_target_not_held_and_a_stream_holds_to_its_first_byte(
        ) -> None:
    """Two targets of eight slots, the light key active: once the heavy key is over its share,
    its request goes to the target whose prefills have all started rather than waiting for the
    one holding an unstarted prefill; with both held it waits, and a streamed request holds
    its target until its first byte, past its predicted TTFT (up to PACE_MAX_SEC)."""
    import dataclasses

    from pharos.sched import PACE_MAX_SEC

    sched, state, clock = fleet({
        "http://l:1": (llamacpp(slots=8), BackendSpec(url="http://l:1", capacity=8)),
        "http://l:2": (llamacpp(slots=8), BackendSpec(url="http://l:2", capacity=8))})

    def stream(seed: int) -> SchedRequest:
        return dataclasses.replace(req(seed=seed), stream=True)

    light = granted(sched.acquire("light", 1, stream(99)))
    light.first_byte()
    within = [granted(sched.acquire("heavy", 1, stream(i))) for i in range(8)]  # its share
    for lease in within:
        lease.first_byte()
    a = granted(sched.acquire("heavy", 1, stream(10)))  # over its share: nothing unstarted
    b = granted(sched.acquire("heavy", 1, stream(11)))
    assert b.target is not a.target  # a's target is held by a's prefill
    c = sched.acquire("heavy", 1, stream(12))
    assert not c.called and sched.queue.paced >= 1  # both held
    assert a.est_ttft is not None and a.est_ttft < PACE_MAX_SEC * 0.9
    clock.advance(min(a.est_ttft, b.est_ttft or 0.0) + 0.01)
    assert not c.called  # streamed: held past the predicted TTFT, until a first byte
    a.first_byte()
    assert granted(c).target is a.target
