"""Layer 1: placement on multi-model hosts (issue 15): load times learned from the engine, from
a cold dispatch's TTFT, and from model sizes; the eviction price of a cold load and its
victims, in the scheduler's decisions; the replica rule (a warm model queues for its slot
until its demand needs another host, within a wait bound) and bad input (a failed load, a
model of unknown size, a model appearing mid-run)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from twisted.internet.task import Clock

from pharos.config import Backend as BackendSpec
from pharos.placement import (
    LOAD_BYTES_PER_SEC_DEFAULT,
    SLOT_DEMAND_HALF_LIFE_SEC,
    LoadRates,
    ModelDemand,
    ReplicaRule,
    Resident,
    drain_hold,
    horizon,
    reload_price,
    replica_hold,
    swap_hold,
    victims,
)
from pharos.policy import RouteReq, score
from pharos.proxy.unload import pinned_models
from pharos.sched import Guards, SchedRequest, Scheduler
from pharos.state.registry import Target
from pharos.state.state import State
from pharos.state.stats import Sample, TargetStats, learn, load_sample
from tests.support.sched import GB, fleet, granted, ollama, req

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def cold(**kw: object) -> Sample:
    base: dict[str, object] = {"ok": True, "dispatched_cold": True, "ttft_sec": 5.0,
                               "duration_sec": 6.0}
    return Sample(**{**base, **kw})  # type: ignore[arg-type]


# --- item 3: load times learned well ---------------------------------------------------------

def test_the_engines_own_load_time_is_taken_as_is() -> None:
    """Ollama's load_duration (native API) is the load; one under 10 ms loaded nothing, and a
    warm dispatch or a failed one measures no load."""
    stats = TargetStats()
    assert load_sample(stats, cold(load_sec=3.0)) == 3.0
    assert load_sample(stats, cold(load_sec=0.001)) is None
    assert load_sample(stats, cold(dispatched_cold=False, load_sec=3.0)) is None
    assert load_sample(stats, cold(ok=False)) is None
    assert load_sample(stats, cold(control=True)) is None


def test_a_v1_load_is_the_ttft_less_the_queue_and_the_prefill() -> None:
    """On /v1 (no load_duration) the load is the time to first byte less the prefills ahead
    of it (the prefill window) and its own prefill: the engine's prompt eval time, else its
    uncached tokens at the learned speed, else nothing (over-counted, never under)."""
    stats = TargetStats()
    # Nothing known of the prefill: the window (shorter than the TTFT) is the load.
    assert load_sample(stats, cold(prefill_window_sec=4.0)) == 4.0
    stats.prefill_sec_per_token.add(0.001)
    s = cold(prefill_window_sec=4.0, prompt_tokens=1000, cached_tokens=200)
    assert load_sample(stats, s) == pytest.approx(4.0 - 0.8)
    s = cold(prefill_window_sec=4.0, prompt_tokens=1000, cached_tokens=0, prompt_eval_sec=1.0)
    assert load_sample(stats, s) == pytest.approx(3.0)
    # A remainder below the floor is still a load paid.
    assert load_sample(stats, cold(ttft_sec=0.5, prompt_eval_sec=1.0)) == 0.010
    learned = TargetStats()
    learned.prefill_sec_per_token.add(0.001)
    assert learn(learned, cold(prefill_window_sec=4.0, prompt_tokens=1000, cached_tokens=200))
    assert learned.load_sec.value == pytest.approx(3.2)


def test_load_rates_per_host_then_the_fleet_median_then_the_default() -> None:
    """Before a host has loaded anything its loads are estimated from the model's size at
    the median rate of the hosts that have, and before any host has at the documented
    default; an unknown size estimates nothing; nonsense samples teach nothing."""
    rates = LoadRates()
    assert rates.estimate("h1", 4 * GB) == (4 * GB / LOAD_BYTES_PER_SEC_DEFAULT, "default")
    assert rates.estimate("h1", None) is None
    rates.learn("h1", 4 * GB, 2.0)  # 2 GB/s
    rates.learn("h2", 6 * GB, 1.0)  # 6 GB/s
    rates.learn("h2", None, 1.0)
    rates.learn("h2", 4 * GB, 0.0)
    assert rates.estimate("h1", 4 * GB) == (2.0, "host")
    assert rates.estimate("h2", 6 * GB) == (1.0, "host")
    fleet_est = rates.estimate("h3", 8 * GB)  # the median: 4 GB/s
    assert fleet_est is not None and fleet_est[1] == "fleet"
    assert fleet_est[0] == pytest.approx(2.0)


def test_a_cold_candidate_is_priced_from_its_size_until_a_load_is_measured() -> None:
    """The scheduler's cold candidates take their load time from the model's size: at the
    default rate first (said in the score's fallbacks), then at the rate a measured load on
    the same host showed, and on another host at the fleet's; a measured load on the target
    itself wins."""
    sizes = {"a": 4 * GB, "b": 8 * GB}
    sched, state, _ = fleet({
        "http://h1:1": (ollama([], sizes), BackendSpec(url="http://h1:1", kind="ollama",
                                                       memory_gb=20, capacity=4)),
        "http://h2:1": (ollama([], sizes), BackendSpec(url="http://h2:1", kind="ollama",
                                                       memory_gb=20, capacity=4)),
    })

    def loads(model: str) -> dict[str, tuple[float | None, str | None]]:
        r = req(model)
        placed = sched.decide(r, sched.targets(r))
        by_id = {t.id: t.backend.url for t in state.targets}
        return {by_id[c.target_id]: (c.load_sec, c.load_basis) for c in placed.candidates}

    assert loads("b") == {"http://h1:1": (16.0, "load_sec=size/default"),
                          "http://h2:1": (16.0, "load_sec=size/default")}
    r = req("b")
    placed = sched.decide(r, sched.targets(r))
    s = score(RouteReq(100, 1), placed.candidates, sched.policy)
    assert all("load_sec=size/default" in x.fallbacks for x in s)
    lease = granted(sched.acquire("k", 1, req("a")))
    assert lease.cold
    lease.release(cold(load_sec=2.0))  # 4 GB in 2 s on this host
    host = lease.target.backend.url
    other = "http://h2:1" if host == "http://h1:1" else "http://h1:1"
    assert loads("b") == {host: (4.0, "load_sec=size/host"), other: (4.0, "load_sec=size/fleet")}


# --- item 1: eviction has a price -----------------------------------------------------------

def test_reload_price_grows_with_the_victims_demand() -> None:
    """Evicting a model nobody asks for costs nothing; a tail model costs at most about one
    reload; a popular one costs its reload plus the wait of those arriving during it."""
    assert reload_price(0.0, 3.0) == 0.0
    assert reload_price(0.5, 0.0) == 0.0
    tail = reload_price(0.001, 3.0, horizon=300.0)
    popular = reload_price(0.5, 3.0, horizon=300.0)
    assert 0 < tail < 3.0 * (1 - math.exp(-0.3)) + 0.01
    assert popular == pytest.approx(3.0 + 0.5 * 9 / 2, rel=1e-6)
    assert reload_price(0.01, 3.0, horizon=30.0) < reload_price(0.01, 3.0, horizon=300.0)
    assert horizon(300.0) == 60.0 and horizon(20.0) == 20.0  # capped at the half-life


def test_demand_decays_with_its_half_life() -> None:
    """A model's request rate halves over each half-life without requests."""
    demand = ModelDemand(half_life=60.0)
    for i in range(10):
        demand.add("p", float(i))
    now = demand.rate("p", 9.0)
    assert demand.rate("p", 69.0) == pytest.approx(now / 2)
    assert demand.rate("never", 9.0) == 0.0


def test_victims_are_the_least_recently_used_idle_models() -> None:
    """A load that fits beside the loaded models evicts nothing; otherwise idle models go,
    least recently used first, until it fits; a busy one never; not enough idle ones: None."""
    r = [Resident("old", 4 * GB, True, 1.0), Resident("new", 4 * GB, True, 5.0),
         Resident("busy", 4 * GB, False, 0.0)]
    assert victims(4 * GB, 16 * GB, r) == []
    assert [v.model for v in victims(4 * GB, 12 * GB, r) or []] == ["old"]
    assert [v.model for v in victims(8 * GB, 12 * GB, r) or []] == ["old", "new"]
    assert victims(12 * GB, 12 * GB, r) is None


def test_named_victims_are_the_cheapest_idle_models() -> None:
    """When Pharos names the victims (it unloads them before the load), the idle models go
    cheapest first, the least recently used among equal prices; a busy one never."""
    r = [Resident("pop", 4 * GB, True, 1.0, price=9.0),
         Resident("rare", 4 * GB, True, 5.0, price=0.5),
         Resident("gone", 4 * GB, True, 3.0, price=0.5),
         Resident("busy", 4 * GB, False, 0.0, price=0.0)]
    assert [v.model for v in victims(4 * GB, 16 * GB, r, named=True) or []] == ["gone"]
    assert [v.model for v in victims(8 * GB, 16 * GB, r, named=True) or []] == ["gone", "rare"]
    assert [v.model for v in victims(4 * GB, 16 * GB, r) or []] == ["pop"]  # the host's LRU
    assert victims(16 * GB, 16 * GB, r, named=True) is None


def test_an_ollama_hosts_cold_load_unloads_its_cheapest_idle_model_first() -> None:
    """A full Ollama host with an idle popular model (never released here: least recently
    used) and an idle rare one used just now: a third model's load is priced against the
    rare one and its lease asks the host to unload it (``Lease.unload``, as the host names
    it); the host left to itself would choose by its own order, not by demand."""
    sizes = {"a": 4 * GB, "b": 4 * GB, "c": 4 * GB}
    sched, state, clock = fleet({"http://h1:1": (ollama(["a", "b"], sizes), BackendSpec(
        url="http://h1:1", kind="ollama", memory_gb=8, capacity=2))})
    for _ in range(30):
        sched.hosts.demand.add("a", clock.seconds())
    granted(sched.acquire("k", 1, req("b"))).release()
    lease = granted(sched.acquire("k", 1, req("c")))
    assert lease.cold
    won = next(c for c in lease.decision.candidates if c.target_id == lease.target.id)
    assert won.victims == ("b",)
    assert lease.unload == ("b",)
    assert "evicts b (reload" in lease.decision.reason
    lease.release()
    warm = granted(sched.acquire("k", 1, req("a", seed=2)))  # warm: nothing to unload
    assert not warm.cold and warm.unload == ()


def test_models_loaded_for_good_are_read_from_api_ps() -> None:
    """``/api/ps`` as Ollama 0.33.3 serves it (the fixture: both models expire within
    minutes) pins nothing; an entry expiring in 2318 (``keep_alive: -1``) is pinned; an
    unreadable body or entry pins nothing."""
    captured = (FIXTURES / "ollama/0.33.3/loaded/api_ps").read_bytes()
    assert pinned_models(captured, 2126) == frozenset()
    doc = json.loads(captured)
    doc["models"][1]["expires_at"] = "2318-03-18T02:43:13.884519512-07:00"
    assert pinned_models(json.dumps(doc).encode(), 2126) == {"qwen3:8b"}
    assert pinned_models(b"not json", 2126) == frozenset()
    assert pinned_models(b'{"models":[{"name":"x","expires_at":"soon"},7]}', 2126) == set()


def two_hosts() -> tuple[Scheduler, State, Clock]:
    sizes = {"pop": 6 * GB, "tail": 6 * GB, "new": 6 * GB}
    return fleet({
        "http://h1:1": (ollama(["pop"], sizes), BackendSpec(url="http://h1:1", kind="ollama",
                                                            memory_gb=10, capacity=2)),
        "http://h2:1": (ollama(["tail"], sizes), BackendSpec(url="http://h2:1", kind="ollama",
                                                             memory_gb=10, capacity=2)),
    })


def test_a_cold_load_evicts_the_model_whose_reload_costs_least() -> None:
    """Two hosts each full with one idle model, a popular one and a tail one: a third model
    loads where it evicts the tail model, and the reason names the victim and its price."""
    sched, state, clock = two_hosts()
    for _ in range(30):
        sched.hosts.demand.add("pop", clock.seconds())
    sched.hosts.demand.add("tail", clock.seconds() - 600)
    for seed in range(1, 21):  # whatever the seed breaking ties
        r = req("new", seed=seed)
        placed = sched.decide(r, sched.targets(r))
        by_id = {t.id: t.backend.url for t in state.targets}
        prices = {by_id[c.target_id]: (c.victims, c.reload_sec) for c in placed.candidates}
        assert prices["http://h1:1"][0] == ("pop",)
        assert prices["http://h2:1"][0] == ("tail",)
        assert prices["http://h1:1"][1] > 3 * prices["http://h2:1"][1]
        winner = placed.decision.target_id
        assert winner is not None and by_id[winner] == "http://h2:1"
        assert "evicts tail (reload" in placed.decision.reason
        reload = {by_id[s.target_id]: s.reload for s in placed.decision.scores}
        assert reload["http://h1:1"] == prices["http://h1:1"][1] > 0


def test_a_tie_between_two_loads_evicts_the_less_demanded_model() -> None:
    """Two full hosts, a middle model idle on one and a tail model (half its demand) on the
    other: their reload prices differ by less than the cost policy's tie window, and a third
    model's load evicts the tail one whatever the seed (the seed chose before, and the middle
    models were pushed out as often as the tail: ``pharos bench placement``, 2 hosts)."""
    sizes = {"mid": 6 * GB, "tail": 6 * GB, "new": 6 * GB}
    sched, state, clock = fleet({
        "http://h1:1": (ollama(["mid"], sizes), BackendSpec(url="http://h1:1", kind="ollama",
                                                            memory_gb=10, capacity=2)),
        "http://h2:1": (ollama(["tail"], sizes), BackendSpec(url="http://h2:1", kind="ollama",
                                                             memory_gb=10, capacity=2)),
    })
    for t in state.targets:
        t.stats.load_sec.add(3.0)
    for _ in range(12):
        sched.hosts.demand.add("mid", clock.seconds())
    for _ in range(6):
        sched.hosts.demand.add("tail", clock.seconds())
    by_id = {t.id: t.backend.url for t in state.targets}
    placements = [sched.decide(r, sched.targets(r))
                  for r in (req("new", seed=seed) for seed in range(1, 33))]
    assert {by_id[p.decision.target_id] for p in placements  # type: ignore[index]
            } == {"http://h2:1"}
    for placed in placements:
        prices = {by_id[c.target_id]: c.reload_sec for c in placed.candidates}
        assert prices["http://h1:1"] > prices["http://h2:1"] > 0
        assert "evicts tail (reload" in placed.decision.reason
        assert "tie within" in placed.decision.reason  # the prices are within the window
        assert "broken by eviction price" in placed.decision.reason


def test_no_idle_victim_the_load_waits_as_before() -> None:
    """With the only other model busy on one host, the load goes to the host whose model is
    idle (whatever its price); with both busy, the request waits."""
    sched, state, clock = two_hosts()
    for _ in range(30):
        sched.hosts.demand.add("pop", clock.seconds())
    tail = granted(sched.acquire("k", 1, req("tail")))
    lease = granted(sched.acquire("k", 1, req("new")))
    assert lease.target.backend.url == "http://h1:1"
    assert "evicts pop" in lease.decision.reason
    lease.release()
    pop = granted(sched.acquire("k", 1, req("pop")))
    waiting = sched.acquire("k", 1, req("new", seed=9))
    assert not waiting.called
    for x in (tail, pop):
        x.release()
    assert waiting.called
    waiting.addCallback(lambda lease: lease.release())


def test_a_loads_victim_is_cold_on_its_host_until_the_next_full_round() -> None:
    """A cold load priced as pushing an idle model out of a full host: until the host's next
    full round, a request for that model sees it cold there (the engine unloaded it; the last
    round still lists it), and a full round listing it loaded makes it warm again (found by
    ``pharos bench placement``: requests sent to a victim Pharos took as warm paid loads)."""
    sizes = {"a": 4 * GB, "b": 4 * GB, "c": 4 * GB}
    sched, state, clock = fleet({"http://h1:1": (ollama(["a", "b"], sizes), BackendSpec(
        url="http://h1:1", kind="ollama", memory_gb=8, capacity=2))})
    lease = granted(sched.acquire("k", 1, req("c")))
    assert lease.cold
    won = next(c for c in lease.decision.candidates if c.target_id == lease.target.id)
    assert len(won.victims) == 1
    victim = won.victims[0]
    lease.release()
    target = next(t for t in state.targets if t.model == victim)

    def cold_now() -> bool:
        r = req(victim)
        return sched.decide(r, sched.targets(r)).cold[target.id]

    for _ in range(4):  # rounds that read no residency: still cold
        clock.advance(1.0)
        assert cold_now()
    clock.advance(1.0)  # the next full round still lists a and b loaded (the fake's /api/ps)
    assert not cold_now()


def test_a_loads_victim_is_not_priced_again_as_resident_until_the_next_full_round() -> None:
    """After a load pushed ``a`` out of a full host, the next cold load there is priced
    against what the host holds now (``b`` and the model just loaded), not against the
    round's stale list too: one victim, not ``a`` again (found by ``pharos bench placement``:
    decisions said "evicts model-6+model-0" where model-6 had gone and the engine unloaded
    model-0 alone, a price twice the real one)."""
    sizes = {"a": 4 * GB, "b": 4 * GB, "c": 4 * GB, "d": 4 * GB}
    sched, state, clock = fleet({"http://h1:1": (ollama(["a", "b"], sizes), BackendSpec(
        url="http://h1:1", kind="ollama", memory_gb=8, capacity=2))})
    lease = granted(sched.acquire("k", 1, req("c")))
    assert lease.cold
    (first,) = next(c for c in lease.decision.candidates
                    if c.target_id == lease.target.id).victims
    lease.release()
    r = req("d")
    placed = sched.decide(r, sched.targets(r))
    (d,) = [c for c in placed.candidates if state.targets[c.target_id].model == "d"]
    assert d.warm is False and len(d.victims) == 1, d.victims
    assert first not in d.victims


# --- item 2: replicas follow demand, within a wait bound ------------------------------------

def test_the_replica_rule() -> None:
    """A copy of a warm model is held while its demand fits its warm slots and waiting costs
    less than the load and its eviction; it may load once demand exceeds the slots' share,
    once waiting costs more, once the request has waited the bound, or with the rule off."""
    rule = ReplicaRule(utilization=0.7, wait_bound_sec=30.0)
    held = replica_hold(rule, demand=1.0, warm_slots=2, warm_wait=2.5, load_cost=3.0,
                        waited=0.0)
    assert held is not None and held.startswith("no copy, a warm slot costs less")
    assert "wait 2.5s < load+evict 3.0s" in held and "of 2 warm slots" in held
    assert replica_hold(rule, 1.5, 2, 2.5, 3.0, 0.0) is None  # demand > 2 x 0.7
    assert replica_hold(rule, 1.0, 4, 2.5, 3.0, 0.0) is not None  # 4 slots serve it
    assert replica_hold(rule, 1.0, 2, 3.5, 3.0, 0.0) is None  # waiting costs more
    assert replica_hold(rule, 1.0, 2, 2.5, 3.0, 30.0) is None  # waited the bound
    assert replica_hold(rule, 1.0, 0, 2.5, 3.0, 0.0) is None  # warm nowhere: load
    assert replica_hold(ReplicaRule(utilization=None), 1.0, 2, 2.5, 3.0, 0.0) is None
    with pytest.raises(ValueError):
        ReplicaRule(utilization=0.0)
    with pytest.raises(ValueError):
        ReplicaRule(wait_bound_sec=0.0)


def test_the_swap_and_drain_holds() -> None:
    """A swap waits while the loaded model has requests queued, until the bound; past it only
    for the requests queued before the loaded model came in (its batch); a host drains for a
    model once its oldest request has waited the bound."""
    rule = ReplicaRule(wait_bound_sec=30.0)
    note = swap_hold(rule, "a", 3, 5.0)
    assert note is not None and "3 queued for loaded a first" in note
    assert swap_hold(rule, "a", 0, 5.0) is None
    assert swap_hold(rule, "a", 3, 30.0) is None
    assert swap_hold(rule, "a", 3, 30.0, batch=True) is not None
    assert swap_hold(ReplicaRule(swap_grouping=False), "a", 3, 5.0) is None
    assert drain_hold(rule, "c", 29.0) is None
    assert drain_hold(rule, "c", 31.0) == "held for a swap to c (waited 31.0s >= 30.0s)"


def pop_and_tail() -> tuple[Scheduler, State, Clock]:
    """``pop`` loaded on h1 (2 slots), ``tail`` idle on h2; each host holds one 6 GB model."""
    sizes = {"pop": 6 * GB, "tail": 6 * GB}
    return fleet({
        "http://h1:1": (ollama(["pop"], sizes), BackendSpec(url="http://h1:1", kind="ollama",
                                                            memory_gb=10, capacity=2)),
        "http://h2:1": (ollama(["tail"], sizes), BackendSpec(url="http://h2:1", kind="ollama",
                                                             memory_gb=10, capacity=2)),
    })


def on_h2(state: State, model: str) -> Target:
    return next(t for t in state.targets if t.model == model and t.backend.url == "http://h2:1")


def test_a_warm_model_queues_for_its_slot_until_its_demand_needs_another_host() -> None:
    """``pop`` on a full h1: a copy on h2 costs about what the wait does (within the cost
    policy's tie window, where a cold target won on its lower utilization), so with little
    demand the request queues for h1 and the reason says why; once pop's slot demand exceeds
    h1's slots the copy loads on h2, and a request that waited the bound may load too."""
    sched, state, clock = pop_and_tail()
    on_h2(state, "pop").stats.load_sec.add(3.8)  # vs a 3.5 s wait for a slot on h1
    leases = [granted(sched.acquire("k", 1, req("pop", seed=s))) for s in (1, 2)]
    assert {x.target.backend.url for x in leases} == {"http://h1:1"}
    r = req("pop", seed=3)
    placed = sched.decide(r, sched.targets(r))
    assert placed.decision.enqueue and placed.decision.target_id is not None
    assert state.targets[placed.decision.target_id].backend.url == "http://h1:1"
    assert "queued: no free slot" in placed.decision.reason
    assert "no copy, a warm slot costs less" in placed.decision.reason, placed.decision.reason
    assert "demand" in placed.decision.reason
    held = [s.set_aside for s in placed.decision.scores if s.set_aside is not None]
    assert len(held) == 1 and held[0].startswith("no copy, a warm slot costs less")
    # The same decision with the request past the bound: the copy competes (and wins).
    late = sched.decide(r, sched.targets(r), waited=30.0)
    assert late.decision.target_id == on_h2(state, "pop").id
    # Demand above what h1's slots serve: the copy is allowed now.
    for _ in range(8):
        sched.hosts.slot_demand.add("pop", clock.seconds(), 20.0)
    assert sched.hosts.slot_demand.rate("pop", clock.seconds()) > 2  # h1's 2 slots, all of them
    busy = sched.decide(r, sched.targets(r))
    assert busy.decision.target_id == on_h2(state, "pop").id
    assert not busy.decision.enqueue
    assert "no copy, a warm slot costs less" not in busy.decision.reason
    assert "replica needed: demand" in busy.decision.reason
    for x in leases:
        x.release()


def test_slot_demand_counts_a_requests_wait_for_its_slot() -> None:
    """A model's slot demand counts the requests wanting a slot, not only those holding one:
    a request that waited in Pharos adds its wait to its service time, so a queue that
    persists can show a demand above the slots its hosts serve (the replica rule's test);
    counting service alone, the measure could never exceed the slots already busy."""
    sched, state, clock = pop_and_tail()
    on_h2(state, "pop").stats.load_sec.add(60.0)  # a copy dear: the third request queues
    leases = [granted(sched.acquire("k", 1, req("pop", seed=s))) for s in (1, 2)]
    waiting = sched.acquire("k", 1, req("pop", seed=3))
    assert not waiting.called
    clock.advance(5.0)
    now = clock.seconds()
    before = sched.hosts.slot_demand.rate("pop", now)
    leases[0].release()
    third = granted(waiting)
    assert third.target.backend.url == "http://h1:1"
    service = third.target.stats.service_sec.value or sched.policy.service_sec_default
    tau = SLOT_DEMAND_HALF_LIFE_SEC / math.log(2)
    assert sched.hosts.slot_demand.rate("pop", now) - before == pytest.approx((5.0 + service) / tau)
    for x in (leases[1], third):
        x.release()


def test_without_the_rule_the_tie_loads_a_copy() -> None:
    """The contrast: with ``replica_utilization`` off, the same tie goes to the cold copy."""
    sched, state, _ = pop_and_tail()
    sched.reconfigure(replace(sched.routing,
                                guards=Guards(placement=ReplicaRule(utilization=None))))
    on_h2(state, "pop").stats.load_sec.add(3.8)
    leases = [granted(sched.acquire("k", 1, req("pop", seed=s))) for s in (1, 2)]
    r = req("pop", seed=3)
    assert sched.decide(r, sched.targets(r)).decision.target_id == on_h2(state, "pop").id
    for x in leases:
        x.release()


# --- bad input --------------------------------------------------------------------------------

def test_a_failed_load_is_not_retried_on_that_host_until_the_next_full_round() -> None:
    """A cold dispatch that fails marks its host: the next request for the model is not
    loaded there (set aside, said in the reason) until the host's next full round."""
    sched, state, clock = pop_and_tail()
    cold_lease = granted(sched.acquire("k", 1, SchedRequest(
        "pop", 100, 5, exclude=frozenset({t.id for t in state.targets
                                          if t.backend.url == "http://h1:1"}))))
    assert cold_lease.cold and cold_lease.target.backend.url == "http://h2:1"
    cold_lease.release(cold(ok=False))
    full_round = cold_lease.target.backend.full_round
    r = SchedRequest("pop", 100, 6, exclude=frozenset(
        {t.id for t in state.targets if t.backend.url == "http://h1:1"}))
    placed = sched.decide(r, sched.targets(r))
    assert placed.decision.target_id is None
    assert "load failed here this round" in placed.decision.reason
    while cold_lease.target.backend.full_round == full_round:
        clock.advance(1.0)
    again = sched.decide(r, sched.targets(r))
    assert again.decision.target_id == on_h2(state, "pop").id


def test_a_model_of_unknown_size_loads_at_the_fleet_median_size() -> None:
    """A model ``/api/tags`` lists without a size is taken at the median size of the others:
    its load is estimated from it (the basis says so) and it is checked to fit."""
    backend = ollama([], {"a": 4 * GB, "b": 6 * GB, "c": 8 * GB})
    body = backend.answers["/api/tags"]
    assert isinstance(body, tuple)
    backend.answers["/api/tags"] = (200, body[1].replace(b',"size":8000000000', b""))
    sched, state, _ = fleet({"http://h1:1": (backend, BackendSpec(
        url="http://h1:1", kind="ollama", memory_gb=20, capacity=2))})
    r = req("c")
    (c,) = sched.decide(r, sched.targets(r)).candidates
    assert state.view(state.targets[c.target_id]).size_bytes is None
    assert sched.hosts.median_size() == 6 * GB
    assert c.load_sec == pytest.approx(6 * GB / LOAD_BYTES_PER_SEC_DEFAULT)
    assert c.load_basis == "load_sec=size/default (size=fleet median)"
    assert c.fits_if_cold is True


def test_a_model_that_appears_mid_run_is_served() -> None:
    """A model pulled onto a host while Pharos runs is listed from the host's next full
    round and served; the models there before keep being served."""
    backend = ollama(["a"], {"a": 4 * GB})
    sched, state, clock = fleet({"http://h1:1": (backend, BackendSpec(
        url="http://h1:1", kind="ollama", memory_gb=20, capacity=2))})
    granted(sched.acquire("k", 1, req("a"))).release()
    fresh = ollama(["a"], {"a": 4 * GB, "new": 4 * GB})
    backend.answers.update(fresh.answers)
    for _ in range(12):
        clock.advance(0.5)
    lease = granted(sched.acquire("k", 1, req("new")))
    assert lease.cold and lease.target.model == "new"
    lease.release()
    granted(sched.acquire("k", 1, req("a"))).release()


def test_doctor_says_what_placement_does_with_memory_gb() -> None:
    """``pharos doctor`` notes a host without ``memory_gb``: residency only, no fit check
    (and llama-swap: one model at a time); with it, loads are checked and priced."""
    from pharos.engine.doctor import BackendReport, _memory_note
    from pharos.engine.signals import Residency, Snapshot

    ollama_report = BackendReport("http://h:1", kind="ollama",
                                  snapshot=Snapshot(residency={"a": Residency.LOADED}))
    assert "residency only" in _memory_note(ollama_report, None)
    assert "no fit check" in _memory_note(ollama_report, None)
    assert _memory_note(ollama_report, 24.0).startswith("memory_gb: 24 in config")
    swap = BackendReport("http://h:2", kind="llama-swap")
    assert "one model at a time" in _memory_note(swap, None)
    assert "no residency" in _memory_note(BackendReport("http://h:3", kind="vllm"), None)


def test_the_rules_parameters_in_config() -> None:
    """``routing.replica_utilization``, ``load_wait_bound`` and ``swap_grouping`` reach the
    scheduler's rule; out of range or unknown, the error names the field."""
    from pharos.config import ConfigError, parse_config
    from pharos.service import guards_of

    cfg = parse_config("routing:\n  replica_utilization: 0.5\n  load_wait_bound: 1m\n"
                       "  swap_grouping: false\n")
    assert guards_of(cfg).placement == ReplicaRule(0.5, 60.0, False)
    off = parse_config("routing:\n  replica_utilization: null\n")
    assert guards_of(off).placement.utilization is None
    assert guards_of(parse_config("listen: 127.0.0.1:1\n")).placement == ReplicaRule()
    for bad, field in (("replica_utilization: 1.5", "routing.replica_utilization"),
                       ("load_wait_bound: 0s", "routing.load_wait_bound"),
                       ("swap_grouping: 3", "routing.swap_grouping"),
                       ("replica_utilisation: 0.5", "replica_utilisation")):
        with pytest.raises(ConfigError) as info:
            parse_config(f"routing:\n  {bad}\n")
        assert field in str(info.value), (bad, str(info.value))


def test_max_loaded_models_in_config() -> None:
    """``backends[].max_loaded_models`` reaches the backend (and a dns entry's members);
    zero, a negative number or a string is refused with its path."""
    from pharos.config import ConfigError, parse_config

    cfg = parse_config("backends:\n  - url: http://h:1\n    max_loaded_models: 1\n")
    assert cfg.backends[0].max_loaded_models == 1
    assert parse_config("backends:\n  - url: http://h:1\n").backends[0].max_loaded_models is None
    for bad in ("0", "-1", "one"):
        with pytest.raises(ConfigError) as info:
            parse_config(f"backends:\n  - url: http://h:1\n    max_loaded_models: {bad}\n")
        assert "max_loaded_models" in str(info.value)
