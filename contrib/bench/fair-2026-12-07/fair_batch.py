"""Issue 11 item 4 in virtual time, on the vLLM double's own engine model: the real
``pharos.sched.Scheduler`` (over a real ``State``) in front of two ``pharos.sim.batch.BatchModel``
engines of 8 sequences (40 ms decode steps, the double's prefill knobs, its 2,048-token step
budget, chunked prefill, decode cost per sequence), on a twisted ``Clock`` advanced 1 ms at a
time: ``../fair-2026-12-02/fair_virtual.py``'s runs (same arrivals, same Pharos) with this
engine in place of its own. Its own engine (every joining prompt prefilled whole in one step,
no budget, no per-sequence cost, 10 ms ticks) gave the light key's ratio 1.0-1.3 where the
doubles gave 1.4-1.5 in real time; this one gives what they give, so a change can be tried
here first.

Every request is streamed (``SchedRequest.stream``), its first token at the end of the step
that completes its prompt (``Lease.first_byte``). ``--timeout S`` cuts each request S s after
it arrived, as the bench's clients do (queued: it leaves the queue; at the engine: cancelled).

A finished request gives its target a sample, as the proxy does (``--no-learn``: none, so
the targets never learn their service time, as the runs before 2026-12-07 17:30 had it).

Usage: PYTHONPATH=TREE python fair_batch.py SEED [DURATION] [--timeout S] [--no-tenants]
[--no-learn]
-> one JSON line (``fair_virtual.py``'s, with ``timeout``). No sockets, no real time: the same
tree and seed give the same numbers on any machine load.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from pharos.engine.fetch import Fetched
from pharos.sim.batch import VLLM_KNOBS, BatchModel
from pharos.sim.model import GenRequest, Job
from pharos.state.stats import Sample

#: Whether finished requests teach their target (``--no-learn``: not, as before 2026-12-07
#: 17:30, when every target's service time stayed unknown).
LEARN = True


def _load_fair_virtual() -> Any:
    path = Path(__file__).resolve().parent.parent / "fair-2026-12-02" / "fair_virtual.py"
    spec = importlib.util.spec_from_file_location("fair_virtual", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fair_virtual"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


fv = _load_fair_virtual()
_PROMPTS = random.Random(7)  # distinct prompts: no prefix is shared, as in W6


class _Listener:
    """Hears a sequence's tokens: its first byte, its end."""

    def __init__(self, eng: Engine, s: Any) -> None:
        self.eng, self.s = eng, s

    def token(self, job: Job, index: int, text: str, last: bool) -> None:
        if index == 0:
            s = self.s
            s.lease.first_byte()
            now = self.eng.clock.seconds()
            admitted = job.admitted_at if job.admitted_at is not None else now
            self.eng.ttfts.append((s.arrived, s.client, now - s.arrived, s.prompt,
                                   admitted - s.arrived, 0))

    def done(self, job: Job) -> None:
        lease = self.s.lease
        if not LEARN:
            lease.release()
            return
        # What the proxy gives back at a request's end, from which the target learns its
        # service time (which sizes the fair queue's room) and its prefill speed.
        now = self.eng.clock.seconds()
        granted = lease.granted_at if lease.granted_at is not None else now
        first = job.first_token_at if job.first_token_at is not None else now
        lease.release(Sample(ok=True, dispatched_cold=False, ttft_sec=first - granted,
                             duration_sec=now - granted, prompt_tokens=self.s.prompt,
                             cached_tokens=0, prefill_window_sec=lease.prefill_window_sec))


class Engine:
    """The vLLM double's own engine model on the clock, with ``fair_virtual.Engine``'s face."""

    def __init__(self, clock: Clock, name: str) -> None:
        self.clock, self.name = clock, name
        knobs = dataclasses.replace(fv.KNOBS, decode_seq_s=float(VLLM_KNOBS["decode_seq_s"]),
                                    block_tokens=int(VLLM_KNOBS["block_tokens"]),
                                    cache_tokens=int(VLLM_KNOBS["cache_tokens"]),
                                    batch_tokens=int(VLLM_KNOBS["batch_tokens"]))
        self.model = BatchModel(clock, {fv.MODEL: 1}, slots=fv.SLOTS, knobs=knobs)
        #: arrival, client, TTFT, prompt, arrival to its admission, 0
        self.ttfts: list[tuple[float, str, float, int, float, int]] = []

    def fetch(self, path: str) -> Deferred[Fetched]:
        if path == "/v1/models":
            return succeed(Fetched(200, "application/json", b'{"data":[{"id":"m"}]}'))
        return succeed(Fetched(404, "text/plain", b"not found"))

    def add(self, s: Any) -> None:
        prompt = _PROMPTS.randbytes(2 * s.prompt).hex().encode()  # 4 bytes a token
        s.job = self.model.submit(GenRequest(fv.MODEL, prompt, max_tokens=s.left),
                                  _Listener(self, s))

    def cut(self, s: Any) -> bool:
        if s.job is None or s.job.state in ("done", "cancelled"):
            return False
        self.model.cancel(s.job)
        return True


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("seed", type=int)
    ap.add_argument("duration", type=float, nargs="?", default=120.0)
    ap.add_argument("--timeout", type=float, default=0.0,
                    help="cut each request this many seconds after it arrived (0: never)")
    ap.add_argument("--no-tenants", action="store_true", help="skip run (b)")
    ap.add_argument("--no-learn", action="store_true",
                    help="release leases with no sample: targets learn no service time")
    args = ap.parse_args()
    global LEARN
    LEARN = not args.no_learn
    seed, duration = args.seed, args.duration
    import pharos

    def run(clients: list[dict[str, Any]]) -> dict[str, Any]:
        return dict(fv.run(seed, clients, duration, timeout=args.timeout, engine=Engine,
                           stream=True, tick=0.001))

    light, heavy = 12 / 11, 120 / 11
    out: dict[str, Any] = {"seed": seed, "duration": duration, "timeout": args.timeout,
                           "tree": subprocess.run(
                               ["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                               text=True, cwd=pharos.__path__[0]).stdout.strip()}
    out["alone"] = run([{"name": "light", "rate": light}])
    out["fair"] = run([{"name": "light", "rate": light}, {"name": "heavy", "rate": heavy}])
    out["ratio"] = out["fair"]["light"]["p95"] / out["alone"]["light"]["p95"]
    if not args.no_tenants:
        out["tenants"] = t = run([{"name": "a", "rate": 10.0, "count": 100, "tenant": "a"},
                                  {"name": "b", "rate": 6.0, "tenant": "b"}])
        ta, tb = t["a"]["served_tokens"], t["b"]["served_tokens"]
        out["b_share"] = tb / (ta + tb)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
