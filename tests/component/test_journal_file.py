"""Layer 3: the usage journal on the running reactor and its real thread pool
(``pharos.journal``): records land in a real file, in order, in batches written from a pool
thread, never from the reactor's; records trickling in one at a time are written by the
timer without ``close``."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.interfaces import IReactorFromThreads
from twisted.internet.task import deferLater

from pharos import journal as journal_module
from pharos.journal import Journal
from tests.support.fleet import eventually


@pytest_twisted.ensureDeferred
async def test_records_land_in_order_from_a_pool_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """2,000 records written in a burst on the reactor thread all land, in order, once
    ``close`` fires, in a few batches (not a thread round trip per record); every append ran
    in a thread other than the reactor's."""
    threads: set[int] = set()
    append = journal_module._File.append

    def spy(self: journal_module._File, lines: list[str], close: bool) -> None:
        threads.add(threading.get_ident())
        append(self, lines, close)

    monkeypatch.setattr(journal_module._File, "append", spy)
    path = tmp_path / "usage.jsonl"
    j = Journal(path, IReactorFromThreads(reactor), capacity=10_000)
    for i in range(2000):
        assert j.write({"key": "k", "n": i})
    await j.close()
    got = [json.loads(line)["n"] for line in path.read_text(encoding="utf-8").splitlines()]
    assert got == list(range(2000))
    assert (j.written, j.dropped, j.failed) == (2000, 0, 0)
    assert j.batches <= 5
    assert threads and threading.get_ident() not in threads


@pytest_twisted.ensureDeferred
async def test_records_written_one_at_a_time_land_on_the_timer(tmp_path: Path) -> None:
    """Records written one per reactor turn reach the file, in order, on the batch timer
    alone (without ``close``)."""
    path = tmp_path / "usage.jsonl"
    j = Journal(path, IReactorFromThreads(reactor), interval=0.05)
    try:
        for i in range(20):
            assert j.write({"n": i})
            await deferLater(reactor, 0.001)
        await eventually(lambda: j.written == 20, timeout=10)
        got = [json.loads(line)["n"] for line in path.read_text(encoding="utf-8").splitlines()]
        assert got == list(range(20))
    finally:
        await j.close()
