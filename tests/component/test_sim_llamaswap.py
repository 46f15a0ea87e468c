"""The llama-swap double (issue 15): llama-swap v250's own bodies rebuilt from its pinned
capture, resolved by Pharos as the capture is, one model at a time with swaps in arrival
order; and Pharos in front of it over loopback groups the swaps of an A-B-A-A-C stream that
the double, sent the stream as it arrives, swaps at every change of model."""

from __future__ import annotations

import json
from typing import Any

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred, gatherResults
from twisted.internet.task import Clock, deferLater

from pharos.engine.fetch import CaptureFetcher
from pharos.engine.library import AUTO, LLAMASWAP
from pharos.engine.plan import resolve
from pharos.engine.signals import Residency
from pharos.sim.double import EngineDouble, pinned_capture
from pharos.sim.wire import shape_of
from tests.support.doubles import Rig, plan_outline
from tests.support.fleet import start_fleet, within

MODELS = ("gemma-3-12b", "qwen2.5-coder-7b", "qwen3-8b")


def body(double: EngineDouble, path: str) -> bytes:
    return double.flavor.get(path, double.model.status()).body


def test_llamaswap_bodies_are_rebuilt_from_the_capture() -> None:
    """With the capture's ready model loaded, ``/running`` is the capture's record of it byte
    for byte (a ``starting`` one is the same record with its state), ``/v1/models`` keeps the
    recorded shape with each model's status, and every other recorded path is as recorded."""
    capture = pinned_capture(LLAMASWAP)
    double = EngineDouble(LLAMASWAP, Clock(), loaded=("qwen3-8b",))
    recorded = json.loads(capture.paths["/running"].body)
    ready = next(r for r in recorded["running"] if r["model"] == "qwen3-8b")
    expected = {"running": [ready]}
    assert json.loads(body(double, "/running")) == expected
    assert body(double, "/running").endswith(b"}\n")
    models = json.loads(body(double, "/v1/models"))
    assert shape_of(models) == shape_of(json.loads(capture.paths["/v1/models"].body))
    assert {d["id"]: d["status"]["value"] for d in models["data"]} == {
        "gemma-3-12b": "unloaded", "qwen2.5-coder-7b": "unloaded", "qwen3-8b": "loaded"}
    for path in ("/health", "/api/version", "/metrics", "/props", "/api/tags", "/"):
        assert body(double, path) == capture.paths[path].body, path
    assert double.flavor.served_model("coder") == "qwen2.5-coder-7b"  # a recorded alias
    assert double.flavor.served_model("nope") is None


@pytest_twisted.ensureDeferred
async def test_resolve_reads_the_llamaswap_double_as_its_capture() -> None:
    """Over its socket the double is detected as llama-swap v250 with the probes the capture
    gets, and its residency is the double's (nothing loaded, then the model it swapped in)."""
    capture = pinned_capture(LLAMASWAP)
    expected, _ = await resolve(CaptureFetcher(capture), AUTO)
    rig = Rig(LLAMASWAP, prefill_s=0.0, decode_s=0.0, load_s=0.0)
    try:
        plan, snap = await resolve(rig.fetcher, AUTO)
        assert plan_outline(plan) == plan_outline(expected)
        assert plan.kind == LLAMASWAP and plan.version == "v250"
        assert not snap.residency
        await rig.whole("/v1/chat/completions", {
            "model": "qwen3-8b", "messages": [{"role": "user", "content": "hi"}]})
        _, snap = await resolve(rig.fetcher, AUTO)
        assert snap.residency == {"qwen3-8b": Residency.LOADED}
    finally:
        await rig.close()


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4}


@pytest_twisted.ensureDeferred
async def test_one_model_at_a_time_in_arrival_order() -> None:
    """A, B, A sent together: B waits for A's request to end, and the second A for B's
    (arrival order, as a request at a time through llama-swap's swap): three loads, each
    reply whole, one model loaded at the end."""
    rig = Rig(LLAMASWAP, prefill_s=0.001, decode_s=0.05, load_s=0.1)

    async def send(i: int, model: str) -> Any:
        await deferLater(reactor, 0.02 * i, lambda: None)  # arrival order A, B, A
        return await rig.whole("/v1/chat/completions", chat(model))

    try:
        replies = await within(gatherResults([
            ensureDeferred(send(i, m))
            for i, m in enumerate(("qwen3-8b", "gemma-3-12b", "qwen3-8b"))]))
        assert [r.code for r, _ in replies] == [200, 200, 200]
        assert rig.double.loads == 3
        loaded = [m.name for m in rig.double.model.status().models if m.state == "loaded"]
        assert loaded == ["qwen3-8b"]
    finally:
        await rig.close()


#: The A-B-A-A-C pattern, four times, a request every 50 ms.
PATTERN = [m for _ in range(4) for m in ("qwen3-8b", "gemma-3-12b", "qwen3-8b", "qwen3-8b",
                                         "qwen2.5-coder-7b")]
SPACING = 0.05
HOST = {"prefill_s": 0.001, "decode_s": 0.03, "load_s": 0.1, "slots": 2}


@pytest_twisted.ensureDeferred
async def test_pharos_groups_the_swaps_fifo_dispatch_makes() -> None:
    """The A-B-A-A-C stream sent straight to a llama-swap double as it arrives (what a router
    that dispatches at once, in order, leaves to llama-swap) swaps at nearly every change of
    model; through Pharos, which knows llama-swap holds one model at a time and serves the
    loaded model's queued requests before a swap, the same stream takes at least 3x fewer
    loads, and every request is served."""
    rig = Rig(LLAMASWAP, **HOST)
    try:
        async def direct(i: int, model: str) -> int:
            await deferLater(reactor, i * SPACING, lambda: None)
            response, _ = await rig.whole("/v1/chat/completions", chat(model))
            return int(response.code)

        codes = await within(gatherResults([ensureDeferred(direct(i, m))
                                            for i, m in enumerate(PATTERN)]), 60)
        assert codes == [200] * len(PATTERN)
        fifo_loads = rig.double.loads
    finally:
        await rig.close()
    fleet = await start_fleet([(LLAMASWAP, HOST, {"kind": LLAMASWAP, "capacity": 2})])
    try:
        async def routed(i: int, model: str) -> int:
            await deferLater(reactor, i * SPACING, lambda: None)
            r = await fleet.post("/v1/chat/completions", chat(model))
            await r.content()
            return int(r.code)

        codes = await within(gatherResults([ensureDeferred(routed(i, m))
                                            for i, m in enumerate(PATTERN)]), 60)
        assert codes == [200] * len(PATTERN)
        grouped_loads = fleet.doubles[0].loads
    finally:
        await fleet.stop()
    print(f"loads: fifo {fifo_loads}, through Pharos {grouped_loads}")
    assert fifo_loads >= 12, fifo_loads
    assert grouped_loads * 3 <= fifo_loads, (grouped_loads, fifo_loads)
