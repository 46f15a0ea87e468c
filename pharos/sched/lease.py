"""A lease: one request's slot on a target, and what it gives back when released."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from twisted.internet.interfaces import IReactorTime

from pharos.policy import Decision
from pharos.prefix import EMPTY, Chain, Source
from pharos.state.registry import Target
from pharos.state.stats import Sample


class LeaseOwner(Protocol):
    """What a lease tells the scheduler that granted it."""

    def root_ended(self, tid: int, root: int) -> int:
        """A lease with this root on this target ended: the root's tokens to give back."""

    def started(self, lease: Lease) -> None:
        """The first byte of the lease's reply arrived."""

    def released(self, lease: Lease, sample: Sample | None) -> None:
        """The lease is given back (its target's counts already are), with its feedback."""


@dataclass(eq=False)
class Lease:
    """A slot on a target, held for one request; released once, with its feedback."""

    owner: LeaseOwner
    clock: IReactorTime
    target: Target
    decision: Decision
    waited: bool
    cold: bool  # dispatched to a target whose model was cold
    released: bool = False
    key: str = ""  # whose request it is (the fair queue's shares)
    chain: Chain = EMPTY
    predicted_tokens: int = 0  # the index's prediction for this target (0: none)
    source: Source | None = None  # where the predicting slot came from
    est_ttft: float | None = None  # the policy's estimate for this target, seconds
    prefill_sec: float = 0.0  # the policy's prefill estimate, queued on the target until...
    kv_tokens: int = 0  # ...and the KV it takes that the engine's usage does not show
    kv_root: int = 0  # of ``kv_tokens``, its root's (the first there with that root pays it)
    started: bool = False  # ...the first byte of the reply arrived
    #: The target's ``kv_round`` at its first byte (None before it).
    kv_round: int | None = None
    #: Its first byte less the later of its grant and the target's previous first byte.
    prefill_window_sec: float | None = None
    granted_at: float = 0.0
    moved_at: float | None = None  # the last byte of its reply relayed (the watchdog's clue)
    #: ``RootCaches.sent``'s answer: what the reply's cached tokens teach retention.
    root_ahead: int | None = None
    #: Its reply's prefix outcome (the ``prefix`` metric), once released with a sample.
    prefix: str | None = None
    #: The policy that routed it (``x-pharos-policy``, metrics).
    policy: str = ""
    #: Its reply is streamed: it holds its target's pacing until its first byte.
    stream: bool = False
    #: The idle models (as the host names them) its cold load pushes out, which the proxy asks
    #: the host to unload first (``names_victims``): those Pharos priced cheapest to lose.
    unload: tuple[str, ...] = ()

    def touch(self) -> None:
        """Bytes of the reply moved (called per relayed chunk)."""
        self.moved_at = self.target.backend.replied_at = self.clock.seconds()

    def first_byte(self) -> None:
        """The engine answered: its prefill is no longer queued on the target."""
        if self.started or self.released:
            return
        self.started = True
        t = self.target
        self.kv_round = t.kv_round
        now = self.clock.seconds()
        since = self.granted_at
        if t.last_first_byte_at is not None and t.last_first_byte_at > since:
            since = t.last_first_byte_at  # a prefill ahead of it ended only then
        self.prefill_window_sec = now - since
        t.last_first_byte_at = now
        self.owner.started(self)

    def release(self, sample: Sample | None = None) -> None:
        """Free the slot and learn from the request; the next waiter runs at once."""
        if self.released:
            return
        self.released = True
        t = self.target
        t.inflight -= 1
        # Its own blocks, and its root's once no other request there has that root.
        back = self.kv_tokens - self.kv_root
        if self.chain:
            back += self.owner.root_ended(t.id, self.chain.keys[0])
        if back:
            if self.kv_round is None or self.kv_round == t.kv_round:
                # Still counted in ``kv_sent_tokens`` (sent since the last round): its blocks
                # are free now, and the next round's usage will not show them.
                t.kv_sent_tokens = max(0, t.kv_sent_tokens - back)
            else:
                # It ran at the last round, whose usage shows its blocks: room until the next
                # round (else a small pool of short requests looks full for the round).
                t.kv_freed_tokens += back
        self.owner.released(self, sample)
