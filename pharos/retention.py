"""Which root prefixes each target's cache still holds, and what a new one would push out.

A prompt sent to a target that does not hold its root prefix (the tools and system message)
makes that cache take the root in; a cache that holds only a few roots then evicts the least
recently used one, and the next request for that root pays its prefill again. The policy
prices that like a model eviction: the prefill of the live roots a choice pushes out of the
only cache that holds them.

Per target, an LRU of the roots Pharos sent it (their estimated tokens), and how many root
tokens it retains, learned from replies: a root found cached with ``ahead`` tokens of other
roots sent there since it was last used means the cache retains at least ``ahead + tokens``;
one found evicted, fewer. Roots beyond the retention are taken as gone (but remembered, so a
hit can raise it). Unknown retention prices nothing. Pure: no clock, bounded.

Replicated (peers, and the snapshot: restored prefix entries without it cannot be told stale
from live): ``merge`` keeps, per target and root, the latest send (the LRU order), and the
retention learned last (a tie: the larger): maxima, so merging is idempotent and order-free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

#: Roots remembered per target (the least recently used go first).
ROOTS_PER_TARGET: Final = 256
#: A root not asked for this long is not worth keeping anywhere (assumed: longer than a
#: steadily used system prompt's gaps, shorter than an idle conversation's).
LIVE_SEC: Final = 60.0
#: Roots whose last use is remembered.
LIVE_ROOTS: Final = 4096
#: A reply whose cached tokens cover this share of the root's estimate held the root (the
#: estimate is bytes / 4, the engine counts its own tokens and whole blocks).
HELD_SHARE: Final = 0.8
#: Roots per exported row (about 6 KB of JSON; ``merge`` takes rows in any order).
ROW_ROOTS: Final = 128
_U64: Final = 2**64


@dataclass(frozen=True)
class RootsRow:
    """Part of one target's picture on the wire: its retention, when that was learned (None:
    unknown), and roots as (hash, tokens, last sent there)."""

    target: str
    retained: int | None
    learned_at: float | None
    roots: tuple[tuple[int, int, float], ...]

    def to_json(self) -> dict[str, object]:
        return {"target": self.target, "retained": self.retained,
                "learned_at": self.learned_at, "roots": [list(r) for r in self.roots]}


def _finite(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def _count(value: object) -> bool:
    return type(value) is int and value >= 0


def parse_roots_row(raw: object) -> RootsRow:
    """A row off the wire, checked (unknown fields and trailing list items ignored)."""
    if not isinstance(raw, dict):
        raise ValueError("expected an object")
    target, retained, learned_at = raw.get("target"), raw.get("retained"), raw.get("learned_at")
    if not isinstance(target, str):
        raise ValueError("target must be a string")
    if retained is not None and not _count(retained):
        raise ValueError("retained must be a non-negative integer or null")
    if learned_at is not None and not _finite(learned_at):
        raise ValueError("learned_at must be a number or null")
    roots = raw.get("roots", [])
    if not isinstance(roots, list):
        raise ValueError("roots must be a list")
    out: list[tuple[int, int, float]] = []
    for r in roots:
        if (not isinstance(r, list) or len(r) < 3 or not _count(r[0]) or r[0] >= _U64
                or not _count(r[1]) or not _finite(r[2])):
            raise ValueError("a root must be [64-bit hash, tokens, last sent]")
        out.append((r[0], r[1], float(r[2])))
    return RootsRow(target, retained,
                    None if learned_at is None else float(learned_at), tuple(out))


class RootCaches:
    """The roots each target is believed to hold, in LRU order, and each one's retention."""

    def __init__(self, roots_per_target: int = ROOTS_PER_TARGET) -> None:
        self.roots_per_target = roots_per_target
        # target -> {root: tokens}, least recently used first (a dict keeps insertion order).
        self._held: dict[int, dict[int, int]] = {}
        #: target -> root tokens it was seen to retain; absent: unknown.
        self.retained: dict[int, int] = {}
        self._last_use: dict[int, float] = {}
        self._sent_at: dict[int, dict[int, float]] = {}  # target -> {root: last sent there}
        self._learned_at: dict[int, float] = {}  # target -> when ``retained`` was learned
        self._forgot_at: dict[int, float] = {}  # target -> when its cache started empty

    def held(self, target: int) -> dict[int, int]:
        """The target's roots, least recently used first (a live view: do not change it)."""
        return self._held.get(target, {})

    def sent(self, target: int, root: int, tokens: int, now: float) -> int | None:
        """A request with ``root`` was dispatched to ``target``: the root is its most recent.
        Returns the tokens of the other roots sent there since this one was last used there
        (None if it was not held), for ``learn``."""
        held = self._held.setdefault(target, {})
        ahead: int | None = None
        if root in held:
            ahead = 0
            passed = False
            for r, n in held.items():
                if passed:
                    ahead += n
                elif r == root:
                    passed = True
            del held[root]
        at = self._sent_at.setdefault(target, {})
        # Send times strictly increase per target, so their order is the LRU order even when
        # the clock stands still or goes back (``merge`` rebuilds the order from them).
        newest = at.get(next(reversed(held)), -math.inf) if held else -math.inf
        at[root] = now if now > newest else math.nextafter(newest, math.inf)
        held[root] = tokens
        while len(held) > self.roots_per_target:
            oldest = next(iter(held))
            del held[oldest]
            at.pop(oldest, None)
        self._last_use.pop(root, None)
        self._last_use[root] = now
        while len(self._last_use) > LIVE_ROOTS:
            del self._last_use[next(iter(self._last_use))]
        return ahead

    def tokens_of(self, root: int) -> int | None:
        """The root's estimated tokens where some target holds it (None: nowhere)."""
        for held in self._held.values():
            n = held.get(root)
            if n is not None:
                return n
        return None

    def learn(self, target: int, tokens: int, ahead: int | None, cached: int | None,
              now: float | None = None) -> None:
        """A reply's cached tokens for a root held with ``ahead`` tokens of other roots used
        since (the module docstring). ``now``: what ``merge`` orders retentions by."""
        if ahead is None or cached is None or tokens <= 0:
            return
        seen = ahead + tokens
        known = self.retained.get(target)
        if cached >= tokens * HELD_SHARE:
            if known is None or seen > known:
                self._set_retained(target, seen, now)
        elif known is None or seen <= known:
            self._set_retained(target, max(tokens, seen - 1), now)

    def _set_retained(self, target: int, tokens: int, at: float | None) -> None:
        self.retained[target] = tokens
        if at is None:
            self._learned_at.pop(target, None)
        else:
            self._learned_at[target] = at

    def resident(self, target: int) -> list[tuple[int, int]]:
        """The roots the target's cache holds by the learned retention, newest first (every
        root sent there while the retention is unknown)."""
        known = self.retained.get(target)
        out: list[tuple[int, int]] = []
        total = 0
        for r, n in reversed(self._held.get(target, {}).items()):
            total += n
            if known is not None and total > known and out:
                break
            out.append((r, n))
        return out

    def pushed_out(self, target: int, root: int) -> bool:
        """``root`` was sent to ``target`` but more root tokens went there since than its
        learned retention keeps: taken as evicted (False when not known either way)."""
        held = self._held.get(target)
        known = self.retained.get(target)
        if not held or root not in held or known is None:
            return False
        total = 0
        for r, n in reversed(held.items()):
            if r == root:
                return total > 0 and total + n > known
            total += n
        return False

    def evicts(self, target: int, root: int, tokens: int) -> list[tuple[int, int]] | None:
        """The roots ``target`` would push out to take ``root`` in, oldest first, with the
        tokens each loses (the last only what does not fit: vLLM frees a sequence's tail
        blocks first); None when its retention is unknown, [] when the root fits or is held."""
        known = self.retained.get(target)
        if known is None:
            return None
        resident = self.resident(target)
        if any(r == root for r, _ in resident):
            return []
        over = sum(n for _, n in resident) + tokens - known
        out: list[tuple[int, int]] = []
        for r, n in reversed(resident):
            if over <= 0:
                break
            out.append((r, min(n, over)))  # engines evict blocks: the oldest root's tail
            over -= n
        return out

    def live(self, root: int, now: float) -> bool:
        """The root was asked for within ``LIVE_SEC``."""
        at = self._last_use.get(root)
        return at is not None and now - at <= LIVE_SEC

    def holders(self, root: int, targets: Iterable[int]) -> int:
        """How many of ``targets`` hold the root (by their retention)."""
        return sum(1 for t in targets
                   if root in self._held.get(t, ()) and any(r == root for r, _ in
                                                           self.resident(t)))

    def forget(self, target: int, now: float | None = None) -> None:
        """The target's cache is gone (a new generation): nothing held, retention kept (the
        engine is the same size). ``now``: when, so ``merge`` takes back no older sends."""
        self._held.pop(target, None)
        self._sent_at.pop(target, None)
        if now is not None:
            self._forgot_at[target] = now

    # --- replication ---------------------------------------------------------------------

    def export(self, key_of: Callable[[int], str | None]) -> list[RootsRow]:
        """Every target's picture (those ``key_of`` names), ``ROW_ROOTS`` roots a row, least
        recently sent first; a copy, so a caller may yield between rows."""
        rows: list[RootsRow] = []
        for target in sorted(set(self._held) | set(self.retained)):
            key = key_of(target)
            if key is None:
                continue
            retained, learned_at = self.retained.get(target), self._learned_at.get(target)
            at = self._sent_at.get(target, {})
            roots = [(r, n, at.get(r, -math.inf)) for r, n in self.held(target).items()]
            roots = [r for r in roots if math.isfinite(r[2])]
            for i in range(0, max(len(roots), 1), ROW_ROOTS):
                rows.append(RootsRow(key, retained, learned_at, tuple(roots[i:i + ROW_ROOTS])))
        return rows

    def export_retention(self, key_of: Callable[[int], str | None]) -> list[RootsRow]:
        """Each target's learned retention and when, without roots: what peers send every
        tick, so every instance prices on what all replies taught."""
        rows: list[RootsRow] = []
        for target in sorted(self.retained):
            key = key_of(target)
            if key is not None:
                rows.append(RootsRow(key, self.retained[target],
                                     self._learned_at.get(target), ()))
        return rows

    def merge(self, rows: Iterable[RootsRow],
              id_of: Callable[[str], int | None]) -> tuple[int, int]:
        """Merge exported rows; returns (roots that changed something, unknown targets')."""
        changed = dropped = 0
        for row in rows:
            target = id_of(row.target)
            if target is None:
                dropped += len(row.roots)
                continue
            if row.retained is not None:
                theirs = (-math.inf if row.learned_at is None else row.learned_at, row.retained)
                known = self.retained.get(target)
                ours = (self._learned_at.get(target, -math.inf), known or 0)
                if known is None or theirs > ours:
                    self._set_retained(target, row.retained, row.learned_at)
            changed += self._merge_roots(target, row.roots)
        return changed, dropped

    def _merge_roots(self, target: int, roots: Iterable[tuple[int, int, float]]) -> int:
        floor = self._forgot_at.get(target, -math.inf)
        held = self._held.get(target, {})
        at = self._sent_at.get(target, {})
        pic = {r: (at.get(r, -math.inf), n) for r, n in held.items()}
        changed = 0
        for r, n, when in roots:
            if when <= floor:
                continue
            if r not in pic or (when, n) > pic[r]:
                pic[r] = (when, n)
                changed += 1
                if when > self._last_use.get(r, -math.inf):
                    self._last_use.pop(r, None)
                    self._last_use[r] = when
        if not changed:
            return 0
        while len(self._last_use) > LIVE_ROOTS:
            del self._last_use[next(iter(self._last_use))]
        order = sorted(pic.items(), key=lambda kv: (kv[1][0], kv[0]))[-self.roots_per_target:]
        self._held[target] = {r: n for r, (_, n) in order}
        self._sent_at[target] = {r: when for r, (when, _) in order}
        return changed
