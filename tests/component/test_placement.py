"""Layer 3: placement over loopback (issue 15). Three simulated Ollama hosts that each hold one
model at a time, a popular model loaded on two of them, and tail models asked for one after
another: each tail load evicts the previous tail model (idle, little demand), never the popular
one, and the decision's reason names the victim and its price. The popular model on one host:
asked for one at a time it stays there (a request finding it full queues for a warm slot, and
explain says why); asked for more than its slots serve, it gets a second host."""

from __future__ import annotations

import json
from itertools import pairwise
from typing import Any

import pytest_twisted
import treq
from twisted.internet.defer import ensureDeferred, gatherResults

from pharos.engine.signals import Residency
from pharos.sim.double import EngineDouble
from pharos.sim.slots import SlotModel
from tests.support.fleet import Fleet, eventually, start_fleet, within

GB = 1_000_000_000
TAILS = ("t1", "t2", "t3", "t4", "t5")
SIZES = {"pop": 4 * GB, **dict.fromkeys(TAILS, 4 * GB)}
#: Each host holds one 4 GB model (5 GB of memory, as Pharos is told and the double enforces).
HOST = {"models": SIZES, "host_memory": 5 * GB, "load_s": 0.5, "slots": 2}
BACKEND = {"kind": "ollama", "memory_gb": 5, "capacity": 2}


def loaded(double: EngineDouble) -> set[str]:
    return {m.name for m in double.model.status().models if m.state == "loaded"}


def seen_loaded(fleet: Fleet, double: EngineDouble, model: str) -> bool:
    """Pharos's view says ``model`` is loaded on ``double`` (a round has seen it)."""
    t = fleet.target(double, model)
    return bool(fleet.pharos.state.view(t).residency is Residency.LOADED)


async def ok(fleet: Fleet, model: str) -> Any:
    r = await within(ensureDeferred(fleet.chat(model)))
    await r.content()
    assert r.code == 200, model
    return r


@pytest_twisted.ensureDeferred
async def test_the_tail_evicts_the_idle_tail_never_the_popular_model() -> None:
    """With an idle tail model to evict, no tail load evicts the popular model, whatever the
    seeds breaking ties: the popular model's reload is priced above the tail's."""
    fleet = await start_fleet([
        ("ollama", {**HOST, "loaded": ["pop"]}, BACKEND),
        ("ollama", {**HOST, "loaded": ["pop"]}, BACKEND),
        ("ollama", {**HOST, "loaded": ["t1"]}, BACKEND),
    ])
    pop_hosts, tail_host = fleet.doubles[:2], fleet.doubles[2]
    try:
        await eventually(lambda: all(seen_loaded(fleet, d, "pop") for d in pop_hosts)
                         and seen_loaded(fleet, tail_host, "t1"), timeout=10)
        for _ in range(6):  # the popular model's demand
            await gatherResults([ensureDeferred(ok(fleet, "pop")) for _ in range(4)])
        await ok(fleet, "t1")
        for previous, tail in pairwise(TAILS):
            await eventually(lambda p=previous: seen_loaded(fleet, tail_host, p), timeout=10)
            await ok(fleet, "pop")
            r = await ok(fleet, tail)
            assert r.headers.getRawHeaders(b"x-pharos-backend") == [tail_host.url.encode()]
            reason = r.headers.getRawHeaders(b"x-pharos-reason")[0].decode()
            assert f"evicts {previous} (reload" in reason, reason
            for d in pop_hosts:
                assert loaded(d) == {"pop"}, (tail, loaded(d))
            assert loaded(tail_host) == {tail}
        assert all(d.stats.completed > 0 for d in pop_hosts)
        # /admin/explain shows each cold candidate's victims and their price.
        await eventually(lambda: seen_loaded(fleet, tail_host, TAILS[-1]), timeout=10)
        r = await fleet.post("/admin/explain/v1/chat/completions",
                             {"model": "t1", "messages": [{"role": "user", "content": "hi"}]})
        doc = json.loads(await r.content())
        assert r.code == 200, doc
        by_backend = {c["backend"]: c for c in doc["candidates"]}
        tail_c = by_backend[tail_host.url]
        assert tail_c["evicts_models"] == [TAILS[-1]]
        assert tail_c["unloads_victims"] is True  # Ollama: Pharos names the victim
        for d in pop_hosts:
            pop_c = by_backend[d.url]
            assert pop_c["evicts_models"] == ["pop"]
            assert pop_c["reload_price_sec"] > tail_c["reload_price_sec"] > 0
            assert pop_c["estimate"]["reload_sec"] == pop_c["reload_price_sec"]
        assert doc["winner"].startswith(tail_host.url)
    finally:
        await fleet.stop()


def hosts_of(fleet: Fleet, model: str) -> list[str]:
    return [d.url for d in fleet.doubles if model in loaded(d)]


@pytest_twisted.ensureDeferred
async def test_demand_above_one_hosts_slots_gets_a_second_host() -> None:
    """The popular model on one host (2 slots), idle tail models on the two others. Asked for
    one request at a time it stays on its one host (no copy evicts a tail model); asked for
    six at a time, over and over (more than its host's slots serve), it gets a second host,
    loaded over an idle tail model, never over itself, and every request is served."""
    slow = {**HOST, "decode_s": 0.08}  # about 0.7 s a reply: a queue costs more than a load
    fleet = await start_fleet([
        ("ollama", {**slow, "loaded": ["pop"]}, BACKEND),
        ("ollama", {**slow, "loaded": ["t1"]}, BACKEND),
        ("ollama", {**slow, "loaded": ["t2"]}, BACKEND),
    ])
    first = fleet.doubles[0]
    try:
        await eventually(lambda: seen_loaded(fleet, first, "pop")
                         and seen_loaded(fleet, fleet.doubles[1], "t1")
                         and seen_loaded(fleet, fleet.doubles[2], "t2"), timeout=10)
        for _ in range(8):  # low demand: one at a time
            r = await ok(fleet, "pop")
            assert r.headers.getRawHeaders(b"x-pharos-backend") == [first.url.encode()]
        assert hosts_of(fleet, "pop") == [first.url]
        assert loaded(fleet.doubles[1]) == {"t1"} and loaded(fleet.doubles[2]) == {"t2"}
        # Its host full: a request would queue for a warm slot, and explain says why.
        first.hold()
        busy = [ensureDeferred(ok(fleet, "pop")) for _ in range(2)]
        await eventually(lambda: fleet.target(first, "pop").inflight == 2, timeout=10)
        r = await fleet.post("/admin/explain/v1/chat/completions",
                             {"model": "pop", "messages": [{"role": "user", "content": "hi"}]})
        doc = json.loads(await r.content())
        assert doc["enqueue"] and doc["winner"].startswith(first.url), doc
        assert "queued: no free slot" in doc["reason"], doc["reason"]
        assert "no copy, a warm slot costs less" in doc["reason"], doc["reason"]
        held = [c["set_aside"] for c in doc["candidates"] if c["backend"] != first.url]
        assert len(held) == 2 and all(h.startswith("no copy, a warm slot costs less")
                                      for h in held), held
        first.release()
        await gatherResults(busy)
        served: set[str] = set()
        copies: list[str] = []  # the reasons of the requests that loaded a copy
        for _ in range(20):  # high demand: six at a time
            replies = await gatherResults([ensureDeferred(ok(fleet, "pop")) for _ in range(6)])
            for r in replies:
                backend = r.headers.getRawHeaders(b"x-pharos-backend")[0].decode()
                served.add(backend)
                if backend != first.url:
                    copies.append(r.headers.getRawHeaders(b"x-pharos-reason")[0].decode())
            if len(served) > 1:
                break
        assert len(served) > 1, served
        assert any("evicts t" in reason for reason in copies), copies
        assert not any("evicts pop" in reason for reason in copies), copies
        assert first.url in hosts_of(fleet, "pop")
        assert len(hosts_of(fleet, "pop")) >= 2
        # The copy came from the demand rule: the requests wanting pop's two slots (waiting
        # ones counted) outnumbered them (replica_utilization 1.0).
        assert any("replica needed: demand" in reason for reason in copies), copies
    finally:
        await fleet.stop()


#: Names whose SHA-256 (the double's stand-in for Ollama's model path) sorts "popular" first:
#: left to itself, the host unloads it before "rare-a" (keep-alive, then path).
NAMED = {"popular": 4 * GB, "rare-a": 4 * GB, "rare-b": 4 * GB}


@pytest_twisted.ensureDeferred
async def test_pharos_names_the_victim_the_host_would_not_have_chosen() -> None:
    """A host holding the popular model and a rare one, both idle, and a request for a third:
    left to itself the Ollama double (as Ollama: the shortest keep-alive, then the lowest
    model path) unloads the popular model; Pharos asks it to unload the rare one first (a
    request with no prompt and ``keep_alive: 0``), so the popular one stays and its next
    request is warm. The decision's reason names that victim. A model someone loaded for
    good (``keep_alive: -1``) is never unloaded by Pharos, even when it is the cheapest."""
    host = {"models": NAMED, "host_memory": 9 * GB, "load_s": 0.5, "slots": 2,
            "loaded": ["popular", "rare-a"]}
    fleet = await start_fleet([("ollama", host, {**BACKEND, "memory_gb": 9})])
    double = fleet.doubles[0]
    try:
        await eventually(lambda: seen_loaded(fleet, double, "popular")
                         and seen_loaded(fleet, double, "rare-a"), timeout=10)
        for _ in range(4):  # the popular model's demand; the rare one has none
            await ok(fleet, "popular")
        r = await ok(fleet, "rare-b")
        reason = r.headers.getRawHeaders(b"x-pharos-reason")[0].decode()
        assert "evicts rare-a (reload" in reason, reason
        assert loaded(double) == {"popular", "rare-b"}
        assert double.stats.controls == 1  # the one unload, not a generation
        m = await treq.get(fleet.url + "/metrics", pool=fleet.pool)
        text = (await m.content()).decode()
        assert 'pharos_decisions_total{outcome="victims_unloaded",stage="load"} 1.0' in text
        assert 'pharos_decisions_total{outcome="unload_failed",stage="load"} 0.0' in text
        model = double.model
        assert isinstance(model, SlotModel)
        before = model.loads
        await ok(fleet, "popular")
        assert model.loads == before  # still loaded: no reload
        # Someone loads rare-b for good (keep_alive -1, straight to the host): Pharos still
        # prices it as the cheapest to lose, but reads /api/ps before unloading and leaves
        # it; the host then chooses (and keeps the pinned one).
        pin = await treq.post(double.url + "/api/generate",
                              json.dumps({"model": "rare-b", "keep_alive": -1}).encode(),
                              pool=fleet.pool)
        await pin.content()
        assert pin.code == 200
        r = await ok(fleet, "rare-a")
        assert "rare-b" in loaded(double) and "rare-a" in loaded(double)
        assert double.stats.controls == 2  # the pin; no unload this time
        m = await treq.get(fleet.url + "/metrics", pool=fleet.pool)
        text = (await m.content()).decode()
        assert 'pharos_decisions_total{outcome="unload_failed",stage="load"} 1.0' in text
    finally:
        await fleet.stop()
