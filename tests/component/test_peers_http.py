"""Layer 3: the peer site and the treq transport over loopback (spec §12): two nodes exchange
deltas with the shared secret, usage crosses, a wrong secret is refused, every reply carries
``Pharos-Origin``, garbage gets a 400, and a config with peers builds a service whose peer
listener answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from twisted.internet import reactor as _reactor
from twisted.internet.interfaces import IListeningPort
from twisted.internet.task import deferLater
from twisted.web.client import HTTPConnectionPool
from twisted.web.http_headers import Headers
from twisted.web.resource import Resource

from pharos.config import Listen, PeersConfig, parse_config
from pharos.engine.fetch import make_client
from pharos.peer.membership import Membership
from pharos.peer.node import ORIGIN_HEADER, PeerNode, TreqTransport
from pharos.peer.site import peer_site
from pharos.policy import PolicyConfig
from pharos.prefix import PrefixOp
from pharos.sched import RouteSettings, Scheduler
from pharos.state.state import State
from pharos.usage import Ledger, Reservation
from tests.support.capture_server import close, serve

reactor: Any = _reactor
SECRET = b"peer-secret-1"


@dataclass
class Side:
    node: PeerNode
    ledger: Ledger
    port: IListeningPort
    member: str


@dataclass
class Pair:
    a: Side
    b: Side
    pool: HTTPConnectionPool

    async def close(self) -> None:
        for side in (self.a, self.b):
            if side.node.running:
                await side.node.stopService()
            await close(side.port)
        await self.pool.closeCachedConnections()


def side(name: str, pool: HTTPConnectionPool, secret: bytes) -> Side:
    state = State(reactor, None, fetcher_for=lambda spec: None)  # type: ignore[arg-type,return-value]
    sched = Scheduler(state, RouteSettings(PolicyConfig()), on_prefix=lambda op: node.push(op))
    ledger = Ledger(reactor, origin=f"origin-{name}", timezone="UTC")
    peers = PeersConfig(secret_file="/unused", listen=Listen(":0"))
    node = PeerNode(ledger.origin, lambda: "fp", sched, ledger,
                    TreqTransport(make_client(reactor, pool), secret), Membership(peers), reactor)
    port, url = serve(peer_site(node, SECRET, None))
    return Side(node, ledger, port, url.removeprefix("http://"))


@pytest_twisted.async_yield_fixture()
async def pair() -> AsyncIterator[Pair]:
    """Two nodes on loopback, each listing both members (itself included), not started."""
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.cachedConnectionTimeout = 1
    a, b = side("a", pool, SECRET), side("b", pool, SECRET)
    for s in (a, b):
        s.node.membership.members = frozenset({a.member, b.member})
    p = Pair(a, b, pool)
    yield p
    await p.close()


async def until(check: Any, seconds: float = 10.0) -> None:
    """Wait (polling the real reactor) until ``check()`` holds."""
    for _ in range(int(seconds / 0.05)):
        if check():
            return
        await deferLater(reactor, 0.05, lambda: None)
    assert check()


@pytest_twisted.ensureDeferred
async def test_two_nodes_share_usage_and_skip_themselves(pair: Pair) -> None:
    """Started nodes hear each other within a few ticks, each recognises its own member by
    the origin header, and tokens spent on A count on B."""
    a, b = pair.a, pair.b
    held = a.ledger.reserve("k", "t", 10, None)
    assert isinstance(held, Reservation)
    a.ledger.settle(held, "m", 40, 0, 2)
    a.node.startService()
    b.node.startService()
    await until(lambda: b.ledger.spent_today(key="k") == 42)
    await until(lambda: a.node.peers[a.member].myself and b.node.peers[b.member].myself)
    assert a.node.peers[b.member].origin == b.ledger.origin
    assert a.node.peers[b.member].connected and a.node.peers[b.member].failing is None
    assert a.node.origins[b.ledger.origin].seq > 0


@pytest_twisted.ensureDeferred
async def test_wrong_secret_is_refused_and_flagged(pair: Pair) -> None:
    """A node with another secret gets 401s: nothing of its merges, its peer shows why."""
    a, b = pair.a, pair.b
    a.node.transport = TreqTransport(make_client(reactor, pair.pool), b"wrong")
    held = a.ledger.reserve("k", "t", 10, None)
    assert isinstance(held, Reservation)
    a.ledger.settle(held, "m", 1, 0, 1)
    a.node.startService()
    await until(lambda: (a.node.peers[b.member].failing or "").startswith("HTTP 401"))
    assert b.ledger.spent_today(key="k") == 0
    assert not a.node.peers[b.member].connected


@pytest_twisted.ensureDeferred
async def test_every_reply_carries_the_origin(pair: Pair) -> None:
    """401, 404, 400 (garbage), 409 (another proto) and 503 (no snapshot source) all carry
    Pharos-Origin; none is a 500."""
    b = pair.b
    url = f"http://{b.member}"
    auth = Headers({b"authorization": [b"Bearer " + SECRET]})
    cases = [
        (await treq.post(url + "/peer/delta", b"{}", pool=pair.pool), 401),
        (await treq.get(url + "/nowhere", headers=auth, pool=pair.pool), 404),
        (await treq.post(url + "/peer/delta", b"\x00garbage", headers=auth, pool=pair.pool),
         400),
        (await treq.post(url + "/peer/delta", b'{"proto": 7}', headers=auth, pool=pair.pool),
         409),
        (await treq.get(url + "/peer/snapshot", headers=auth, pool=pair.pool), 503),
    ]
    for response, code in cases:
        await response.content()
        assert response.code == code
        assert response.headers.getRawHeaders(ORIGIN_HEADER) == [b.ledger.origin]


@pytest_twisted.ensureDeferred
async def test_a_config_with_peers_builds_a_service_with_a_peer_listener(
        tmp_path: Path) -> None:
    """A service with a peers section adds the peer node and its listener: the peer site
    answers with the instance's origin, and the scheduler hands prefix ops to the node."""
    from twisted.application import strports

    from pharos.service import PharosService

    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    probe = serve(Resource())  # a free port for the peer listener
    await close(probe[0])
    port = int(probe[1].rsplit(":", 1)[1])
    config = parse_config(f"listen: '127.0.0.1:0'\npeers: {{secret_file: {secret}, "
                          f"listen: '127.0.0.1:{port}', members: ['127.0.0.1:{port}']}}\n")
    top = PharosService.from_config(reactor, config, listen=strports.service)
    assert top.peer_node is not None
    pushed: list[PrefixOp] = []
    push, top.peer_node.push = top.peer_node.push, pushed.append  # type: ignore[method-assign,assignment]
    op = PrefixOp("k", (1,), 0.0)
    assert top.sched.learning.on_prefix is not None
    top.sched.learning.on_prefix(op)
    top.peer_node.push = push  # type: ignore[method-assign]
    assert pushed == [op]  # the scheduler's prefix ops go to the peer node
    assert top.on_leaving == [top.peer_node.leave]
    top.privilegedStartService()
    top.startService()
    pool = HTTPConnectionPool(reactor, persistent=False)
    try:
        r = await treq.get(f"http://127.0.0.1:{port}/peer/snapshot",
                           headers=Headers({b"authorization": [b"Bearer s3cret"]}), pool=pool)
        await r.content()
        assert r.headers.getRawHeaders(ORIGIN_HEADER) == [top.ledger.origin]
        await until(lambda: top.peer_node is not None
                    and top.peer_node.peers[f"127.0.0.1:{port}"].myself)
    finally:
        await top.stopService()
