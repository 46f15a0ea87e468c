"""A JSON-lines journal written off the reactor: the usage journal (``usage.journal: FILE``)
and the decision log both write through it. It writes only the dicts callers hand over
(never prompt text: the callers never hand it over).

**Cheap per record.** ``write`` serializes the record (a record that cannot be serialized is
reported where it was made) and appends the line to an in-memory batch. The batch goes to
the writer thread ``interval`` seconds after its first line, or at once past
``batch_records`` lines or ``batch_bytes``: one thread round trip per batch, never per
record (a round trip per record cost more than the rest of the observability together).

**Never blocking the reactor.** All disk I/O happens in a thread of the reactor's pool, one
batch at a time: the next is handed over when the previous one has landed, so lines keep
their order and a stalled disk holds one pool thread at most (DNS lookups still get one).

**Bounded memory.** ``capacity`` records and ``max_bytes`` bound what is pending and being
written together; past either ``write`` drops the record and counts it in ``dropped``
rather than block. A batch is handed over at a tenth of the bound, so only a writer stuck
for ``capacity`` records drops. ``close`` hands over everything pending and fires when it
has landed. A crash loses at most ``interval`` seconds of records.

**The file stays open** between batches, touched only by the writing thread. Before each
batch the writer checks that the path still names the open file and reopens it after a log
rotation. A failed batch closes the file, so a path that becomes writable again recovers by
itself. Each batch is flushed to the OS before it counts as written.

**Errors are reported, never raised into the reactor**: counted in ``failed``, ``error`` says
why (``None`` once a batch lands again), one log event per new error, not per batch.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Final

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import (
    IDelayedCall,
    IReactorFromThreads,
    IReactorThreads,
    IReactorTime,
)
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

#: Records pending or being written, at most (about 300 bytes each for usage: a few MB).
DEFAULT_CAPACITY: Final = 10_000
#: Bytes pending or being written, at most (a decision line of a big fleet is ~100 KB).
DEFAULT_MAX_BYTES: Final = 64 * 1024 * 1024
#: Seconds a line waits for its batch to be handed to the writer, at most.
DEFAULT_INTERVAL: Final = 0.5

_log = Logger()
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


class _File:
    """The journal's open file. Used only by the writer thread of the batch in flight (one
    at a time, handed over through the pool's queue), never by the reactor thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: IO[bytes] | None = None
        self._ident: tuple[int, int] | None = None

    def append(self, lines: list[str], close: bool) -> None:
        """Append a batch and flush it to the OS; ``close``: close the file afterwards."""
        try:
            if lines:
                f = self._open()
                f.write("".join(lines).encode("utf-8"))
                f.flush()
        except BaseException:
            self._close()
            raise
        if close:
            self._close()

    def _open(self) -> IO[bytes]:
        if self.file is not None:
            try:
                st = os.stat(self.path)
                same = (st.st_dev, st.st_ino) == self._ident
            except OSError:
                same = False
            if not same:  # rotated or removed: write to what the path names now
                self._close()
        if self.file is None:
            f = self.path.open("ab")
            st = os.fstat(f.fileno())
            self.file, self._ident = f, (st.st_dev, st.st_ino)
        return self.file

    def _close(self) -> None:
        f, self.file, self._ident = self.file, None, None
        if f is not None:
            with contextlib.suppress(OSError):  # its batch failed or was flushed already
                f.close()


class Journal:
    """Appends one JSON line per ``write`` to ``path``, in batches, off the reactor thread.
    ``threadpool`` and ``clock`` default to the reactor's; ``batch_records`` and
    ``batch_bytes`` to a tenth of the bounds. ``name`` is how log events call it."""

    def __init__(self, path: str | Path, reactor: IReactorFromThreads,
                 capacity: int = DEFAULT_CAPACITY, threadpool: ThreadPool | None = None, *,
                 clock: IReactorTime | None = None, interval: float = DEFAULT_INTERVAL,
                 max_bytes: int = DEFAULT_MAX_BYTES, batch_records: int | None = None,
                 batch_bytes: int | None = None, name: str = "usage journal") -> None:
        self.path = Path(path)
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.interval = interval
        self.name = name
        self.batch_records = batch_records or max(1, capacity // 10)
        self.batch_bytes = batch_bytes or max(1, max_bytes // 10)
        self._reactor = reactor
        self._clock = clock if clock is not None else IReactorTime(reactor)
        self._pool = (threadpool if threadpool is not None
                      else IReactorThreads(reactor).getThreadPool())
        #: Records turned away because the buffer was full or the journal closed.
        self.dropped = 0
        #: Records lost because they could not be serialized or written.
        self.failed = 0
        #: Records written.
        self.written = 0
        #: Why the last batch could not be written; ``None`` while writes succeed.
        self.error: str | None = None
        #: Batches handed to the writer (one thread round trip each).
        self.batches = 0
        self._file = _File(self.path)
        self._pending: list[str] = []
        self._pending_bytes = 0
        self._in_flight = 0
        self._in_flight_bytes = 0
        self._writing = False
        self._timer: IDelayedCall | None = None
        self._closing = False
        self._closed: list[Deferred[None]] = []

    @property
    def buffered(self) -> int:
        """Records accepted and not yet written (pending and the batch being written)."""
        return len(self._pending) + self._in_flight

    def write(self, record: Mapping[str, object]) -> bool:
        """Queue one record; returns at once. False if it was dropped (buffer full, journal
        closed) or cannot be serialized (counted in ``failed`` and logged)."""
        pending = self._pending
        if (self._closing or len(pending) + self._in_flight >= self.capacity
                or self._pending_bytes + self._in_flight_bytes >= self.max_bytes):
            self.dropped += 1
            return False
        try:
            line = _encode(record) + "\n"
        except (TypeError, ValueError) as e:
            self.failed += 1
            _log.error("{name}: a record cannot be written as JSON: {error}",
                       name=self.name, error=str(e))
            return False
        pending.append(line)
        self._pending_bytes += len(line)
        if len(pending) >= self.batch_records or self._pending_bytes >= self.batch_bytes:
            self._flush()
        elif self._timer is None and not self._writing:
            self._timer = self._clock.callLater(self.interval, self._tick)
        return True

    def _tick(self) -> None:
        self._timer = None
        self._flush()

    def _flush(self) -> None:
        """Hand the pending lines to the pool as one batch, unless one is being written (its
        landing hands over the next). Closing, an empty batch closes an open file."""
        if self._writing:
            return
        if not self._pending and not (self._closing and self._file.file is not None):
            return
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        self._in_flight, self._in_flight_bytes = len(batch), self._pending_bytes
        self._pending_bytes = 0
        self._writing = True
        self.batches += 1
        d = deferToThreadPool(self._reactor, self._pool, self._file.append, batch,
                              self._closing)
        d.addCallbacks(self._landed, self._lost)
        d.addBoth(self._next)

    def _landed(self, _: None) -> None:
        self.written += self._in_flight
        self.error = None

    def _lost(self, failure: Failure) -> None:
        self.failed += self._in_flight
        error = f"{type(failure.value).__name__}: {failure.value}"
        if error != self.error:
            _log.error("{name} {path} cannot be written: {error}; its records are "
                       "counted as failed until it can", name=self.name, path=str(self.path),
                       error=error)
        self.error = error

    def _next(self, _: object) -> None:
        self._writing = False
        self._in_flight = self._in_flight_bytes = 0
        if (self._closing or len(self._pending) >= self.batch_records
                or self._pending_bytes >= self.batch_bytes):
            self._flush()
        elif self._pending and self._timer is None:
            self._timer = self._clock.callLater(self.interval, self._tick)
        if self._closing and not self._writing:
            self._fire_closed()

    def _fire_closed(self) -> None:
        waiting, self._closed = self._closed, []
        for d in waiting:
            d.callback(None)

    def close(self) -> Deferred[None]:
        """Stop accepting records and hand over what is pending; the Deferred fires once all of
        it is written (or counted as failed) and the file is closed. It never fails."""
        self._closing = True
        d: Deferred[None] = Deferred()
        self._closed.append(d)
        self._flush()
        if not self._writing:
            self._fire_closed()
        return d
