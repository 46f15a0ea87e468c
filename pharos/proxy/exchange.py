"""One client request through Pharos, from acquire to the last byte.

An ``Exchange`` is the only owner of its request's lease. Each attempt takes a lease, sends
the request, and either relays the reply or gives the lease back before trying again; ``run``'s
``finally`` gives back whatever is still held. Every way a request can end (the client leaving
before, between or after the engine's headers, an engine error, reset, hang or death, a fault
of Pharos's own) goes through that one place, so no path can skip the release.

Before the engine's first body byte nothing has been written to the client, so an attempt can
still be abandoned and retried elsewhere: when its backend goes down (a failed scrape round or
a refused connection, ``Inflight.backend_down``), when no first byte arrives within the route
family's ``timeouts.first_byte``, or when the engine answers 502, 503 or 504. A 500 is the
request's own fault and reaches the client as the engine sent it. After the first byte there
are no retries; an engine that dies or stalls (``timeouts.stream_idle``) cuts the client.
Each attempt ends in a ``Step``; when to retry, and where, is ``Retries``'s alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Protocol

import attr
from treq.client import HTTPClient
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ConnectError, ConnectionRefusedError
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.web._newclient import RequestTransmissionFailed, ResponseNeverReceived
from twisted.web.iweb import IResponse
from twisted.web.server import Request

from pharos.engine.usage import Usage
from pharos.policy import PolicyConfig
from pharos.proxy import errors
from pharos.proxy.auth import OPEN, Identity
from pharos.proxy.errors import ApiError
from pharos.proxy.parse import Parsed
from pharos.proxy.relay import EngineDied, Relay, Stalled, Tap, collect, response_headers, send
from pharos.proxy.streamtap import StreamTap
from pharos.proxy.unload import unload
from pharos.sched import Lease, QueueFull, SchedRequest, Scheduler, Unavailable, UnknownModel
from pharos.state.registry import BackendState, Target
from pharos.state.state import State
from pharos.state.stats import MIN_REAL_LOAD_SEC, Sample

log = Logger()

#: Routes whose missing support an engine shows with a 404 (coding agents).
AGENT_ROUTES = frozenset({"/v1/messages", "/v1/responses"})
EMBEDDING_ROUTES = frozenset({"/v1/embeddings", "/api/embed", "/api/embeddings"})
#: Engine statuses another engine may answer better: retried once elsewhere before the first
#: byte. 500 is not among them: it is the request's own fault far more often than the engine's.
RETRY_STATUSES = frozenset({502, 503, 504})

#: How an exchange ended (the ``upstream`` decisions).
OK = "ok"
ERROR_STATUS = "error_status"
CONNECT_FAILED = "connect_failed"
DIED_MID_REPLY = "died_mid_reply"
CLIENT_LEFT = "client_left"
TIMED_OUT = "timed_out"
PHAROS_ERROR = "pharos_error"
#: An attempt given up for a retry elsewhere (``upstream``): the engine answered 503,
#: or another 5xx (or 404 on a coding-agent route).
BUSY_RETRIED = "busy_retried"
ERROR_RETRIED = "error_retried"

class Engine(Protocol):
    """The engine leg of an attempt (``EngineLeg``)."""

    def send(self, target: Target, path: str, body: bytes,
             fresh: bool = False) -> Deferred[IResponse]: ...

    def unload(self, target: Target, models: tuple[str, ...]) -> Deferred[int]: ...

    def start_reply(self, request: Request, response: IResponse, target: Target,
                    reason: str, lease: Lease | None = None) -> None: ...


class DecisionSink(Protocol):
    """What the proxy asks of the decision log (``pharos.obs.decisions``; the proxy imports
    no subscriber)."""

    def sampled(self, request_id: str) -> bool: ...

    def decided(self, request_id: str, attempt: int, prompt_tokens: int, lease: Lease
                ) -> None: ...


class Watch(Protocol):
    """Who follows requests through their steps (the live map). ``watching`` is read first,
    so a request nobody watches costs one attribute read; an event that fails is logged and
    never fails the request."""

    @property
    def watching(self) -> bool: ...

    def admitted(self, key: str, model: str | None) -> None: ...

    def queued(self, key: str, model: str | None) -> None: ...

    def routed(self, key: str, target: Target, reason: str) -> None: ...

    def first_byte(self, target: Target, reason: str) -> None: ...


def tell(event: Callable[..., None], *args: object) -> None:
    """One event to a ``Watch``."""
    try:
        event(*args)
    except Exception:
        log.failure("live map: {event} event failed", event=event.__name__)


@attr.s(auto_attribs=True, eq=False)
class EngineLeg:
    """What an attempt asks of the engines: ``send`` its body to a target's route (``fresh``:
    on a new connection, closed after it, when a pooled one turned out dead), ``unload`` a
    host's models first (a cold load's victims, as the host names them; fires when done,
    never fails: ``pharos.proxy.unload``), and ``start_reply``: the engine's head on the
    client's reply, with Pharos's own headers (the live map wraps it to see first bytes)."""

    client: HTTPClient
    fresh_client: HTTPClient
    clock: IReactorTime

    def send(self, target: Target, path: str, body: bytes,
             fresh: bool = False) -> Deferred[IResponse]:
        return send(self.fresh_client if fresh else self.client, target.backend.url + path,
                    body)

    def unload(self, target: Target, models: tuple[str, ...]) -> Deferred[int]:
        return unload(self.client, self.clock, target.backend.url, models)

    def start_reply(self, request: Request, response: IResponse, target: Target,
                    reason: str, lease: Lease | None = None) -> None:
        engine_head(request, response.code, response_headers(response), target)
        request.setHeader(b"x-pharos-reason", reason.encode("ascii", "replace")[:512])
        if lease is not None:
            if lease.policy:
                request.setHeader(b"x-pharos-policy", lease.policy.encode())
            if lease.chain:
                request.setHeader(b"x-pharos-predicted-cached-tokens",
                                  str(lease.predicted_tokens).encode())
            if lease.est_ttft is not None:
                request.setHeader(b"x-pharos-estimated-ttft-ms",
                                  f"{lease.est_ttft * 1000:.1f}".encode())


@dataclass(frozen=True, slots=True)
class Limits:
    """The exchange's time limits in seconds (config ``timeouts:``)."""

    first_byte: float
    stream_idle: float


class _Abandoned(Exception):
    """The attempt's backend went down, or its first byte is late: try elsewhere."""

    def __init__(self, why: str, timed_out: bool) -> None:
        super().__init__(why)
        self.timed_out = timed_out


def disconnected(request: Request) -> bool:
    """Whether the client's connection is gone (``notifyFinish`` never fires after that)."""
    return bool(getattr(request, "_disconnected", False)) or request.channel is None


class Inflight:
    """The exchanges in progress, by backend: a backend that goes down abandons the attempts
    on it that have no first byte yet."""

    def __init__(self) -> None:
        self.by_backend: dict[str, set[Exchange]] = {}
        self.count = 0

    def add(self, backend: BackendState, ex: Exchange) -> None:
        self.by_backend.setdefault(backend.url, set()).add(ex)

    def discard(self, backend: BackendState, ex: Exchange) -> None:
        s = self.by_backend.get(backend.url)
        if s is not None:
            s.discard(ex)
            if not s:
                del self.by_backend[backend.url]

    def backend_down(self, backend: BackendState, why: str) -> None:
        """Abandon every attempt on ``backend`` that has not had a first byte."""
        for ex in list(self.by_backend.get(backend.url, ())):
            ex.abandon(f"{backend.url} went down: {why}", timed_out=False)


class Step(Enum):
    """How an attempt ended: replied, retried on the same target or elsewhere, given up."""

    REPLIED = "replied"
    SAME = "same"
    ELSEWHERE = "elsewhere"
    GIVE_UP = "give_up"


REPLIED, SAME, ELSEWHERE, GIVE_UP = Step.REPLIED, Step.SAME, Step.ELSEWHERE, Step.GIVE_UP


class Retries:
    """The retry policy, in one place. Before a byte reaches the client an attempt may be
    tried again: once more on a new connection after a dead pooled one (the engine had
    closed it: nothing was answered, and Twisted retries only idempotent requests,
    twisted#7843; its idle siblings are as old), and once on another target after a failed
    connection, a backend going down, a late first byte, or a status in ``RETRY_STATUSES``
    (404 on a coding-agent route). It also keeps what giving up answers: the last engine
    reply kept (``refused``) and the last failure."""

    __slots__ = ("elsewhere_left", "failed", "refused", "same_left", "timed_out", "tried")

    def __init__(self) -> None:
        self.same_left = 1
        self.elsewhere_left = 1
        self.tried: set[int] = set()
        self.refused: tuple[int, list[tuple[bytes, list[bytes]]], bytes, Target] | None = None
        self.failed: str | None = None
        self.timed_out = False

    @property
    def retrying(self) -> bool:
        """A retry is under way (it goes to the front of the queue)."""
        return not (self.same_left and self.elsewhere_left)

    @property
    def fresh(self) -> bool:
        """Send on a new connection (a pooled one turned out dead)."""
        return not self.same_left

    def retried_status(self, path: str, code: int) -> bool:
        """Whether an engine's ``code`` is retried elsewhere (while that retry is left)."""
        return bool(self.elsewhere_left) and (
            code in RETRY_STATUSES or (path in AGENT_ROUTES and code == 404))

    def same(self) -> bool:
        """A dead pooled connection: whether the request is sent once more."""
        if self.same_left:
            self.same_left -= 1
            return True
        return False

    def elsewhere(self, target: Target) -> Step:
        """The attempt on ``target`` ended without a reply: the next goes elsewhere, or
        the exchange gives up."""
        self.tried.add(target.id)
        if self.elsewhere_left:
            self.elsewhere_left -= 1
            return ELSEWHERE
        return GIVE_UP


class Exchange:
    """One request's attempts; ``run`` returns when the reply ended or raises the route's
    error (an ``ApiError``, or ``CancelledError`` once the client is gone)."""

    def __init__(self, request: Request, parsed: Parsed, path: str, kind: str | None, *,
                 sched: Scheduler, state: State, engine: Engine, clock: IReactorTime,
                 limits: Limits, inflight: Inflight, session: int | None,
                 who: Identity = OPEN, policy: PolicyConfig | None = None,
                 capture: Callable[[StreamTap], Tap] | None = None,
                 decision_log: DecisionSink | None = None, request_id: str = "",
                 watch: Watch | None = None) -> None:
        self.request = request
        self.parsed = parsed
        self.path = path
        self.kind = kind
        self.sched = sched
        self.state = state
        self.engine = engine
        self.clock = clock
        self.limits = limits
        self.inflight = inflight
        self.session = session
        self.who = who
        #: The policy routing it (its model's or its split arm's); None: the scheduler's.
        self.policy = policy
        #: Wraps each attempt's tap (a store-eligible /v1/responses request's capture,
        #: ``pharos.proxy.conversation``); None for every other request.
        self.capture = capture
        #: The decision log, told of each lease taken when it samples this request.
        self.request_id = request_id
        self.decision_log = (decision_log if decision_log is not None
                             and decision_log.sampled(request_id) else None)
        self.watch = watch
        self.lease: Lease | None = None
        self.gone = False
        self.outcome: str | None = None
        self.sample: Sample | None = None
        self._pending: Deferred[Any] | None = None  # what an attempt awaits before a byte
        self._relay: Relay | None = None
        self._abandoned: _Abandoned | None = None
        self._timer: IDelayedCall | None = None
        self._answered = False  # the engine's first body byte arrived: no retry from here
        #: The target whose reply went to the client (its headers were sent), and the reply's
        #: usage as the tap read it (None: unknown): what admission settles and Done records.
        self.replied: Target | None = None
        self.usage: Usage | None = None
        #: What ``Done`` records: the ``(stage, outcome)`` pairs of each attempt (route, queue,
        #: load, upstream) and the prefix outcome; the lease whose reply went to the client and
        #: its reason; leases taken; seconds in the fair queue (all attempts, and those before
        #: the first send); when the first attempt was sent.
        self.decisions: list[tuple[str, str]] = []
        self.answered: Lease | None = None
        self.reason: str | None = None
        self.attempts = 0
        self.queue_wait = 0.0
        self.queue_wait_before_send = 0.0
        self.first_sent: float | None = None
        self.sent_at = 0.0  # when the current attempt's lease was granted
        self._sent = False  # an attempt was sent and has no upstream outcome yet

    def _upstream(self, outcome: str) -> None:
        """The sent attempt's ``upstream`` decision (once per attempt sent)."""
        if self._sent:
            self._sent = False
            self.decisions.append(("upstream", outcome))

    # --- the one owner of the lease --------------------------------------------------------

    def _take(self, lease: Lease) -> None:
        assert self.lease is None, "an exchange holds one lease at a time"
        self.lease = lease
        self.inflight.add(lease.target.backend, self)
        if self.decision_log is not None:
            self.decision_log.decided(self.request_id, self.attempts + 1,
                                      self.parsed.prompt_tokens, lease)

    def _drop(self, sample: Sample | None = None) -> None:
        """Give back the lease held, if any (the only place a lease is released)."""
        lease, self.lease = self.lease, None
        self._cancel_timer()
        self._pending = None
        self._relay = None
        self._abandoned = None
        self._answered = False
        if lease is not None:
            self.inflight.discard(lease.target.backend, self)
            lease.release(sample)

    async def run(self) -> None:
        """All attempts; the lease still held is released whatever happened."""
        if disconnected(self.request):
            self.outcome = CLIENT_LEFT
            raise CancelledError()
        self.request.notifyFinish().addErrback(self._left)
        self.inflight.count += 1
        try:
            await self._attempts()
        except CancelledError:
            self.outcome = CLIENT_LEFT
            self._upstream(CLIENT_LEFT)
            raise
        except ApiError:
            self.outcome = self.outcome or ERROR_STATUS
            self._upstream(ERROR_STATUS)
            raise
        except Exception:
            self.outcome = PHAROS_ERROR
            self._upstream(PHAROS_ERROR)
            raise
        finally:
            self.inflight.count -= 1
            self._drop(self.sample)
            lease = self.answered
            if lease is not None and lease.prefix is not None:
                self.decisions.append(("prefix", lease.prefix))

    # --- events from outside ---------------------------------------------------------------

    def _left(self, _: object) -> None:
        """The client's connection closed: stop whatever the attempt is waiting for."""
        self.gone = True
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()  # also when it waits on an inner Deferred (treq chains them)
        if self._relay is not None:
            self._relay.stopProducing()

    def abandon(self, why: str, timed_out: bool) -> None:
        """Give up the current attempt if its engine has not answered a byte yet."""
        if self._answered or self.lease is None or self._abandoned is not None:
            return
        self._abandoned = _Abandoned(why, timed_out)
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()  # also when it waits on an inner Deferred (treq chains them)
        if self._relay is not None:
            self._relay.abandon()

    def _arm(self) -> None:
        self._cancel_timer()
        limit = self.limits.first_byte
        self._timer = self.clock.callLater(limit, self._late)

    def _late(self) -> None:
        self._timer = None
        self.abandon(f"no first byte within {self.limits.first_byte:g} s", timed_out=True)

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()

    async def _wait(self, d: Deferred[Any]) -> Any:
        """Await ``d`` while it can be cancelled by the client leaving or the attempt being
        abandoned."""
        self._pending = d
        try:
            return await d
        finally:
            if self._pending is d:
                self._pending = None

    def _check(self) -> None:
        if self.gone:
            raise CancelledError()

    # --- the attempts ----------------------------------------------------------------------

    async def _attempts(self) -> None:
        """Attempt after attempt, each ending replied, retried (on the same target or
        elsewhere, as ``Retries`` decides) or given up; then the give-up's reply."""
        parsed = self.parsed
        req = SchedRequest(parsed.model, parsed.prompt_tokens, self.sched.seed(), kind=self.kind,
                           chain=parsed.chain, session=self.session,
                           output_tokens=parsed.max_tokens, policy=self.policy,
                           stream=parsed.stream)
        retries = Retries()
        step = SAME
        while step is SAME or step is ELSEWHERE:
            self._check()
            lease = await self._acquire(req, retries)
            step = GIVE_UP if lease is None else await self._attempt(lease, retries)
        if step is GIVE_UP:
            self._give_up(retries)

    async def _acquire(self, req: SchedRequest, retries: Retries) -> Lease | None:
        """The next attempt's lease (a retry at the front of the queue, never on a target
        tried); None when a retry finds no target left."""
        who, decisions, watch = self.who, self.decisions, self.watch
        if watch is not None and not watch.watching:
            watch = None
        asked_at = self.clock.seconds()
        if watch is not None and not retries.retrying:
            tell(watch.admitted, who.name, req.model)
        try:
            granted = self.sched.acquire(
                who.name, who.weight, replace(req, exclude=frozenset(retries.tried)),
                front=retries.retrying, tenant=who.tenant, tenant_weight=who.tenant_weight)
            if watch is not None and not granted.called:
                tell(watch.queued, who.name, req.model)
            lease = await self._wait(granted)
        except UnknownModel:
            decisions.append(("route", "unknown_model"))
            if retries.retrying:
                return None
            raise errors.unknown_model(self.parsed.model) from None
        except Unavailable:
            decisions.append(("route", "unavailable"))
            if retries.retrying:
                return None
            raise errors.unavailable(self.parsed.model) from None
        except QueueFull:
            decisions.append(("route", "queue_full"))
            raise errors.queue_full() from None
        except CancelledError:
            decisions.append(("route", "client_left"))
            raise
        if watch is not None:
            tell(watch.routed, who.name, lease.target, lease.decision.reason)
        self._take(lease)
        self.sent_at = self.clock.seconds()
        self.attempts += 1
        if lease.waited:  # granted at once: the pick's time is Pharos's own (overhead)
            self.queue_wait += self.sent_at - asked_at
        decisions.append(("route", lease.decision.why or "only_choice"))
        decisions.append(("queue", "waited" if lease.waited else "immediate"))
        return lease

    async def _attempt(self, lease: Lease, retries: Retries) -> Step:
        """Send on ``lease`` and relay the reply (REPLIED), or, when no byte reached the
        client, what ``retries`` makes of the failure."""
        self._check()
        target, sent_at = lease.target, self.sent_at
        if self.first_sent is None:
            self.first_sent = sent_at
            self.queue_wait_before_send = self.queue_wait
        self._sent = True
        self._arm()
        try:
            if lease.unload:
                # Pharos chose what the load pushes out (``Lease.unload``): that goes first,
                # or the host picks its own (its first-byte timer runs meanwhile).
                accepted = await self._wait(self.engine.unload(target, lease.unload))
                self.decisions.append(("load", "victims_unloaded" if accepted == len(
                    lease.unload) else "unload_failed"))
            response = await self._wait(self.engine.send(
                target, self.path, self.parsed.forward_body(target.served),
                fresh=retries.fresh))
        except Exception as e:
            return self._not_sent(e, target, retries)
        if retries.retried_status(self.path, response.code):
            return await self._busy(response, lease, retries)
        retries.tried.add(target.id)
        if self.path == "/v1/messages" and response.code >= 400:
            await self._anthropic_error(response, lease)
            return REPLIED
        try:
            await self._relay_reply(response, lease, sent_at)
        except _Abandoned as a:
            self._drop()
            return self._lost(a, target, retries)
        return REPLIED

    def _not_sent(self, e: Exception, target: Target, retries: Retries) -> Step:
        """The attempt failed before the engine's headers: abandoned (its backend went down,
        its first byte late), a dead pooled connection, or a failed connection."""
        abandoned = self._abandoned
        self._drop()
        if self.gone:
            raise CancelledError() from None
        if abandoned is not None:
            return self._lost(abandoned, target, retries)
        if isinstance(e, CancelledError):
            raise e
        if _stale(e) and retries.same():
            self._sent = False  # not an upstream outcome of its own
            return SAME
        self._upstream(CONNECT_FAILED)
        if _refused(e):
            self.state.eject(target.backend)
            self.inflight.backend_down(target.backend, "connection refused")
        retries.failed = f"{target.backend.url}: {_describe(e)}"
        retries.timed_out = False
        self.outcome = CONNECT_FAILED
        log.warn("{url} failed before replying: {why}", url=target.backend.url,
                 why=_describe(e))
        return retries.elsewhere(target)

    def _lost(self, a: _Abandoned, target: Target, retries: Retries) -> Step:
        """The attempt was abandoned before its first byte."""
        retries.failed, retries.timed_out = str(a), a.timed_out
        self._upstream(TIMED_OUT if a.timed_out else CONNECT_FAILED)
        log.warn("{why}; retrying elsewhere", why=retries.failed)
        return retries.elsewhere(target)

    async def _busy(self, response: IResponse, lease: Lease, retries: Retries) -> Step:
        """A status another engine may answer better: the reply is kept for the give-up and
        the request goes elsewhere."""
        try:
            body = await self._wait(collect(response))
        except CancelledError:
            self._drop()
            if self.gone:
                raise
            body = b""
        self._drop(Sample(ok=False, dispatched_cold=lease.cold, ttft_sec=None,
                          duration_sec=None))
        self._check()
        target = lease.target
        retries.refused = (response.code, response_headers(response), body, target)
        self._upstream(BUSY_RETRIED if response.code == 503 else ERROR_RETRIED)
        if response.code != 503:
            log.warn("{url} answered {code}, retrying elsewhere: {msg}",
                     url=target.backend.url, code=response.code, msg=_message(body))
        return retries.elsewhere(target)

    def _give_up(self, retries: Retries) -> None:
        """No attempt replied: the kept engine reply if there is one, else 504 when the last
        failure was a late first byte, else 502."""
        if retries.refused is not None:
            code, headers, body, target = retries.refused
            path = self.path
            if path in AGENT_ROUTES and code == 404:
                raise ApiError(400, f"{path} is not served by {target.backend.url}",
                               code="route_not_served")
            self.outcome = ERROR_STATUS
            engine_head(self.request, code, headers, target)
            self.request.write(body)
            return
        if retries.timed_out:
            self.outcome = TIMED_OUT
            raise errors.upstream(f"no first byte from any backend: {retries.failed}",
                                  status=504)
        self.outcome = self.outcome or CONNECT_FAILED
        raise errors.upstream(f"no backend answered: {retries.failed}")

    def _replied(self, lease: Lease) -> None:
        """The lease whose reply goes to the client (its reason and estimate are Done's)."""
        self.answered = lease
        self.reason = lease.decision.reason

    async def _anthropic_error(self, response: IResponse, lease: Lease) -> None:
        """An engine's error on /v1/messages, in Anthropic's shape whatever the engine's (an
        OpenAI-compatible server answers OpenAI's or FastAPI's ``detail``; Claude Code reads
        only Anthropic's)."""
        body = await self._wait(collect(response, 1024 * 1024))
        self._answered = True
        self._cancel_timer()
        self.sample = Sample(ok=False, dispatched_cold=lease.cold, ttft_sec=None,
                             duration_sec=None)
        self.outcome = ERROR_STATUS
        self._upstream(ERROR_STATUS)
        self._replied(lease)
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            doc = None
        if not (isinstance(doc, dict) and doc.get("type") == "error"):
            body = ApiError(response.code, _message(body)).body(ollama=False, anthropic=True)
        request = self.request
        self._start_reply(response, lease.target, lease)
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"content-length", b"%d" % len(body))
        request.write(body)

    def _start_reply(self, response: IResponse, target: Target, lease: Lease) -> None:
        """The engine's head on the client's reply: the engine answered."""
        self.engine.start_reply(self.request, response, target, lease.decision.reason, lease)
        watch = self.watch
        if watch is not None and watch.watching:
            tell(watch.first_byte, target, lease.decision.reason)

    async def _relay_reply(self, response: IResponse, lease: Lease, sent_at: float) -> None:
        """Stream the reply back; the headers go out with its first byte (until then the
        attempt can still be abandoned); feedback in ``self.sample`` when it ends."""
        request = self.request
        target = lease.target
        tap = StreamTap(strip_usage_chunk=self.parsed.pharos_asked_usage,
                        embeddings=self.path in EMBEDDING_ROUTES)
        relayed: Tap = tap if self.capture is None else self.capture(tap)
        first: list[float] = []
        unchanged = not self.parsed.pharos_asked_usage

        def first_byte() -> None:
            # The engine answered: no retry from here, so the client gets the headers.
            self._answered = True
            self.replied = target
            self._replied(lease)
            self._cancel_timer()
            first.append(self.clock.seconds())
            self._start_reply(response, target, lease)
            length = response.length
            if unchanged and isinstance(length, int):
                request.setHeader(b"content-length", str(length).encode())
            lease.first_byte()

        relay = Relay(request, relayed, self.clock, first_byte,
                      idle_timeout=self.limits.stream_idle, touch=lease.touch)
        self._relay = relay
        response.deliverBody(relay)
        try:
            await relay.done
        except EngineDied as e:
            if relay.abandoned and not self._answered and self._abandoned is not None:
                raise self._abandoned from None
            self.outcome = DIED_MID_REPLY
            self._upstream(DIED_MID_REPLY)
            if isinstance(e, Stalled):
                log.warn("{url} stalled mid-reply: {why}", url=target.backend.url, why=str(e))
            else:
                log.warn("{url} died mid-reply: {why}", url=target.backend.url, why=str(e))
            self.state.eject(target.backend)
            self.inflight.backend_down(target.backend, "died mid-reply")
            self._drop()
            await cut(request)
            return
        finally:
            self._relay = None
        if not self._answered:
            # An empty body: the headers go out now.
            first_byte()
        end = self.clock.seconds()
        usage = self.usage = tap.usage
        self.outcome = OK if response.code < 400 else ERROR_STATUS
        self._upstream(self.outcome)
        load_sec = usage.load_sec if usage else None
        if self.parsed.control:
            self.decisions.append(("load", "control"))
        elif lease.cold and (load_sec is None or load_sec >= MIN_REAL_LOAD_SEC):
            self.decisions.append(("load", "cold_start"))
        elif not lease.cold and load_sec is not None and load_sec >= MIN_REAL_LOAD_SEC:
            self.decisions.append(("load", "unexpected_load"))
        self.sample = Sample(
            ok=response.code < 400,
            dispatched_cold=lease.cold,
            ttft_sec=first[0] - sent_at if first else None,
            duration_sec=end - sent_at,
            prompt_tokens=usage.prompt_tokens if usage else None,
            cached_tokens=usage.cached_tokens if usage else None,
            prompt_eval_sec=usage.prompt_eval_sec if usage else None,
            load_sec=usage.load_sec if usage else None,
            control=self.parsed.control,
            prefill_window_sec=lease.prefill_window_sec,
        )


def engine_head(request: Request, code: int, headers: list[tuple[bytes, list[bytes]]],
                target: Target) -> None:
    """The engine's status and headers on the client's reply, with the request's own id
    (not the engine's) and the backend that answered."""
    request.setResponseCode(code)
    ours = request.responseHeaders.getRawHeaders(b"x-request-id")
    for k, vs in headers:
        request.responseHeaders.setRawHeaders(k, vs)
    if ours:
        request.responseHeaders.setRawHeaders(b"x-request-id", ours)
    request.setHeader(b"x-pharos-backend", target.backend.url.encode())


def _refused(e: Exception) -> bool:
    return isinstance(e, ConnectionRefusedError | ConnectError)


def _stale(e: Exception) -> bool:
    """The connection died before any answer: a pooled connection the engine had closed."""
    return isinstance(e, ResponseNeverReceived | RequestTransmissionFailed)


def _describe(e: Exception) -> str:
    if isinstance(e, ResponseNeverReceived):
        return "connection closed before a reply"
    return f"{type(e).__name__}: {e}".strip()[:300]


def _message(body: bytes) -> str:
    """An engine's error message (OpenAI's ``error.message``, Ollama's ``error``, FastAPI's
    ``detail``), cut to 200 bytes (the log's, and a reshaped error's; it often names a
    flag)."""
    try:
        doc = json.loads(body)
        err = doc.get("error", doc.get("detail")) if isinstance(doc, dict) else None
        msg = err.get("message") if isinstance(err, dict) else err
        text = str(msg if msg is not None else body[:200])
    except (ValueError, RecursionError):
        text = body[:200].decode("utf-8", "replace")
    return text[:200]


async def cut(request: Request) -> None:
    """Cut the client's connection mid-reply: an incomplete read, never a clean end."""
    channel = request.channel
    transport = channel.transport if channel is not None else None
    if transport is None or disconnected(request):
        return
    gone: Deferred[None] = request.notifyFinish()
    gone.addErrback(lambda _: None)
    transport.abortConnection()  # type: ignore[attr-defined]
    await gone
