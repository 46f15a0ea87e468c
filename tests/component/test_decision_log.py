"""Layer 3: the decision log (issue 12 item 4) over loopback: a sampled request's decisions
carry every candidate's signals and cost terms, the winner, reason and estimate, and a done
line joins them with the measured TTFT and cached tokens; sampling keeps a request's lines
together; no prompt text."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest_twisted

from pharos.config import DecisionLogConfig, Observability
from tests.support.fleet import eventually, start_fleet

MARKER = "zebra-quartz-marker"


async def run(path: Path, rate: float, n: int) -> list[dict[str, object]]:
    fleet = await start_fleet([("vllm", {"seed": i}, {"kind": "vllm"}) for i in range(3)],
                              observability=Observability(DecisionLogConfig(str(path), rate)))
    try:
        for i in range(n):
            r = await fleet.chat("tiny", messages=[{"role": "user",
                                                    "content": f"{MARKER} {i} " * 40}])
            await r.content()
            assert r.code == 200
        dlog = fleet.pharos.decision_log
        assert dlog is not None
        await eventually(lambda: dlog.journal.buffered == 0, timeout=10)
    finally:
        await fleet.stop()
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest_twisted.ensureDeferred
async def test_every_decision_with_its_candidates_and_outcome(tmp_path: Path) -> None:
    """At sample rate 1, each of 6 requests has a decision line naming all 3 candidates with
    signals and terms, the winner among them, a reason and an estimate, then a done line with
    its measured TTFT and cached tokens; the marker from the prompts is in no line."""
    path = tmp_path / "decisions.jsonl"
    lines = await run(path, 1.0, 6)
    assert MARKER not in path.read_text()
    by_id: dict[str, list[dict[str, object]]] = defaultdict(list)
    for line in lines:
        by_id[str(line["request_id"])].append(line)
    assert len(by_id) == 6
    for events in by_id.values():
        decision, done = events
        assert decision["event"] == "decision" and done["event"] == "done"
        cands = decision["candidates"]
        assert isinstance(cands, list) and len(cands) == 3
        for c in cands:
            assert {"backend", "model", "free_slots", "matched_tokens", "est_ttft", "wait",
                    "prefill", "set_aside"} <= set(c)
        winner = decision["winner"]
        assert isinstance(winner, dict)
        assert winner["backend"] in {c["backend"] for c in cands}
        assert decision["reason"] and decision["est_ttft"] is not None
        assert done["status"] == 200 and done["ttft"] is not None
        assert done["cached_tokens"] is not None


@pytest_twisted.ensureDeferred
async def test_sampling_keeps_a_requests_lines_together(tmp_path: Path) -> None:
    """At sample rate 0.5 some of 40 requests are logged, not all, and each logged one has
    both its decision and its done line."""
    lines = await run(tmp_path / "d.jsonl", 0.5, 40)
    kinds: dict[str, set[str]] = defaultdict(set)
    for line in lines:
        kinds[str(line["request_id"])].add(str(line["event"]))
    assert 5 <= len(kinds) <= 35
    assert all(k == {"decision", "done"} for k in kinds.values())
