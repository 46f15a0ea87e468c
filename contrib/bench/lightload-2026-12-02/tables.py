"""The README's table: ``tables.py BEFORE_DIR AFTER_DIR`` (directories of
``lightload_virtual.py run``'s JSON files, seeds 1-20 of mix and w6 under both policies)."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def load(d: Path) -> dict[tuple[str, str, int], dict[str, Any]]:
    out = {}
    for p in d.glob("*.json"):
        r = json.loads(p.read_text())
        out[(r["workload"], r["policy"], r["seed"])] = r
    return out


def main() -> None:
    b, a = load(Path(sys.argv[1])), load(Path(sys.argv[2]))
    seeds = sorted({k[2] for k in a})
    print("| workload | seed | least-load p99 | cost p99 before | cost p99 after | least-load p50 "
          "| cost p50 before | cost p50 after | cost hit rate before / after |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for w in ("mix", "w6"):
        for s in seeds:
            ll, cb, ca = a[(w, "least-load", s)], b[(w, "cost", s)], a[(w, "cost", s)]
            assert ll["p99"] == b[(w, "least-load", s)]["p99"], (w, s)

            def f(x: float, ref: float) -> str:
                return f"**{round(x * 1000)}**" if x > ref else f"{round(x * 1000)}"

            print(f"| {w} | {s} | {round(ll['p99'] * 1000)} | {f(cb['p99'], ll['p99'])} | "
                  f"{f(ca['p99'], ll['p99'])} | {round(ll['p50'] * 1000)} | "
                  f"{round(cb['p50'] * 1000)} | {round(ca['p50'] * 1000)} | "
                  f"{cb['hit_rate']} / {ca['hit_rate']} |")
        for hi in (5, 10, seeds[-1]):
            ss = [s for s in seeds if s <= hi]

            def lost(m: dict[tuple[str, str, int], dict[str, Any]], ss: list[int] = ss,
                     w: str = w) -> int:
                return sum(m[(w, "cost", s)]["p99"] > a[(w, "least-load", s)]["p99"] for s in ss)

            def med(m: dict[tuple[str, str, int], dict[str, Any]], p: str,
                    ss: list[int] = ss, w: str = w) -> int:
                return round(statistics.median(m[(w, p, s)]["p99"] for s in ss) * 1000)

            print(f"| {w} | seeds 1-{hi}: losses / median p99 | {med(a, 'least-load')} | "
                  f"{lost(b)} / {med(b, 'cost')} | {lost(a)} / {med(a, 'cost')} | | | | |")


if __name__ == "__main__":
    main()
