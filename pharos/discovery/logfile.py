"""Follow a local log file by polling on the injected clock.

The file is followed by inode and offset from its start. A new inode at the path is a
rotation: the old file (still open) is drained, then the new one read from its start. A file
shorter than the offset was truncated: reading starts over. Each read takes at most
``CHUNK_BYTES``, the next at once while more is waiting, so a huge file is caught up a chunk
per reactor turn without stalling it. The feed ends when the file disappears.
"""

from __future__ import annotations

import os
from typing import IO, Final

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from pharos.discovery.feed import (
    MAX_LINE_BYTES,
    DockerFeeds,
    FeedUnavailable,
    LineSplitter,
    LogFeed,
    OnLine,
)

log = Logger()

#: Seconds between polls of a file that has nothing new (once a second).
POLL_INTERVAL: Final = 1.0
#: Bytes read per reactor turn.
CHUNK_BYTES: Final = 1024 * 1024


class FileGone(Exception):
    """The followed file is missing or unreadable; the feed ended."""


class FileFeed:
    """A ``file:///path`` log feed (implements ``pharos.discovery.feed.LogFeed``)."""

    def __init__(
        self,
        path: str,
        clock: IReactorTime,
        interval: float = POLL_INTERVAL,
        chunk: int = CHUNK_BYTES,
        max_line: int = MAX_LINE_BYTES,
    ) -> None:
        self.path = path
        self._clock = clock
        self._interval = interval
        self._chunk = chunk
        self._max_line = max_line
        self._file: IO[bytes] | None = None
        self._ino: tuple[int, int] | None = None  # (device, inode) of the open file
        self._offset = 0
        self._call: IDelayedCall | None = None
        self._done: Deferred[None] | None = None
        self._splitter: LineSplitter | None = None
        #: Counters for doctor and tests: rotations and truncations seen, overlong lines dropped.
        self.rotations = 0
        self.truncations = 0
        self._warned_long = False

    def describe(self) -> str:
        """The file's URL."""
        return f"file://{self.path}"

    @property
    def too_long(self) -> int:
        """Lines dropped for exceeding the line limit since the last connect."""
        return self._splitter.too_long if self._splitter is not None else 0

    def connect(self, on_line: OnLine) -> Deferred[None]:
        """Read the file from its start and follow it until it disappears or is cancelled."""
        if self._done is not None:
            raise RuntimeError(f"{self.describe()} is already connected")
        self._done = Deferred(lambda _: self._stop())
        self._splitter = LineSplitter(on_line, self._max_line)
        done = self._done
        try:
            self._open()
        except FileGone as e:
            self._finish(e)
        else:
            self._read()
        return done

    # --- internals --------------------------------------------------------------------------

    def _open(self) -> None:
        try:
            f = open(self.path, "rb", buffering=0)  # noqa: SIM115 - held across polls
        except OSError as e:
            raise FileGone(f"{self.describe()}: {e.strerror or e}") from None
        st = os.fstat(f.fileno())
        self._file, self._ino, self._offset = f, (st.st_dev, st.st_ino), 0
        if self._splitter is not None:
            self._splitter.reset()

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _path_identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _read(self) -> None:
        """One turn: check for rotation or truncation, read one chunk, schedule the next."""
        self._call = None
        f = self._file
        assert f is not None and self._splitter is not None
        try:
            at_path = self._path_identity()
            replaced = at_path != self._ino
            if not replaced and os.fstat(f.fileno()).st_size < self._offset:
                self.truncations += 1
                f.seek(0)
                self._offset = 0
                self._splitter.reset()
            data = f.read(self._chunk) or b""
        except OSError as e:
            self._finish(FileGone(f"{self.describe()}: {e.strerror or e}"))
            return
        self._offset += len(data)
        if data:
            self._splitter.feed(data)
            if self._done is None:  # on_line cancelled the feed
                return
            if self._splitter.too_long and not self._warned_long:
                self._warned_long = True
                log.warn("log feed {feed}: a line over {limit} bytes was dropped (further "
                         "ones are dropped without a word)", feed=self.describe(),
                         limit=self._max_line)
        if replaced and not data:
            # The old file is drained: a rotation moves on to the new file, a missing one ends.
            self._close()
            if at_path is None:
                self._finish(FileGone(f"{self.describe()}: the file is gone"))
                return
            self.rotations += 1
            try:
                self._open()
            except FileGone as e:
                self._finish(e)
                return
            self._schedule(0)
            return
        # More is waiting (a full chunk, or an old file still being drained): read on at once.
        self._schedule(0 if replaced or len(data) == self._chunk else self._interval)

    def _schedule(self, delay: float) -> None:
        self._call = self._clock.callLater(delay, self._read)

    def _stop(self) -> None:
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        self._close()
        self._done = None

    def _finish(self, why: Exception) -> None:
        done = self._done
        self._stop()
        if done is not None and not done.called:
            done.errback(why)


def feed_for(url: str, clock: IReactorTime, docker: DockerFeeds | None = None) -> LogFeed:
    """The feed a ``logs:`` URL names: ``file:///path`` or ``docker://<container>`` (built by
    ``docker``, from Docker discovery; without it refused by name)."""
    scheme, sep, target = url.partition("://")
    if sep and scheme == "file" and target.startswith("/"):
        return FileFeed(target, clock)
    if sep and scheme == "docker" and target:
        if docker is None:
            raise FeedUnavailable(f"{url}: no Docker engine to read container logs from")
        return docker(target)
    raise FeedUnavailable(f"{url}: expected file:///<absolute path> or docker://<container>")
