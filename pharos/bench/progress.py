"""One carriage-return line on a terminal showing how far a run is; nothing when stderr is not
a terminal (a log file gets the summary the command prints at the end instead)."""

from __future__ import annotations

import sys
from typing import Protocol, TextIO

from twisted.internet.interfaces import IReactorTime

from pharos.periodic import Periodic

#: Seconds between redraws.
INTERVAL = 0.5
_WIDTH = 24


class Counts(Protocol):
    """What the line shows (``OpenLoop`` has these)."""

    sent: int
    finished: int
    errors: int
    start: float | None


class Progress:
    """Redraws ``label [####----] sent/total ...`` every ``INTERVAL`` seconds of ``clock``
    while started; ``stop`` draws the last state and ends the line."""

    def __init__(self, clock: IReactorTime, counts: Counts, total: int, duration: float,
                 label: str = "", stream: TextIO | None = None) -> None:
        self.clock = clock
        self.counts = counts
        self.total = total
        self.duration = duration
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty()
        self._loop = Periodic(clock, INTERVAL, self._draw, now=True, what="progress line")

    def line(self) -> str:
        """The text of the line, as it stands."""
        c = self.counts
        done = c.finished / self.total if self.total else 1.0
        filled = int(done * _WIDTH)
        elapsed = self.clock.seconds() - c.start if c.start is not None else 0.0
        head = f"{self.label} " if self.label else ""
        return (f"{head}[{'#' * filled}{'-' * (_WIDTH - filled)}] {c.sent}/{self.total} sent, "
                f"{c.finished} done, {c.errors} errors, {elapsed:.0f}/{self.duration:.0f} s")

    def start(self) -> None:
        """Begin redrawing (on a terminal only)."""
        if self.enabled and not self._loop.running:
            self._loop.startService()

    def stop(self) -> None:
        """Stop redrawing; leave the final state on its own line."""
        if not self._loop.running:
            return
        self._loop.stopService()
        self._draw()
        self.stream.write("\n")
        self.stream.flush()

    def _draw(self) -> None:
        self.stream.write("\r" + self.line() + "\x1b[K")
        self.stream.flush()
