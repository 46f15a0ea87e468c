"""Where the decide row's tail comes from: the same decisions as ``pharos bench pick --only
decide`` timed in order, and the indices of those over twice the median (clustered runs of
consecutive slow calls are the machine, not a decision's work). ``prof`` adds a cProfile.
Usage: taskset -c 1 python decide_tail.py [prof]"""

from __future__ import annotations

import gc
import random
import sys
import time

from twisted.internet.task import Clock

from pharos.config import Backend
from pharos.policy import PolicyConfig
from pharos.sched import SchedRequest, Scheduler
from pharos.sim import bench
from pharos.state.state import State


def main() -> None:
    n, prompt_tokens = 64, 8000
    rng = random.Random(1)
    for _ in range(64):
        bench.mixed_candidates(n, rng)  # the generator where ``bench_decide`` leaves it
    ch = bench._chat(prompt_tokens, rng)
    rng = random.Random(len(ch))
    engines = {f"http://10.0.{i // 250}.{i % 250}:8000":
               bench._Engine(rng.randint(0, 16), round(rng.random(), 3)) for i in range(n)}
    clock = Clock()
    state = State(clock, None, rng=lambda: 0.5, fetcher_for=lambda spec: engines[spec.url])
    sched = Scheduler(state, PolicyConfig())
    state.set_backends([Backend(url=url, kind="vllm", capacity=16) for url in engines])
    state.service.startService()
    clock.pump([1.0] * 6)
    for t in state.targets[::4]:
        sched.index.record(ch.keys[: rng.randint(1, len(ch))], t.id, t.gen, clock.seconds())
    count = [0]

    def one() -> object:
        count[0] += 1
        req = SchedRequest("m", prompt_tokens, count[0], chain=ch)
        return sched.decide(req, sched.targets(req)).decision.target_terms

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


if __name__ == "__main__":
    main()
