"""Layer 1: the state file (pharos.peer.statefile) on a Clock: written every 30 s through a
temporary file, restored through the snapshot's merge, and a bad file starts the instance
empty."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

from twisted.internet.task import Clock
from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher
from zope.interface import implementer

from pharos.peer import snapshot
from pharos.peer.statefile import WRITE_EVERY, StateFile, read_snapshot
from tests.support.snapshot import NOW, clock, filled, replicas


def run(c: Clock, d: Any) -> Any:
    """Advance the clock in small steps until ``d`` fires; its result."""
    out: list[Any] = []
    d.addBoth(out.append)
    for _ in range(100_000):
        if out:
            break
        c.advance(0.001)
    assert out, "did not finish"
    return out[0]


def test_written_every_interval_and_renamed_into_place(tmp_path: Path) -> None:
    """The file appears after one interval, whole (it decodes), with no temporary file left;
    it is written again each interval."""
    c = clock()
    r, _ = filled(c)
    path = tmp_path / "pharos.state"
    writer = StateFile(str(path), r, c)
    writer.startService()
    assert not path.exists()
    c.advance(WRITE_EVERY)
    run(c, writer._idle())
    assert writer.written == 1
    assert read_snapshot(str(path)) is not None
    assert not (tmp_path / "pharos.state.tmp").exists()
    c.advance(WRITE_EVERY)
    run(c, writer._idle())
    assert writer.written == 2
    run(c, writer.stopService())
    c.advance(WRITE_EVERY * 3)
    assert writer.written == 2
    assert path.stat().st_mode & 0o777 == 0o600  # usage by key name is nobody else's


def test_restore_merges_what_was_written(tmp_path: Path) -> None:
    """An instance that starts from the file has the writer's prefix entries and usage."""
    c = clock()
    r, targets = filled(c)
    path = str(tmp_path / "s")
    assert run(c, StateFile(path, r, c).write()) is None
    fresh, ftargets = replicas(c, origin="b")
    assert run(c, StateFile(path, fresh, c).restore()) is None
    assert fresh.ledger.spent_today(key="alice") == 10
    keys = {t.id: t.key for t in targets}
    assert fresh.index.export({t.id: t.key for t in ftargets}.get) == r.index.export(keys.get)


def test_missing_truncated_or_corrupt_file_starts_empty(tmp_path: Path) -> None:
    """No file is a first start; a truncated, corrupt or unreadable one is logged and the
    restore still succeeds, merging nothing."""
    c = clock()
    r, _ = filled(c)
    good = snapshot.build_now(r, c)
    cases = {"missing": None, "truncated": good[: len(good) // 2], "corrupt": b"\x00" * 64,
             "not-json": gzip.compress(b"[1, 2"), "directory": b""}
    for name, data in cases.items():
        path = tmp_path / name
        if name == "directory":
            path.mkdir()
        elif data is not None:
            path.write_bytes(data)
        fresh, _ = replicas(c)
        assert run(c, StateFile(str(path), fresh, c).restore()) is None, name
        assert len(fresh.index) == 0 and fresh.ledger.export() == [], name


def test_a_failed_write_keeps_the_previous_file(tmp_path: Path) -> None:
    """A write that fails (here: its temporary file cannot be renamed) is counted and
    logged, never raised; the previous file stays whole."""
    c = clock()
    r, _ = filled(c)
    path = tmp_path / "s"
    writer = StateFile(str(path), r, c)
    run(c, writer.write())
    before = path.read_bytes()
    (tmp_path / "s.tmp").mkdir()  # os.open of the temporary file fails
    assert run(c, writer.write()) is None
    assert (writer.written, writer.failed) == (1, 1)
    assert path.read_bytes() == before


def test_writes_never_overlap(tmp_path: Path) -> None:
    """A write asked for while one is under way starts after it (the final write of a
    shutdown after a periodic one)."""
    c = clock()
    r, _ = filled(c)
    order: list[str] = []
    pending: list[Any] = []

    def slow_thread(f: Any) -> Any:
        from twisted.internet.defer import Deferred
        d: Deferred[Any] = Deferred()
        pending.append((f, d))
        order.append("start")
        return d

    writer = StateFile(str(tmp_path / "s"), r, c, in_thread=slow_thread)
    first, second = writer.write(), writer.write()
    for _ in range(1000):
        c.advance(0.001)
    assert order == ["start"]  # the second waits for the first
    f, d = pending.pop(0)
    d.callback(f())
    for _ in range(1000):
        c.advance(0.001)
    assert order == ["start", "start"]
    f, d = pending.pop(0)
    d.callback(f())
    assert run(c, first) is None and run(c, second) is None
    assert writer.written == 2
    assert c.seconds() > NOW


def test_a_bad_line_inside_a_whole_file_keeps_the_parts_before_it(tmp_path: Path) -> None:
    """A file that is whole gzip but has a bad line after its cells (a writer's bug, not a
    crash: the file is renamed into place whole) restores the parts before the line, logs
    that it restored only in part, and never fails the start."""
    c = clock()
    r, _ = filled(c)
    raw = gzip.decompress(snapshot.build_now(r, c)).splitlines()
    cells_at = next(i for i, line in enumerate(raw) if line.startswith(b'{"cells"'))
    path = tmp_path / "s"
    bad = [*raw[: cells_at + 1], b"{oops", *raw[cells_at + 1 :]]
    path.write_bytes(gzip.compress(b"\n".join(bad)))
    fresh, _ = replicas(c)
    logged: list[str] = []

    @implementer(ILogObserver)
    def observe(event: LogEvent) -> None:
        logged.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    try:
        assert run(c, StateFile(str(path), fresh, c).restore()) is None
    finally:
        globalLogPublisher.removeObserver(observe)
    assert fresh.ledger.spent_today(key="alice") == 10
    assert len(fresh.index) == 0  # the prefix parts come after the bad line
    assert any("restored only in part" in text for text in logged)
