"""Table of ab.sh's rounds: per arm, the median and range over rounds of the decide row's
min, p50 and p99 (us), and what each arm's policy was (``machine.policy``).

    python summarize_pick.py AB_DIR
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def main() -> None:
    """Entry point: see the module docstring."""
    out = Path(sys.argv[1])
    print("| arm | policy | rounds | min us: median (range) | p50 us: median (range) "
          "| p99 us: median (range) |")
    print("|---|---|---|---|---|---|")
    for arm in ("before", "interpreted", "compiled"):
        rows = [json.loads(p.read_text()) for p in sorted(out.glob(f"{arm}-*.json"))]
        if not rows:
            continue
        policy = {str(r["machine"].get("policy")) for r in rows}
        cells = []
        for key in ("min_us", "p50_us", "p99_us"):
            v = [r["decide"][key] for r in rows]
            cells.append(f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})")
        print(f"| {arm} | {', '.join(sorted(policy))} | {len(rows)} | " + " | ".join(cells)
              + " |")


if __name__ == "__main__":
    main()
