"""Periodic work, one way everywhere. ``TimerService`` and ``LoopingCall`` stop for good on
the first exception (while ``running`` stays True) and align calls to the start time, so loops
started together fire in step; this loop logs a failure and carries on, counts the interval
from the end of a call (never two at once) and can spread the first call and jitter the rest.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable

from twisted.application.service import Service
from twisted.internet.defer import CancelledError, Deferred, maybeDeferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

log = Logger()


class Periodic(Service):
    """Calls ``work`` (a Deferred or coroutine is waited for) every ``interval`` seconds on
    ``clock`` while running, counted from the end of the last call.

    The first call comes at start when ``now``, else after ``random() * interval`` when
    ``spread``, else after ``interval``; ``jitter`` varies later waits by up to that fraction.
    A failure is logged as "``what`` failed" and the loop goes on. ``stopService`` fires once
    the call under way has ended (cancelled first when ``cancel``); it never fails.
    """

    def __init__(self, clock: IReactorTime, interval: float, work: Callable[[], object], *,
                 what: str = "periodic work", now: bool = False, spread: bool = False,
                 jitter: float = 0.0, random: Callable[[], float] = _random.random,
                 cancel: bool = False) -> None:
        self.clock = clock
        self.interval = interval
        self.work = work
        self.what = what
        self.now, self.spread, self.jitter, self.random, self.cancel = (
            now, spread, jitter, random, cancel)
        self._next: IDelayedCall | None = None
        self._busy: Deferred[object] | None = None

    def startService(self) -> None:
        super().startService()
        if self._busy is not None:  # restarted during a call: its end schedules the next
            return
        if self.now:
            self._run()
        else:
            self._schedule(self.random() * self.interval if self.spread else self.interval)

    def stopService(self) -> Deferred[None]:
        super().stopService()
        if self._next is not None and self._next.active():
            self._next.cancel()
        self._next = None
        busy = self._busy
        if busy is None:
            return succeed(None)
        ended: Deferred[None] = Deferred()
        busy.addBoth(lambda _: ended.callback(None))
        if self.cancel:
            busy.cancel()
        return ended

    @property
    def busy(self) -> bool:
        """Whether a call is under way."""
        return self._busy is not None

    def _schedule(self, delay: float) -> None:
        if self.running:
            self._next = self.clock.callLater(delay, self._run)

    def _run(self) -> None:
        self._next = None
        d = self._busy = maybeDeferred(self.work)
        d.addErrback(self._failed)
        d.addBoth(self._ended)

    def _failed(self, f: Failure) -> None:
        if not f.check(CancelledError):
            log.failure("{what} failed", f, what=self.what)

    def _ended(self, _: object) -> None:
        self._busy = None
        jitter = self.jitter
        self._schedule(self.interval * (1 + jitter * (2 * self.random() - 1)) if jitter
                       else self.interval)
