"""Layer 1: the lease watchdog and the wedged-queue signal behind /healthz, on a Clock."""

from __future__ import annotations

from twisted.internet.task import Clock

from pharos.config import Backend as BackendSpec
from pharos.sched import Scheduler
from pharos.watchdog import Watchdog
from tests.support.sched import fleet, granted, llamacpp, req


def _one_slot() -> tuple[Scheduler, Clock]:
    sched, _, clock = fleet({"http://a": (llamacpp(slots=1), BackendSpec(
        url="http://a", kind="llamacpp", capacity=1))})
    return sched, clock


def test_a_silent_lease_past_the_drain_timeout_is_reported_once() -> None:
    """A lease held past ``older_than`` is left alone while its bytes move, then logged and
    counted once when it falls silent for a check period; a released one is forgotten."""
    sched, clock = _one_slot()
    dog = Watchdog(sched, clock, older_than=100, every=10)
    dog.startService()
    lease = granted(sched.acquire("k", 1, req()))
    for _ in range(40):  # 200 s of bytes every 5 s: old, but moving
        clock.pump([1.0] * 5)
        lease.touch()
    assert sched.queue.stuck == 0
    clock.pump([1.0] * 25)
    assert sched.queue.stuck == 1
    clock.pump([1.0] * 100)
    assert sched.queue.stuck == 1  # reported once
    lease.release()
    assert dog.check() == []
    dog.stopService()


def test_stuck_for_counts_only_while_requests_wait_without_progress() -> None:
    """``stuck_for`` is None with nobody waiting, grows while a waiter sees no grant and no
    release, and ends when a lease is given back."""
    sched, clock = _one_slot()
    assert sched.queue.stuck_for(clock.seconds()) is None
    held = granted(sched.acquire("k", 1, req()))
    waiter = sched.acquire("k", 1, req())
    assert not waiter.called
    clock.pump([1.0] * 50)  # the scrapers keep the backend up meanwhile
    assert sched.queue.stuck_for(clock.seconds()) == 50
    held.release()
    assert waiter.called
    assert sched.queue.stuck_for(clock.seconds()) is None
