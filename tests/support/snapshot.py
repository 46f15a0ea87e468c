"""Replicas filled with state, for the snapshot and state-file tests."""

from __future__ import annotations

from twisted.internet.task import Clock

from pharos.config import Backend as BackendSpec
from pharos.peer.snapshot import (
    Replicas,
)
from pharos.prefix import PrefixIndex, chain
from pharos.state.registry import BackendState, Target
from pharos.state.state import State
from pharos.state.stats import Sample, learn
from pharos.usage import Ledger, Reservation

NOW = 1_800_000_000.0
SECRET = "the-secret-prompt-text-7731"


def replicas(clock: Clock, origin: str = "a", models: tuple[str, ...] = ("m1", "m2"),
             capacity: int = 1000) -> tuple[Replicas, list[Target]]:
    """Replicas over a State with one backend's targets registered."""
    state = State(clock, None, fetcher_for=lambda spec: None)  # type: ignore[arg-type,return-value]
    backend = BackendState(BackendSpec(url="http://e:1", kind="ollama"))
    targets = [state.target(backend, m, m) for m in models]
    ledger = Ledger(clock, origin=origin, timezone="UTC")
    return Replicas(state, PrefixIndex(capacity), ledger), targets


def clock() -> Clock:
    c = Clock()
    c.advance(NOW)
    return c


def filled(c: Clock) -> tuple[Replicas, list[Target]]:
    r, targets = replicas(c)
    for i in range(40):
        msgs = [{"role": "system", "content": SECRET}, {"role": "user", "content": f"q{i}"}]
        ch = chain("m1", msgs, None, None)
        r.index.record(ch, targets[i % 2].id, 0, NOW - 100 + i)
    held = r.ledger.reserve("alice", "t", 10, None)
    assert isinstance(held, Reservation)
    r.ledger.settle(held, "m1", 7, 0, 3)
    learn_service(targets[0], 2.0)
    return r, targets


def learn_service(t: Target, sec: float) -> None:
    """One local sample of the target's request seconds."""
    learn(t.stats, Sample(ok=True, dispatched_cold=False, ttft_sec=0.1, duration_sec=sec))
