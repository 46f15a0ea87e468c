"""Layer 1: a scrape's deadline measures the engine, not Pharos's reactor: a timeout that
fires on time fails the fetch; one that fires late (the reactor was busy) gives the reply as
long again, once, so an answer that arrived unread is taken."""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from pharos.engine.fetch import Fetched, FetchError, HTTPFetcher


def bounded(clock: Clock) -> tuple[Deferred[Fetched], list[Any]]:
    fetcher = HTTPFetcher("http://engine", None, clock, timeout=0.8)  # type: ignore[arg-type]
    inner: Deferred[Fetched] = Deferred()
    out: list[Any] = []
    fetcher._bounded(inner, 0.8).addBoth(out.append)
    return inner, out


def test_an_on_time_deadline_fails_the_fetch() -> None:
    """No answer within 0.8 s, the clock running on time: FetchError naming the timeout."""
    clock = Clock()
    _, out = bounded(clock)
    clock.advance(0.79)
    assert out == []
    clock.advance(0.01)
    assert len(out) == 1 and out[0].check(FetchError)
    assert "no answer within 0.8 s" in str(out[0].value)


def test_a_late_deadline_waits_once_for_what_arrived() -> None:
    """The reactor was stuck for 3 s: the deadline fires late, the answer that came in the
    meantime is taken; without an answer it fails after one more 0.8 s, not for ever."""
    clock = Clock()
    inner, out = bounded(clock)
    clock.advance(3.0)
    assert out == []
    inner.callback(Fetched(200, "text/plain", b"ok"))
    assert out and isinstance(out[0], Fetched)

    clock = Clock()
    _, out = bounded(clock)
    clock.advance(3.0)
    assert out == []
    clock.advance(0.8)
    assert len(out) == 1 and out[0].check(FetchError)
