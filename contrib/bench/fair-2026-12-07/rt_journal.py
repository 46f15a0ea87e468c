"""The light key's p95 TTFT as Pharos's usage journal saw it (its wait in Pharos's queue,
``queue_wait_ms``, plus ``ttft_ms``, from dispatch to the engine's first byte), at 10:1 over
alone, per seed and variant; with ``--engine``, ``ttft_ms`` alone (the engine leg). Usage:
rt_journal.py OUT [--engine]"""

import glob
import json
import os
import statistics
import sys

out = sys.argv[1]
ENGINE = "--engine" in sys.argv[2:]


def p95(path: str) -> float | None:
    try:
        with open(path) as f:
            rows = [json.loads(line) for line in f]
    except OSError:
        return None
    t0 = min(r["time"] - r["duration_ms"] / 1000 for r in rows)
    tt = sorted(r["ttft_ms"] + (0 if ENGINE else r["queue_wait_ms"]) for r in rows
                if r["key"] == "light" and r["ttft_ms"] is not None
                and r["time"] - r["duration_ms"] / 1000 - t0 >= 5.0)  # the bench's warm-up
    return tt[min(len(tt) - 1, int(0.95 * len(tt)))] if tt else None


def journal(name: str, seed: int) -> str:
    return os.path.join(out, name, "logs", "w6", "12", f"cost-seed{seed}", "journal.jsonl")


seeds = sorted(int(p.rsplit("seed", 1)[1]) for p in glob.glob(
    os.path.join(out, "a-alone", "logs", "w6", "12", "cost-seed*")))
names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(out, "a-fair-*")))
alone = {s: p95(journal("a-alone", s)) for s in seeds}
print("| variant | " + " | ".join(f"seed {s}" for s in seeds) + " | median |")
print("|---|" + "---|" * (len(seeds) + 1))
print("| light alone p95 ms | " + " | ".join(f"{alone[s] or 0:.0f}" for s in seeds) + " | |")
for n in names:
    cells, ratios = [], []
    for s in seeds:
        f, a = p95(journal(n, s)), alone[s]
        if f is None or a is None:
            cells.append("-")
            continue
        ratios.append(f / a)
        cells.append(f"{f:.0f} ({f / a:.2f}x)")
    med = f"{statistics.median(ratios):.2f}x" if ratios else ""
    print(f"| {n} | " + " | ".join(cells) + f" | {med} |")
