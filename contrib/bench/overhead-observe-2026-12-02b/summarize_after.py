"""Print the figures of this directory's runs (``python summarize_after.py``): per variant the
median (min-max) over rounds of Pharos CPU ms per request and added TTFT p50, then the
same-round differences observe - plain, before and after."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

here = Path(__file__).parent
variants = ("base-plain", "base-observe", "after-plain", "after-observe")
runs: dict[str, dict[int, dict[str, float]]] = {v: {} for v in variants}
for f in here.glob("*-r*.json"):
    v, r = f.stem.rsplit("-r", 1)
    if not f.read_text().strip():
        continue  # a run still going
    d = json.loads(f.read_text())
    runs[v][int(r)] = {"cpu": d["pharos_cpu_ms_per_request"], "add": d["added_ms"]["p50"]}


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


print(f"{'variant':<14} rounds  cpu ms/request      added p50 ms")
for v in variants:
    rs = runs[v].values()
    print(f"{v:<14} {len(runs[v]):>6}  {med([x['cpu'] for x in rs]):<18}  "
          f"{med([x['add'] for x in rs])}")
for side in ("base", "after"):
    plain, obs = runs[f"{side}-plain"], runs[f"{side}-observe"]
    both = sorted(set(plain) & set(obs))
    dcpu = [obs[r]["cpu"] - plain[r]["cpu"] for r in both]
    ratio = [obs[r]["cpu"] / plain[r]["cpu"] - 1 for r in both]
    dadd = [obs[r]["add"] - plain[r]["add"] for r in both]
    q = statistics.quantiles(ratio, n=4) if len(ratio) > 1 else ratio * 3
    print(f"{side}: observe - plain same round: cpu {statistics.median(dcpu):+.3f} ms "
          f"(median ratio {statistics.median(ratio) * 100:+.1f} %, quartiles "
          f"{q[0] * 100:+.1f} to {q[2] * 100:+.1f} %, {sum(x > 0 for x in dcpu)}/{len(both)} "
          f"higher); added p50 {statistics.median(dadd):+.3f} ms")
plain_b, plain_a = runs["base-plain"], runs["after-plain"]
both = sorted(set(plain_b) & set(plain_a))
print(f"plain after - before same round: cpu "
      f"{statistics.median([plain_a[r]['cpu'] - plain_b[r]['cpu'] for r in both]):+.3f} ms")
# The plain runs execute the same code before and after (no decision log, no reader: the
# changed paths are not reached), so they are pooled as one reference for both sides.
pooled = {r: (plain_b[r]["cpu"] + plain_a[r]["cpu"]) / 2 for r in both}
for side in ("base", "after"):
    obs = runs[f"{side}-observe"]
    same = sorted(set(obs) & set(pooled))
    ratio = [obs[r]["cpu"] / pooled[r] - 1 for r in same]
    print(f"{side}-observe vs pooled plain of the same round: cpu "
          f"{statistics.median([obs[r]['cpu'] - pooled[r] for r in same]):+.3f} ms "
          f"(median ratio {statistics.median(ratio) * 100:+.1f} %)")
all_plain = [x["cpu"] for v in ("base-plain", "after-plain") for x in runs[v].values()]
print(f"all plain runs: cpu {med(all_plain)}")
