"""The tables of this directory's README from its result files and load.tsv alone: each
restarted instance's hit rate over its first probe interval (5 s from /healthz 200 again)
against its own before its SIGTERM (as ``../peers-2026-12-02b/summarize_roots.py``), per run
(3 restarts), per restart, and pooled per variant, with the load average at each run's start.

Usage: python3 summarize_restart13.py RESULTS_DIR
       (RESULTS_DIR/rep<R>/<variant>/w1/6/cost-seed<N>.json, RESULTS_DIR/load.tsv)
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path
from typing import Any

MISS_BELOW = 1600  # of a 2,000-token system prompt, as in ../peers-2026-12-02/
WINDOW = 5.0
GOAL = 0.90
VARIANTS = ("restart-peers-state", "restart-peers", "restart-state-three", "restart-state")


def counted_ok(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in doc["records"] if not r["warmup"] and r["status"] == 200
            and r["error"] is None]


def hit(records: list[dict[str, Any]]) -> float | None:
    pairs = [(r["cached_tokens"], r["prompt_tokens"]) for r in records
             if r["cached_tokens"] is not None and r["prompt_tokens"]]
    prompt = sum(p for _, p in pairs)
    return sum(c for c, _ in pairs) / prompt if prompt else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fmt(v: float | None, f: str = ".3f") -> str:
    return "-" if v is None else format(v, f)


def windows(doc: dict[str, Any]) -> list[tuple[list[Any], list[Any], list[Any], float]]:
    """Per restart that came back: before, first 5 s, the others' same 5 s; down seconds."""
    ok = counted_ok(doc)
    out = []
    for r in doc["summary"]["restarts"]:
        url, term, back = r["url"], r["term_at"], r.get("healthy_at")
        if back is None:
            continue
        out.append(([x for x in ok if x["url"] == url and x["sent"] < term],
                    [x for x in ok if x["url"] == url and back <= x["sent"] < back + WINDOW],
                    [x for x in ok if x["url"] != url and back <= x["sent"] < back + WINDOW],
                    back - term))
    return out


def main() -> None:
    root = Path(sys.argv[1])
    loads = {(row["rep"], row["seed"], row["variant"]): row
             for row in csv.DictReader((root / "load.tsv").open(), delimiter="\t")}
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for path in sorted(root.glob("rep*/*/w1/6/cost-seed*.json")):
        rep, variant = path.parts[-5][3:], path.parts[-4]
        seed = path.stem.rsplit("seed", 1)[1]
        doc = json.loads(path.read_text())
        runs[variant].append({"rep": rep, "seed": seed, "doc": doc,
                              "load": loads.get((rep, seed, variant), {}),
                              "windows": windows(doc)})
    print("| variant | rep | seed | start UTC | load 1 min (start → end) | commit | before "
          "| first 5 s (n) | regained (run) | regained per restart | predicted-held / other "
          "misses | errors | restarts back | TTFT p50 of hits, s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for v in VARIANTS:
        for run in sorted(runs[v], key=lambda r: (r["rep"], int(r["seed"]))):
            doc, ws, load = run["doc"], run["windows"], run["load"]
            b = [x for w in ws for x in w[0]]
            a = [x for w in ws for x in w[1]]
            miss = [x for x in a if (x["cached_tokens"] or 0) < MISS_BELOW]
            held = [x for x in miss if "cached tok" in (x["reason"] or "")]
            run["regained"] = ratio(hit(a), hit(b))
            run["per_restart"] = [ratio(hit(w[1]), hit(w[0])) for w in ws]
            hits = [x["ttft"] for x in counted_ok(doc) if x.get("ttft") is not None
                    and (x["cached_tokens"] or 0) >= MISS_BELOW]
            commit = doc["spec"].get("git", doc["spec"]).get("commit") or "-"
            dirty = doc["spec"].get("git", doc["spec"]).get("dirty")
            print(f"| {v} | {run['rep']} | {run['seed']} | {load.get('start_utc', '-')} | "
                  f"{load.get('load1', '-')} → {load.get('load1_end', '-')} | "
                  f"{str(commit)[:7]}{' dirty' if dirty else ''} | {fmt(hit(b))} | "
                  f"{fmt(hit(a))} ({len(a)}) | {fmt(run['regained'], '.2f')} | "
                  f"{' '.join(fmt(x, '.2f') for x in run['per_restart'])} | "
                  f"{len(held)} / {len(miss) - len(held)} | "
                  f"{sum(doc['summary']['errors'].values())} | "
                  f"{len(ws)}/{len(doc['summary']['restarts'])} | "
                  f"{fmt(statistics.median(hits) if hits else None, '.2f')} |")
    print()
    print(f"| variant | runs | restarts back | regained per run: median (min) | per restart: "
          f"median (min) | pooled: first 5 s / before | down s (median) | goal ≥ {GOAL:.2f} |")
    print("|---|---|---|---|---|---|---|---|")
    for v in VARIANTS:
        if not runs[v]:
            continue
        per_run = [r["regained"] for r in runs[v] if r["regained"] is not None]
        per_restart = [x for r in runs[v] for x in r["per_restart"] if x is not None]
        ws = [w for r in runs[v] for w in r["windows"]]
        pooled = ratio(hit([x for w in ws for x in w[1]]), hit([x for w in ws for x in w[0]]))
        med = statistics.median(per_run) if per_run else None
        verdict = "-" if med is None else (
            "met" if med >= GOAL and pooled is not None and pooled >= GOAL else "not met")
        print(f"| {v} | {len(runs[v])} | {len(ws)} | {fmt(med, '.2f')} "
              f"({fmt(min(per_run) if per_run else None, '.2f')}) | "
              f"{fmt(statistics.median(per_restart) if per_restart else None, '.2f')} "
              f"({fmt(min(per_restart) if per_restart else None, '.2f')}) | {fmt(pooled, '.2f')}"
              f" | {fmt(statistics.median(w[3] for w in ws) if ws else None, '.1f')} | "
              f"{verdict} |")


if __name__ == "__main__":
    main()
