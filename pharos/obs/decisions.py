"""The decision log: one JSON line per routing decision of a sampled request, with every
candidate's signals and cost terms, the guard that set one aside, the winner, the reason and
the estimated TTFT; and at the end one line of what happened, joined by ``request_id``.

Sampling hashes the request id against ``sample_rate``, so every attempt of a sampled request
is logged and none of an unsampled one. Lines go through ``Journal``: built on the reactor
thread for sampled requests only, handed to a writer thread in batches through a bounded
buffer that drops and counts when the disk falls behind. No prompt text.
"""

from __future__ import annotations

import hashlib
from typing import Any

from twisted.internet.interfaces import IReactorFromThreads

from pharos.journal import Journal
from pharos.proxy.done import Done
from pharos.sched import Lease
from pharos.state.state import State

#: Candidates written per decision (a fleet of more writes the first ones and says so).
MAX_CANDIDATES = 256


class DecisionLog:
    """Writes sampled decisions to ``path``."""

    def __init__(self, path: str, sample_rate: float, reactor: IReactorFromThreads,
                 state: State, policy: str) -> None:
        self.journal = Journal(path, reactor, name="decision log")
        self.sample_rate = sample_rate
        self.state = state
        self.policy = policy
        self._limit = int(sample_rate * 2**64)

    def sampled(self, request_id: str) -> bool:
        """Whether this request's decisions are logged (the same answer for every attempt)."""
        if self.sample_rate >= 1.0:
            return True
        h = int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "big")
        return h < self._limit

    def decided(self, request_id: str, attempt: int, prompt_tokens: int, lease: Lease) -> None:
        """One attempt's decision: the lease's target won among the decision's candidates."""
        d = lease.decision
        targets = self.state.targets
        cands = d.candidates[:MAX_CANDIDATES]
        terms = d.score_terms
        rows = []
        for i, c in enumerate(cands):
            t = targets[c.target_id]
            (tid, est, wait, load, prefill, kv_penalty, util, fallbacks, aside, evict,
             reload) = terms[i]
            rows.append({
                "backend": t.backend.url, "model": t.model, "warm": c.warm,
                "capacity": c.capacity, "free_slots": c.free_slots,
                "queue_ahead": c.queue_ahead, "inflight": c.inflight, "kv_usage": c.kv_usage,
                "kv_free_tokens": c.kv_free_tokens, "matched_tokens": c.matched_tokens,
                "evict_tokens": c.evict_tokens, "est_ttft": est, "wait": wait, "load": load,
                "prefill": prefill, "kv_penalty": kv_penalty, "evict": evict,
                "reload": reload, "victims": list(c.victims),
                "utilization": util, "fallbacks": list(fallbacks), "set_aside": aside,
            })
        self.journal.write({
            "request_id": request_id, "event": "decision", "attempt": attempt,
            "policy": lease.policy or self.policy, "prompt_tokens": prompt_tokens,
            "candidates": rows, "candidates_total": len(d.candidates),
            "winner": {"backend": lease.target.backend.url, "model": lease.target.model},
            "reason": d.reason, "guards": list(d.guards), "est_ttft": lease.est_ttft,
            "predicted_tokens": lease.predicted_tokens,
        })

    def done(self, done: Done) -> None:
        """An ``on_done`` subscriber: the outcome line of a sampled request."""
        if not self.sampled(done.request_id) or done.attempts == 0:
            return
        self.journal.write({
            "request_id": done.request_id, "event": "done", "status": done.status,
            "target": done.target, "ttft": done.ttft, "est_ttft": done.est_ttft,
            "prompt_tokens": done.prompt_tokens, "cached_tokens": done.cached_tokens,
            "predicted_tokens": done.predicted_tokens, "prefix": done.prefix,
        })

    @property
    def dropped(self) -> int:
        return self.journal.dropped

    def close(self) -> Any:
        return self.journal.close()
