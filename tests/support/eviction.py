"""A three-backend fleet and prompts for the eviction-pricing tests."""

from __future__ import annotations

from twisted.internet.task import Clock

from pharos.config import Backend as BackendSpec
from pharos.sched import Lease, SchedRequest, Scheduler
from pharos.state.state import State
from tests.support.cache_routing import chat
from tests.support.sched import fleet, granted, llamacpp


def three() -> tuple[Scheduler, State, Clock]:
    return fleet({f"http://{h}:1": (llamacpp(slots=4), BackendSpec(url=f"http://{h}:1",
                                                                   kind="llamacpp"))
                  for h in "abc"})


def system(n: int) -> str:
    return f"System prompt number {n}. " + "Answer with care. " * 120  # ~550 tokens


def on(sched: Scheduler, target: int, req: SchedRequest) -> Lease:
    """Grant ``req`` on ``target`` (the others excluded)."""
    others = frozenset(t.id for t in sched.state.targets if t.id != target)
    lease = granted(sched.acquire("k", 1, SchedRequest(
        req.model, req.prompt_tokens, req.seed, exclude=others, chain=req.chain)))
    assert lease.target.id == target
    return lease


def root_tokens(n: int) -> int:
    return chat("q", system=system(n)).chain.ends[0] // 4
