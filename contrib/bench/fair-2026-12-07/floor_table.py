"""ab_release.sh's OUT (``pharos bench overhead --floor`` before and after, interleaved) as a
table: Pharos's CPU a request at 32 clients, its added p50 / p99 at one client, and the same
for the Klein + treq floor. Usage: floor_table.py OUT"""

import glob
import json
import os
import sys

out = sys.argv[1]
print("| run | tree | Pharos CPU ms/req at 32 | added p50 / p99 ms at one client "
      "| Klein + treq CPU / added p50 | Pharos over Klein + treq: CPU / p50 |")
print("|---|---|---|---|---|---|")
for p in sorted(glob.glob(os.path.join(out, "*-*.json")),
                key=lambda p: (os.path.basename(p).split("-")[1], p)):
    arm, rep = os.path.basename(p)[:-5].split("-")
    with open(p) as f:
        t = json.load(f)["targets"]
    ph, kt = t["pharos"], t["klein-treq"]
    print(f"| {rep} | {arm} | {ph['cpu_ms_per_request']:.3f} | "
          f"{ph['added_ms']['p50']:.2f} / {ph['added_ms']['p99']:.2f} | "
          f"{kt['cpu_ms_per_request']:.3f} / {kt['added_ms']['p50']:.2f} | "
          f"{ph['cpu_ms_per_request'] - kt['cpu_ms_per_request']:+.2f} / "
          f"{ph['added_ms']['p50'] - kt['added_ms']['p50']:+.2f} |")
