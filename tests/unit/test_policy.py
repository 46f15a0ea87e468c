"""Routing policy (spec §7): table tests for every branch of ``cost`` and ``least-load``, the
worked example of the reason string, fallbacks (fleet median, then defaults, never 0), ties,
purity, and hypothesis properties."""

from __future__ import annotations

import ast
import dataclasses
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pharos import policy, reasons
from pharos.policy import (
    BOUNDED_LOAD_MIN_INFLIGHT,
    FITS_IF_COLD_UNKNOWN,
    KV_DISCOUNTED,
    KV_USAGE_UNKNOWN,
    KV_WAIVED,
    SET_ASIDE_BOUNDED_LOAD,
    SET_ASIDE_WONT_FIT,
    Candidate,
    Decision,
    PolicyConfig,
    RouteReq,
    Score,
    cost,
    least_load,
    pick,
    score,
)

reasons.install(policy)  # its decisions worded, as the scheduler's are

COST = PolicyConfig()
LEAST = PolicyConfig(name="least-load")
#: Only the absolute window (1 ms): the tests of its exact edges.
ABSOLUTE = PolicyConfig(tie_window_share=0.0)
REQ = RouteReq(prompt_tokens=1000, seed=7)


def cand(target_id: int, **changes: Any) -> Candidate:
    """An idle warm target with 4 slots, 2 ms per prefill token, all estimates known; a full
    1000-token prefill costs 2.0 s and a load 5.0 s."""
    fields: dict[str, Any] = {
        "warm": True,
        "capacity": 4,
        "free_slots": 4,
        "queue_ahead": 0,
        "kv_usage": 0.1,
        "matched_tokens": 0,
        "prefill_sec_per_token": 0.002,
        "load_sec": 5.0,
        "service_sec": 4.0,
        "fits_if_cold": True,
        "loading": False,
        "inflight": 0,
    }
    fields.update(changes)
    return Candidate(target_id=target_id, **fields)


def by_id(decision: Decision, target_id: int) -> Score:
    """The score of one target in a decision."""
    (found,) = [s for s in decision.scores if s.target_id == target_id]
    return found


# --- cost: every branch -------------------------------------------------------------------

COST_TABLE = [
    pytest.param([cand(1, warm=False), cand(2)], 2, "warm", False, id="warm-beats-cold"),
    pytest.param(
        [cand(1, capacity=1, free_slots=0, queue_ahead=3), cand(2, warm=False)],
        2, "least_loaded", False, id="cold-when-warm-wait-outweighs-load"),
    pytest.param([cand(1, free_slots=0), cand(2, warm=False)], 1, "warm", True,
                 id="queue-on-warm-when-wait-is-shorter-than-load"),
    pytest.param(
        [cand(1, capacity=1, free_slots=0, queue_ahead=9),
         cand(2, warm=False, fits_if_cold=False, load_sec=0.1)],
        1, "only_choice", True, id="infeasible-cold-never-picked"),
    pytest.param(
        [cand(1, warm=False, loading=True, fits_if_cold=False), cand(2, warm=False)],
        1, "warm", False, id="loading-counts-as-warm"),
    pytest.param([cand(1, warm=None), cand(2, warm=False)], 1, "warm", False,
                 id="unknown-residency-is-always-loaded"),
    pytest.param([cand(1, matched_tokens=900, free_slots=2), cand(2)], 1, "cache", False,
                 id="cached-prefix-outweighs-load"),
    pytest.param(
        [cand(1, matched_tokens=900, free_slots=2), cand(2, warm=False, load_sec=1.0)],
        1, "cache", False, id="cache-saved-more-than-warm"),
    pytest.param([cand(1, matched_tokens=100), cand(2, warm=False)], 1, "warm", False,
                 id="warm-saved-more-than-cache"),
    pytest.param([cand(1, free_slots=1), cand(2, free_slots=3)], 2, "least_loaded", False,
                 id="equal-cost-least-utilized"),
    pytest.param([cand(1, prefill_sec_per_token=0.001, free_slots=2), cand(2)],
                 1, "least_loaded", False, id="won-on-prefill-speed-alone"),
    pytest.param([cand(1)], 1, "only_choice", False, id="only-choice"),
    pytest.param([cand(1, free_slots=0)], 1, "only_choice", True, id="only-choice-saturated"),
]


@pytest.mark.parametrize(("cands", "target", "why", "enqueue"), COST_TABLE)
def test_cost_branches(cands: list[Candidate], target: int, why: str, enqueue: bool) -> None:
    """Each branch of the cost policy picks the target with the lowest estimated TTFT (wait +
    load + prefill), never an infeasible cold load, enqueues exactly when the winner has no
    free slot, and reports the §13 route outcome that explains the win."""
    d = pick(REQ, cands, COST)
    assert (d.target_id, d.why, d.enqueue) == (target, why, enqueue)
    assert d.reason


def test_cost_terms_follow_the_formula() -> None:
    """Every term of a score is the spec §7 formula: wait = (queue+1)/capacity × service when
    saturated, load when cold, prefill of the uncached tokens, the KV penalty (a quarter of
    what the match saves at 95 % usage with the 0.9 threshold: half the way to 100 %, times
    KV_DISTRUST_MAX), utilization counting the queue."""
    c = cand(1, capacity=2, free_slots=0, queue_ahead=3, service_sec=4.0, warm=False,
             load_sec=5.0, kv_usage=0.95, matched_tokens=500)
    s, _ = score(REQ, [c, cand(2, kv_usage=0.1)], COST)
    assert s.wait == pytest.approx(8.0)
    assert s.load == pytest.approx(5.0)
    assert s.prefill == pytest.approx(1.0)
    assert s.kv_penalty == pytest.approx(0.25)
    assert s.utilization == pytest.approx(2.5)
    assert s.est_ttft == pytest.approx(14.25)
    assert s.feasible and s.set_aside is None and s.fallbacks == ()


def test_free_slot_means_no_wait_even_with_a_queue() -> None:
    """A target with a free slot has no wait (spec §7), though queued requests still count in
    its utilization."""
    (s,) = score(REQ, [cand(1, free_slots=1, queue_ahead=2)], COST)
    assert s.wait == 0.0
    assert s.utilization == pytest.approx((4 - 1 + 2) / 4)


def test_infeasible_cold_load_is_set_aside_with_no_estimate() -> None:
    """A cold load that would not fit has no est_ttft, is marked set aside with its reason,
    and the decision's reason counts it."""
    d = pick(REQ, [cand(1, free_slots=0), cand(2, warm=False, fits_if_cold=False)], COST)
    s = by_id(d, 2)
    assert s.est_ttft is None
    assert not s.feasible
    assert s.set_aside == SET_ASIDE_WONT_FIT
    assert "1 set aside (cold load won't fit)" in d.reason


@pytest.mark.parametrize("cfg", [COST, LEAST], ids=["cost", "least-load"])
def test_no_feasible_target_waits_without_a_target(cfg: PolicyConfig) -> None:
    """When every candidate is a cold load that would not fit, both policies return no target
    and enqueue (the scheduler waits for a model to become evictable), saying why."""
    cands = [cand(1, warm=False, fits_if_cold=False), cand(2, warm=False, fits_if_cold=False)]
    d = pick(REQ, cands, cfg)
    assert d.target_id is None
    assert d.enqueue
    assert d.why is None
    assert d.reason == "no feasible target: 2 set aside (cold load won't fit)"
    assert len(d.scores) == 2


@pytest.mark.parametrize("cfg", [COST, LEAST], ids=["cost", "least-load"])
def test_no_candidates(cfg: PolicyConfig) -> None:
    """With no candidates at all there is nothing to wait for: no target, no enqueue."""
    d = pick(REQ, [], cfg)
    assert (d.target_id, d.enqueue, d.why, d.scores) == (None, False, None, ())
    assert d.reason == "no candidates"


def test_loading_target_pays_no_load() -> None:
    """A target whose cold model is already loading counts as warm: its load term is 0 and a
    memory check that says it won't fit does not set it aside (the load is already paid)."""
    (s,) = score(REQ, [cand(1, warm=False, loading=True, fits_if_cold=False)], COST)
    assert s.load == 0.0
    assert s.feasible


def test_unknown_residency_pays_no_load() -> None:
    """An engine that reports no residency has its one model always loaded: no load term, and
    no load_sec fallback either, since the load was never needed."""
    (s,) = score(REQ, [cand(1, warm=None, load_sec=None)], COST)
    assert s.load == 0.0
    assert s.fallbacks == ()


@pytest.mark.parametrize(
    ("kv_usage", "winner", "penalty"),
    [
        pytest.param(0.5, 1, 0.0, id="no-pressure-match-wins"),
        pytest.param(0.9, 1, 0.0, id="at-threshold-no-penalty"),
        pytest.param(0.98, 1, 0.8, id="pressure-discounts-the-holder-still-wins"),
        pytest.param(1.0, 2, 1.0, id="full-cache-loses-to-a-longer-unpressured-match"),
        pytest.param(None, 1, 0.0, id="unknown-usage-match-trusted"),
    ],
)
def test_kv_pressure_penalty(kv_usage: float | None, winner: int, penalty: float) -> None:
    """Above the 0.9 threshold part of the prefill a prefix match saves is added back in
    proportion (KV_DISTRUST_MAX of it at 100 %), which hands the win to a target without
    pressure only when that one's own match is close (600 of 1,000 tokens here); unknown KV
    usage adds no penalty but is listed as an assumption."""
    cands = [cand(1, matched_tokens=1000, kv_usage=kv_usage),
             cand(2, matched_tokens=600, kv_usage=0.5)]
    d = pick(REQ, cands, COST)
    assert d.target_id == winner
    s = by_id(d, 1)
    assert s.kv_penalty == pytest.approx(penalty)
    assert s.prefill == 0.0
    assert (KV_USAGE_UNKNOWN in s.fallbacks) == (kv_usage is None)


def test_a_holder_under_full_pressure_still_beats_a_target_holding_nothing() -> None:
    """At 100 % KV usage the holder pays back at most half of what its match saves, so it
    still costs less than an idle target without the prompt; the decision says the guard
    discounted a match."""
    d = pick(REQ, [cand(1, matched_tokens=1000, kv_usage=1.0), cand(2, kv_usage=0.2)], COST)
    assert d.target_id == 1
    assert by_id(d, 1).kv_penalty == pytest.approx(1.0)
    assert d.guards == (KV_DISCOUNTED,) and "kv pressure discounted 1 match" in d.reason


@pytest.mark.parametrize(("above", "below", "waived"),
                         [(3, 0, True), (2, 1, False), (9, 1, True), (8, 2, False),
                          (1, 0, True)])
def test_kv_pressure_is_waived_when_nearly_every_candidate_is_above(
        above: int, below: int, waived: bool) -> None:
    """When every candidate reporting KV usage is above the threshold (at most one in ten
    below), the guard is waived for all: no match is discounted, the prefix decides, and
    the decision and its reason say so; otherwise it discounts the pressured matches."""
    cands = [cand(i, matched_tokens=1000 if i == 0 else 0, kv_usage=0.99)
             for i in range(above)]
    cands += [cand(above + i, kv_usage=0.3) for i in range(below)]
    cands.append(cand(99, kv_usage=None))  # unknown usage neither counts for nor against
    d = pick(REQ, cands, COST)
    assert d.target_id == 0
    assert (by_id(d, 0).kv_penalty == 0.0) == waived
    assert d.guards == ((KV_WAIVED,) if waived else (KV_DISCOUNTED,))
    assert ("kv pressure waived" in d.reason) == waived


def test_kv_pressure_threshold_one_turns_the_penalty_off() -> None:
    """kv_pressure_threshold=1.0 never penalizes, even at 100 % usage."""
    cfg = PolicyConfig(kv_pressure_threshold=1.0)
    (s,) = score(REQ, [cand(1, matched_tokens=1000, kv_usage=1.0)], cfg)
    assert s.kv_penalty == 0.0


# --- matched tokens (prefix cache) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("matched", "prefill"),
    [(0, 2.0), (400, 1.2), (1000, 0.0), (5000, 0.0), (-3, 2.0)],
    ids=["none", "part", "all", "more-than-prompt", "negative"],
)
def test_matched_tokens_shrink_prefill(matched: int, prefill: float) -> None:
    """Only uncached tokens are prefilled: max(prompt - matched, 0) × seconds per token, and a
    match estimate longer than the prompt estimate never makes prefill negative."""
    (s,) = score(REQ, [cand(1, matched_tokens=matched)], COST)
    assert s.prefill == pytest.approx(prefill)
    assert s.kv_penalty == 0.0


def test_worked_example_reason() -> None:
    """The spec §7 worked example: a warm target holding 1.2k of a 1.4k-token prompt beats an
    idle cold one, reason "warm, 1.2k cached tok, est 0.4s vs 3.1s (cold)", and the §13 outcome
    is cache (its prefix saved 2.4 s against the other's 0.3 s load)."""
    req = RouteReq(prompt_tokens=1400, seed=1)
    cands = [cand(1, matched_tokens=1200), cand(2, warm=False, load_sec=0.3)]
    d = pick(req, cands, COST)
    assert d.target_id == 1
    assert d.reason == "warm, 1.2k cached tok, est 0.4s vs 3.1s (cold)"
    assert d.why == "cache"
    assert not d.enqueue


@pytest.mark.parametrize(
    ("cands", "cfg", "reason"),
    [
        pytest.param([cand(1)], COST, "only choice, warm, est 2s", id="only-choice"),
        pytest.param([cand(1, free_slots=0, service_sec=0.02)], COST,
                     "only choice, warm, full, est 2s, queued: no free slot", id="queued"),
        pytest.param([cand(1, prefill_sec_per_token=0.00005)], COST,
                     "only choice, warm, est 50ms", id="milliseconds"),
        pytest.param([cand(1, warm=False, loading=True), cand(2, warm=False)], COST,
                     "loading, est 2s vs 7s (cold)", id="loading"),
        pytest.param([cand(1, prefill_sec_per_token=None), cand(2, warm=False)], COST,
                     "warm, est 2s vs 7s (cold), assumed prefill_sec_per_token=median",
                     id="assumed"),
        pytest.param([cand(1, free_slots=2), cand(2, warm=False)], LEAST,
                     "least loaded, cold, util 0% vs 50% (warm)", id="least-load"),
        pytest.param([cand(1), cand(2, warm=False, fits_if_cold=False)], LEAST,
                     "only choice, warm, util 0%, 1 set aside (cold load won't fit)",
                     id="least-load-only-choice"),
    ],
)
def test_reason_reads_for_people(cands: list[Candidate], cfg: PolicyConfig, reason: str) -> None:
    """The reason names the winner's state, its cached tokens, its estimate against the
    runner-up's (or utilization under least-load), queueing, set-aside candidates and the
    inputs it assumed."""
    assert pick(REQ, cands, cfg).reason == reason


# --- fallbacks: fleet median, then defaults, never 0 ---------------------------------------


def test_unknown_prefill_speed_takes_fleet_median() -> None:
    """A candidate with unknown prefill speed beside one that knows 1 ms/token is estimated at
    1 ms/token, and says so."""
    d = pick(REQ, [cand(1, prefill_sec_per_token=None),
                   cand(2, prefill_sec_per_token=0.001)], COST)
    s = by_id(d, 1)
    assert s.prefill == pytest.approx(1.0)
    assert s.fallbacks == ("prefill_sec_per_token=median",)
    assert by_id(d, 2).fallbacks == ()


def test_unknown_prefill_speed_with_none_known_takes_default() -> None:
    """With no candidate knowing its prefill speed, the documented 5 ms/token default is used
    (never 0), and a configured default replaces it."""
    cands = [cand(1, prefill_sec_per_token=None), cand(2, prefill_sec_per_token=None)]
    for s in score(REQ, cands, COST):
        assert s.prefill == pytest.approx(5.0)
        assert s.fallbacks == ("prefill_sec_per_token=default",)
    (s,) = score(REQ, cands[:1], PolicyConfig(prefill_sec_per_token_default=0.01))
    assert s.prefill == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("known", "median"),
    [([0.001, 0.003, 0.009], 0.003), ([0.001, 0.003], 0.002), ([0.004], 0.004)],
    ids=["odd", "even", "one"],
)
def test_fleet_median_over_candidates_that_know(known: list[float], median: float) -> None:
    """The fleet median is taken over the candidates that know the value only (an odd count
    takes the middle one, an even count the mean of the middle two)."""
    cands = [cand(i, prefill_sec_per_token=v) for i, v in enumerate(known)]
    cands.append(cand(99, prefill_sec_per_token=None))
    s = score(REQ, cands, COST)[-1]
    assert s.prefill == pytest.approx(1000 * median)


def test_unknown_load_time_takes_median_then_default() -> None:
    """An unknown load time falls back to the median of the learned load times (warm targets'
    included), then to the 10 s default."""
    cold = cand(1, warm=False, load_sec=None)
    s = score(REQ, [cold, cand(2, load_sec=3.0)], COST)[0]
    assert s.load == pytest.approx(3.0)
    assert s.fallbacks == ("load_sec=median",)
    s = score(REQ, [cold, cand(2, load_sec=None)], COST)[0]
    assert s.load == pytest.approx(10.0)
    assert s.fallbacks == ("load_sec=default",)


def test_unknown_service_time_takes_median_then_default() -> None:
    """An unknown service time, needed only when the target is saturated, falls back to the
    median of the known ones, then to the 5 s default."""
    busy = cand(1, capacity=1, free_slots=0, service_sec=None)
    s = score(REQ, [busy, cand(2, service_sec=2.0)], COST)[0]
    assert s.wait == pytest.approx(2.0)
    assert s.fallbacks == ("service_sec=median",)
    s = score(REQ, [busy], COST)[0]
    assert s.wait == pytest.approx(5.0)
    assert s.fallbacks == ("service_sec=default",)


def test_fallbacks_list_only_the_inputs_used() -> None:
    """An idle warm target needs no service or load time, so their being unknown is not a
    fallback; nor is an unknown KV usage without a prefix match."""
    (s,) = score(REQ, [cand(1, service_sec=None, load_sec=None, kv_usage=None)], COST)
    assert s.fallbacks == ()


def test_unknown_memory_headroom_is_feasible_but_said() -> None:
    """A cold load with unknown memory headroom is taken as feasible, and both the score and
    the reason say it was assumed."""
    d = pick(REQ, [cand(1, warm=False, fits_if_cold=None)], COST)
    assert d.target_id == 1
    assert d.scores[0].fallbacks == (FITS_IF_COLD_UNKNOWN,)
    assert d.reason.endswith("assumed fits_if_cold=unknown")


def test_all_unknown_is_never_zero() -> None:
    """A saturated cold candidate that knows none of its estimates still gets a positive wait,
    load and prefill from the defaults: a missing signal never becomes 0."""
    c = cand(1, warm=False, free_slots=0, prefill_sec_per_token=None, load_sec=None,
             service_sec=None, fits_if_cold=None, kv_usage=None)
    (s,) = score(REQ, [c], COST)
    assert s.wait == pytest.approx(1 / 4 * 5.0)
    assert s.load == pytest.approx(10.0)
    assert s.prefill == pytest.approx(5.0)
    assert set(s.fallbacks) == {"service_sec=default", "load_sec=default",
                                "prefill_sec_per_token=default", FITS_IF_COLD_UNKNOWN}


# --- ties ----------------------------------------------------------------------------------


def test_tie_within_window_goes_to_lower_utilization() -> None:
    """Costs within 1 ms tie, and the tie goes to the less utilized target even though its
    estimate is 0.5 ms higher; the reason says how the tie was broken."""
    cands = [cand(1, free_slots=3), cand(2, prefill_sec_per_token=0.0020005)]
    d = pick(REQ, cands, ABSOLUTE)
    assert d.target_id == 2
    assert "tie within 1ms broken by utilization" in d.reason


def test_estimates_within_a_tenth_of_the_lowest_tie() -> None:
    """With the default share, estimates within 10 % of the lowest tie as well (learned
    speeds are noisy to about that): the less utilized target wins 5 % above the best, the
    cheaper one 15 % below; the reason names the window used."""
    five = [cand(1, free_slots=3), cand(2, prefill_sec_per_token=0.0021)]
    d = pick(REQ, five, COST)
    assert d.target_id == 2 and "broken by utilization" in d.reason
    assert "tie within 1ms" not in d.reason
    fifteen = [cand(1, free_slots=3), cand(2, prefill_sec_per_token=0.0023)]
    assert pick(REQ, fifteen, COST).target_id == 1
    assert pick(REQ, five, ABSOLUTE).target_id == 1


def test_outside_window_lower_cost_wins() -> None:
    """1.5 ms apart is not a tie: the cheaper target wins despite higher utilization, and a
    zero window makes only exact equality a tie."""
    cands = [cand(1, free_slots=3), cand(2, prefill_sec_per_token=0.0020015)]
    assert pick(REQ, cands, ABSOLUTE).target_id == 1
    cands = [cand(1, free_slots=3), cand(2, prefill_sec_per_token=0.0020005)]
    assert pick(REQ, cands, PolicyConfig(tie_window_sec=0.0,
                                         tie_window_share=0.0)).target_id == 1


def test_a_tie_between_loads_goes_to_the_cheaper_eviction() -> None:
    """Two cold loads within the window at the same utilization: the one whose victims cost
    less to reload wins for every seed (not the seed), and the reason says so; least-load
    reads no price (its seed decides)."""
    cands = [cand(1, warm=False, reload_sec=3.6, victims=("mid",)),
             cand(2, warm=False, reload_sec=3.3, victims=("tail",))]
    decisions = [pick(RouteReq(prompt_tokens=1000, seed=seed), cands, COST)
                 for seed in range(32)]
    assert {d.target_id for d in decisions} == {2}
    assert all("broken by eviction price" in d.reason for d in decisions)
    least = {pick(RouteReq(prompt_tokens=1000, seed=seed), cands, LEAST).target_id
             for seed in range(32)}
    assert least == {1, 2}


@pytest.mark.parametrize("cfg", [COST, LEAST], ids=["cost", "least-load"])
def test_exact_tie_broken_by_seed(cfg: PolicyConfig) -> None:
    """Among identical candidates the seed decides: the same seed always picks the same target
    (whatever the candidate order), and different seeds spread requests over the targets so
    identical requests don't herd."""
    cands = [cand(i) for i in range(16)]
    picks = []
    for seed in range(64):
        req = RouteReq(prompt_tokens=1000, seed=seed)
        d = pick(req, cands, cfg)
        assert pick(req, cands, cfg).target_id == d.target_id
        assert pick(req, cands[::-1], cfg).target_id == d.target_id
        assert "broken by seed" in d.reason
        picks.append(d.target_id)
    assert len(set(picks)) >= 8
    assert picks[0] != picks[1] or picks[1] != picks[2]


def test_seed_is_taken_modulo_64_bits() -> None:
    """Seeds are uint64: a negative or oversized seed is reduced, not an error."""
    cands = [cand(1), cand(2)]
    assert pick(RouteReq(1000, -1), cands, COST).target_id in (1, 2)
    assert pick(RouteReq(1000, 1 << 70), cands, COST).target_id in (1, 2)


# --- least-load ----------------------------------------------------------------------------

LEAST_TABLE = [
    pytest.param([cand(1, free_slots=2), cand(2, warm=False)], 2, "least_loaded", False,
                 id="lowest-utilization-even-cold"),
    pytest.param([cand(1, matched_tokens=900, free_slots=3), cand(2)], 2, "least_loaded",
                 False, id="ignores-cache"),
    pytest.param([cand(1, queue_ahead=2), cand(2, free_slots=3)], 2, "least_loaded", False,
                 id="queue-counts-in-utilization"),
    pytest.param([cand(1, free_slots=0), cand(2, warm=False, fits_if_cold=False)],
                 1, "only_choice", True, id="never-infeasible-cold"),
    pytest.param(
        [cand(1, capacity=2, free_slots=0, queue_ahead=1), cand(2, capacity=2, free_slots=0)],
        2, "least_loaded", True, id="enqueue-when-winner-saturated"),
    pytest.param([cand(1)], 1, "only_choice", False, id="only-choice"),
]


@pytest.mark.parametrize(("cands", "target", "why", "enqueue"), LEAST_TABLE)
def test_least_load_branches(cands: list[Candidate], target: int, why: str, enqueue: bool) -> None:
    """least-load picks the lowest utilization ((capacity - free + queue) / capacity) among
    feasible candidates only, whatever the cache or residency, and enqueues exactly when the
    winner has no free slot."""
    d = pick(REQ, cands, LEAST)
    assert (d.target_id, d.why, d.enqueue) == (target, why, enqueue)


def test_least_load_still_reports_cost_scores() -> None:
    """least-load's decision carries the same per-candidate scores as cost's."""
    cands = [cand(1, free_slots=2), cand(2, warm=False)]
    assert least_load(REQ, cands, LEAST).scores == cost(REQ, cands, COST).scores


# --- API -----------------------------------------------------------------------------------


def test_pick_dispatches_on_the_configured_policy() -> None:
    """pick runs the policy named in the config."""
    cands = [cand(1, free_slots=2), cand(2, warm=False)]
    assert pick(REQ, cands, COST) == cost(REQ, cands, COST)
    assert pick(REQ, cands, LEAST) == least_load(REQ, cands, LEAST)
    assert {"cost", "least-load"} <= set(policy.POLICIES)


def test_decision_scores_follow_candidate_order() -> None:
    """Decision.scores are Score values, one per candidate in the candidates' order, equal to
    what score() computes, built from the cheap tuples the hot path keeps."""
    cands = [cand(3, warm=False), cand(1), cand(2, free_slots=0)]
    d = pick(REQ, cands, COST)
    assert [s.target_id for s in d.scores] == [3, 1, 2]
    assert d.scores == score(REQ, cands, COST)
    assert all(isinstance(s, Score) for s in d.scores)
    assert [Score(*t) for t in d.score_terms] == list(d.scores)


@pytest.mark.parametrize(
    "changes",
    [
        {"name": "fastest"},
        {"prefill_sec_per_token_default": 0.0},
        {"load_sec_default": -1.0},
        {"service_sec_default": 0.0},
        {"tie_window_sec": -0.001},
        {"kv_pressure_threshold": 1.5},
    ],
    ids=["name", "prefill", "load", "service", "window", "kv"],
)
def test_config_rejects_bad_values(changes: dict[str, Any]) -> None:
    """A policy config with an unknown policy, a zero or negative default (a missing signal
    must never become 0), a negative tie window or a KV threshold outside 0..1 is an error."""
    with pytest.raises(ValueError):
        PolicyConfig(**cast(Any, changes))


def test_capacity_below_one_is_an_error() -> None:
    """Capacity is resolved by the scheduler to at least 1; anything less is a bug, raised
    rather than divided by."""
    with pytest.raises(ValueError, match="capacity 0"):
        pick(REQ, [cand(1, capacity=0)], COST)


def test_value_types_are_frozen() -> None:
    """Inputs and outputs are immutable values."""
    d = pick(REQ, [cand(1)], COST)
    with pytest.raises(AttributeError):
        d.target_id = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        d.scores[0].wait = 1.0  # type: ignore[misc]


# --- purity --------------------------------------------------------------------------------

ALLOWED_IMPORTS = {"__future__", "collections.abc", "dataclasses", "math", "typing"}
#: The module's source (``policy.__file__`` is the extension when it was compiled: mypyc,
#: ``pharos.compiled``).
SOURCE = Path(policy.__file__).with_name("policy.py")


def test_policy_imports_only_pure_stdlib() -> None:
    """pharos/policy.py imports nothing from Pharos and nothing that does I/O, reads a clock,
    logs or draws randomness: only the modules listed here."""
    tree = ast.parse(SOURCE.read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import"
            imported.add(node.module or "")
    assert imported <= ALLOWED_IMPORTS


def test_importing_policy_loads_no_other_pharos_module() -> None:
    """In a fresh interpreter, importing pharos.policy after the bare package adds no other
    pharos module and nothing from Twisted."""
    code = (
        "import sys, pharos\n"
        "before = set(sys.modules)\n"
        "import pharos.policy\n"
        "print('\\n'.join(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(policy.__file__).parent.parent)
    added = set(out.stdout.split())
    assert {m for m in added if m.startswith("pharos")} == {"pharos.policy"}
    assert not {m for m in added if m.split(".")[0] in {"twisted", "logging", "time", "random"}}


# --- properties ----------------------------------------------------------------------------


def _opt(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


candidates = st.builds(
    Candidate,
    target_id=st.integers(0, 1000),
    warm=_opt(st.booleans()),
    capacity=st.integers(1, 8),
    free_slots=st.integers(-2, 8),
    queue_ahead=st.integers(0, 10),
    kv_usage=_opt(st.floats(0.0, 1.0)),
    matched_tokens=st.integers(0, 6000),
    prefill_sec_per_token=_opt(st.floats(1e-4, 0.05)),
    load_sec=_opt(st.floats(0.1, 60.0)),
    service_sec=_opt(st.floats(0.1, 60.0)),
    fits_if_cold=_opt(st.booleans()),
    loading=st.booleans(),
    inflight=st.integers(0, 8),
)
fleets = st.lists(candidates, max_size=8, unique_by=lambda c: c.target_id)
requests = st.builds(RouteReq, prompt_tokens=st.integers(0, 5000),
                     seed=st.integers(0, (1 << 64) - 1))
configs = st.builds(PolicyConfig, tie_window_sec=st.sampled_from([0.0, 0.001, 0.5]))


@given(requests, fleets, configs)
def test_cost_picks_a_minimum_feasible_estimate(
    req: RouteReq, cands: list[Candidate], cfg: PolicyConfig
) -> None:
    """Whatever the fleet, cost's target has the minimum est_ttft up to the tie window, is
    never set aside, and is enqueued exactly when it has no free slot; with nothing feasible
    there is no target."""
    d = cost(req, cands, cfg)
    feasible = [s for s in d.scores if s.feasible]
    if not feasible:
        assert d.target_id is None and d.why is None
        assert d.enqueue == bool(cands)
        return
    best = min(s.est_ttft for s in feasible if s.est_ttft is not None)
    chosen = by_id(d, cast(int, d.target_id))
    assert chosen.feasible and chosen.est_ttft is not None
    assert chosen.est_ttft <= best + max(cfg.tie_window_sec, best * cfg.tie_window_share)
    (c,) = [c for c in cands if c.target_id == d.target_id]
    assert d.enqueue == (c.free_slots <= 0)
    assert d.why in ("only_choice", "least_loaded", "cache", "warm")
    assert (d.why == "only_choice") == (len(feasible) == 1)


@given(requests, fleets)
def test_least_load_picks_a_minimum_feasible_utilization(
    req: RouteReq, cands: list[Candidate]
) -> None:
    """Whatever the fleet, least-load's target has the lowest utilization among feasible
    candidates and is never set aside."""
    d = least_load(req, cands, LEAST)
    feasible = [s for s in d.scores if s.feasible]
    if not feasible:
        assert d.target_id is None
        return
    chosen = by_id(d, cast(int, d.target_id))
    assert chosen.feasible
    assert chosen.utilization == min(s.utilization for s in feasible)


@given(requests, fleets, st.sampled_from([COST, LEAST]))
def test_decision_does_not_depend_on_candidate_order(
    req: RouteReq, cands: list[Candidate], cfg: PolicyConfig
) -> None:
    """The same request over the same fleet in any order gets the same target, queueing and
    outcome: medians, ties and the seeded choice are all order-free."""
    d = pick(req, cands, cfg)
    r = pick(req, cands[::-1], cfg)
    assert (r.target_id, r.enqueue, r.why) == (d.target_id, d.enqueue, d.why)


@given(requests, fleets)
def test_needed_terms_are_never_zero(req: RouteReq, cands: list[Candidate]) -> None:
    """Every term a candidate needs is positive, known or not: prefill when tokens are
    uncached, wait when saturated, load when cold and not loading."""
    for c, s in zip(cands, score(req, cands, COST), strict=True):
        assert (s.prefill > 0) == (req.prompt_tokens > c.matched_tokens)
        assert (s.wait > 0) == (c.free_slots <= 0)
        assert (s.load > 0) == (c.warm is False and not c.loading)


# --- terms built when read ------------------------------------------------------------------

#: Strategies for the ``Candidate`` fields whose range matters; any other field is varied by
#: its type (``BY_TYPE``), so a field added later is varied here without editing this test.
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "target_id": st.integers(0, 1000),
    "capacity": st.integers(1, 8),
    "free_slots": st.integers(-2, 8),
    "queue_ahead": st.integers(0, 10),
    "kv_usage": _opt(st.sampled_from([0.0, 0.5, 0.9, 0.95, 1.0]) | st.floats(0.0, 1.0)),
    "matched_tokens": st.integers(-5, 6000),
    "prefill_sec_per_token": _opt(st.floats(1e-4, 0.05)),
    "inflight": st.integers(0, 8),
    "victims": st.lists(st.sampled_from(["a", "b"]), max_size=2).map(tuple),
    "load_basis": _opt(st.sampled_from(["load_sec=size/host", "load_sec=size/default"])),
    "held": _opt(st.sampled_from(["queued for a warm slot", "swap held"])),
    "prefill_model": _opt(st.tuples(st.floats(0.0, 0.01), st.floats(0.0, 1e-7),
                                    st.floats(0.0, 0.05))),
}
BY_TYPE: dict[str, st.SearchStrategy[Any]] = {
    "int": st.integers(0, 10_000),
    "float": st.floats(0.0, 60.0),
    "bool": st.booleans(),
    "int | None": _opt(st.integers(0, 10_000)),
    "float | None": _opt(st.floats(0.1, 60.0)),
    "bool | None": _opt(st.booleans()),
}
#: Each Candidate field's type as the source spells it (a compiled Candidate's fields carry
#: the types mypyc resolved, not the annotations' text).
SOURCE_TYPES = {node.target.id: ast.unparse(node.annotation)
                for cls in ast.parse(SOURCE.read_text()).body
                if isinstance(cls, ast.ClassDef) and cls.name == "Candidate"
                for node in cls.body
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
EVERY_FIELD = {f.name: FIELDS[f.name] if f.name in FIELDS else BY_TYPE.get(SOURCE_TYPES[f.name])
               for f in dataclasses.fields(Candidate)}
every_field_fleets = st.lists(
    st.builds(Candidate, **{k: v for k, v in EVERY_FIELD.items() if v is not None}),
    max_size=10, unique_by=lambda c: c.target_id)
guard_configs = st.builds(
    PolicyConfig, name=st.sampled_from(["cost", "least-load"]),
    kv_pressure_threshold=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
    bounded_load_epsilon=st.sampled_from([None, 0.0, 1.0]))


def test_every_candidate_field_is_varied() -> None:
    """The full-terms property below varies every Candidate field (by its type when FIELDS
    does not name it), so a new input priced in one of the two estimates and not the other
    makes it fail."""
    assert [name for name, strategy in EVERY_FIELD.items() if strategy is None] == []


@given(requests, every_field_fleets)
def test_bounded_load_spares_a_target_running_a_few(
    req: RouteReq, cands: list[Candidate]
) -> None:
    """Bounded load never sets aside a target running fewer than BOUNDED_LOAD_MIN_INFLIGHT
    of Pharos's requests or half its slots (whichever is less), whatever the fleet; and any
    target it sets aside is at or past the bound."""
    scored = policy._select(req, cands, COST)
    for c, t in zip(cands, scored.all_terms(), strict=True):
        if t[8] == SET_ASIDE_BOUNDED_LOAD:
            assert c.inflight >= min(BOUNDED_LOAD_MIN_INFLIGHT, (c.capacity + 1) // 2)
            assert c.inflight >= scored.fleet.bound


@given(requests, every_field_fleets, guard_configs)
def test_selection_estimates_equal_the_full_terms(
    req: RouteReq, cands: list[Candidate], cfg: PolicyConfig
) -> None:
    """What a pick selects on (each candidate's est_ttft under cost, its utilization, which
    candidates are set aside and why, computed in the hot loop without the other terms) is
    exactly what the full terms built on reading say, whatever the fleet, guards and policy."""
    scored = policy._select(req, cands, cfg)
    terms = scored.all_terms()
    assert [t[0] for t in terms] == [c.target_id for c in cands]
    assert scored.feasible == [i for i, t in enumerate(terms) if t[8] is None]
    assert scored.util == [t[6] for t in terms]
    aside: dict[str, int] = {}
    for t in terms:
        if t[8] is not None:
            aside[t[8]] = aside.get(t[8], 0) + 1
    assert scored.aside == aside
    if cfg.name == "cost":
        assert scored.est == [t[1] for t in terms]
        assert scored.best == min((e for e in scored.est if e is not None), default=math.inf)


@pytest.mark.parametrize("cfg", [COST, LEAST], ids=["cost", "least-load"])
def test_target_terms_are_the_winners_terms(cfg: PolicyConfig) -> None:
    """Decision.target_terms (what the scheduler reads for the lease) is the winner's entry of
    the full terms, read without building the other candidates' first; None without a
    target."""
    cands = [cand(1, warm=False), cand(2, matched_tokens=600, prefill_sec_per_token=None),
             cand(3, free_slots=0)]
    d = pick(REQ, cands, cfg)
    winner = d.target_terms
    assert winner is not None and winner[0] == d.target_id
    (entry,) = [t for t in d.score_terms if t[0] == d.target_id]
    assert winner == entry
    assert pick(REQ, [cand(1, warm=False, fits_if_cold=False)], cfg).target_terms is None
    assert pick(REQ, [], cfg).target_terms is None


@given(requests, every_field_fleets, guard_configs)
def test_explanation_is_built_when_read(
    req: RouteReq, cands: list[Candidate], cfg: PolicyConfig
) -> None:
    """A pick builds no reason, outcome or guards (what people read) until one is read, nor
    does reading the winner's terms (what the scheduler reads); once built, it is the same
    explanation a fresh pick gives, whichever is read first."""
    d = pick(req, cands, cfg)
    _ = d.target_terms  # what the scheduler reads
    assert d._scored._explained is None
    fresh = pick(req, cands, cfg)
    assert (fresh.guards, fresh.why, fresh.reason) == (d.guards, d.why, d.reason)
    assert d._scored._explained is not None


def test_decisions_compare_by_their_terms() -> None:
    """Decisions stay plain values though their terms are built when read: equal decisions
    hash alike, and two that differ only in a set-aside candidate's load time (same target,
    same reason) are not equal."""
    cands = [cand(1), cand(2, warm=False, fits_if_cold=False, load_sec=5.0)]
    d = pick(REQ, cands, COST)
    assert d == pick(REQ, cands, COST) and hash(d) == hash(pick(REQ, cands, COST))
    other = pick(REQ, [cands[0], cand(2, warm=False, fits_if_cold=False, load_sec=6.0)], COST)
    assert (other.target_id, other.reason) == (d.target_id, d.reason)
    assert other != d
