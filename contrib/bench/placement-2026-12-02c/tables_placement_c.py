"""The goals table, every policy's medians and cost before/after, from the runs here.

    PYTHONPATH=. .venv/bin/python contrib/bench/placement-2026-12-02c/tables_placement_c.py

The grid was run by several processes (the baselines, cost before and cost after the fix,
each its own ``pharos bench placement --policies ...``), so each config's ``rows.json``,
``goals.json`` and chart are rewritten here from every run in ``<config>/runs/`` as
``run_grid`` writes them; ``before/<config>/runs/`` holds cost before the fix.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path

from pharos.bench.placement import (
    POLICIES,
    FleetConfig,
    RunResult,
    chart_svg,
    goals,
    goals_table,
    medians_table,
    summarize,
)

HERE = Path(__file__).resolve().parent
FLEETS = (
    FleetConfig(hosts=3, models=8),
    FleetConfig(hosts=2, models=8),
    FleetConfig(hosts=4, models=16),
    FleetConfig(hosts=3, models=8, kind="llama-swap", rate=0.6, keep_alive=None),
)


def runs(d: Path) -> list[RunResult]:
    return [RunResult(**json.loads(p.read_text())) for p in sorted(d.glob("*.json"))]


def main() -> None:
    gs = []
    ba = ["| config | cost before: loads/1000 (per seed) | p50 s | p95 s | cost after: "
          "loads/1000 (per seed) | p50 s | p95 s |", "|---|---|---|---|---|---|---|"]
    for cfg in FLEETS:
        d = HERE / cfg.name
        if not (d / "runs").exists():
            continue
        rs = runs(d / "runs")
        # The seeds cost (after) finished: every policy's medians over those of them it ran.
        seeds = sorted({r.seed for r in rs if r.policy == "cost"}) or sorted(
            {r.seed for r in rs})
        rs = [r for r in rs if r.seed in seeds]
        have = {p: sorted(r.seed for r in rs if r.policy == p) for p in POLICIES}
        rows = [summarize(cfg, r) for r in rs]
        g = goals(cfg, rows)
        (d / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
        (d / "goals.json").write_text(json.dumps({"fleet": asdict(cfg), **g}, indent=1)
                                      + "\n")
        first = sorted((r for r in rs if r.seed == seeds[0]),
                       key=lambda r: POLICIES.index(r.policy))
        (d / "hosts-per-model.svg").write_text(chart_svg(
            first, cfg.hosts, f"{cfg.name}: hosts holding each model over time, seed "
                              f"{seeds[0]}"))
        partial = "; ".join(f"{p} seeds {','.join(map(str, v))}" for p, v in have.items()
                            if v and v != seeds)
        g["config"] = (f"{cfg.name} (seeds {','.join(map(str, seeds))}"
                       + (f"; {partial}" if partial else "") + ")")
        gs.append(g)
        cells = []
        for rr in (runs(HERE / "before" / cfg.name / "runs"), [r for r in rs
                                                                if r.policy == "cost"]):
            sm = sorted((summarize(cfg, r) for r in rr if r.policy == "cost"),
                        key=lambda x: x["seed"])
            if not sm:
                cells += ["-", "-", "-"]
                continue
            per = ", ".join(f"{x['loads_per_1000']:.0f}" for x in sm)
            cells += [f"{statistics.median(x['loads_per_1000'] for x in sm):.0f} ({per})",
                      f"{statistics.median(x['p50'] for x in sm):.2f}",
                      f"{statistics.median(x['p95'] for x in sm):.2f}"]
        ba.append(f"| {cfg.name} | " + " | ".join(cells) + " |")
    print(goals_table(gs))
    print(medians_table(gs))
    print("\n".join(ba))


if __name__ == "__main__":
    main()
