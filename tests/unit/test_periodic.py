"""The periodic-service helper on a ``Clock``: first-call timing, intervals counted from the end
of a call, jitter, failures that do not stop the loop, and a stop that waits for the call."""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import capturedLogs, formatEvent

from pharos.periodic import Periodic


def test_first_call_after_one_interval_then_every_interval() -> None:
    """Without ``now`` or ``spread`` the first call comes one interval after start."""
    clock, calls = Clock(), []
    loop = Periodic(clock, 5.0, lambda: calls.append(clock.seconds()))
    loop.startService()
    clock.pump([4.9, 0.1, 5.0, 5.0])
    assert calls == [5.0, 10.0, 15.0]


def test_now_calls_at_start_and_spread_draws_the_first_delay() -> None:
    """``now`` calls at once; ``spread`` waits ``random() * interval`` first."""
    clock, calls = Clock(), []
    Periodic(clock, 4.0, lambda: calls.append(("now", clock.seconds())), now=True).startService()
    assert calls == [("now", 0.0)]
    Periodic(clock, 4.0, lambda: calls.append(("spread", clock.seconds())), spread=True,
             random=lambda: 0.25).startService()
    clock.advance(1.0)
    assert calls == [("now", 0.0), ("spread", 1.0)]


def test_the_interval_counts_from_the_end_of_a_slow_call() -> None:
    """A call that takes 3 s of a 5 s interval is followed 5 s after it ended, never
    overlapping."""
    clock, started, pending = Clock(), [], []

    def work() -> Deferred[None]:
        started.append(clock.seconds())
        d: Deferred[None] = Deferred()
        pending.append(d)
        return d

    Periodic(clock, 5.0, work, now=True).startService()
    clock.advance(3.0)
    pending.pop().callback(None)
    clock.advance(4.9)
    assert started == [0.0]
    clock.advance(0.1)
    assert started == [0.0, 8.0]


def test_jitter_varies_each_later_wait() -> None:
    """With jitter 0.1 and ``random`` at 1.0 and then 0.0, the waits are 11 s and 9 s."""
    clock, calls = Clock(), []
    draws = iter([1.0, 0.0, 0.5])
    Periodic(clock, 10.0, lambda: calls.append(clock.seconds()), now=True, jitter=0.1,
             random=lambda: next(draws)).startService()
    clock.pump([11.0, 9.0])
    assert calls == [0.0, 11.0, 20.0]


def test_a_failing_call_is_logged_and_the_loop_goes_on() -> None:
    """An exception does not stop the loop (as it would a ``LoopingCall``)."""
    clock, calls = Clock(), []

    def work() -> None:
        calls.append(clock.seconds())
        raise RuntimeError("boom")

    with capturedLogs() as events:
        Periodic(clock, 1.0, work, now=True, what="the check").startService()
        clock.pump([1.0, 1.0])
    assert calls == [0.0, 1.0, 2.0]
    failed = [e for e in events if "log_failure" in e]
    assert len(failed) == 3 and formatEvent(failed[0]) == "the check failed"


def test_stop_cancels_the_next_call_and_waits_for_the_one_under_way() -> None:
    """``stopService`` fires once the call in flight ends, and nothing runs after it;
    with ``cancel`` the call in flight is cancelled at once."""
    clock, pending, calls = Clock(), [], []

    def work() -> Deferred[None]:
        calls.append(clock.seconds())
        d: Deferred[None] = Deferred()
        pending.append(d)
        return d

    loop = Periodic(clock, 1.0, work, now=True)
    loop.startService()
    stopped = loop.stopService()
    assert not stopped.called and loop.busy
    pending.pop().callback(None)
    assert stopped.called and not loop.busy
    clock.advance(10.0)
    assert calls == [0.0]

    cancelling = Periodic(clock, 1.0, work, now=True, cancel=True)
    cancelling.startService()
    assert cancelling.stopService().called and pending[0].called
    idle = Periodic(clock, 1.0, work)
    idle.startService()
    assert idle.stopService().called
    clock.advance(10.0)
    assert calls == [0.0, 10.0]


def test_a_restart_during_a_call_does_not_run_two_at_once() -> None:
    """Stopped and started again while a call is under way, the loop waits for that call and
    counts the interval from its end."""
    clock, pending, calls = Clock(), [], []

    def work() -> Deferred[None]:
        calls.append(clock.seconds())
        d: Deferred[None] = Deferred()
        pending.append(d)
        return d

    loop = Periodic(clock, 1.0, work, now=True)
    loop.startService()
    loop.stopService()
    loop.startService()
    assert calls == [0.0]
    clock.advance(2.0)
    pending.pop().callback(None)
    clock.advance(1.0)
    assert calls == [0.0, 3.0] and len(clock.getDelayedCalls()) == 0
