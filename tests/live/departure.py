"""A client that leaves mid-stream through Pharos, on a live engine: the engine stops it."""

from __future__ import annotations

from typing import Any

from twisted.internet.threads import deferToThread

from tests.live.engines import engines
from tests.live.load import start_streams, stop_all, wait_started
from tests.live.routing import front
from tests.support.fleet import eventually


async def client_leaves_mid_stream(eng: engines.RunningEngine, kind: str, body: dict[str, Any],
                                   running_metric: str) -> None:
    """Start a long stream through Pharos and close it after its first token: Pharos holds no
    lease, and the engine reports nothing running within a generous wait, long before the
    stream's tokens would have ended. (A stream that ended before the engine's gauge showed
    it is started again: nothing would tell its cancellation from its end.)"""
    pharos = await front(eng.url, kind)
    seen: list[float] = []

    def running() -> float:
        value = float(engines.get_metrics(eng.url).get(running_metric, 0))
        if not seen or seen[-1] != value:
            seen.append(value)
        return value

    try:
        for attempt in range(3):  # again when the stream ended before the engine showed it
            streams = start_streams(pharos.url, body, 1)
            stream = streams[0]
            await deferToThread(wait_started, streams, 1)
            # The engine's gauge follows its steps (and a previous test's cancelled streams
            # may still be leaving): wait for it to show this one alone, while it runs (a
            # tiny model on a busy machine can finish a whole context in seconds).
            try:
                await eventually(lambda s=stream: running() == 1 or s.finished.is_set(),
                                 timeout=30)
            except AssertionError:
                await deferToThread(stop_all, streams)
                raise AssertionError(f"the engine never showed the stream alone: {seen}") from None
            if not stream.finished.is_set():
                break
            assert attempt < 2, f"the stream ended before the engine showed it, 3 times: {seen}"
            await eventually(lambda: running() == 0, timeout=60)
        await deferToThread(stop_all, streams)

        def idle() -> bool:
            return running() == 0

        await eventually(lambda: all(t.inflight == 0 for t in pharos.pharos.state.targets),
                         timeout=20)
        await eventually(idle, timeout=30)
    finally:
        await pharos.stop()
