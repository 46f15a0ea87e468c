"""A State over in-memory backends on a Clock."""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.task import Clock

from pharos.config import Backend as BackendSpec
from pharos.engine.fetch import Fetcher
from pharos.state.state import State
from tests.support.plan import FakeBackend

TAGS = b'{"models":[{"name":"a","size":10},{"name":"b","size":20}]}'


def ollama(ps: bytes = b'{"models":[{"name":"a","size_vram":5}]}',
           version: bytes = b"0.32.15") -> FakeBackend:
    return FakeBackend({
        "/api/version": (200, b'{"version":"%s"}' % version),
        "/v1/models": (200, b'{"data":[{"id":"a"},{"id":"b"}]}'),
        "/api/ps": (200, ps),
        "/api/tags": (200, TAGS),
    })


def make(backends: dict[str, FakeBackend], rng: Callable[[], float] = lambda: 0.5,
         ) -> tuple[State, Clock, list[str]]:
    clock = Clock()
    rounds: list[str] = []

    def fetcher_for(spec: BackendSpec) -> Fetcher:
        return backends[spec.url]

    state = State(clock, None, rng=rng, fetcher_for=fetcher_for,
                  on_round=lambda b: rounds.append(b.url))
    return state, clock, rounds


def spec(url: str = "http://a:1", **kw: object) -> BackendSpec:
    return BackendSpec(url=url, kind="ollama", **kw)  # type: ignore[arg-type]
