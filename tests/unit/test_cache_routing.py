"""Layer 1: cache-aware routing in the scheduler (spec §6, §7): predictions from the prefix
index enter the cost, replies teach the index (record, correct, forget) and are counted by
outcome, and the guards (bounded load, hot-prefix spreading, session affinity) hold."""

from __future__ import annotations

from collections import Counter

from pharos.config import Backend as BackendSpec
from pharos.policy import (
    BOUNDED_LOAD_MIN_INFLIGHT,
    SET_ASIDE_BOUNDED_LOAD,
    Candidate,
    PolicyConfig,
    RouteReq,
    pick,
)
from pharos.reasons import deciding_term
from pharos.sched import Scheduler
from pharos.state.state import State
from pharos.state.stats import Sample
from tests.support.cache_routing import SYSTEM, chat, ok
from tests.support.plan import FakeBackend
from tests.support.sched import fleet, granted, llamacpp


def three(slots: int = 4) -> tuple[Scheduler, State]:
    sched, state, _ = fleet({
        f"http://{h}:1": (llamacpp(slots=slots), BackendSpec(url=f"http://{h}:1",
                                                             kind="llamacpp"))
        for h in "abc"
    })
    return sched, state


def test_a_recorded_prefix_wins_the_next_request() -> None:
    """After a success on one target, the next request sharing its system prompt is predicted
    there and the cost sends it there for its cache."""
    sched, _ = three()
    first = granted(sched.acquire("k", 1, chat("q1")))
    assert first.predicted_tokens == 0
    ok(first, cached=0)
    second = granted(sched.acquire("k", 1, chat("q2", seed=7)))
    assert second.target is first.target
    assert second.predicted_tokens >= len(SYSTEM) // 4
    assert second.decision.why == "cache"
    assert sched.outcomes == Counter({"miss": 1})


def test_nothing_is_recorded_before_the_reply_ends() -> None:
    """A request in flight teaches nothing: a second one sent meanwhile has no prediction
    (engines cache per slot until the first request ends)."""
    sched, _ = three()
    granted(sched.acquire("k", 1, chat("q1")))
    second = granted(sched.acquire("k", 1, chat("q2", seed=3)))
    assert second.predicted_tokens == 0


def test_wrong_prediction_is_corrected() -> None:
    """An engine that cached far below the prediction makes the index drop that target: the
    next request has no prediction there."""
    sched, _ = three()
    ok(granted(sched.acquire("k", 1, chat("q1"))), cached=0)
    second = granted(sched.acquire("k", 1, chat("q2")))
    assert second.predicted_tokens > 0
    ok(second, cached=3)  # evicted
    assert sched.outcomes["wrong_prediction"] == 1
    assert sched.predictions[("local", "wrong_prediction")] == 1
    third = granted(sched.acquire("k", 1, chat("q3")))
    assert third.predicted_tokens == 0


def test_confirmed_prediction_counts_as_predicted_hit() -> None:
    """A prediction the engine confirms is a predicted_hit, by the slot's source."""
    sched, _ = three()
    ok(granted(sched.acquire("k", 1, chat("q1"))), cached=0)
    second = granted(sched.acquire("k", 1, chat("q2")))
    ok(second, cached=second.predicted_tokens)
    assert sched.predictions == Counter({("local", "predicted_hit"): 1})


def test_error_reply_forgets_the_prompt() -> None:
    """An error reply removes the prompt from that target, or a failing target would win the
    same prompt again by affinity."""
    sched, _ = three()
    ok(granted(sched.acquire("k", 1, chat("q1"))), cached=0)
    second = granted(sched.acquire("k", 1, chat("q1")))
    second.release(Sample(ok=False, dispatched_cold=False, ttft_sec=None, duration_sec=None))
    third = granted(sched.acquire("k", 1, chat("q1")))
    assert third.predicted_tokens == 0


def test_unknown_cached_tokens_still_record() -> None:
    """An engine that reports no cached tokens gives outcome unknown, and the prompt is still
    recorded (the index is a hint)."""
    sched, _ = three()
    ok(granted(sched.acquire("k", 1, chat("q1"))), cached=None)
    assert sched.outcomes == Counter({"unknown": 1})
    assert granted(sched.acquire("k", 1, chat("q2"))).predicted_tokens > 0


def test_a_burst_of_identical_requests_spreads() -> None:
    """Identical requests arriving together do not all land on one target: each decision sees
    the in-flight counts of the ones before."""
    sched, _ = three(slots=4)
    leases = [granted(sched.acquire("k", 1, chat("same", seed=i))) for i in range(6)]
    per = Counter(lease.target.id for lease in leases)
    assert len(per) == 3
    assert max(per.values()) == 2


def test_bounded_load_sets_an_overloaded_cache_holder_aside() -> None:
    """A target holding the whole prompt but already twice its share of in-flight requests is
    set aside; the cost policy picks another."""
    def cand(tid: int, inflight: int, matched: int) -> Candidate:
        return Candidate(target_id=tid, warm=None, capacity=8, free_slots=8 - inflight,
                         queue_ahead=0, kv_usage=0.1, matched_tokens=matched,
                         prefill_sec_per_token=0.001, load_sec=None, service_sec=2.0,
                         fits_if_cold=None, loading=False, inflight=inflight)

    cands = [cand(0, 4, 2000), cand(1, 0, 0), cand(2, 0, 0)]
    d = pick(RouteReq(2100, 1), cands, PolicyConfig())
    assert d.target_id != 0
    assert d.scores[0].set_aside == SET_ASIDE_BOUNDED_LOAD
    off = pick(RouteReq(2100, 1), cands, PolicyConfig(bounded_load_epsilon=None))
    assert off.target_id == 0
    assert deciding_term(off.scores, off.target_id) == "prefill"


def test_bounded_load_ignores_a_handful_in_flight_on_a_large_engine() -> None:
    """Four requests in flight on a 64-slot engine reach the bound (2 x 5 / 3, rounded up)
    but melt nothing: the prompt's only holder keeps it (sending it away was a miss, and a copy
    that pushed another prompt out of a small cache, W1). With 12 in flight, past
    BOUNDED_LOAD_MIN_INFLIGHT, the guard sets the holder aside again; the test above keeps it
    acting at half the slots of a small engine (4 of 8)."""
    def cand(tid: int, inflight: int, matched: int) -> Candidate:
        return Candidate(target_id=tid, warm=None, capacity=64, free_slots=64 - inflight,
                         queue_ahead=0, kv_usage=0.1, matched_tokens=matched,
                         prefill_sec_per_token=0.001, load_sec=None, service_sec=2.0,
                         fits_if_cold=None, loading=False, inflight=inflight)

    few = pick(RouteReq(2100, 1), [cand(0, 4, 2000), cand(1, 0, 0), cand(2, 0, 0)],
               PolicyConfig())
    assert few.target_id == 0
    assert few.scores[0].set_aside is None
    assert BOUNDED_LOAD_MIN_INFLIGHT <= 12
    many = pick(RouteReq(2100, 1), [cand(0, 12, 2000), cand(1, 0, 0), cand(2, 0, 0)],
                PolicyConfig())
    assert many.target_id != 0
    assert many.scores[0].set_aside == SET_ASIDE_BOUNDED_LOAD


def test_bounded_load_never_leaves_no_target() -> None:
    """When the only target under the bound cannot take the request, the guard steps back."""
    def cand(tid: int, inflight: int, fits: bool | None) -> Candidate:
        return Candidate(target_id=tid, warm=fits is None, capacity=8, free_slots=8 - inflight,
                         queue_ahead=0, kv_usage=None, matched_tokens=0,
                         prefill_sec_per_token=0.001, load_sec=5.0, service_sec=2.0,
                         fits_if_cold=fits, loading=False, inflight=inflight)

    d = pick(RouteReq(100, 1), [cand(0, 6, None), cand(1, 0, False)], PolicyConfig())
    assert d.target_id == 0


def test_session_goes_back_to_its_target() -> None:
    """A request naming its session returns to the session's last target even when another is
    less loaded, while that target has a free slot."""
    sched, _ = three(slots=4)
    first = granted(sched.acquire("k", 1, chat("hi", system="short", session=1)))
    others = [granted(sched.acquire("k", 1, chat("x", system="other", seed=i)))
              for i in range(2, 5)]
    again = granted(sched.acquire("k", 1, chat("more", system="short", seed=9, session=1)))
    assert again.target is first.target
    assert again.decision.reason.startswith("session affinity")
    assert len({o.target.id for o in others}) >= 2


def test_session_affinity_yields_to_a_full_target() -> None:
    """A session's target with no free slot does not hold the request: it goes elsewhere."""
    sched, _ = three(slots=1)
    first = granted(sched.acquire("k", 1, chat("hi", system="short", session=1)))
    again = granted(sched.acquire("k", 1, chat("more", system="short", seed=9, session=1)))
    assert again.target is not first.target


def test_hot_root_prefix_gets_a_second_owner() -> None:
    """A root prefix whose demand exceeds one target's share is priced as held by more than
    one target, so requests sharing it spread; a cool one keeps a single owner."""
    sched, state = three(slots=2)
    for t in state.targets:
        t.stats.service_sec.add(10.0)
    ok(granted(sched.acquire("k", 1, chat("q0"))), cached=0)
    holder = next(iter(sched.index.lookup(chat("q").chain, sched.learning.gen)))
    cool = sched.decide(chat("qa"), sched.targets(chat("qa")))
    assert cool.hot_owners == frozenset()
    leases = [granted(sched.acquire("k", 1, chat(f"q{i}", seed=i))) for i in range(1, 5)]
    placed = sched.decide(chat("qz"), sched.targets(chat("qz")))
    assert placed.hot_owners and holder not in placed.hot_owners
    assert len({lease.target.id for lease in leases}) >= 2


def test_queued_prefill_is_waited_for() -> None:
    """A target with prefill already queued (requests without a first byte) costs that much
    wait even with free slots; the queue drains at the first byte or, failing that, at
    release."""
    sched, _ = three(slots=8)
    first = granted(sched.acquire("k", 1, chat("q1")))
    t = first.target
    assert first.prefill_sec > 0 and t.queued_prefill == first.prefill_sec
    second = granted(sched.acquire("k", 1, chat("q2", system="another system prompt " * 300)))
    assert second.target is not t  # the first one's prefill is still queued there
    placed = sched.decide(chat("q3"), sched.targets(chat("q3")))
    waits = {s.target_id: s.wait for s in placed.decision.scores}
    assert waits[t.id] == first.prefill_sec
    first.first_byte()
    assert t.queued_prefill == 0 and t.unstarted == 0
    ok(first, cached=0)
    assert t.queued_prefill == 0
    second.release(None)
    assert second.target.queued_prefill == 0 and second.target.unstarted == 0


def test_shared_cache_engines_learn_at_the_first_byte() -> None:
    """On a vLLM target the prompt is recorded at the reply's first byte (its cache serves
    other requests from then on); on llama.cpp only when the reply ends."""
    vllm = FakeBackend({
        "/version": (200, b'{"version":"0.32.0"}'),
        "/v1/models": (200, b'{"data":[{"id":"m"}]}'),
        "/metrics": (200, b'vllm:num_requests_running{model_name="m"} 0\n'
                     b'vllm:num_requests_waiting{model_name="m"} 0\n'),
    })
    for kind, fake, at_first_byte in (("vllm", vllm, True), ("llamacpp", llamacpp(4), False)):
        sched, state, _ = fleet({
            "http://a:1": (fake, BackendSpec(url="http://a:1", kind=kind, capacity=4)),  # type: ignore[arg-type]
        })
        lease = granted(sched.acquire("k", 1, chat("q1")))
        assert lease.target.backend.kind == kind
        lease.first_byte()
        assert bool(sched.index.lookup(chat("q").chain, sched.learning.gen)) is at_first_byte, kind
