"""Readiness and drain: what makes restarts and rolling updates invisible to clients.

``/healthz`` answers 503 until the state is restored and the first scrape round has finished
(``Health``), and from the first moment of a drain. ``Drain.run``, on SIGTERM: ``/healthz``
turns 503; requests are still accepted for ``drain.grace`` so the load balancer notices; then
the listener stops, idle keep-alive connections close and busy ones close after their reply;
requests in flight get ``drain.timeout``, then the rest are cut. The service tree does the
rest (``pharos.tap``). ``PublicSite`` hands every request to ``Drain.track``: one set insertion
and one ``notifyFinish`` per request.
"""

from __future__ import annotations

import os
import signal
import weakref
from collections.abc import Callable
from typing import Any

from klein import Klein
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.web.http import HTTPChannel
from twisted.web.server import Request

from pharos.config import DEFAULT_DRAIN_GRACE, DEFAULT_DRAIN_TIMEOUT
from pharos.proxy.live import LiveConfig
from pharos.proxy.site import add_error_handling, reply
from pharos.sched import Scheduler
from pharos.state.state import State

log = Logger()

#: Seconds to wait for cut connections to report themselves closed.
CUT_WAIT = 5.0


class Health:
    """The lifecycle part of ``/healthz``: ``restored`` once the restore sources ran (a bare
    one starts restored), ``draining`` from the first moment of a drain."""

    def __init__(self, restored: bool = True) -> None:
        self.restored = restored
        self.draining = False

    def status(self) -> str | None:
        """Why ``/healthz`` answers 503 (``draining``, ``starting``), or None."""
        if self.draining:
            return "draining"
        if not self.restored:
            return "starting"
        return None


class Drain:
    """The public requests in flight, and the drain sequence over them."""

    def __init__(self, clock: IReactorTime, health: Health,
                 grace: float = DEFAULT_DRAIN_GRACE,
                 timeout: float = DEFAULT_DRAIN_TIMEOUT) -> None:
        self.clock = clock
        self.health = health
        self.grace = grace
        self.timeout = timeout
        self.inflight: set[Request] = set()
        self._channels: weakref.WeakSet[HTTPChannel] = weakref.WeakSet()
        self._idle: list[Deferred[None]] = []
        #: The listener stopped listening: replies end their connections.
        self.closed = False
        #: Requests cut at the timeout (tests, the log).
        self.cut = 0

    def track(self, request: Request) -> None:
        """A request arrived: in flight until it finishes or its client goes."""
        self.inflight.add(request)
        channel = request.channel
        if channel is not None:
            self._channels.add(channel)
            if self.closed:
                channel.persistent = False
        request.notifyFinish().addBoth(lambda _: self._done(request))

    def _done(self, request: Request) -> None:
        self.inflight.discard(request)
        if not self.inflight:
            waiting, self._idle = self._idle, []
            for d in waiting:
                d.callback(None)

    def idle(self) -> Deferred[None]:
        """Fires when no request is in flight."""
        d: Deferred[None] = Deferred()
        if not self.inflight:
            d.callback(None)
        else:
            self._idle.append(d)
        return d

    async def run(self, stop_listening: Callable[[], Deferred[None] | None]) -> None:
        """The drain: 503 at once, ``grace`` seconds of requests as usual, the listener closed,
        the requests in flight given ``timeout`` seconds, the rest cut. Never fails."""
        self.health.draining = True
        log.info("draining: /healthz answers 503; requests accepted for {grace:g} s more "
                 "(a second signal ends Pharos at once)", grace=self.grace)
        if self.grace > 0:
            await deferLater(self.clock, self.grace)
        try:
            await maybeDeferred(stop_listening)
        except Exception as e:
            log.error("draining: closing the listener failed: {why}", why=str(e))
        self.closed = True
        self._close_idle()
        if self.inflight:
            log.info("draining: listener closed; {n} request(s) in flight get up to "
                     "{timeout:g} s", n=len(self.inflight), timeout=self.timeout)
            if not await self._within(self.idle(), self.timeout):
                self._cut()
                await self._within(self.idle(), CUT_WAIT)
        log.info("draining: done")

    def _close_idle(self) -> None:
        """Idle keep-alive connections close now, busy ones after their reply."""
        for channel in list(self._channels):
            if channel.transport is None or getattr(channel.transport, "disconnected", True):
                continue
            channel.persistent = False
            if not channel.requests:
                channel.loseConnection()

    def _cut(self) -> None:
        """The timeout passed: end the connections of the requests still in flight (each
        cancels its engine request)."""
        self.cut = len(self.inflight)
        log.warn("draining: {n} request(s) still in flight after {timeout:g} s: cut",
                 n=self.cut, timeout=self.timeout)
        for request in list(self.inflight):
            channel = request.channel
            transport = channel.transport if channel is not None else None
            if transport is None:
                self._done(request)
                continue
            abort = getattr(transport, "abortConnection", None)
            (abort or transport.loseConnection)()

    async def _within(self, d: Deferred[None], seconds: float) -> bool:
        """Whether ``d`` fired within ``seconds`` (it is left to fire later, or never)."""
        fired: Deferred[bool] = Deferred()
        timer: IDelayedCall = self.clock.callLater(seconds, fired.callback, False)

        def done(_: object) -> None:
            if not fired.called:
                timer.cancel()
                fired.callback(True)

        d.addCallback(done)
        return await fired


class HealthPage:
    """``GET /healthz``, no key needed: 503 until restored and first scraped (a load balancer
    never sends traffic blind), from the first moment of a drain, and while requests wait and
    none has started (nor a lease been given back) for ``timeouts.queue_stuck``."""

    app = Klein()
    add_error_handling(app)

    def __init__(self, health: Health, state: State, sched: Scheduler, clock: IReactorTime,
                 live: LiveConfig) -> None:
        self.health = health
        self.state = state
        self.sched = sched
        self.clock = clock
        self.live = live

    @app.route("/healthz", methods=["GET", "HEAD"])
    def healthz(self, request: Request) -> bytes:
        why = self.health.status()
        if why is not None:
            return reply(request, 503, {"status": why})
        if not self.state.ready:
            return reply(request, 503, {"status": "starting"})
        stuck = self.sched.stuck_for(self.clock.seconds())
        if stuck is not None and stuck > self.live.now.config.timeouts.queue_stuck:
            return reply(request, 503, {"status": "stuck", "waiting": self.sched.waiting,
                                        "stuck_seconds": round(stuck, 1)})
        return reply(request, 200, {"status": "ok"})


def second_signal_ends(stopping: Callable[[], bool]) -> None:
    """Wrap the reactor's SIGTERM and SIGINT handlers (once the reactor runs: it installs them at
    start-up) so a signal while Pharos stops, or a second one, ends the process at once; Twisted's
    would only call ``reactor.stop`` again (``ReactorNotRunning``) and wait out the drain."""
    seen: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(signum)
        if not callable(previous):
            continue  # ignored, or the default (which ends the process anyway)

        def handler(num: int, frame: Any, previous: Callable[..., Any] = previous) -> None:
            if seen or stopping():
                log.warn("signal {num} while stopping: ending at once", num=num)
                signal.signal(num, signal.SIG_DFL)
                os.kill(os.getpid(), num)
                return
            seen.append(num)
            previous(num, frame)

        signal.signal(signum, handler)
