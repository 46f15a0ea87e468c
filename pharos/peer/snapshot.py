"""The Snapshot: what ``GET /peer/snapshot`` serves and the state file holds.

Gzip of newline-delimited JSON, so it is written and read in small steps (a full snapshot is
tens of MB of JSON: one ``json.loads`` of it holds the GIL for seconds)::

    {"proto": 1, "origin": "...", "taken_at": 1764633600.0}                 the header, first
    {"stats": [{"target": key, "prefill_sec_per_token": x, "load_sec": y, "service_sec": z}]}
    {"cells": [{...Ledger.export row...}, ...]}                              Day cells, any origin
    {"prefix": [[link_hash, [[target_key, last_used], ...]], ...]}
    {"roots": [{"target": key, "retained": n, "learned_at": t, "roots": [[hash, tokens, t]]}]}

A part line holds at most ``PART_ITEMS`` items. Prefix parts come least recently used part
first, each part's entries most recent first (as ``PrefixIndex.merge`` takes them), so merging
each part as it arrives rebuilds the writer's LRU order. The ``roots`` part is optional: older
proto-1 writers do not send it and ignore it as an unknown kind. Readers take parts in any
order and number; unknown fields, part kinds and trailing list items are ignored so mixed
versions interoperate; ``PROTO`` is bumped only for a breaking change, and a newer one is
refused. (A small snapshot of the first proto-1 writers, one JSON object on one line, is a
header carrying all three parts: it still reads.)

Prompt text never appears: a prefix entry is a 64-bit link hash and the targets that held it.
Each replicated module owns its export and merge; this module only turns them into bytes and
back, in steps on the injected clock, so an instance merging a peer's snapshot keeps serving.

A bad stream raises ``SnapshotError``. ``restore_bytes`` first inflates the whole stream
without parsing it, so a truncated or corrupt gzip stream (its CRC) merges nothing; a whole
gzip stream with a bad line has the parts before that line merged. That is safe: every merge
is idempotent and max-based, so a partial merge is a subset of a valid snapshot's effect.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import Cooperator

from pharos.prefix import Entry, PrefixIndex, Source, WireSlot
from pharos.retention import RootCaches, RootsRow, parse_roots_row
from pharos.state.state import State
from pharos.state.stats import parse_stats
from pharos.usage import Ledger, parse_cell

#: Wire version shared by deltas, snapshots and the state file.
PROTO: Final = 1
#: Items per part line: parsed and merged in one step of about a ms, and a line's objects
#: stay under the collector's generation-0 threshold (700); larger lines set off young
#: collections that promoted their objects and brought on full collections.
PART_ITEMS: Final = 128
#: Bytes inflated per reading step.
INFLATE_STEP: Final = 256 * 1024
#: Bytes inflated per step of the first pass that only checks the gzip stream.
CHECK_STEP: Final = 4 * 1024 * 1024
#: A longer line is refused (parsing it would hold the reactor for tens of ms).
MAX_LINE_BYTES: Final = 1024 * 1024
#: A snapshot inflating past this is refused (a gzip bomb, or not a snapshot).
MAX_DECODED_BYTES: Final = 512 * 1024 * 1024
_U64: Final = 2**64
#: Seconds between two slices of steps: the next reactor turn (a zero delay would run every
#: slice within one ``Clock.advance``).
TURN: Final = 1e-6
#: The part kinds this release reads.
PARTS: Final = ("prefix", "cells", "stats", "roots")
#: ``RootsRow``s per ``roots`` line (each up to ``retention.ROW_ROOTS`` roots: about 50 KB).
ROOT_ROWS: Final = 8


@dataclass
class Restored:
    """What a restore merged and dropped, per part (prefix in slots), and whose snapshot."""

    prefix_merged: int = 0
    prefix_dropped: int = 0  # slots of targets not seen here (yet)
    cells_changed: int = 0
    cells_unchanged: int = 0  # already known, or past retention
    stats_taken: int = 0
    stats_pending: int = 0  # rows for targets not seen yet, taken when they appear
    roots_merged: int = 0  # roots that changed the picture here
    roots_dropped: int = 0  # roots of targets not seen here, or no picture kept here
    origin: str | None = None
    taken_at: float | None = None

    @property
    def merged_any(self) -> bool:
        return bool(self.prefix_merged or self.prefix_dropped or self.cells_changed
                    or self.cells_unchanged or self.stats_taken or self.stats_pending
                    or self.roots_merged or self.roots_dropped)

    def __str__(self) -> str:
        return (f"prefix {self.prefix_merged} merged, {self.prefix_dropped} dropped; "
                f"cells {self.cells_changed} changed, {self.cells_unchanged} unchanged; "
                f"stats {self.stats_taken} taken, {self.stats_pending} pending; "
                f"roots {self.roots_merged} merged, {self.roots_dropped} dropped")


class SnapshotError(ValueError):
    """Garbage, truncated gzip, a wrong shape, or an incompatible proto. ``partial``: what a
    ``restore_bytes`` merged before the defect (whole parts only), if anything."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.partial: Restored | None = None


@dataclass
class Replicas:
    """The replicated modules a snapshot is taken from and merged into (``roots``: the
    scheduler's picture of each engine's root cache; None: not carried)."""

    state: State
    index: PrefixIndex
    ledger: Ledger
    roots: RootCaches | None = None


@dataclass(frozen=True)
class StateSnapshot:
    """A whole decoded snapshot (tests and tools), prefix entries most recent first."""

    proto: int
    origin: str
    taken_at: float
    prefix: tuple[Entry, ...] = ()
    cells: tuple[Mapping[str, object], ...] = ()
    stats: tuple[Mapping[str, object], ...] = ()
    roots: tuple[RootsRow, ...] = ()


# --- build ------------------------------------------------------------------------------------


def build(replicas: Replicas, clock: IReactorTime, *,
          steps_per_turn: int | None = None) -> Deferred[bytes]:
    """The snapshot of ``replicas`` as bytes, a part per step on ``clock`` so the reactor
    keeps serving. ``steps_per_turn``: a fixed number of steps per turn (tests)."""
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

    def line(doc: Mapping[str, object]) -> None:
        out.append(gz.compress(json.dumps(doc, separators=(",", ":")).encode() + b"\n"))

    state, ledger = replicas.state, replicas.ledger
    line({"proto": PROTO, "origin": ledger.origin, "taken_at": taken_at})
    copy: PrefixIndex | None = None
    for copy in replicas.index.copy_in_steps():
        if copy is None:
            yield None
    assert copy is not None
    line({"stats": state.export_stats()})
    # Targets are only ever added, so names and gens read now cover every slot of the copy.
    keys = {t.id: t.key for t in state.targets}
    gens = {t.id: t.gen for t in state.targets}
    if replicas.roots is not None:
        for rows in _batches(iter(replicas.roots.export(keys.get)), ROOT_ROWS):
            line({"roots": [row.to_json() for row in rows]})
            yield None
    for rows in _batches(ledger.iter_export(minutes=False)):
        line({"cells": rows})
        yield None
    for batch in _batches(copy.iter_export(keys.get, gens, newest_first=False)):
        line({"prefix": [[e.key, [[s.target_key, s.last_used] for s in e.slots]]
                         for e in reversed(batch)]})
        yield None
    out.append(gz.flush())


def _batches(items: Iterator[Any], size: int = PART_ITEMS) -> Iterator[list[Any]]:
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
    """Run ``steps`` a slice (about 10 ms, or ``steps_per_turn``) at a time on ``clock``."""
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


# --- read -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Header:
    proto: int
    origin: str
    taken_at: float


#: What reading yields: None between steps, the header, or one checked part.
_Event = tuple[str, Any] | None


def _check_gzip(data: bytes) -> Iterator[None]:
    """Inflate the whole stream without keeping it, a step at a time: a truncated or corrupt
    one (zlib checks the gzip CRC and length) raises before anything is merged."""
    for _ in _inflated(data, CHECK_STEP):
        yield None


def _inflated(data: bytes, step: int) -> Iterator[bytes]:
    """The inflated stream, at most ``step`` bytes at a time; every defect a SnapshotError."""
    inflate = zlib.decompressobj(31)
    pending, total = data, 0
    while not inflate.eof:
        try:
            chunk = inflate.decompress(pending, step)
        except zlib.error as e:
            raise SnapshotError(f"not gzip: {e}") from None
        pending = inflate.unconsumed_tail
        if not chunk and not pending and not inflate.eof:
            raise SnapshotError("truncated: the gzip stream ends early")
        total += len(chunk)
        if total > MAX_DECODED_BYTES:
            raise SnapshotError(f"larger than {MAX_DECODED_BYTES} bytes once inflated")
        yield chunk
    if inflate.unused_data:
        raise SnapshotError("trailing bytes after the gzip stream")


def _lines(data: bytes) -> Iterator[bytes | None]:
    """The stream's non-empty lines, None after each inflated chunk."""
    rest = b""
    for chunk in _inflated(data, INFLATE_STEP):
        *whole, rest = (rest + chunk).split(b"\n")
        for line in (*whole, rest):
            if len(line) > MAX_LINE_BYTES:
                raise SnapshotError(f"a line longer than {MAX_LINE_BYTES} bytes")
        yield from (line for line in whole if line.strip())
        yield None
    if rest.strip():
        yield rest


def _events(data: bytes) -> Iterator[_Event]:
    """The header, then each part checked through, a line per step. Parts before a defect
    are yielded before it raises."""
    counts = dict.fromkeys(PARTS, 0)
    header: _Header | None = None
    for line in _lines(data):
        if line is None:
            yield None
            continue
        try:
            doc = json.loads(line)
        except (UnicodeDecodeError, ValueError) as e:
            raise SnapshotError(f"not JSON: {e}") from None
        if not isinstance(doc, dict):
            raise SnapshotError(f"expected a JSON object, not {type(doc).__name__}")
        if header is None:
            header = _header(doc)
            yield "header", header
        for kind in PARTS:
            if kind in doc:
                items = _part(doc, kind, counts[kind])
                counts[kind] += len(items)
                yield kind, items
    if header is None:
        raise SnapshotError("truncated: no header")


def _header(doc: Mapping[str, object]) -> _Header:
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
    return _Header(proto, origin, float(taken_at))


def _part(doc: Mapping[str, object], kind: str, first: int) -> list[Any]:
    """One part's items, checked all through (``first``: the index of its first item among
    all parts of its kind, for messages)."""
    items = doc[kind]
    if items is None:
        return []
    if not isinstance(items, list):
        raise SnapshotError(f"{kind} must be a list, not {type(items).__name__}")
    if kind == "prefix":
        return [_entry(e, first + i) for i, e in enumerate(items)]
    if kind == "roots":
        rows: list[RootsRow] = []
        for i, item in enumerate(items, first):
            try:
                rows.append(parse_roots_row(item))
            except ValueError as e:
                raise SnapshotError(f"roots[{i}]: {e}") from None
        return rows
    for i, item in enumerate(items, first):
        if kind == "cells":
            if not isinstance(item, dict):
                raise SnapshotError(f"cells[{i}]: expected an object")
            try:
                parse_cell(item)
            except ValueError as e:
                raise SnapshotError(f"cells[{i}]: {e}") from None
        else:
            if not isinstance(item, dict) or not isinstance(item.get("target"), str):
                raise SnapshotError(f"stats[{i}]: expected an object with a target string")
            try:
                parse_stats(item)
            except ValueError as e:
                raise SnapshotError(f"stats[{i}]: {e}") from None
    return items


def decode(data: bytes) -> StateSnapshot:
    """A whole snapshot's bytes back, checked all through (tests and tools; an instance uses
    ``restore_bytes``). ``SnapshotError`` says what is wrong."""
    header: _Header | None = None
    parts: dict[str, list[Any]] = {kind: [] for kind in PARTS}
    prefix_parts: list[list[Entry]] = []
    for event in _events(data):
        if event is None:
            continue
        kind, value = event
        if kind == "header":
            header = value
        elif kind == "prefix":
            prefix_parts.append(value)
        else:
            parts[kind].extend(value)
    assert header is not None
    prefix = tuple(e for part in reversed(prefix_parts) for e in part)
    return StateSnapshot(header.proto, header.origin, header.taken_at, prefix,
                    tuple(parts["cells"]), tuple(parts["stats"]), tuple(parts["roots"]))


def _finite(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


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


def restore(replicas: Replicas, snap: StateSnapshot, now: float,
            source: Source = "restored") -> Restored:
    """Merge a decoded ``snap`` through each module's ``merge`` in one go (tests and tools).
    Prefix slots of targets not seen here are dropped (restore after the first scrape
    round); stats of such targets wait for them."""
    done = Restored(origin=snap.origin, taken_at=snap.taken_at)
    _merge(replicas, "prefix", snap.prefix, now, source, done)
    _merge(replicas, "cells", snap.cells, now, source, done)
    _merge(replicas, "stats", snap.stats, now, source, done)
    _merge(replicas, "roots", snap.roots, now, source, done)
    return done


def restore_bytes(replicas: Replicas, data: bytes, clock: IReactorTime,
                  source: Source = "restored", *,
                  steps_per_turn: int | None = None) -> Deferred[Restored]:
    """Check, decode and merge a snapshot's bytes in steps on ``clock``, each part as it is
    read, so neither the JSON nor the decoded snapshot is held whole. Fails with
    ``SnapshotError`` (``partial``: whole parts merged before a defect)."""
    done = Restored()
    steps = _restore_steps(replicas, data, clock.seconds, source, done)
    d = _cooperate(clock, steps, steps_per_turn)

    def failed(f: Any) -> Any:
        if f.check(SnapshotError) and done.merged_any:
            f.value.partial = done
        return f

    return d.addCallbacks(lambda _: done, failed)


def _restore_steps(replicas: Replicas, data: bytes, now: Callable[[], float],
                   source: Source, done: Restored) -> Iterator[None]:
    yield from _check_gzip(data)
    for event in _events(data):
        if event is not None:
            kind, value = event
            if kind == "header":
                done.origin, done.taken_at = value.origin, value.taken_at
            else:
                _merge(replicas, kind, value, now(), source, done)
        yield None


def _merge(replicas: Replicas, kind: str, items: Any, now: float, source: Source,
           done: Restored) -> None:
    """One checked part through its module's merge (target ids and gens read afresh: a
    serving instance may register targets or bump gens between parts)."""
    state = replicas.state
    if kind == "prefix":
        if not items:
            return
        ids = {t.key: t.id for t in state.targets}
        gens = {t.id: t.gen for t in state.targets}
        slots = sum(len(e.slots) for e in items)
        dropped = replicas.index.merge(items, ids.get, gens, now, source)
        done.prefix_merged += slots - dropped
        done.prefix_dropped += dropped
    elif kind == "cells":
        changed = replicas.ledger.merge(items)
        done.cells_changed += changed
        done.cells_unchanged += len(items) - changed
    elif kind == "stats":
        taken, pending = state.merge_stats(items)
        done.stats_taken += taken
        done.stats_pending += pending
    elif kind == "roots":
        if replicas.roots is None:
            done.roots_dropped += sum(len(row.roots) for row in items)
            return
        ids = {t.key: t.id for t in state.targets}
        merged, dropped = replicas.roots.merge(items, ids.get)
        done.roots_merged += merged
        done.roots_dropped += dropped
