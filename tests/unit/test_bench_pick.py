"""``pharos bench pick``'s decide row: it times the scheduler's whole decision, index included."""

from __future__ import annotations

import json
import random

import pytest

from pharos.bench import pick as bench


def test_the_decide_fleet_routes_to_a_target_the_index_says_holds_the_chat() -> None:
    """The row's fleet is one the scheduler prices with the prefix index: of 8 idle-ish
    targets, the two recorded as holding the chat (every fourth) are the ones it picks."""
    ch = bench._chat(800, random.Random(1))
    one, stop = bench.decide_fleet(8, ch, 800, random.Random(len(ch)))
    try:
        chosen = {one()[0] for _ in range(20)}  # type: ignore[index]
    finally:
        stop()
    assert chosen and chosen <= {0, 4}, chosen


def test_pharos_bench_pick_only_decide_prints_the_row(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--only decide --json`` prints the decide row alone, with the policy that ran."""
    assert bench.main_pick(["--only", "decide", "--rounds", "400", "--candidates", "8",
                            "--prompt-tokens", "800", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["decide"]) == {"p50_us", "p99_us", "mean_us", "min_us"}
    assert set(doc["decide/1w"]) == {"p50_us", "p99_us", "mean_us", "min_us"}
    assert "cost" not in doc and doc["machine"]["policy"] is not None


def test_the_written_decide_fleet_writes_one_target_per_decision() -> None:
    """``decide/1w``'s fleet gives one target a new stamp before each decision, a different
    one each time, so the row times the rebuild a dispatch between decisions causes."""
    from pharos.state.registry import Target

    ch = bench._chat(800, random.Random(1))
    seen: list[int] = []
    setattr_ = Target.__setattr__

    def spy(self: Target, name: str, value: object) -> None:
        if name == "queued_prefill":
            seen.append(self.id)
        setattr_(self, name, value)

    one, stop = bench.decide_fleet(8, ch, 800, random.Random(len(ch)), written=1)
    try:
        Target.__setattr__ = spy  # type: ignore[method-assign]
        for _ in range(3):
            one()
    finally:
        Target.__setattr__ = setattr_  # type: ignore[method-assign]
        stop()
    assert len(seen) == 3 and len(set(seen)) == 3, seen
