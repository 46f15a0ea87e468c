"""Which root prefixes each target's cache still holds, and what a new one would push out.

A prompt sent to a target that does not hold its root prefix (the tools and system message)
makes that cache take the root in; an engine whose cache holds only a few roots then evicts
the least recently used one, and the next request for that root pays its prefill again
(issue 10: a per-request TTFT minimum that sent prompts to idle engines without them kept
evicting what those small caches held; production-stack's prefixaware, which never moves a
prompt, had the better tail). The policy prices that like a model eviction: the prefill of
the live roots a choice pushes out of the only cache that holds them.

Per target, an LRU of the roots Pharos sent it (their estimated tokens), and how many root
tokens it retains, learned from replies rather than modelled from block counts: a root found
cached with ``ahead`` tokens of other roots sent there since it was last used means the
cache retains at least ``ahead + tokens``; a root found evicted means fewer. Roots beyond the
learned retention are taken as gone (but remembered, so a hit can raise it again). Unknown
retention prices nothing (``None``, never a guess).

Pure: no clock (times are passed in), bounded (``ROOTS_PER_TARGET`` roots a target,
``LIVE_ROOTS`` roots' last use).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

#: Roots remembered per target (the least recently used go first).
ROOTS_PER_TARGET: Final = 256
#: A root not asked for this long is not worth keeping anywhere (assumed: longer than the
#: gaps of a steadily used system prompt, shorter than an idle conversation's).
LIVE_SEC: Final = 60.0
#: Roots whose last use is remembered.
LIVE_ROOTS: Final = 4096
#: A reply whose cached tokens cover this share of the root's estimate held the root (the
#: estimate is bytes / 4, the engine counts its own tokens and whole blocks).
HELD_SHARE: Final = 0.8


class RootCaches:
    """The roots each target is believed to hold, in LRU order, and each one's retention."""

    def __init__(self, roots_per_target: int = ROOTS_PER_TARGET) -> None:
        self.roots_per_target = roots_per_target
        # target -> {root: tokens}, least recently used first (a dict keeps insertion order).
        self._held: dict[int, dict[int, int]] = {}
        #: target -> root tokens it was seen to retain; absent: unknown.
        self.retained: dict[int, int] = {}
        self._last_use: dict[int, float] = {}

    def held(self, target: int) -> dict[int, int]:
        """The target's roots, least recently used first (a live view: do not change it)."""
        return self._held.get(target, {})

    def sent(self, target: int, root: int, tokens: int, now: float) -> int | None:
        """A request with ``root`` was dispatched to ``target``: the root is its most recent.
        Returns the tokens of the other roots sent there since this one was last used there
        (None if it was not held): what ``learn`` needs when the reply says what was cached."""
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
        held[root] = tokens
        while len(held) > self.roots_per_target:
            del held[next(iter(held))]
        self._last_use.pop(root, None)
        self._last_use[root] = now
        while len(self._last_use) > LIVE_ROOTS:
            del self._last_use[next(iter(self._last_use))]
        return ahead

    def tokens_of(self, root: int) -> int | None:
        """The root's estimated tokens as some target's LRU holds them (None: not held
        anywhere): a peer's prefix record names a root by its hash only."""
        for held in self._held.values():
            n = held.get(root)
            if n is not None:
                return n
        return None

    def learn(self, target: int, tokens: int, ahead: int | None, cached: int | None) -> None:
        """A reply's cached tokens for a root that was held with ``ahead`` tokens of other
        roots used since: the cache retains at least ``ahead + tokens`` when it held the
        root, fewer when it did not."""
        if ahead is None or cached is None or tokens <= 0:
            return
        seen = ahead + tokens
        known = self.retained.get(target)
        if cached >= tokens * HELD_SHARE:
            if known is None or seen > known:
                self.retained[target] = seen
        elif known is None or seen <= known:
            self.retained[target] = max(tokens, seen - 1)

    def resident(self, target: int) -> list[tuple[int, int]]:
        """The roots the target's cache holds by the learned retention, newest first (every
        root sent there while the retention is unknown). Older ones are taken as evicted, but
        remembered: a reply that finds one cached raises the retention."""
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
        tokens each loses (the last one only what does not fit: vLLM frees a sequence's tail
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

    def forget(self, target: int) -> None:
        """The target's cache is gone (a restart, a new generation): nothing held, retention
        kept (the engine is the same size)."""
        self._held.pop(target, None)
