"""The W1 table of this directory's README from its result files alone.

Usage: python3 summarize_workers.py RESULTS_DIR   (RESULTS_DIR/workers-<N>/w1/6/cost-seed<S>.json)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def main(root: Path) -> None:
    print("| workers | seed | hit rate | p99 TTFT ms | errors |")
    print("|---|---|---|---|---|")
    by: dict[str, dict[int, float]] = {}
    for variant in ("workers-1", "workers-2"):
        for path in sorted((root / variant / "w1" / "6").glob("cost-seed*.json")):
            seed = int(path.stem.rsplit("seed", 1)[1])
            s = json.loads(path.read_text())["summary"]
            by.setdefault(variant, {})[seed] = s["hit_rate"]
            print(f"| {variant[-1]} | {seed} | {s['hit_rate']:.3f} | "
                  f"{s['ttft_s']['p99'] * 1000:.0f} | {sum(s['errors'].values())} |")
    one, two = by.get("workers-1", {}), by.get("workers-2", {})
    seeds = sorted(set(one) & set(two))
    if seeds:
        diffs = [(two[s] - one[s]) * 100 for s in seeds]
        print(f"\nmedian hit rate: 1 worker {statistics.median(one[s] for s in seeds):.3f}, "
              f"2 workers {statistics.median(two[s] for s in seeds):.3f}; "
              f"2 - 1 by seed (points): {', '.join(f'{d:+.1f}' for d in diffs)}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
