"""Where the decide row's tail comes from: the same decisions as ``pharos bench pick --only
decide`` timed in order, and the indices of those over twice the median (clustered runs of
consecutive slow calls are the machine, not a decision's work). ``prof`` adds a cProfile.
Usage: taskset -c 1 python decide_tail.py [prof]"""

from __future__ import annotations

import gc
import random
import sys
import time

from pharos.sim import bench


def main() -> None:
    n, prompt_tokens = 64, 8000
    rng = random.Random(1)
    for _ in range(64):
        bench.mixed_candidates(n, rng)  # the generator where ``bench_decide`` leaves it
    ch = bench._chat(prompt_tokens, rng)
    one, stop = bench.decide_fleet(n, ch, prompt_tokens, random.Random(len(ch)))
    for _ in range(1000):
        one()
    gc.disable()
    ts = []
    for _ in range(5000):
        t0 = time.perf_counter_ns()
        one()
        ts.append((time.perf_counter_ns() - t0) / 1000)
    gc.enable()
    s = sorted(ts)
    print("min", s[0], "p50", s[2500], "p90", s[4500], "p99", s[4950])
    slow = [i for i, t in enumerate(ts) if t > 2 * s[2500]]
    print(len(slow), "slow; first indices", slow[:40])
    if len(sys.argv) > 1:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(3000):
            one()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)
    stop()


if __name__ == "__main__":
    main()
