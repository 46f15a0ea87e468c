"""The usage journal (``usage.journal: FILE``, issue 11 item 5): one JSON line per finished
request, written off the request path.

The caller passes each record as a dict (key, tenant, model, target, status, tokens,
timings); this module serializes what it is given and nothing else, so what reaches the file
is what the caller chose (never prompt text: the caller never hands it over).

**Never blocking the reactor.** ``write`` serializes the record (microseconds, and a record
that cannot be serialized is reported where it was made) and appends the line to a bounded
in-memory buffer; when the buffer is full it drops the record and counts it in ``dropped``
instead of waiting. All disk I/O (open, append, close) happens in a thread, over a batch the
reactor handed over and no longer touches, so no lock is shared with the reactor thread.

**Which thread.** Batches go through ``deferToThreadPool`` on the reactor's own thread pool
(by default), one batch at a time: the next batch is taken when the previous one has landed,
so lines keep their order, the journal never holds more than one pool thread (a stalled disk
cannot starve DNS lookups or other pool users), and it needs no thread of its own to start
and stop. Under load, batches simply grow (up to the buffer's bound) while one is written.

**Rotation-safe.** Each batch opens the file for appending and closes it, so a log rotator
that renames the file is followed on the next batch, and a path that becomes writable again
(disk space freed, directory created) recovers by itself.

**Errors are reported, never raised into the reactor.** A batch that cannot be written is
counted in ``failed``, ``error`` says why (``None`` once a batch lands again), and one log
event is emitted per new error, not per batch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorFromThreads, IReactorThreads
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

#: Records held while the writer is behind, in memory (about 300 bytes each: a few MB).
DEFAULT_CAPACITY: Final = 10_000

_log = Logger()


def _append(path: Path, lines: list[str]) -> None:
    """Append a batch of lines (in a pool thread: the only disk I/O of the journal)."""
    with path.open("a", encoding="utf-8") as f:
        f.writelines(lines)


class Journal:
    """Appends one JSON line per ``write`` to ``path``, off the reactor thread.

    ``reactor`` delivers results from the writer thread; ``threadpool`` runs the writes
    (default: the reactor's). ``capacity`` bounds the records buffered or being written.
    """

    def __init__(self, path: str | Path, reactor: IReactorFromThreads,
                 capacity: int = DEFAULT_CAPACITY, threadpool: ThreadPool | None = None) -> None:
        self.path = Path(path)
        self.capacity = capacity
        self._reactor = reactor
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
        self._pending: list[str] = []
        self._in_flight = 0
        self._closing = False
        self._closed: list[Deferred[None]] = []

    @property
    def buffered(self) -> int:
        """Records accepted and not yet written (pending and the batch being written)."""
        return len(self._pending) + self._in_flight

    def write(self, record: Mapping[str, object]) -> bool:
        """Queue one record; returns at once. False if it was dropped (buffer full, journal
        closed) or cannot be serialized (counted in ``failed`` and logged)."""
        if self._closing or self.buffered >= self.capacity:
            self.dropped += 1
            return False
        try:
            line = json.dumps(record, ensure_ascii=False, separators=(",", ":"),
                              allow_nan=False) + "\n"
        except (TypeError, ValueError) as e:
            self.failed += 1
            _log.error("usage journal: a record cannot be written as JSON: {error}",
                       error=str(e))
            return False
        self._pending.append(line)
        self._flush()
        return True

    def _flush(self) -> None:
        """Hand the pending lines to the pool as one batch, unless one is being written."""
        if self._in_flight or not self._pending:
            return
        batch, self._pending = self._pending, []
        self._in_flight = len(batch)
        d = deferToThreadPool(self._reactor, self._pool, _append, self.path, batch)
        d.addCallbacks(self._landed, self._lost)
        d.addBoth(self._next)

    def _landed(self, _: None) -> None:
        self.written += self._in_flight
        self.error = None

    def _lost(self, failure: Failure) -> None:
        self.failed += self._in_flight
        error = f"{type(failure.value).__name__}: {failure.value}"
        if error != self.error:
            _log.error("usage journal {path} cannot be written: {error}; its records are "
                       "counted as failed until it can", path=str(self.path), error=error)
        self.error = error

    def _next(self, _: object) -> None:
        self._in_flight = 0
        self._flush()
        if self._closing and not self._in_flight:
            self._fire_closed()

    def _fire_closed(self) -> None:
        waiting, self._closed = self._closed, []
        for d in waiting:
            d.callback(None)

    def close(self) -> Deferred[None]:
        """Stop accepting records; the Deferred fires once everything accepted before has
        been written (or counted as failed). It never fails."""
        self._closing = True
        d: Deferred[None] = Deferred()
        self._closed.append(d)
        if not self._in_flight:
            self._fire_closed()
        return d
