"""Per fleet and variant: loads per 1,000 requests per seed and the medians of loads, p50 and
p95 TTFT over seeds (``rows.json`` of each ``pharos bench placement --out DIR/VARIANT``).

Usage: python3 table.py DIR VARIANT...   (a markdown table on stdout)
"""

import json
import statistics
import sys
from pathlib import Path

FLEETS = ("ollama-3h-8m", "ollama-2h-8m", "ollama-4h-16m", "llama-swap-3h-8m")


def main() -> None:
    root, variants = Path(sys.argv[1]), sys.argv[2:]
    print("| fleet | variant | loads/1000 (seeds 1-5) | median loads | p50 s | p95 s "
          "| tail p95 s |")
    print("|---|---|---|---|---|---|---|")
    for fleet in FLEETS:
        for v in variants:
            path = root / v / fleet / "rows.json"
            if not path.exists():
                continue
            rows = sorted((r for r in json.loads(path.read_text()) if r["policy"] == "cost"),
                          key=lambda r: r["seed"])
            med = {k: statistics.median(r[k] for r in rows)
                   for k in ("loads_per_1000", "p50", "p95", "tail_p95")}
            print(f"| {fleet} | {v} | {' / '.join(str(int(r['loads'])) for r in rows)} | "
                  f"{med['loads_per_1000']:.0f} | {med['p50']:.2f} | {med['p95']:.2f} | "
                  f"{med['tail_p95']:.2f} |")


if __name__ == "__main__":
    main()
