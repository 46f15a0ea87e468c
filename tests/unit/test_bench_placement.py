"""``pharos bench placement`` (issue 15 item 5): a tiny grid on virtual time, its report's shape
and counts (behaviour, not timing: the figures themselves are the benchmark's)."""

from __future__ import annotations

import json
from pathlib import Path

from pharos.bench.placement import (
    POLICIES,
    FleetConfig,
    goals_table,
    main_placement,
    run_grid,
    run_one,
    summarize,
    tail_models,
)

TINY = FleetConfig(hosts=2, models=4, memory_gb=8.0, requests=40, rate=1.0)


def test_every_policy_serves_every_request_and_counts_agree() -> None:
    """Each policy (Pharos's cost, random and round-robin; the harness's loaded-first) serves
    all 40 requests; at least one load per model asked for, never more loads than requests
    plus the models (a request starts at most one load); placement never shows more copies than
    the fleet's memory holds; the summary's loads per 1,000 is the count scaled."""
    for policy in POLICIES:
        run = run_one(TINY, policy, 3)
        assert run.served == run.requests == 40, policy
        assert all(t is not None and t >= 0 for t in run.ttft), policy
        asked = set(run.models)
        assert len(asked) <= run.loads <= run.requests + TINY.models, policy
        for _, counts in run.placement:
            assert sum(counts.values()) <= TINY.resident, policy
            assert all(0 <= n <= TINY.hosts for n in counts.values()), policy
        if policy == "loaded-first":
            assert run.cold_dispatches is None  # the harness's dispatch: no Pharos lease
        else:
            assert run.cold_dispatches is not None and 0 < run.cold_dispatches <= run.served
        row = summarize(TINY, run)
        assert row["loads_per_1000"] == 1000 * run.loads / run.requests
        tails = set(tail_models(TINY))
        assert row["tail_requests"] == sum(m in tails for m in run.models)


def test_same_seed_same_run() -> None:
    """Virtual time: the same seed gives the same loads and TTFTs (the benchmark's results
    do not depend on how loaded the machine is)."""
    a, b = run_one(TINY, "cost", 5), run_one(TINY, "cost", 5)
    assert (a.loads, a.ttft, a.placement) == (b.loads, b.ttft, b.placement)


def test_compressed_fleet_serves_everything_sooner() -> None:
    """``compress``: the same fleet four times faster and the rate four times higher, Pharos
    not told the memory (as ``bench compare``'s config): every request served, the config
    named for both, and the fastest TTFT under the compressed 0.75 s load (the engines run
    the compressed timings)."""
    cfg = FleetConfig(hosts=2, models=4, requests=40, rate=1.0, compress=4.0,
                      pharos_memory=False)
    assert cfg.name == "ollama-2h-4m-x4-nomem"
    run = run_one(cfg, "cost", 3)
    assert run.served == 40
    assert min(t for t in run.ttft if t is not None) < 0.75


def test_tail_models_are_past_the_resident_copies() -> None:
    """Two hosts holding two 4 GB models each: models 4.. are the tail; a llama-swap fleet
    holds one model a host."""
    assert tail_models(FleetConfig(hosts=2, models=6)) == ["model-4", "model-5"]
    assert tail_models(FleetConfig(hosts=2, models=6, kind="llama-swap")) == [
        "model-2", "model-3", "model-4", "model-5"]


def test_grid_writes_runs_rows_goals_and_chart(tmp_path: Path) -> None:
    """The command writes a run file per policy and seed, the summary rows, the goals (each
    with the cost figure, its limit and met) and the hosts-per-model chart, and prints the
    goals table."""
    assert main_placement(["--hosts", "2", "--models", "3", "--requests", "20", "--seeds",
                           "1,2", "--out", str(tmp_path)]) == 0
    d = tmp_path / "ollama-2h-3m"
    runs = sorted(p.name for p in (d / "runs").iterdir())
    assert runs == sorted(f"{p}-seed{s}.json" for p in POLICIES for s in (1, 2))
    rows = json.loads((d / "rows.json").read_text())
    assert len(rows) == len(POLICIES) * 2
    assert all(r["served"] == r["requests"] == 20 for r in rows)
    g = json.loads((d / "goals.json").read_text())
    assert g["fleet"]["hosts"] == 2
    for key in ("loads", "p95", "p50", "tail"):
        assert set(g[key]) == {"cost", "limit", "met"}
    assert set(g["medians"]) == set(POLICIES)
    svg = (d / "hosts-per-model.svg").read_text()
    assert svg.startswith("<svg") and svg.count("model-0<") == len(POLICIES)
    assert "| ollama-2h-3m |" in goals_table([g])


def test_grid_without_out_returns_the_goals() -> None:
    """``run_grid`` without a directory writes nothing and returns rows and goals."""
    result = run_grid(TINY, [1], ["cost", "random"], None)
    assert [r["policy"] for r in result["rows"]] == ["cost", "random"]
    assert result["goals"]["loads"]["limit"] == result["goals"]["medians"]["random"][
        "loads_per_1000"] / 5
