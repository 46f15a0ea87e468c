"""A client that leaves mid-stream through Pharos, on a live engine: the engine stops it."""

from __future__ import annotations

from typing import Any

from twisted.internet.threads import deferToThread

from tests.component.fleet import eventually
from tests.live.engines import engines
from tests.live.load import start_streams, stop_all, wait_started
from tests.live.routing import front


async def client_leaves_mid_stream(eng: engines.RunningEngine, kind: str, body: dict[str, Any],
                                   running_metric: str) -> None:
    """Start a long stream through Pharos and close it after its first token: Pharos holds no
    lease, and the engine reports nothing running (the stream alone would run for minutes)
    within a generous wait."""
    pharos = await front(eng.url, kind)
    try:
        streams = start_streams(pharos.url, body, 1)
        await deferToThread(wait_started, streams, 1)

        def running() -> float:
            return float(engines.get_metrics(eng.url).get(running_metric, 0))

        # The engine's gauge follows its steps (and a previous test's cancelled streams may
        # still be leaving): wait for it to show this one alone.
        await eventually(lambda: running() == 1, timeout=30)
        await deferToThread(stop_all, streams)

        def idle() -> bool:
            return running() == 0

        await eventually(lambda: all(t.inflight == 0 for t in pharos.pharos.state.targets),
                         timeout=20)
        await eventually(idle, timeout=30)
    finally:
        await pharos.stop()
