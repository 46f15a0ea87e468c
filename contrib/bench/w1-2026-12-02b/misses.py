"""Per-request miss breakdown of a W1 run from a decision trace (issue 10 item 5).

The trace is written by Pharos with ``decision-trace.diff`` applied (not part of Pharos: it
writes one JSON line per finished request to ``$PHAROS_TRACE.<pid>.jsonl`` with the decision's
candidates as the scheduler built them: the index's match, the match after stale predictions
were dropped, eviction pricing, free slots, in-flight counts, KV free tokens, each candidate's
est_ttft terms and set-aside reason, the learned retention, and the engine's cached tokens).

    python3 misses.py TRACE.jsonl [...]          # V=1 for one line per miss

A request is a miss when fewer than 1,600 of its system prompt's 2,000 tokens were cached
(the engine caches whole 16-token blocks). Requests of the first 20 s (the warm-up) are
counted apart. Each miss gets the first category that applies:

* first touch: no request with this system prompt was sent before;
* predicted, evicted by pool: the chosen engine was predicted to hold the prompt and did not
  (the cache pushed it out: other prompts, running requests' blocks);
* held elsewhere, set aside (bounded load) / tie window / holder's wait higher (kv
  headroom when the holder's KV free tokens could not take the prompt): another candidate
  was predicted to hold it and lost for that reason;
* held elsewhere per index but dropped as pushed out (stale): the index said some engine held
  it, the learned retention said it had been pushed out since (``RootCaches.pushed_out``);
* held nowhere: no engine was believed to hold it.
"""

from __future__ import annotations

import collections
import json
import os
import sys

ROOT_TOKENS = 2000
HELD = 0.8 * ROOT_TOKENS
WARMUP = 20.0


def analyse(path: str) -> dict:
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    header, rows = rows[0], rows[1:]
    rows.sort(key=lambda r: r["now"])
    t0 = rows[0]["now"]
    label: dict[int, str] = {}
    seen: set[int] = set()
    cats: collections.Counter[str] = collections.Counter()
    per_prompt: dict[str, collections.Counter[int]] = collections.defaultdict(
        collections.Counter)
    n = hits = warm_misses = 0
    lines = []
    for r in rows:
        root = r["root"]
        label.setdefault(root, f"P{len(label)}")
        first = root not in seen
        seen.add(root)
        t = r["now"] - t0
        hit = (r["cached"] or 0) >= HELD
        if t < WARMUP:
            warm_misses += not hit
            continue
        n += 1
        per_prompt[label[root]][r["target"]] += 1
        if hit:
            hits += 1
            continue
        win = next(c for c in r["cands"] if c["t"] == r["target"])
        others = [c for c in r["cands"] if c["t"] != r["target"]]
        holders = [c for c in others if c["matched"] >= HELD]
        if first:
            cat = "first touch"
        elif win["matched"] >= HELD:
            cat = "predicted, evicted by pool"
        elif holders:
            h = min(holders, key=lambda c: c["est"] if c["est"] is not None else 1e9)
            if h["aside"]:
                cat = f"held elsewhere, set aside ({h['aside']})"
            elif "tie" in r["reason"] and h["est"] <= win["est"] * 1.1 + 0.001:
                cat = "held elsewhere, tie window"
            elif h["kvfree"] is not None and h["kvfree"] < r["prompt"] - h["matched"]:
                cat = "held elsewhere, holder's wait higher (kv headroom)"
            else:
                cat = "held elsewhere, holder's wait higher"
        elif any(c["idx"] >= HELD for c in r["cands"]):
            cat = "held elsewhere per index but dropped as pushed out (stale)"
        else:
            cat = "held nowhere"
        cats[cat] += 1
        lines.append(f"{t:5.1f}s {label[root]} -> engine {r['target']} cached {r['cached']}: "
                     f"{cat} | {r['reason']}")
    return {"pharos": header.get("pharos"), "n": n, "hits": hits, "categories": cats,
            "warmup_misses": warm_misses, "lines": lines,
            "engines_per_prompt": {k: dict(v) for k, v in sorted(per_prompt.items())}}


def main() -> None:
    for path in sys.argv[1:]:
        a = analyse(path)
        print(f"{path} ({a['pharos']}): {a['n']} requests after the warm-up, "
              f"{a['n'] - a['hits']} misses ({a['warmup_misses']} in the warm-up)")
        for cat, k in a["categories"].most_common():
            print(f"  {k:3d}  {cat}")
        print("  requests per engine, by system prompt:", a["engines_per_prompt"])
        if os.environ.get("V"):
            for line in a["lines"]:
                print("   ", line)


if __name__ == "__main__":
    main()
