"""Fixtures the component tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import pytest_twisted


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
