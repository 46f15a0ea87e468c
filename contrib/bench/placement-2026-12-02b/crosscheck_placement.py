"""The virtual-time harness against a real-time loopback run of the same fleet (issue 15 item 5).

Reads ``realtime/multi-model/4.8/<policy>-seed1.json`` (``pharos bench compare``: three Ollama
doubles and Pharos on loopback, 4x compressed) and ``ollama-3h-8m-x4-nomem/runs/<policy>-
seed1.json`` (``pharos bench placement --compress 4 --no-pharos-memory``), and prints for each
policy: whether the requests are the same (model of each, in order), TTFT p50 / p95 (compressed
seconds) and the dispatches Pharos made to a target it saw cold, per 1,000 requests (real time:
the decision's reason names the winner's state; virtual: ``Lease.cold``).

    PYTHONPATH=. .venv/bin/python contrib/bench/placement-2026-12-02b/crosscheck_placement.py
"""

from __future__ import annotations

import json
from pathlib import Path

from pharos.bench.placement import pct

HERE = Path(__file__).resolve().parent


def main() -> None:
    print(f"{'policy':<12} {'same reqs':>9} {'p50 real':>9} {'p50 virt':>9} {'p95 real':>9} "
          f"{'p95 virt':>9} {'cold/1000 real':>15} {'cold/1000 virt':>15} {'loads/1000 virt':>16}")
    for policy in ("cost", "random", "round-robin"):
        real_path = HERE / "realtime" / "multi-model" / "4.8" / f"{policy}-seed1.json"
        virt_path = HERE / "ollama-3h-8m-x4-nomem" / "runs" / f"{policy}-seed1.json"
        if not real_path.exists() or not virt_path.exists():
            print(f"{policy:<12} missing")
            continue
        real = json.loads(real_path.read_text())["records"]
        virt = json.loads(virt_path.read_text())
        real.sort(key=lambda r: r["index"])
        same = [r["model"] for r in real] == virt["models"]
        rt = [r["ttft"] for r in real if r["ttft"] is not None]
        vt = [t for t in virt["ttft"] if t is not None]
        cold = sum("cold" in [p.strip() for p in (r["reason"] or "").split(",")] for r in real)
        n = len(real)
        vcold = virt.get("cold_dispatches")
        vc = "-" if vcold is None else f"{1000 * vcold / virt['requests']:.0f}"
        print(f"{policy:<12} {same!s:>9} {pct(rt, .5):>9.2f} {pct(vt, .5):>9.2f} "
              f"{pct(rt, .95):>9.2f} {pct(vt, .95):>9.2f} {1000 * cold / n:>15.0f} "
              f"{vc:>15} "
              f"{1000 * virt['loads'] / virt['requests']:>16.0f}")


if __name__ == "__main__":
    main()
