"""Several Pharos instances in one process (spec §14 layer 3): each a State, Scheduler, Ledger,
PrefixIndex and PeerNode over shared in-memory engine doubles, linked by ``MemoryNetwork``, an
in-memory transport that can cut an instance off, on one ``Clock`` stepped by hand."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock

from pharos.config import Backend as BackendSpec
from pharos.config import Listen, PeersConfig
from pharos.engine.fetch import Fetcher
from pharos.peer.membership import Membership
from pharos.peer.node import PeerNode, Reply
from pharos.policy import PolicyConfig
from pharos.sched import RouteSettings, Scheduler
from pharos.state.state import State
from pharos.usage import Ledger
from tests.support.plan import FakeBackend

FINGERPRINT = "0123456789abcdef"


def llamacpp(slots: int) -> FakeBackend:
    """A llama.cpp double with ``slots`` slots serving model ``m``, idle by its own count."""
    return FakeBackend({
        "/props": (200, b'{"total_slots":%d,"build_info":"b11312-0c1e570"}' % slots),
        "/v1/models": (200, b'{"data":[{"id":"m"}]}'),
        "/metrics": (200, b"llamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n"),
    })


@dataclass
class MemoryNetwork:
    """Members by address; ``cut`` members neither send nor receive (a crash or a
    partition); ``hold`` members take deltas and never answer (a slow peer). Every delta
    body that reached a node is kept in ``delivered`` (for replay in any order)."""

    nodes: dict[str, PeerNode] = field(default_factory=dict)
    snapshots: dict[str, Callable[[], Deferred[bytes]]] = field(default_factory=dict)
    cut: set[str] = field(default_factory=set)
    hold: set[str] = field(default_factory=set)
    delivered: list[tuple[str, bytes]] = field(default_factory=list)
    held: list[Deferred[Reply]] = field(default_factory=list)

    def transport(self, me: str) -> MemoryTransport:
        return MemoryTransport(self, me)


@dataclass
class MemoryTransport:
    """``PeerNode``'s transport over a ``MemoryNetwork``, as seen from member ``me``."""

    net: MemoryNetwork
    me: str
    posts: int = 0

    def _link(self, member: str) -> PeerNode | None:
        net = self.net
        if self.me in net.cut or member in net.cut:
            return None
        return net.nodes.get(member)

    def post_delta(self, member: str, body: bytes) -> Deferred[Reply]:
        self.posts += 1
        node = self._link(member)
        if node is None:
            return fail(ConnectionRefusedError(member))
        if member in self.net.hold:
            d: Deferred[Reply] = Deferred()
            self.net.held.append(d)
            return d
        self.net.delivered.append((member, body))
        code, reply = node.receive_bytes(body)
        return succeed(Reply(code, node.origin, reply))

    def get_snapshot(self, member: str) -> Deferred[Reply]:
        node = self._link(member)
        build = self.net.snapshots.get(member)
        if node is None or build is None:
            return fail(ConnectionRefusedError(member))
        origin = node.origin
        return build().addCallback(lambda data: Reply(200, origin, data))


@dataclass
class Instance:
    """One Pharos instance's replicated parts."""

    member: str
    state: State
    sched: Scheduler
    ledger: Ledger
    node: PeerNode


def instance(member: str, members: list[str], net: MemoryNetwork, clock: Clock,
             backends: dict[str, FakeBackend], *, fingerprint: str = FINGERPRINT,
             restore: Callable[[Instance, bytes], object] | None = None,
             specs: dict[str, BackendSpec] | None = None) -> Instance:
    """An instance at ``member`` (its origin is ``o-<member>``) over the shared ``backends``
    doubles, with every member (itself included) in its peer list; ``specs``: each
    backend's config (by URL; default: the URL alone)."""

    def fetcher_for(spec: BackendSpec) -> Fetcher:
        return backends[spec.url]

    state = State(clock, None, rng=lambda: 0.5, fetcher_for=fetcher_for)
    seeds = iter(range(1, 1_000_000))
    sched = Scheduler(state, RouteSettings(PolicyConfig(name="cost")), seed=lambda: next(seeds),
                      on_prefix=lambda op: node.push(op))
    state.on_round = lambda b: sched.kick()
    origin = f"o-{member}"
    ledger = Ledger(clock, origin=origin, timezone="UTC")
    peers = PeersConfig(secret_file="/unused", listen=Listen(":1"), members=tuple(members))
    inst: Instance
    node = PeerNode(origin, lambda: fingerprint, sched, ledger, net.transport(member),
                    Membership(peers), clock,
                    restore=(lambda data: restore(inst, data)) if restore else None)
    inst = Instance(member, state, sched, ledger, node)
    ledger.on_reserve = node.kick
    net.nodes[member] = node
    state.set_backends([(specs or {}).get(url) or BackendSpec(url=url) for url in backends])
    state.service.startService()
    return inst


def vllm() -> FakeBackend:
    """A vLLM double serving model ``m``, idle by its own count."""
    return FakeBackend({
        "/version": (200, b'{"version":"0.32.0"}'),
        "/v1/models": (200, b'{"object":"list","data":[{"id":"m"}]}'),
        "/metrics": (200, b'vllm:num_requests_running{model_name="m"} 0\n'
                     b'vllm:num_requests_waiting{model_name="m"} 0\n'),
    })


def stop(inst: Instance) -> None:
    """Stop an instance's loops (its scrapers and its peer node)."""
    if inst.node.running:
        inst.node.stopService()
    inst.state.service.stopService()
