"""``pharos bench memory``: what the bounded tables cost when full, reported, never asserted.

The prefix index at its default capacity, under ``tracemalloc``, for one-link records (each
request a new one-message chat: the worst case) and conversations (2 to 16 messages over 64
shared system prompts on 3 targets). And the RSS of a child process holding Pharos's service
tree (not started) with every default cap full: the index, the session table, the hot roots.
"""

from __future__ import annotations

import gc
import hashlib
import json
import random
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from pharos.bench.pick import machine
from pharos.prefix import DEFAULT_CAPACITY, PrefixIndex, chain

#: System prompts shared by the conversations.
ROOTS = 64
#: Targets the conversations are recorded on.
TARGETS = 3


#: Links recorded per entry of capacity: full, and turned over once, as a long-running
#: index is (a full shard drops its oldest in batches, so it holds a little less).
TURNOVER = 2


def _one_link(index: PrefixIndex, rng: random.Random, n: int) -> None:
    for k in range(TURNOVER * n):
        index.record([rng.getrandbits(64)], k % TARGETS, 0, 1_000_000.0 + k)


def _conversations(index: PrefixIndex, rng: random.Random, n: int) -> None:
    """Conversations' chains (a shared system prompt, then their own turns), each on one of
    the targets, its links touched together, until ``TURNOVER * n`` links were recorded."""
    systems = [{"role": "system", "content": f"system prompt {r} " * 40} for r in range(ROOTS)]
    k = links = 0
    while links < TURNOVER * n:
        turns = rng.randint(1, 15)
        messages = [systems[rng.randrange(ROOTS)]] + [
            {"role": ("user", "assistant")[i % 2], "content": f"turn {i} of {k}"}
            for i in range(turns)]
        ch = chain("m", messages, None, None)
        index.record(ch, k % TARGETS, 0, 1_000_000.0 + k)
        links += len(ch)
        k += 1


def index_bytes(fill: Callable[[PrefixIndex, random.Random, int], None],
                capacity: int = DEFAULT_CAPACITY, seed: int = 1) -> dict[str, Any]:
    """The index's traced bytes once ``fill`` has it full and turned over (the chains' own
    objects are garbage by then, as a request's are after it ends)."""
    rng = random.Random(seed)
    gc.collect()
    tracemalloc.start()
    try:
        index = PrefixIndex(capacity)
        fill(index, rng, capacity)
        gc.collect()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    entries = len(index)
    return {"entries": entries, "mb": round(held / 1e6, 1), "peak_mb": round(peak / 1e6, 1),
            "bytes_per_entry": round(held / entries)}


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def child() -> dict[str, Any]:
    """In this process: Pharos's service tree, then every default cap filled; RSS at each."""
    from twisted.internet import reactor

    from pharos.config import parse_config
    from pharos.service import PharosService

    config = parse_config("backends:\n" + "".join(
        f"  - url: http://127.0.0.1:{9 + i}\n    kind: vllm\n" for i in range(TARGETS)))
    top = PharosService.from_config(reactor, config)
    gc.collect()
    out: dict[str, Any] = {"rss_service_mb": round(_rss_mb(), 1)}
    sched = top.sched
    _conversations(sched.index, random.Random(1), sched.index.capacity)
    for s in range(sched.guards.sessions):
        key = int.from_bytes(hashlib.blake2b(b"s%d" % s, digest_size=8).digest(), "big")
        sched.sessions[key] = s % TARGETS
    now = time.monotonic()
    for root in range(sched.hot.capacity):
        sched.hot.add(root << 32, 1.0, now)
    gc.collect()
    out.update({"rss_full_mb": round(_rss_mb(), 1), "index_entries": len(sched.index),
                "sessions": len(sched.sessions), "hot_roots": len(sched.hot)})
    return out


def bench_memory() -> dict[str, Any]:
    """Both figures, with the machine and date."""
    result: dict[str, Any] = {"bench": "memory", "capacity": DEFAULT_CAPACITY,
                              "machine": machine(), "date": time.strftime("%Y-%m-%d")}
    result["index_one_link"] = index_bytes(_one_link)
    result["index_conversations"] = index_bytes(_conversations)
    run = subprocess.run([sys.executable, "-m", "pharos.bench.memory", "--child"],
                         capture_output=True, text=True, timeout=600, check=True)
    result["process"] = json.loads(run.stdout)
    return result


def main_memory(argv: list[str]) -> int:
    """``pharos bench memory [--json]``."""
    import argparse

    p = argparse.ArgumentParser(prog="pharos bench memory")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    r = bench_memory()
    if a.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"memory at the default caps ({r['date']}, Python {r['machine']['python']})")
    for name in ("index_one_link", "index_conversations"):
        m = r[name]
        print(f"  {name:<20} {m['entries']:>7} entries  {m['mb']:6.1f} MB  "
              f"({m['bytes_per_entry']} B/entry, peak {m['peak_mb']} MB)")
    p_ = r["process"]
    print(f"  process RSS          {p_['rss_service_mb']:6.1f} MB with the service built, "
          f"{p_['rss_full_mb']:6.1f} MB with {p_['index_entries']} index entries, "
          f"{p_['sessions']} sessions, {p_['hot_roots']} hot roots")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        print(json.dumps(child()))
    else:
        sys.exit(main_memory(sys.argv[1:]))
