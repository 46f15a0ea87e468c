"""The W1 table of this directory's README from its result files alone.

Usage: python3 summarize_w1b.py RESULTS_DIR
(RESULTS_DIR/{before,after}-workers-<N>/w1/6/cost-seed<S>.json)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

VARIANTS = ("before-workers-2", "after-workers-2", "after-workers-1")


def main(root: Path) -> None:
    print("| variant | seed | hit rate | p99 TTFT ms | errors |")
    print("|---|---|---|---|---|")
    by: dict[str, dict[int, float]] = {}
    for variant in VARIANTS:
        for path in sorted((root / variant / "w1" / "6").glob("cost-seed*.json")):
            seed = int(path.stem.rsplit("seed", 1)[1])
            s = json.loads(path.read_text())["summary"]
            by.setdefault(variant, {})[seed] = s["hit_rate"]
            print(f"| {variant} | {seed} | {s['hit_rate']:.3f} | "
                  f"{s['ttft_s']['p99'] * 1000:.0f} | {sum(s['errors'].values())} |")
    one = by.get("after-workers-1", {})
    for variant in VARIANTS[:2]:
        two = by.get(variant, {})
        seeds = sorted(set(one) & set(two))
        if seeds:
            diffs = [(two[s] - one[s]) * 100 for s in seeds]
            print(f"\n{variant} - after-workers-1 by seed (points): "
                  f"{', '.join(f'{d:+.1f}' for d in diffs)} "
                  f"(median {statistics.median(diffs):+.1f})")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
