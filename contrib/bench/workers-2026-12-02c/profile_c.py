"""Where a worker's time goes under the bench's load: py-spy (a sampling profiler outside the
process, bench-only, ``pip install --target DIR py-spy``) on each Pharos process while wrk
runs, for ``workers: 1`` and ``workers: 2``; per process the share of its busy samples whose
stack passes through each group of frames (``GROUPS``), and the top functions by own samples.

``python profile_c.py --py-spy DIR/bin/py-spy --out results/profile.json``
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_workers_c import (
    Nginx,
    children,
    start_pharos,
    stop_pharos,
    wrk,
)

#: Frame groups: a sample counts in a group when any frame of its stack matches.
GROUPS: dict[str, tuple[str, ...]] = {
    "peer exchange (pharos/peer/)": ("pharos/peer/",),
    "merge of a peer's ops": ("merge_prefix (", "merge_dispatched (", "merge_gauges ("),
    "treq (engine leg)": ("treq/",),
    "scheduler (pharos/sched.py)": ("pharos/sched.py",),
}
#: py-spy samples per second: a process busy all the time gives RATE x seconds samples (idle
#: samples are left out, so a group's share is of the process's busy time).
RATE = 200


def summarize(raw: str) -> dict[str, Any]:
    total = 0
    groups: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        for name, needles in GROUPS.items():
            if any(x in stack for x in needles):
                groups[name] += n
        own[stack.split(";")[-1]] += n
    return {"busy_samples": total,
            "share": {k: round(v / total, 4) for k, v in groups.items()} if total else {},
            "top_own": [(k, round(v / total, 4)) for k, v in own.most_common(15)]}


def main() -> int:
    p = argparse.ArgumentParser(prog="profile_c.py")
    p.add_argument("--py-spy", required=True)
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    result: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "loadavg_start": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="profile-workers-c-") as d:
        tmp = Path(d)
        nginx = Nginx(tmp)
        try:
            for workers in (1, 2):
                proc, port = start_pharos(workers, nginx, tmp, dict(os.environ), f"p{workers}")
                try:
                    pids = [proc.pid] if workers == 1 else children(proc.pid)
                    wrk([port], 3, a.connections, False)
                    spies = [subprocess.Popen(
                        [a.py_spy, "record", "--nonblocking", "-r", str(RATE), "-f", "raw",
                         "-d", str(a.seconds), "-p", str(pid), "-o", str(tmp / f"{pid}.txt")],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for pid in pids]
                    load = wrk([port], a.seconds + 2, a.connections, False)
                    for s in spies:
                        s.wait(timeout=60)
                    result[f"workers_{workers}"] = {
                        "rps_under_profiler": round(load["rps"], 1),
                        "processes": {str(pid): summarize((tmp / f"{pid}.txt").read_text())
                                      for pid in pids}}
                finally:
                    stop_pharos(proc)
        finally:
            nginx.stop()
    result["loadavg_end"] = os.getloadavg()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
