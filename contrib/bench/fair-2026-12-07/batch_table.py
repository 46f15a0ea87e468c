"""batch_ab.sh's OUT as a table: the light key's p95 TTFT at 10:1 over its p95 alone, per seed,
before and after, with each timeout. Usage: batch_table.py OUT"""

import glob
import json
import os
import statistics
import sys

out = sys.argv[1]
runs = {}
for p in glob.glob(os.path.join(out, "*.json")):
    with open(p) as f:
        d = json.load(f)
    tree, t, _ = os.path.basename(p)[:-5].split("-")
    runs[(tree, t, d["seed"])] = d
seeds = sorted({k[2] for k in runs})
for t in ("t0", "t15"):
    print(f"\n{t}: light p95 at 10:1 / alone (p95 ms alone, at 10:1), heavy tokens served")
    print("| seed | before | after |")
    print("|---:|---|---|")
    med: dict[str, list[float]] = {"before": [], "after": []}
    for s in seeds:
        cells = []
        for tree in ("before", "after"):
            d = runs.get((tree, t, s))
            if d is None:
                cells.append("-")
                continue
            med[tree].append(d["ratio"])
            a, f = d["alone"]["light"]["p95"], d["fair"]["light"]["p95"]
            cells.append(f"{d['ratio']:.2f}x ({a * 1000:.0f}, {f * 1000:.0f}), "
                         f"{d['fair']['heavy']['served_tokens']}")
        print(f"| {s} | " + " | ".join(cells) + " |")
    print("| median | " + " | ".join(
        f"{statistics.median(v):.2f}x" if v else "-" for v in med.values()) + " |")
