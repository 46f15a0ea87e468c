"""The longest reactor stall of the state file and of a peer snapshot pull, with the default
caps full (issue 13 items 3-4), after the snapshot became newline-delimited JSON parts.

Same content and method as ``contrib/bench/statefile-2026-12-02/measure.py`` (its ``replicas``
is reused: 200k prefix entries over 8 targets, 80k Day cells, stats for 8 targets), on the
real reactor with a 1 ms ``LoopingCall`` recording the longest gap between its calls:

Each phase has only its own instance in the heap, as one process would (a generation-2
collection walks every tracked object, so a second full instance would double it):

- write: ``StateFile.write`` of the full instance;
- restore: ``StateFile.restore`` of that file into an empty instance (at start);
- pull: a SERVING full instance (other prefix entries, its own origin's cells) merging the
  full snapshot as a reconnecting peer's is merged (``tap.py``'s ``restore=``: decode and
  ``restore_in_steps`` before this change, ``restore_bytes`` after), and the same snapshot
  merged a second time (a reconnect after a short partition: nearly everything known).

``gc.callbacks`` times every collection per generation. ``--freeze`` calls ``gc.freeze()``
once the instances are filled (what a process could do after its start-up restore), to see
how much of the stall is generation-2 collections over the long-lived heap. Usage::

    PYTHONPATH=. .venv/bin/python contrib/bench/statefile-2026-12-02b/measure_steps.py \
        [--runs N] [--freeze] [--part-items N] > result.json
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from twisted.internet import reactor, task
from twisted.internet.defer import Deferred

from pharos.peer import snapshot
from pharos.peer.statefile import StateFile
from pharos.service import in_thread

_spec = importlib.util.spec_from_file_location(
    "statefile_measure", Path(__file__).parent.parent / "statefile-2026-12-02" / "measure.py")
assert _spec is not None and _spec.loader is not None
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)


class GcLog:
    """Every collection's duration, per generation, between two ``take`` calls."""

    def __init__(self) -> None:
        self.times: dict[int, list[float]] = {}
        self._t = 0.0
        gc.callbacks.append(self.on_gc)

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.times.setdefault(info["generation"], []).append(time.perf_counter() - self._t)

    def take(self) -> dict[str, Any]:
        out = {f"gen{g}": {"n": len(v), "max_ms": round(max(v) * 1000, 1)}
               for g, v in sorted(self.times.items())}
        self.times = {}
        return out


def serving_replicas() -> Any:
    """A serving instance full of its own prefix entries (another seed) and of its own
    origin's 80k cells, so the pulled snapshot adds as much as it can."""
    r = base.replicas(fill=False)
    rng = base.random.Random(11)
    now = time.time()
    roots = [rng.getrandbits(64) for _ in range(2000)]
    n = len(r.state.targets)
    i = 0
    while len(r.index) < base.DEFAULT_CAPACITY * 0.97:
        chain = [rng.choice(roots)] + [rng.getrandbits(64) for _ in range(3)]
        r.index.record(chain, rng.randrange(n), 0, now - 3600 + i * 0.01)
        i += 1
    today = int(now // 86400)
    r.ledger.merge([
        {"origin": "serving", "kind": "day", "bucket": today - d, "key": f"key-{k}",
         "tenant": f"tenant-{k % 3}", "model": f"model-{m}", "requests": 10 + d,
         "prompt_tokens": 1234, "cached_tokens": 234, "completion_tokens": 98,
         "unmetered": 0}
        for d in range(base.DAYS) for k in range(base.KEYS) for m in range(base.MODELS)])
    return r


def pull(replicas: Any, data: bytes) -> Deferred[Any]:
    """What ``tap.py`` hands a pulled snapshot's bytes to (either version of the code)."""
    if hasattr(snapshot, "restore_bytes"):
        return snapshot.restore_bytes(replicas, data, reactor)
    return snapshot.restore_in_steps(replicas, snapshot.decode(data), reactor)  # type: ignore[attr-defined]


async def measure(runs: int, freeze: bool, part_items: int | None) -> dict[str, Any]:
    t0 = time.perf_counter()
    full = base.replicas(fill=True)
    fill_sec = time.perf_counter() - t0
    if freeze:
        gc.collect()
        gc.freeze()
    if part_items is not None:
        setattr(snapshot, "PART_ITEMS", part_items)  # noqa: B010 (a Final, changed for a run)
    out: dict[str, Any] = {
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
                   f"{platform.python_implementation()} {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M"), "load_avg_at_start": os.getloadavg()[0],
        "code": "restore_bytes" if hasattr(snapshot, "restore_bytes") else "decode+steps",
        "freeze": freeze, "part_items": getattr(snapshot, "PART_ITEMS", None),
        "prefix_entries": len(full.index),
        "cells": len(full.ledger.export(minutes=False)), "fill_sec": round(fill_sec, 1),
        "runs": []}
    gaps = base.Gaps()
    gcs = GcLog()

    async def timed(what: Any) -> tuple[float, float, dict[str, Any]]:
        gcs.take()
        gaps.start()
        t = time.perf_counter()
        await what()
        sec = time.perf_counter() - t
        return round(gaps.stop() * 1000, 1), round(sec, 2), gcs.take()

    # Each phase holds only the instances it needs, as one process would: the writer's for
    # the writes, then the restored one, then the serving one.
    rows: list[dict[str, Any]] = [{} for _ in range(runs)]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pharos.state")
        writer = StateFile(path, full, reactor, in_thread=in_thread(reactor))
        for row in rows:
            gaps.start()
            await task.deferLater(reactor, 0.2)
            row["idle_max_gap_ms"] = round(gaps.stop() * 1000, 1)
            row["write_max_gap_ms"], row["write_sec"], row["write_gc"] = await timed(
                writer.write)
            row["file_bytes"] = os.path.getsize(path)
        entries = len(full.index)
        del full, writer
        gc.collect()
        with open(path, "rb") as f:
            data = f.read()
        for row in rows:
            fresh = base.replicas(fill=False)
            row["restore_max_gap_ms"], row["restore_sec"], row["restore_gc"] = await timed(
                StateFile(path, fresh, reactor, in_thread=in_thread(reactor)).restore)
            assert len(fresh.index) == entries, (len(fresh.index), entries)
            del fresh
            gc.collect()
        for row in rows:
            serving = serving_replicas()
            gc.collect()
            if freeze:
                gc.freeze()
            for name in ("pull", "pull_again"):
                row[f"{name}_max_gap_ms"], row[f"{name}_sec"], row[f"{name}_gc"] = (
                    await timed(lambda s=serving: pull(s, data)))
            del serving
            gc.collect()
            if freeze:
                gc.unfreeze()
    for row in rows:
        out["runs"].append(row)
        print({k: v for k, v in row.items() if "gap" in k or "sec" in k}, file=sys.stderr)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--freeze", action="store_true")
    parser.add_argument("--part-items", type=int, default=None)
    args = parser.parse_args()
    result: dict[str, Any] = {}

    def done(r: Any) -> None:
        result["r"] = r
        reactor.stop()

    reactor.callWhenRunning(
        lambda: Deferred.fromCoroutine(
            measure(args.runs, args.freeze, args.part_items)).addBoth(done))
    reactor.run()
    r = result["r"]
    if not isinstance(r, dict):
        r.raiseException()
    import json
    print(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
