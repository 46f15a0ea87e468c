"""The peer node: one sender loop per peer, the merge of what peers send, and the snapshot
pulls that heal a reconnect.

Push-based full mesh. Every ``TICK`` each peer gets a ``Delta``: this origin's absolute gauges
and recent usage cells (a lost delta is repaired by the next; nothing is acknowledged or
retried), every target's learned retention, and the prefix ops since its last tick from a
bounded list (``MAX_PENDING``; a full list drops new ops: they are hints). A peer's tick is
skipped while its previous delta is outstanding, and each delta has a timeout, so a slow
peer delays only itself. The hot path never waits: ``push`` appends to lists.

Dispatches are told too (``Delta.dispatched``), so peers route on where prompts are going,
not where they went a tick ago (else two instances put one new root into two small caches
and the copies cascade). A dispatch that moves a root (``PrefixOp.moved``) or a reservation
against a daily budget (``kick``) sends a delta to every peer on the next reactor turn:
quotas are exact to one in-flight request per key per instance only if siblings learn of it
before the next request for that key.

Idle, nothing is sent: a tick that would repeat the last delta the peer answered 200 is
skipped (``Peer.idle``), except for a keep-alive every ``KEEPALIVE`` seconds (gauges,
reservations and retention, no cells), well inside the receivers' ``PEER_SILENCE_SEC``. A
failed or refused delta, or another origin answering (a restart), forgets what was
acknowledged, so everything goes again. Otherwise only cells that differ from the
acknowledged ones go (cells merge by max): unchanged cells' JSON was most of a delta's cost.

What arrives is merged by the modules that own it (``Scheduler``, ``Ledger``); the node only
moves bytes. A member that answers with this instance's own origin is skipped. A member that
was unreachable (or is new) and answers again has its snapshot pulled and merged
(``restore``), which heals whatever a partition missed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import treq
from treq.client import HTTPClient
from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList, TimeoutError, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from pharos.peer.membership import DNS_INTERVAL, Membership
from pharos.peer.wire import Delta, ProtoMismatch, WireError, decode, encode
from pharos.periodic import Periodic
from pharos.prefix import PrefixOp
from pharos.sched import PEER_SILENCE_SEC, GaugeError, Scheduler
from pharos.usage import Ledger

log = Logger()

#: Seconds between deltas to one peer.
TICK: Final = 0.2
#: Seconds between keep-alives to an idle peer (a quarter of ``sched.PEER_SILENCE_SEC``: three
#: may be lost before the receiver takes this instance for gone).
KEEPALIVE: Final = PEER_SILENCE_SEC / 4
#: Prefix ops waiting for one peer's next delta; more are dropped.
MAX_PENDING: Final = 10_000
#: Seconds a delta may take before it is abandoned (the next tick sends a fresh one).
DELTA_TIMEOUT: Final = 2.0
#: Seconds a snapshot pull may take (at start, all pulls together).
SNAPSHOT_TIMEOUT: Final = 5.0
#: Seconds without a successful exchange after which a peer counts as disconnected, so its
#: next answer pulls a snapshot (one lost delta is not a partition).
RECONNECT_AFTER: Final = 2.0
#: The reply header naming the answering instance's origin.
ORIGIN_HEADER: Final = "Pharos-Origin"


@dataclass(frozen=True, slots=True)
class Reply:
    """A peer's answer: status, its ``Pharos-Origin`` (None if absent) and body."""

    code: int
    origin: str | None
    body: bytes


class Transport(Protocol):
    """How deltas and snapshot requests reach a member (``TreqTransport`` over HTTP; tests use
    an in-memory one that can cut an instance off)."""

    def post_delta(self, member: str, body: bytes) -> Deferred[Reply]: ...

    def get_snapshot(self, member: str) -> Deferred[Reply]: ...


class TreqTransport:
    """Deltas and snapshots over HTTP with the bearer secret."""

    def __init__(self, client: HTTPClient, secret: bytes) -> None:
        self.client = client
        self.auth = b"Bearer " + secret

    async def _request(self, method: str, url: str, body: bytes | None,
                       timeout: float) -> Reply:
        headers = Headers({b"Authorization": [self.auth],
                           b"Content-Type": [b"application/json"]})
        response = await self.client.request(method, url, data=body, headers=headers,
                                             timeout=timeout, allow_redirects=False)
        content: bytes = await treq.content(response)
        origin = response.headers.getRawHeaders(ORIGIN_HEADER)
        return Reply(response.code, origin[0] if origin else None, content)

    def post_delta(self, member: str, body: bytes) -> Deferred[Reply]:
        return Deferred.fromCoroutine(self._request(
            "POST", f"http://{member}/peer/delta", body, DELTA_TIMEOUT))

    def get_snapshot(self, member: str) -> Deferred[Reply]:
        return Deferred.fromCoroutine(self._request(
            "GET", f"http://{member}/peer/snapshot", None, SNAPSHOT_TIMEOUT))


@dataclass(eq=False)
class Peer:
    """One member as this node sees it."""

    member: str
    pending: list[PrefixOp] = field(default_factory=list)
    dispatched: list[PrefixOp] = field(default_factory=list)  # dispatches not yet sent
    dropped_ops: int = 0  # ops that found the pending list full
    flush: bool = False  # a moved root waits for the outstanding delta's answer
    flushed: int = 0  # deltas sent early for moved roots
    loop: Periodic | None = None
    outstanding: Deferred[Any] | None = None
    skipped: int = 0  # ticks skipped while a delta was outstanding
    idle: int = 0  # ticks skipped because nothing changed since the acknowledged delta
    keepalives: int = 0  # deltas sent only to say this instance is alive
    sent_at: float | None = None  # when the last delta went (this process's clock)
    acked: tuple[object, ...] | None = None  # the state the last 200-answered delta carried
    origin: str | None = None  # its Pharos-Origin, once it answered
    myself: bool = False  # it answered with this instance's origin
    heard_at: float | None = None  # the last successful exchange (this process's clock)
    connected: bool = False  # answered since it was last unreachable (or pulled at start)
    failing: str | None = None  # why the last exchange failed
    proto_mismatch: bool = False  # it answered 409: another wire version
    pulls: int = 0  # snapshots pulled from it


@dataclass(slots=True)
class Origin:
    """A peer origin as seen in its deltas."""

    heard_at: float
    seq: int = -1
    fingerprint: str = ""
    leaving: bool = False


class PeerNode(Service):
    """Sender loops, delta merges and snapshot pulls for one instance. ``fingerprint`` is
    called per delta (a reload may change it); ``restore`` merges a snapshot's bytes (it may
    return a Deferred) and raises ``ValueError`` on a bad one."""

    def __init__(self, origin: str, fingerprint: Callable[[], str], sched: Scheduler,
                 ledger: Ledger, transport: Transport, membership: Membership,
                 clock: IReactorTime,
                 restore: Callable[[bytes], object] | None = None, *,
                 tick: float = TICK, max_pending: int = MAX_PENDING) -> None:
        self.origin = origin
        self.fingerprint = fingerprint
        self.sched = sched
        self.ledger = ledger
        self.transport = transport
        self.membership = membership
        self.clock = clock
        self.restore = restore
        self.tick = tick
        self.max_pending = max_pending
        self.peers: dict[str, Peer] = {}
        #: Origins heard from (their deltas), for /status and metrics.
        self.origins: dict[str, Origin] = {}
        self.seq = 0
        self.leaving = False
        #: For metrics: deltas refused by reason, origins whose fingerprint differs from ours.
        self.refused: dict[str, int] = {}
        self.fingerprint_mismatch: set[str] = set()
        self._resolve_loop = Periodic(clock, DNS_INTERVAL, self._resolve, now=True,
                                      what="peers: resolving members")
        self._flush_call: IDelayedCall | None = None  # while a ``_flush`` is due

    # --- membership ----------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        self._set_members(self.membership.members)
        if self.membership.dynamic:
            self._resolve_loop.startService()

    def stopService(self) -> Deferred[None]:
        super().stopService()
        if self._resolve_loop.running:
            self._resolve_loop.stopService()
        for peer in self.peers.values():
            self._stop_loop(peer)
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        pending = [p.outstanding for p in self.peers.values() if p.outstanding is not None]
        for d in pending:
            d.cancel()
        return succeed(None)

    def _resolve(self) -> Deferred[None]:
        async def go() -> None:
            members = await self.membership.refresh()
            if self.membership.failing is not None:
                log.warn("peers: {why}; keeping the last members", why=self.membership.failing)
            if self.running:
                self._set_members(members)

        return Deferred.fromCoroutine(go())

    def _set_members(self, members: frozenset[str]) -> None:
        for member in list(self.peers):
            if member not in members:
                peer = self.peers.pop(member)
                self._stop_loop(peer)
                if peer.outstanding is not None:
                    peer.outstanding.cancel()
        for member in sorted(members):
            if member not in self.peers:
                peer = self.peers[member] = Peer(member)
                if self.running and not self.leaving:
                    self._start_loop(peer)

    def _start_loop(self, peer: Peer) -> None:
        peer.loop = Periodic(self.clock, self.tick, lambda: self._tick(peer),
                             what=f"peers: the sender to {peer.member}")
        peer.loop.startService()

    @staticmethod
    def _stop_loop(peer: Peer) -> None:
        if peer.loop is not None and peer.loop.running:
            peer.loop.stopService()
        peer.loop = None

    # --- sending -------------------------------------------------------------------------

    def push(self, op: PrefixOp) -> None:
        """A prefix op for every peer's next delta (``on_prefix``), dropped where the list is
        full. A dispatch that moved a root asks for a delta on the next turn."""
        cap = self.max_pending
        for peer in self.peers.values():
            if peer.myself:
                continue
            queue = peer.dispatched if op.dispatched else peer.pending
            if len(queue) < cap:
                queue.append(op)
            else:
                peer.dropped_ops += 1
        if op.moved and self.running and not self.leaving and (
                self._flush_call is None or not self._flush_call.active()):
            self._flush_call = self.clock.callLater(0, self._flush)

    def _flush(self, every: bool = False) -> None:
        """A delta to every peer now (``every``: peers without ops too); those with one
        outstanding get theirs when it is answered. Never raises."""
        self._flush_call = None
        for peer in list(self.peers.values()):
            if peer.myself or peer.loop is None or not (
                    every or peer.dispatched or peer.pending):
                continue
            if peer.outstanding is not None:
                peer.flush = True
                continue
            if self._tick(peer):
                peer.flushed += 1

    def kick(self) -> None:
        """Something peers must learn promptly changed (a reservation against a budget): a
        delta to every peer on the next reactor turn, as for a moved root."""
        if self.running and not self.leaving and (
                self._flush_call is None or not self._flush_call.active()):
            self._flush_call = self.clock.callLater(0, self._flush, True)

    def state(self) -> tuple[object, ...]:
        """What a delta carries besides ops, compared to skip idle ticks: (fingerprint,
        gauges with ``reserved``, cells, retention)."""
        gauges: dict[str, Any] = dict(self.sched.export_gauges())
        gauges["reserved"] = self.ledger.export_reserved()
        return (self.fingerprint(), gauges, self.ledger.export_recent(),
                tuple(self.sched.roots.export_retention(self._key_of)))

    def delta(self, ops: list[PrefixOp], leaving: bool = False,
              dispatched: list[PrefixOp] | None = None,
              state: tuple[object, ...] | None = None, keepalive: bool = False,
              since: tuple[object, ...] | None = None) -> Delta:
        """This instance's delta now (a keep-alive: gauges only); only cells that differ from
        ``since`` go. Retention always goes, so a receiver that dropped it gets it back."""
        self.seq += 1
        fp, gauges, cells, retention = self.state() if state is None else state
        assert isinstance(cells, list)
        if keepalive:
            cells = []
        elif since is not None:
            before = {_cell_key(c): c for c in since[2]}  # type: ignore[attr-defined]
            cells = [c for c in cells if before.get(_cell_key(c)) != c]
        return Delta(self.origin, fp, self.seq, leaving, gauges,  # type: ignore[arg-type]
                     cells, tuple(ops), dispatched=tuple(dispatched or ()),
                     retention=retention)  # type: ignore[arg-type]

    def _key_of(self, tid: int) -> str | None:
        targets = self.sched.state.targets
        return targets[tid].key if 0 <= tid < len(targets) else None

    def _tick(self, peer: Peer) -> bool:
        """One peer's tick: True when a delta went (nothing changed since the acknowledged one
        and no keep-alive due: none). Never raises (``_flush`` calls it too)."""
        try:
            if peer.myself:
                return False
            if peer.outstanding is not None:
                peer.skipped += 1
                return False
            state = self.state()
            unchanged = not (peer.pending or peer.dispatched) and state == peer.acked
            now = self.clock.seconds()
            if unchanged and peer.sent_at is not None and 0 <= now - peer.sent_at < KEEPALIVE:
                peer.idle += 1
                return False
            ops, peer.pending = peer.pending, []
            sent, peer.dispatched = peer.dispatched, []
            peer.flush = False
            if unchanged:
                peer.keepalives += 1
            self._send(peer, encode(self.delta(ops, dispatched=sent, state=state,
                                               keepalive=unchanged, since=peer.acked)), state)
            return True
        except Exception:
            log.failure("peers: building a delta for {member} failed", member=peer.member)
            return False

    def _send(self, peer: Peer, body: bytes,
              state: tuple[object, ...] | None = None) -> Deferred[None]:
        d = self.transport.post_delta(peer.member, body)
        d.addTimeout(DELTA_TIMEOUT, self.clock)
        peer.outstanding = d
        peer.sent_at = self.clock.seconds()
        peer.acked = None  # until this one is answered 200

        def answered(reply: Reply) -> None:
            known = peer.origin
            self._answered(peer, reply)
            # Another origin at that member (it restarted): everything goes again.
            if reply.code == 200 and peer.outstanding is d and (
                    known is None or reply.origin in (None, known)):
                peer.acked = state

        done: Deferred[None] = d.addCallbacks(answered, lambda f: self._failed(peer, f))

        def clear(_: object) -> None:
            if peer.outstanding is d:
                peer.outstanding = None
                if peer.flush and peer.loop is not None and not self.leaving:
                    peer.flush = False
                    peer.flushed += 1
                    self.clock.callLater(0, self._tick, peer)

        done.addBoth(clear)
        return done

    def _answered(self, peer: Peer, reply: Reply) -> None:
        if reply.origin is not None:
            peer.origin = reply.origin
            if reply.origin == self.origin:
                self._myself(peer)
                return
        now = self.clock.seconds()
        if reply.code == 409:
            if not peer.proto_mismatch:
                log.error("peers: {member} speaks another wire proto ({why}); not "
                          "sharing state with it", member=peer.member,
                          why=reply.body[:200].decode("utf-8", "replace"))
            peer.proto_mismatch = True
            peer.failing = "proto mismatch (409)"
            return
        if reply.code != 200:
            why = f"HTTP {reply.code}: {reply.body[:200].decode('utf-8', 'replace')}"
            if peer.failing != why:
                log.warn("peers: {member} refused a delta: {why}", member=peer.member, why=why)
            peer.failing = why
            if reply.code != 400:  # a 400 is about this delta; 401 and 5xx are about the link
                return
        peer.proto_mismatch = False
        peer.failing = None if reply.code == 200 else peer.failing
        reconnected = not peer.connected
        peer.heard_at, peer.connected = now, True
        if reconnected:
            self._pull(peer)

    def _failed(self, peer: Peer, f: Failure) -> None:
        why = "timed out" if f.check(TimeoutError) else (f.getErrorMessage() or repr(f.value))
        if peer.failing is None:
            log.warn("peers: {member} unreachable: {why}", member=peer.member, why=why)
        peer.failing = why
        now = self.clock.seconds()
        if peer.heard_at is None or not 0 <= now - peer.heard_at < RECONNECT_AFTER:
            peer.connected = False

    def _myself(self, peer: Peer) -> None:
        """The member is this instance (its reply carried our origin): skipped from now on."""
        if not peer.myself:
            log.info("peers: {member} is this instance; skipped", member=peer.member)
        peer.myself, peer.pending, peer.dispatched = True, [], []
        self._stop_loop(peer)

    # --- snapshots -----------------------------------------------------------------------

    def _pull(self, peer: Peer) -> Deferred[bool]:
        """Pull and merge the peer's snapshot; True when merged. Never fails."""
        async def go() -> bool:
            if self.restore is None:
                return False
            try:
                d = self.transport.get_snapshot(peer.member)
                d.addTimeout(SNAPSHOT_TIMEOUT, self.clock)
                reply = await d
            except Exception as e:
                log.warn("peers: snapshot from {member} failed: {why}", member=peer.member,
                         why=str(e) or type(e).__name__)
                peer.connected = False
                return False
            if reply.origin == self.origin:
                self._myself(peer)
                return False
            if reply.code != 200:
                log.warn("peers: snapshot from {member}: HTTP {code}", member=peer.member,
                         code=reply.code)
                if reply.code == 409:
                    peer.proto_mismatch = True
                return False
            try:
                merged = self.restore(reply.body)
                if isinstance(merged, Deferred):
                    await merged
            except ValueError as e:
                log.warn("peers: snapshot from {member} refused: {why}", member=peer.member,
                         why=str(e))
                self._count("snapshot")
                return False
            if reply.origin is not None:
                peer.origin = reply.origin
            peer.pulls += 1
            peer.connected = True
            peer.heard_at = self.clock.seconds()
            return True

        return Deferred.fromCoroutine(go())

    def pull_all(self) -> Deferred[None]:
        """At start (a ``restore_sources`` entry): pull a snapshot from every member that
        answers within ``SNAPSHOT_TIMEOUT`` overall, and merge each. Never fails."""
        if not self.peers:
            self._set_members(self.membership.members)
        pulls = [self._pull(p) for p in self.peers.values() if not p.myself]
        d: Deferred[Any] = DeferredList(pulls, consumeErrors=True)
        return d.addCallback(lambda _: None)

    # --- leaving -------------------------------------------------------------------------

    def leave(self) -> Deferred[None]:
        """The last delta, marked Leaving, to every peer (after the drain's streams finished):
        peers drop this instance's gauges at once and hold its final cells. Peers slower than
        ``DELTA_TIMEOUT`` are not waited for. Never fails."""
        self.leaving = True
        sends = []
        for peer in self.peers.values():
            self._stop_loop(peer)
            if peer.myself:
                continue
            if peer.outstanding is not None:
                peer.outstanding.cancel()
            ops, peer.pending = peer.pending, []
            sent, peer.dispatched = peer.dispatched, []
            sends.append(self._send(peer, encode(self.delta(ops, leaving=True,
                                                            dispatched=sent))))
        d: Deferred[Any] = DeferredList(sends, consumeErrors=True)
        return d.addCallback(lambda _: None)

    # --- receiving -----------------------------------------------------------------------

    def _count(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def receive(self, delta: Delta) -> list[str]:
        """Merge a peer's delta through the owning modules; returns what was refused (a
        malformed part is refused whole, the rest merges). Our own origin merges nothing."""
        if delta.origin == self.origin:
            return []
        now = self.clock.seconds()
        problems: list[str] = []
        seen = self.origins.get(delta.origin)
        if seen is None:
            seen = self.origins[delta.origin] = Origin(now)
        if delta.fingerprint != self.fingerprint():
            if delta.origin not in self.fingerprint_mismatch:
                log.warn("peers: origin {origin} has another fingerprint ({theirs}, ours "
                         "{ours}): its backends, keys or usage zone differ",
                         origin=delta.origin, theirs=delta.fingerprint,
                         ours=self.fingerprint())
            self.fingerprint_mismatch.add(delta.origin)
        else:
            self.fingerprint_mismatch.discard(delta.origin)
        seen.fingerprint = delta.fingerprint
        newer = delta.seq > seen.seq
        if newer:
            seen.seq, seen.heard_at, seen.leaving = delta.seq, now, delta.leaving
            if delta.leaving:
                self.sched.forget(delta.origin)
                self.ledger.forget_reserved(delta.origin)
            else:
                try:
                    self.sched.merge_gauges(delta.origin, delta.gauges, now)
                except GaugeError as e:
                    problems.append(str(e))
                try:
                    self.ledger.merge_reserved(delta.origin, delta.gauges.get("reserved"), now)
                except ValueError as e:
                    problems.append(str(e))
        try:
            self.ledger.merge(delta.cells)
        except ValueError as e:
            problems.append(str(e))
        if delta.retention:
            self.sched.roots.merge(delta.retention, self.sched.target_id)
        if delta.dispatched:  # before the records: a request's dispatch precedes them
            self.sched.merge_dispatched(list(delta.dispatched), now)
        self.sched.merge_prefix(list(delta.prefix), now, roots=delta.dispatched is None)
        if problems:
            self._count("malformed")
        return problems

    def receive_bytes(self, body: bytes) -> tuple[int, bytes]:
        """A ``POST /peer/delta`` body → (status, reply body): 200, 400 naming what is wrong,
        or 409 for another wire proto (``site`` adds auth and the origin header)."""
        try:
            delta = decode(body)
        except WireError as e:
            if isinstance(e, ProtoMismatch):
                self._count("proto")
                return 409, str(e).encode()
            self._count("garbage")
            return 400, str(e).encode()
        problems = self.receive(delta)
        if problems:
            return 400, "; ".join(problems).encode()
        return 200, b"{}"

    # --- status --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The peers block of /status: each member's state, each origin heard."""
        now = self.clock.seconds()
        return {
            "origin": self.origin,
            "fingerprint": self.fingerprint(),
            "members": [{
                "member": p.member, "origin": p.origin, "self": p.myself,
                "connected": p.connected, "last_heard": p.heard_at,
                "silent_sec": None if p.heard_at is None else round(now - p.heard_at, 3),
                "failing": p.failing, "proto_mismatch": p.proto_mismatch,
                "pending_ops": len(p.pending) + len(p.dispatched),
                "dropped_ops": p.dropped_ops, "early_deltas": p.flushed,
                "skipped_ticks": p.skipped, "idle_ticks": p.idle,
                "keepalives": p.keepalives, "snapshots_pulled": p.pulls,
            } for p in self.peers.values()],
            "origins": {o: {"last_heard": s.heard_at, "leaving": s.leaving,
                            "fingerprint_mismatch": o in self.fingerprint_mismatch}
                        for o, s in self.origins.items()},
            "refused": dict(self.refused),
        }


def _cell_key(row: Any) -> tuple[object, ...]:
    return (row["kind"], row["bucket"], row["key"], row["tenant"], row["model"])

