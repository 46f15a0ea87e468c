"""The Snapshot of spec §12: what ``GET /peer/snapshot`` serves and the state file holds.

Gzip'd versioned JSON::

    {"proto": 1, "origin": "...", "taken_at": 1764633600.0,
     "prefix": [[link_hash, [[target_key, last_used], ...]], ...],   most recently used first
     "cells":  [{...Ledger.export row...}, ...],                      Day cells of every origin
     "stats":  [{"target": key, "prefill_sec_per_token": x, "load_sec": y, "service_sec": z}]}

Prompt text never appears: a prefix entry is a 64-bit link hash and the targets that held it.
Each replicated module owns its export and merge (``PrefixIndex.iter_export``/``merge``,
``Ledger.iter_export``/``merge``, ``State.export_stats``/``merge_stats``); this module only
turns them into bytes and back. Unknown fields (and trailing list items) are ignored so mixed
versions interoperate; ``PROTO`` is bumped only for a breaking change. ``build`` works in small
steps on the injected clock (a full index and 400 days of cells take seconds to encode); so
does ``restore_in_steps``, for a running instance merging a big snapshot.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import Cooperator

from pharos.prefix import Entry, PrefixIndex, Source, WireSlot
from pharos.state.state import State
from pharos.state.stats import parse_stats
from pharos.usage import Ledger, parse_cell

#: Wire version shared by deltas, snapshots and the state file.
PROTO: Final = 1
#: Items encoded or merged per step; the cooperator runs steps for about 10 ms, then lets the
#: reactor run.
STEP_ITEMS: Final = 256
#: A snapshot inflating past this is refused (a gzip bomb, or not a snapshot): 200k prefix
#: entries and 80k cells take about 35 MB.
MAX_DECODED_BYTES: Final = 512 * 1024 * 1024
_U64: Final = 2**64
#: Seconds between two slices of steps: the next reactor turn (a zero delay would run every
#: slice within one ``Clock.advance``).
TURN: Final = 1e-6


class SnapshotError(ValueError):
    """Garbage, truncated gzip, a wrong shape, or an incompatible proto."""


@dataclass
class Replicas:
    """The replicated modules a snapshot is taken from and merged into."""

    state: State
    index: PrefixIndex
    ledger: Ledger


@dataclass(frozen=True)
class Snapshot:
    """A decoded snapshot, checked all through: ``restore`` cannot fail half way."""

    proto: int
    origin: str
    taken_at: float
    prefix: tuple[Entry, ...] = ()
    cells: tuple[Mapping[str, object], ...] = ()
    stats: tuple[Mapping[str, object], ...] = ()


@dataclass
class Restored:
    """What a restore merged and dropped, per part (prefix counted in slots)."""

    prefix_merged: int = 0
    prefix_dropped: int = 0  # slots of targets not seen here (yet)
    cells_changed: int = 0
    cells_unchanged: int = 0  # already known, or past retention
    stats_taken: int = 0
    stats_pending: int = 0  # rows for targets not seen yet, taken when they appear

    def __str__(self) -> str:
        return (f"prefix {self.prefix_merged} merged, {self.prefix_dropped} dropped; "
                f"cells {self.cells_changed} changed, {self.cells_unchanged} unchanged; "
                f"stats {self.stats_taken} taken, {self.stats_pending} pending")


# --- build ------------------------------------------------------------------------------------


def build(replicas: Replicas, clock: IReactorTime, *,
          steps_per_turn: int | None = None) -> Deferred[bytes]:
    """The snapshot of ``replicas`` as gzip'd JSON, encoded in steps on ``clock`` so the
    reactor keeps serving (the prefix index is copied a shard per step first, the cells when
    their turn comes). ``steps_per_turn``: a fixed number of steps per reactor turn instead
    of about 10 ms of them (tests)."""
    out: list[bytes] = []
    steps = _build_steps(replicas, clock.seconds(), out)
    d = _cooperate(clock, steps, steps_per_turn)
    return d.addCallback(lambda _: b"".join(out))


def build_now(replicas: Replicas, clock: IReactorTime) -> bytes:
    """``build`` in one go (tests, and tools with no reactor to spare)."""
    out: list[bytes] = []
    for _ in _build_steps(replicas, clock.seconds(), out):
        pass
    return b"".join(out)


def _build_steps(replicas: Replicas, taken_at: float, out: list[bytes]) -> Iterator[None]:
    gz = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: a gzip header and trailer

    def put(text: str) -> None:
        out.append(gz.compress(text.encode()))

    state, ledger = replicas.state, replicas.ledger
    header = {"proto": PROTO, "origin": ledger.origin, "taken_at": taken_at}
    put(json.dumps(header)[:-1])
    copy: PrefixIndex | None = None
    for copy in replicas.index.copy_in_steps():
        if copy is None:
            yield None
    assert copy is not None
    # Targets are only ever added, so names and gens read now cover every slot of the copy.
    keys = {t.id: t.key for t in state.targets}
    gens = {t.id: t.gen for t in state.targets}
    put(', "prefix": [')
    first = True
    for batch in _batches(copy.iter_export(keys.get, gens)):
        text = json.dumps([[e.key, [[s.target_key, s.last_used] for s in e.slots]]
                           for e in batch], separators=(",", ":"))
        put(("" if first else ",") + text[1:-1])
        first = False
        yield None
    put('], "cells": [')
    first = True
    for rows in _batches(ledger.iter_export(minutes=False)):
        put(("" if first else ",") + json.dumps(rows, separators=(",", ":"))[1:-1])
        first = False
        yield None
    put('], "stats": ' + json.dumps(state.export_stats(), separators=(",", ":")) + "}")
    out.append(gz.flush())


def _batches(items: Iterator[Any], size: int = STEP_ITEMS) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _cooperate(clock: IReactorTime, steps: Iterator[None],
               steps_per_turn: int | None = None) -> Deferred[None]:
    """Run ``steps`` a slice at a time on ``clock`` (about 10 ms of them, or
    ``steps_per_turn``); fires when they are done."""
    if steps_per_turn is None:
        coop = Cooperator(scheduler=lambda f: clock.callLater(TURN, f))
    else:
        def budget() -> Callable[[], bool]:
            left = [steps_per_turn]

            def spent() -> bool:
                left[0] -= 1
                return left[0] <= 0

            return spent

        coop = Cooperator(terminationPredicateFactory=budget,
                          scheduler=lambda f: clock.callLater(TURN, f))
    d: Deferred[Any] = coop.coiterate(steps)

    def stop(result: object) -> object:
        coop.stop()
        return result

    return d.addBoth(stop)


# --- decode -----------------------------------------------------------------------------------


def decode(data: bytes) -> Snapshot:
    """A snapshot's bytes back, checked all through; ``SnapshotError`` says what is wrong."""
    try:
        inflate = zlib.decompressobj(31)
        raw = inflate.decompress(data, MAX_DECODED_BYTES)
        if inflate.unconsumed_tail:
            raise SnapshotError(f"larger than {MAX_DECODED_BYTES} bytes once inflated")
        if not inflate.eof:
            raise SnapshotError("truncated: the gzip stream ends early")
    except zlib.error as e:
        raise SnapshotError(f"not gzip: {e}") from None
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        raise SnapshotError(f"not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise SnapshotError(f"expected a JSON object, not {type(doc).__name__}")
    proto = doc.get("proto")
    if type(proto) is not int:
        raise SnapshotError(f"proto must be an integer, not {proto!r}")
    if proto != PROTO:
        raise SnapshotError(f"proto {proto} is not this release's {PROTO}")
    origin = doc.get("origin")
    if not isinstance(origin, str):
        raise SnapshotError(f"origin must be a string, not {origin!r}")
    taken_at = doc.get("taken_at")
    if not _finite(taken_at):
        raise SnapshotError(f"taken_at must be a number, not {taken_at!r}")
    assert isinstance(taken_at, int | float)
    prefix = tuple(_entry(e, i) for i, e in enumerate(_list(doc, "prefix")))
    cells = _list(doc, "cells")
    for i, cell in enumerate(cells):
        if not isinstance(cell, dict):
            raise SnapshotError(f"cells[{i}]: expected an object")
        try:
            parse_cell(cell)
        except ValueError as e:
            raise SnapshotError(f"cells[{i}]: {e}") from None
    stats = _list(doc, "stats")
    for i, row in enumerate(stats):
        if not isinstance(row, dict) or not isinstance(row.get("target"), str):
            raise SnapshotError(f"stats[{i}]: expected an object with a target string")
        try:
            parse_stats(row)
        except ValueError as e:
            raise SnapshotError(f"stats[{i}]: {e}") from None
    return Snapshot(proto, origin, float(taken_at), prefix, tuple(cells), tuple(stats))


def _finite(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def _list(doc: Mapping[str, object], name: str) -> list[Any]:
    value = doc.get(name)
    if value is None:
        return []  # a part added later, or left out: nothing of it
    if not isinstance(value, list):
        raise SnapshotError(f"{name} must be a list, not {type(value).__name__}")
    return value


def _entry(raw: object, i: int) -> Entry:
    if not isinstance(raw, list) or len(raw) < 2:
        raise SnapshotError(f"prefix[{i}]: expected [hash, slots]")
    key, slots = raw[0], raw[1]
    if type(key) is not int or not 0 <= key < _U64:
        raise SnapshotError(f"prefix[{i}]: the hash must be a 64-bit unsigned integer")
    if not isinstance(slots, list):
        raise SnapshotError(f"prefix[{i}]: slots must be a list")
    wire = []
    for slot in slots:
        if (not isinstance(slot, list) or len(slot) < 2 or not isinstance(slot[0], str)
                or not _finite(slot[1])):
            raise SnapshotError(f"prefix[{i}]: a slot must be [target key, last used]")
        wire.append(WireSlot(slot[0], float(slot[1])))
    return Entry(key, tuple(wire))


# --- restore ----------------------------------------------------------------------------------


def restore(replicas: Replicas, snap: Snapshot, now: float,
            source: Source = "restored") -> Restored:
    """Merge ``snap`` through each module's own ``merge`` in one go (idempotent, so merging
    several sources, or one twice, is safe). Prefix slots of targets not seen here are dropped
    (restore after the first scrape round); stats of such targets wait for them."""
    done = Restored()
    for _ in _restore_steps(replicas, snap, lambda: now, source, done, whole=True):
        pass
    return done


def restore_in_steps(replicas: Replicas, snap: Snapshot, clock: IReactorTime,
                     source: Source = "restored", *,
                     steps_per_turn: int | None = None) -> Deferred[Restored]:
    """``restore`` in steps on ``clock``, for an instance that serves meanwhile."""
    done = Restored()
    steps = _restore_steps(replicas, snap, clock.seconds, source, done, whole=False)
    return _cooperate(clock, steps, steps_per_turn).addCallback(lambda _: done)


def _restore_steps(replicas: Replicas, snap: Snapshot, now: Callable[[], float],
                   source: Source, done: Restored, whole: bool) -> Iterator[None]:
    state = replicas.state
    ids = {t.key: t.id for t in state.targets}
    gens = {t.id: t.gen for t in state.targets}
    size = len(snap.prefix) if whole else STEP_ITEMS
    # Oldest batch first: merge applies a batch from its oldest entry, so the LRU order of
    # the whole snapshot carries over.
    for end in range(len(snap.prefix), 0, -max(size, 1)):
        batch = snap.prefix[max(0, end - size):end]
        slots = sum(len(e.slots) for e in batch)
        dropped = replicas.index.merge(batch, ids.get, gens, now(), source)
        done.prefix_merged += slots - dropped
        done.prefix_dropped += dropped
        yield None
    size = len(snap.cells) if whole else STEP_ITEMS
    for start in range(0, len(snap.cells), max(size, 1)):
        batch_cells: Sequence[Mapping[str, object]] = snap.cells[start:start + size]
        changed = replicas.ledger.merge(batch_cells)
        done.cells_changed += changed
        done.cells_unchanged += len(batch_cells) - changed
        yield None
    taken, pending = state.merge_stats(snap.stats)
    done.stats_taken += taken
    done.stats_pending += pending
