"""Layer 3: the usage journal on the running reactor and its real thread pool
(``pharos.journal``): records land in a real file, in order, written from a pool thread,
never from the reactor's."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.interfaces import IReactorFromThreads

from pharos import journal as journal_module
from pharos.journal import Journal


@pytest_twisted.ensureDeferred
async def test_records_land_in_order_from_a_pool_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """2,000 records written in a burst on the reactor thread all land, in order, once
    ``close`` fires; every append ran in a thread other than the reactor's."""
    threads: set[int] = set()
    append = journal_module._append

    def spy(path: Path, lines: list[str]) -> None:
        threads.add(threading.get_ident())
        append(path, lines)

    monkeypatch.setattr(journal_module, "_append", spy)
    path = tmp_path / "usage.jsonl"
    j = Journal(path, IReactorFromThreads(reactor), capacity=10_000)
    for i in range(2000):
        assert j.write({"key": "k", "n": i})
    await j.close()
    got = [json.loads(line)["n"] for line in path.read_text(encoding="utf-8").splitlines()]
    assert got == list(range(2000))
    assert (j.written, j.dropped, j.failed) == (2000, 0, 0)
    assert threads and threading.get_ident() not in threads
