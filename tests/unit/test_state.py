"""Layer 1: the state service on a Clock: scrape rounds, staleness, generations, backends
coming and going, readiness, feedback."""

from __future__ import annotations

from pharos.config import Backend as BackendSpec
from pharos.engine.fetch import FetchError
from pharos.engine.signals import Residency
from pharos.state.stats import Ewma, Sample, TargetStats, learn
from tests.support.plan import FakeBackend
from tests.support.state import make, ollama, spec


def test_first_round_at_random_offset_then_every_interval() -> None:
    """The first round starts at a random offset in [0, 1 s); later ones about every second."""
    fake = ollama()
    state, clock, rounds = make({"http://a:1": fake}, rng=lambda: 0.25)
    state.set_backends([spec()])
    state.service.startService()
    clock.advance(0.2)
    assert rounds == []
    clock.advance(0.1)
    assert rounds == ["http://a:1"]
    clock.advance(1.0)
    assert len(rounds) == 2
    state.service.stopService()


def test_full_round_every_fifth_and_load_rounds_between() -> None:
    """After the resolve, only load paths are asked, and every fifth round the whole plan."""
    fake = FakeBackend({
        "/version": (200, b'{"version":"0.32.0"}'),
        "/v1/models": (200, b'{"data":[{"id":"m"}]}'),
        "/metrics": (200, b'vllm:num_requests_running{model_name="m"} 1\n'),
    })
    state, clock, _ = make({"http://v:1": fake})
    state.set_backends([BackendSpec(url="http://v:1", kind="vllm")])
    state.service.startService()
    clock.advance(0.5)  # round 0: resolve
    fake.gets.clear()
    for _ in range(5):
        clock.advance(1.0)
    assert fake.gets["/metrics"] == 5
    assert fake.gets["/version"] == 1  # one full round among the five
    state.service.stopService()


def test_failure_is_recorded_and_the_loop_goes_on() -> None:
    """An unreachable backend is recorded as failing; the rounds continue and it comes back."""
    fake = ollama()
    state, clock, rounds = make({"http://a:1": fake})
    state.set_backends([spec()])
    state.service.startService()
    clock.advance(0.5)
    b = state.backends["http://a:1"]
    assert b.failing is None
    saved = dict(fake.answers)
    fake.answers = {p: FetchError("refused") for p in saved}
    for _ in range(5):
        clock.advance(1.0)
    assert b.failing is not None and "refused" in b.failing
    fake.answers = saved
    clock.advance(1.0)
    clock.advance(1.0)
    assert b.failing is None
    assert len(rounds) == 8
    state.service.stopService()


def test_a_backend_whose_replies_flow_is_not_taken_down_for_missed_scrapes() -> None:
    """Scrapes that fail while reply bytes keep arriving (an engine too busy to answer
    /metrics in time) leave it up, never ejected, past the views' staleness; once the replies
    stop too, it goes down within a few rounds."""
    fake = ollama()
    state, clock, _ = make({"http://a:1": fake})
    downs: list[str] = []
    state.on_down = lambda b, why: downs.append(b.url)
    state.set_backends([spec()])
    state.service.startService()
    clock.advance(0.5)
    b = state.backends["http://a:1"]
    fake.answers = {p: FetchError("timed out") for p in fake.answers}
    for _ in range(30):
        b.replied_at = clock.seconds()  # what a lease's touch does per relayed chunk
        clock.advance(1.0)
    assert b.failed_rounds >= 20 and not b.ejected and downs == []
    assert state.is_up(b)
    for _ in range(6):
        clock.advance(1.0)
    assert set(downs) == {"http://a:1"} and b.ejected and not state.is_up(b)
    state.service.stopService()


def test_views_go_stale_after_three_intervals() -> None:
    """A backend that stops answering keeps its last view only until it is stale."""
    fake = ollama()
    state, clock, _ = make({"http://a:1": fake})
    state.set_backends([spec()])
    state.service.startService()
    clock.advance(0.5)
    [a] = [t for t in state.targets if t.model == "a"]
    assert state.view(a).residency is Residency.LOADED
    assert state.view(a).up
    fake.answers = {p: FetchError("refused") for p in fake.answers}
    clock.pump([1.0] * 14)  # a reactor that runs its rounds
    assert state.view(a).residency is Residency.LOADED  # still within 3 full intervals
    clock.pump([1.0] * 2)
    v = state.view(a)
    assert v.residency is Residency.UNKNOWN
    assert not v.up
    assert state.targets_for("a") == []
    state.service.stopService()


def test_a_reactor_that_ran_no_rounds_leaves_the_backend_up() -> None:
    """Time that passed without rounds (the reactor held by a burst of clients) does not make
    a backend stale: it stays up until its rounds run and fail."""
    fake = ollama()
    state, clock, _ = make({"http://a:1": fake})
    state.set_backends([spec()])
    state.service.startService()
    clock.advance(0.5)
    b = state.backends["http://a:1"]
    clock.advance(30.0)  # one step: no round ran in between
    assert state.is_up(b)
    fake.answers = {p: FetchError("refused") for p in fake.answers}
    clock.pump([1.0] * 20)
    assert not state.is_up(b)
    state.service.stopService()


def test_generation_bumps_on_unload_unlist_and_new_version() -> None:
    """A model that goes cold, leaves the list, or a new engine version bumps generations."""
    fake = ollama()
    state, clock, _ = make({"http://a:1": fake})
    state.set_backends([spec()])
    state.service.startService()
    clock.advance(0.5)
    a, b = state.targets
    fake.answers["/api/ps"] = (200, b'{"models":[]}')
    for _ in range(5):
        clock.advance(1.0)
    assert (a.gen, b.gen) == (1, 0)  # a went cold; b was never loaded
    fake.answers["/v1/models"] = (200, b'{"data":[{"id":"a"}]}')
    for _ in range(5):
        clock.advance(1.0)
    assert b.gen == 1
    fake.answers["/api/version"] = (200, b'{"version":"0.33.3"}')
    for _ in range(10):
        clock.advance(1.0)
    assert (a.gen, b.gen) == (2, 2)
    state.service.stopService()


def test_backends_keep_state_and_ids_across_removal() -> None:
    """An unchanged backend keeps its state; one removed and re-added gets it back; target ids
    are stable and never reused."""
    fakes = {"http://a:1": ollama(), "http://b:1": ollama()}
    state, clock, _ = make(fakes)
    state.set_backends([spec("http://a:1"), spec("http://b:1")])
    state.service.startService()
    clock.advance(0.5)
    ids = {(t.backend.url, t.model): t.id for t in state.targets}
    old_a = state.backends["http://a:1"]
    state.set_backends([spec("http://b:1")])
    assert "http://a:1" not in state.backends
    assert all(t.backend.url != "http://a:1" for t in state.targets_for("a"))
    state.set_backends([spec("http://a:1"), spec("http://b:1")])
    assert state.backends["http://a:1"] is old_a
    clock.advance(1.0)
    assert {(t.backend.url, t.model): t.id for t in state.targets} == ids
    state.service.stopService()


def test_ready_once_the_first_set_finished_a_round() -> None:
    """Readiness latches when every backend of the first set has had a round, failing or not."""
    fakes = {"http://a:1": ollama(), "http://b:1": FakeBackend({})}
    fakes["http://b:1"].answers = {p: FetchError("refused") for p in
                                   ("/api/version", "/v1/models", "/api/ps", "/api/tags")}
    state, clock, _ = make(fakes)
    ready = state.when_ready()
    state.set_backends([spec("http://a:1"), spec("http://b:1")])
    state.service.startService()
    assert not ready.called
    clock.advance(0.6)
    assert ready.called and state.ready
    state.service.stopService()


def test_reply_marks_model_loaded_until_the_next_full_round() -> None:
    """A successful reply shows a cold model loaded until a full round has the last word."""
    fake = ollama(ps=b'{"models":[]}')
    state, clock, _ = make({"http://a:1": fake})
    state.set_backends([spec()])
    state.service.startService()
    clock.advance(0.5)
    a = state.targets[0]
    assert state.view(a).residency is Residency.COLD
    clock.advance(1.0)
    state.feedback(a, Sample(ok=True, dispatched_cold=True, ttft_sec=2.0, duration_sec=3.0))
    assert state.view(a).residency is Residency.LOADED
    for _ in range(4):
        clock.advance(1.0)
    assert state.view(a).residency is Residency.COLD  # the full round says it is cold again
    state.service.stopService()


def test_eject_until_next_answered_round() -> None:
    """An ejected backend is down until its next answered round."""
    state, clock, _ = make({"http://a:1": ollama()})
    state.set_backends([spec()])
    state.service.startService()
    clock.advance(0.5)
    b = state.backends["http://a:1"]
    state.eject(b)
    assert state.targets_for("a") == []
    clock.advance(1.0)
    assert [t.model for t in state.targets_for("a")] == ["a"]
    state.service.stopService()


def test_aliases_rename_models_to_client_names() -> None:
    """Targets carry the client's name; the engine's name is kept for the forwarded body."""
    state, clock, _ = make({"http://a:1": ollama()})
    state.set_backends([spec(aliases={"a": "small"})])
    state.service.startService()
    clock.advance(0.5)
    [t] = state.targets_for("small")
    assert (t.model, t.served) == ("small", "a")
    assert state.view(t).residency is Residency.LOADED
    state.service.stopService()


def test_ewma_unknown_until_first_sample() -> None:
    """An EWMA with no samples is unknown, then follows its samples."""
    e = Ewma(alpha=0.5)
    assert e.value is None
    e.add(2.0)
    e.add(4.0)
    assert e.value == 3.0


def test_learning_rules() -> None:
    """Prefill needs ≥256 uncached tokens; a cold dispatch with a sub-10 ms engine load counts
    as warm; a control request and an error teach nothing."""
    s = TargetStats()
    learn(s, Sample(ok=True, dispatched_cold=False, ttft_sec=1.0, duration_sec=2.0,
                    prompt_tokens=1000, cached_tokens=900))
    assert s.prefill_sec_per_token.value is None  # only 100 uncached
    assert s.service_sec.value == 2.0
    learn(s, Sample(ok=True, dispatched_cold=False, ttft_sec=1.0, duration_sec=2.0,
                    prompt_tokens=1000, cached_tokens=0, prompt_eval_sec=0.5))
    assert s.prefill_sec_per_token.value == 0.0005
    paid = learn(s, Sample(ok=True, dispatched_cold=True, ttft_sec=0.2, duration_sec=1.0,
                           load_sec=0.001))
    assert not paid and s.load_sec.value is None
    paid = learn(s, Sample(ok=True, dispatched_cold=True, ttft_sec=3.0, duration_sec=4.0))
    assert paid and s.load_sec.value == 3.0
    before = (s.service_sec.samples, s.load_sec.samples)
    learn(s, Sample(ok=False, dispatched_cold=False, ttft_sec=1, duration_sec=1))
    learn(s, Sample(ok=True, dispatched_cold=True, ttft_sec=1, duration_sec=1, control=True))
    assert (s.service_sec.samples, s.load_sec.samples) == before


def test_prefill_speed_is_learned_from_the_window_after_the_prefills_ahead() -> None:
    """With the window measured from the end of the prefill ahead (``prefill_window_sec``), a
    TTFT that waited behind others teaches the speed of its own prefill; without one (a
    direct caller), the TTFT is used as before."""
    s = TargetStats()
    learn(s, Sample(ok=True, dispatched_cold=False, ttft_sec=3.0, duration_sec=4.0,
                    prompt_tokens=1000, cached_tokens=0, prefill_window_sec=1.0))
    assert s.prefill_sec_per_token.value == 0.001
    s = TargetStats()
    learn(s, Sample(ok=True, dispatched_cold=False, ttft_sec=3.0, duration_sec=4.0,
                    prompt_tokens=1000, cached_tokens=0))
    assert s.prefill_sec_per_token.value == 0.003
