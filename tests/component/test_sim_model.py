"""The slot model behind the llama.cpp and Ollama doubles, on a ``Clock``: no sockets, no
sleeping. With the P(u, c) pair and fixed terms and the per-sequence decode cost at zero it
keeps the plain numbers these tests were written with (tests/unit/test_sim_slots.py has the
rest)."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from pharos.sim.model import (
    CANCELLED,
    COLD,
    LENGTH,
    LOAD,
    LOADED,
    RUNNING,
    STOP,
    UNLOAD,
    WAITING,
    GenRequest,
    Knobs,
    ModelTooLarge,
    UnknownModel,
)
from pharos.sim.prompt import BLOCK_TOKENS, chain_blocks, count_tokens
from pharos.sim.slots import SlotModel
from tests.support.sim import Listener, prompt, run

GB = 10**9
FAST = Knobs(prefill_s=0.001, decode_s=0.01, load_s=2.0, max_output_tokens=5,
             prefill_pair_s=0.0, prefill_fixed_s=0.0, decode_seq_s=0.0)


def test_idle_ttft_is_prefill_of_the_prompt_then_one_token_per_decode_step() -> None:
    """A warm idle model: first token after prefill(prompt tokens), then one per decode_s,
    done with the last; the request's max_tokens under the cap ends it with "length"."""
    clock = Clock()
    model = SlotModel(clock, {"m": GB}, slots=2, knobs=FAST, loaded=["m"])
    seen = Listener(clock)
    job = model.submit(GenRequest("m", prompt(100), max_tokens=3), seen)
    assert seen.tokens == []  # never called from inside submit
    run(clock, 0.0999)
    assert seen.tokens == []
    run(clock, 0.0001)
    assert job.ttft == pytest.approx(0.1)
    assert [e.index for e in seen.tokens] == [0]
    run(clock, 0.01)
    run(clock, 0.01)
    assert [(e.index, e.last) for e in seen.tokens] == [(0, False), (1, False), (2, True)]
    assert seen.done_at == pytest.approx(0.12)
    assert job.finish_reason == LENGTH and job.tokens_done == 3
    assert model.status().running == 0


def test_output_is_capped_and_then_stops() -> None:
    """Without max_tokens (or with more than the cap) a reply has the cap's length, "stop"."""
    clock = Clock()
    model = SlotModel(clock, {"m": GB}, knobs=FAST, loaded=["m"])
    job = model.submit(GenRequest("m", prompt(4), max_tokens=1000), Listener(clock))
    run(clock, 10)
    assert job.tokens_done == FAST.max_output_tokens and job.finish_reason == STOP


def test_repeated_prompt_is_cached_and_faster() -> None:
    """The second send of a prompt finds its whole-block prefix cached (at most prompt - 1
    tokens: the last is always computed) and its first token comes sooner."""
    clock = Clock()
    model = SlotModel(clock, {"m": GB}, knobs=FAST, loaded=["m"])
    text = prompt(100)
    first = model.submit(GenRequest("m", text), Listener(clock))
    run(clock, 10)
    second = model.submit(GenRequest("m", text), Listener(clock))
    run(clock, 10)
    assert first.cached_tokens == 0
    assert second.cached_tokens == (100 // BLOCK_TOKENS) * BLOCK_TOKENS
    assert second.ttft is not None and first.ttft is not None and second.ttft < first.ttft
    assert second.ttft == pytest.approx((100 - second.cached_tokens) * FAST.prefill_s)
    status = model.status()
    assert status.cached_tokens_total == second.cached_tokens
    assert status.prompt_tokens_total == 200


def test_next_turn_hits_the_previous_turn_and_its_reply() -> None:
    """A prompt that extends an earlier prompt plus the reply generated for it is cached up to
    the end of that reply's whole blocks, as an engine caches a conversation."""
    clock = Clock()
    model = SlotModel(clock, {"m": GB}, knobs=FAST, loaded=["m"])
    turn1 = prompt(64)
    model.submit(GenRequest("m", turn1), Listener(clock))
    run(clock, 10)
    reply = "".join(["The", " quick", " brown", " fox", " jumps"]).encode()
    turn2 = turn1 + reply + prompt(64, "b")
    job = model.submit(GenRequest("m", turn2), Listener(clock))
    run(clock, 10)
    assert job.cached_tokens == len(chain_blocks(turn1 + reply)) * BLOCK_TOKENS
    assert job.cached_tokens >= 64


def test_prompt_size_counts_decoded_bytes() -> None:
    """4 bytes of text per token, rounded up: UTF-8 text counts its encoded bytes."""
    assert count_tokens(b"abcd") == 1
    assert count_tokens(b"abcde") == 2
    assert count_tokens("été".encode()) == 2  # 5 bytes
    assert GenRequest("m", b"").prompt_tokens == 1


def test_requests_beyond_the_slots_wait_in_arrival_order() -> None:
    """Slots bound the running requests; the rest wait and start as slots free up."""
    clock = Clock()
    model = SlotModel(clock, {"m": GB}, slots=2, knobs=FAST, loaded=["m"])
    jobs = [model.submit(GenRequest("m", prompt(10), max_tokens=2), Listener(clock))
            for _ in range(3)]
    status = model.status()
    assert (status.running, status.waiting) == (2, 1)
    assert [j.state for j in jobs] == [RUNNING, RUNNING, WAITING]
    assert {j.slot for j in jobs[:2]} == {0, 1}
    run(clock, 0.02)  # one step prefills both 10-token prompts: their first tokens
    assert jobs[2].state == WAITING
    run(clock, 0.01)  # their second and last tokens: the waiting one takes a slot
    assert jobs[2].state == RUNNING and jobs[2].slot in (0, 1)
    assert model.status().waiting == 0


def test_cancel_frees_the_slot_for_the_next() -> None:
    """Cancelling a running job frees its slot at once and no callback follows."""
    clock = Clock()
    model = SlotModel(clock, {"m": GB}, slots=1, knobs=FAST, loaded=["m"])
    seen = Listener(clock)
    a = model.submit(GenRequest("m", prompt(10)), seen)
    b = model.submit(GenRequest("m", prompt(10)), Listener(clock))
    assert b.state == WAITING
    model.cancel(a)
    assert a.state == CANCELLED and b.state == RUNNING
    run(clock, 10)
    assert seen.tokens == []
    assert model.status().finished.get("abort") == 1


def test_cold_model_loads_first() -> None:
    """A cold model: TTFT = load + prefill; the load shows as the job's load time."""
    clock = Clock()
    model = SlotModel(clock, {"m": GB}, knobs=FAST)
    job = model.submit(GenRequest("m", prompt(100)), Listener(clock))
    assert model.status().model("m").state == "loading"
    assert model.status().waiting == 1
    run(clock, 10)
    assert job.ttft == pytest.approx(FAST.load_s + 100 * FAST.prefill_s)
    assert job.load_seconds == pytest.approx(FAST.load_s)


def test_cold_model_on_a_full_host_evicts_the_least_recently_used_idle_model() -> None:
    """Host memory holds two of three 4 GB models: loading the third unloads the idle model
    used longest ago, never a busy one, and its cache goes with it."""
    clock = Clock()
    model = SlotModel(clock, {"a": 4 * GB, "b": 4 * GB, "c": 4 * GB}, knobs=FAST,
                        loaded=["a", "b"])
    for name in ("b", "a"):  # a is used last, so b is the least recently used
        model.submit(GenRequest(name, prompt(8)), Listener(clock))
        run(clock, 1)
    model.submit(GenRequest("c", prompt(8)), Listener(clock))
    states = {m.name: m.state for m in model.status().models}
    assert states == {"a": LOADED, "b": COLD, "c": "loading"}


def test_busy_models_are_not_evicted_the_cold_one_waits() -> None:
    """When only busy models could make room, the cold model waits until one goes idle."""
    clock = Clock()
    knobs = Knobs(prefill_s=0.001, decode_s=1.0, load_s=2.0, max_output_tokens=3)
    model = SlotModel(clock, {"a": 6 * GB, "b": 6 * GB}, knobs=knobs, loaded=["a"])
    busy = model.submit(GenRequest("a", prompt(8)), Listener(clock))
    cold = model.submit(GenRequest("b", prompt(8)), Listener(clock))
    run(clock, 0.5)
    assert model.status().model("b").state == COLD and cold.state == WAITING
    run(clock, 5)  # a finishes, goes idle, is evicted; b loads and runs
    assert busy.finished_at is not None
    assert model.status().model("a").state == COLD
    run(clock, 10)
    assert cold.tokens_done == 3


def test_hold_freezes_progress_and_release_resumes_it() -> None:
    """Held requests take slots and stay running however far the clock moves; released, they
    continue with the time their step had left."""
    clock = Clock()
    model = SlotModel(clock, {"m": GB}, slots=2, knobs=FAST, loaded=["m"])
    jobs = [model.submit(GenRequest("m", prompt(100)), Listener(clock)) for _ in range(3)]
    run(clock, 0.05)  # one step prefills both running prompts: 0.2 s, 0.15 s left
    model.hold()
    run(clock, 100)
    status = model.status()
    assert (status.running, status.waiting) == (2, 1)
    assert all(j.first_token_at is None for j in jobs)
    model.release()
    run(clock, 0.15)
    assert jobs[0].first_token_at == pytest.approx(100.2)
    assert jobs[0].ttft == pytest.approx(100.2) and jobs[0].prefill_seconds == pytest.approx(0.2)


def test_keep_alive_unloads_an_idle_model_and_control_requests() -> None:
    """An idle model unloads after its keep-alive; a load request loads it without a slot;
    an unload request (keep_alive 0) unloads it at once."""
    clock = Clock()
    model = SlotModel(clock, {"m": GB}, knobs=Knobs(load_s=1.0, keep_alive=300.0))
    loader = Listener(clock)
    load = model.submit(GenRequest("m", control=LOAD), loader)
    run(clock, 1)
    assert load.control_reason == LOAD and loader.done_at == pytest.approx(1.0)
    assert model.status().model("m").expires_at == pytest.approx(301.0)
    run(clock, 300)
    assert model.status().model("m").state == COLD
    model.submit(GenRequest("m", control=LOAD), Listener(clock))
    run(clock, 1)
    model.submit(GenRequest("m", control=UNLOAD, keep_alive=0), Listener(clock))
    clock.advance(0)
    assert model.status().model("m").state == COLD


def test_unknown_and_oversized_models_are_refused() -> None:
    """A name the engine does not serve, or a model larger than host memory, fails at once."""
    model = SlotModel(Clock(), {"m": GB, "huge": 20 * GB}, knobs=FAST)
    with pytest.raises(UnknownModel):
        model.submit(GenRequest("x"), Listener(Clock()))
    with pytest.raises(ModelTooLarge):
        model.submit(GenRequest("huge"), Listener(Clock()))


def test_kv_usage_counts_running_tokens() -> None:
    """KV usage is the running requests' prompt and generated tokens over the pool."""
    clock = Clock()
    model = SlotModel(clock, {"m": GB}, knobs=Knobs(cache_tokens=1000, prefill_s=0.001,
                                                    decode_s=1.0, prefill_pair_s=0.0,
                                                    prefill_fixed_s=0.0), loaded=["m"])
    model.submit(GenRequest("m", prompt(100)), Listener(clock))
    assert model.status().kv_usage == pytest.approx(0.1)
    run(clock, 0.1)
    assert model.status().kv_usage == pytest.approx(0.101)
