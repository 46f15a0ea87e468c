"""The light key's p95 TTFT at 10:1 over its p95 alone, per seed and variant, from fair_rt.sh's
OUT (the bench's client-side TTFT; heavy requests served and cut). Usage: rt_table.py OUT"""

import glob
import json
import os
import statistics
import sys
from typing import Any

out = sys.argv[1]


def load(name: str) -> dict[int, dict[str, Any]]:
    res = {}
    for p in glob.glob(os.path.join(out, name, "w6", "12", "cost-seed*.json")):
        with open(p) as f:
            d = json.load(f)
        res[d["spec"]["seed"]] = d["summary"]
    return res


alone = load("a-alone")
names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(out, "a-fair-*")))
print("| variant | " + " | ".join(f"seed {s}" for s in sorted(alone)) + " | median |")
print("|---|" + "---|" * (len(alone) + 1))
print("| light alone p95 ms | " + " | ".join(
    f"{alone[s]['per_client']['light']['ttft_s']['p95'] * 1000:.0f}" for s in sorted(alone))
    + " | |")
for n in names:
    fair = load(n)
    cells, ratios = [], []
    for s in sorted(alone):
        if s not in fair:
            cells.append("-")
            continue
        f = fair[s]["per_client"]
        r = f["light"]["ttft_s"]["p95"] / alone[s]["per_client"]["light"]["ttft_s"]["p95"]
        ratios.append(r)
        h = f["heavy"]
        cells.append(f"{f['light']['ttft_s']['p95'] * 1000:.0f} ({r:.2f}x; heavy ok "
                     f"{h['ok']}, cut {sum(h.get('errors', {}).values())})")
    med = f"{statistics.median(ratios):.2f}x" if ratios else ""
    print(f"| {n} | " + " | ".join(cells) + f" | {med} |")
