"""The baselines through Pharos (this sweep) beside the same baselines dispatched around Pharos
in the committed sweep of 2026-11-29, seed 1 of each (the same requests at the same times),
and ``cost`` in both as the drift reference (the machine and the code moved between the two).

Usage: python compare_baselines_sweep.py NEW_RESULTS OLD_RESULTS
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def load(root: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    out = {}
    for f in sorted(root.glob("*/*/*-seed1.json")):
        doc = json.loads(f.read_text())
        workload, rate = f.parent.parent.name, f.parent.name
        out[(workload, rate, f.name.removesuffix("-seed1.json"))] = doc["summary"]
    return out


def cell(s: dict[str, Any] | None) -> str:
    if s is None:
        return "–"
    p99 = s["ttft_s"].get("p99") if s.get("ttft_s") else None
    hit = s.get("hit_rate")
    errors = sum(s.get("errors", {}).values())
    text = f"{p99 * 1000:,.0f}" if p99 is not None else "–"
    text += f" / {hit:.2f}" if hit is not None else " / –"
    return text + (f" ({errors} err)" if errors else "")


def main() -> None:
    new, old = load(Path(sys.argv[1])), load(Path(sys.argv[2]))
    policies = ("round-robin", "random", "p2c", "prefix-hash", "cost")
    print("p99 TTFT ms / hit rate, seed 1. *old*: the committed sweep of 2026-11-29 (round-robin "
          "and random dispatched by the harness straight to the engines); *new*: this sweep, "
          "every policy through Pharos.\n")
    print("| workload | rate | " + " | ".join(
        f"{p} old | {p} new" if p in ("round-robin", "random", "cost") else f"{p} new"
        for p in policies) + " |")
    print("| --- | ---: | " + " | ".join(
        "---: | ---:" if p in ("round-robin", "random", "cost") else "---:"
        for p in policies) + " |")
    for workload, rate in sorted({(w, r) for w, r, _ in new}, key=lambda x: (x[0], float(x[1]))):
        cells = []
        for p in policies:
            if p in ("round-robin", "random", "cost"):
                cells.append(cell(old.get((workload, rate, p))))
            cells.append(cell(new.get((workload, rate, p))))
        print(f"| {workload} | {rate} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
