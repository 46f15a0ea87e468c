"""The shared-prefix cells of this run as a table: per KV counting, start and policy, each
seed's hit rate and p99 TTFT, their medians, and the cells where cost's p99 is over
prefix-aware's (same seed). Misses: counted requests with under 400 cached tokens (a
500-token system prompt plus a 10-40-token question: a hit caches ~95 %).
Usage: python3 shared_table.py shared [PREFIX_AWARE_DIR]   (the second: where prefix-aware's
runs are, when they are not beside cost's: an A/B whose other tree ran cost alone)"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

MISS_BELOW = 400


def cell(path: Path) -> tuple[float, float, int, float]:
    doc = json.loads(path.read_text())
    s = doc["summary"]
    misses = sum(1 for r in doc["records"] if not r.get("warmup") and r.get("status") == 200
                 and (r.get("cached_tokens") or 0) < MISS_BELOW)
    return s["hit_rate"], s["ttft_s"]["p99"] * 1000, misses, s["busiest_share"]


def main(root: Path, pa_root: Path | None = None) -> None:
    print("| KV usage | start | policy | hit rate (seeds) | p99 TTFT ms (seeds) | misses | "
          "busiest engine share | median hit | median p99 |")
    print("|---|---|---|---|---|---|---|---|---|")
    worse: list[str] = []
    for kv in sorted(p.name for p in root.glob("kv-*")):
        for start in ("serial", "burst"):
            base = root / kv / start / "w1" / "20"
            got: dict[str, dict[int, tuple[float, float, int, float]]] = {}
            for policy in ("prefix-aware", "cost"):
                where = base if pa_root is None or policy == "cost" else (
                    pa_root / kv / start / "w1" / "20")
                for path in sorted(where.glob(f"{policy}-seed*.json")):
                    seed = int(path.stem.rsplit("seed", 1)[1])
                    got.setdefault(policy, {})[seed] = cell(path)
            for policy, seeds in got.items():
                v = [seeds[k] for k in sorted(seeds)]
                print(f"| {kv[3:]} | {start} | {policy} | "
                      + " / ".join(f"{h:.3f}" for h, _, _, _ in v) + " | "
                      + " / ".join(f"{p:.0f}" for _, p, _, _ in v) + " | "
                      + " / ".join(str(m) for _, _, m, _ in v) + " | "
                      + " / ".join(f"{b:.2f}" for _, _, _, b in v) + " | "
                      + f"{statistics.median(h for h, _, _, _ in v):.3f} | "
                      + f"{statistics.median(p for _, p, _, _ in v):.0f} |")
            for seed, (_, p, _, _) in sorted(got.get("cost", {}).items()):
                pa = got.get("prefix-aware", {}).get(seed)
                if pa is not None and p > pa[1] + 4:
                    worse.append(f"{kv[3:]} {start} seed {seed}: +{p - pa[1]:.0f} ms")
    print()
    print("cost's p99 more than 4 ms over prefix-aware's, same seed: "
          + ("; ".join(worse) if worse else "none"))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "shared"),
         Path(sys.argv[2]) if len(sys.argv) > 2 else None)
