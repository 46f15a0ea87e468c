"""One ``decide`` row of ``pharos bench pick`` from whichever tree is on PYTHONPATH (before
or after), as JSON on stdout: the same fleet, chat and timing as the bench's own row, with
the min added to the summary (the tree before this change reports no min)."""

from __future__ import annotations

import json
import random
import sys

from pharos.sim import bench


def summary(us: list[float]) -> dict[str, float]:
    """The bench's summary plus the min."""
    return {"p50_us": round(bench.percentile(us, 50), 1),
            "p99_us": round(bench.percentile(us, 99), 1), "min_us": round(us[0], 1)}


def main() -> None:
    """``decide_ab.py ROUNDS``: the bench's decide row over ROUNDS // 4 decisions."""
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    bench._summary = summary
    rng = random.Random(1)
    for _ in range(64):
        bench.mixed_candidates(64, rng)
    words = ("harbour", "pilot", "tide", "beacon", "channel", "buoy", "vessel", "keel")
    per = 8000 * bench.BYTES_PER_TOKEN // 16
    messages = []
    for i in range(16):
        text = " ".join(rng.choice(words) for _ in range(per // 7 + 1))[:per]
        messages.append({"role": "system" if i == 0 else ("user", "assistant")[i % 2],
                         "content": text})
    ch = bench.chain("m", messages, None, None)
    row = bench._scheduler_decide(64, ch, 8000, rounds, random.Random(len(ch)))
    print(json.dumps({"tree": bench.__file__, "decide": row}))


if __name__ == "__main__":
    main()
