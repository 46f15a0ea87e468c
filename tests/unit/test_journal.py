"""Layer 1: the journal (``pharos.journal``; the usage journal of issue 11 item 5 and the
decision log of issue 12 item 4): JSON lines in order, no disk I/O on the calling thread,
records handed to the writer in batches (on a timer or past a size, never one thread round
trip per record), the file kept open across batches and reopened after rotation, a bounded
buffer that drops and counts instead of blocking, ``close`` flushing everything, and errors
reported instead of raised.

The pool here runs the journal's work only when the test says so, in the test's thread:
whatever happened before ``run`` happened without the writer, so ``write`` alone did no
disk I/O; a writer stuck on a slow disk is a pool that is not run. The batch timer is a
``Clock``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.internet.interfaces import IReactorFromThreads
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool
from zope.interface import implementer

from pharos.journal import Journal


@implementer(IReactorFromThreads)
class Immediate:
    """A reactor whose ``callFromThread`` runs the call at once (the tests' single thread)."""

    def callFromThread(self, callable: Callable[..., Any], *args: Any, **kw: Any) -> None:
        callable(*args, **kw)


class HeldPool(ThreadPool):
    """A thread pool that holds each call until ``run``."""

    def __init__(self) -> None:
        super().__init__(0, 1)
        self.calls: list[tuple[Callable[[bool, Any], object], Callable[..., Any], tuple[Any, ...],
                               dict[str, Any]]] = []

    def callInThreadWithCallback(self, onResult: Callable[[bool, Any], object] | None,  # noqa: N803
                                 func: Callable[..., Any], *args: Any, **kw: Any) -> None:
        assert onResult is not None
        self.calls.append((onResult, func, args, kw))

    def run(self) -> int:
        """Run the held calls (and any they lead to); returns how many ran."""
        ran = 0
        while self.calls:
            on_result, func, args, kw = self.calls.pop(0)
            ran += 1
            try:
                result = func(*args, **kw)
            except Exception:
                on_result(False, Failure())
            else:
                on_result(True, result)
        return ran


def journal(path: Path, capacity: int = 100, **kw: Any) -> tuple[Journal, HeldPool, Clock]:
    pool, clock = HeldPool(), Clock()
    return Journal(path, Immediate(), capacity, pool, clock=clock, **kw), pool, clock


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


RECORD = {"key": "k", "tenant": "t", "model": "m", "target": "http://e:8000", "status": 200,
          "tokens": {"prompt": 12, "cached": 0, "completion": 3},
          "timings": {"ttft_ms": 41.5, "total_ms": 90.0}}


def test_records_land_as_json_lines_in_order(tmp_path: Path) -> None:
    """Each record becomes one JSON line, in the order written, even across batches taken
    while an earlier batch was being written; the file is appended to, never truncated."""
    path = tmp_path / "usage.jsonl"
    path.write_text('{"earlier": true}\n', encoding="utf-8")
    j, pool, clock = journal(path)
    assert j.write({**RECORD, "n": 0, "model": "modèle"})
    clock.advance(j.interval)  # the first batch is handed over, not yet written
    for i in range(1, 5):
        assert j.write({**RECORD, "n": i, "model": "modèle"})
    assert pool.run() == 1  # the first record alone; the four behind it wait for the timer
    assert len(lines(path)) == 2
    clock.advance(j.interval)
    assert pool.run() == 1
    got = lines(path)
    assert got[0] == {"earlier": True}
    assert [r["n"] for r in got[1:]] == [0, 1, 2, 3, 4]
    assert got[1] == {**RECORD, "n": 0, "model": "modèle"}
    assert (j.written, j.dropped, j.failed, j.error) == (5, 0, 0, None)
    assert j.batches == 2


def test_records_are_batched_one_round_trip_per_batch(tmp_path: Path) -> None:
    """Records written one at a time are not handed to the writer one by one: nothing goes
    to the pool before the timer fires, then the whole batch goes in one call; a batch that
    passes ``batch_records`` goes at once without waiting for the timer."""
    path = tmp_path / "usage.jsonl"
    j, pool, clock = journal(path, batch_records=10)
    for i in range(9):
        assert j.write({"n": i})
    assert pool.calls == []
    clock.advance(j.interval)
    assert len(pool.calls) == 1
    assert pool.run() == 1
    assert [r["n"] for r in lines(path)] == list(range(9))
    for i in range(9, 19):
        j.write({"n": i})
    assert len(pool.calls) == 1  # the tenth record filled a batch: no timer needed
    pool.run()
    assert [r["n"] for r in lines(path)] == list(range(19))
    assert j.batches == 2 and clock.getDelayedCalls() == []


def test_the_file_stays_open_and_a_rotated_file_is_followed(tmp_path: Path) -> None:
    """The writer keeps the file open across batches (one open for many), and when a log
    rotator renames the file the next batch goes to a new file at the path; the renamed
    file keeps what was written before."""
    path = tmp_path / "usage.jsonl"
    j, pool, clock = journal(path)
    j.write({"n": 0})
    clock.advance(j.interval)
    pool.run()
    opened = j._file.file
    assert opened is not None
    j.write({"n": 1})
    clock.advance(j.interval)
    pool.run()
    assert j._file.file is opened
    path.rename(tmp_path / "usage.jsonl.1")
    j.write({"n": 2})
    clock.advance(j.interval)
    pool.run()
    assert [r["n"] for r in lines(tmp_path / "usage.jsonl.1")] == [0, 1]
    assert [r["n"] for r in lines(path)] == [2]
    closed: list[None] = []
    j.close().addCallback(closed.append)
    pool.run()
    assert closed == [None] and j._file.file is None and opened.closed


def test_write_does_no_disk_io_on_the_calling_thread(tmp_path: Path) -> None:
    """``write`` only buffers: until the writer runs, nothing is opened or written, however
    many records were accepted."""
    path = tmp_path / "usage.jsonl"
    j, pool, clock = journal(path)
    for i in range(50):
        assert j.write({"n": i})
    clock.advance(j.interval)
    assert not path.exists()
    assert j.buffered == 50
    pool.run()
    assert len(lines(path)) == 50
    assert j.buffered == 0


def test_a_full_buffer_drops_and_counts_instead_of_blocking(tmp_path: Path) -> None:
    """With the writer stuck, ``write`` keeps returning at once: past ``capacity`` records
    (pending and being written) it drops and counts; once the writer catches up it accepts
    again, and only the accepted records are in the file."""
    path = tmp_path / "usage.jsonl"
    j, pool, clock = journal(path, capacity=3)
    got = [j.write({"n": i}) for i in range(1000)]
    assert got == [True] * 3 + [False] * 997
    assert j.dropped == 997
    clock.advance(j.interval)
    pool.run()
    assert j.write({"n": "after"})
    clock.advance(j.interval)
    pool.run()
    assert [r["n"] for r in lines(path)] == [0, 1, 2, "after"]


def test_the_byte_bound_drops_too(tmp_path: Path) -> None:
    """Big records are bounded by bytes as well as by count: with the writer stuck, records
    past ``max_bytes`` pending are dropped and counted."""
    path = tmp_path / "d.jsonl"
    j, pool, clock = journal(path, capacity=1000, max_bytes=10_000, batch_bytes=100_000)
    got = [j.write({"blob": "x" * 1000}) for _ in range(20)]
    assert got == [True] * 10 + [False] * 10
    assert j.dropped == 10
    j.close()
    pool.run()
    assert len(lines(path)) == 10


def test_close_flushes_what_is_buffered(tmp_path: Path) -> None:
    """``close`` hands over what is pending without waiting for the timer, and fires only
    after every accepted record is in the file; records written after it are dropped and
    counted."""
    path = tmp_path / "usage.jsonl"
    j, pool, clock = journal(path)
    for i in range(3):
        j.write({"n": i})
    closed: list[None] = []
    j.close().addCallback(closed.append)
    assert not j.write({"n": "late"})
    assert closed == []
    assert clock.getDelayedCalls() == []
    pool.run()
    assert closed == [None]
    assert [r["n"] for r in lines(path)] == [0, 1, 2]
    assert j.dropped == 1


def test_close_while_a_batch_is_written_flushes_the_rest(tmp_path: Path) -> None:
    """Records accepted while a batch is being written are written too when ``close`` comes
    before that batch lands, and the file is closed at the end."""
    path = tmp_path / "usage.jsonl"
    j, pool, clock = journal(path)
    j.write({"n": 0})
    clock.advance(j.interval)
    j.write({"n": 1})
    closed: list[None] = []
    j.close().addCallback(closed.append)
    assert pool.run() == 2
    assert closed == [None]
    assert [r["n"] for r in lines(path)] == [0, 1]
    assert j._file.file is None


def test_close_with_nothing_buffered_fires_at_once(tmp_path: Path) -> None:
    """Closing an idle journal fires immediately and touches no file."""
    j, pool, clock = journal(tmp_path / "usage.jsonl")
    closed: list[None] = []
    j.close().addCallback(closed.append)
    assert closed == [None]
    assert pool.calls == []
    assert not (tmp_path / "usage.jsonl").exists()


def test_an_unwritable_path_is_reported_not_raised(tmp_path: Path) -> None:
    """A journal whose directory does not exist counts the lost records in ``failed``, says
    why in ``error`` and logs it once (not per batch); nothing is raised into the reactor,
    ``close`` still fires, and once the path is writable the journal recovers."""
    path = tmp_path / "missing" / "usage.jsonl"
    j, pool, clock = journal(path)
    with capturedLogs() as events:
        for i in range(3):
            assert j.write({"n": i})
        clock.advance(j.interval)
        pool.run()
        j.write({"n": 3})
        clock.advance(j.interval)
        pool.run()
    assert j.failed == 4 and j.written == 0
    assert j.error is not None and "FileNotFoundError" in j.error
    [event] = [e for e in events if "cannot be written" in e.get("log_format", "")]
    assert event["path"] == str(path)
    path.parent.mkdir()
    j.write({"n": 4})
    closed: list[None] = []
    j.close().addCallback(closed.append)
    pool.run()
    assert closed == [None]
    assert [r["n"] for r in lines(path)] == [4]
    assert j.error is None


def test_a_record_that_is_not_json_is_counted_not_raised(tmp_path: Path) -> None:
    """A record that cannot be serialized (an object, NaN) is refused and counted in
    ``failed`` without raising into the caller (an on_done subscriber); the records around
    it are written."""
    path = tmp_path / "usage.jsonl"
    j, pool, clock = journal(path)
    with capturedLogs() as events:
        assert j.write({"n": 1})
        assert not j.write({"n": object()})
        assert not j.write({"n": float("nan")})
        assert j.write({"n": 2})
    clock.advance(j.interval)
    pool.run()
    assert j.failed == 2
    assert len([e for e in events if "as JSON" in e.get("log_format", "")]) == 2
    assert [r["n"] for r in lines(path)] == [1, 2]
