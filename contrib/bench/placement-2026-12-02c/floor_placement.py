"""Hindsight floors of cold loads per 1,000 requests for the placement grid's fleets (issue 15
item 5): what any router could reach on the same requests and host memory.

    PYTHONPATH=. .venv/bin/python contrib/bench/placement-2026-12-02c/floor_placement.py

Each fleet holds ``C`` model copies at once (hosts x models per host: 6, 4, 8 and 3). The
requests are the grid's (``pharos.bench.placement.workload``, seeds 1-5). Computed on the
sequence of requested models in arrival order, every request served at its arrival in zero
time (no slots, no queue, no load time), the fleet's memory pooled (any copy may go):

* ``belady``: Belady's MIN, the offline optimum of that problem (on a miss with the memory
  full, unload the model whose next request is furthest). No router that sends each request
  when it arrives loads fewer: real slots, load times and one host's memory only make it
  harder. A router that holds requests back can go below it by grouping (swap grouping
  on one-model hosts does); ``belady-wait`` gives an idea of how far.
* ``belady-wait``: the same after folding each request into the first request of its
  model's group, a group being the requests for a model within ``WAIT_SEC`` of its first (as
  if the group's first requests had waited for its last, the wait bound's 30 s): an estimate
  of how far grouping reaches, not a bound.
* ``static``: the ``C - 1`` most popular models (by the workload's weights) kept loaded, the
  rest through one copy: an online rule that knows the popularity.
* ``lru``: one pooled least-recently-used cache of ``C`` models.
* ``host-lru``: what a router can do when each host unloads its own least recently used
  model (Ollama) and the router only picks the host: ``hosts`` caches of ``C / hosts``
  models, each LRU; a miss goes to the host whose LRU model is ``hindsight``: next asked for
  last (greedy, with the future known), or ``popularity``: least popular by the workload's
  weights (what an exact demand estimate would price).
"""

from __future__ import annotations

import math
import statistics
from collections import OrderedDict

from pharos.bench.placement import FleetConfig, workload

WAIT_SEC = 30.0
SEEDS = (1, 2, 3, 4, 5)
FLEETS = (
    FleetConfig(hosts=3, models=8),
    FleetConfig(hosts=2, models=8),
    FleetConfig(hosts=4, models=16),
    FleetConfig(hosts=3, models=8, kind="llama-swap", rate=0.6, keep_alive=None),
)


def belady(seq: list[str], c: int) -> int:
    """Misses of Belady's MIN with ``c`` slots on ``seq``."""
    nxt = [0.0] * len(seq)
    last: dict[str, float] = {}
    for i in range(len(seq) - 1, -1, -1):
        nxt[i] = last.get(seq[i], math.inf)
        last[seq[i]] = i
    cache: dict[str, float] = {}
    misses = 0
    for i, m in enumerate(seq):
        if m not in cache:
            misses += 1
            if len(cache) >= c:
                del cache[max(cache, key=lambda k: cache[k])]
        cache[m] = nxt[i]
    return misses


def lru(seq: list[str], c: int) -> int:
    """Misses of one LRU cache of ``c`` models."""
    cache: OrderedDict[str, None] = OrderedDict()
    misses = 0
    for m in seq:
        if m in cache:
            cache.move_to_end(m)
            continue
        misses += 1
        if len(cache) >= c:
            cache.popitem(last=False)
        cache[m] = None
    return misses


def static(seq: list[str], c: int) -> int:
    """Misses with the ``c - 1`` most popular models pinned (each loaded once) and one swap
    copy for the rest."""
    pinned = {f"model-{i}" for i in range(c - 1)}
    seen: set[str] = set()
    slot = None
    misses = 0
    for m in seq:
        if m in pinned:
            if m not in seen:
                seen.add(m)
                misses += 1
        elif m != slot:
            slot = m
            misses += 1
    return misses


def host_lru(seq: list[str], hosts: int, per_host: int, hindsight: bool) -> int:
    """Misses of ``hosts`` LRU caches of ``per_host`` models, a miss placed on the host whose
    LRU model is asked for last (``hindsight``) or is the least popular (model-<i>: higher i
    is less popular); a host with room first."""
    nxt_at: list[dict[str, float]] = []
    if hindsight:
        last: dict[str, float] = {}
        nxt_at = [{} for _ in seq]
        for i in range(len(seq) - 1, -1, -1):
            nxt_at[i] = dict(last)
            last[seq[i]] = i
    caches: list[OrderedDict[str, None]] = [OrderedDict() for _ in range(hosts)]
    misses = 0
    for i, m in enumerate(seq):
        holder = next((c for c in caches if m in c), None)
        if holder is not None:
            holder.move_to_end(m)
            continue
        misses += 1
        room = [c for c in caches if len(c) < per_host]
        if room:
            room[0][m] = None
            continue

        def badness(c: OrderedDict[str, None], i: int = i) -> float:
            victim = next(iter(c))
            if hindsight:
                return -nxt_at[i].get(victim, math.inf)
            return -int(victim.rsplit("-", 1)[1])

        best = min(caches, key=badness)
        best.popitem(last=False)
        best[m] = None
    return misses


def merged(times: list[float], seq: list[str]) -> list[str]:
    """``seq`` with each request folded into its model's group: the requests within
    ``WAIT_SEC`` of the group's first."""
    out: list[str] = []
    first: dict[str, float] = {}  # model -> its open group's first request
    for t, m in zip(times, seq, strict=True):
        f = first.get(m)
        if f is not None and t - f <= WAIT_SEC:
            continue
        first[m] = t
        out.append(m)
    return out


def main() -> None:
    print("| fleet | copies | belady | belady-wait (30 s, estimate) | static | lru | "
          "host-lru hindsight | host-lru popularity |")
    print("|---|---|---|---|---|---|---|---|")
    for cfg in FLEETS:
        cols: dict[str, list[float]] = {
            k: [] for k in ("belady", "wait", "static", "lru", "hl-hind", "hl-pop")}
        per_seed = []
        for seed in SEEDS:
            reqs = workload(cfg, seed)
            seq = [r.model for r in reqs]
            times = [r.at for r in reqs]
            k = 1000.0 / len(seq)
            c = cfg.resident
            per_host = c // cfg.hosts
            row = {"belady": belady(seq, c) * k, "wait": belady(merged(times, seq), c) * k,
                   "static": static(seq, c) * k, "lru": lru(seq, c) * k,
                   "hl-hind": host_lru(seq, cfg.hosts, per_host, True) * k,
                   "hl-pop": host_lru(seq, cfg.hosts, per_host, False) * k}
            for key, v in row.items():
                cols[key].append(v)
            per_seed.append(row)
        med = {key: statistics.median(v) for key, v in cols.items()}
        seeds = " / ".join(f"{r['belady']:.0f}" for r in per_seed)
        print(f"| {cfg.name} | {cfg.resident} | {med['belady']:.0f} (seeds {seeds}) | "
              f"{med['wait']:.0f} | {med['static']:.0f} | {med['lru']:.0f} | "
              f"{med['hl-hind']:.0f} | {med['hl-pop']:.0f} |")


if __name__ == "__main__":
    main()
