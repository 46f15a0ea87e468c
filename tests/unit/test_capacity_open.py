"""Layer 1: a target holding the prompt's root, full at a capacity Pharos only estimated
(learned, or the fallback) while its engine queues nothing, is given one more request
instead of sending the hit to an engine without the prompt (issue 10 item 2: on the
shared-prefix bench the holders were full at the 6-10 slots learned so far of the doubles'
64, and the spread hits pushed other prompts out of small caches); an engine that queues,
a capacity the engine or the config gives, or a queue in Pharos ahead keeps it full."""

from __future__ import annotations

from twisted.internet.task import Clock

from pharos.config import Backend as BackendSpec
from pharos.policy import Candidate
from pharos.prefix import Chain, chain
from pharos.sched import SchedRequest, Scheduler, with_match
from pharos.state.registry import Target
from tests.support.capacity import report, vllm
from tests.support.plan import FakeBackend
from tests.support.sched import fleet, granted

A, B = "http://a", "http://b"


def prompt(system: str) -> Chain:
    msgs = [{"role": "system", "content": system * 200}, {"role": "user", "content": "q"}]
    return chain("m", msgs, None, None)


ROOT = prompt("harbour pilot ")


def rig(capacity: int | None = None, waiting: int = 0
        ) -> tuple[Scheduler, Clock, dict[str, FakeBackend], Target, Target]:
    """Two vLLM doubles, ``a`` holding ROOT with 2 learned slots both taken by requests of
    it, ``b`` idle and holding nothing; ``a``'s engine reports ``waiting`` at the last
    round (fresh: no reply has ended since)."""
    engines = {A: vllm(), B: vllm()}
    for e in engines.values():
        report(e, 0)
    sched, state, clock = fleet({url: (e, BackendSpec(url=url, kind="vllm", capacity=capacity))
                                 for url, e in engines.items()})
    a, b = sorted(state.targets, key=lambda t: t.backend.url)
    sched.index.record(ROOT.keys[:1], a.id, a.gen, clock.seconds())
    if capacity is None:
        a.learned_capacity = b.learned_capacity = 2
    for seed in (1, 2):
        assert granted(sched.acquire("k", 1, SchedRequest("m", 900, seed, chain=ROOT))
                       ).target is a
    if waiting:
        report(engines[A], 2, waiting)
        clock.advance(1.0)
    return sched, clock, engines, a, b


def test_a_holder_full_at_its_learned_capacity_takes_one_more() -> None:
    """At its 2 learned slots, with no queue at the engine, the holder of the prompt's root
    takes a third request with it (the reason says it went past its learned capacity); a
    prompt with another root goes to the idle engine."""
    sched, _, _, a, b = rig()
    lease = granted(sched.acquire("k", 1, SchedRequest("m", 900, 3, chain=ROOT)))
    assert lease.target is a and a.inflight == 3
    assert "past its learned capacity" in lease.decision.reason
    other = prompt("lighthouse keeper ")
    assert granted(sched.acquire("k", 1, SchedRequest("m", 900, 4, chain=other))).target is b


def test_an_engine_queue_keeps_the_holder_full() -> None:
    """An engine that reports a queue (its last round, fresh) keeps the holder full at what
    Pharos counts: the hit goes to the idle engine."""
    sched, _, _, a, b = rig(waiting=3)
    lease = granted(sched.acquire("k", 1, SchedRequest("m", 900, 3, chain=ROOT)))
    assert lease.target is b


def test_a_capacity_the_engine_queued_at_keeps_the_holder_full() -> None:
    """Once the engine has queued at the learned capacity (``capacity_seen_queue``), that is
    its cap, not an estimate: no slot past it, even with the queue gone."""
    sched, _, _, a, b = rig()
    a.capacity_seen_queue = True
    lease = granted(sched.acquire("k", 1, SchedRequest("m", 900, 3, chain=ROOT)))
    assert lease.target is b


def test_a_configured_capacity_is_not_exceeded() -> None:
    """``capacity:`` in the config is the operator's cap: the holder full at it stays full."""
    sched, _, _, a, b = rig(capacity=2)
    lease = granted(sched.acquire("k", 1, SchedRequest("m", 900, 3, chain=ROOT)))
    assert lease.target is b


def test_the_slot_past_capacity_needs_the_root_and_no_queue_ahead() -> None:
    """``with_match`` gives the slot only for a match covering the root, while no other
    request waits ahead (the request itself is the one counted), and only to a candidate
    whose capacity is open."""
    full = Candidate(target_id=0, warm=None, capacity=2, free_slots=0, queue_ahead=1,
                     kv_usage=0.1, matched_tokens=0, prefill_sec_per_token=None,
                     load_sec=None, service_sec=None, fits_if_cold=None, loading=False,
                     inflight=2, capacity_open=True)
    assert with_match(full, 500, True).free_slots == 1
    assert with_match(full, 500, False).free_slots == 0
    behind = Candidate(**{**{f: getattr(full, f) for f in full.__dataclass_fields__},
                          "queue_ahead": 2})
    assert with_match(behind, 500, True).free_slots == 0
    closed = Candidate(**{**{f: getattr(full, f) for f in full.__dataclass_fields__},
                          "capacity_open": False})
    assert with_match(closed, 500, True).free_slots == 0
