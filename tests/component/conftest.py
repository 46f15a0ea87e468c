"""Fixtures the component tests share."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from typing import Protocol

import pytest_twisted

# The tests that stop ``twistd`` or ``pharos sim-engine`` with SIGINT need the child to get
# SIGINT's default disposition. A run started in the background by a non-interactive shell
# (``(setsid make test &)``) has SIGINT ignored, every child inherits that, and Twisted (as
# ``nohup`` users expect) keeps it ignored: the test waited out its timeout. A handler here
# is reset to the default in each child at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


class Closable(Protocol):
    """A test rig: whatever it started stops in ``close``."""

    async def close(self) -> None: ...


@pytest_twisted.async_yield_fixture()
async def rigs() -> AsyncIterator[list[Closable]]:
    """A list the test appends its rigs to; each is closed after the test."""
    made: list[Closable] = []
    yield made
    for rig in made:
        await rig.close()
