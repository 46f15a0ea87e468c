"""The slot model of the llama.cpp and Ollama doubles, on a ``Clock``: slot choice, per-slot
caching, shared steps, residency and cancellation."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from twisted.internet.task import Clock

from pharos.engine.library import LLAMACPP
from pharos.sim.double import EngineDouble, pinned_capture
from pharos.sim.model import (
    CANCELLED,
    COLD,
    LOADED,
    RUNNING,
    UNLOAD,
    WAITING,
    GenRequest,
    Job,
    Knobs,
)
from pharos.sim.slots import EVICT_LRU, EVICT_OLLAMA, SlotModel
from pharos.sim.wire import shape_of
from tests.support.sim import Listener, prompt, run

GB = 10**9
#: Every term of P(u, c) and of the decode step non-zero, so the tests see each one.
K = Knobs(prefill_s=0.001, decode_s=0.01, load_s=2.0, max_output_tokens=4,
          prefill_pair_s=1e-6, prefill_fixed_s=0.005, decode_seq_s=0.002, cache_tokens=4096)


def warm(slots: int = 2, knobs: Knobs = K, **models: int) -> tuple[Clock, SlotModel]:
    """A clock and a model with its models (default one, ``m``) loaded."""
    clock = Clock()
    catalogue = models or {"m": GB}
    return clock, SlotModel(clock, catalogue, slots=slots, knobs=knobs, loaded=list(catalogue))


def serve(clock: Clock, model: SlotModel, text: bytes, name: str = "m",
          max_tokens: int | None = None) -> Job:
    """Send one request and let it finish."""
    job = model.submit(GenRequest(name, text, max_tokens=max_tokens), Listener(clock))
    run(clock, 30)
    assert job.finished_at is not None
    return job


# --- an idle engine ---------------------------------------------------------------------------


def test_idle_ttft_is_p_of_u_and_c_with_and_without_a_cached_prefix() -> None:
    """On an idle engine the first token comes exactly P(u, c) after arrival: the whole prompt
    when nothing is cached, then, for the same prompt again, its last four tokens after the 96
    its slot holds; the prefill time the reply reports is the same."""
    clock, model = warm()
    text = prompt(100)
    seen = Listener(clock)
    first = model.submit(GenRequest("m", text), seen)
    p = K.prefill_seconds(100, 0)
    run(clock, p - 1e-9)
    assert seen.tokens == []
    run(clock, 1e-9)
    assert [e.index for e in seen.tokens] == [0]
    assert first.ttft == pytest.approx(p, abs=1e-12)
    assert first.prefill_seconds == pytest.approx(p, abs=1e-12)
    run(clock, 10)
    second = serve(clock, model, text)
    assert (first.cached_tokens, second.cached_tokens) == (0, 96)
    assert second.ttft == pytest.approx(K.prefill_seconds(4, 96), abs=1e-12)


def test_a_prompt_longer_than_a_step_is_chunked_and_still_costs_p() -> None:
    """A prompt over ``batch_tokens`` is computed in chunks, one per step; the chunks' costs
    add up to P(u, c) (d paid once), so an idle engine's TTFT is still P(u, c)."""
    knobs = Knobs(prefill_s=0.001, prefill_pair_s=1e-5, prefill_fixed_s=0.005,
                  batch_tokens=64, max_output_tokens=2)
    clock, model = warm(knobs=knobs)
    job = model.submit(GenRequest("m", prompt(200)), Listener(clock))
    run(clock, 10)
    assert job.ttft == pytest.approx(knobs.prefill_seconds(200, 0), abs=1e-12)


def test_then_one_token_per_step() -> None:
    """A lone request decodes one token per ``decode_s``; the last one ends it."""
    clock, model = warm()
    seen = Listener(clock)
    job = model.submit(GenRequest("m", prompt(10), max_tokens=3), seen)
    run(clock, 10)
    times = seen.times()
    assert [e.last for e in seen.tokens] == [False, False, True]
    assert times[1] - times[0] == pytest.approx(K.decode_s)
    assert times[2] - times[1] == pytest.approx(K.decode_s)
    assert seen.done_at == pytest.approx(times[2])
    assert job.decode_seconds == pytest.approx(2 * K.decode_s)


# --- slot choice and per-slot caching ---------------------------------------------------------


def test_a_request_takes_the_free_slot_holding_its_longest_prefix() -> None:
    """Three slots each holding another prompt: a request extending one of them goes to that
    slot and finds its blocks cached; a prompt sharing nothing takes the least recently used
    free slot (never-used slots first, the highest id among them, as llama.cpp picks)."""
    clock, model = warm(slots=3)
    a, b, c = prompt(64, "a"), prompt(64, "b"), prompt(64, "c")
    assert [serve(clock, model, t, max_tokens=1).slot for t in (a, b, c)] == [2, 1, 0]
    longer_b = serve(clock, model, b + prompt(40, "x"), max_tokens=1)
    assert (longer_b.slot, longer_b.cached_tokens) == (1, 64)
    longer_a = serve(clock, model, a + prompt(40, "y"), max_tokens=1)
    assert (longer_a.slot, longer_a.cached_tokens) == (2, 64)
    fresh = serve(clock, model, prompt(64, "z"), max_tokens=1)
    assert (fresh.slot, fresh.cached_tokens) == (0, 0)  # slot 0 was used longest ago
    assert model.status().cached_tokens_total == 128


def test_a_request_beside_a_busy_slot_holding_its_prefix_prefills_in_full() -> None:
    """The ledger's measurement: the slot holding a prompt is busy with it again, so the same
    prompt sent beside it takes the other slot and computes every token; once both are over,
    the prompt hits again."""
    clock, model = warm(slots=2)
    text = prompt(100)
    serve(clock, model, text)
    busy = model.submit(GenRequest("m", text), Listener(clock))
    run(clock, 0.01)
    beside = model.submit(GenRequest("m", text), Listener(clock))
    assert busy.cached_tokens == 96 and beside.slot != busy.slot
    assert beside.cached_tokens == 0
    run(clock, 30)
    assert beside.ttft is not None and beside.ttft >= K.prefill_seconds(100, 0)
    assert serve(clock, model, text).cached_tokens == 96


def test_a_slot_caches_at_most_its_share_of_the_context() -> None:
    """A slot's cache holds at most ``cache_tokens // slots`` tokens: a longer prompt finds
    only that much of itself cached when it comes back."""
    knobs = Knobs(cache_tokens=128, max_output_tokens=1)
    clock, model = warm(slots=2, knobs=knobs)
    text = prompt(200)
    serve(clock, model, text)
    assert serve(clock, model, text).cached_tokens == 64


# --- load ------------------------------------------------------------------------------------


def test_same_instant_arrivals_share_the_first_step() -> None:
    """Two requests arriving together on an idle engine are prefilled in one step: both first
    tokens come after both prefills, and a third beyond the slots waits for a free one."""
    clock, model = warm(slots=2)
    jobs = [model.submit(GenRequest("m", prompt(50, s)), Listener(clock)) for s in "abc"]
    assert [j.state for j in jobs] == [RUNNING, RUNNING, WAITING]
    run(clock, 10)
    both = 2 * K.prefill_seconds(50, 0)
    assert jobs[0].ttft == pytest.approx(both) and jobs[1].ttft == pytest.approx(both)
    assert jobs[2].ttft is not None and jobs[2].ttft > both


def test_ttft_rises_with_load() -> None:
    """More concurrent requests than slots queue: the mean TTFT never falls as the number of
    simultaneous requests grows, and is well above an idle engine's at six on two slots."""
    means = []
    for n in range(1, 7):
        clock, model = warm(slots=2)
        jobs = [model.submit(GenRequest("m", prompt(100, chr(97 + i))), Listener(clock))
                for i in range(n)]
        assert model.status().waiting == max(0, n - 2)
        run(clock, 30)
        ttfts = [j.ttft for j in jobs]
        assert all(t is not None for t in ttfts)
        means.append(sum(t for t in ttfts if t is not None) / n)
    assert means == sorted(means)
    assert means[-1] > 2 * means[0]


def test_decode_slows_with_more_active_slots() -> None:
    """n slots decoding together take ``decode_s + decode_seq_s·(n - 1)`` per token."""
    gaps = []
    for n in range(1, 5):
        clock, model = warm(slots=4)
        seen = [Listener(clock) for _ in range(n)]
        for i in range(n):
            model.submit(GenRequest("m", prompt(10, chr(97 + i))), seen[i])
        run(clock, 10)
        gap = seen[0].tokens[2].at - seen[0].tokens[1].at
        assert gap == pytest.approx(K.decode_s + K.decode_seq_s * (n - 1))
        gaps.append(gap)
    assert gaps == sorted(gaps) and gaps[0] < gaps[-1]


def test_a_new_prompt_shares_the_step_of_a_decoding_slot() -> None:
    """A request arriving while another decodes starts at the next step, which computes its
    prompt with the other's next token: that token is late by the prompt's prefill."""
    clock, model = warm(slots=2, knobs=Knobs(prefill_s=0.001, decode_s=0.01,
                                             prefill_pair_s=0.0, prefill_fixed_s=0.0,
                                             decode_seq_s=0.0, max_output_tokens=10))
    seen = Listener(clock)
    model.submit(GenRequest("m", prompt(10, "a")), seen)
    run(clock, 0.015)  # prefill 0.01, first token; the first decode step runs to 0.02
    late = model.submit(GenRequest("m", prompt(100, "b")), Listener(clock))
    run(clock, 1)
    times = seen.times()
    assert times[:3] == [pytest.approx(0.01), pytest.approx(0.02), pytest.approx(0.13)]
    assert late.first_token_at == pytest.approx(0.13)
    assert late.ttft == pytest.approx(0.13 - 0.015)


# --- cancellation ----------------------------------------------------------------------------


def test_cancel_frees_the_slot_and_withdraws_a_waiting_request() -> None:
    """A cancelled waiting request leaves the queue; a cancelled running one frees its slot
    for the next at once; neither hears anything after, and both count as aborted."""
    clock, model = warm(slots=1)
    seen = Listener(clock)
    running = model.submit(GenRequest("m", prompt(10)), seen)
    waiting = model.submit(GenRequest("m", prompt(10, "b")), Listener(clock))
    nxt = model.submit(GenRequest("m", prompt(10, "c")), Listener(clock))
    model.cancel(waiting)
    assert waiting.state == CANCELLED and model.status().waiting == 1
    run(clock, K.prefill_seconds(10, 0) + 0.001)
    heard = len(seen.tokens)
    model.cancel(running)
    assert running.state == CANCELLED and nxt.state == RUNNING and nxt.slot == 0
    run(clock, 30)
    assert len(seen.tokens) == heard and seen.done_at is None
    assert nxt.tokens_done == K.max_output_tokens
    assert model.status().finished.get("abort") == 2


def test_a_dropped_request_leaves_what_its_steps_computed_in_its_slot() -> None:
    """Cancelled after two 32-token chunks of its prompt, a request leaves those 64 tokens in
    its slot: the same prompt sent again finds them cached."""
    knobs = Knobs(prefill_s=0.001, prefill_pair_s=0.0, prefill_fixed_s=0.0, batch_tokens=32)
    clock, model = warm(slots=1, knobs=knobs)
    text = prompt(200)
    job = model.submit(GenRequest("m", text), Listener(clock))
    run(clock, 0.07)  # two steps of 0.032 s are over, the third runs
    model.cancel(job)
    assert model.cached_prefix("m", text) == 64
    again = serve(clock, model, text)
    assert again.cached_tokens == 64


# --- residency (Ollama) ----------------------------------------------------------------------


def test_a_cold_model_adds_its_load_time() -> None:
    """A cold model's first token comes ``load_s`` + P(u, 0) after arrival."""
    clock = Clock()
    model = SlotModel(clock, {"m": GB}, knobs=K)
    job = model.submit(GenRequest("m", prompt(100)), Listener(clock))
    assert model.status().model("m").state == "loading"
    run(clock, 30)
    assert job.ttft == pytest.approx(K.load_s + K.prefill_seconds(100, 0))
    assert job.load_seconds == pytest.approx(K.load_s)


def test_memory_pressure_never_unloads_a_model_with_requests_in_flight() -> None:
    """Host memory holds two of three models: a third evicts the idle one even though the
    busy one was used longer ago; the busy one keeps serving."""
    slow = Knobs(decode_s=1.0, max_output_tokens=20, load_s=2.0)
    clock = Clock()
    model = SlotModel(clock, {"a": 4 * GB, "b": 4 * GB, "c": 4 * GB},
                      knobs=replace(slow, host_memory=10 * GB), loaded=["a", "b"])
    busy = model.submit(GenRequest("a", prompt(8)), Listener(clock))
    run(clock, 1)
    serve_quick = model.submit(GenRequest("b", prompt(8), max_tokens=1), Listener(clock))
    run(clock, 1)
    assert serve_quick.finished_at is not None and busy.state == RUNNING
    assert model.status().model("a").last_used < model.status().model("b").last_used
    model.submit(GenRequest("c", prompt(8), max_tokens=1), Listener(clock))
    states = {m.name: m.state for m in model.status().models}
    assert states == {"a": LOADED, "b": COLD, "c": "loading"}
    run(clock, 30)
    assert busy.tokens_done == 20


def test_ollama_order_unloads_the_shortest_keep_alive_then_the_lowest_path() -> None:
    """Memory short, the Ollama order (server/sched.go ``findRunnerToUnload``) takes an idle
    model with the shortest keep-alive, and between equal ones the lowest model path (the
    double's stand-in: its name's SHA-256, "popular" before "rare-a"), however recently it
    was used; an unload request (keep-alive 0) puts its model first at once, before its
    expiry fires. The LRU order takes the least recently used."""
    sizes = {"popular": 4 * GB, "rare-a": 4 * GB, "rare-b": 4 * GB}

    def host(evict: str) -> tuple[Clock, SlotModel]:
        clock = Clock()
        model = SlotModel(clock, sizes, knobs=replace(K, host_memory=9 * GB, keep_alive=300.0),
                          loaded=["popular", "rare-a"], evict=evict)
        serve(clock, model, prompt(8), "rare-a", max_tokens=1)
        serve(clock, model, prompt(8), "popular", max_tokens=1)  # the most recent
        return clock, model

    def resident(model: SlotModel) -> set[str]:
        return {m.name for m in model.status().models if m.state in (LOADED, "loading")}

    clock, model = host(EVICT_OLLAMA)
    model.submit(GenRequest("rare-b", prompt(8), max_tokens=1), Listener(clock))
    assert resident(model) == {"rare-a", "rare-b"}
    clock, model = host(EVICT_OLLAMA)
    model.submit(GenRequest("rare-a", control=UNLOAD, keep_alive=0.0), Listener(clock))
    model.submit(GenRequest("rare-b", prompt(8), max_tokens=1), Listener(clock))
    assert resident(model) == {"popular", "rare-b"}
    clock, model = host(EVICT_LRU)
    model.submit(GenRequest("rare-b", prompt(8), max_tokens=1), Listener(clock))
    assert resident(model) == {"popular", "rare-b"}
    with pytest.raises(ValueError, match="eviction order"):
        SlotModel(Clock(), sizes, evict="mru")


def test_keep_alive_unloads_an_idle_model_and_its_slots_forget() -> None:
    """An idle model unloads ``keep_alive`` seconds after its last use (``expires_at`` says
    when); loaded again, its slots hold nothing, so a repeated prompt is computed in full."""
    knobs = replace(K, keep_alive=5.0)
    clock = Clock()
    model = SlotModel(clock, {"m": GB}, knobs=knobs)
    text = prompt(100)
    first = model.submit(GenRequest("m", text), Listener(clock))
    run(clock, 2.5)
    assert first.finished_at is not None
    status = model.status().model("m")
    assert status.state == LOADED
    assert status.expires_at == pytest.approx(first.finished_at + 5.0)
    assert model.cached_prefix("m", text) == 96
    run(clock, 5)
    assert model.status().model("m").state == COLD
    again = model.submit(GenRequest("m", text), Listener(clock))
    run(clock, 30)
    assert again.cached_tokens == 0 and again.load_seconds == pytest.approx(knobs.load_s)


# --- llama.cpp's /slots ----------------------------------------------------------------------


def test_llamacpp_slots_show_the_busy_slot_and_the_last_task_of_an_idle_one() -> None:
    """/slots renders from the model: the first request takes slot 1 (llama.cpp's tie rule);
    running, it has the busy capture's shape; over, slot 1 keeps its task id and prompt size
    in the prefix capture's shape while slot 0, never used, stays the idle shape."""
    clock = Clock()
    double = EngineDouble(LLAMACPP, clock, slots=2, max_output_tokens=2)
    job = double.model.submit(GenRequest("tiny", b"x" * 400), Listener(clock))

    def slots() -> list[dict[str, object]]:
        doc = json.loads(double.flavor.get("/slots", double.model.status()).body)
        assert isinstance(doc, list)
        return doc

    assert [s["is_processing"] for s in slots()] == [False, True]
    run(clock, 10)
    after = slots()
    prefix = json.loads(pinned_capture(LLAMACPP, state="prefix").paths["/slots"].body)
    assert shape_of(after[1]) == shape_of(prefix[1]) and shape_of(after[0]) == shape_of(prefix[0])
    assert (after[1]["is_processing"], after[1]["id_task"], after[1]["n_prompt_tokens"]) == (
        False, job.id, 100)
    assert after[1]["next_token"] == prefix[1]["next_token"]
    double.stop()

