"""Layer 1: KV headroom (issue 10 item 4). vLLM admits no request its free KV blocks cannot
hold, so a free slot on an engine whose running requests hold most of its pool still waits;
the pool comes from ``vllm:cache_config_info`` and the room from its KV usage less the
prompts Pharos sent since that was read. The cost prices the wait for the first running
request to end; unknown room prices nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pharos.config import Backend as BackendSpec
from pharos.policy import Candidate, PolicyConfig, RouteReq, pick
from pharos.sched import SchedRequest
from tests.support.plan import FakeBackend
from tests.support.sched import fleet, granted

BASE = Candidate(target_id=0, warm=True, capacity=64, free_slots=60, queue_ahead=0,
                 kv_usage=0.9, matched_tokens=0, prefill_sec_per_token=0.0001, load_sec=None,
                 service_sec=4.0, fits_if_cold=None, loading=False, inflight=4)


def test_a_prompt_that_does_not_fit_waits_for_a_running_request() -> None:
    """A 2,000-token prompt on an engine with room for 500 waits service / (running + 1)
    (4 s / 5): a slower engine with room wins; with the room unknown or large enough, the
    faster one does."""
    tight = replace(BASE, target_id=0, kv_free_tokens=500)
    roomy = replace(BASE, target_id=1, prefill_sec_per_token=0.0002, kv_free_tokens=50_000)
    d = pick(RouteReq(2000, 1), [tight, roomy], PolicyConfig())
    assert d.target_id == 1
    assert d.scores[0].wait == pytest.approx(4.0 / 5)
    assert d.scores[1].wait == 0
    for room in (None, 2000):
        d = pick(RouteReq(2000, 1), [replace(tight, kv_free_tokens=room), roomy],
                 PolicyConfig())
        assert d.target_id == 0 and d.scores[0].wait == 0


def test_the_cached_part_needs_no_room() -> None:
    """Only the uncached tokens need blocks: a prompt whose 1,800 tokens are cached fits in
    room for 500."""
    tight = replace(BASE, kv_free_tokens=500, matched_tokens=1800)
    d = pick(RouteReq(2000, 1), [tight], PolicyConfig())
    assert d.scores[0].wait == 0


def vllm(kv: float, running: int = 2) -> FakeBackend:
    return FakeBackend({
        "/version": (200, b'{"version":"0.32.0"}'),
        "/v1/models": (200, b'{"object":"list","data":[{"id":"m"}]}'),
        "/metrics": (200, (
            f'vllm:num_requests_running{{model_name="m"}} {running}\n'
            'vllm:num_requests_waiting{model_name="m"} 0\n'
            f'vllm:kv_cache_usage_perc{{model_name="m"}} {kv}\n'
            'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0\n'
        ).encode()),
    })


def test_room_is_the_pool_less_usage_less_what_pharos_sent_since() -> None:
    """1,600-token pool at 50 % usage: 800 tokens of room; a 600-token prompt sent leaves
    200, and still 200 after a round while it has no first byte (the engine's usage holds
    none of a queued prompt and only the chunks computed so far of one being prefilled);
    after its first byte the next round's usage counts it."""
    url = "http://v"
    sched, state, clock = fleet({url: (vllm(0.5), BackendSpec(url=url, kind="vllm",
                                                                capacity=8))})
    clock.pump([1.0] * 6)  # a full round read the pool
    (t,) = state.targets
    assert state.view(t).kv_pool_tokens == 1600
    assert sched.candidate(t, 0).kv_free_tokens == 800
    lease = granted(sched.acquire("k", 1, SchedRequest("m", 600, 1)))
    assert sched.candidate(t, 0).kv_free_tokens == 200
    sched.learn_capacity(t.backend)  # what a round does after reading the engine
    assert sched.candidate(t, 0).kv_free_tokens == 200
    lease.first_byte()
    sched.learn_capacity(t.backend)
    assert sched.candidate(t, 0).kv_free_tokens == 800


def test_a_cache_hit_takes_its_cached_blocks_unless_a_request_there_holds_them() -> None:
    """vLLM's usage counts the blocks of running requests: a cached prefix no running request
    holds is free there, and held once a prompt using it runs. The first request predicted to
    find a 1,000-token system prompt cached takes its whole prompt from the room (1,600 ->
    500, not 1,500); a second one with the same root while the first is in flight takes only
    its uncached tokens; after both ended, a third takes its whole prompt again."""
    from pharos.prefix import chain

    url = "http://v"
    sched, state, clock = fleet({url: (vllm(0.0), BackendSpec(url=url, kind="vllm",
                                                                capacity=8))})
    clock.pump([1.0] * 6)
    (t,) = state.targets
    system = {"role": "system", "content": "s" * 4000}

    def hit(n: int) -> SchedRequest:
        ch = chain("m", [system, {"role": "user", "content": f"{n}" * 400}], None, None)
        return SchedRequest("m", 1100, n, chain=ch)

    first = hit(1)
    sched.index.record(first.chain.keys[:1], t.id, t.gen, clock.seconds())
    assert sched.candidate(t, 0).kv_free_tokens == 1600
    a = granted(sched.acquire("k", 1, first))
    assert 900 <= a.predicted_tokens < 1100
    assert sched.candidate(t, 0).kv_free_tokens == 1600 - 1100
    b = granted(sched.acquire("k", 1, hit(2)))
    assert sched.candidate(t, 0).kv_free_tokens == 1600 - 1100 - (1100 - b.predicted_tokens)
    for lease in (a, b):
        lease.first_byte()
        lease.release()
    sched.learn_capacity(t.backend)
    granted(sched.acquire("k", 1, hit(3)))
    assert sched.candidate(t, 0).kv_free_tokens == 1600 - 1100


def test_a_request_that_ended_gives_its_room_back_before_the_next_round() -> None:
    """A request sent and ended within a round leaves no KV behind (vLLM frees its blocks;
    the next round's usage will not show them): the room is back at once. One that had its
    first byte before a round is counted by that round's usage: its end gives that room
    back until the next round reads the usage again. Without these, the hits on a shared
    system prompt (its whole 500 tokens counted, as no other request held it) filled a small
    pool's room within a round and the holders were priced as full."""
    url = "http://v"
    sched, state, clock = fleet({url: (vllm(0.5), BackendSpec(url=url, kind="vllm",
                                                                capacity=8))})
    clock.pump([1.0] * 6)
    (t,) = state.targets
    assert sched.candidate(t, 0).kv_free_tokens == 800
    a = granted(sched.acquire("k", 1, SchedRequest("m", 600, 1)))
    b = granted(sched.acquire("k", 1, SchedRequest("m", 100, 2)))
    assert sched.candidate(t, 0).kv_free_tokens == 100
    a.first_byte()
    a.release()
    assert sched.candidate(t, 0).kv_free_tokens == 700  # a's 600 back; b's 100 still out
    b.first_byte()
    sched.learn_capacity(t.backend)  # a round: the engine's usage counts b from now on
    assert sched.candidate(t, 0).kv_free_tokens == 800
    b.release()
    assert sched.candidate(t, 0).kv_free_tokens == 900  # the round's usage showed b's 100
    sched.learn_capacity(t.backend)  # a usage read after b ended: nothing of b in it
    assert sched.candidate(t, 0).kv_free_tokens == 800
    c = granted(sched.acquire("k", 1, SchedRequest("m", 300, 3)))
    sched.learn_capacity(t.backend)  # c has no first byte: still counted after the round
    assert sched.candidate(t, 0).kv_free_tokens == 500
    c.release()  # ended without a first byte (an error): its room is back too
    assert sched.candidate(t, 0).kv_free_tokens == 800


def test_an_ended_request_leaves_its_root_to_another_request_with_it() -> None:
    """Two requests with the same 1,000-token system prompt running at a round whose usage
    shows them (1,200 of a 1,600-token pool: the root once, each one's own 100): the first
    to end gives back only its own 100 tokens (the other still holds the root's blocks), the
    last the rest, root included, so the room is the whole pool they left; the next round's
    usage is the truth again."""
    from pharos.prefix import chain

    url = "http://v"
    sched, state, clock = fleet({url: (vllm(0.75), BackendSpec(url=url, kind="vllm",
                                                                 capacity=8))})
    clock.pump([1.0] * 6)
    (t,) = state.targets
    system = {"role": "system", "content": "s" * 4000}

    def req(n: int) -> SchedRequest:
        ch = chain("m", [system, {"role": "user", "content": f"{n}" * 400}], None, None)
        return SchedRequest("m", 1100, n, chain=ch)

    first = req(1)
    sched.index.record(first.chain.keys[:1], t.id, t.gen, clock.seconds())
    a = granted(sched.acquire("k", 1, first))  # no request there holds the root: 1,100
    b = granted(sched.acquire("k", 1, req(2)))  # the root in flight there: its own 100
    root = first.chain.ends[0] // 4
    assert (a.kv_tokens, b.kv_tokens) == (1100, 1100 - root) and root == 1000
    for lease in (a, b):
        lease.first_byte()
    sched.learn_capacity(t.backend)  # the round's usage (75 %) holds both
    assert sched.candidate(t, 0).kv_free_tokens == 400
    a.release()
    assert sched.candidate(t, 0).kv_free_tokens == 500
    b.release()
    assert sched.candidate(t, 0).kv_free_tokens == 1600
    sched.learn_capacity(t.backend)
    assert sched.candidate(t, 0).kv_free_tokens == 400


def test_usage_held_at_rest_is_cache_fill_and_says_no_room() -> None:
    """An engine reporting 99 % KV usage with nothing running, queued or in flight counts its
    cache's fill (evictable blocks), not blocks running requests hold: its room is unknown
    from then on, never 16 tokens; vLLM's own count at rest (0) and a busy engine's high
    usage leave the room known."""
    url = "http://v"
    for kv, running, counts_cache in ((0.99, 0, True), (0.0, 0, False), (0.99, 3, False)):
        sched, state, clock = fleet({url: (vllm(kv, running),
                                           BackendSpec(url=url, kind="vllm", capacity=8))})
        clock.pump([1.0] * 6)
        (t,) = state.targets
        sched.learn_capacity(t.backend)  # what a round does after reading the engine
        assert t.kv_counts_cache is counts_cache
        room = sched.candidate(t, 0).kv_free_tokens
        assert room is None if counts_cache else room == int((1 - kv) * 1600)


def test_no_pool_no_room() -> None:
    """Without a pool (an engine that does not say) the room is unknown, never 0."""
    url = "http://v"
    engine = vllm(0.5)
    answer = engine.answers["/metrics"]
    assert isinstance(answer, tuple)
    body = answer[1]
    engine.answers["/metrics"] = (200, b"\n".join(
        line for line in body.split(b"\n") if b"cache_config_info" not in line))
    sched, state, clock = fleet({url: (engine, BackendSpec(url=url, kind="vllm"))})
    clock.pump([1.0] * 6)
    (t,) = state.targets
    assert sched.candidate(t, 0).kv_free_tokens is None


def test_a_malformed_pool_is_a_probe_error() -> None:
    """Block counts that are not counts are a probe error, never a pool."""
    from pharos.engine.library import _vllm_kv_pool
    from pharos.engine.probes import ProbeError

    with pytest.raises(ProbeError, match="num_gpu_blocks"):
        _vllm_kv_pool(b'vllm:cache_config_info{block_size="x",num_gpu_blocks="8"} 1.0\n')
    assert _vllm_kv_pool(b"vllm:num_requests_running 0\n").load == {}
