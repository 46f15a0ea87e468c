"""Shadow policies (issue 17 item 3): offered decisions run a turn later, bounded (dropped and
counted when behind), counted for agreement and the cost model's gain, logged as a chain that
``replay`` checks."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.task import Clock

from pharos.models import Fleet, ModelSpec
from pharos.policy import Candidate, PolicyConfig, RouteReq, pick
from pharos.shadow import Shadow, replay


def cand(target_id: int, **changes: Any) -> Candidate:
    fields: dict[str, Any] = {
        "warm": True, "capacity": 4, "free_slots": 4, "queue_ahead": 0, "kv_usage": 0.1,
        "matched_tokens": 0, "prefill_sec_per_token": 0.002, "load_sec": 5.0,
        "service_sec": 4.0, "fits_if_cold": True, "loading": False, "inflight": 0}
    fields.update(changes)
    return Candidate(target_id=target_id, **fields)


@dataclass
class Req:
    model: str = "m"
    policy: PolicyConfig | None = None


@dataclass
class Placed:
    route: RouteReq
    candidates: tuple[Candidate, ...]
    decision: Any


@dataclass
class Sink:
    lines: list[dict[str, object]] = field(default_factory=list)

    def write(self, record: Mapping[str, object]) -> bool:
        self.lines.append(json.loads(json.dumps(record)))
        return True


def placed(seed: int) -> Placed:
    """Target 1 holds 800 of the prompt's 1000 tokens; target 2 is idle and holds nothing."""
    cands = (cand(1, matched_tokens=800, free_slots=3), cand(2))
    route = RouteReq(1000, seed)
    return Placed(route, cands, pick(route, cands, PolicyConfig()))


def test_offers_run_a_turn_later_bounded_and_counted() -> None:
    """Nothing runs inside ``offer``; a turn later every queued decision is shadowed; offers
    past the queue limit are dropped and counted; least-load disagreeing with cost here has a
    negative estimated gain (cost's pick looked faster)."""
    clock, sink = Clock(), Sink()
    fleet = Fleet([ModelSpec("m", shadow=("least-load", "cost"))])
    shadow = Shadow(clock, fleet, PolicyConfig, sink, queue_limit=3, batch=2)
    for seed in range(5):
        shadow.offer(Req(), placed(seed))
    assert shadow.pending() == 3 and shadow.dropped == 2 and not shadow.tallies
    clock.advance(0)  # a batch of 2, then the rest on the next call (Clock runs both)
    assert shadow.pending() == 0
    least = shadow.tallies[("m", "cost", "least-load")]
    same = shadow.tallies[("m", "cost", "cost")]
    assert (least.decisions, least.agree) == (3, 0) and least.gain_sum < 0
    assert (same.decisions, same.agree, same.gain_sum) == (3, 3, 0.0)
    shadow.offer(Req(model="other"), placed(9))  # no shadows for it: not queued
    assert shadow.pending() == 0
    checked, problems = replay(json.dumps(x) for x in sink.lines)
    assert checked == 3 and problems == []


def test_replay_catches_a_changed_pick() -> None:
    """A shadow line whose pick was edited, even with its sha recomputed, fails the rebuild."""
    from pharos.shadow import seal

    clock, sink = Clock(), Sink()
    shadow = Shadow(clock, Fleet([ModelSpec("m", shadow=("least-load",))]), PolicyConfig, sink)
    shadow.offer(Req(), placed(1))
    clock.advance(0)
    line = dict(sink.lines[1])
    line.pop("sha")
    line["picks"] = {"least-load": 1}
    forged = {**line, "sha": seal(str(line["prev"]), line)}
    checked, problems = replay([json.dumps(sink.lines[0]), json.dumps(forged)])
    assert checked == 1 and problems == ["line 2: shadow least-load picks 2, the line says 1"]
