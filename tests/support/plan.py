"""In-memory engines for the plan, state and scheduler tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Coroutine
from typing import Any, TypeVar

from twisted.internet.defer import Deferred, fail, succeed

from pharos.engine.fetch import Fetched

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine whose Deferreds have all fired (in-memory fetchers)."""
    d = Deferred.fromCoroutine(coro)
    results: list[Any] = []
    d.addBoth(results.append)
    assert results, "coroutine did not finish synchronously"
    if isinstance(results[0], Exception) or hasattr(results[0], "raiseException"):
        results[0].raiseException()
    return results[0]


class FakeBackend:
    """Answers chosen per path; everything else is a 404. Counts GETs per path."""

    def __init__(self, answers: dict[str, tuple[int, bytes] | Exception]) -> None:
        self.answers = answers
        self.gets: Counter[str] = Counter()

    def fetch(self, path: str) -> Deferred[Fetched]:
        self.gets[path] += 1
        a = self.answers.get(path, (404, b"not found"))
        if isinstance(a, Exception):
            return fail(a)
        return succeed(Fetched(a[0], "application/json", a[1]))
