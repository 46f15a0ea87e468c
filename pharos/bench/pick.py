"""``pharos bench pick``: the routing decision's time, reported, never asserted."""

from __future__ import annotations

import gc
import json
import platform
import random
import time
from collections.abc import Callable
from typing import Any

from pharos.policy import Candidate, PolicyConfig, RouteReq, pick
from pharos.prefix import BYTES_PER_TOKEN, Chain, PrefixIndex, chain


def mixed_candidates(n: int, rng: random.Random) -> list[Candidate]:
    """``n`` candidates as a mixed fleet looks: warm and cold, busy and idle, some unknowns."""
    out = []
    for i in range(n):
        warm = rng.choice([True, True, False, None])
        cap = rng.choice([1, 2, 4, 8])
        busy = rng.randint(0, cap)
        out.append(Candidate(
            target_id=i,
            warm=warm,
            capacity=cap,
            free_slots=cap - busy,
            queue_ahead=rng.randint(0, 3) if busy == cap else 0,
            kv_usage=rng.choice([None, rng.random()]),
            matched_tokens=rng.choice([0, 0, rng.randint(0, 8000)]),
            prefill_sec_per_token=rng.choice([None, rng.uniform(0.0005, 0.01)]),
            load_sec=rng.choice([None, rng.uniform(1, 20)]),
            service_sec=rng.choice([None, rng.uniform(1, 30)]),
            fits_if_cold=rng.choice([None, True, False]) if warm is False else None,
            loading=warm is False and rng.random() < 0.2,
            inflight=busy,
        ))
    return out


def percentile(sorted_values: list[float], p: float) -> float:
    """The p-th percentile (0..100) of sorted values, nearest rank."""
    k = max(0, min(len(sorted_values) - 1, round(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def time_calls(fn: Callable[[], object], rounds: int) -> list[float]:
    """Wall time of each call in microseconds, sorted (GC off while timing)."""
    out = []
    gc.disable()
    try:
        for _ in range(rounds):
            t0 = time.perf_counter_ns()
            fn()
            out.append((time.perf_counter_ns() - t0) / 1000)
    finally:
        gc.enable()
    out.sort()
    return out


def bench_pick(candidates: int = 64, prompt_tokens: int = 8000, rounds: int = 20000,
               seed: int = 1) -> dict[str, Any]:
    """p50/p99 of one decision over ``candidates`` mixed candidates, for both policies.

    A decision is what the scheduler reads to place a request: the target, whether to queue
    and the winner's terms. Its reason is built when first read (the reply's headers), so
    ``cost+index+reason`` times the decision with its reason: what an answered request pays."""
    rng = random.Random(seed)
    fleets = [mixed_candidates(candidates, rng) for _ in range(64)]
    results: dict[str, Any] = {
        "bench": "pick", "candidates": candidates, "prompt_tokens": prompt_tokens,
        "rounds": rounds, "machine": machine(), "date": time.strftime("%Y-%m-%d"),
    }
    for name in ("cost", "least-load"):
        cfg = PolicyConfig(name=name)
        i = [0]

        def one(cfg: PolicyConfig = cfg, i: list[int] = i) -> object:
            i[0] += 1
            return pick(RouteReq(prompt_tokens, i[0]), fleets[i[0] % 64], cfg).target_terms

        time_calls(one, 2000)  # warm up
        us = time_calls(one, rounds)
        results[name] = _summary(us)
    results.update(_with_index(fleets, candidates, prompt_tokens, rounds, rng))
    return results


def _summary(us: list[float]) -> dict[str, float]:
    """p50, p99, mean and min: on a shared machine the min shows the code's own cost, the
    p99 mostly whoever else had the CPU."""
    return {"p50_us": round(percentile(us, 50), 1), "p99_us": round(percentile(us, 99), 1),
            "mean_us": round(sum(us) / len(us), 1), "min_us": round(us[0], 1)}


def bench_decide(candidates: int = 64, prompt_tokens: int = 8000, rounds: int = 20000,
                 seed: int = 1) -> dict[str, Any]:
    """The ``decide`` row alone (``--only decide``): the same chat and fleet as in
    ``bench_pick``, timed over ``rounds // 4`` decisions."""
    rng = random.Random(seed)
    for _ in range(64):
        mixed_candidates(candidates, rng)  # the generator where ``bench_pick`` leaves it
    ch = _chat(prompt_tokens, rng)
    return {"bench": "pick", "candidates": candidates, "prompt_tokens": prompt_tokens,
            "rounds": rounds, "machine": machine(), "date": time.strftime("%Y-%m-%d"),
            "decide": _scheduler_decide(candidates, ch, prompt_tokens, rounds,
                                        random.Random(len(ch))),
            "decide/1w": _scheduler_decide_written(candidates, ch, prompt_tokens, rounds,
                                                   random.Random(len(ch)))}


def _chat(prompt_tokens: int, rng: random.Random) -> Chain:
    """The prefix chain of a ``prompt_tokens`` chat of 16 messages."""
    words = ("harbour", "pilot", "tide", "beacon", "channel", "buoy", "vessel", "keel")
    per = prompt_tokens * BYTES_PER_TOKEN // 16
    messages = []
    for i in range(16):
        text = " ".join(rng.choice(words) for _ in range(per // 7 + 1))[:per]
        messages.append({"role": "system" if i == 0 else ("user", "assistant")[i % 2],
                         "content": text})
    return chain("m", messages, None, None)


def _with_index(fleets: list[list[Candidate]], n: int, prompt_tokens: int, rounds: int,
                rng: random.Random) -> dict[str, Any]:
    """The cost decision with the prefix index: the lookup of a 16-message chat (recorded to
    various depths on a quarter of the targets, among 50k other entries), then ``pick`` over
    the priced candidates; apart, the lookup alone and the chain's hashing (once per request)."""
    import dataclasses

    words = ("harbour", "pilot", "tide", "beacon", "channel", "buoy", "vessel", "keel")
    per = prompt_tokens * BYTES_PER_TOKEN // 16
    messages = []
    for i in range(16):
        text = " ".join(rng.choice(words) for _ in range(per // 7 + 1))[:per]
        messages.append({"role": "system" if i == 0 else ("user", "assistant")[i % 2],
                         "content": text})
    ch = chain("m", messages, None, None)
    # Its own generator, so the rows below see the same index as before the row was added.
    decide = _scheduler_decide(n, ch, prompt_tokens, rounds, random.Random(len(ch)))
    written = _scheduler_decide_written(n, ch, prompt_tokens, rounds, random.Random(len(ch)))
    index = PrefixIndex()
    for k in range(50_000):
        index.record([rng.getrandbits(64)], k % n, 0, float(k))
    for tid in range(0, n, 4):
        index.record(ch.keys[: rng.randint(1, len(ch))], tid, 0, 1.0)
    gens = dict.fromkeys(range(n), 0)
    cfg = PolicyConfig()
    count = [0]

    # The scheduler prices a match when it builds each candidate (outside these figures, as
    # in "cost" above), so the fleets are priced once here from the same lookup.
    found = index.lookup(ch, gens)
    priced = [[dataclasses.replace(c, matched_tokens=m.matched_bytes // BYTES_PER_TOKEN)
               if (m := found.get(c.target_id)) is not None else c for c in f] for f in fleets]

    def one() -> object:
        count[0] += 1
        index.lookup(ch, gens)
        return pick(RouteReq(prompt_tokens, count[0]), priced[count[0] % 64], cfg).target_terms

    def with_reason() -> object:
        count[0] += 1
        index.lookup(ch, gens)
        d = pick(RouteReq(prompt_tokens, count[0]), priced[count[0] % 64], cfg)
        return d.target_terms, d.reason

    time_calls(one, 2000)
    decision = time_calls(one, rounds)
    reason = time_calls(with_reason, rounds)
    lookup = time_calls(lambda: index.lookup(ch, gens), rounds)
    hashing = time_calls(lambda: chain("m", messages, None, None), max(1000, rounds // 10))
    return {"cost+index": _summary(decision), "cost+index+reason": _summary(reason),
            "lookup": _summary(lookup), "chain": _summary(hashing), "decide": decide,
            "decide/1w": written}


class _Engine:
    """A vLLM engine's pages, answered in memory (a ``pharos.engine.fetch.Fetcher``)."""

    def __init__(self, running: int, kv: float) -> None:
        self.pages = {
            "/version": b'{"version":"0.32.0"}',
            "/v1/models": b'{"object":"list","data":[{"id":"m"}]}',
            "/metrics": (f'vllm:num_requests_running{{model_name="m"}} {running}\n'
                         'vllm:num_requests_waiting{model_name="m"} 0\n'
                         f'vllm:kv_cache_usage_perc{{model_name="m"}} {kv}\n'
                         'vllm:cache_config_info{block_size="16",engine="0",'
                         'num_gpu_blocks="4096"} 1.0\n').encode(),
        }

    def fetch(self, path: str) -> Any:
        from twisted.internet.defer import succeed

        from pharos.engine.fetch import Fetched

        page = self.pages.get(path)
        return succeed(Fetched(200, "application/json", page) if page is not None
                       else Fetched(404, "text/plain", b"not found"))


def _scheduler_decide(n: int, ch: Any, prompt_tokens: int, rounds: int,
                      rng: random.Random) -> dict[str, float]:
    """The scheduler's whole decision (``Scheduler.decide``, then the winner's terms) over
    ``n`` vLLM targets read from in-memory pages on a fake clock: candidates built from
    signals and stats, the index lookup, hot-prefix owners, eviction pricing, the pick."""
    one, stop = decide_fleet(n, ch, prompt_tokens, rng)
    time_calls(one, 1000)
    out = _summary(time_calls(one, max(1000, rounds // 4)))
    stop()
    return out


def _scheduler_decide_written(n: int, ch: Any, prompt_tokens: int, rounds: int,
                              rng: random.Random) -> dict[str, float]:
    """``decide`` with one target written before each decision (``decide_fleet``)."""
    one, stop = decide_fleet(n, ch, prompt_tokens, rng, written=1)
    time_calls(one, 1000)
    out = _summary(time_calls(one, max(1000, rounds // 4)))
    stop()
    return out


def decide_fleet(n: int, ch: Any, prompt_tokens: int, rng: random.Random, written: int = 0
                 ) -> tuple[Callable[[], object], Callable[[], None]]:
    """The ``decide`` row's fleet: one decision as a call (each with the next seed), and what
    stops the state's service. ``written``: targets written before each decision, in turn, as
    a dispatch or reply writes its target (the ``decide/1w`` row: the fleet rebuilds those)."""
    from twisted.internet.task import Clock

    from pharos.config import Backend
    from pharos.sched import RouteSettings, SchedRequest, Scheduler
    from pharos.state.state import State

    engines = {f"http://10.0.{i // 250}.{i % 250}:8000": _Engine(rng.randint(0, 16),
                                                                 round(rng.random(), 3))
               for i in range(n)}
    clock = Clock()
    state = State(clock, None, rng=lambda: 0.5, fetcher_for=lambda spec: engines[spec.url])
    sched = Scheduler(state, RouteSettings(PolicyConfig()))
    state.set_backends([Backend(url=url, kind="vllm", capacity=16) for url in engines])
    state.service.startService()
    clock.pump([1.0] * 6)  # a full round and load rounds: every signal known
    for t in state.targets[::4]:
        sched.index.record(ch.keys[: rng.randint(1, len(ch))], t.id, t.gen, clock.seconds())
    count = [0]
    targets = state.targets

    def one() -> object:
        count[0] += 1
        for k in range(written):
            t = targets[(count[0] * written + k) % n]
            t.queued_prefill = t.queued_prefill  # a write its candidate reads: a new stamp
        req = SchedRequest("m", prompt_tokens, count[0], chain=ch)
        return sched.decide(req, sched.targets(req)).decision.target_terms

    def stop() -> None:
        state.service.stopService()

    return one, stop


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    import os

    from pharos import compiled

    return {"python": platform.python_version(), "implementation":
            platform.python_implementation(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "processor": platform.processor() or None,
            # mypyc-compiled policy, chain links and wording, or why not (``pharos.compiled``)
            "policy": compiled.status.get("pharos.policy"),
            "linkhash": compiled.status.get("pharos.linkhash"),
            "reasons": compiled.status.get("pharos.reasons")}


def main_pick(argv: list[str]) -> int:
    """``pharos bench pick [--rounds N] [--json]``."""
    import argparse

    p = argparse.ArgumentParser(prog="pharos bench pick")
    p.add_argument("--candidates", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=8000)
    p.add_argument("--rounds", type=int, default=20000)
    p.add_argument("--only", choices=["decide"],
                   help="time only this row (the scheduler's whole decision)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.only == "decide":
        r = bench_decide(a.candidates, a.prompt_tokens, a.rounds)
    else:
        r = bench_pick(a.candidates, a.prompt_tokens, a.rounds)
    if a.json:
        print(json.dumps(r, indent=2))
    else:
        print(f"routing decision, {a.candidates} candidates, {a.prompt_tokens}-token prompt, "
              f"{a.rounds} rounds ({r['date']}, Python {r['machine']['python']}, "
              f"{r['machine']['cpus']} CPUs, policy {r['machine']['policy']})")
        for name in ("cost", "least-load", "cost+index", "cost+index+reason", "lookup", "chain",
                     "decide", "decide/1w"):
            if name in r:
                print(f"  {name:<17} p50 {r[name]['p50_us']:7.1f} us   p99 "
                      f"{r[name]['p99_us']:7.1f} us   min {r[name]['min_us']:7.1f} us")
    return 0
