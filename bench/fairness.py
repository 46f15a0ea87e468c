"""The fair queue on a saturated fleet: the client groups for ``pharos bench compare
--clients`` and the tables of docs/performance.rst's Fairness section, read from the result
files and Pharos's usage journal. Reported, never asserted.

Run from a checkout after ``make install``. First the client groups::

    .venv/bin/python bench/fairness.py clients bench/results/fair/clients

``a-alone`` (a light key alone, 1/11 of the rate), ``a-fair`` (the same light key beside a
heavy key sending 10/11, each with its own key), ``a-onekey`` (both as one key: no fairness),
``b-tenants`` (100 keys of tenant ``a`` sending 0.625 of the rate together against one key of
tenant ``b`` sending 0.375, equal weights) and ``b-onekey`` (the same as one key). Then each
mode on the same fleet, two vLLM doubles of 8 sequences at 40 ms a decode step::

    for mode in a-alone a-fair; do
        .venv/bin/pharos bench compare --engines 2 --kind vllm \\
            --engine-arg=--max-num-seqs=8 --engine-arg=--decode-ms=40 --backend-capacity 8 \\
            --workload w6 --workload-arg 'prompt_tokens=[200,600]' \\
            --workload-arg 'output_tokens=[20,60]' --rate 12 --duration 180 --warmup 5 \\
            --timeout 120 --seeds 1,2,3 --policies cost \\
            --clients bench/results/fair/clients/$mode.yaml --out bench/results/fair/$mode
    done
    .venv/bin/python bench/fairness.py light bench/results/fair

``--timeout 15`` instead of 120 has the clients give up as the published "give up at 15 s"
row does; ``a-onekey`` (``--duration 30 --timeout 15``) gives the row without fairness. For
the tenants: ``b-tenants`` at ``--rate 16 --duration 30 --timeout 15``, then
``bench/fairness.py tenants bench/results/fair``.

``light`` prints, for every mode run beside ``a-alone`` and every policy in it, the light
key's p95 TTFT per seed over its p95 alone (the harness's client-side TTFT, from each result
file's ``summary.per_client``), and for Pharos's runs the same ratio with every seed's light
requests pooled, from Pharos's usage journal (queue wait plus the engine's TTFT), with a
bootstrap 90 % interval (requests resampled within each seed). A seed of 60 s has about 58
light requests, whose p95 is the fourth slowest; pooling is what makes short runs readable.
``tenants`` prints tenant ``b``'s share of the output tokens served per seed.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

#: The client groups, as ``pharos.bench.clients`` reads them.
CLIENTS = {
    "a-alone": "clients:\n"
               "  - {name: light, share: 0.0909}\n"
               "  - {name: heavy, share: 0}\n",
    "a-fair": "clients:\n"
              "  - {name: light, share: 0.0909}\n"
              "  - {name: heavy, share: 0.9091}\n",
    "a-onekey": "clients:\n"
                "  - {name: light, share: 0.0909, key: shared}\n"
                "  - {name: heavy, share: 0.9091, key: shared}\n",
    "b-tenants": "tenants:\n"
                 "  - {name: a, weight: 1}\n"
                 "  - {name: b, weight: 1}\n"
                 "clients:\n"
                 "  - {name: a, share: 0.625, count: 100, tenant: a}\n"
                 "  - {name: b, share: 0.375, tenant: b}\n",
    "b-onekey": "clients:\n"
                "  - {name: a, share: 0.625, key: shared}\n"
                "  - {name: b, share: 0.375, key: shared}\n",
}
#: The workload every mode runs.
WORKLOAD = "w6"
#: Bootstrap resamples and the interval's tails.
RESAMPLES = 2000
TAIL = 0.05


def write_clients(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in CLIENTS.items():
        (out / f"{name}.yaml").write_text(text)
        print(out / f"{name}.yaml")


def results(mode_dir: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """A mode's result files, by policy and seed."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for path in sorted(mode_dir.glob(f"{WORKLOAD}/*/*-seed*.json")):
        doc = json.loads(path.read_text())
        policy = path.stem.rsplit("-seed", 1)[0]
        out.setdefault(policy, {})[int(doc["spec"]["seed"])] = doc
    return out


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def journal_light(mode_dir: Path, seed: int, warmup: float) -> list[float]:
    """The light key's queue wait plus TTFT (ms) of one run, from Pharos's usage journal,
    leaving out the requests that started within the warm-up."""
    paths = list(mode_dir.glob(f"logs/{WORKLOAD}/*/cost-seed{seed}/journal.jsonl"))
    if not paths:
        return []
    rows = [json.loads(line) for line in paths[0].read_text().splitlines() if line.strip()]
    if not rows:
        return []
    t0 = min(r["time"] - r["duration_ms"] / 1000 for r in rows)
    return [r["ttft_ms"] + r["queue_wait_ms"] for r in rows
            if r.get("key") == "light" and r.get("ttft_ms") is not None
            and r.get("queue_wait_ms") is not None
            and r["time"] - r["duration_ms"] / 1000 - t0 >= warmup]


def pooled(mode_dir: Path, alone_dir: Path, seeds: list[int], warmup: float
           ) -> tuple[float, float, float] | None:
    """The pooled ratio of the light key's p95 beside the heavy key over alone, and its
    bootstrap interval; None without journals."""
    fair = {s: journal_light(mode_dir, s, warmup) for s in seeds}
    alone = {s: journal_light(alone_dir, s, warmup) for s in seeds}
    seeds = [s for s in seeds if fair[s] and alone[s]]
    if not seeds:
        return None
    ratio = p95([x for s in seeds for x in fair[s]]) / p95([x for s in seeds for x in alone[s]])
    rng = random.Random(1)
    boot = sorted(
        p95([x for s in seeds for x in rng.choices(fair[s], k=len(fair[s]))])
        / p95([x for s in seeds for x in rng.choices(alone[s], k=len(alone[s]))])
        for _ in range(RESAMPLES))
    return ratio, boot[int(TAIL * RESAMPLES)], boot[int((1 - TAIL) * RESAMPLES) - 1]


def light_p95(doc: dict[str, Any]) -> float | None:
    group = doc["summary"].get("per_client", {}).get("light")
    return None if group is None else group["ttft_s"]["p95"]


def light(out: Path) -> int:
    alone = results(out / "a-alone").get("cost", {})
    if not alone:
        print(f"no a-alone results under {out}", file=sys.stderr)
        return 1
    print("| mode | policy | light p95 at 10:1 / alone, per seed | median | "
          "pooled from the journal (90 % interval) |")
    print("|---|---|---|---|---|")
    for mode_dir in sorted(p for p in out.iterdir() if p.is_dir() and p.name != "a-alone"):
        for policy, runs in sorted(results(mode_dir).items()):
            seeds = sorted(set(runs) & set(alone))
            ratios = []
            for s in seeds:
                fair_p95, alone_p95 = light_p95(runs[s]), light_p95(alone[s])
                if fair_p95 is not None and alone_p95:
                    ratios.append(fair_p95 / alone_p95)
            if not ratios:
                continue
            warmup = float(runs[seeds[0]]["spec"].get("warmup") or 0.0)
            pool = pooled(mode_dir, out / "a-alone", seeds, warmup) if policy == "cost" \
                else None
            pool_cell = "-" if pool is None else f"{pool[0]:.2f}x ({pool[1]:.2f}-{pool[2]:.2f})"
            print(f"| {mode_dir.name} | {policy} | "
                  + ", ".join(f"{r:.2f}" for r in ratios)
                  + f" | {statistics.median(ratios):.2f}x | {pool_cell} |")
    return 0


def tenants(out: Path) -> int:
    runs = results(out / "b-tenants")
    if not runs:
        print(f"no b-tenants results under {out}", file=sys.stderr)
        return 1
    print("| policy | seed | b's share of served output tokens |")
    print("|---|---|---|")
    for policy, by_seed in sorted(runs.items()):
        for seed, doc in sorted(by_seed.items()):
            groups = doc["summary"].get("per_client", {})
            a = (groups.get("a") or {}).get("output_tokens_per_s") or 0.0
            b = (groups.get("b") or {}).get("output_tokens_per_s") or 0.0
            share = f"{b / (a + b):.3f}" if a + b else "-"
            print(f"| {policy} | {seed} | {share} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fairness.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("clients", help="write the client groups' YAML files").add_argument(
        "dir", type=Path)
    sub.add_parser("light", help="the light key's p95 at 10:1 over alone").add_argument(
        "out", type=Path)
    sub.add_parser("tenants", help="tenant b's share of the served tokens").add_argument(
        "out", type=Path)
    a = p.parse_args(argv)
    if a.command == "clients":
        write_clients(a.dir)
        return 0
    if a.command == "light":
        return light(a.out)
    return tenants(a.out)


if __name__ == "__main__":
    sys.exit(main())
