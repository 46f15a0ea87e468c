"""Layer 1: the delta wire format and membership (spec §12): round trip, unknown fields
ignored, proto checked, shapes bounded; the fingerprint; members from a list or an injected
resolver, a failed resolution keeping the last set."""

from __future__ import annotations

import dataclasses
import json

import pytest
from twisted.internet.defer import Deferred, fail, succeed

from pharos.config import Backend as BackendSpec
from pharos.config import Config, DnsBackends, Key, Listen, PeersConfig, UsageConfig
from pharos.peer.membership import Membership, join, split
from pharos.peer.wire import (
    MAX_OPS,
    PROTO,
    Delta,
    ProtoMismatch,
    WireError,
    decode,
    encode,
    fingerprint,
)
from pharos.prefix import PrefixOp


def sample() -> Delta:
    return Delta("o1", "00ff", 7, False,
                 {"inflight": {"http://e:1#m": 2}, "waiting": {"m": 1},
                  "reserved": {"day": 20000, "keys": {"k": 10}, "tenants": {"t": 10}}},
                 [{"origin": "o1", "kind": "day", "bucket": 20000, "key": "k", "tenant": "t",
                   "model": "m", "requests": 1, "prompt_tokens": 3, "cached_tokens": 0,
                   "completion_tokens": 4, "unmetered": 0}],
                 (PrefixOp("http://e:1#m", (1, 2**64 - 1), 12.5), PrefixOp("x#m", (3,), 1.0,
                                                                          True)))


def test_round_trip() -> None:
    """encode then decode gives the same delta."""
    assert decode(encode(sample())) == sample()


def test_unknown_fields_are_ignored() -> None:
    """A later release's extra fields (top level, in ops) decode as if absent."""
    raw = json.loads(encode(sample()))
    raw["new_field"] = {"x": [1]}
    raw["prefix"][0]["weight"] = 3
    assert decode(json.dumps(raw).encode()) == sample()


def with_dispatches() -> Delta:
    return dataclasses.replace(sample(), dispatched=(
        PrefixOp("http://e:1#m", (5, 6), 13.0, dispatched=True, root_tokens=2000, moved=True),
        PrefixOp("http://e:1#m", (5,), 13.5, dispatched=True, root_tokens=None)))


def test_dispatches_round_trip_and_an_older_delta_has_none() -> None:
    """A delta's dispatch ops (target, hashes, time, root tokens, moved) survive the round
    trip and ignore unknown fields; a delta without the ``dispatch`` field (an older peer's)
    decodes with ``dispatched`` None, and one with an empty list with ()."""
    assert decode(encode(with_dispatches())) == with_dispatches()
    raw = json.loads(encode(with_dispatches()))
    raw["dispatch"][0]["weight"] = 3
    assert decode(json.dumps(raw).encode()) == with_dispatches()
    assert "dispatch" not in json.loads(encode(sample()))
    assert decode(encode(sample())).dispatched is None
    empty = dataclasses.replace(sample(), dispatched=())
    assert decode(encode(empty)).dispatched == ()


@pytest.mark.parametrize("op,why", [
    ({"target": 1, "hashes": [1], "last_used": 0}, r"dispatch\[0\].target"),
    ({"target": "t", "hashes": [], "last_used": 0}, r"dispatch\[0\].hashes"),
    ({"target": "t", "hashes": [1], "last_used": 0, "root_tokens": -1}, "root_tokens"),
    ({"target": "t", "hashes": [1], "last_used": 0, "root_tokens": 1.5}, "root_tokens"),
    ({"target": "t", "hashes": [1], "last_used": 0, "moved": "yes"}, "moved"),
    ("garbage", r"dispatch\[0\]: expected an object"),
])
def test_malformed_dispatches_name_the_problem(op: object, why: str) -> None:
    """A bad dispatch op refuses the delta (a 400) naming the field; a dispatch list past
    the ops bound is refused too."""
    raw = json.loads(encode(sample()))
    raw["dispatch"] = [op]
    with pytest.raises(WireError, match=why):
        decode(json.dumps(raw).encode())
    raw["dispatch"] = [{"target": "t", "hashes": [1], "last_used": 0}] * (MAX_OPS + 1)
    with pytest.raises(WireError, match="dispatch: expected a list"):
        decode(json.dumps(raw).encode())


def test_retention_round_trips_and_a_bad_row_is_refused() -> None:
    """Each target's retention (without roots) survives the round trip; a row that is not
    one refuses the delta naming it."""
    from pharos.retention import RootsRow

    delta = dataclasses.replace(sample(), retention=(RootsRow("http://e:1#m", 6000, 12.0, ()),
                                                     RootsRow("x#m", None, None, ())))
    assert decode(encode(delta)) == delta
    raw = json.loads(encode(delta))
    raw["retention"][0]["retained"] = -1
    with pytest.raises(WireError, match=r"retention\[0\]: retained"):
        decode(json.dumps(raw).encode())
    raw["retention"] = {"not": "a list"}
    with pytest.raises(WireError, match="retention: expected a list"):
        decode(json.dumps(raw).encode())


def test_another_proto_is_a_mismatch() -> None:
    """Any other proto is refused as ProtoMismatch (a 409), naming both versions."""
    with pytest.raises(ProtoMismatch, match=f"peer proto 2, this instance speaks {PROTO}"):
        decode(b'{"proto": 2, "origin": "x", "fingerprint": ""}')


@pytest.mark.parametrize("body,why", [
    (b"\x80", "not JSON"),
    (b"1", "expected a JSON object"),
    (b'{"proto": 1, "origin": "", "fingerprint": ""}', "origin"),
    (b'{"proto": 1, "origin": "x", "fingerprint": "", "seq": -1}', "seq"),
    (b'{"proto": 1, "origin": "x", "fingerprint": "", "gauges": []}', "gauges"),
    (b'{"proto": 1, "origin": "x", "fingerprint": "", "prefix": [{"target": "t", '
     b'"hashes": [18446744073709551616], "last_used": 0}]}', "hashes"),
    (b'{"proto": 1, "origin": "x", "fingerprint": "", "prefix": [{"target": "t", '
     b'"hashes": [], "last_used": 1e999}]}', "last_used"),
    (b'{"proto": 1, "origin": "x", "fingerprint": "", "prefix": [{"target": "t", '
     b'"hashes": [], "last_used": Infinity}]}', "not JSON"),
])
def test_malformed_deltas_name_the_problem(body: bytes, why: str) -> None:
    """Garbage raises WireError naming the field, never another exception."""
    with pytest.raises(WireError, match=why):
        decode(body)


def test_too_many_ops_are_refused() -> None:
    """A delta with more ops than a pending list holds is refused whole."""
    raw = json.loads(encode(sample()))
    raw["prefix"] = [{"target": "t", "hashes": [1], "last_used": 0}] * (MAX_OPS + 1)
    with pytest.raises(WireError, match="prefix"):
        decode(json.dumps(raw).encode())


def test_fingerprint_covers_backends_keys_and_zone() -> None:
    """The fingerprint changes with the backend set (DNS groups included), the key set and the
    usage zone, and not with their order."""
    base = Config(backends=(BackendSpec("http://a:1"), BackendSpec("http://b:1")),
                  keys=(Key("k1", "h1"), Key("k2", "h2")))
    same = Config(backends=(BackendSpec("http://b:1"), BackendSpec("http://a:1")),
                  keys=(Key("k2", "h2"), Key("k1", "h9")))
    assert fingerprint(base) == fingerprint(same)
    for other in (Config(backends=base.backends, keys=base.keys[:1]),
                  Config(backends=base.backends[:1], keys=base.keys),
                  Config(backends=base.backends, keys=base.keys, usage=UsageConfig(timezone="UTC")),
                  Config(backends=base.backends, keys=base.keys,
                         dns_backends=(DnsBackends("engines.svc", 8000),))):
        assert fingerprint(other) != fingerprint(base)


class FakeResolver:
    def __init__(self) -> None:
        self.answers: list[str] | Exception = []
        self.asked: list[str] = []

    def resolve(self, host: str) -> Deferred[list[str]]:
        self.asked.append(host)
        if isinstance(self.answers, Exception):
            return fail(self.answers)
        return succeed(list(self.answers))


def refresh(m: Membership) -> frozenset[str]:
    out: list[frozenset[str]] = []
    Deferred.fromCoroutine(m.refresh()).addCallback(out.append)
    return out[0]


def test_static_members_never_change() -> None:
    """peers.members is the member set; refresh returns it unchanged."""
    m = Membership(PeersConfig("/s", members=("10.0.0.1:8081", "[::1]:8081")))
    assert not m.dynamic
    assert refresh(m) == {"10.0.0.1:8081", "[::1]:8081"}


def test_dns_members_take_the_listen_port_and_survive_a_failed_resolution() -> None:
    """peers.dns without a port takes peers.listen's; every address is a member; a failed
    resolution keeps the last set and says why."""
    resolver = FakeResolver()
    m = Membership(PeersConfig("/s", listen=Listen(":9001"), dns="pharos-peers"), resolver)
    assert m.dynamic
    resolver.answers = ["10.0.0.1", "10.0.0.2", "fd00::1"]
    assert refresh(m) == {"10.0.0.1:9001", "10.0.0.2:9001", "[fd00::1]:9001"}
    resolver.answers = RuntimeError("SERVFAIL")
    assert refresh(m) == {"10.0.0.1:9001", "10.0.0.2:9001", "[fd00::1]:9001"}
    assert m.failing is not None and "SERVFAIL" in m.failing
    resolver.answers = ["10.0.0.3"]
    assert refresh(m) == {"10.0.0.3:9001"} and m.failing is None
    assert resolver.asked == ["pharos-peers"] * 3


def test_split_and_join() -> None:
    """Addresses split into host and port (IPv6 in brackets) and join back."""
    assert split("[fd00::1]:81", None) == ("fd00::1", 81)
    assert split("host", 80) == ("host", 80)
    assert split("host:82", 80) == ("host", 82)
    assert join("fd00::1", 81) == "[fd00::1]:81" and join("h", 1) == "h:1"


def test_node_follows_dns_membership_every_ten_seconds() -> None:
    """A node over peers.dns adds a peer loop per resolved address and drops the loops of
    addresses that went away, at each re-resolution (every DNS_INTERVAL)."""
    from twisted.internet.task import Clock

    from pharos.peer.membership import DNS_INTERVAL
    from pharos.peer.node import PeerNode
    from pharos.policy import PolicyConfig
    from pharos.sched import RouteSettings, Scheduler
    from pharos.state.state import State
    from pharos.usage import Ledger
    from tests.support.peer_mesh import MemoryNetwork

    clock = Clock()
    resolver = FakeResolver()
    resolver.answers = ["10.0.0.1", "10.0.0.2"]
    state = State(clock, None, fetcher_for=lambda spec: None)  # type: ignore[arg-type,return-value]
    node = PeerNode("me", lambda: "fp", Scheduler(state, RouteSettings(PolicyConfig())),
                    Ledger(clock, "me"),
                    MemoryNetwork().transport("me"),
                    Membership(PeersConfig("/s", listen=Listen(":81"), dns="p"), resolver), clock)
    node.startService()
    assert set(node.peers) == {"10.0.0.1:81", "10.0.0.2:81"}
    assert all(p.loop is not None and p.loop.running for p in node.peers.values())
    old = node.peers["10.0.0.1:81"]
    resolver.answers = ["10.0.0.2", "10.0.0.3"]
    clock.advance(DNS_INTERVAL)
    assert set(node.peers) == {"10.0.0.2:81", "10.0.0.3:81"}
    assert old.loop is None
    node.stopService()
    assert not clock.getDelayedCalls()
