"""Layer 1: following a log file (``FileFeed``) and splitting lines (``LineSplitter``).

The followed file is written and rotated with ``twisted.python.logfile.LogFile`` and
``DailyLogFile`` (the rotation twistd itself uses); polls run on a ``Clock``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, globalLogPublisher
from twisted.python.failure import Failure
from twisted.python.logfile import DailyLogFile, LogFile
from zope.interface import implementer

from pharos.discovery.feed import MAX_LINE_BYTES, FeedUnavailable, LineSplitter
from pharos.discovery.logfile import CHUNK_BYTES, POLL_INTERVAL, FileFeed, FileGone, feed_for


class Followed:
    """A FileFeed connected on a Clock, with the lines it delivered and how it ended."""

    def __init__(self, path: Path, **kw: Any) -> None:
        self.clock = Clock()
        self.feed = FileFeed(str(path), self.clock, **kw)
        self.lines: list[bytes] = []
        self.ended: list[Failure] = []
        self.d: Deferred[None] = self.feed.connect(self.lines.append)
        self.d.addErrback(self.ended.append)

    def poll(self) -> None:
        """Let one poll interval pass (``Clock.advance`` also runs the turns it schedules at
        once, so whatever is waiting is read)."""
        self.clock.advance(POLL_INTERVAL)

    def stop(self) -> None:
        """Cancel the feed; nothing is left scheduled."""
        self.d.cancel()
        assert self.clock.getDelayedCalls() == []


def test_reads_from_start_and_follows_growth(tmp_path: Path) -> None:
    """Lines already in the file arrive at connect; later ones at the next poll, in order."""
    lf = LogFile("engine.log", str(tmp_path))
    lf.write("one\ntwo\n")
    f = Followed(tmp_path / "engine.log")
    assert f.lines == [b"one", b"two"]
    lf.write("three\n")
    assert f.lines == [b"one", b"two"]  # nothing until the poll
    f.poll()
    assert f.lines == [b"one", b"two", b"three"]
    f.stop()
    lf.close()


def test_partial_last_line_waits_for_its_newline(tmp_path: Path) -> None:
    """A line the engine is still writing is held until its newline arrives."""
    lf = LogFile("engine.log", str(tmp_path))
    lf.write("whole\nhal")
    f = Followed(tmp_path / "engine.log")
    assert f.lines == [b"whole"]
    lf.write("f of it")
    f.poll()
    assert f.lines == [b"whole"]
    lf.write("\r\nnext\n")
    f.poll()
    assert f.lines == [b"whole", b"half of it", b"next"]
    f.stop()
    lf.close()


def test_rotation_between_two_polls_drains_the_old_file_first(tmp_path: Path) -> None:
    """LogFile rotates (path -> path.1, a new path) between polls: the old file's last lines
    come first, then the new file from its start; nothing is lost or repeated."""
    lf = LogFile("engine.log", str(tmp_path))
    lf.write("a\nb\n")
    f = Followed(tmp_path / "engine.log")
    lf.write("c\n")  # written to the old file after the last poll
    lf.rotate()
    lf.write("d\ne\n")
    f.poll()
    assert f.lines == [b"a", b"b", b"c", b"d", b"e"]
    assert f.feed.rotations == 1
    assert (tmp_path / "engine.log.1").read_bytes() == b"a\nb\nc\n"
    lf.write("f\n")
    f.poll()
    assert f.lines[-1] == b"f"
    f.stop()
    lf.close()


def test_size_rotation_several_times_between_polls(tmp_path: Path) -> None:
    """LogFile's own size rotation (rotateLength) twice between polls: the feed follows the
    path, so it reads the old file it holds and the newest one; the middle file is missed,
    which is the price of polling (one poll a second; engines log far slower)."""
    lf = LogFile("engine.log", str(tmp_path), rotateLength=10)
    lf.write("line-0001\n")
    f = Followed(tmp_path / "engine.log")
    for i in range(2, 6):
        lf.write(f"line-{i:04d}\n")  # each write past 10 bytes rotates first
    f.poll()
    assert f.lines[0] == b"line-0001"
    assert f.lines[-1] == b"line-0005"
    assert f.feed.rotations == 1
    f.stop()
    lf.close()


class ClockDailyLogFile(DailyLogFile):
    """A DailyLogFile whose day comes from a test clock (``toDate`` is its test hook)."""

    def __init__(self, name: str, directory: str, clock: Clock) -> None:
        self.clock = clock
        super().__init__(name, directory)

    def toDate(self, *args: Any) -> tuple[int, int, int]:
        when = args[0] if args else self.clock.seconds()
        return tuple(time.gmtime(when)[:3])  # type: ignore[return-value]


def test_daily_rotation_is_followed(tmp_path: Path) -> None:
    """DailyLogFile rotates on the first write of a new day: the feed drains yesterday's file
    (its partial line is dropped: that file gets no more bytes) and reads today's."""
    f_clock = Clock()
    f_clock.advance(os.stat(tmp_path).st_mtime)  # files made now belong to this day
    lf = ClockDailyLogFile("engine.log", str(tmp_path), f_clock)
    lf.write("monday 1\n")
    f = Followed(tmp_path / "engine.log")
    lf.write("monday 2\npartial")
    f.poll()
    f_clock.advance(86400)
    lf.write("tuesday 1\n")
    f.poll()
    assert f.lines == [b"monday 1", b"monday 2", b"tuesday 1"]
    assert f.feed.rotations == 1
    assert len(list(tmp_path.glob("engine.log.*"))) == 1
    f.stop()
    lf.close()


def test_truncation_starts_over(tmp_path: Path) -> None:
    """A file shorter than the offset was truncated (copytruncate, an engine restarted with
    O_TRUNC): reading starts over from its start."""
    path = tmp_path / "engine.log"
    path.write_bytes(b"old 1\nold 2\n")
    f = Followed(path)
    path.write_bytes(b"new\n")  # same inode, shorter
    f.poll()
    assert f.lines == [b"old 1", b"old 2", b"new"]
    assert f.feed.truncations == 1
    f.stop()


def test_a_file_that_disappears_ends_the_feed_after_its_last_lines(tmp_path: Path) -> None:
    """The file removed: what was written before is still read, then the feed ends with
    FileGone and schedules nothing more; connecting to a missing file fails at once."""
    path = tmp_path / "engine.log"
    path.write_bytes(b"a\n")
    f = Followed(path)
    with path.open("ab") as out:
        out.write(b"b\n")
    path.unlink()
    f.poll()
    assert f.lines == [b"a", b"b"]
    assert len(f.ended) == 1 and f.ended[0].check(FileGone)
    assert f.clock.getDelayedCalls() == []
    again = Followed(path)
    assert again.lines == [] and again.ended[0].check(FileGone)
    assert "engine.log" in str(again.ended[0].value)


def turn(clock: Clock) -> None:
    """One reactor turn: run only the earliest scheduled call (``Clock.advance`` would also
    run every call it schedules for now)."""
    call = clock.calls.pop(0)
    clock.rightNow = max(clock.rightNow, call.getTime())
    call.func(*call.args, **call.kw)


def test_growth_is_read_a_bounded_chunk_per_turn(tmp_path: Path) -> None:
    """A file that grew by far more than a chunk is read one chunk per reactor turn, the
    next turn scheduled at once (not a poll later) and behind other work already due: the
    reactor never stalls on it, and every line arrives."""
    path = tmp_path / "engine.log"
    line = b"x" * 99 + b"\n"
    path.write_bytes(line * 1000)  # 100 kB
    clock = Clock()
    feed = FileFeed(str(path), clock, chunk=10_000)
    lines: list[bytes] = []
    d = feed.connect(lines.append)
    assert len(lines) == 100  # one chunk
    other: list[int] = []
    clock.callLater(0, other.append, len(lines))  # other work due now
    turns = 1
    while len(lines) < 1000:
        turn(clock)
        turns += 1
    assert other == [100]  # ran between the first chunk and the second
    assert turns == 11  # ten chunks, one other call
    turn(clock)  # an empty read: back to polling once a second
    assert [c.getTime() for c in clock.getDelayedCalls()] == [POLL_INTERVAL]
    d.cancel()


def test_gigabytes_at_once_keep_each_turn_bounded(tmp_path: Path) -> None:
    """A file that grows by 2 GiB at once (sparse, no newline: one overlong line): each turn
    reads one chunk and schedules the next at once, and the held part of the line stays
    within the line limit. (Reading all 2 GiB here takes seconds; the 10 MB line test shows
    an overlong line dropped and the lines after it arriving.)"""
    path = tmp_path / "engine.log"
    path.write_bytes(b"before\n")
    clock = Clock()
    feed = FileFeed(str(path), clock)
    lines: list[bytes] = []
    d = feed.connect(lines.append)
    with path.open("r+b") as out:
        out.truncate(7 + 2 * 1024**3)
    turn(clock)  # the poll a second later
    for i in range(1, 6):
        assert feed._offset == 7 + i * CHUNK_BYTES
        assert [c.getTime() for c in clock.getDelayedCalls()] == [POLL_INTERVAL]
        assert feed._splitter is not None and feed._splitter.pending <= MAX_LINE_BYTES
        turn(clock)
    assert lines == [b"before"] and feed.too_long == 1
    d.cancel()


def test_a_10_mb_line_is_dropped_and_counted(tmp_path: Path) -> None:
    """A 10 MB line is dropped whole (never held in memory past the limit) and counted, and
    logged once; the lines around it arrive."""
    path = tmp_path / "engine.log"
    path.write_bytes(b"a\n" + b"y" * 10_000_000 + b"\nb\n")
    seen: list[dict[str, Any]] = []
    observer = implementer(ILogObserver)(lambda e: seen.append(e))
    globalLogPublisher.addObserver(observer)
    try:
        f = Followed(path)
        f.poll()
        with path.open("ab") as out:
            out.write(b"z" * 100_000 + b"\nc\n")
        f.poll()
    finally:
        globalLogPublisher.removeObserver(observer)
    assert f.lines == [b"a", b"b", b"c"]
    assert f.feed.too_long == 2
    warned = [e for e in seen if "dropped" in e.get("log_format", "")]
    assert len(warned) == 1  # logged once, never the line itself
    assert b"yyyy" not in repr(seen).encode()
    f.stop()


def test_invalid_utf8_passes_as_bytes(tmp_path: Path) -> None:
    """Lines are bytes: invalid UTF-8 is passed on untouched (the probes decode with
    replacement), and the lines after it arrive."""
    path = tmp_path / "engine.log"
    path.write_bytes(b"ok\n\xff\xfe bad \xc3\n fine\n")
    f = Followed(path)
    assert f.lines == [b"ok", b"\xff\xfe bad \xc3", b" fine"]
    f.stop()


def test_cancel_stops_polling_and_fires_cancelled(tmp_path: Path) -> None:
    """Cancelling the connect Deferred closes the file and leaves nothing scheduled; the feed
    can connect again and reads from the start."""
    path = tmp_path / "engine.log"
    path.write_bytes(b"a\n")
    f = Followed(path)
    f.stop()
    assert f.ended[0].check(CancelledError)
    again: list[bytes] = []
    d = f.feed.connect(again.append)
    assert again == [b"a"]
    d.addErrback(lambda _: None)
    d.cancel()


def test_splitter_bounds() -> None:
    """The splitter holds at most its limit of a partial line; a line of exactly the limit
    passes, one byte more is dropped; a line split across many chunks is whole."""
    out: list[bytes] = []
    s = LineSplitter(out.append, limit=4)
    s.feed(b"ab")
    s.feed(b"cd\nabcde")
    assert out == [b"abcd"] and s.pending == 0 and s.too_long == 1
    s.feed(b"fgh\nok\n")
    assert out == [b"abcd", b"ok"]
    assert s.too_long == 1


def test_feed_for_maps_urls() -> None:
    """file:/// is a FileFeed; docker:// uses the factory it is given, or is refused by name;
    anything else is refused by name."""
    clock = Clock()
    feed = feed_for("file:///var/log/ollama.log", clock)
    assert isinstance(feed, FileFeed) and feed.describe() == "file:///var/log/ollama.log"
    made: list[str] = []

    def docker(name: str) -> FileFeed:
        made.append(name)
        return FileFeed("/x", clock)

    feed_for("docker://ollama", clock, docker)
    assert made == ["ollama"]
    with pytest.raises(FeedUnavailable, match="docker://ollama"):
        feed_for("docker://ollama", clock)
    with pytest.raises(FeedUnavailable, match="expected"):
        feed_for("http://x/log", clock)
