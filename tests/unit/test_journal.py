"""Layer 1: the usage journal (``pharos.journal``, issue 11 item 5): JSON lines in order,
no disk I/O on the calling thread, a bounded buffer that drops and counts instead of
blocking, ``close`` flushing, and errors reported instead of raised.

The pool here runs the journal's work only when the test says so, in the test's thread:
whatever happened before ``run`` happened without the writer, so ``write`` alone did no
disk I/O; a writer stuck on a slow disk is a pool that is not run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.internet.interfaces import IReactorFromThreads
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


def journal(path: Path, capacity: int = 100) -> tuple[Journal, HeldPool]:
    pool = HeldPool()
    return Journal(path, Immediate(), capacity, pool), pool


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
    j, pool = journal(path)
    for i in range(5):
        assert j.write({**RECORD, "n": i, "model": "modèle"})
    assert pool.run() == 2  # the first record alone, then the four that queued behind it
    got = lines(path)
    assert got[0] == {"earlier": True}
    assert [r["n"] for r in got[1:]] == [0, 1, 2, 3, 4]
    assert got[1] == {**RECORD, "n": 0, "model": "modèle"}
    assert (j.written, j.dropped, j.failed, j.error) == (5, 0, 0, None)


def test_write_does_no_disk_io_on_the_calling_thread(tmp_path: Path) -> None:
    """``write`` only buffers: until the writer runs, nothing is opened or written, however
    many records were accepted."""
    path = tmp_path / "usage.jsonl"
    j, pool = journal(path)
    for i in range(50):
        assert j.write({"n": i})
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
    j, pool = journal(path, capacity=3)
    got = [j.write({"n": i}) for i in range(1000)]
    assert got == [True] * 3 + [False] * 997
    assert j.dropped == 997
    pool.run()
    assert j.write({"n": "after"})
    pool.run()
    assert [r["n"] for r in lines(path)] == [0, 1, 2, "after"]


def test_close_flushes_what_is_buffered(tmp_path: Path) -> None:
    """``close`` fires only after every accepted record is in the file; records written
    after it are dropped and counted."""
    path = tmp_path / "usage.jsonl"
    j, pool = journal(path)
    for i in range(3):
        j.write({"n": i})
    closed: list[None] = []
    j.close().addCallback(closed.append)
    assert not j.write({"n": "late"})
    assert closed == []
    pool.run()
    assert closed == [None]
    assert [r["n"] for r in lines(path)] == [0, 1, 2]
    assert j.dropped == 1


def test_close_with_nothing_buffered_fires_at_once(tmp_path: Path) -> None:
    """Closing an idle journal fires immediately and touches no file."""
    j, pool = journal(tmp_path / "usage.jsonl")
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
    j, pool = journal(path)
    with capturedLogs() as events:
        for i in range(3):
            assert j.write({"n": i})
        pool.run()
        j.write({"n": 3})
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
    j, pool = journal(path)
    with capturedLogs() as events:
        assert j.write({"n": 1})
        assert not j.write({"n": object()})
        assert not j.write({"n": float("nan")})
        assert j.write({"n": 2})
    pool.run()
    assert j.failed == 2
    assert len([e for e in events if "as JSON" in e.get("log_format", "")]) == 2
    assert [r["n"] for r in lines(path)] == [1, 2]
