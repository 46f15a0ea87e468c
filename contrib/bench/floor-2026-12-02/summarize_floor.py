"""Markdown tables of the floor runs here (run-*.json) and the bad-input run (badinput-*.json):
``python summarize_floor.py``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def floor_table(runs: list[tuple[str, dict[str, Any]]]) -> None:
    """One row per router and run."""
    print("| run | load 1 min (start, end) | path | p50 ms | +p50 | +p99 | CPU/req @1 | "
          "CPU/req @32 | net @32 | idle CPU ms/s | req/s @32 (rounds) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in runs:
        load = f"{r['load_average_start'][0]}, {r['load_average_end'][0]}"
        for t, v in r["targets"].items():
            rounds = ", ".join(f"{x['req_per_s']:.0f}" for x in v["rounds"])
            net = v.get("cpu_ms_per_request_net")
            print(f"| {name} | {load} | {t} | {v['one_client_ms']['p50']:.3f} | "
                  f"{v['added_ms']['p50']:+.3f} | {v['added_ms']['p99']:+.3f} | "
                  f"{v['cpu_ms_per_request_one_client']:.3f} | {v['cpu_ms_per_request']:.3f} | "
                  f"{'' if net is None else f'{net:.3f}'} | "
                  f"{v.get('idle_cpu_ms_per_s', '')} | {rounds} |")


def stream_table(runs: list[tuple[str, dict[str, Any]]]) -> None:
    """The 500-token stream's gaps."""
    print("| run | path | gap p50 ms | gap p99 ms | mean gap ms | read together | "
          "first to last ms |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in runs:
        s = r.get("stream")
        if not s:
            continue
        for t in ("direct", "pharos"):
            v = s[t]
            print(f"| {name} | {t} | {v['gap_ms']['p50']:.3f} | {v['gap_ms']['p99']:.3f} | "
                  f"{v.get('gap_mean_ms', '')} | {v.get('gaps_zero_share', '')} | "
                  f"{v['first_to_last_ms_median']:.1f} |")


def soak_table(runs: list[tuple[str, dict[str, Any]]]) -> None:
    """The soaks' RSS."""
    print("| run | requests | not 200 | req/s | RSS after warm-up MB | end | max | growth |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in runs:
        k = r.get("soak")
        if k:
            print(f"| {name} | {k['requests']} | {k['not_ok']} | {k['req_per_s']} | "
                  f"{k['rss_after_warmup_mb']} | {k['rss_end_mb']} | {k['rss_max_mb']} | "
                  f"{k['rss_growth_mb']} |")


def main() -> int:
    runs = [(p.stem, json.loads(p.read_text())) for p in sorted(HERE.glob("run-*.json"))
            if p.stat().st_size]
    if not runs:
        print("no run-*.json here", file=sys.stderr)
        return 1
    floor_table(runs)
    print()
    stream_table(runs)
    print()
    soak_table(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
