"""The tables of this directory's README from its result files alone: each restarted
instance's hit rate over its first probe interval (5 s from /healthz 200) against its own
before its SIGTERM, pooled per variant, and its misses in that window split by whether Pharos
predicted the prompt held there (its reason names cached tokens) — the misses the roots part
is meant to remove.

Usage: python3 summarize_roots.py RESULTS_DIR   (RESULTS_DIR/<variant>/w1/6/cost-seed<N>.json)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

MISS_BELOW = 1600  # of a 2,000-token system prompt, as in ../peers-2026-12-02/
WINDOW = 5.0
VARIANTS = ("restart-peers-state-before", "restart-peers-state", "restart-peers-before",
            "restart-peers")


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


def windows(doc: dict[str, Any]) -> tuple[list[Any], list[Any], list[Any], list[float]]:
    """Before, first 5 s and the others' same 5 s, over a run's restarts; down times."""
    ok = counted_ok(doc)
    before: list[Any] = []
    after: list[Any] = []
    others: list[Any] = []
    downs: list[float] = []
    for r in doc["summary"]["restarts"]:
        url, term, back = r["url"], r["term_at"], r.get("healthy_at")
        if back is None:
            continue
        downs.append(back - term)
        before += [x for x in ok if x["url"] == url and x["sent"] < term]
        after += [x for x in ok if x["url"] == url and back <= x["sent"] < back + WINDOW]
        others += [x for x in ok if x["url"] != url and back <= x["sent"] < back + WINDOW]
    return before, after, others, downs


def main() -> None:
    root = Path(sys.argv[1])
    print("| variant | seed | before | first 5 s (n) | regained | predicted-held misses "
          "| other misses | errors | restarts back |")
    print("|---|---|---|---|---|---|---|---|---|")
    pooled = {}
    for v in VARIANTS:
        acc: tuple[list[Any], list[Any], list[Any], list[float]] = ([], [], [], [])
        for seed, doc in load(root, v).items():
            parts = windows(doc)
            for into, part in zip(acc, parts, strict=True):
                into += part
            b, a = parts[0], parts[1]
            miss = [x for x in a if (x["cached_tokens"] or 0) < MISS_BELOW]
            held = [x for x in miss if "cached tok" in (x["reason"] or "")]
            hb, ha = hit(b), hit(a)
            print(f"| {v} | {seed} | {fmt(hb)} | {fmt(ha)} ({len(a)}) | "
                  f"{fmt(ha / hb if ha is not None and hb else None, '.2f')} | {len(held)} | "
                  f"{len(miss) - len(held)} | {sum(doc['summary']['errors'].values())} | "
                  f"{len(parts[3])}/{len(doc['summary']['restarts'])} |")
        pooled[v] = acc
    print()
    print("| variant | restarts | down s (median) | before | first 5 s (n) | first 5 s / "
          "before | others, same windows | first 5 s / others | misses: predicted held "
          "/ other |")
    print("|---|---|---|---|---|---|---|---|---|")
    for v, (b, a, o, downs) in pooled.items():
        if not downs:
            continue
        hb, ha, ho = hit(b), hit(a), hit(o)
        miss = [x for x in a if (x["cached_tokens"] or 0) < MISS_BELOW]
        n_held = sum(1 for x in miss if "cached tok" in (x["reason"] or ""))
        print(f"| {v} | {len(downs)} | {statistics.median(downs):.1f} | {fmt(hb)} | "
              f"{fmt(ha)} ({len(a)}) | {fmt(ha / hb if ha is not None and hb else None, '.2f')}"
              f" | {fmt(ho)} | {fmt(ha / ho if ha is not None and ho else None, '.2f')} | "
              f"{n_held} / {len(miss) - n_held} |")


if __name__ == "__main__":
    main()
