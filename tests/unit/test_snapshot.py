"""Layer 1: the §12 Snapshot (pharos.peer.snapshot): built in steps on a Clock, decoded with
every defect named, restored through each module's own merge."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest
from twisted.internet.task import Clock

from pharos.config import Backend as BackendSpec
from pharos.peer import snapshot
from pharos.peer.snapshot import PROTO, Replicas, SnapshotError, build, decode, restore
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


def pump(c: Clock, d: Any) -> Any:
    """Run the clock's zero-delay calls until ``d`` fires; its result."""
    out: list[Any] = []
    d.addBoth(out.append)
    for _ in range(100_000):
        if out:
            break
        c.advance(0.001)
    assert out, "did not finish"
    return out[0]


def test_round_trip_restores_prefix_cells_and_stats() -> None:
    """A snapshot built in steps decodes to the same entries, cells and stats, and a fresh
    instance with the same targets restored from it exports the same prefix entries (same
    order) and cells."""
    c = clock()
    r, targets = filled(c)
    data = pump(c, build(r, c))
    assert isinstance(data, bytes)
    snap = decode(data)
    assert snap.proto == PROTO and snap.origin == "a" and snap.taken_at == NOW
    keys = {t.id: t.key for t in targets}
    assert list(snap.prefix) == r.index.export(keys.get)
    assert list(snap.cells) == r.ledger.export(minutes=False)
    fresh, fresh_targets = replicas(c, origin="b")
    got = restore(fresh, snap, c.seconds())
    fkeys = {t.id: t.key for t in fresh_targets}
    assert fresh.index.export(fkeys.get) == r.index.export(keys.get)
    assert fresh.ledger.export(minutes=False) == r.ledger.export(minutes=False)
    assert fresh.ledger.spent_today(key="alice") == 10
    assert fresh_targets[0].stats.service_sec.value == 2.0
    assert got.prefix_dropped == 0 and got.prefix_merged == sum(len(e.slots)
                                                                for e in snap.prefix)
    assert got.cells_changed == 1 and got.stats_taken == 1
    # Restored slots say where they came from.
    entry = snap.prefix[0]
    assert {s[3] for s in fresh.index.slots(entry.key)} == {"restored"}


def test_build_in_steps_while_the_index_changes() -> None:
    """One step per reactor turn: requests recorded between steps neither break the build nor
    leak into it (it exports a copy)."""
    c = clock()
    r, targets = replicas(c, capacity=200_000)
    for i in range(3000):
        r.index.record([i + 1], targets[0].id, 0, NOW - 10)
    d = build(r, c, steps_per_turn=1)
    out: list[Any] = []
    d.addBoth(out.append)
    turns = 0
    while not out:
        c.advance(0.001)
        r.index.record([10**9 + turns], targets[1].id, 0, NOW)
        turns += 1
    assert turns > 3
    assert isinstance(out[0], bytes)
    snap = decode(out[0])
    assert len(snap.prefix) in range(3000, 3002)  # the copy is taken at the first step


def test_restore_goes_through_each_modules_merge(monkeypatch: pytest.MonkeyPatch) -> None:
    """restore calls PrefixIndex.merge (source restored), Ledger.merge and State.merge_stats:
    one merge code for peers and the state file."""
    c = clock()
    r, _ = filled(c)
    snap = decode(snapshot.build_now(r, c))
    fresh, _ = replicas(c)
    calls: list[str] = []
    for cls, name in ((PrefixIndex, "merge"), (Ledger, "merge"), (State, "merge_stats")):
        original = getattr(cls, name)

        def spy(self: Any, *a: Any, _o: Any = original, _n: str = name, _c: Any = cls,
                **kw: Any) -> Any:
            calls.append(f"{_c.__name__}.{_n}:{kw.get('source', a[-1] if a else '')}"
                         if _c is PrefixIndex else f"{_c.__name__}.{_n}")
            return _o(self, *a, **kw)

        monkeypatch.setattr(cls, name, spy)
    restore(fresh, snap, c.seconds())
    assert calls == ["PrefixIndex.merge:restored", "Ledger.merge", "State.merge_stats"]


def test_restore_in_steps_keeps_the_lru_order() -> None:
    """Merged a batch at a time (oldest batch first), the restored index has the snapshot's
    order, most recent first."""
    c = clock()
    r, targets = replicas(c)
    for i in range(700):
        r.index.record([i + 1], targets[i % 2].id, 0, NOW - 1000 + i)
    snap = decode(snapshot.build_now(r, c))
    fresh, ftargets = replicas(c)
    got = pump(c, snapshot.restore_in_steps(fresh, snap, c, steps_per_turn=1))
    assert got.prefix_merged == 700
    assert fresh.index.lru_order() == r.index.lru_order()


def test_stats_only_where_no_local_sample_and_wait_for_unseen_targets() -> None:
    """A restored estimate fills only an estimate with no local sample; a row for a target
    not seen yet is kept and taken when the target appears."""
    c = clock()
    r, targets = replicas(c)
    learn_service(targets[0], 5.0)
    rows = [{"target": targets[0].key, "service_sec": 1.0, "load_sec": 9.0},
            {"target": "http://later:2#m9", "service_sec": 3.0, "future_field": [1]}]
    taken, pending = r.state.merge_stats(rows)
    assert (taken, pending) == (1, 1)
    assert targets[0].stats.service_sec.value == 5.0  # a local sample wins
    assert targets[0].stats.load_sec.value == 9.0  # no local sample: restored
    later = r.state.target(BackendState(BackendSpec(url="http://later:2", kind="vllm")),
                           "m9", "m9")
    assert later.stats.service_sec.value == 3.0
    assert later.stats.prefill_sec_per_token.value is None  # unknown stays unknown


def learn_service(t: Target, sec: float) -> None:
    """One local sample of the target's request seconds."""
    learn(t.stats, Sample(ok=True, dispatched_cold=False, ttft_sec=0.1, duration_sec=sec))


def test_no_prompt_text_in_a_snapshot() -> None:
    """A snapshot holds hashes, target keys, counts and speeds: never prompt text."""
    c = clock()
    r, _ = filled(c)
    raw = gzip.decompress(snapshot.build_now(r, c))
    assert SECRET.encode() not in raw
    assert b"q1" not in raw


def doc_bytes(doc: object) -> bytes:
    return gzip.compress(json.dumps(doc).encode())


GOOD = {"proto": PROTO, "origin": "x", "taken_at": NOW}


@pytest.mark.parametrize("data, why", [
    (b"", "truncated"),
    (b"garbage, not gzip", "not gzip"),
    (doc_bytes(GOOD)[:-12], "truncated"),
    (gzip.compress(b"{not json"), "not JSON"),
    (gzip.compress(b"\xff\xfe"), "not JSON"),
    (doc_bytes([1, 2]), "expected a JSON object"),
    (doc_bytes({**GOOD, "proto": PROTO + 1}), f"proto {PROTO + 1}"),
    (doc_bytes({**GOOD, "proto": "1"}), "proto must be an integer"),
    (doc_bytes({**GOOD, "origin": 5}), "origin must be a string"),
    (doc_bytes({**GOOD, "taken_at": "now"}), "taken_at"),
    (doc_bytes({**GOOD, "prefix": {}}), "prefix must be a list"),
    (doc_bytes({**GOOD, "prefix": [[-1, []]]}), "64-bit"),
    (doc_bytes({**GOOD, "prefix": [[2**64, []]]}), "64-bit"),
    (doc_bytes({**GOOD, "prefix": [[1, [["t", "x"]]]]}), "a slot must be"),
    (doc_bytes({**GOOD, "prefix": [[1, [[3, 1.0]]]]}), "a slot must be"),
    (doc_bytes({**GOOD, "cells": [{"kind": "day"}]}), "cells[0]: usage cell"),
    (doc_bytes({**GOOD, "cells": ["x"]}), "cells[0]"),
    (doc_bytes({**GOOD, "stats": [{"target": "t", "load_sec": -1}]}), "stats[0]"),
    (doc_bytes({**GOOD, "stats": [{"load_sec": 1}]}), "stats[0]"),
])
def test_bad_snapshots_are_refused_by_name(data: bytes, why: str) -> None:
    """Garbage, truncated gzip, wrong types and another proto raise SnapshotError saying
    what is wrong (a ValueError, never anything else)."""
    with pytest.raises(SnapshotError, match=None) as e:
        decode(data)
    assert why in str(e.value)


def test_unknown_fields_and_missing_parts_are_ignored() -> None:
    """A snapshot from a later release of the same proto, with fields this one does not know
    (top level, in entries, slots, cells and stats), decodes; parts left out are empty."""
    c = clock()
    r, targets = replicas(c)
    cell = {"origin": "z", "kind": "day", "bucket": int(NOW // 86400), "key": "k",
            "tenant": "t", "model": "m1", "requests": 1, "prompt_tokens": 2,
            "cached_tokens": 0, "completion_tokens": 3, "unmetered": 0, "new": True}
    doc = {**GOOD, "future": {"a": 1},
           "prefix": [[7, [[targets[0].key, NOW - 5, "extra"]], "extra"]],
           "cells": [cell], "stats": [{"target": targets[1].key, "load_sec": 2.5, "x": 1}]}
    snap = decode(doc_bytes(doc))
    got = restore(r, snap, NOW)
    assert got.prefix_merged == 1 and got.cells_changed == 1 and got.stats_taken == 1
    assert r.ledger.spent_today(key="k") == 5
    assert decode(doc_bytes(GOOD)).prefix == ()


def test_slots_of_unknown_targets_are_dropped_and_counted() -> None:
    """A slot naming a target this instance has not seen is dropped (and counted), the rest
    of the snapshot merges."""
    c = clock()
    r, targets = replicas(c)
    doc = {**GOOD, "prefix": [[7, [[targets[0].key, NOW], ["http://gone:9#m", NOW]]]]}
    got = restore(r, decode(doc_bytes(doc)), NOW)
    assert (got.prefix_merged, got.prefix_dropped) == (1, 1)
    assert [s[0] for s in r.index.slots(7)] == [targets[0].id]
