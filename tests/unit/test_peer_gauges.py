"""Layer 1: the scheduler's and the ledger's gauges for peers (spec §8, §11, §12): export,
merge, staleness, Leaving, peer-aware occupancy and budgets, prefix ops handed to peers."""

from __future__ import annotations

from dataclasses import replace

import pytest
from twisted.internet.task import Clock

from pharos.config import Backend as BackendSpec
from pharos.prefix import Chain, PrefixOp
from pharos.sched import PEER_SILENCE_SEC, GaugeError, Scheduler
from pharos.state.state import State
from pharos.state.stats import Sample
from pharos.usage import Ledger, Refusal, Reservation
from tests.support.sched import fleet, granted, llamacpp, req


def one_slot() -> tuple[Scheduler, State, Clock]:
    """One llama.cpp target with two slots."""
    return fleet({"http://l:1": (llamacpp(slots=2), BackendSpec(url="http://l:1"))})


def test_export_counts_inflight_per_target_key_and_waiters_per_model() -> None:
    """export_gauges names targets by key (backend URL # model), absolute counts."""
    sched, state, _ = one_slot()
    granted(sched.acquire("k", 1, req()))
    granted(sched.acquire("k", 1, req()))
    sched.acquire("k", 1, req())
    assert sched.export_gauges() == {"inflight": {"http://l:1#m": 2}, "waiting": {"m": 1}}


def test_peer_inflight_fills_slots_and_its_release_serves_the_queue() -> None:
    """A peer's in-flight requests occupy the target's slots; a report with them gone re-runs
    the queue at once (a peer's freed slot)."""
    sched, state, clock = one_slot()
    sched.merge_gauges("p", {"inflight": {"http://l:1#m": 2}}, clock.seconds())
    d = sched.acquire("k", 1, req())
    assert not d.called and sched.waiting == 1
    assert sched.peer_inflight(state.targets[0].id) == 2
    sched.merge_gauges("p", {"inflight": {"http://l:1#m": 1}}, clock.seconds())
    assert granted(d).target.key == "http://l:1#m"


def test_a_silent_peer_stops_counting_after_two_seconds() -> None:
    """A report counts until its peer has been silent PEER_SILENCE_SEC."""
    sched, state, clock = one_slot()
    sched.merge_gauges("p", {"inflight": {"http://l:1#m": 2}, "waiting": {"m": 3}},
                       clock.seconds())
    clock.advance(PEER_SILENCE_SEC - 0.1)
    assert sched.peer_inflight(0) == 2 and sched.peer_waiting("m") == 3
    clock.advance(0.2)
    assert sched.peer_inflight(0) == 0 and sched.peer_waiting("m") == 0
    assert "p" not in sched.peers


def test_leaving_drops_gauges_at_once() -> None:
    """forget(origin) (a Leaving delta) frees the peer's slots without waiting for silence."""
    sched, state, clock = one_slot()
    sched.merge_gauges("p", {"inflight": {"http://l:1#m": 2}}, clock.seconds())
    d = sched.acquire("k", 1, req())
    assert not d.called
    sched.forget("p")
    granted(d)


def test_unknown_target_counts_once_it_appears() -> None:
    """A key this process has not seen is kept and ignored until the target is registered."""
    sched, state, clock = one_slot()
    sched.merge_gauges("p", {"inflight": {"http://other:1#m": 5, "http://l:1#m": 1}},
                       clock.seconds())
    assert sched.peer_inflight(0) == 1
    assert sched.target_id("http://other:1#m") is None


def test_clock_going_back_keeps_a_fresh_report_for_two_seconds() -> None:
    """A report stamped in the future (the clock jumped back) counts two seconds from now,
    not until the clock catches up."""
    sched, state, clock = one_slot()
    sched.merge_gauges("p", {"inflight": {"http://l:1#m": 1}}, clock.seconds() + 3600)
    assert sched.peer_inflight(0) == 1
    clock.advance(PEER_SILENCE_SEC + 0.1)
    assert sched.peer_inflight(0) == 0


@pytest.mark.parametrize("gauges", [
    {"inflight": [1, 2]},
    {"inflight": {"k": -1}},
    {"inflight": {"k": 1.5}},
    {"waiting": {"m": "3"}},
    {"inflight": {"k": True}},
])
def test_malformed_gauges_are_refused_and_the_previous_report_kept(
        gauges: dict[str, object]) -> None:
    """Garbage raises GaugeError naming the part; the peer's last good report stays."""
    sched, state, clock = one_slot()
    sched.merge_gauges("p", {"inflight": {"http://l:1#m": 1}}, clock.seconds())
    with pytest.raises(GaugeError):
        sched.merge_gauges("p", gauges, clock.seconds())
    assert sched.peer_inflight(0) == 1


def test_prefix_records_and_corrections_go_to_on_prefix() -> None:
    """Each dispatch hands a dispatched op to the peers (the first one moved a root into
    the target, the second did not), a success a record op, an error reply a removal; only
    hashes, the target key and the root's size travel."""
    sched, state, clock = one_slot()
    ops: list[PrefixOp] = []
    sched.learning.on_prefix = ops.append
    chain = Chain((11, 22), (400, 800))
    r = req()
    lease = granted(sched.acquire("k", 1, replace(r, chain=chain)))
    lease.release(Sample(True, False, 0.1, 0.2, prompt_tokens=200, cached_tokens=0))
    lease2 = granted(sched.acquire("k", 1, replace(r, chain=chain)))
    lease2.release(Sample(False, False, None, 0.2))
    assert [(o.target_key, o.hashes, o.remove, o.dispatched, o.moved, o.root_tokens)
            for o in ops] == [
        ("http://l:1#m", (11, 22), False, True, True, 100),
        ("http://l:1#m", (11, 22), False, False, False, None),
        ("http://l:1#m", (11, 22), False, True, False, 100),
        ("http://l:1#m", (11, 22), True, False, False, None)]


def test_merge_prefix_applies_ops_for_known_targets_only() -> None:
    """A peer's record lands in the index as a peer slot; an op for an unknown target is
    dropped and counted."""
    sched, state, clock = one_slot()
    dropped = sched.merge_prefix([PrefixOp("http://l:1#m", (5, 6), 1.0),
                                  PrefixOp("http://x:1#m", (7,), 1.0)], clock.seconds())
    assert dropped == 1
    assert [s[3] for s in sched.index.slots(6)] == ["peer"]


def ledger(clock: Clock, origin: str = "a") -> Ledger:
    return Ledger(clock, origin=origin, timezone="UTC")


def test_peers_reservations_count_against_the_budget() -> None:
    """A peer's open reservations are held against today's budget like this process's own;
    stale after two seconds of silence; dropped at once by forget_reserved."""
    clock = Clock()
    clock.advance(86400 * 20000)
    mine, theirs = ledger(clock, "a"), ledger(clock, "b")
    held = theirs.reserve("k", "t", 600, 1000)
    assert isinstance(held, Reservation)
    mine.merge_reserved("b", theirs.export_reserved(), clock.seconds())
    assert mine.peers_reserved(key="k") == 600
    assert isinstance(mine.reserve("k", "t", 500, 1000), Refusal)
    clock.advance(PEER_SILENCE_SEC)
    assert isinstance(mine.reserve("k", "t", 500, 1000), Reservation)
    mine.merge_reserved("b", theirs.export_reserved(), clock.seconds())
    assert mine.peers_reserved(tenant="t") == 600
    mine.forget_reserved("b")
    assert mine.peers_reserved(key="k") == 0


@pytest.mark.parametrize("raw", ["x", {"day": "1"}, {"day": 1, "keys": {"k": -1}},
                                 {"day": 1, "tenants": []}])
def test_malformed_reservations_are_refused(raw: object) -> None:
    """Garbage raises ValueError and keeps the previous report."""
    clock = Clock()
    mine = ledger(clock)
    mine.merge_reserved("b", {"day": mine._today(), "keys": {"k": 3}}, 0.0)
    with pytest.raises(ValueError):
        mine.merge_reserved("b", raw, 0.0)
    assert mine.peers_reserved(key="k") == 3


def test_export_recent_carries_own_recent_cells_only() -> None:
    """A delta's cells: this origin's Day cells of today and yesterday and its Minute cells;
    older days and other origins' cells stay out."""
    clock = Clock()
    clock.advance(86400 * 20000 + 30)
    mine = ledger(clock, "a")
    old = mine.reserve("k", "t", 10, None)
    assert isinstance(old, Reservation)
    mine.settle(old, "m", 5, 0, 5)
    clock.advance(86400 * 2)
    mine.merge([{"origin": "b", "kind": "day", "bucket": mine._today(), "key": "k",
                 "tenant": "t", "model": "m", "requests": 1, "prompt_tokens": 1,
                 "cached_tokens": 0, "completion_tokens": 1, "unmetered": 0}])
    r = mine.reserve("k", "t", 10, None)
    assert isinstance(r, Reservation)
    assert mine.admit_rpm("k", "t", None) is None
    mine.settle(r, "m", 3, 0, 4)
    cells = mine.export_recent()
    assert {(c["origin"], c["kind"], c["bucket"]) for c in cells} == {
        ("a", "day", mine._today()), ("a", "minute", int(clock.seconds() // 60))}
