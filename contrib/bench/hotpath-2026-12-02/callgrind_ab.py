"""Instructions per proxied request (valgrind callgrind ``Ir``), for A/B comparisons of code
versions on a loaded shared machine, where CPU time and latency are too noisy (issue 16 item 2).

Each tree's Pharos runs under ``valgrind --tool=callgrind --instr-atstart=no`` against the same
vLLM double (no prefill or decode time); after a warm-up, instrumentation is switched on for
``--requests`` tiny non-streamed chats (1 output token) at ``--clients`` keep-alive clients,
then the counts are dumped: ``Ir`` over requests is the instructions per request, the whole
process (reactor, threads, GC) included. Rounds alternate the trees.

Usage: python callgrind_ab.py --trees A,B [--rounds R] [--requests N] [--clients C] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from hotload import EXE, free_port, load, wait_up


def ir_of(path: str) -> int:
    for line in Path(path).read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def one(tree: str, engine_port: int, tmp: str, requests: int, clients: int,
        keep: str | None, label: str, kind: str, idle: float) -> dict[str, object]:
    port = free_port()
    cfg = Path(tmp) / f"pharos-{port}.yaml"
    cfg.write_text(f"listen: 127.0.0.1:{port}\nbackends:\n"
                   f"  - url: http://127.0.0.1:{engine_port}\n    kind: {kind}\n")
    out = Path(tmp) / f"cg-{port}"
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=tree)
    p = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                          f"--callgrind-out-file={out}/callgrind.out.%p",
                          str(EXE / "python"), str(EXE / "twistd"), "-n", "--pidfile=",
                          "pharos", "-c", str(cfg)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp, env=env)
    try:
        wait_up(port, "/healthz", 600)
        asyncio.run(load(port, clients, 200))  # warm: pooled connections, caches, code paths
        subprocess.run(["callgrind_control", "-i", "on", str(p.pid)], check=True,
                       stdout=subprocess.DEVNULL)
        time.sleep(idle)  # the background (scrape rounds, timers) alone: dump 1
        subprocess.run(["callgrind_control", "-d", str(p.pid)], check=True,
                       stdout=subprocess.DEVNULL)
        t0 = time.time()
        asyncio.run(load(port, clients, requests))
        subprocess.run(["callgrind_control", "-d", str(p.pid)], check=True,
                       stdout=subprocess.DEVNULL)
        wall = time.time() - t0
    finally:
        p.terminate()
        p.wait(timeout=60)
    dumps = sorted(f for f in glob.glob(f"{out}/callgrind.out.*") if not f.endswith(".0")
                   and Path(f).stat().st_size > 0)
    # dump .1: idle; .2: the load; the final one at exit is left out
    idle_dump = next(f for f in dumps if f.endswith(".1"))
    load_dump = next(f for f in dumps if f.endswith(".2"))
    ir_idle, ir = ir_of(idle_dump), ir_of(load_dump)
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(load_dump, Path(keep) / f"callgrind.{label}.out")
    bg = ir_idle / idle * wall
    return {"tree": tree, "label": label, "kind": kind, "requests": requests,
            "clients": clients, "ir_per_request": round(ir / requests),
            "idle_ir_per_s": round(ir_idle / idle), "wall_s": round(wall, 1),
            "net_ir_per_request": round((ir - bg) / requests),
            "loadavg": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", required=True)
    ap.add_argument("--labels", default="")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--keep", default=None, help="copy each dump here")
    ap.add_argument("--kind", default="openai",
                    help="the backend kind Pharos is told (openai: a cheap scrape round)")
    ap.add_argument("--idle", type=float, default=10.0,
                    help="seconds of instrumented idle before the load (the background)")
    a = ap.parse_args()
    trees = a.trees.split(",")
    labels = a.labels.split(",") if a.labels else [Path(t).name for t in trees]
    eport = free_port()
    eng = subprocess.Popen([str(EXE / "pharos"), "sim-engine", "--kind", "vllm", "--port",
                            str(eport), "--slots", "64", "--prefill-ms", "0", "--decode-ms",
                            "0", "--prefill-fixed-ms", "0", "--prefill-pair-ns", "0",
                            "--decode-seq-us", "0", "--max-tokens", "1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_up(eport, "/health")
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(a.rounds):
                for t, lab in zip(trees, labels, strict=True):
                    row = one(t, eport, tmp, a.requests, a.clients, a.keep, f"{lab}-r{r}",
                              a.kind, a.idle)
                    print(json.dumps(row), flush=True)
    finally:
        eng.terminate()
        eng.wait(timeout=10)


if __name__ == "__main__":
    main()
