"""Medians and spreads of the interleaved overhead runs in this directory (stdlib only)."""
import glob
import json
import os
import re
import statistics as st
import sys
from typing import Any

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
runs: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
for f in glob.glob(os.path.join(d, "*-r*.json")):
    m = re.match(r"(\w+)-(\w+)-r(\d+)\.json", os.path.basename(f))
    if m:
        with open(f) as fh:
            runs.setdefault((m[1], m[2]), {})[int(m[3])] = json.load(fh)

def fig(r: dict[str, Any], k: str) -> float:
    return float({"cpu": r["pharos_cpu_ms_per_request"], "add50": r["added_ms"]["p50"],
            "add99": r["added_ms"]["p99"], "dir50": r["ttft_direct_ms"]["p50"]}[k])

for mode in sorted({m for m, _ in runs}):
    print(f"## {mode}")
    print("variant   n  cpu ms/req med [min-max]   added p50 ms med [min-max]   "
          "added p99 med   direct p50 med")
    for v in ("base", "head", "observe", "log", "live"):
        rs = runs.get((mode, v))
        if not rs:
            continue
        vals = {k: [fig(r, k) for r in rs.values()] for k in ("cpu", "add50", "add99", "dir50")}
        c, a = vals["cpu"], vals["add50"]
        print(f"{v:<8} {len(rs):2}  {st.median(c):5.2f} [{min(c):.2f}-{max(c):.2f}]"
              f"          {st.median(a):5.2f} [{min(a):.2f}-{max(a):.2f}]"
              f"           {st.median(vals['add99']):5.2f}          "
              f"{st.median(vals['dir50']):5.2f}")
    for a_, b_ in (("head", "base"), ("observe", "head"), ("observe", "base"),
                   ("log", "head"), ("live", "head")):
        A, B = runs.get((mode, a_)), runs.get((mode, b_))
        if not A or not B:
            continue
        common = sorted(set(A) & set(B))
        for k, name in (("cpu", "cpu"), ("add50", "added p50")):
            ratios = [fig(A[i], k) / fig(B[i], k) for i in common]
            diffs = [fig(A[i], k) - fig(B[i], k) for i in common]
            med_a = st.median(fig(r, k) for r in A.values())
            med_b = st.median(fig(r, k) for r in B.values())
            print(f"  {a_} vs {b_} {name}: medians {med_a:.2f} vs {med_b:.2f} "
                  f"({(med_a / med_b - 1) * 100:+.0f} %); same-round diff median "
                  f"{st.median(diffs):+.2f} ms [{min(diffs):+.2f} to {max(diffs):+.2f}], "
                  f"ratio median {(st.median(ratios) - 1) * 100:+.0f} %, "
                  f"{sum(x > 0 for x in diffs)}/{len(diffs)} rounds higher")

print("## pooled over every series (same-round pairs; CPU only: latency differs by series)")
for a_, b_ in (("head", "base"), ("observe", "head"), ("observe", "base")):
    for k, name in (("cpu", "cpu"),):
        diffs, ratios = [], []
        for mode in sorted({m for m, _ in runs}):
            A, B = runs.get((mode, a_)), runs.get((mode, b_))
            if A and B:
                for i in sorted(set(A) & set(B)):
                    diffs.append(fig(A[i], k) - fig(B[i], k))
                    ratios.append(fig(A[i], k) / fig(B[i], k))
        q = st.quantiles(ratios, n=4)
        print(f"  {a_} vs {b_} {name}: n={len(diffs)} diff median {st.median(diffs):+.2f} ms, "
              f"ratio median {(st.median(ratios) - 1) * 100:+.0f} % "
              f"(quartiles {(q[0] - 1) * 100:+.0f} % to {(q[2] - 1) * 100:+.0f} %), "
              f"{sum(x > 0 for x in diffs)}/{len(diffs)} higher")
