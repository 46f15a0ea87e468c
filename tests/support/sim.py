"""What the simulator's tests share: moving a ``Clock`` step by step, a listener that records
what a job produced, and the prompts the slot tests send."""

from __future__ import annotations

from dataclasses import dataclass, field

from twisted.internet.task import Clock

from pharos.sim.model import Job


def run(clock: Clock, seconds: float) -> None:
    """Move the clock ``seconds`` ahead, firing each call at its own time (``Clock.advance``
    alone runs everything at the end time, so chained steps would drift)."""
    end = clock.seconds() + seconds
    while True:
        due = [c.getTime() for c in clock.getDelayedCalls() if c.getTime() <= end]
        if not due:
            break
        clock.advance(max(0.0, min(due) - clock.seconds()))
    clock.advance(end - clock.seconds())


@dataclass
class Event:
    """One token a job produced: the clock time then and the job's finish reason then."""

    index: int
    text: str
    last: bool
    at: float
    reason: str | None


@dataclass
class Listener:
    """Records a job's tokens (with the clock time and the finish reason then) and its end."""

    clock: Clock
    tokens: list[Event] = field(default_factory=list)
    done_at: float | None = None

    def token(self, job: Job, index: int, text: str, last: bool) -> None:
        self.tokens.append(Event(index, text, last, self.clock.seconds(), job.finish_reason))

    def done(self, job: Job) -> None:
        self.done_at = self.clock.seconds()

    def times(self) -> list[float]:
        """When each token came."""
        return [e.at for e in self.tokens]


def prompt(n_tokens: int, seed: str = "a") -> bytes:
    """A prompt of exactly ``n_tokens`` tokens (4 bytes each), distinct per ``seed``."""
    return (seed * (4 * n_tokens))[: 4 * n_tokens].encode()
