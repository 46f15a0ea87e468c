"""Log feeds: where an engine's log lines come from.

A feed hands each line to ``on_line`` as bytes without its newline and never keeps, logs or
sends a line's content: lines are matched in memory by the plan's log probes and dropped.
``FileFeed`` follows a local file (``file:///path``); Docker discovery supplies the feed for
``docker://<container>``; ``logfile.feed_for`` picks one by URL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol

from twisted.internet.defer import Deferred

#: The longest line a feed passes on; a longer one is dropped whole and counted. Every log
#: line a probe reads (Ollama's server config line is ~2 KB) is far shorter.
MAX_LINE_BYTES: Final = 64 * 1024

OnLine = Callable[[bytes], None]


class LogFeed(Protocol):
    """A source of one engine's log lines, started and stopped by the backend's follower."""

    def connect(self, on_line: OnLine) -> Deferred[None]:
        """Deliver lines to ``on_line`` until the feed ends or breaks (the Deferred fires or
        fails then); cancelling it stops the feed."""

    def describe(self) -> str:
        """Where the lines come from, for logs (never a line's content)."""


class FeedUnavailable(ValueError):
    """A log feed URL that names no feed this instance can read."""


class LineSplitter:
    """Bytes in, complete lines out; a line longer than ``limit`` is dropped whole and counted,
    so memory stays bounded however long a line grows."""

    def __init__(self, on_line: OnLine, limit: int = MAX_LINE_BYTES) -> None:
        self._on_line = on_line
        self._limit = limit
        self._held = bytearray()
        self._skipping = False  # inside a line already known to be too long
        self.too_long = 0

    def feed(self, data: bytes) -> None:
        """Split ``data`` into lines, handing each complete one on."""
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                self._hold(data[start:])
                return
            self._hold(data[start:nl])
            if not self._skipping:
                line = bytes(self._held)
                self._held.clear()
                self._on_line(line[:-1] if line.endswith(b"\r") else line)
            self._skipping = False
            self._held.clear()
            start = nl + 1

    def _hold(self, part: bytes) -> None:
        if self._skipping or not part:
            return
        if len(self._held) + len(part) > self._limit:
            self._held.clear()
            self._skipping = True
            self.too_long += 1
            return
        self._held += part

    @property
    def pending(self) -> int:
        """Bytes of a partial line held (0 while skipping an overlong one)."""
        return len(self._held)

    def flush(self) -> None:
        """Hand on a partial last line as a line (a file read whole has no more to come)."""
        if self._held and not self._skipping:
            self._on_line(bytes(self._held))
        self.reset()

    def reset(self) -> None:
        """Forget a partial line (the file it came from is gone)."""
        self._held.clear()
        self._skipping = False


DockerFeeds = Callable[[str], LogFeed]
