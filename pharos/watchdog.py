"""The lease watchdog: a lease older than the drain timeout whose reply moved no byte for a
whole check period is a request nothing will end. That should never happen; the watchdog is
how an operator would learn it did: each such lease is logged once (no prompt text) and
counted (``WaitQueue.stuck``)."""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from pharos.config import DEFAULT_DRAIN_TIMEOUT
from pharos.periodic import Periodic
from pharos.sched import Lease, Scheduler

log = Logger()

#: Seconds between checks; a lease must also have been silent this long.
CHECK_EVERY = 30.0


class Watchdog(Periodic):
    """Checks the scheduler's leases every ``every`` seconds on ``clock``."""

    def __init__(self, sched: Scheduler, clock: IReactorTime,
                 older_than: float = DEFAULT_DRAIN_TIMEOUT, every: float = CHECK_EVERY) -> None:
        super().__init__(clock, every, self.check, what="the lease watchdog's check")
        self.sched = sched
        self.older_than = older_than
        self.every = every
        self._reported: set[int] = set()

    def check(self) -> list[Lease]:
        """The stuck leases found now that were not reported before (logged and counted)."""
        now = self.clock.seconds()
        live = {id(lease) for lease in self.sched.leases}
        self._reported &= live
        found = []
        for lease in self.sched.leases:
            age = now - lease.granted_at
            silent = now - (lease.moved_at if lease.moved_at is not None else lease.granted_at)
            if age > self.older_than and silent >= self.every and id(lease) not in self._reported:
                self._reported.add(id(lease))
                self.sched.queue.stuck += 1
                found.append(lease)
                log.warn("lease on {target} held {age:.0f} s, no byte for {silent:.0f} s",
                         target=lease.target.key, age=age, silent=silent)
        return found
