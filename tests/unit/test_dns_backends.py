"""Layer 1: DNS backends (issue 14 item 5): ``backends: [{dns: NAME, port, kind, refresh}]``
is parsed (unknown fields refused by name), NAME is resolved every refresh through an injected
twisted.names resolver on a Clock (no DNS server), each address is a backend, members that
stay keep their state, members that leave drain, a failed lookup keeps the last set (logged
once); the union with the static list and a reload through ``Discovery.set_static``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, LogEvent, LogLevel, formatEvent, globalLogPublisher
from twisted.names import dns, error
from zope.interface import implementer

from pharos.config import Backend, ConfigError, DnsBackends, parse_config
from pharos.discovery.dns import DnsGroup
from pharos.discovery.service import Discovery
from pharos.engine.fetch import Fetcher
from pharos.state.state import State

NAME = "ollama.llm.svc.cluster.local"


class FakeResolver:
    """A twisted.names resolver whose answers the test sets: ``answers[name]`` is a list of
    addresses, an exception to fail with, or ``None`` for a lookup that never answers."""

    def __init__(self) -> None:
        self.answers: dict[str, Any] = {}
        self.asked = 0

    def _lookup(self, name: str, v6: bool) -> Deferred[Any]:
        self.asked += 1
        got = self.answers.get(name, error.DNSNameError(name))
        if got is None:
            return Deferred()
        if isinstance(got, Exception):
            return fail(got)
        rrs = [dns.RRHeader(name, dns.CNAME, payload=dns.Record_CNAME(b"pod.x"))]
        for a in got:
            if (":" in a) == v6:
                rtype, payload = ((dns.AAAA, dns.Record_AAAA(a)) if v6
                                  else (dns.A, dns.Record_A(a)))
                rrs.append(dns.RRHeader(name, rtype, payload=payload))
        return succeed((rrs, [], []))

    def lookupAddress(self, name: str, timeout: Any = None) -> Deferred[Any]:
        return self._lookup(name, v6=False)

    def lookupIPV6Address(self, name: str, timeout: Any = None) -> Deferred[Any]:
        return self._lookup(name, v6=True)


def group_spec(refresh: float = 10.0, port: int = 11434) -> DnsBackends:
    return DnsBackends(NAME, port, refresh, Backend(url="", kind="ollama", memory_gb=24.0))


@pytest.fixture
def warnings() -> Any:
    """Warnings logged during the test (their text)."""
    seen: list[str] = []

    @implementer(ILogObserver)
    def observe(event: LogEvent) -> None:
        if event.get("log_level") == LogLevel.warn:
            seen.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    yield seen
    globalLogPublisher.removeObserver(observe)


# --- config ---------------------------------------------------------------------------------


def test_dns_entry_parses_with_defaults_and_member_settings() -> None:
    """dns, port, kind, refresh (and the settings every member shares) are read; refresh
    defaults to 10 s; the url entries stay in backends."""
    c = parse_config(f"""
backends:
  - url: http://gpu-box:8000
  - dns: {NAME}
    port: 11434
    kind: ollama
    refresh: 30s
    capacity: 4
  - dns: vllm-headless
    port: 8000
""")
    assert [b.url for b in c.backends] == ["http://gpu-box:8000"]
    first, second = c.dns_backends
    assert (first.name, first.port, first.refresh, first.template.kind,
            first.template.capacity) == (NAME, 11434, 30.0, "ollama", 4)
    assert (second.refresh, second.template.kind) == (10.0, "auto")
    assert first.member("10.0.0.7").url == "http://10.0.0.7:11434"
    assert first.member("fd00::7").url == "http://[fd00::7]:11434"


@pytest.mark.parametrize(("entry", "message"), [
    ("{dns: x, port: 1, colour: red}", "backends[0]: unknown field 'colour'"),
    ("{dns: x}", "backends[0]: missing required field 'port'"),
    ("{dns: x, port: 1, url: 'http://x:1'}", "backends[0].url: an entry has either url or dns"),
    ("{dns: x, port: 1, logs: 'file:///l'}", "backends[0].logs: a log feed is one engine's"),
    ("{dns: x, port: 70000}", "backends[0].port: expected a port from 1 to 65535"),
    ("{dns: x, port: 1, refresh: 0}", "backends[0].refresh: expected a duration above 0"),
    ("{dns: x, port: 1, refresh: soon}", "backends[0].refresh: expected a duration"),
    ("{dns: 'not a name', port: 1}", "backends[0].dns: expected a host name"),
    ("{dns: x, port: 1, kind: nope}", "backends[0].kind: expected one of"),
    ("{url: 'http://x:1', port: 1}", "backends[0].port: only a dns entry takes it"),
])
def test_bad_dns_entries_are_refused_by_name(entry: str, message: str) -> None:
    """Every mistake names its field; nothing is accepted and ignored."""
    with pytest.raises(ConfigError) as e:
        parse_config(f"backends: [{entry}]")
    assert any(m.startswith(message) for m in e.value.errors), e.value.errors


def test_duplicate_dns_entry_is_refused() -> None:
    """The same name and port twice would make every member twice."""
    with pytest.raises(ConfigError, match="duplicate dns backend"):
        parse_config("backends: [{dns: x, port: 1}, {dns: x, port: 1, kind: ollama}]")


# --- resolving ------------------------------------------------------------------------------


def test_each_address_is_a_backend_resolved_every_refresh() -> None:
    """A and AAAA answers (a CNAME on the way skipped) become members, sorted; the name is
    asked again every refresh and a changed answer changes the set."""
    clock, resolver, changes = Clock(), FakeResolver(), []
    resolver.answers[NAME] = ["10.0.0.2", "10.0.0.1", "fd00::1"]
    g = DnsGroup(group_spec(refresh=10), resolver, clock, lambda: changes.append(1))
    g.startService()
    assert [b.url for b in g.backends] == ["http://10.0.0.1:11434", "http://10.0.0.2:11434",
                                           "http://[fd00::1]:11434"]
    assert all(b.kind == "ollama" and b.memory_gb == 24.0 for b in g.backends)
    resolver.answers[NAME] = ["10.0.0.2", "10.0.0.3"]
    clock.advance(9.9)
    assert len(g.backends) == 3
    clock.advance(0.1)
    assert [b.url for b in g.backends] == ["http://10.0.0.2:11434", "http://10.0.0.3:11434"]
    assert len(changes) == 2
    clock.advance(10)  # the same answer: no change told
    assert len(changes) == 2 and g.lookups == 3
    g.stopService()
    assert not clock.getDelayedCalls()


def test_failed_lookup_keeps_the_last_set_and_logs_once(warnings: list[str]) -> None:
    """NXDOMAIN, a server error, a lookup that never answers: the last set stays; one warning
    for the whole outage; an empty answer is an empty set."""
    clock, resolver = Clock(), FakeResolver()
    resolver.answers[NAME] = ["10.0.0.1"]
    g = DnsGroup(group_spec(refresh=10), resolver, clock)
    g.startService()
    for outage in (error.DNSNameError(NAME), error.DNSServerError("SERVFAIL"), None):
        resolver.answers[NAME] = outage
        clock.advance(10)
        clock.advance(10)  # a hung lookup times out (at most the refresh)
    assert [b.url for b in g.backends] == ["http://10.0.0.1:11434"]
    assert g.failing is not None
    assert len([w for w in warnings if "lookup failed" in w]) == 1, warnings
    resolver.answers[NAME] = []
    clock.advance(10)
    assert g.backends == () and g.failing is None
    g.stopService()


def test_stop_cancels_a_lookup_in_flight() -> None:
    """Stopping mid-lookup leaves no delayed call and no reschedule."""
    clock, resolver = Clock(), FakeResolver()
    resolver.answers[NAME] = None
    g = DnsGroup(group_spec(), resolver, clock)
    g.startService()
    g.stopService()
    clock.advance(100)
    assert resolver.asked == 2 and not clock.getDelayedCalls()


# --- the union and State ------------------------------------------------------------------


class NoFetch:
    """A fetcher that never answers: these tests watch the backend set, not scrapes."""

    def get(self, path: str, **kw: Any) -> Deferred[Any]:
        return Deferred()


def state(clock: Clock) -> State:
    def fetcher(spec: Backend) -> Fetcher:
        return NoFetch()  # type: ignore[return-value]

    return State(clock, None, fetcher_for=fetcher)


def test_members_that_stay_keep_their_state_and_leavers_drain() -> None:
    """Through Discovery into State: a member that stays is the same BackendState; one that
    leaves is removed (kept aside, draining), and comes back with its state."""
    clock, resolver = Clock(), FakeResolver()
    resolver.answers[NAME] = ["10.0.0.1", "10.0.0.2"]
    st = state(clock)
    static = [Backend(url="http://gpu-box:8000")]
    d = Discovery(st.set_backends, clock, static, [group_spec()], resolver=resolver)
    d.startService()
    assert sorted(st.backends) == ["http://10.0.0.1:11434", "http://10.0.0.2:11434",
                                   "http://gpu-box:8000"]
    stays = st.backends["http://10.0.0.1:11434"]
    leaves = st.backends["http://10.0.0.2:11434"]
    resolver.answers[NAME] = ["10.0.0.1"]
    clock.advance(10)
    assert st.backends["http://10.0.0.1:11434"] is stays
    assert "http://10.0.0.2:11434" not in st.backends and leaves.removed
    resolver.answers[NAME] = ["10.0.0.1", "10.0.0.2"]
    clock.advance(10)
    assert st.backends["http://10.0.0.2:11434"] is leaves and not leaves.removed
    d.stopService()


def test_reload_changes_the_static_part_and_the_dns_entries() -> None:
    """set_static (what a reload calls) swaps the url backends; a dns entry that stays keeps
    its members without asking again, a new one resolves at once, a removed one drains."""
    clock, resolver, pushed = Clock(), FakeResolver(), []
    resolver.answers[NAME] = ["10.0.0.1"]
    resolver.answers["other"] = ["10.0.1.1"]

    def push(specs: Sequence[Backend]) -> None:
        pushed.append(sorted(b.url for b in specs))

    spec = group_spec()
    d = Discovery(push, clock, [Backend(url="http://a:1")], [spec], resolver=resolver)
    d.startService()
    assert pushed[-1] == ["http://10.0.0.1:11434", "http://a:1"]
    asked = resolver.asked
    other = DnsBackends("other", 8000)
    d.set_static([Backend(url="http://b:1")], [spec, other])
    assert pushed[-1] == ["http://10.0.0.1:11434", "http://10.0.1.1:8000", "http://b:1"]
    assert resolver.asked == asked + 2  # only the new entry was asked
    d.set_static([Backend(url="http://b:1")], [other])
    assert pushed[-1] == ["http://10.0.1.1:8000", "http://b:1"]
    d.stopService()
    assert not clock.getDelayedCalls()


def test_a_static_backend_hides_a_discovered_one_logged_once(warnings: list[str]) -> None:
    """The same URL from DNS and the static list is one backend (the static one's spec)."""
    clock, resolver, pushed = Clock(), FakeResolver(), []
    resolver.answers[NAME] = ["10.0.0.1"]
    static = Backend(url="http://10.0.0.1:11434", kind="vllm")
    d = Discovery(lambda specs: pushed.append(list(specs)), clock, [static], [group_spec()],
                  resolver=resolver)
    d.startService()
    clock.advance(30)
    assert pushed[-1] == [static]
    assert len([w for w in warnings if "already a backend" in w]) == 1
    d.stopService()


def test_not_running_pushes_nothing() -> None:
    """Before start, set_static only records (start-up pushes the first set)."""
    pushed: list[Any] = []
    d = Discovery(pushed.append, Clock(), [Backend(url="http://a:1")])
    d.set_static([Backend(url="http://b:1")])
    assert pushed == []
    d.startService()
    assert [b.url for b in pushed[-1]] == ["http://b:1"]
    d.stopService()


def test_a_reload_applies_dns_entries_live_named_backends(tmp_path: Any) -> None:
    """Adding a dns: entry to the file is a live change of ``backends`` (as the operator
    wrote it), and the applied config carries it to ``Discovery.set_static``."""
    from pharos.config import load_config
    from pharos.reload import ConfigWatcher

    path = tmp_path / "pharos.yaml"
    path.write_text("backends: [{url: 'http://a:1'}]\n")
    applied: list[Any] = []
    watcher = ConfigWatcher(str(path), load_config(path), applied.append, Clock())
    path.write_text(f"backends: [{{url: 'http://b:1'}}, {{dns: {NAME}, port: 11434}}]\n")
    result = watcher.reload()
    assert result.applied == ("backends",) and result.restart == ()
    (config,) = applied
    assert [b.url for b in config.backends] == ["http://b:1"]
    assert [g.name for g in config.dns_backends] == [NAME]
