"""The state file's longest reactor stall with the default caps full (issue 13 item 3).

Fills a prefix index at its default ``routing.prefix_entries`` (200k entries, chains over 8
targets, shared roots so entries hold 1-4 slots) and a ledger with 20 keys x 10 models x 400
days of Day cells (80k cells), then, on the real reactor, writes the state file
(``StateFile.write``: ``snapshot.build`` in steps, the file written in a thread) and restores
it into a fresh instance (``StateFile.restore``: read + decode in a thread, merged in steps),
while a 1 ms ``LoopingCall`` records the longest gap between its calls. Usage:

    PYTHONPATH=. .venv/bin/python contrib/bench/statefile-2026-12-02/measure.py [runs]
"""

from __future__ import annotations

import gc
import json
import os
import platform
import random
import sys
import tempfile
import time
import zlib
from typing import Any

from twisted.internet import reactor, task
from twisted.internet.defer import Deferred

from pharos.config import Backend as BackendSpec
from pharos.peer.snapshot import Replicas
from pharos.peer.statefile import StateFile
from pharos.prefix import DEFAULT_CAPACITY, PrefixIndex
from pharos.service import in_thread
from pharos.state.registry import BackendState
from pharos.state.state import State
from pharos.state.stats import Sample, learn
from pharos.usage import Ledger

KEYS, MODELS, DAYS = 20, 10, 400


def replicas(fill: bool) -> Replicas:
    state = State(reactor, None, fetcher_for=lambda spec: None)  # type: ignore[arg-type,return-value]
    targets = []
    for b in range(4):
        backend = BackendState(BackendSpec(url=f"http://10.0.0.{b}:8000", kind="vllm"))
        targets += [state.target(backend, f"model-{m}", f"model-{m}") for m in range(2)]
    index = PrefixIndex(DEFAULT_CAPACITY)
    ledger = Ledger(reactor, origin="bench", timezone="UTC", retention_days=DAYS)
    if fill:
        rng = random.Random(7)
        now = time.time()
        roots = [rng.getrandbits(64) for _ in range(2000)]
        i = 0
        while len(index) < DEFAULT_CAPACITY * 0.97 or i < 80_000:
            chain = [rng.choice(roots)] + [rng.getrandbits(64) for _ in range(3)]
            index.record(chain, rng.randrange(len(targets)), 0, now - 3600 + i * 0.01)
            i += 1
        today = int(now // 86400)
        rows: list[dict[str, Any]] = [
            {"origin": "bench", "kind": "day", "bucket": today - d, "key": f"key-{k}",
             "tenant": f"tenant-{k % 3}", "model": f"model-{m}", "requests": 1000 + d,
             "prompt_tokens": 123_456_789, "cached_tokens": 23_456_789,
             "completion_tokens": 9_876_543, "unmetered": 3}
            for d in range(DAYS) for k in range(KEYS) for m in range(MODELS)]
        ledger.merge(rows)
        for t in targets:
            learn(t.stats, Sample(ok=True, dispatched_cold=False, ttft_sec=0.2,
                                  duration_sec=3.0, prompt_tokens=2000, cached_tokens=0))
    return Replicas(state, index, ledger)


class GcPauses:
    """The longest garbage-collector pass (``gc.callbacks``), per generation."""

    def __init__(self) -> None:
        self.max: dict[int, float] = {}
        self._t = 0.0
        gc.callbacks.append(self.on_gc)

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            g = info["generation"]
            self.max[g] = max(self.max.get(g, 0.0), time.perf_counter() - self._t)

    def take(self) -> dict[str, float]:
        out = {f"gen{g}": round(v * 1000, 1) for g, v in sorted(self.max.items())}
        self.max = {}
        return out


class Gaps:
    """The longest gap between the calls of a 1 ms LoopingCall."""

    def __init__(self) -> None:
        self.last = time.perf_counter()
        self.max = 0.0
        self.loop = task.LoopingCall(self.tick)

    def tick(self) -> None:
        now = time.perf_counter()
        self.max = max(self.max, now - self.last)
        self.last = now

    def start(self) -> None:
        self.last = time.perf_counter()
        self.max = 0.0
        self.loop.start(0.001)

    def stop(self) -> float:
        self.loop.stop()
        return self.max


async def measure(runs: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    full = replicas(fill=True)
    fill_sec = time.perf_counter() - t0
    out: dict[str, Any] = {
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
                   f"{platform.python_implementation()} {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"), "prefix_entries": len(full.index),
        "slots": sum(len(full.index.slots(k)) for k in full.index.lru_order()),
        "cells": len(full.ledger.export(minutes=False)), "fill_sec": round(fill_sec, 1),
        "runs": []}
    gaps = Gaps()
    pauses = GcPauses()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pharos.state")
        for _ in range(runs):
            gaps.start()
            await task.deferLater(reactor, 0.2)
            idle_gap = gaps.stop()
            writer = StateFile(path, full, reactor, in_thread=in_thread(reactor))
            pauses.take()
            gaps.start()
            t = time.perf_counter()
            await writer.write()
            write_sec = time.perf_counter() - t
            write_gap = gaps.stop()
            write_gc = pauses.take()
            fresh = replicas(fill=False)
            gaps.start()
            t = time.perf_counter()
            await StateFile(path, fresh, reactor, in_thread=in_thread(reactor)).restore()
            restore_sec = time.perf_counter() - t
            restore_gap = gaps.stop()
            restore_gc = pauses.take()
            with open(path, "rb") as f:
                raw = zlib.decompress(f.read(), 31)
            t = time.perf_counter()
            json.loads(raw)
            loads_sec = time.perf_counter() - t
            assert len(fresh.index) == len(full.index), (len(fresh.index), len(full.index))
            out["runs"].append({
                "idle_max_gap_ms": round(idle_gap * 1000, 1),
                "write_max_gap_ms": round(write_gap * 1000, 1),
                "write_sec": round(write_sec, 2), "file_bytes": os.path.getsize(path),
                "restore_max_gap_ms": round(restore_gap * 1000, 1),
                "restore_sec": round(restore_sec, 2), "write_gc_max_ms": write_gc,
                "restore_gc_max_ms": restore_gc, "json_loads_sec": round(loads_sec, 2),
                "json_bytes": len(raw)})
            print(json.dumps(out["runs"][-1]), file=sys.stderr)
    return out


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    result: dict[str, Any] = {}

    def done(r: Any) -> None:
        result["r"] = r
        reactor.stop()

    reactor.callWhenRunning(lambda: Deferred.fromCoroutine(measure(runs)).addBoth(done))
    reactor.run()
    r = result["r"]
    if not isinstance(r, dict):
        r.raiseException()
    print(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
