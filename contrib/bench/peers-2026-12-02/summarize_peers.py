"""The tables of this directory's README from its result files alone.

Usage: python3 summarize_peers.py RESULTS_DIR   (RESULTS_DIR/<variant>/w1/6/cost-seed<N>.json)

Misses: counted requests with fewer than 1,600 of their 2,000-token system prompt cached
(as in ../w1-2026-12-02b/). "predicted" misses are those Pharos routed expecting a cached
prefix (its reason names cached tokens): the engine had pushed the prompt out.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

MISS_BELOW = 1600
WINDOW = 5.0


def load(root: Path, variant: str) -> dict[int, dict[str, Any]]:
    out = {}
    for path in sorted((root / variant / "w1" / "6").glob("cost-seed*.json")):
        out[int(path.stem.rsplit("seed", 1)[1])] = json.loads(path.read_text())
    return out


def counted_ok(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in doc["records"] if not r["warmup"] and r["status"] == 200
            and r["error"] is None]


def hit(records: list[dict[str, Any]]) -> float | None:
    pairs = [(r["cached_tokens"], r["prompt_tokens"]) for r in records
             if r["cached_tokens"] is not None and r["prompt_tokens"]]
    prompt = sum(p for _, p in pairs)
    return sum(c for c, _ in pairs) / prompt if prompt else None


def fmt(v: float | None, f: str = ".3f") -> str:
    return "-" if v is None else format(v, f)


def steady(root: Path, variants: list[str]) -> None:
    print("| variant | seed | hit rate | misses (predicted held) | p99 TTFT ms | errors "
          "| send lag p99 ms |")
    print("|---|---|---|---|---|---|---|")
    for v in variants:
        rates = []
        for seed, doc in load(root, v).items():
            s = doc["summary"]
            ok = counted_ok(doc)
            miss = [r for r in ok if (r["cached_tokens"] or 0) < MISS_BELOW]
            predicted = [r for r in miss if "cached tok" in (r["reason"] or "")]
            rates.append(s["hit_rate"])
            print(f"| {v} | {seed} | {fmt(s['hit_rate'])} | {len(miss)} ({len(predicted)}) | "
                  f"{s['ttft_s']['p99'] * 1000:.0f} | {sum(s['errors'].values())} | "
                  f"{s['send_lag_s']['p99'] * 1000:.0f} |")
        if rates:
            print(f"| {v} | median | {fmt(statistics.median(rates))} | | | | |")


def restarts(root: Path, variants: list[str]) -> None:
    """Each restart: the instance's down time (SIGTERM to /healthz 200), its hit rate before
    (warm-up's end to SIGTERM), over its first probe interval back (5 s from /healthz 200),
    regained = first 5 s / before, and the other instances over the same 5 s. Then per
    variant, pooled over every restart of every seed (cached over prompt tokens of all the
    windows' requests): first 5 s against before and against the others."""
    print("| variant | seed | instance | down s | before: hit (n) | first 5 s: hit (n) | "
          "regained | others, same 5 s | errors in run |")
    print("|---|---|---|---|---|---|---|---|---|")
    pooled: dict[str, tuple[list[Any], list[Any], list[Any], list[float]]] = {}
    for v in variants:
        before: list[Any] = []
        after: list[Any] = []
        others: list[Any] = []
        downs: list[float] = []
        for seed, doc in load(root, v).items():
            ok = counted_ok(doc)
            errors = sum(doc["summary"]["errors"].values())
            for r in doc["summary"]["restarts"]:
                url, term, back = r["url"], r["term_at"], r.get("healthy_at")
                if back is None:
                    print(f"| {v} | {seed} | {r['instance']} | did not come back: "
                          f"{r.get('error')} | | | | | {errors} |")
                    continue
                downs.append(back - term)
                b = [x for x in ok if x["url"] == url and x["sent"] < term]
                a = [x for x in ok if x["url"] == url and back <= x["sent"] < back + WINDOW]
                o = [x for x in ok if x["url"] != url and back <= x["sent"] < back + WINDOW]
                before += b
                after += a
                others += o
                hb, ha = hit(b), hit(a)
                ratio = ha / hb if ha is not None and hb else None
                print(f"| {v} | {seed} | {r['instance']} | {back - term:.1f} | {fmt(hb)} "
                      f"({len(b)}) | {fmt(ha)} ({len(a)}) | {fmt(ratio, '.2f')} | "
                      f"{fmt(hit(o))} | {errors} |")
        pooled[v] = (before, after, others, downs)
    print()
    print("| variant | restarts | down s (median) | before | first 5 s (n) | first 5 s / "
          "before | others, same windows | first 5 s / others |")
    print("|---|---|---|---|---|---|---|---|")
    for v, (b, a, o, downs) in pooled.items():
        hb, ha, ho = hit(b), hit(a), hit(o)
        print(f"| {v} | {len(downs)} | {fmt(statistics.median(downs) if downs else None, '.1f')}"
              f" | {fmt(hb)} | {fmt(ha)} ({len(a)}) | "
              f"{fmt(ha / hb if ha is not None and hb else None, '.2f')} | {fmt(ho)} | "
              f"{fmt(ha / ho if ha is not None and ho else None, '.2f')} |")


def main() -> None:
    root = Path(sys.argv[1])
    steady(root, ["one", "three-peers-before", "three-peers", "three-alone"])
    print()
    restarts(root, ["restart-peers-state", "restart-peers", "restart-state", "restart-none"])


if __name__ == "__main__":
    main()
