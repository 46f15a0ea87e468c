"""Chat requests and lease outcomes for the cache-routing tests."""

from __future__ import annotations

from pharos.prefix import chain
from pharos.sched import Lease, SchedRequest
from pharos.state.stats import Sample

SYSTEM = "You are a careful assistant. " * 400  # ~11 kB: ~2,800 estimated tokens


def chat(question: str, system: str = SYSTEM, seed: int = 1, session: int | None = None
         ) -> SchedRequest:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    ch = chain("m", messages, None, None)
    tokens = (len(system) + len(question)) // 4
    return SchedRequest("m", tokens, seed, chain=ch, session=session)


def ok(lease: Lease, cached: int | None, prompt: int = 100) -> None:
    lease.release(Sample(ok=True, dispatched_cold=False, ttft_sec=0.1, duration_sec=1.0,
                         prompt_tokens=prompt, cached_tokens=cached))
