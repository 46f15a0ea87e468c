"""The goals table and every policy's medians over the configs run here (their goals.json).

    PYTHONPATH=. .venv/bin/python contrib/bench/placement-2026-12-02b/tables_placement.py
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

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
ORDER = ("ollama-3h-8m", "ollama-2h-8m", "ollama-4h-16m", "llama-swap-3h-8m")


def main() -> None:
    gs = []
    for name in ORDER:
        path = HERE / name / "goals.json"
        if path.exists():
            g = json.loads(path.read_text())
            seeds = sorted({r["seed"] for r in json.loads((HERE / name / "rows.json")
                                                          .read_text())})
        elif (HERE / name / "runs").exists():  # a grid stopped early: the seeds it finished
            g = partial(name)
            seeds = g.pop("seeds")
        else:
            continue
        g["config"] = f"{name} (seeds {','.join(map(str, seeds))})"
        gs.append(g)
    print(goals_table(gs))
    print(medians_table(gs))


def partial(name: str) -> dict[str, Any]:
    """Goals over the seeds every policy finished (``runs/``), for a grid stopped early
    (its seeds run by several processes), written as ``run_grid`` writes them."""
    kind, hosts, models = name.rsplit("-", 2)
    cfg = FleetConfig(hosts=int(hosts[:-1]), models=int(models[:-1]), kind=kind,
                      rate=0.6 if kind == "llama-swap" else 1.2,
                      keep_alive=None if kind == "llama-swap" else 300.0)
    runs = [RunResult(**json.loads(p.read_text()))
            for p in sorted((HERE / name / "runs").glob("*.json"))]
    by_seed: dict[int, set[str]] = {}
    for r in runs:
        by_seed.setdefault(r.seed, set()).add(r.policy)
    full = max(len(v) for v in by_seed.values())
    seeds = sorted(s for s, v in by_seed.items() if len(v) == full)
    rows = [summarize(cfg, r) for r in runs if r.seed in seeds]
    g = goals(cfg, rows)
    # What run_grid writes at its end: rows, goals, the chart of the first seed.
    (HERE / name / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
    (HERE / name / "goals.json").write_text(json.dumps({"fleet": asdict(cfg), **g}, indent=1)
                                            + "\n")
    first = sorted((r for r in runs if r.seed == seeds[0]),
                   key=lambda r: POLICIES.index(r.policy))
    (HERE / name / "hosts-per-model.svg").write_text(chart_svg(
        first, cfg.hosts, f"{name}: hosts holding each model over time, seed {seeds[0]}"))
    return {**g, "seeds": seeds}


if __name__ == "__main__":
    main()
