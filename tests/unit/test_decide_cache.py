"""Layer 1: the kept views, up-target lists and candidates a decision reads are always what
building them afresh gives: across published rounds, failed rounds, feedback, leases, peers'
gauges, ejections, removed backends, restored stats and the clock crossing every staleness
boundary (issue 10 item 6 keeps them to decide in 100 µs)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from pharos.config import Backend as BackendSpec
from pharos.engine.fetch import Fetched, FetchError
from pharos.policy import Candidate, PolicyConfig
from pharos.prefix import chain
from pharos.sched import (
    Lease,
    RouteSettings,
    SchedRequest,
    Scheduler,
    Unavailable,
    UnknownModel,
    with_match,
)
from pharos.state.registry import STALE_AFTER_INTERVALS, Target, view_of
from pharos.state.state import State
from pharos.state.stats import Sample


class Engine:
    """A vLLM's pages whose counts and failure the test changes between rounds."""

    def __init__(self, rng: random.Random) -> None:
        self.running, self.waiting, self.kv = rng.randint(0, 8), 0, round(rng.random(), 2)
        self.failing = False

    def fetch(self, path: str) -> Deferred[Fetched]:
        from twisted.internet.defer import fail, succeed

        if self.failing:
            return fail(FetchError("refused"))
        pages = {
            "/version": b'{"version":"0.32.0"}',
            "/v1/models": b'{"object":"list","data":[{"id":"m"}]}',
            "/metrics": (f'vllm:num_requests_running{{model_name="m"}} {self.running}\n'
                         f'vllm:num_requests_waiting{{model_name="m"}} {self.waiting}\n'
                         f'vllm:kv_cache_usage_perc{{model_name="m"}} {self.kv}\n'
                         'vllm:cache_config_info{block_size="16",engine="0",'
                         'num_gpu_blocks="512"} 1.0\n').encode(),
        }
        page = pages.get(path)
        return succeed(Fetched(200, "application/json", page) if page is not None
                       else Fetched(404, "text/plain", b"not found"))


def fresh_check(state: State, sched: Scheduler, req: SchedRequest) -> None:
    """Every kept answer equals the one built afresh (the caches are set aside for the
    reference and put back, so they keep aging across the steps)."""
    now = state.clock.seconds()
    kept_up, state._up = state._up, {}
    try:
        fresh_targets: list[Target] | str = sched.targets(req)
    except (UnknownModel, Unavailable) as e:
        fresh_targets = type(e).__name__
    state._up = kept_up
    try:
        targets: list[Target] | str = sched.targets(req)
    except (UnknownModel, Unavailable) as e:
        targets = type(e).__name__
    assert targets == fresh_targets
    queued = sched.queue.waiting_models.get(req.model, 0)
    for t in state.targets:
        view = state.view(t)
        assert view == view_of(t, now, state.load_interval, state.full_interval, state.is_up)
        cached = sched.candidate(t, queued, 7)
        kept_views, kept_cands = state._views, sched.cands.kept
        state._views, sched.cands.kept = {}, {}
        assert cached == sched.candidate(t, queued, 7)
        state._views, sched.cands.kept = kept_views, kept_cands
    if isinstance(targets, list):
        placed = sched.decide(req, targets)
        kept = state._views, sched.cands.kept, sched.cands.matched, sched.cands.fleets
        state._views, sched.cands.kept, sched.cands.matched, sched.cands.fleets = {}, {}, {}, {}
        again = sched.decide(req, targets)
        state._views, sched.cands.kept, sched.cands.matched, sched.cands.fleets = kept
        assert placed.candidates == again.candidates
        assert placed.cold == again.cold and placed.hot_owners == again.hot_owners
        assert placed.decision.target_id == again.decision.target_id


def edges(state: State) -> list[float]:
    """The moments some kept answer must change: each round's staleness boundaries and the
    end of each backend's replying window."""
    li, fi = state.load_interval, state.full_interval
    out = []
    for b in state.backends.values():
        for at, span in ((b.load_at, STALE_AFTER_INTERVALS * li),
                         (b.full_at, STALE_AFTER_INTERVALS * li),
                         (b.full_at, STALE_AFTER_INTERVALS * fi), (b.replied_at, 3 * li)):
            if at is not None:
                out.append(at + span)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_kept_answers_equal_fresh_ones_through_random_events(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A random run of rounds (some failing), leases taken, started and released with and
    without feedback, replies relayed, peers' gauges, ejections, a backend removed and back,
    restored stats, writes to the fields a candidate does not read, and clock steps that land
    on, just before and just after each staleness boundary: after every step the views, the
    up targets, each candidate and the decision (from the kept fleet: its 5 targets are kept
    as one here) equal the ones built afresh."""
    import pharos.sched.candidates

    monkeypatch.setattr(pharos.sched.candidates, "FLEET_MIN_TARGETS", 1)
    rng = random.Random(seed)
    clock = Clock()
    engines = {f"http://10.0.0.{i}:8000": Engine(rng) for i in range(5)}
    state = State(clock, None, rng=rng.random, fetcher_for=lambda spec: engines[spec.url])
    sched = Scheduler(state, RouteSettings(PolicyConfig()), seed=lambda: rng.getrandbits(63))
    specs = [BackendSpec(url=url, kind="vllm", capacity=rng.choice([None, 4]))
             for url in engines]
    state.set_backends(specs)
    state.service.startService()
    clock.pump([0.5] * 4)
    leases: list[Lease] = []
    system = {"role": "system", "content": "harbour pilot " * 200}
    for step in range(250):
        op = rng.randrange(12)
        url = rng.choice(list(engines))
        b = state.backends.get(url)
        if op == 0:
            clock.advance(rng.choice([0.0, 1e-9, 0.3, 1.0, 2.0]))
        elif op == 1:
            future = [e for e in edges(state) if e > clock.seconds()]
            if future:
                at = min(future) + rng.choice([-1e-9, 0.0, 1e-9, 1e-6])
                clock.advance(max(0.0, at - clock.seconds()))
        elif op == 2:
            engines[url].failing = not engines[url].failing
        elif op == 3:
            e = engines[url]
            e.running, e.waiting, e.kv = (rng.randint(0, 8), rng.choice([0, 0, 2]),
                                          round(rng.random(), 2))
        elif op == 4:
            msgs = [system, {"role": "user", "content": f"q{rng.randrange(5)}"}]
            req = SchedRequest("m", 900, rng.getrandbits(32), chain=chain("m", msgs, None, None))
            d = sched.acquire("k", 1, req)
            d.addCallbacks(leases.append, lambda f: None)
        elif op == 5 and leases:
            lease = leases.pop(rng.randrange(len(leases)))
            lease.first_byte()
            lease.touch()
            lease.release(rng.choice([None, Sample(ok=True, dispatched_cold=False,
                                                   ttft_sec=0.2, duration_sec=1.5,
                                                   prompt_tokens=900, cached_tokens=0)]))
        elif op == 6 and leases:
            rng.choice(leases).first_byte()
        elif op == 7 and b is not None:
            b.replied_at = clock.seconds() - rng.choice([0.0, 2.9, 3.5])
        elif op == 8:
            keys = {t.key: rng.randint(0, 3) for t in state.targets if rng.random() < 0.5}
            sched.merge_gauges("peer", {"inflight": keys, "waiting": {"m": rng.randint(0, 2)}},
                               clock.seconds())
        elif op == 9 and b is not None:
            if rng.random() < 0.5:
                state.eject(b)
            else:
                b.rounds += rng.choice([1, 20])
        elif op == 10:
            kept = [s for s in specs if s.url != url] if rng.random() < 0.5 else specs
            state.set_backends(kept)
        elif op == 11 and state.targets:
            t = rng.choice(state.targets)
            if rng.random() < 0.5:
                state.merge_stats([{"target": t.key, "service_sec": rng.uniform(1, 9),
                                    "prefill_sec_per_token": 0.001}])
            else:
                name = rng.choice(sorted(Target.QUIET))
                setattr(t, name, t.gen + 1 if name == "gen" else rng.choice([0, 3, True]))
        req = SchedRequest("m", 900, step, chain=chain("m", [system, {"role": "user",
                                                                      "content": "q1"}],
                                                       None, None))
        fresh_check(state, sched, req)
    state.service.stopService()


def test_a_decision_rebuilds_only_the_targets_written_since_the_last() -> None:
    """Over 64 targets, a decision after another with no write in between, or with a lease
    taken on one target (its in-flight count and KV written), takes the kept fleet instead of
    going over every target, and its candidates equal those of a full pass; a new waiter
    count ahead, a removed target or the clock past a round's staleness goes the full way."""
    clock = Clock()
    rng = random.Random(5)
    engines = {f"http://10.0.{i // 250}.{i % 250}:8000": Engine(rng) for i in range(64)}
    state = State(clock, None, rng=lambda: 0.5, fetcher_for=lambda spec: engines[spec.url])
    sched = Scheduler(state, RouteSettings(PolicyConfig()), seed=lambda: 7)
    state.set_backends([BackendSpec(url=url, kind="vllm", capacity=16) for url in engines])
    state.service.startService()
    clock.pump([0.5] * 4)
    state.service.stopService()
    system = {"role": "system", "content": "harbour pilot " * 200}
    ch = chain("m", [system, {"role": "user", "content": "q"}], None, None)
    for t in state.targets[::4]:
        sched.index.record(ch.keys[:1], t.id, t.gen, clock.seconds())
    req = SchedRequest("m", 900, 1, chain=ch)
    full_passes = []
    full_loop = sched.cands.full_loop

    def counted(*args: object) -> object:
        full_passes.append(1)
        return full_loop(*args)  # type: ignore[arg-type]

    sched.cands.full_loop = counted  # type: ignore[assignment,method-assign]

    def decide(full: bool) -> None:
        before = len(full_passes)
        placed = sched.decide(req, sched.targets(req))
        assert len(full_passes) - before == (1 if full else 0)
        kept = state._views, sched.cands.kept, sched.cands.matched, sched.cands.fleets
        state._views, sched.cands.kept, sched.cands.matched, sched.cands.fleets = {}, {}, {}, {}
        again = sched.decide(req, sched.targets(req))
        state._views, sched.cands.kept, sched.cands.matched, sched.cands.fleets = kept
        assert placed.candidates == again.candidates and placed.cold == again.cold
        assert placed.decision.target_id == again.decision.target_id

    decide(full=True)
    decide(full=False)
    t = state.targets[9]
    t.inflight += 3
    t.kv_sent_tokens += 500
    decide(full=False)
    assert next(c for c in sched.decide(req, sched.targets(req)).candidates
                if c.target_id == t.id).inflight == 3
    sched.queue.waiting_models["m"] = 2
    decide(full=True)
    decide(full=False)
    clock.advance(STALE_AFTER_INTERVALS * state.load_interval + 1.0)
    decide(full=True)
    state.set_backends([BackendSpec(url=url, kind="vllm", capacity=16)
                        for url in list(engines)[1:]])
    decide(full=True)
    decide(full=False)


def engines_of(engines: dict[str, Engine]) -> Callable[[BackendSpec], Engine]:
    """A ``fetcher_for`` over ``engines`` by URL."""
    return lambda spec: engines[spec.url]


def test_a_small_fleet_is_decided_by_the_full_pass() -> None:
    """A fleet of fewer than ``FLEET_MIN_TARGETS`` targets keeps no fleet: its scan and
    upkeep would cost more than the few kept-candidate tests it saves; one of that many
    does."""
    from pharos.sched import FLEET_MIN_TARGETS

    for n, kept in ((FLEET_MIN_TARGETS - 1, False), (FLEET_MIN_TARGETS, True)):
        clock = Clock()
        engines = {f"http://10.0.0.{i}:8000": Engine(random.Random(i)) for i in range(n)}
        state = State(clock, None, rng=lambda: 0.5, fetcher_for=engines_of(engines))
        sched = Scheduler(state, RouteSettings(PolicyConfig()), seed=lambda: 7)
        state.set_backends([BackendSpec(url=url, kind="vllm", capacity=16) for url in engines])
        state.service.startService()
        clock.pump([0.5] * 4)
        state.service.stopService()
        req = SchedRequest("m", 900, 1)
        sched.decide(req, sched.targets(req))
        assert (list(sched.cands.fleets) == [("m", None)]) is kept, n


def one_target(seed: int, running: int | None = None, capacity: int | None = None
               ) -> tuple[State, Clock, Target]:
    """A State with one vLLM double's target after two seconds of rounds (then stopped, so
    the test moves the clock alone)."""
    clock = Clock()
    engine = Engine(random.Random(seed))
    if running is not None:
        engine.running = running
    state = State(clock, None, rng=lambda: 0.5, fetcher_for=lambda spec: engine)
    state.set_backends([BackendSpec(url="http://e:1", kind="vllm", capacity=capacity)])
    state.service.startService()
    clock.pump([0.5] * 4)
    state.service.stopService()
    [t] = state.targets
    return state, clock, t


def test_a_view_expires_exactly_when_its_round_goes_stale() -> None:
    """A view kept from a fresh load round is served until the last moment the round is
    fresh and rebuilt (its load unknown) once it is not, with no write in between."""
    state, clock, t = one_target(1, running=3)
    b = t.backend
    assert b.load_at is not None
    kept = state.view(t)
    assert kept.running == 3 and state.view(t) is kept
    clock.advance(b.load_at + 3 * state.load_interval - clock.seconds() - 1e-6)
    assert state.view(t) is kept
    clock.advance(2e-6)
    assert state.view(t).running is None
    assert state.view(t) == view_of(t, clock.seconds(), state.load_interval,
                                    state.full_interval, state.is_up)


def test_writes_to_quiet_fields_change_no_candidate() -> None:
    """The target fields written without a new stamp (``Target.QUIET``) are read by neither
    the view nor the candidate: a candidate built after writing any of them equals the kept
    one (a new read of one must take it out of the list)."""
    state, clock, t = one_target(2)
    sched = Scheduler(state, RouteSettings(PolicyConfig()))
    for name in sorted(Target.QUIET):
        for value in (0, 7, True, False, None, 123.5):
            kept = sched.candidate(t, 1)
            setattr(t, name, value)
            assert sched.candidate(t, 1) is kept
            state._views, sched.cands.kept = {}, {}
            assert sched.candidate(t, 1) == kept, name


def test_with_match_copies_every_field() -> None:
    """``with_match`` is ``dataclasses.replace(c, matched_tokens=...)``: every other field,
    whatever its value, is carried over."""
    values: dict[str, object] = {}
    for i, f in enumerate(dataclasses.fields(Candidate)):
        # A distinct value of each field's type (a compiled Candidate checks the types).
        values[f.name] = {"warm": True, "fits_if_cold": False, "loading": True,
                          "kv_usage": 0.25, "victims": ("a", "b"), "load_basis": "basis",
                          "held": "held", "prefill_model": (0.5, 0.25, 0.125),
                          "capacity_open": True}.get(f.name, i + 1)
    c = Candidate(**values)  # type: ignore[arg-type]
    assert with_match(c, 999) == dataclasses.replace(c, matched_tokens=999)


def test_a_write_no_view_reads_keeps_the_view() -> None:
    """A dispatch's writes (in-flight, KV sent, queued prefill) keep the target's view (the
    same object: the next decision rebuilds the candidate alone), and so does a write of any
    field outside ``Target.VIEWED``: each leaves the kept view equal to a fresh one. A write
    the view reads gives a new one."""
    state, clock, t = one_target(4)
    now = clock.seconds()

    def fresh() -> object:
        return view_of(t, now, state.load_interval, state.full_interval, state.is_up)

    kept = state.view(t)
    for i, f in enumerate(dataclasses.fields(Target)):
        if f.name in Target.VIEWED or f.name == "stats":
            continue
        before = t.stamp
        setattr(t, f.name, True if f.type in ("bool", bool) else i + 7)
        assert state.view(t) is kept and kept == fresh(), f.name
        if f.name not in Target.QUIET:
            assert t.stamp > before, f.name  # the candidate is rebuilt
    t.last_release_at = now
    assert state.view(t) is not kept and state.view(t) == fresh()


def test_up_follows_rounds_and_replies_once_the_full_round_is_old() -> None:
    """Once a backend's full round is stale in time, its kept view's ``up`` follows the
    count of rounds since, and then the replies (``replied_at``, written per relayed chunk
    without a new stamp), as a fresh view does; the up-target list too."""
    state, clock, t = one_target(3)
    b = t.backend

    def check(up: bool) -> None:
        fresh = view_of(t, clock.seconds(), state.load_interval, state.full_interval,
                        state.is_up)
        assert state.view(t) == fresh and fresh.up is up
        assert state.targets_for("m") == ([t] if up else [])

    clock.advance(30.0)  # no round ran: up on the count of rounds
    check(True)
    b.rounds += 20
    check(False)
    b.replied_at = clock.seconds()
    check(True)
    clock.advance(3 * state.load_interval)
    check(True)
    clock.advance(1e-6)
    check(False)


def test_a_matched_candidate_is_kept_while_its_candidate_and_match_are() -> None:
    """A target's candidate with a prefix match is served again (the same object) while its
    candidate without the match and the matched tokens are unchanged, and is built anew,
    equal to ``with_match`` of the current candidate, when either changes."""
    state, clock, t = one_target(4, capacity=4)
    sched = Scheduler(state, RouteSettings(PolicyConfig()))
    system = {"role": "system", "content": "harbour pilot " * 200}
    ch = chain("m", [system, {"role": "user", "content": "q " * 100}], None, None)
    sched.index.record(ch.keys[:1], t.id, t.gen, clock.seconds())
    req = SchedRequest("m", 900, 1, chain=ch)

    def matched() -> Candidate:
        [c] = sched.decide(req, [t]).candidates
        assert c.matched_tokens > 0
        return c

    first = matched()
    assert matched() is first
    assert first == with_match(sched.candidate(t, 0), first.matched_tokens)
    sched.index.record(ch.keys, t.id, t.gen, clock.seconds())  # a longer match
    longer = matched()
    assert longer.matched_tokens > first.matched_tokens
    assert longer == with_match(sched.candidate(t, 0), longer.matched_tokens)
    state.merge_stats([{"target": t.key, "service_sec": 3.0, "prefill_sec_per_token": 0.002}])
    changed = matched()
    assert changed is not longer and changed.service_sec == 3.0
    assert changed == with_match(sched.candidate(t, 0), changed.matched_tokens)
