"""The light key's engine-leg TTFT at 10:1, split by whether a heavy request was sent to the
same engine from 100 ms before it to its first byte (a heavy prefill in the step in progress
or in its own). Reads Pharos's usage journals of ``fair/a-fair`` (``tar xJf results.tar.xz``).
A journal line's ``time`` is the request's end; arrival = end - duration, dispatch = arrival +
queue wait. Usage: python3 fair_neighbours.py [FAIR_DIR]"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

NEAR_BEFORE = 0.1


def p95(values: list[float]) -> float | None:
    s = sorted(values)
    return s[max(0, -(-len(s) * 95 // 100) - 1)] if s else None


def main(fair: Path) -> None:
    for journal in sorted((fair / "a-fair" / "logs").glob("*/*/cost-seed*/journal.jsonl")):
        sent: list[tuple[str, str, float, float]] = []
        for line in journal.read_text().splitlines():
            d = json.loads(line)
            if d.get("ttft_ms") is None:
                continue
            arrival = d["time"] - d["duration_ms"] / 1000
            sent.append((d["key"], d["target"], arrival + d["queue_wait_ms"] / 1000,
                         d["ttft_ms"] / 1000))
        heavy = [(t, at) for key, t, at, _ in sent if key == "heavy"]
        split: dict[bool, list[float]] = {False: [], True: []}
        for key, target, at, ttft in sent:
            if key != "light":
                continue
            near = any(t == target and at - NEAR_BEFORE <= h <= at + ttft for t, h in heavy)
            split[near].append(ttft * 1000)
        row = [journal.parent.name]
        for near in (False, True):
            v = split[near]
            row.append(f"{'heavy near' if near else 'none near'}: n {len(v)}, p50 "
                       f"{statistics.median(v):.0f} ms, p95 {p95(v):.0f} ms" if v else "-")
        print(" | ".join(row))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "fair"))
