"""Layer 3 (issue 13, 1 -> 3 instances): peers are told of each request when it is sent, not
a first byte and a tick later. Three instances in one process over the in-memory transport,
two vLLM doubles, on one Clock stepped by hand: a dispatch that puts a root into a cache
lacking it reaches the peers on the next reactor turn and they send that root to the same
engine; an error reply takes the prediction back; a peer's later records do not reorder the
engines' root LRUs; a peer busy with a delta gets the dispatch once it answers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from pharos.config import Backend as BackendSpec
from pharos.peer.node import KEEPALIVE, TICK
from pharos.peer.wire import decode
from pharos.prefix import BYTES_PER_TOKEN, chain
from pharos.sched import Lease, SchedRequest
from pharos.state.stats import Sample
from tests.support.peer_mesh import Instance, MemoryNetwork, instance, stop, vllm

MEMBERS = ["a:1", "b:1", "c:1"]
URLS = ["http://e0:1", "http://e1:1"]
SYSTEM = "You are the pharos test system prompt. " * 60  # about 600 tokens


def request(question: str, seed: int, system: str = SYSTEM) -> SchedRequest:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return SchedRequest("m", (len(system) + len(question)) // BYTES_PER_TOKEN, seed,
                        chain=chain("m", messages, None, None))


def got(d: Deferred[Lease]) -> Lease:
    out: list[Lease] = []
    d.addCallback(out.append)
    assert out, "not granted"
    return out[0]


def matched(inst: Instance, req: SchedRequest) -> dict[int, int]:
    """Predicted cached tokens per target, as the instance would decide now."""
    placed = inst.sched.decide(req, inst.sched.targets(req))
    return {c.target_id: c.matched_tokens for c in placed.candidates if c.matched_tokens}


def ok(lease: Lease, cached: int) -> None:
    lease.release(Sample(True, False, 0.1, 0.5, prompt_tokens=600, cached_tokens=cached))


@pytest.fixture
def mesh() -> Iterator[tuple[list[Instance], MemoryNetwork, Clock]]:
    """Three started instances over two 8-sequence vLLM doubles, after their first round and
    one tick (every member knows the others)."""
    clock = Clock()
    clock.advance(86400.0 * 20_000 + 3600)
    net = MemoryNetwork()
    engines = {url: vllm() for url in URLS}
    specs = {url: BackendSpec(url=url, kind="vllm", capacity=8) for url in URLS}
    insts = [instance(m, MEMBERS, net, clock, engines, specs=specs) for m in MEMBERS]
    for inst in insts:
        inst.node.startService()
    clock.advance(0.6)
    clock.advance(TICK)
    assert all(t.backend.kind == "vllm" for i in insts for t in i.state.targets)
    yield insts, net, clock
    for inst in insts:
        stop(inst)


def test_a_new_root_reaches_the_peers_on_the_next_turn_and_they_follow_it(
        mesh: tuple[list[Instance], MemoryNetwork, Clock]) -> None:
    """A sends a request whose system prompt no engine holds. Before any byte of its reply
    and before A's next tick (only the reactor's next turn), B and C predict that prompt on
    the engine A chose, know the root was sent there, and B sends its own request for that
    prompt to the same engine instead of putting the root into the other cache."""
    (a, b, c), net, clock = mesh
    first = got(a.sched.acquire("k", 1, request("q1", 1)))
    x = first.target.id
    root = first.chain.keys[0]
    assert not first.started
    follow = request("q2", 2)
    assert matched(b, follow) == {}  # nothing told yet
    clock.advance(0)  # the next reactor turn: well before the 200 ms tick
    for inst in (b, c):
        assert matched(inst, follow) == {x: len(SYSTEM) // BYTES_PER_TOKEN}
        assert root in inst.sched.roots.held(x)
        assert [s[3] for s in inst.sched.index.slots(root)] == ["peer"]
    second = got(b.sched.acquire("k", 1, follow))
    assert second.target.id == x
    assert second.predicted_tokens > 0 and second.source == "peer"


def test_a_send_to_an_engine_holding_the_root_waits_for_the_tick(
        mesh: tuple[list[Instance], MemoryNetwork, Clock]) -> None:
    """A second request for a root its engine already holds moves nothing: no delta goes
    before the tick, and the tick carries it (the root stays the engine's newest at B)."""
    (a, b, _), net, clock = mesh
    first = got(a.sched.acquire("k", 1, request("q1", 1)))
    clock.advance(0)
    first.first_byte()
    ok(first, cached=0)
    clock.advance(TICK)
    posts = a.node.transport.posts  # type: ignore[attr-defined]
    again = got(a.sched.acquire("k", 1, request("q3", 3)))
    assert again.target is first.target
    clock.advance(0)
    assert a.node.transport.posts == posts  # type: ignore[attr-defined]
    bodies = len(net.delivered)
    clock.advance(TICK)
    sent = [decode(body) for _, body in net.delivered[bodies:]]
    assert [op.moved for d in sent for op in (d.dispatched or ())] == [False, False]
    assert list(b.sched.roots.held(first.target.id))[-1] == first.chain.keys[0]


def test_an_error_reply_takes_the_prediction_back(
        mesh: tuple[list[Instance], MemoryNetwork, Clock]) -> None:
    """A's request fails: the peers' predicted slot for it goes at A's next tick, so they
    no longer send that prompt to the engine for its cache."""
    (a, b, c), _, clock = mesh
    first = got(a.sched.acquire("k", 1, request("q1", 1)))
    clock.advance(0)
    follow = request("q2", 2)
    assert matched(b, follow)
    first.release(Sample(False, False, None, 0.2))
    clock.advance(TICK)
    for inst in (b, c):
        assert matched(inst, follow) == {}
        assert inst.sched.index.slots(first.chain.keys[0]) == []


def test_a_peers_records_do_not_reorder_the_engines_roots(
        mesh: tuple[list[Instance], MemoryNetwork, Clock]) -> None:
    """A sends root 1 to an engine, then B sends root 2 to the same engine. A's first-byte
    and release records for root 1 arrive at B later: they are not sends, so B still has
    root 2 as that engine's newest (the engine took root 1 first). Before dispatches were
    told, each record counted as a send on arrival and put root 1 last."""
    (a, b, _), _, clock = mesh
    first = got(a.sched.acquire("k", 1, request("q1", 1)))
    x = first.target.id
    clock.advance(0)
    other = "Another system prompt entirely, for the same engine. " * 45
    others = frozenset(t.id for t in b.state.targets if t.id != x)
    req2 = request("q2", 2, system=other)
    second = got(b.sched.acquire("k", 1, SchedRequest(
        "m", req2.prompt_tokens, 2, exclude=others, chain=req2.chain)))
    assert second.target.id == x
    roots = [first.chain.keys[0], req2.chain.keys[0]]
    assert list(b.sched.roots.held(x)) == roots
    first.first_byte()
    ok(first, cached=0)
    clock.advance(TICK)
    assert list(b.sched.roots.held(x)) == roots


def test_a_peer_with_a_delta_outstanding_gets_the_dispatch_once_it_answers(
        mesh: tuple[list[Instance], MemoryNetwork, Clock]) -> None:
    """B is slow: A's tick to it is still unanswered when A moves a root. C hears of it on
    the next turn; B gets a delta carrying it as soon as the outstanding one is answered,
    not a tick later."""
    (a, b, c), net, clock = mesh
    net.hold.add("b:1")
    clock.advance(KEEPALIVE + TICK)  # A's (and C's) keep-alive to B is now outstanding
    assert net.held
    net.hold.discard("b:1")
    first = got(a.sched.acquire("k", 1, request("q1", 1)))
    follow = request("q2", 2)
    clock.advance(0)
    assert matched(c, follow) and not matched(b, follow)
    from pharos.peer.node import Reply
    for d in net.held:
        d.callback(Reply(200, None, b"{}"))
    net.held.clear()
    clock.advance(0)
    assert matched(b, follow) == {first.target.id: len(SYSTEM) // BYTES_PER_TOKEN}
    assert a.node.peers["b:1"].flushed >= 1


def test_each_targets_retention_learned_last_reaches_every_instance(
        mesh: tuple[list[Instance], MemoryNetwork, Clock]) -> None:
    """A learns from a reply that engine 0 retains 6,000 root tokens; at its next tick B and
    C hold the same retention (each reply teaches every instance, not only the one that got
    it). C later learns 3,999 from a miss: that newer lesson replaces A's everywhere, and
    A's older one sent again changes nothing."""
    (a, b, c), net, clock = mesh
    now = clock.seconds()
    a.sched.roots.learn(0, 2000, 4000, 1984, now)
    clock.advance(TICK)
    assert [i.sched.roots.retained for i in (a, b, c)] == [{0: 6000}] * 3
    clock.advance(1)
    c.sched.roots.learn(0, 2000, 2000, 0, clock.seconds())
    assert c.sched.roots.retained == {0: 3999}
    old = [body for member, body in net.delivered if member == "b:1"][-1]
    clock.advance(TICK)
    b.node.receive_bytes(old)
    assert [i.sched.roots.retained for i in (a, b, c)] == [{0: 3999}] * 3
