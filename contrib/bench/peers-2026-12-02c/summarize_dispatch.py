"""The tables of this directory's README from its result files alone.

Usage: python3 summarize_dispatch.py RESULTS_DIR [RESULTS_DIR ...]
       (each RESULTS_DIR/<variant>/w1/6/cost-seed<N>.json; several dirs are pooled per
       variant and seed, in the order given, as separate runs)

A miss is a counted request with fewer than 1,600 of its 2,000-token system prompt cached
(as in ../peers-2026-12-02/). "predicted" misses were routed expecting a cached prefix (the
reason names cached tokens). Each miss is also classed by what the fleet did with its system
prompt just before (the prompt is rebuilt from the seed: records carry no text):
  raced      another instance had sent the same prompt to another engine < 1 s before
  self-raced this instance had (and no other instance)
  evicted    the prompt's last send went to this same engine (the engine pushed it out)
  moved      the prompt's last send, >= 1 s before, went to another engine
The hits' median TTFT says how loaded the machine was during a run (a hit on an idle double
takes well under 100 ms; other sessions' work on the two cores slows the doubles).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from pharos.sim.workloads import w1_shared_system

MISS_BELOW = 1600
RACE_SEC = 1.0
CLASSES = ("raced", "self-raced", "evicted", "moved", "first")


def load(roots: list[Path], variant: str) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for root in roots:
        for path in sorted((root / variant / "w1" / "6").glob("cost-seed*.json")):
            seed = int(path.stem.rsplit("seed", 1)[1])
            out.setdefault(seed, []).append(json.loads(path.read_text()))
    return out


def classes(doc: dict[str, Any]) -> Counter[str]:
    """Each counted miss's class (see the module docstring)."""
    sp = doc["spec"]
    reqs = w1_shared_system(sp["seed"], sp["rate"], sp["duration"],
                            prompt_tokens=tuple(sp["workload_args"]["prompt_tokens"]))
    system = {i: r.messages[0]["content"] for i, r in enumerate(reqs)}
    recs = sorted((r for r in doc["records"] if r["sent"] is not None), key=lambda r: r["sent"])
    out: Counter[str] = Counter()
    for j, r in enumerate(recs):
        if r["warmup"] or r["status"] != 200 or r["error"] is not None:
            continue
        if (r["cached_tokens"] or 0) >= MISS_BELOW:
            continue
        prev = [p for p in recs[:j] if system[p["index"]] == system[r["index"]]]
        recent = [p for p in prev if r["sent"] - p["sent"] < RACE_SEC
                  and p["engine"] != r["engine"]]
        if any(p["url"] != r["url"] for p in recent):
            out["raced"] += 1
        elif recent:
            out["self-raced"] += 1
        elif not prev:
            out["first"] += 1
        elif prev[-1]["engine"] == r["engine"]:
            out["evicted"] += 1
        else:
            out["moved"] += 1
    return out


def steady(roots: list[Path], variants: list[str]) -> dict[str, dict[int, list[float]]]:
    print("| variant | seed | commit | hit rate | misses (predicted held) | "
          + " | ".join(CLASSES) + " | p99 TTFT ms | hits' p50 TTFT ms | errors |")
    print("|---|---|---|---|---|" + "---|" * len(CLASSES) + "---|---|---|")
    rates: dict[str, dict[int, list[float]]] = {}
    for v in variants:
        for seed, docs in sorted(load(roots, v).items()):
            for doc in docs:
                s = doc["summary"]
                ok = [r for r in doc["records"] if not r["warmup"] and r["status"] == 200
                      and r["error"] is None]
                miss = [r for r in ok if (r["cached_tokens"] or 0) < MISS_BELOW]
                predicted = [r for r in miss if "cached tok" in (r["reason"] or "")]
                kinds = classes(doc)
                hits = sorted(r["ttft"] for r in ok if (r["cached_tokens"] or 0) >= MISS_BELOW
                              and r["ttft"] is not None)
                quiet = f"{1000 * hits[len(hits) // 2]:.0f}" if hits else "-"
                rates.setdefault(v, {}).setdefault(seed, []).append(s["hit_rate"])
                print(f"| {v} | {seed} | {doc['spec']['commit'][:7]} | {s['hit_rate']:.3f} | "
                      f"{len(miss)} ({len(predicted)}) | "
                      + " | ".join(str(kinds[c]) for c in CLASSES)
                      + f" | {s['ttft_s']['p99'] * 1000:.0f} | {quiet} | "
                      f"{sum(s['errors'].values())} |")
    print()
    return rates


def losses(rates: dict[str, dict[int, list[float]]], base: str, variants: list[str]) -> None:
    """Per seed, the loss in points against ``base`` (the mean of its runs of that seed),
    then per variant the median over seeds of the per-seed mean hit rate and of the loss."""
    one = {seed: statistics.mean(r) for seed, r in rates.get(base, {}).items()}
    print(f"| variant | per-seed loss against {base}, points | median hit rate | "
          "median loss | seeds within 5 |")
    print("|---|---|---|---|---|")
    for v in [base, *variants]:
        per = {seed: statistics.mean(r) for seed, r in rates.get(v, {}).items()}
        lost = {seed: 100 * (one[seed] - h) for seed, h in per.items() if seed in one}
        if not per or not lost:
            continue
        text = " / ".join(f"{lost[s]:+.1f}" for s in sorted(lost))
        print(f"| {v} | {text} | {statistics.median(per.values()):.3f} | "
              f"{statistics.median(lost.values()):.1f} | "
              f"{sum(1 for x in lost.values() if x <= 5)} of {len(lost)} |")


def main() -> None:
    roots = [Path(p) for p in sys.argv[1:]]
    variants = ["three-peers-before", "three-peers", "three-peers-ret", "three-peers-retonly"]
    rates = steady(roots, ["one", *variants])
    losses(rates, "one", variants)


if __name__ == "__main__":
    main()
