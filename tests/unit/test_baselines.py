"""The baseline policies (issue 17 item 2): ``round-robin``, ``random``, ``p2c`` and
``prefix-hash`` are pure functions of the same inputs as ``cost``, skip what is set aside, and
choose as their names say."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pharos import policy, reasons
from pharos.policy import POLICIES, SET_ASIDE_WONT_FIT, Candidate, PolicyConfig, RouteReq, pick

reasons.install(policy)  # its decisions worded, as the scheduler's are

BASELINES = ("round-robin", "random", "p2c", "prefix-hash")


def cand(target_id: int, **changes: Any) -> Candidate:
    """An idle warm target with 4 slots."""
    fields: dict[str, Any] = {
        "warm": True, "capacity": 4, "free_slots": 4, "queue_ahead": 0, "kv_usage": 0.1,
        "matched_tokens": 0, "prefill_sec_per_token": 0.002, "load_sec": 5.0,
        "service_sec": 4.0, "fits_if_cold": True, "loading": False, "inflight": 0}
    fields.update(changes)
    return Candidate(target_id=target_id, **fields)


def cfg(name: str) -> PolicyConfig:
    return PolicyConfig(name=name)  # type: ignore[arg-type]


def test_every_baseline_is_a_policy() -> None:
    """The four baselines sit in ``POLICIES`` beside cost and least-load."""
    assert set(POLICIES) == {"cost", "least-load", *BASELINES}


def test_round_robin_takes_turns_in_target_id_order() -> None:
    """Turn ``seq`` is the ``seq``-th feasible target by id, whatever the candidates' order,
    and a set-aside target is skipped."""
    cands = [cand(3), cand(1), cand(2)]
    picks = [pick(RouteReq(10, 99, seq=s), cands, cfg("round-robin")).target_id
             for s in range(6)]
    assert picks == [1, 2, 3, 1, 2, 3]
    aside = [cand(3), cand(1, warm=False, fits_if_cold=False), cand(2)]
    picks = [pick(RouteReq(10, 99, seq=s), aside, cfg("round-robin")).target_id
             for s in range(4)]
    assert picks == [2, 3, 2, 3]
    d = pick(RouteReq(10, 99, seq=0), aside, cfg("round-robin"))
    assert d.why == "baseline" and "round robin turn 1 of 2" in d.reason
    assert SET_ASIDE_WONT_FIT in d.reason


def test_random_spreads_over_the_feasible_targets() -> None:
    """Over many seeds every target is drawn, about equally, and the draw does not depend on
    the candidates' order."""
    cands = [cand(1), cand(2), cand(3)]
    counts = Counter(pick(RouteReq(10, s), cands, cfg("random")).target_id
                     for s in range(3000))
    assert set(counts) == {1, 2, 3} and min(counts.values()) > 800
    for s in range(50):
        assert (pick(RouteReq(10, s), cands, cfg("random")).target_id
                == pick(RouteReq(10, s), cands[::-1], cfg("random")).target_id)


def test_p2c_takes_the_less_utilized_of_two() -> None:
    """Never the most utilized of three (it is always beaten by the other one drawn), and
    the least utilized whenever it is drawn."""
    cands = [cand(1, free_slots=0), cand(2, free_slots=2), cand(3, free_slots=4)]
    picks = Counter(pick(RouteReq(10, s), cands, cfg("p2c")).target_id for s in range(600))
    assert picks[1] == 0 and picks[3] > picks[2] > 0
    d = next(pick(RouteReq(10, s), cands, cfg("p2c")) for s in range(600)
             if pick(RouteReq(10, s), cands, cfg("p2c")).target_id == 3)
    assert d.why == "least_loaded" and "p2c" in d.reason


def test_prefix_hash_keeps_a_root_on_one_target() -> None:
    """One root goes to one target whatever the seed and load; roots spread over targets;
    a target leaving moves only the roots it held; no root falls back to p2c."""
    cands = [cand(1), cand(2), cand(3, free_slots=0)]
    for root in range(40):
        first = pick(RouteReq(10, 0, root=root), cands, cfg("prefix-hash")).target_id
        for s in range(5):
            assert pick(RouteReq(10, s, root=root), cands[::-1],
                        cfg("prefix-hash")).target_id == first
    owners = {r: pick(RouteReq(10, 0, root=r), cands, cfg("prefix-hash")).target_id
              for r in range(300)}
    assert set(owners.values()) == {1, 2, 3}
    fewer = cands[:2]
    for r, owner in owners.items():
        if owner != 3:
            assert pick(RouteReq(10, 0, root=r), fewer, cfg("prefix-hash")).target_id == owner
    d = pick(RouteReq(10, 5), cands, cfg("prefix-hash"))
    assert "no root prefix, p2c" in d.reason


@pytest.mark.parametrize("name", BASELINES)
def test_a_baseline_without_a_free_slot_queues(name: str) -> None:
    """A chosen target without a free slot means waiting in the fair queue; nothing feasible
    at all is a decision without a target."""
    d = pick(RouteReq(10, 1, root=5), [cand(1, free_slots=0)], cfg(name))
    assert d.target_id == 1 and d.enqueue and d.why == "only_choice"
    none = pick(RouteReq(10, 1), [cand(1, warm=False, fits_if_cold=False)], cfg(name))
    assert none.target_id is None and none.enqueue


@given(st.sampled_from(BASELINES), st.integers(0, 2**63), st.integers(0, 50),
       st.one_of(st.none(), st.integers(0, 2**64 - 1)),
       st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=1, max_size=6))
def test_baselines_are_pure_and_pick_only_feasible(name: str, seed: int, seq: int,
                                                   root: int | None,
                                                   shape: list[tuple[int, bool]]) -> None:
    """The same inputs give the same decision (no hidden state: round robin's turn is an
    input), and the winner is never set aside."""
    cands = [cand(i, free_slots=free, warm=warm, fits_if_cold=warm)
             for i, (free, warm) in enumerate(shape)]
    req = RouteReq(100, seed, seq=seq, root=root)
    a, b = pick(req, cands, cfg(name)), pick(req, list(cands), cfg(name))
    assert a == b
    if a.target_id is not None:
        assert next(c for c in cands if c.target_id == a.target_id).warm
