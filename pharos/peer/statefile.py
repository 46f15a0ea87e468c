"""The state file (``state_file:``): the Snapshot on disk, so a single instance keeps its
prefix index, usage and speeds across restarts. Written every ``WRITE_EVERY`` seconds and once
more after the drain, so nothing counted is lost: built in steps on the reactor, then written
to a temporary file, synced and renamed over it in a thread, so a crash mid-write leaves the
previous file whole. At start it is read in a thread and merged in steps like a peer's
snapshot; a missing file is a first start, and a corrupt one is logged and the instance
starts empty rather than not at all.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any, Final

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from pharos.peer import snapshot
from pharos.peer.snapshot import Replicas, SnapshotError, StateSnapshot
from pharos.periodic import Periodic

log = Logger()

#: Seconds between writes.
WRITE_EVERY: Final = 30.0

#: Runs a blocking function off the reactor thread (tests run it in place).
InThread = Callable[[Callable[[], Any]], "Deferred[Any]"]


def in_place(f: Callable[[], Any]) -> Deferred[Any]:
    """An ``InThread`` that runs ``f`` at once (tests, tools)."""
    return maybeDeferred(f)


def write_atomically(path: str, data: bytes) -> None:
    """``data`` to ``path`` through a synced temporary file renamed over it (blocking)."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_bytes(path: str) -> bytes | None:
    """The file's bytes; None when there is none (blocking; raises ``OSError``)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def read_snapshot(path: str) -> StateSnapshot | None:
    """The whole decoded file (tests and tools; blocking; raises ``OSError`` or
    ``SnapshotError``); None when there is none."""
    data = read_bytes(path)
    return None if data is None else snapshot.decode(data)


class StateFile(Periodic):
    """Writes the state file every ``interval`` seconds while running; ``write`` writes it
    now (the final write of a shutdown); ``restore`` is the first of ``restore_sources``."""

    def __init__(self, path: str, replicas: Replicas, clock: IReactorTime,
                 in_thread: InThread = in_place, interval: float = WRITE_EVERY) -> None:
        super().__init__(clock, interval, self.write, what=f"state file {path}")
        self.path = path
        self.replicas = replicas
        self.in_thread = in_thread
        self._writing: Deferred[None] | None = None
        #: Writes that succeeded and failed (``/status``, tests).
        self.written = 0
        self.failed = 0

    def stopService(self) -> Deferred[None]:
        """Stop the timer; fires once a write under way has ended (the final write is the
        drain's, ``write``)."""
        super().stopService()
        return self._idle()

    def _idle(self) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        if self._writing is None:
            d.callback(None)
        else:
            self._writing.addBoth(lambda _: d.callback(None))
        return d

    def write(self) -> Deferred[None]:
        """Build and write the file now (after a write under way, never two at once). Never
        fails: a failure is logged and counted, and the previous file stays."""
        async def go() -> None:
            await self._idle()
            data = await snapshot.build(self.replicas, self.clock)
            await self.in_thread(lambda: write_atomically(self.path, data))

        d = Deferred.fromCoroutine(go())
        self._writing = d

        def written(_: object) -> None:
            self.written += 1

        def failed(f: Failure) -> None:
            self.failed += 1
            log.error("state file {path} not written, the previous one stays: {why}",
                      path=self.path, why=f.getErrorMessage())

        def idle(_: object) -> None:
            if self._writing is d:
                self._writing = None

        d.addCallbacks(written, failed).addBoth(idle)
        return d

    def restore(self) -> Deferred[None]:
        """Read, decode and merge the file (a ``restore_sources`` entry). Never fails: a bad
        file is logged and the instance starts without it."""
        async def go() -> None:
            try:
                data = await self.in_thread(lambda: read_bytes(self.path))
            except OSError as e:
                log.error("state file {path} not restored, starting empty: {why}",
                          path=self.path, why=e.strerror or str(e))
                return
            if data is None:
                log.info("state file {path}: none yet, starting empty", path=self.path)
                return
            try:
                got = await snapshot.restore_bytes(self.replicas, data, self.clock)
            except SnapshotError as e:
                if e.partial is None:
                    log.error("state file {path} not restored, starting empty: {why}",
                              path=self.path, why=str(e))
                else:
                    log.error("state file {path} restored only in part ({got}): {why}",
                              path=self.path, got=str(e.partial), why=str(e))
                return
            age = self.clock.seconds() - (got.taken_at or 0.0)
            log.info("state file {path} restored (taken {age:.0f} s ago): {got}",
                     path=self.path, age=age, got=str(got))

        return Deferred.fromCoroutine(go())
