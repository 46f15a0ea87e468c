"""Scheduled requests and polling for the bench tests."""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor

from pharos.bench.workloads import Request as Scheduled


def scheduled(at: float, model: str = "tiny") -> Scheduled:
    return Scheduled(at, model, ({"role": "user", "content": "hello"},), 3)


async def _until(predicate: Any) -> None:
    """Wait, on the real reactor, until ``predicate()`` holds (a few seconds at most)."""
    from twisted.internet.task import deferLater

    for _ in range(500):
        if predicate():
            return
        await deferLater(reactor, 0.01, lambda: None)
    raise AssertionError("condition not reached")
