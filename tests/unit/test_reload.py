"""Layer 1: hot reload (spec §10): the config file is read again when it changes, on SIGHUP
and when asked; keys, tenants, backends, routing guards and timeouts apply live, other fields
wait for a restart, a bad file changes nothing."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from twisted.internet.task import Clock

from pharos.config import (
    Config,
    DecisionLogConfig,
    DrainConfig,
    Observability,
    OwnProbe,
    PromSpec,
    Reloaded,
    RoutingConfig,
    Timeouts,
    UsageConfig,
    file_name,
    load_config,
    reload_diff,
    with_live,
)
from pharos.engine.signals import Signal
from pharos.proxy.auth import digest
from pharos.reload import RELOAD_EVERY, ConfigWatcher, Sighup
from tests.support.state import make, ollama, spec

A, B = digest("phk-a"), digest("phk-b")


def write(path: Path, text: str, stamp: float) -> None:
    path.write_text(text)
    os.utime(path, (stamp, stamp))


def watcher(tmp_path: Path) -> tuple[ConfigWatcher, Path, list[Config], Clock]:
    path = tmp_path / "pharos.yaml"
    write(path, f"keys: [{{name: a, sha256: {A}}}]\n", 1000)
    applied: list[Config] = []
    clock = Clock()
    w = ConfigWatcher(str(path), load_config(path), applied.append, clock)
    w.startService()
    return w, path, applied, clock


def test_a_changed_key_set_applies_at_the_next_check(tmp_path: Path) -> None:
    """A new key appears within one interval of the file changing; nothing is applied while
    the file is unchanged."""
    w, path, applied, clock = watcher(tmp_path)
    clock.advance(RELOAD_EVERY)
    assert applied == []
    write(path, f"keys: [{{name: a, sha256: {A}}}, {{name: b, sha256: {B}}}]\n", 2000)
    clock.advance(RELOAD_EVERY)
    assert [k.name for k in applied[-1].keys] == ["a", "b"]
    assert w.current is applied[-1]
    w.stopService()


def test_a_bad_file_keeps_the_running_config(tmp_path: Path) -> None:
    """A file that does not parse is not applied (the running config stays), and a later
    good version is."""
    w, path, applied, clock = watcher(tmp_path)
    before = w.current
    write(path, "keys: [{name: a}]\n", 2000)
    clock.advance(RELOAD_EVERY)
    assert applied == [] and w.current is before
    write(path, f"keys: [{{name: c, sha256: {B}}}]\n", 3000)
    clock.advance(RELOAD_EVERY)
    assert [k.name for k in applied[-1].keys] == ["c"]
    w.stopService()


def test_fields_that_need_a_restart_are_not_applied(tmp_path: Path) -> None:
    """A changed listen is left as it runs; the key and policy changes beside it apply (the
    policy is live since issue 17)."""
    w, path, applied, clock = watcher(tmp_path)
    write(path, f"listen: 127.0.0.1:9999\npolicy: least-load\n"
                f"keys: [{{name: b, sha256: {B}}}]\n", 2000)
    clock.advance(RELOAD_EVERY)
    (new,) = applied
    assert [k.name for k in new.keys] == ["b"]
    assert new.listen == Config().listen and new.policy == "least-load"
    write(path, "listen: 127.0.0.1:9998\npolicy: least-load\n"
                + f"keys: [{{name: b, sha256: {B}}}]\n", 3000)
    clock.advance(RELOAD_EVERY)
    assert len(applied) == 1  # only a restart field changed: nothing to apply
    w.stopService()


def test_a_forced_reload_reads_an_unchanged_mtime(tmp_path: Path) -> None:
    """reload() (SIGHUP, /admin/reload) reads the file even when its mtime and size did not
    change, and says what it applied; read again unchanged, it says nothing changed."""
    w, path, applied, clock = watcher(tmp_path)
    write(path, f"keys: [{{name: b, sha256: {A}}}]\n", 1000)  # same size, same mtime
    clock.advance(RELOAD_EVERY)
    assert applied == []
    done = w.reload()
    assert done == Reloaded(applied=("keys",)) and done.changed
    assert [k.name for k in applied[-1].keys] == ["b"]
    again = w.reload()
    assert again == Reloaded() and not again.changed
    w.stopService()


def test_a_forced_reload_of_a_bad_file_returns_every_error(tmp_path: Path) -> None:
    """A file with two mistakes: both errors come back, nothing is applied, and the timer
    does not apply it later either."""
    w, path, applied, clock = watcher(tmp_path)
    before = w.current
    write(path, "keys: [{name: a}]\npolicy: fastest\n", 2000)
    done = w.reload()
    assert len(done.errors) == 2 and not done.changed
    assert any("policy" in e for e in done.errors)
    clock.advance(RELOAD_EVERY)
    assert applied == [] and w.current is before
    w.stopService()


def test_routing_guards_apply_live_and_the_index_size_waits(tmp_path: Path) -> None:
    """The routing guards are live field by field; the prefix index's size needs a restart
    and keeps its running value while the guards beside it apply."""
    w, path, applied, clock = watcher(tmp_path)
    write(path, f"keys: [{{name: a, sha256: {A}}}]\nrouting: {{kv_pressure_threshold: 0.5, "
                f"bounded_load_epsilon: null, session_affinity: false, prefix_entries: 7}}\n",
          2000)
    done = w.reload()
    assert done.applied == ("routing.bounded_load_epsilon", "routing.kv_pressure_threshold",
                            "routing.session_affinity")
    assert done.restart == ("routing.prefix_entries",)
    r = applied[-1].routing
    assert (r.kv_pressure_threshold, r.bounded_load_epsilon, r.session_affinity) == (
        0.5, None, False)
    assert r.prefix_entries == RoutingConfig().prefix_entries
    w.stopService()


def test_reload_diff_names_live_and_restart_fields() -> None:
    """Timeouts are live except the header deadline (the listening site holds it); usage,
    the decision log and drain need a restart, ``observability.metrics_key`` does not;
    with_live takes only the live ones; names are shown as the file spells them."""
    old = Config()
    new = Config(timeouts=Timeouts(stream_idle=5.0, request_headers=3.0,
                                   first_byte_generate=60.0),
                 usage=UsageConfig(retention_days=10), drain=DrainConfig(grace=1.0),
                 observability=Observability(DecisionLogConfig("/tmp/d.jsonl"),
                                             metrics_key="0" * 64))
    live, restart = reload_diff(old, new)
    assert live == ["observability.metrics_key", "timeouts.first_byte_generate",
                    "timeouts.stream_idle"]
    assert file_name(live[1]) == "timeouts.first_byte.generate"
    assert restart == ["usage", "drain", "observability.decision_log",
                       "timeouts.request_headers"]
    running = with_live(old, new, live)
    assert running.timeouts == Timeouts(stream_idle=5.0, first_byte_generate=60.0)
    assert running.usage == old.usage and running.drain == old.drain
    assert running.observability == Observability(metrics_key="0" * 64)


class FakeReactor:
    """Records what a signal handler schedules instead of running it."""

    def __init__(self) -> None:
        self.calls: list[Callable[[], object]] = []

    def callFromThread(self, f: Callable[..., object], *args: object, **kw: object) -> None:
        self.calls.append(lambda: f(*args, **kw))


def test_sighup_schedules_a_reload_and_stopping_restores_the_handler(tmp_path: Path) -> None:
    """While the service runs, SIGHUP only schedules the reload on the reactor thread (the
    handler itself changes nothing); the scheduled call reloads an unchanged-mtime file;
    stopping puts the previous handler back."""
    w, path, applied, clock = watcher(tmp_path)
    seen: list[int] = []
    previous = signal.signal(signal.SIGHUP, lambda n, f: seen.append(n))
    try:
        reactor = FakeReactor()
        hup = Sighup(reactor, w.reload)  # type: ignore[arg-type]
        hup.startService()
        write(path, f"keys: [{{name: b, sha256: {A}}}]\n", 1000)
        assert callable(signal.getsignal(signal.SIGHUP))  # never the default: exit
        os.kill(os.getpid(), signal.SIGHUP)
        assert len(reactor.calls) == 1 and applied == [] and seen == []
        reactor.calls[0]()
        assert [k.name for k in applied[-1].keys] == ["b"]
        hup.stopService()
        assert signal.getsignal(signal.SIGHUP) != hup._handle  # the test's own is back
        os.kill(os.getpid(), signal.SIGHUP)
        assert seen == [signal.SIGHUP] and len(reactor.calls) == 1
    finally:
        signal.signal(signal.SIGHUP, previous)
        w.stopService()


def test_a_bad_file_on_sighup_keeps_the_running_config(tmp_path: Path) -> None:
    """A SIGHUP with a file that does not parse logs its errors and applies nothing."""
    w, path, applied, clock = watcher(tmp_path)
    before = w.current
    reactor = FakeReactor()
    hup = Sighup(reactor, w.reload)  # type: ignore[arg-type]
    hup.startService()
    try:
        write(path, "keys: [{name: a, sha256: nothex}]\n", 2000)
        assert callable(signal.getsignal(signal.SIGHUP))  # never the default: exit
        os.kill(os.getpid(), signal.SIGHUP)
        (call,) = reactor.calls
        call()
        assert applied == [] and w.current is before
    finally:
        hup.stopService()
        w.stopService()


def test_a_changed_backend_spec_re_resolves_and_keeps_serving() -> None:
    """A backend whose own probes change keeps its state (targets, the last round) and stays
    routable at once, and a new scraper resolves its plan again with the new probe."""
    fake = ollama()
    fake.answers["/own"] = (200, b"my_running 3\n")
    state, clock, _ = make({"http://a:1": fake})
    state.set_backends([spec()])
    state.service.startService()
    clock.advance(0.6)
    b = state.backends["http://a:1"]
    assert state.targets_for("a") and b.plan is not None
    assert "my-running" not in [p.name for p in b.plan.active]
    probe = OwnProbe("my-running", Signal.RUNNING, PromSpec("/own", "my_running"))
    state.set_backends([spec(probes=(probe,))])
    assert state.backends["http://a:1"] is b and b.spec.probes == (probe,)
    assert [t.backend for t in state.targets_for("a")] == [b]
    clock.advance(1.0)
    assert b.plan is not None and "my-running" in [p.name for p in b.plan.active]
    assert fake.gets["/own"] >= 1
    state.service.stopService()
