"""Layer 1: capacity learned from what an engine reports (issue 10 item 3), on a Clock with a
scripted vLLM (which exports no max-num-seqs): probing upward while requests wait in Pharos
for the target and the engine has no queue, Running taken as the
capacity when the engine queues (and no slot tried past it then), never below what it was
seen running, hostile counts ignored, config and engine-reported capacity winning."""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from pharos.config import Backend as BackendSpec
from pharos.sched import (
    CAPACITY_CONFIG,
    CAPACITY_DEFAULT,
    CAPACITY_LEARNED,
    REPROBE_ROUNDS,
    Lease,
    Scheduler,
)
from pharos.state.registry import BackendState, Target
from tests.support.capacity import report, vllm
from tests.support.plan import FakeBackend
from tests.support.sched import fleet, req

URL = "http://v"


def rig(capacity: int | None = None) -> tuple[Scheduler, Clock, FakeBackend, Target]:
    engine = vllm()
    report(engine, 0)
    sched, state, clock = fleet({URL: (engine, BackendSpec(url=URL, kind="vllm",
                                                           capacity=capacity))})

    def round_done(backend: BackendState) -> None:
        sched.learn_capacity(backend)
        sched.kick()

    state.on_round = round_done
    (target,) = state.targets
    return sched, clock, engine, target


def hold(sched: Scheduler, n: int) -> list[Deferred[Lease]]:
    return [sched.acquire("k", 1, req()) for _ in range(n)]


def test_probes_up_one_slot_a_round_while_pharos_waits_and_the_engine_does_not() -> None:
    """Starting from the 2-slot fallback, every round in which the engine runs all Pharos sent
    with no queue of its own while requests wait in Pharos adds one slot."""
    sched, clock, engine, t = rig()
    assert sched.capacity_of(t) == (None, CAPACITY_DEFAULT)
    waiters = hold(sched, 20)
    for _ in range(10):
        report(engine, t.inflight)
        clock.pump([1.0])
    assert t.learned_capacity is not None and t.learned_capacity >= 10
    assert sched.capacity_of(t) == (t.learned_capacity, CAPACITY_LEARNED)
    assert sum(d.called for d in waiters) == t.inflight


def test_a_wait_between_rounds_is_a_reason_to_probe() -> None:
    """A burst that waited in Pharos and was served before the next round still adds a slot
    (short requests come and go between rounds); a round with no wait adds none."""
    sched, clock, engine, t = rig()
    report(engine, 0)
    clock.pump([1.0])
    assert t.learned_capacity is None
    d = hold(sched, 3)
    assert [x.called for x in d] == [True, True, False]  # the third waited
    leases: list[Lease] = []
    for x in d:
        x.addCallback(leases.append)
    leases[0].release()
    assert d[2].called
    leases[1].release()
    leases[2].release()
    clock.pump([1.0])
    assert t.learned_capacity == 3
    clock.pump([1.0] * 3)
    assert t.learned_capacity == 3


def test_leases_on_replies_the_engine_has_finished_leave_room() -> None:
    """Pharos holds a lease until the client has the last byte, so its in-flight count can
    be far above the engine's Running (a slow client or relay; seen on a live vLLM: Running 0
    with 9 leases held). The engine has room then: requests waiting in Pharos with no engine
    queue add a slot a round until the engine queues."""
    sched, clock, engine, t = rig()
    hold(sched, 20)
    for _ in range(5):
        report(engine, 0)
        clock.pump([1.0])
    assert t.learned_capacity == 7 and t.inflight == 7
    for _ in range(3):
        report(engine, 7, 2)
        clock.pump([1.0])
    assert t.learned_capacity == 7 and t.capacity_seen_queue


def queued_at_six() -> tuple[Scheduler, Clock, FakeBackend, Target]:
    """20 requests through Pharos to an engine that runs 6 and queues the rest: by the eighth
    round the queue has set the capacity to 6."""
    sched, clock, engine, t = rig()
    hold(sched, 20)
    for _ in range(8):
        report(engine, min(t.inflight, 6), max(0, t.inflight - 6))
        clock.pump([1.0])
    assert t.learned_capacity == 6 and t.capacity_seen_queue
    return sched, clock, engine, t


def test_an_engine_queue_sets_the_capacity_to_its_running_count() -> None:
    """When the engine reports waiting > 0, its Running is the capacity (a probe that went one
    too far comes back), and it stays when the engine goes quiet."""
    sched, clock, engine, t = queued_at_six()
    report(engine, 0, 0)
    clock.pump([1.0] * 5)
    assert t.learned_capacity == 6


def test_no_slot_is_tried_past_a_capacity_the_engine_queue_set() -> None:
    """Once the engine's queue set the capacity, an engine running exactly that many with
    no queue while Pharos has waiters is full, not a reason to try one more (a try parks a
    request in the engine's queue until two rounds in a row see it, and on a live vLLM at
    its --max-num-seqs it came back every few rounds); a higher count seen running still
    raises it."""
    sched, clock, engine, t = queued_at_six()
    for _ in range(5):
        report(engine, 6, 0)  # the queue drained: Pharos sends only 6 now
        clock.pump([1.0])
    assert t.learned_capacity == 6
    report(engine, 7, 0)
    clock.pump([1.0])
    assert t.learned_capacity == 7


def test_a_queue_for_kv_blocks_sets_no_capacity() -> None:
    """An engine that queues while its running requests hold (nearly) its whole KV pool is
    waiting for blocks, not at its sequence cap: the capacity is not pinned there, the target
    counts as full while the queue lasts, and once the queue drains and Pharos still has
    waiters the probing goes on upward."""
    sched, clock, engine, t = rig()
    hold(sched, 30)
    for _ in range(4):
        report(engine, t.inflight)
        clock.pump([1.0])
    before = t.learned_capacity
    assert before is not None and before >= 4
    for _ in range(4):
        report(engine, 3, t.inflight - 3, kv=0.97)
        clock.pump([1.0])
    assert t.learned_capacity == before and not t.capacity_seen_queue
    assert sched.candidate(t, 0).free_slots == 0  # full at what it runs while it queues
    for _ in range(4):
        report(engine, t.inflight, 0, kv=0.5)
        clock.pump([1.0])
    assert t.learned_capacity is not None and t.learned_capacity >= before + 3


def test_a_pinned_capacity_is_tried_again_after_quiet_rounds() -> None:
    """A capacity an engine queue set is not final: after REPROBE_ROUNDS rounds in a row in
    which requests found the target full and the engine queued nothing, one more slot is
    tried; an engine that queues again at that count pins it back."""
    sched, clock, engine, t = queued_at_six()
    for _ in range(REPROBE_ROUNDS - 1):
        report(engine, 6, 0)
        clock.pump([1.0])
    assert t.learned_capacity == 6
    report(engine, 6, 0)
    clock.pump([1.0])
    assert t.learned_capacity == 7 and not t.capacity_seen_queue
    for _ in range(3):
        report(engine, 6, 1)  # the seventh waits in the engine: 6 was the cap after all
        clock.pump([1.0])
    assert t.learned_capacity == 6 and t.capacity_seen_queue


def test_never_below_what_it_was_seen_running() -> None:
    """An engine seen running 9 at once (clients bypassing Pharos) has at least 9 slots, even
    if it later queues at 5 running."""
    sched, clock, engine, t = rig()
    report(engine, 9)
    clock.pump([1.0])
    assert t.learned_capacity == 9
    report(engine, 5, 3)
    clock.pump([1.0])
    assert t.learned_capacity == 9


def test_hostile_or_flapping_counts_learn_nothing() -> None:
    """A Running count no engine could have, a negative one or one that vanishes leaves the
    learned capacity as it was."""
    sched, clock, engine, t = rig()
    report(engine, 7)
    clock.pump([1.0])
    for bad in (1e9, -3, "NaN"):
        report(engine, bad)
        clock.pump([1.0])
        assert t.learned_capacity == 7, bad
    engine.answers["/metrics"] = (200, b"")  # the metrics page lost its series
    clock.pump([1.0] * 3)
    assert t.learned_capacity == 7


def test_an_implausible_running_count_is_unknown_not_a_full_engine() -> None:
    """A round reporting more running than any engine has (1e9) is no occupancy: the target
    is priced on Pharos's own in-flight count, as if the engine had said nothing."""
    sched, clock, engine, t = rig()
    report(engine, 1e9)
    clock.pump([1.0])
    assert sched.candidate(t, 0).free_slots == 2
    report(engine, 2)
    clock.pump([1.0])
    assert sched.candidate(t, 0).free_slots == 0


def test_an_engine_that_keeps_queueing_is_full_at_what_it_runs() -> None:
    """capacity: 64 in config, but the engine runs 4 and queues 3 (a KV pool that holds only
    4 prompts): after one such round the target still has 60 free slots (a request waiting one
    engine step is no queue); after two it is full at 4, so a request sent there is priced as
    waiting for one of those 4 to end; once the queue is gone the 64 slots are back."""
    sched, clock, engine, t = rig(capacity=64)
    report(engine, 4, waiting=3)
    clock.pump([1.0])
    c = sched.candidate(t, 0)
    assert (c.capacity, c.free_slots) == (64, 60)
    clock.pump([1.0])
    c = sched.candidate(t, 0)
    assert (c.capacity, c.free_slots, c.queue_ahead) == (4, 0, 3)
    report(engine, 4, waiting=0)
    clock.pump([1.0])
    c = sched.candidate(t, 0)
    assert (c.capacity, c.free_slots) == (64, 60)


def test_config_capacity_wins_and_nothing_is_learned() -> None:
    """capacity: in config is an override: used as is, never learned over."""
    sched, clock, engine, t = rig(capacity=3)
    hold(sched, 10)
    for _ in range(5):
        report(engine, t.inflight)
        clock.pump([1.0])
    assert t.inflight == 3 and t.learned_capacity is None
    assert sched.capacity_of(t) == (3, CAPACITY_CONFIG)


def test_with_the_metrics_unanswered_its_own_started_requests_still_teach() -> None:
    """The engine's /metrics fails every round (a busy engine past the deadline) while every
    request Pharos has there got its first byte and its replies flow: one slot more a round
    all the same; with one request still without its first byte (the engine may be queueing
    it), none."""
    from pharos.engine.fetch import FetchError

    def started(lease: Lease) -> Lease:
        lease.first_byte()  # the engine's first byte (once: it ignores a repeat)
        return lease

    sched, clock, engine, t = rig()
    waiters = hold(sched, 20)
    clock.pump([1.0])
    engine.answers["/metrics"] = FetchError("no answer within 0.8 s")
    for _ in range(4):
        for d in waiters:
            if d.called:
                d.addCallback(started)
        t.backend.replied_at = clock.seconds()
        clock.pump([1.0])
    learned = t.learned_capacity
    assert learned is not None and learned >= 4, learned
    for _ in range(3):  # no first bytes from here: the slot granted next stays unstarted
        t.backend.replied_at = clock.seconds()
        clock.pump([1.0])
    assert t.learned_capacity is not None and t.learned_capacity <= learned + 1
