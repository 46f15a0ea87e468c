"""Layer 1: the log follower under a backend's scraper, on a Clock: log values in a snapshot
of their own, used only where no scraped probe knows the signal, unknown while the feed is
down, reconnected with backoff; a line that turns a model cold bumps its generation."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet.defer import Deferred
from twisted.logger import ILogObserver, globalLogPublisher
from zope.interface import implementer

from pharos.config import Backend as BackendSpec
from pharos.config import parse_config
from pharos.discovery.feed import LogFeed, OnLine
from pharos.engine.signals import Load, Residency, Snapshot
from pharos.state.logs import BACKOFF_MAX, LogFollower, overlay
from pharos.state.registry import View, with_log
from pharos.state.state import State
from tests.support.state import make, ollama

URL = "http://a:1"
SERVER_CONFIG = (b'time=2026-09-29T10:00:00.000Z level=INFO source=routes.go:1 msg="server '
                 b'config" env="map[OLLAMA_HOST:http://0.0.0.0:11434 OLLAMA_NUM_PARALLEL:4 '
                 b'OLLAMA_ORIGINS:[]]"')


class FakeFeed:
    """A log feed the test drives: it pushes lines, ends the feed, or refuses connects."""

    def __init__(self) -> None:
        self.on_line: OnLine | None = None
        self.d: Deferred[None] | None = None
        self.connects: list[float] = []
        self.refuse = False
        self.clock: Any = None

    def connect(self, on_line: OnLine) -> Deferred[None]:
        self.connects.append(self.clock.seconds() if self.clock else 0.0)
        if self.refuse:
            self.on_line = None
            return _failed("no such file")
        self.on_line = on_line
        self.d = Deferred(lambda _: setattr(self, "on_line", None))
        return self.d

    def describe(self) -> str:
        return "fake://engine"

    def line(self, data: bytes) -> None:
        assert self.on_line is not None, "not connected"
        self.on_line(data)

    def end(self) -> None:
        assert self.d is not None
        d, self.d, self.on_line = self.d, None, None
        d.errback(ConnectionError("stream closed"))


def _failed(why: str) -> Deferred[None]:
    d: Deferred[None] = Deferred()
    d.errback(FileNotFoundError(why))
    return d


def rig(spec: BackendSpec, feed: FakeFeed) -> tuple[State, Any, Any]:
    """A state with one Ollama-like backend whose log feed is ``feed``, first round run."""
    state, clock, _ = make({spec.url: ollama()})
    feed.clock = clock
    checked: LogFeed = feed
    state.log_feed_for = lambda s: checked if s.logs is not None else None
    state.set_backends([spec])
    state.service.startService()
    clock.advance(0.5)  # the first round resolves the plan and starts the follower
    return state, clock, state.backends[spec.url]


def with_feed(**kw: Any) -> BackendSpec:
    cfg = parse_config(f"""
backends:
  - url: {URL}
    kind: ollama
    logs: file:///var/log/ollama.log
""")
    return dataclasses.replace(cfg.backends[0], **kw)


@pytest.fixture
def warnings() -> Iterator[list[dict[str, Any]]]:
    """Every warning-or-worse log event while the test runs."""
    seen: list[dict[str, Any]] = []

    @implementer(ILogObserver)
    def observe(event: dict[str, Any]) -> None:
        level = event.get("log_level")
        if level is not None and level.name in ("warn", "error", "critical"):
            seen.append(event)

    globalLogPublisher.addObserver(observe)
    yield seen
    globalLogPublisher.removeObserver(observe)


def test_capacity_from_the_log_and_unknown_while_the_feed_is_down() -> None:
    """An Ollama backend with a feed keeps its log probe; the server config line gives
    capacity 4 (the view says it came from the log); when the feed drops, capacity is unknown
    (not 0) until a reconnect reads the line again."""
    feed = FakeFeed()
    state, clock, b = rig(with_feed(), feed)
    assert b.plan is not None
    assert [p.name for p in b.plan.log_probes] == ["ollama-log-num-parallel"]
    t = state.target_of(b, "a")
    assert t is not None
    assert state.view(t).capacity is None  # no line yet
    feed.line(b"some other line")
    feed.line(SERVER_CONFIG)
    v = state.view(t)
    assert v.capacity == 4 and v.from_log == frozenset({"capacity"})
    assert b.log is not None and b.log.sources == {
        next(iter(b.log.sources)): "ollama-log-num-parallel"}
    clock.advance(10.0)  # log values do not go stale with the scrape interval
    assert state.view(t).capacity == 4
    feed.end()
    assert state.view(t).capacity is None and b.log is None
    clock.advance(1.0)  # reconnect after 1 s: the file is read from its start again
    assert len(feed.connects) == 2
    feed.line(SERVER_CONFIG)
    assert state.view(t).capacity == 4
    state.service.stopService()
    assert b.log is None and feed.on_line is None


def test_reconnect_backoff_doubles_to_30_seconds_and_resets_on_a_line() -> None:
    """A feed that keeps failing is retried after 1, 2, 4, 8, 16, 30, 30 s; once lines flow
    again the next loss is retried after 1 s."""
    feed = FakeFeed()
    state, clock, b = rig(with_feed(), feed)
    feed.refuse = True
    lost_at = clock.seconds()
    feed.end()
    for _ in range(240):
        clock.advance(0.5)
    times = [lost_at, *feed.connects[1:]]
    gaps = [y - x for x, y in itertools.pairwise(times)]
    assert gaps[:7] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    feed.refuse = False
    clock.advance(BACKOFF_MAX)
    assert feed.on_line is not None
    feed.line(b"hello")
    n = len(feed.connects)
    feed.end()
    clock.advance(1.0)
    assert len(feed.connects) == n + 1
    state.service.stopService()
    assert clock.getDelayedCalls() == [] or all(
        not c.active() for c in clock.getDelayedCalls())


def test_a_log_line_that_turns_a_model_cold_bumps_its_generation() -> None:
    """An own residency log probe from config: a "loaded" line makes the model loaded in the
    view (from the log); a later "unloaded" line makes it cold and bumps the target's gen."""
    cfg = parse_config(f"""
backends:
  - url: {URL}
    kind: ollama
    logs: file:///var/log/ollama.log
    probes:
      - name: my-residency
        signal: residency
        log: {{match: 'model (?P<model>\\S+) (?P<value>loaded|cold)'}}
""")
    feed = FakeFeed()
    state, clock, b = rig(cfg.backends[0], feed)
    assert b.plan is not None
    assert [p.name for p in b.plan.log_probes] == ["my-residency", "ollama-log-num-parallel"]
    t = state.target_of(b, "a")
    assert t is not None
    assert state.view(t).residency is Residency.UNKNOWN  # the own probe took the signal
    feed.line(b"model a loaded")
    v = state.view(t)
    assert v.residency is Residency.LOADED and "residency" in v.from_log
    gen = t.gen
    feed.line(b"model b cold")  # another model's line: a's generation stays
    assert t.gen == gen
    feed.line(b"model a cold")
    assert t.gen == gen + 1
    assert state.view(t).residency is Residency.COLD
    feed.line(b"model a cold")  # already cold: no second bump
    assert t.gen == gen + 1
    state.service.stopService()


def test_a_backend_without_a_feed_drops_its_log_probes() -> None:
    """No logs: in the spec: no follower, the log probe dropped with "no log feed"."""
    feed = FakeFeed()
    state, clock, b = rig(with_feed(logs=None), feed)
    assert b.plan is not None and b.plan.log_probes == ()
    reasons = {d.probe.name: d.reason for d in b.plan.dropped}
    assert reasons["ollama-log-num-parallel"] == "no log feed"
    assert feed.connects == []
    state.service.stopService()


def test_invalid_utf8_is_logged_once_and_lines_after_it_count(
        warnings: list[dict[str, Any]]) -> None:
    """Lines that are not UTF-8 are warned about once (not their content) and the lines after
    them still set values."""
    feed = FakeFeed()
    state, clock, b = rig(with_feed(), feed)
    for _ in range(3):
        feed.line(b"\xff\xfe secret \xc3")
    feed.line(SERVER_CONFIG)
    utf8 = [w for w in warnings if "UTF-8" in w.get("log_format", "")]
    assert len(utf8) == 1
    assert all(b"secret" not in repr(w).encode() for w in warnings)
    t = state.target_of(b, "a")
    assert t is not None and state.view(t).capacity == 4
    state.service.stopService()


def test_a_removed_backend_stops_following() -> None:
    """Removing the backend stops its follower (the feed is cancelled, values gone)."""
    feed = FakeFeed()
    state, clock, b = rig(with_feed(), feed)
    feed.line(SERVER_CONFIG)
    state.set_backends([])
    assert feed.on_line is None and b.log is None
    state.service.stopService()


def _view(**kw: Any) -> View:
    base: dict[str, Any] = dict(up=True, residency=Residency.UNKNOWN, running=None,
                                waiting=None, capacity=None, kv_usage=None,
                                kv_pool_tokens=None, size_bytes=None, vram_bytes=None,
                                load_fresh=True)
    return View(**{**base, **kw})


def test_log_values_fill_only_what_no_scraped_probe_knows() -> None:
    """A scraped value wins over the log's; the log fills the unknown ones, per model (a
    model's own entry before the whole backend's), and names what it filled."""
    log = Snapshot(load={"": Load(capacity=4, running=1), "m": Load(running=2)},
                   residency={"m": Residency.LOADED})
    v = with_log(_view(capacity=8), log, "m")
    assert (v.capacity, v.running, v.residency) == (8, 2, Residency.LOADED)
    assert v.from_log == frozenset({"running", "residency"})
    v = with_log(_view(), log, "other")
    assert (v.capacity, v.running, v.residency) == (4, 1, Residency.UNKNOWN)
    assert with_log(_view(running=0), Snapshot(), "m") == _view(running=0)


def test_overlay_keeps_older_values_of_other_models() -> None:
    """A line's values cover only what it names: a residency line for one model keeps the
    others', a later capacity replaces the earlier one."""
    a = Snapshot(residency={"x": Residency.LOADED}, load={"": Load(capacity=2)},
                 sources={})
    b = overlay(a, Snapshot(residency={"y": Residency.COLD}, load={"": Load(capacity=4)}))
    assert b.residency == {"x": Residency.LOADED, "y": Residency.COLD}
    assert b.load[""].capacity == 4


def test_follower_ignores_lines_after_it_stopped() -> None:
    """A line delivered after stop (a feed still emptying its buffer) sets nothing."""
    feed = FakeFeed()
    state, clock, b = rig(with_feed(), feed)
    on_line = feed.on_line
    follower = next(iter(state._scrapers[URL]))
    assert isinstance(follower, LogFollower)
    state.service.stopService()
    assert on_line is not None
    on_line(SERVER_CONFIG)
    assert b.log is None
