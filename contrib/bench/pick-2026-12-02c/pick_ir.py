"""Instructions per call of ``pharos bench pick``'s ``decide`` row (the scheduler's whole
decision over 64 vLLM targets, an 8,000-token chat of 16 messages) and of the chat's chain
hashing, for A/B on a loaded shared machine where wall-clock p99 is noise (issue 10 item 6).

Under ``valgrind --tool=callgrind`` run twice with different counts (``ir_ab.sh``): the
difference of the totals over the difference of the counts is the instructions per call,
Python's start and the bench's setup excluded.

    pick_ir.py decide N    N decisions after 200 warm ones
    pick_ir.py chain N     N chain hashings of the chat
    pick_ir.py pick N      N picks alone over the decision's candidates
    pick_ir.py parts       min and median wall time of the decision and of its parts
    pick_ir.py profile N   cProfile of N decisions
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from typing import Any

from pharos.sim import bench


def setup() -> tuple[list[dict[str, str]], Any]:
    """The bench's chat (messages and chain), made as ``bench_decide`` makes it."""
    rng = random.Random(1)
    for _ in range(64):
        bench.mixed_candidates(64, rng)
    words = ("harbour", "pilot", "tide", "beacon", "channel", "buoy", "vessel", "keel")
    per = 8000 * bench.BYTES_PER_TOKEN // 16
    messages = []
    for i in range(16):
        text = " ".join(rng.choice(words) for _ in range(per // 7 + 1))[:per]
        messages.append({"role": "system" if i == 0 else ("user", "assistant")[i % 2],
                         "content": text})
    return messages, bench.chain("m", messages, None, None)


def decide_closure(ch: Any) -> Callable[[], object]:
    """The bench's own decide row's closure (its fleet, index and clock), not timed."""
    calls: list[Callable[[], object]] = []

    def capture(fn: Callable[[], object], rounds: int) -> list[float]:
        calls.append(fn)
        return [1.0]

    real = bench.time_calls
    bench.time_calls = capture
    try:
        bench._scheduler_decide(64, ch, 8000, 4000, random.Random(len(ch)))
    finally:
        bench.time_calls = real
    return calls[0]


def best(fn: Callable[[], object], n: int = 3000) -> tuple[float, float]:
    """Min and median wall time of ``fn`` over ``n`` calls, in microseconds."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - t0)
    out.sort()
    return round(out[0] / 1000, 1), round(out[n // 2] / 1000, 1)


def parts(one: Callable[[], object]) -> None:
    """The whole decision, its pick alone (on the decision's candidates), the index lookup
    and the up-target list: min and median over 3,000 calls each."""
    from pharos.policy import PolicyConfig, pick
    from pharos.sched import Scheduler

    seen: list[tuple[Any, Any, Any]] = []
    real = Scheduler.decide

    def spy(self: Scheduler, req: Any, targets: Any, waited: float = 0.0) -> Any:
        p = real(self, req, targets, waited)
        seen.append((self, req, p))
        return p

    Scheduler.decide = spy  # type: ignore[method-assign]
    one()
    Scheduler.decide = real  # type: ignore[method-assign]
    sched, req, p = seen[0]
    cands, route, cfg = list(p.candidates), p.route, PolicyConfig()
    print("decide  min/p50 us", best(one))
    print("pick    min/p50 us", best(lambda: pick(route, cands, cfg).target_terms))
    print("lookup  min/p50 us", best(lambda: sched.index.lookup(req.chain, sched.learning.gen)))
    print("targets min/p50 us", best(lambda: sched.targets(req)))


def main() -> None:
    """Entry point: see the module docstring."""
    what = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    messages, ch = setup()
    if what == "chain":
        for _ in range(n):
            bench.chain("m", messages, None, None)
        return
    one = decide_closure(ch)
    for _ in range(200):
        one()
    if what == "parts":
        parts(one)
    elif what == "pick":
        from pharos.policy import PolicyConfig, pick
        from pharos.sched import Scheduler

        seen: list[Any] = []
        real = Scheduler.decide
        Scheduler.decide = lambda self, req, targets, waited=0.0: seen.append(  # type: ignore
            real(self, req, targets, waited)) or seen[-1]
        one()
        Scheduler.decide = real  # type: ignore[method-assign]
        cands, route, cfg = list(seen[0].candidates), seen[0].route, PolicyConfig()
        for _ in range(n):
            _ = pick(route, cands, cfg).target_terms
    elif what == "profile":
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(n or 3000):
            one()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(30)
    else:
        for _ in range(n):
            one()


if __name__ == "__main__":
    main()
