"""Issue 10 item 4 in virtual time: ``mix`` and ``w6`` at light load, ``cost`` against
``least-load``, the same requests at the same times on fresh engines per policy.

What runs is ``pharos bench compare``'s light-load set-up (``../light-2026-12-02/run.sh``)
without sockets or real time: three vLLM-like engines (``pharos.sim.double.EngineDouble``'s
``BatchModel``: 64 sequences, 600 KV blocks of 16 tokens, the vLLM double's timing), their
status pages rendered by the double's own flavor, and Pharos's real ``State`` (scrape rounds,
capacity learning) and ``Scheduler`` (policy, prefix index, retention, KV headroom) on one
``twisted.internet.task.Clock``. Each request of the workload is parsed as the proxy parses it
(``pharos.proxy.parse``: the prompt estimate and prefix chain), asks the scheduler for a lease,
is submitted to the leased engine's model, tells the lease its first byte at its first token
and is released at its end with the sample the proxy builds from the reply (TTFT and duration
from the grant, the engine's prompt and cached tokens, the prefill window; vLLM reports no
prefill time). TTFT is from arrival to first token: Pharos's own CPU and the relay cost
nothing here, so the figures are the decisions' and the engines', and the same tree and seed
give the same numbers on any machine load.

Per run it keeps every request's trace: arrival, tag (``mix/w1``, ``mix/w6``, ``w6``), the
target it went to (``engine``: Pharos's target id, as in the candidates), TTFT, time queued in
Pharos, prompt and cached tokens, and the decision's candidates (estimate, wait, prefill,
eviction price, utilization, learned prefill speed, free slots, KV room) as the scheduler saw
them; and every 5 s each target's learned prefill speed, service time and capacity.

``shared-serial`` and ``shared-burst`` (added 2026-12-07, issue 10 item 2) are
``../shared-prefix.sh``'s set-up instead: w1 at 20 req/s for 40 s (15 s of warm-up), eight
500-token system prompts, 10-40-token questions, 10-30-token replies, 250-block pools (about
half the prompts fit once running requests have their blocks), KV usage as vLLM counts it,
capacity not told (learned), the traffic starting one request at a time or all at once; run
them with ``--policies prefix-aware,cost`` and ``table --base prefix-aware``.

Usage (from a checkout, or with PYTHONPATH=TREE):
  python lightload_virtual.py run --seeds 1-10 --out results/      # one JSON per run
  python lightload_virtual.py table results/                         # the per-seed table
  python lightload_virtual.py diff results/ mix 2                    # cost's slowest requests
  python lightload_virtual.py run --variants 8 ... ; vtable results/  # each seed's loss: the
                                     # requests' (most variants lose) or one draw's (few do)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from pharos.bench.openloop import assign
from pharos.config import Backend as BackendSpec
from pharos.engine.fetch import Fetched
from pharos.policy import PolicyConfig
from pharos.proxy.parse import parse
from pharos.sched import Lease, Placement, Routing, SchedRequest, Scheduler
from pharos.sim.double import EngineDouble
from pharos.sim.model import GenRequest, Job
from pharos.sim.prompt import CHAT, prompt_text
from pharos.sim.workloads import Request, generate
from pharos.state.state import State
from pharos.state.stats import Sample

ENGINES = 3
SLOTS = 64  # --max-num-seqs=64, and Pharos told capacity: 64
BLOCKS = 600  # --num-gpu-blocks-override=600
BLOCK_TOKENS = 16
RATE = 3.0
DURATION = 60.0
WARMUP = 20.0
#: The workloads' arguments, as ``../light-2026-12-02/run.sh`` gives them.
WORKLOADS: dict[str, dict[str, Any]] = {
    "mix": {"prompt_tokens": (2000, 2000), "unique_tokens": (1000, 3000)},
    "w6": {"prompt_tokens": (1000, 3000)},
}
#: ``../shared-prefix.sh``'s runs: name -> (workload, its arguments, start).
_SHARED_ARGS: dict[str, Any] = {"prompt_tokens": (500, 500), "question_tokens": (10, 40),
                                "output_tokens": (10, 30)}
SHARED: dict[str, tuple[str, dict[str, Any], str]] = {
    "shared-serial": ("w1", _SHARED_ARGS, "serial"),
    "shared-burst": ("w1", _SHARED_ARGS, "burst"),
}
#: Per set: (rate, duration, warm-up, KV blocks, capacity told, KV usage counted as).
SETTINGS: dict[str, tuple[float, float, float, int, bool, str | None]] = {
    "shared-serial": (20.0, 40.0, 15.0, 250, False, "running"),
    "shared-burst": (20.0, 40.0, 15.0, 250, False, "running"),
}
POLICIES = ("least-load", "cost")
SAMPLE_SEC = 5.0
#: Virtual seconds after the last arrival for the last replies.
DRAIN_SEC = 120.0


def pct(values: Sequence[float], p: float) -> float | None:
    """Nearest rank, as ``pharos.bench.summary.percentile``."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(len(s) * p / 100) - 1))]


class _Engine:
    """A vLLM double without sockets: its model, its status pages from its flavor."""

    def __init__(self, url: str, clock: Clock, seed: int, blocks: int = BLOCKS,
                 kv_usage: str | None = None) -> None:
        self.url = url
        extra: dict[str, Any] = {} if kv_usage is None else {"kv_usage_counts": kv_usage}
        self.double = EngineDouble("vllm", clock, slots=SLOTS, seed=seed,
                                   cache_tokens=blocks * BLOCK_TOKENS, **extra)

    def fetch(self, path: str) -> Deferred[Fetched]:
        rec = self.double.flavor.get(path, self.double.model.status())
        return succeed(Fetched(rec.status, rec.content_type, rec.body))


class _Listener:
    def __init__(self, on_first: Any, on_done: Any) -> None:
        self.on_first, self.on_done, self.first = on_first, on_done, False

    def token(self, job: Job, index: int, text: str, last: bool) -> None:
        if not self.first:
            self.first = True
            self.on_first(job)

    def done(self, job: Job) -> None:
        self.on_done(job)


def _candidates(placed: Placement) -> list[list[Any]]:
    """Per candidate: engine, est_ttft, wait, prefill, evict, utilization, learned prefill
    s/token (None: unknown), matched tokens, free slots, KV room (None: unknown), capacity,
    queued prefill s."""
    out = []
    for c, t in zip(placed.candidates, placed.decision.score_terms, strict=True):
        out.append([c.target_id, _r(t[1]), _r(t[2]), _r(t[4]), _r(t[9]), _r(t[6]),
                    None if c.prefill_sec_per_token is None else round(c.prefill_sec_per_token
                                                                       * 1e6, 1),
                    c.matched_tokens, c.free_slots, c.kv_free_tokens, c.capacity,
                    _r(c.queued_prefill_sec)])
    return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def run_one(workload: str, seed: int, policy: str, *, rate: float = RATE,
            duration: float = DURATION, warmup: float = WARMUP, variant: int = 0
            ) -> dict[str, Any]:
    """One run of ``policy`` on fresh engines with ``workload``'s requests of ``seed`` (a
    ``SHARED`` name: its own rate, duration, pools and start)."""
    clock = Clock()
    blocks, told, kv_usage = BLOCKS, True, None
    if workload in SHARED:
        kind, args, start_mode = SHARED[workload]
        rate, duration, warmup, blocks, told, kv_usage = SETTINGS[workload]
        reqs: list[Request] = generate(kind, seed, rate, duration, start=start_mode, **args)
    else:
        reqs = generate(workload, seed, rate, duration, **WORKLOADS[workload])
    engines = [_Engine(f"http://e{i}:8000", clock, seed * 100 + i, blocks, kv_usage)
               for i in range(ENGINES)]
    by_url = {e.url: e for e in engines}
    # The same draws for every policy. A ``variant`` other than 0 draws the router's own
    # random numbers (ties, jitter) from other streams: the same requests at the same times
    # on the same engines, another run of the decisions (``vtable``).
    tail = f":{variant}" if variant else ""
    rng = random.Random(f"lightload:{seed}{tail}")
    state = State(clock, None, rng=rng.random, fetcher_for=lambda spec: by_url[spec.url])
    seeds = random.Random(f"lightload-seeds:{seed}{tail}")
    req_seeds = [seeds.getrandbits(63) for _ in reqs]
    # ``prefix-aware`` is the harness's own dispatch (production-stack's router, chosen in
    # send order before the run, as ``pharos bench compare`` does): no lease, no Pharos.
    direct = (assign([e.url for e in engines], reqs, "prefix-aware", seed)
              if policy == "prefix-aware" else None)
    sched = Scheduler(state, Routing(PolicyConfig(name="cost" if direct else policy)),  # type: ignore[arg-type]
                      seed=lambda: rng.getrandbits(63))

    def on_round(b: Any) -> None:  # as PharosService._round
        sched.learn_capacity(b)
        sched.kick()

    state.on_round = on_round
    state.set_backends([BackendSpec(url=e.url, kind="vllm", capacity=SLOTS if told else None)
                        for e in engines])
    state.service.startService()
    clock.advance(1.0)  # the first round: the model is known
    clock.advance(1.0)
    start = clock.seconds()
    recs: list[dict[str, Any]] = [{} for _ in reqs]
    by_seed: dict[int, int] = {}

    def routed(req: SchedRequest, placed: Placement) -> None:
        i = by_seed.get(req.seed)
        if i is not None:
            recs[i]["cands"] = _candidates(placed)
            recs[i]["why"] = placed.decision.why

    sched.on_route = routed

    def arrive(i: int) -> None:
        r = reqs[i]
        body = r.body()
        raw = json.dumps(body).encode()
        parsed = parse(raw, CHAT)
        rec = recs[i]
        rec.update(i=i, at=round(r.at, 4), tag=r.tag or workload, est_tokens=parsed.prompt_tokens)
        by_seed[req_seeds[i]] = i
        sreq = SchedRequest(parsed.model, parsed.prompt_tokens, req_seeds[i], chain=parsed.chain,
                            output_tokens=parsed.max_tokens)
        arrived = clock.seconds()
        if direct is not None:
            url = direct[i]
            rec.update(engine=[e.url for e in engines].index(url), queued=0.0)

            def first_direct(job: Job) -> None:
                rec["ttft"] = round(clock.seconds() - arrived, 4)

            def done_direct(job: Job) -> None:
                rec.update(prompt=job.prompt_tokens, cached=job.cached_tokens,
                           end=round(clock.seconds() - start, 4), out=job.tokens_done)

            by_url[url].double.model.submit(GenRequest(parsed.model, prompt_text(CHAT, body),
                                                       r.max_tokens),
                                            _Listener(first_direct, done_direct))
            return
        d = sched.acquire("bench", 1, sreq)

        def granted(lease: Lease) -> None:
            granted_at = clock.seconds()
            e = by_url[lease.target.backend.spec.url]
            rec.update(engine=lease.target.id, queued=_r(granted_at - arrived),
                       est=_r(lease.est_ttft), waited=lease.waited)

            def first(job: Job) -> None:
                rec["ttft"] = round(clock.seconds() - arrived, 4)
                lease.first_byte()

            def done(job: Job) -> None:
                now = clock.seconds()
                rec.update(prompt=job.prompt_tokens, cached=job.cached_tokens,
                           end=round(now - start, 4), out=job.tokens_done)
                lease.release(Sample(
                    ok=True, dispatched_cold=lease.cold,
                    ttft_sec=(job.first_token_at if job.first_token_at is not None else now)
                    - granted_at,
                    duration_sec=now - granted_at, prompt_tokens=job.prompt_tokens,
                    cached_tokens=job.cached_tokens, prompt_eval_sec=None, load_sec=None,
                    prefill_window_sec=lease.prefill_window_sec))

            e.double.model.submit(GenRequest(parsed.model, prompt_text(CHAT, body),
                                             r.max_tokens), _Listener(first, done))

        d.addCallback(granted)
        d.addErrback(lambda f: rec.update(error=f.getErrorMessage()))

    for i, r in enumerate(reqs):
        clock.callLater(r.at, arrive, i)
    learned: list[list[Any]] = []

    def sample() -> None:
        row: list[Any] = [round(clock.seconds() - start, 1)]
        for t in state.targets:
            v = t.stats.prefill_sec_per_token.value
            s = t.stats.service_sec.value
            row.append([None if v is None else round(v * 1e6, 1),
                        None if s is None else round(s, 3), t.learned_capacity])
        learned.append(row)
        clock.callLater(SAMPLE_SEC, sample)

    sample()
    end = start + (reqs[-1].at if reqs else 0.0) + DRAIN_SEC
    while clock.calls and clock.seconds() < end:
        if all(("ttft" in r and "prompt" in r) or "error" in r for r in recs):
            break
        clock.advance(max(0.0, clock.calls[0].getTime() - clock.seconds()))
    state.service.stopService()
    for e in engines:
        e.double.model.stop()
    counted = [r for r in recs if r.get("at", 0.0) >= warmup and "ttft" in r]
    tt = [r["ttft"] for r in counted]
    prompt = sum(r.get("prompt", 0) for r in counted)
    cached = sum(r.get("cached", 0) for r in counted)
    per_engine = [sum(1 for r in recs if r.get("engine") == k) for k in range(ENGINES)]
    return {
        "workload": workload, "seed": seed, "policy": policy, "variant": variant, "rate": rate,
        "duration": duration, "warmup": warmup, "requests": len(reqs), "counted": len(tt),
        "unserved": sum(1 for r in recs if "ttft" not in r),
        "p50": pct(tt, 50), "p90": pct(tt, 90), "p99": pct(tt, 99), "max": max(tt, default=None),
        "hit_rate": round(cached / prompt, 4) if prompt else None,
        "per_engine": per_engine, "queued_in_pharos": sum(1 for r in counted if r["queued"] > 0),
        "learned": learned, "records": recs,
    }


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def _tree() -> str:
    import pharos

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True,
                              cwd=pharos.__path__[0]).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain",
                                                                 "--", ".") else "")


def main_run(a: argparse.Namespace) -> None:
    a.out.mkdir(parents=True, exist_ok=True)
    tree = _tree()
    for w in a.workloads.split(","):
        for seed in _seeds(a.seeds):
            for policy, variant in ((p, v) for v in range(a.variants)
                                    for p in a.policies.split(",")):
                res = run_one(w, seed, policy, rate=a.rate, variant=variant)
                res["tree"] = tree
                path = a.out / (f"{w}-{policy}-seed{seed}.json" if not variant
                                else f"{w}-{policy}-seed{seed}-v{variant}.json")
                path.write_text(json.dumps(res, separators=(",", ":")) + "\n")
                print(f"{w} seed {seed} {policy}: p50 {res['p50'] * 1000:.0f} ms, p99 "
                      f"{res['p99'] * 1000:.0f} ms, hit {res['hit_rate']}, per engine "
                      f"{res['per_engine']}, unserved {res['unserved']}", flush=True)


def _load(d: Path, variants: bool = False) -> dict[Any, dict[str, Any]]:
    """Runs by (workload, policy, seed), variant 0 only; by (..., variant) with ``variants``."""
    out: dict[Any, dict[str, Any]] = {}
    for p in sorted(d.glob("*.json")):
        r = json.loads(p.read_text())
        v = r.get("variant", 0)
        if variants:
            out[(r["workload"], r["policy"], r["seed"], v)] = r
        elif not v:
            out[(r["workload"], r["policy"], r["seed"])] = r
    return out


def main_vtable(a: argparse.Namespace) -> None:
    """Per seed, cost's p99 against the base policy's over every variant of the run: whether
    a seed's loss is the request sequence's (cost loses on most variants) or one run's draw
    (it loses on few)."""
    runs = _load(a.dir, variants=True)
    b = a.base
    print(f"| workload | seed | variants | {b} p99 (mean) | cost p99 (mean) | "
          f"cost - {b} (mean) | variants cost loses |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for w in sorted({k[0] for k in runs}):
        seeds = sorted({k[2] for k in runs if k[0] == w})
        diffs: list[float] = []
        for s in seeds:
            vs = sorted(k[3] for k in runs if k[0] == w and k[1] == "cost" and k[2] == s
                        and (w, b, s, k[3]) in runs)
            if not vs:
                continue
            base = [runs[(w, b, s, v)]["p99"] for v in vs]
            cost = [runs[(w, "cost", s, v)]["p99"] for v in vs]
            d = [c - x for c, x in zip(cost, base, strict=True)]
            diffs.append(sum(d) / len(d))
            print(f"| {w} | {s} | {len(vs)} | {_ms(sum(base) / len(vs))} | "
                  f"{_ms(sum(cost) / len(vs))} | {sum(d) / len(d) * 1000:+.0f} | "
                  f"{sum(1 for x in d if x > 0)} of {len(vs)} |")
        print(f"| {w} | seeds whose mean loses | | | | "
              f"{sum(1 for x in diffs if x > 0)} of {len(diffs)} | |")


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def main_table(a: argparse.Namespace) -> None:
    runs = _load(a.dir)
    b = a.base
    print(f"| workload | seed | {b} p50 | cost p50 | {b} p99 | cost p99 | "
          f"cost - {b} p99 | hit rate {b} / cost | per engine {b} | per engine cost |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|---|")
    for w in sorted({k[0] for k in runs}):
        seeds = sorted({k[2] for k in runs if k[0] == w})
        losses = 0
        for s in seeds:
            ll, c = runs.get((w, b, s)), runs.get((w, "cost", s))
            if ll is None or c is None:
                continue
            d = c["p99"] - ll["p99"]
            losses += d > 0
            print(f"| {w} | {s} | {_ms(ll['p50'])} | {_ms(c['p50'])} | {_ms(ll['p99'])} | "
                  f"{_ms(c['p99'])} | {'+' if d > 0 else ''}{d * 1000:.0f} | "
                  f"{ll['hit_rate']} / {c['hit_rate']} | "
                  f"{'/'.join(map(str, ll['per_engine']))} | "
                  f"{'/'.join(map(str, c['per_engine']))} |")
        print(f"| {w} | losses | | | | | {losses} of {len(seeds)} | | | |")


def main_diff(a: argparse.Namespace) -> None:
    """Cost's slowest counted requests of one seed beside the base policy's run of them."""
    runs = _load(a.dir)
    c, ll = runs[(a.workload, "cost", a.seed)], runs[(a.workload, a.base, a.seed)]
    print(f"{a.workload} seed {a.seed}: cost p99 {_ms(c['p99'])} ms, {a.base} "
          f"{_ms(ll['p99'])} ms")
    for name, run, other in (("cost", c, ll), (a.base, ll, c)):
        rows = sorted((r for r in run["records"] if r["at"] >= run["warmup"] and "ttft" in r),
                      key=lambda r: -r["ttft"])[: a.n]
        print(f"-- {name}'s slowest {a.n}")
        for r in rows:
            o = other["records"][r["i"]]
            print(f"  #{r['i']} at {r['at']:.2f} {r['tag']} prompt {r.get('prompt')} cached "
                  f"{r.get('cached')}: engine {r['engine']} ttft {_ms(r['ttft'])} ms (est "
                  f"{_ms(r.get('est'))}, queued {_ms(r['queued'])}); other: engine "
                  f"{o.get('engine')} "
                  f"ttft {_ms(o.get('ttft'))} ms")
            for cand in r.get("cands", []):
                print(f"      cand {cand}")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="lightload_virtual.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--workloads", default="mix,w6")
    r.add_argument("--seeds", default="1-5")
    r.add_argument("--policies", default=",".join(POLICIES))
    r.add_argument("--rate", type=float, default=RATE)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--variants", type=int, default=1,
                   help="runs per seed and policy, each drawing the router's random numbers "
                        "from another stream (variant 0: the usual run)")
    t = sub.add_parser("table")
    t.add_argument("dir", type=Path)
    t.add_argument("--base", default="least-load", help="the policy cost is set against")
    v = sub.add_parser("vtable")
    v.add_argument("dir", type=Path)
    v.add_argument("--base", default="least-load")
    d = sub.add_parser("diff")
    d.add_argument("dir", type=Path)
    d.add_argument("workload")
    d.add_argument("seed", type=int)
    d.add_argument("-n", type=int, default=5)
    d.add_argument("--base", default="least-load")
    a = p.parse_args(argv)
    {"run": main_run, "table": main_table, "vtable": main_vtable, "diff": main_diff}[a.cmd](a)


if __name__ == "__main__":
    main(sys.argv[1:])
