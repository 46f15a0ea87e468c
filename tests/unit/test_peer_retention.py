"""Layer 1: a peer's prefix records count in this instance's picture of each engine's cache
(``Scheduler.merge_prefix`` → ``RootCaches``): behind several instances each engine takes
every instance's prompts, so what it still holds depends on all of them. And that picture
travels in snapshots, so a restarted instance tells stale predictions from live ones."""

from __future__ import annotations

from pharos.peer.snapshot import Replicas, build_now, decode, restore
from pharos.prefix import PrefixOp
from pharos.sched import SchedRequest, Scheduler
from pharos.usage import Ledger
from tests.support.cache_routing import chat, ok
from tests.support.eviction import on, root_tokens, system, three


def matched(sched: Scheduler, req: SchedRequest, target: int) -> int:
    placed = sched.decide(req, sched.targets(req))
    return next(c for c in placed.candidates if c.target_id == target).matched_tokens


def test_peer_records_push_a_root_out_of_the_engine_they_went_to() -> None:
    """Target 0 retains two roots and holds root 1 (sent here). Peers then send roots 2 and 3
    there: their records make root 1 the third most recent, so a request for it is no longer
    priced as cached on target 0; the record of a root whose size this instance never saw
    changes nothing; a correction (remove) is not a send."""
    sched, _, clock = three()
    ok(on(sched, 1, chat("q", system=system(2))), cached=0)  # sizes of roots 2 and 3 known
    ok(on(sched, 2, chat("q", system=system(3))), cached=0)
    ok(on(sched, 0, chat("q", system=system(1))), cached=0)
    sched.roots.retained[0] = root_tokens(1) + root_tokens(2)
    key = sched.state.targets[0].key
    again = chat("q2", system=system(1))
    assert matched(sched, again, 0) > 0
    unknown = chat("q", system=system(7)).chain.keys
    before = dict(sched.roots.held(0))
    sched.merge_prefix([PrefixOp(key, unknown, clock.seconds()),
                        PrefixOp(key, chat("q", system=system(2)).chain.keys, clock.seconds(),
                                 remove=True)], clock.seconds())
    assert dict(sched.roots.held(0)) == before and matched(sched, again, 0) > 0
    for n in (2, 3):
        sched.merge_prefix([PrefixOp(key, chat("q", system=system(n)).chain.keys,
                                     clock.seconds())], clock.seconds())
    assert list(sched.roots.held(0).values())[-2:] == [root_tokens(2), root_tokens(3)]
    assert matched(sched, again, 0) == 0


def replicas(sched: Scheduler, roots: bool = True) -> Replicas:
    ledger = Ledger(sched.state.clock, origin="o", timezone="UTC")
    return Replicas(sched.state, sched.index, ledger, sched.roots if roots else None)


def test_a_restarted_instance_restores_the_roots_and_drops_stale_predictions() -> None:
    """An instance restarted from a snapshot (a peer's or its state file) with the roots
    part knows that target 0 pushed root 1 out (two roots sent since, retention two roots)
    and does not predict it there, as the instance it came from does not; without the part
    it would. Its first sends keep the restored picture (the engine is the one the picture
    describes): root 3 is still the newest on target 0."""
    sched, _, _ = three()
    for n in (1, 2, 3):
        ok(on(sched, 0, chat("q", system=system(n))), cached=0)
    sched.roots.retained[0] = root_tokens(2) + root_tokens(3)
    stale, live = chat("q2", system=system(1)), chat("q2", system=system(3))
    assert matched(sched, stale, 0) == 0 and matched(sched, live, 0) > 0
    data = build_now(replicas(sched), sched.state.clock)

    without, _, _ = three()
    restore(replicas(without, roots=False), decode(data), 0.0)
    assert matched(without, stale, 0) > 0  # the bench's "predicted held" misses

    restarted, _, _ = three()
    done = restore(replicas(restarted), decode(data), 0.0)
    assert done.roots_merged == 3
    assert matched(restarted, stale, 0) == 0 and matched(restarted, live, 0) > 0
    ok(on(restarted, 1, chat("q", system=system(4))), cached=0)
    assert on(restarted, 0, chat("q3", system=system(3))).root_ahead == 0
    assert list(restarted.roots.held(0))[:2] == [chat("q", system=system(n)).chain.keys[0]
                                                  for n in (1, 2)]


def test_a_peers_dispatch_is_a_send_but_no_prediction_on_a_slot_cache() -> None:
    """On llama.cpp targets (each slot caches its own prompt, reusable only once the request
    ended) a peer's dispatch counts as a send in the target's root LRU, with the size it
    carries even for a root this instance never saw, and in the root's demand, but predicts
    nothing in the index; a dispatch to a target not known here is dropped."""
    sched, _, clock = three()
    key = sched.state.targets[0].key
    req = chat("q", system=system(5))
    op = PrefixOp(key, req.chain.keys, clock.seconds(), dispatched=True, root_tokens=1234,
                  moved=True)
    unknown = PrefixOp("http://nowhere:1#m", req.chain.keys, clock.seconds(), dispatched=True)
    assert sched.merge_dispatched([op, unknown], clock.seconds()) == 1
    assert sched.roots.held(0) == {req.chain.keys[0]: 1234}
    assert sched.hot.demand(req.chain.keys[0], clock.seconds()) > 0
    assert sched.index.slots(req.chain.keys[0]) == []
    assert matched(sched, req, 0) == 0
