"""Layer 1: the scheduler prices what a prompt would push out of a small cache (issue 10
item 2, ``pharos.retention``): each target's roots in LRU order, retention learned from the
replies' cached tokens through the lease, and a candidate that does not hold the root priced
with the live roots it would evict that no other candidate holds."""

from __future__ import annotations

from dataclasses import replace

import pytest
from twisted.internet.task import Clock

from pharos.policy import Candidate, PolicyConfig, RouteReq, pick
from pharos.reasons import deciding_term
from pharos.retention import LIVE_SEC
from pharos.sched import Guards, SchedRequest, Scheduler
from tests.support.cache_routing import chat, ok
from tests.support.eviction import on, root_tokens, system, three


def test_replies_teach_a_targets_retention() -> None:
    """A root found cached behind two others proves three roots retained; one found evicted
    behind three proves fewer."""
    sched, _, _ = three()
    for n in (1, 2, 3):
        ok(on(sched, 0, chat("q", system=system(n))), cached=0)
    again = on(sched, 0, chat("q", system=system(1)))
    assert again.root_ahead == root_tokens(2) + root_tokens(3)
    ok(again, cached=root_tokens(1))
    three_roots = root_tokens(1) + root_tokens(2) + root_tokens(3)
    assert sched.roots.retained[0] == three_roots
    ok(on(sched, 0, chat("q", system=system(4))), cached=0)
    evicted = on(sched, 0, chat("q", system=system(2)))  # 3, 1 and 4 since
    ok(evicted, cached=0)
    assert sched.roots.retained[0] < three_roots + root_tokens(4)


def filled() -> tuple[Scheduler, Clock]:
    """Target 0 holds roots 1, 2, 3 and retains exactly those; target 1 holds root 4."""
    sched, _, clock = three()
    for n in (1, 2, 3):
        ok(on(sched, 0, chat("q", system=system(n))), cached=0)
    ok(on(sched, 1, chat("q", system=system(4))), cached=0)
    sched.roots.retained[0] = root_tokens(1) + root_tokens(2) + root_tokens(3)
    return sched, clock


def evict_tokens(sched: Scheduler, req: SchedRequest) -> dict[int, int]:
    placed = sched.decide(req, sched.targets(req))
    return {c.target_id: c.evict_tokens for c in placed.candidates}


def test_a_new_root_is_priced_with_the_root_it_would_push_out() -> None:
    """A new root on the full target evicts its least recently used live root, which no
    other target holds; targets whose retention is unknown are priced nothing."""
    sched, _ = filled()
    assert evict_tokens(sched, chat("q", system=system(9))) == {0: root_tokens(1), 1: 0, 2: 0}


def test_no_price_for_a_held_root_a_shared_one_or_a_dead_one() -> None:
    """The target holding the request's root evicts nothing; a root another target also
    holds costs nothing to evict; nor does one nobody asked for within LIVE_SEC."""
    sched, clock = filled()
    assert evict_tokens(sched, chat("q2", system=system(2)))[0] == 0
    ok(on(sched, 2, chat("q", system=system(1))), cached=0)  # root 1 on target 2 too
    assert evict_tokens(sched, chat("q", system=system(9)))[0] == 0
    clock.pump([1.0] * int(LIVE_SEC + 2))
    sched.roots.retained[2] = root_tokens(1)
    ok(on(sched, 2, chat("q", system=system(5))), cached=0)  # 2 now holds only root 5
    assert evict_tokens(sched, chat("q", system=system(9)))[0] == 0  # root 1 is dead


def test_pricing_can_be_turned_off() -> None:
    """``routing.eviction_pricing: false`` prices nothing."""
    sched, _ = filled()
    sched.reconfigure(replace(sched.routing, guards=Guards(eviction_pricing=False)))
    assert evict_tokens(sched, chat("q", system=system(9))) == {0: 0, 1: 0, 2: 0}


def test_the_cost_adds_the_evictions_prefill() -> None:
    """An idle target that would push out 500 tokens of another prompt's cache (0.5 s at its
    speed) loses to one 0.3 s busier that pushes out nothing, and wins when what it pushes
    out is worth less than that wait; the term is in the scores and may decide."""
    base = Candidate(target_id=0, warm=True, capacity=4, free_slots=4, queue_ahead=0,
                     kv_usage=None, matched_tokens=0, prefill_sec_per_token=0.001,
                     load_sec=None, service_sec=None, fits_if_cold=None, loading=False,
                     inflight=0)
    idle = replace(base, target_id=0, evict_tokens=500)
    busy = replace(base, target_id=1, queued_prefill_sec=0.3)
    d = pick(RouteReq(600, 1), [idle, busy], PolicyConfig())
    assert d.target_id == 1
    assert d.scores[0].evict == pytest.approx(0.5) and d.scores[1].evict == 0
    assert deciding_term(d.scores, 1) == "evict"
    d = pick(RouteReq(600, 1), [replace(idle, evict_tokens=200), busy], PolicyConfig())
    assert d.target_id == 0


def test_a_prediction_the_retention_says_is_stale_is_not_priced() -> None:
    """The index still predicts root 1 on target 0, but two roots went there since and it
    retains two: the candidate is priced without the match (the index learns of the eviction
    only from the next reply); the lease still carries the index's prediction, so that reply
    corrects it."""
    sched, _ = filled()
    req = chat("q2", system=system(1))
    placed = sched.decide(req, sched.targets(req))
    assert placed.matches[0].tokens > 0
    assert next(c for c in placed.candidates if c.target_id == 0).matched_tokens > 0
    sched.roots.retained[0] = root_tokens(2) + root_tokens(3)
    placed = sched.decide(req, sched.targets(req))
    assert next(c for c in placed.candidates if c.target_id == 0).matched_tokens == 0
