"""Swaps on a one-model host, A-B-A-A-C, FIFO dispatch against swap grouping (issue 15 item 4).

Behaviour, not timing (``pharos.sim.swaps`` runs the real scheduler on a Clock): the same
arrivals give the same swaps on any machine. Rows: slots per host, fair-queue keys (one key:
the fair queue is arrival order; a key each: its heads are), the rule (FIFO: swap grouping
off; grouped with each wait bound). Columns: swaps, requests served, wait p50 / p95 / max in
simulated seconds, and the swaps without grouping per swap of the row (off/x).

    PYTHONPATH=. .venv/bin/python contrib/bench/placement-2026-12-02/swap_sweep.py
"""

from __future__ import annotations

import statistics

from pharos.placement import ReplicaRule
from pharos.sim.swaps import pattern, run_swaps


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    arrivals = pattern(12)  # 60 requests, one every 0.1 s; each holds a slot 1 s
    print(f"A-B-A-A-C x12, a request every 0.1 s, 1 s each ({len(arrivals)} requests)")
    print(f"{'slots':>5} {'keys':>8} {'rule':>14} {'swaps':>6} {'served':>6} "
          f"{'p50':>6} {'p95':>6} {'max':>6} {'off/x':>7}")
    for slots in (1, 2):
        for key, keys in (("k", "one"), (None, "each")):
            fifo = run_swaps(ReplicaRule(swap_grouping=False), arrivals, slots=slots, key=key)
            rows = [("no grouping", fifo)] + [
                (f"grouped {bound:g}s", run_swaps(ReplicaRule(wait_bound_sec=bound), arrivals,
                                                  slots=slots, key=key))
                for bound in (5.0, 10.0, 30.0, 60.0)]
            for name, run in rows:
                waits = list(run.waits.values())
                ratio = fifo.swaps / run.swaps if run.swaps else float("inf")
                print(f"{slots:>5} {keys:>8} {name:>14} {run.swaps:>6} {run.served:>6} "
                      f"{statistics.median(waits):>6.1f} {pct(waits, 0.95):>6.1f} "
                      f"{max(waits):>6.1f} {ratio:>7.1f}")


if __name__ == "__main__":
    main()
