"""Layer 1: the §12 Snapshot (pharos.peer.snapshot): newline-delimited JSON parts in gzip,
built and merged a part per step on a Clock, every defect named, restored through each
module's own merge."""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any

import pytest
from twisted.internet.task import Clock

from pharos.config import Backend as BackendSpec
from pharos.peer import snapshot
from pharos.peer.snapshot import (
    MAX_LINE_BYTES,
    PART_ITEMS,
    PROTO,
    Replicas,
    Restored,
    SnapshotError,
    build,
    decode,
    restore,
    restore_bytes,
)
from pharos.prefix import PrefixIndex
from pharos.retention import RootCaches
from pharos.state.registry import BackendState, Target
from pharos.state.state import State
from pharos.usage import Ledger
from tests.support.snapshot import NOW, SECRET, clock, filled, learn_service, replicas


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


def lines(data: bytes) -> list[dict[str, Any]]:
    """A snapshot's lines, parsed."""
    return [json.loads(line) for line in gzip.decompress(data).splitlines()]


def test_restore_bytes_merges_part_by_part_and_keeps_the_lru_order() -> None:
    """The stream is a header line then small part lines (at most PART_ITEMS items each,
    prefix parts least recent first); merged from the bytes one step per turn, the parts land
    between turns (never all in one), and the restored index has the writer's LRU order."""
    c = clock()
    r, targets = replicas(c, capacity=5000)
    n = PART_ITEMS * 3 + 100
    for i in range(n):
        r.index.record([i + 1], targets[i % 2].id, 0, NOW - 10_000 + i)
    data = snapshot.build_now(r, c)
    parsed = lines(data)
    assert set(parsed[0]) == {"proto", "origin", "taken_at"}
    prefix = [p["prefix"] for p in parsed if "prefix" in p]
    assert len(prefix) == 4 and all(len(p) <= PART_ITEMS for p in prefix)
    assert prefix[0][-1][0] == 1 and prefix[-1][0][0] == n  # oldest part first
    fresh, _ = replicas(c, capacity=5000)
    out: list[Any] = []
    restore_bytes(fresh, data, c, steps_per_turn=1).addBoth(out.append)
    seen: set[int] = set()
    while not out:
        c.advance(0.001)
        seen.add(len(fresh.index))
    assert {0, PART_ITEMS, n} <= seen  # one part merged at a time
    got = out[0]
    assert isinstance(got, Restored) and got.prefix_merged == n
    assert (got.origin, got.taken_at) == ("a", NOW)
    assert fresh.index.lru_order() == r.index.lru_order()
    assert list(decode(data).prefix) == r.index.export({t.id: t.key for t in targets}.get)


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
    what is wrong (a ValueError, never anything else), decoded whole or merged in steps; in
    steps nothing of such a one-line snapshot is merged."""
    with pytest.raises(SnapshotError, match=None) as e:
        decode(data)
    assert why in str(e.value)
    c = clock()
    r, _ = replicas(c)
    failure = pump(c, restore_bytes(r, data, c))
    assert failure.check(SnapshotError) and why in failure.getErrorMessage()
    assert failure.value.partial is None
    assert len(r.index) == 0 and r.ledger.export() == []


def ndjson(*docs: object, tail: bytes = b"") -> bytes:
    """Lines of JSON, gzip'd (``tail``: raw bytes appended before compressing)."""
    raw = b"".join(json.dumps(d).encode() + b"\n" for d in docs) + tail
    return gzip.compress(raw)


def test_a_corrupt_or_truncated_stream_merges_nothing() -> None:
    """A stream cut short or with a byte flipped mid-way (the gzip CRC, or inflate itself,
    catches it) is refused before any part is merged, even parts that precede the damage;
    so are bytes after the gzip stream."""
    c = clock()
    r, _ = filled(c)
    for i in range(2000):
        r.index.record([10_000 + i], 0, 0, NOW - 50)
    good = snapshot.build_now(r, c)
    flipped = bytearray(good)
    flipped[len(good) * 3 // 4] ^= 0x10
    for bad in (good[: len(good) * 3 // 4], bytes(flipped), good + b"x", good + good):
        fresh, _ = replicas(c)
        failure = pump(c, restore_bytes(fresh, bad, c, steps_per_turn=1))
        assert failure.check(SnapshotError), failure
        assert failure.value.partial is None
        assert len(fresh.index) == 0 and fresh.ledger.export() == []


def test_a_bad_line_in_a_whole_stream_keeps_the_parts_before_it() -> None:
    """A whole gzip stream whose third line is wrong: the parts before it are merged (safe:
    merges are idempotent and max-based) and reported as the error's ``partial``; nothing
    after it is."""
    c = clock()
    r, targets = replicas(c)
    cell = {"origin": "z", "kind": "day", "bucket": int(NOW // 86400), "key": "k",
            "tenant": "t", "model": "m1", "requests": 1, "prompt_tokens": 2,
            "cached_tokens": 0, "completion_tokens": 3, "unmetered": 0}
    data = ndjson(GOOD, {"cells": [cell]}, {"prefix": [[1, [["t", "x"]]]]},
                  {"prefix": [[7, [[targets[0].key, NOW]]]]})
    failure = pump(c, restore_bytes(r, data, c))
    assert failure.check(SnapshotError) and "prefix[0]: a slot must be" in str(failure.value)
    assert failure.value.partial.cells_changed == 1
    assert r.ledger.spent_today(key="k") == 5
    assert 7 not in r.index


def test_parts_in_any_order_unknown_kinds_blank_lines_and_one_line_form() -> None:
    """Parts may come in any order and number, a line may carry several parts (the header
    line too: a one-line snapshot reads), unknown part kinds and fields are ignored, blank
    lines and a last line without its newline are fine."""
    c = clock()
    r, targets = replicas(c)
    cell = {"origin": "z", "kind": "day", "bucket": int(NOW // 86400), "key": "k",
            "tenant": "t", "model": "m1", "requests": 1, "prompt_tokens": 2,
            "cached_tokens": 0, "completion_tokens": 3, "unmetered": 0}
    data = ndjson({**GOOD, "stats": [{"target": targets[1].key, "load_sec": 2.5}]},
                  {"prefix": [[7, [[targets[0].key, NOW - 5]]]], "later": [1]},
                  {"sketches": [{"a": 1}]},
                  {"cells": [cell], "prefix": [[8, [[targets[1].key, NOW - 9]]]]},
                  tail=b"\n\n" + json.dumps({"cells": []}).encode())
    got = pump(c, restore_bytes(r, data, c))
    assert isinstance(got, Restored)
    assert (got.prefix_merged, got.cells_changed, got.stats_taken) == (2, 1, 1)
    assert r.ledger.spent_today(key="k") == 5 and {7, 8} <= set(r.index.lru_order())
    snap = decode(data)
    assert [e.key for e in snap.prefix] == [8, 7] and len(snap.cells) == 1


def test_a_newer_proto_is_refused_before_any_merge() -> None:
    """A header from a newer proto refuses the whole snapshot, parts on its own line
    included."""
    c = clock()
    r, targets = replicas(c)
    data = ndjson({**GOOD, "proto": PROTO + 1, "prefix": [[7, [[targets[0].key, NOW]]]]},
                  {"prefix": [[8, [[targets[0].key, NOW]]]]})
    failure = pump(c, restore_bytes(r, data, c))
    assert failure.check(SnapshotError) and f"proto {PROTO + 1}" in str(failure.value)
    assert len(r.index) == 0


def test_an_overlong_line_is_refused() -> None:
    """A line longer than MAX_LINE_BYTES (a writer that does not split its parts, e.g. one
    JSON document of a full index) is refused rather than parsed in one reactor turn."""
    filler = {"origin": "z", "pad": "x" * (MAX_LINE_BYTES + 10)}
    data = ndjson(GOOD, {"cells": [filler]})
    with pytest.raises(SnapshotError, match="longer than"):
        decode(data)


def test_a_stream_without_a_header_is_refused() -> None:
    """An empty (but whole) gzip stream, or one of blank lines, has no header."""
    for raw in (b"", b"\n\n"):
        with pytest.raises(SnapshotError, match="no header"):
            decode(gzip.compress(raw))
    assert zlib.decompress(gzip.compress(b""), 31) == b""


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


# --- the roots part (RootCaches: each engine's root LRU and learned retention) -----------------


def with_roots(c: Clock, origin: str = "a", models: tuple[str, ...] = ("m1", "m2")
               ) -> tuple[Replicas, list[Target]]:
    """Replicas that carry a RootCaches picture."""
    r, targets = replicas(c, origin=origin, models=models)
    return Replicas(r.state, r.index, r.ledger, RootCaches()), targets


def test_a_snapshot_with_roots_restores_them() -> None:
    """Each target's roots (LRU order, sizes) and learned retention go into the snapshot by
    target key and come back in a fresh instance whose target ids differ; the prefix entries
    come back too; restoring twice changes nothing more."""
    c = clock()
    r, targets = filled(c)
    r = Replicas(r.state, r.index, r.ledger, RootCaches())
    assert r.roots is not None
    for i, root in enumerate((11, 12, 13, 11)):
        r.roots.sent(targets[0].id, root, 500 + root, NOW - 10 + i)
    r.roots.sent(targets[1].id, 2**64 - 1, 700, NOW - 3)
    r.roots.learn(targets[0].id, 511, 1025, cached=511, now=NOW - 2)
    data = pump(c, build(r, c))
    snap = decode(data)
    assert [row.target for row in snap.roots] == [targets[0].key, targets[1].key]
    fresh, fresh_targets = with_roots(c, origin="b", models=("m2", "m1"))  # other ids
    assert fresh_targets[0].key == targets[1].key and fresh_targets[0].id == targets[0].id
    got = pump(c, restore_bytes(fresh, data, c))
    assert isinstance(got, Restored) and (got.roots_merged, got.roots_dropped) == (4, 0)
    assert fresh.roots is not None
    by_key = {t.key: t.id for t in fresh.state.targets}
    t0, t1 = by_key[targets[0].key], by_key[targets[1].key]
    assert list(fresh.roots.held(t0).items()) == [(12, 512), (13, 513), (11, 511)]
    assert list(fresh.roots.held(t1).items()) == [(2**64 - 1, 700)]
    assert fresh.roots.retained == {t0: 1536}
    assert got.prefix_merged > 0
    again = pump(c, restore_bytes(fresh, data, c))
    assert again.roots_merged == 0 and list(fresh.roots.held(t0)) == [12, 13, 11]
    assert "roots 4 merged, 0 dropped" in str(got)


def test_an_older_snapshot_without_roots_still_restores() -> None:
    """A snapshot of a writer that carries no roots part restores its prefix, cells and stats
    and leaves the picture empty; one with roots restored by replicas that keep none counts
    them dropped and merges the rest."""
    c = clock()
    old, _ = filled(c)
    data = pump(c, build(old, c))
    assert decode(data).roots == ()
    fresh, _ = with_roots(c, origin="b")
    got = pump(c, restore_bytes(fresh, data, c))
    assert got.prefix_merged > 0 and got.cells_changed == 1 and got.stats_taken == 1
    assert fresh.roots is not None and fresh.roots.export(lambda t: "k") == []
    newer, targets = with_roots(c)
    assert newer.roots is not None
    newer.roots.sent(targets[0].id, 5, 100, NOW)
    plain, _ = replicas(c, origin="c")
    got = pump(c, restore_bytes(plain, pump(c, build(newer, c)), c))
    assert got.roots_dropped == 1 and got.roots_merged == 0


def test_a_recorded_roots_part_reads_and_a_bad_one_is_named() -> None:
    """A snapshot as the first writers of the roots part write it (literal JSON: what later
    releases must keep reading): a row per target key, unknown fields ignored, rows of
    unknown targets dropped; a malformed row is refused by its index."""
    c = clock()
    r, targets = with_roots(c)
    data = ndjson(GOOD, {"roots": [
        {"target": targets[0].key, "retained": 1200, "learned_at": NOW - 1, "future": 1,
         "roots": [[7, 400, NOW - 9], [8, 600, NOW - 4]]},
        {"target": "gone/m", "retained": None, "learned_at": None, "roots": [[9, 1, NOW]]},
        {"target": targets[1].key, "retained": None, "learned_at": None, "roots": []}]})
    got = pump(c, restore_bytes(r, data, c))
    assert (got.roots_merged, got.roots_dropped) == (2, 1)
    assert r.roots is not None
    assert list(r.roots.held(targets[0].id).items()) == [(7, 400), (8, 600)]
    assert r.roots.retained == {targets[0].id: 1200}
    bad = ndjson(GOOD, {"roots": [{"target": "x", "roots": []}, {"target": 3}]})
    with pytest.raises(SnapshotError, match=r"roots\[1\]: target"):
        decode(bad)
