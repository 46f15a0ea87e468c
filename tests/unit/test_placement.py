"""Layer 1: placement on multi-model hosts (issue 15): load times learned from the engine, from
a cold dispatch's TTFT, and from model sizes; the eviction price of a cold load and its
victims, in the scheduler's decisions."""

from __future__ import annotations

import math

import pytest
from twisted.internet.task import Clock

from pharos.config import Backend as BackendSpec
from pharos.placement import (
    LOAD_BYTES_PER_SEC_DEFAULT,
    LoadRates,
    ModelDemand,
    Resident,
    horizon,
    reload_price,
    victims,
)
from pharos.policy import RouteReq, score
from pharos.sched import Scheduler
from pharos.state.state import State
from pharos.state.stats import Sample, TargetStats, learn, load_sample
from tests.unit.test_sched import GB, fleet, granted, ollama, req


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
        sched.demand.add("pop", clock.seconds())
    sched.demand.add("tail", clock.seconds() - 600)
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


def test_no_idle_victim_the_load_waits_as_before() -> None:
    """With the only other model busy on one host, the load goes to the host whose model is
    idle (whatever its price); with both busy, the request waits."""
    sched, state, clock = two_hosts()
    for _ in range(30):
        sched.demand.add("pop", clock.seconds())
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
