"""Placement decisions per proxied request in a Pharos process, from a cProfile stats file
written by ``HOT_CPROFILE=FILE PYTHONPATH=<tree> python ../hotpath-2026-12-02/hotload.py``
(twistd's ``--profiler cprofile --savestats``): calls of ``Scheduler.decide`` over calls of
``Scheduler.acquire`` (one per request sent to an engine), with the queue machinery's calls.

Usage: python decisions_per_request.py LABEL STATS [LABEL STATS ...]  (one JSON line each)
"""

from __future__ import annotations

import json
import pstats
import sys

NAMES = ("acquire", "decide", "_try_place", "_grant_one", "_pass", "kick", "_kick", "release")


def counts(path: str) -> dict[str, int]:
    """Calls of each of ``NAMES`` in ``pharos/sched.py``."""
    out: dict[str, int] = {}
    stats = pstats.Stats(path).stats  # type: ignore[attr-defined]
    for (filename, _, name), (_, ncalls, *_rest) in stats.items():
        if filename.endswith("pharos/sched.py") and name in NAMES:
            out[name] = ncalls
    return out


def main() -> None:
    args = sys.argv[1:]
    for label, path in zip(args[::2], args[1::2], strict=True):
        n = counts(path)
        print(json.dumps({"label": label, "calls": n,
                          "decisions_per_request": round(n["decide"] / n["acquire"], 3)}))


if __name__ == "__main__":
    main()
