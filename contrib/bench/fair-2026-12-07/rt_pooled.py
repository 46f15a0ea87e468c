"""The light key's p95 TTFT at 10:1 over its p95 alone with every seed's light requests
pooled (about 290 a variant where one seed has about 58, whose p95 is its fourth slowest), and
a bootstrap 90 % interval of that ratio (requests resampled within each seed, 2,000 times),
from Pharos's journal (queue wait plus TTFT, as ``rt_journal.py``; ``--engine``: the engine
leg). Usage: rt_pooled.py OUT [--engine]"""

import glob
import json
import os
import random
import sys

out = sys.argv[1]
ENGINE = "--engine" in sys.argv[2:]


def light(path: str) -> list[float]:
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    t0 = min(r["time"] - r["duration_ms"] / 1000 for r in rows)
    return [r["ttft_ms"] + (0 if ENGINE else r["queue_wait_ms"]) for r in rows
            if r["key"] == "light" and r["ttft_ms"] is not None
            and r["time"] - r["duration_ms"] / 1000 - t0 >= 5.0]  # the bench's warm-up


def runs(name: str) -> dict[int, list[float]]:
    res = {}
    for p in glob.glob(os.path.join(out, name, "logs", "w6", "12", "cost-seed*", "journal.jsonl")):
        res[int(p.split("cost-seed")[1].split("/")[0])] = light(p)
    return res


def p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.95 * len(xs)))]


alone = runs("a-alone")
rng = random.Random(1)
print("| variant | seeds | light requests | pooled p95 ms (alone) | pooled ratio | 90 % interval |")
print("|---|---:|---:|---|---:|---|")
for name in sorted(os.path.basename(p) for p in glob.glob(os.path.join(out, "a-fair-*"))):
    fair = runs(name)
    seeds = sorted(set(fair) & set(alone))
    f = [x for s in seeds for x in fair[s]]
    a = [x for s in seeds for x in alone[s]]
    ratio = p95(f) / p95(a)
    boot = []
    for _ in range(2000):
        fb = [x for s in seeds for x in rng.choices(fair[s], k=len(fair[s]))]
        ab = [x for s in seeds for x in rng.choices(alone[s], k=len(alone[s]))]
        boot.append(p95(fb) / p95(ab))
    boot.sort()
    print(f"| {name} | {len(seeds)} | {len(f)} | {p95(f):.0f} ({p95(a):.0f}) | {ratio:.2f}x | "
          f"{boot[100]:.2f}-{boot[1899]:.2f}x |")
