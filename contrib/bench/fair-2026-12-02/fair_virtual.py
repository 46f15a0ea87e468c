"""Issue 11 item 4 in virtual time: the real ``pharos.sched.Scheduler`` (over a real ``State``)
in front of two in-memory vLLM-like engines of 8 sequences each, on a twisted ``Clock``.

Each engine runs a batch of at most 8 sequences; a step takes ``STEP`` seconds plus the prefill
of the sequences joining it (``Knobs.prefill_seconds``, the vLLM double's knobs); a sequence's
first token comes at the end of the step it joined (``Lease.first_byte``), then one a step.
Pharos is told ``capacity: 8`` so requests past 16 wait in its fair queue. TTFT = end of the
first step - arrival at Pharos. Arrivals are
Poisson per client on the client's own seed (same requests whatever the others send), W6-like:
200-600-token prompts, 20-60 output tokens.

  (a) light (1/11) and heavy (10/11) of 12 req/s, and light alone.
  (b) 100 keys of tenant a (10 req/s) against one key of tenant b (6 req/s), same weights.

Usage: PYTHONPATH=TREE python fair_virtual.py SEED [DURATION]  -> one JSON line.
No sockets, no real time: the same tree and seed give the same numbers on any machine load.
"""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from pharos.config import Backend as BackendSpec
from pharos.engine.fetch import Fetched
from pharos.policy import PolicyConfig
from pharos.sched import Lease, Routing, SchedRequest, Scheduler
from pharos.sim.batch import VLLM_KNOBS
from pharos.sim.model import Knobs
from pharos.state.state import State

MODEL = "m"
SLOTS = 8
STEP = 0.040
KNOBS = Knobs(prefill_s=float(VLLM_KNOBS["prefill_s"]),
              prefill_pair_s=float(VLLM_KNOBS["prefill_pair_s"]),
              prefill_fixed_s=float(VLLM_KNOBS["prefill_fixed_s"]), decode_s=STEP)
WARMUP = 5.0


@dataclass
class _Seq:
    lease: Lease
    left: int
    arrived: float
    client: str
    prompt: int
    first: bool = True
    joined: float | None = None  # when its first step started
    beside: int = 0  # prompts prefilled in the same step (its own included)
    job: Any = None  # its job in an engine model (``../fair-2026-12-07/fair_batch.py``)


@dataclass
class Engine:
    """An OpenAI-compatible engine with a batch of ``SLOTS`` sequences on the clock."""

    clock: Clock
    name: str
    running: list[_Seq] = field(default_factory=list)
    joining: list[_Seq] = field(default_factory=list)
    stepping: bool = False
    #: arrival, client, TTFT, prompt, arrival to its first step's start, prompts in that step
    ttfts: list[tuple[float, str, float, int, float, int]] = field(default_factory=list)

    def fetch(self, path: str) -> Deferred[Fetched]:
        if path == "/v1/models":
            return succeed(Fetched(200, "application/json", b'{"data":[{"id":"m"}]}'))
        return succeed(Fetched(404, "text/plain", b"not found"))

    def add(self, s: _Seq) -> None:
        self.joining.append(s)
        if not self.stepping:
            self._step()

    def cut(self, s: _Seq) -> bool:
        """The client left: the sequence leaves its batch (whether it was in one)."""
        for q in (self.running, self.joining):
            if s in q:
                q.remove(s)
                return True
        return False

    def _step(self) -> None:
        room = SLOTS - len(self.running)
        new, self.joining = self.joining[:room], self.joining[room:]
        self.running += new
        if not self.running:
            self.stepping = False
            return
        self.stepping = True
        dur = STEP + sum(KNOBS.prefill_seconds(s.prompt, 0) for s in new)
        for s in new:
            s.joined, s.beside = self.clock.seconds(), len(new)
        self.clock.callLater(dur, self._done_step)

    def _done_step(self) -> None:
        now = self.clock.seconds()
        keep = []
        for s in self.running:
            if s.first:
                s.first = False
                s.lease.first_byte()
                assert s.joined is not None
                self.ttfts.append((s.arrived, s.client, now - s.arrived, s.prompt,
                                   s.joined - s.arrived, s.beside))
            s.left -= 1
            if s.left > 0:
                keep.append(s)
            else:
                s.lease.release()
        self.running = keep
        self._step()


def arrivals(seed: int, name: str, rate: float, duration: float
             ) -> list[tuple[float, int, int]]:
    rng = random.Random(f"{seed}-{name}")
    t, out = 0.0, list[tuple[float, int, int]]()
    if rate <= 0:
        return out
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return out
        out.append((t, rng.randint(200, 600), rng.randint(20, 60)))


def run(seed: int, clients: list[dict[str, Any]], duration: float, *, timeout: float = 0.0,
        engine: Callable[[Clock, str], Any] = Engine, stream: bool = False, tick: float = 0.01
        ) -> dict[str, Any]:
    """One run; ``timeout``: each request is cut that long after it arrived (0: never), as
    the real-time bench's clients do; ``engine``: the engine model; ``stream``: the requests
    say they are streamed (a tree that knows ``SchedRequest.stream``)."""
    clock = Clock()
    engines = {f"http://e{i}:8000": engine(clock, f"e{i}") for i in range(2)}
    state = State(clock, None, rng=lambda: 0.5, fetcher_for=lambda spec: engines[spec.url])
    seeds = iter(range(1, 1 << 30))
    sched = Scheduler(state, Routing(PolicyConfig()), seed=lambda: next(seeds))
    state.on_round = lambda b: sched.kick()
    state.set_backends([BackendSpec(url=u, kind="openai", capacity=SLOTS) for u in engines])
    state.service.startService()
    clock.advance(0.6)
    start = clock.seconds()
    served: dict[str, list[int]] = {}
    costs: dict[str, list[float]] = {}  # the fair queue's cost: output limit + prompt / 10
    waited: dict[str, list[float]] = {}  # arrival to grant, s (the wait in Pharos's queue)

    live: dict[tuple[str, int], Any] = {}  # a request's grant, then its engine and sequence
    cuts = [0]

    def cut(c: str, i: int) -> None:
        x = live.pop((c, i), None)
        if isinstance(x, Deferred):
            x.cancel()  # still queued: it leaves the queue
        elif x is not None and x[0].cut(x[1]):
            cuts[0] += 1
            x[1].lease.release()

    def granted(lease: Lease, c: str, at: float, prompt: int, out: int, i: int) -> None:
        e = engines[lease.target.backend.url]
        now = clock.seconds() - start
        if WARMUP <= now <= duration:  # shares while both send, not while the backlog drains
            served.setdefault(c, []).append(prompt + out)
            costs.setdefault(c, []).append(out + prompt / 10)
        if at - start >= WARMUP:
            waited.setdefault(c, []).append(clock.seconds() - at)
        sq = _Seq(lease, out, at, c, prompt)
        if (c, i) in live:
            live[(c, i)] = (e, sq)
        e.add(sq)

    def arrive(c: dict[str, Any], i: int, prompt: int, out: int) -> None:
        at = clock.seconds()
        n = c.get("count", 1)
        key = c["name"] if n == 1 else f"{c['name']}{i % n}"
        sr = SchedRequest(MODEL, prompt, i, output_tokens=out)
        if stream:
            sr = dataclasses.replace(sr, stream=True)
        d = sched.acquire(key, 1, sr, tenant=c.get("tenant", "default"))
        if timeout:
            live[(c["name"], i)] = d
            clock.callLater(timeout, cut, c["name"], i)
        d.addCallback(granted, c["name"], at, prompt, out, i)
        d.addErrback(lambda f: None)

    for c in clients:
        for i, (t, p, o) in enumerate(arrivals(seed, c["name"], c["rate"], duration)):
            clock.callLater(t, arrive, c, i, p, o)
    while clock.seconds() - start < duration + 60:
        clock.advance(tick)
    state.service.stopService()
    res: dict[str, Any] = {"cuts": cuts[0]} if timeout else {}
    for c in clients:
        rows = sorted((x for e in engines.values() for x in e.ttfts
                       if x[1] == c["name"] and x[0] - start >= WARMUP), key=lambda x: x[2])
        tt = [x[2] for x in rows]
        if not tt:
            continue
        res[c["name"]] = {
            "n": len(tt), "p50": tt[len(tt) // 2], "p95": tt[min(len(tt) - 1, int(0.95 * len(tt)))],
            "max": tt[-1], "served_tokens": sum(served.get(c["name"], [])),
            "served_cost": sum(costs.get(c["name"], [])),
            "queued": sum(1 for w in waited.get(c["name"], []) if w > 0),
            "max_queue_wait": max(waited.get(c["name"], [0.0])),
            # the slowest 5 %: TTFT, wait for a step to start (Pharos's queue + the step in
            # progress), prompts prefilled in its first step
            "tail": [(round(x[2], 3), round(x[4], 3), x[5]) for x in rows[int(0.95 * len(rows)):]]}
    return res


def main() -> None:
    seed = int(sys.argv[1])
    duration = float(sys.argv[2]) if len(sys.argv) > 2 else 120.0
    light, heavy = 12 / 11, 120 / 11
    import pharos
    out: dict[str, Any] = {"seed": seed, "duration": duration, "tree": subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
        cwd=pharos.__path__[0]).stdout.strip()}
    out["alone"] = run(seed, [{"name": "light", "rate": light}], duration)
    out["fair"] = run(seed, [{"name": "light", "rate": light},
                             {"name": "heavy", "rate": heavy}], duration)
    out["tenants"] = run(seed, [{"name": "a", "rate": 10.0, "count": 100, "tenant": "a"},
                                {"name": "b", "rate": 6.0, "tenant": "b"}], duration)
    a, f = out["alone"]["light"]["p95"], out["fair"]["light"]["p95"]
    out["ratio"] = f / a
    ta, tb = out["tenants"]["a"]["served_tokens"], out["tenants"]["b"]["served_tokens"]
    out["b_share"] = tb / (ta + tb)
    ca, cb = out["tenants"]["a"]["served_cost"], out["tenants"]["b"]["served_cost"]
    out["b_cost_share"] = cb / (ca + cb)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
