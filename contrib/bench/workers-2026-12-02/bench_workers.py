"""``workers: N`` benchmarks (issue 16 item 3), reported, never asserted.

``throughput``: one zero-time vLLM double (``pharos sim-engine``), and in interleaved rounds a
fresh ``twistd -n pharos`` with ``workers: 1`` and with ``workers: 2`` in front of it (the order
alternating per round); per run a warm-up, then ``--seconds`` of a closed loop of ``--clients``
keep-alive connections sending a tiny non-streamed chat (one output token); the requests per
second, and the CPU per request of Pharos (supervisor and workers together), of the engine
and of this process (the load). Nothing is pinned: two workers need both cores, so the
engine and the load share them with Pharos.

``w1 --workers N -- COMPARE-ARGS``: ``pharos bench compare`` with ``workers: N`` added to every
Pharos config it writes (the harness's own ``pharos_config``, wrapped).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from pharos.bench.floor import closed_loop, cpu_seconds, free_port, load_average, request_bytes
from pharos.sim.bench import machine

BIN = Path(sys.executable).parent


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _get(port: int, path: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return int(r.status), r.read()


def _wait_up(port: int, workers: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    want = [f'pharos_worker_up{{worker="{i}"}} 1.0'.encode() for i in range(workers)]
    while True:
        try:
            code, body = _get(port, "/metrics")
            if code == 200 and (workers == 1 or all(w in body for w in want)):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"Pharos with {workers} workers did not come up")
        time.sleep(0.2)


def _run(variant: str, engine_port: int, engine_pid: int, clients: int, seconds: float,
         warmup: float, tmp: Path) -> dict[str, Any]:
    """One fresh Pharos: ``variant`` is ``1`` or ``2:MODE`` (``PHAROS_WORKERS_LISTEN``)."""
    workers = int(variant.split(":")[0])
    env = dict(os.environ)
    if ":" in variant:
        env["PHAROS_WORKERS_LISTEN"] = variant.split(":", 1)[1]
    port = free_port()
    cfg = tmp / f"w{workers}.yaml"
    cfg.write_text(f"listen: 127.0.0.1:{port}\nworkers: {workers}\n"
                   f"drain: {{grace: 0s, timeout: 10s}}\n"
                   f"backends:\n  - url: http://127.0.0.1:{engine_port}\n    kind: vllm\n")
    log = (tmp / f"w{workers}.log").open("ab")
    proc = subprocess.Popen([str(BIN / "twistd"), "-n", "--pidfile=", "pharos", "-c", str(cfg)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=tmp, env=env)
    try:
        _wait_up(port, workers)
        body = json.dumps({"model": "tiny", "max_tokens": 1,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        raw = request_bytes(port, body)
        closed_loop(port, raw, clients, seconds=warmup)
        pids = [proc.pid, *_children(proc.pid)]
        load = load_average()
        cpu0 = {p: cpu_seconds(p) for p in pids}
        eng0 = cpu_seconds(engine_pid)
        me0 = os.times()
        t0 = time.perf_counter()
        counts = closed_loop(port, raw, clients, seconds=seconds)
        elapsed = time.perf_counter() - t0
        me1 = os.times()
        router = sum(cpu_seconds(p) - cpu0[p] for p in pids)
        per_process = {str(p): round(cpu_seconds(p) - cpu0[p], 3) for p in pids}
        engine = cpu_seconds(engine_pid) - eng0
        own = (me1.user - me0.user) + (me1.system - me0.system)
        n = counts["ok"]
        return {"variant": variant, "workers": workers, "clients": clients,
                "seconds": round(elapsed, 3),
                "ok": n, "not_ok": counts["not_ok"], "rps": round(n / elapsed, 1),
                "router_cpu_ms_per_req": round(router / n * 1000, 3) if n else None,
                "router_cpu_s_by_pid": per_process,
                "engine_cpu_ms_per_req": round(engine / n * 1000, 3) if n else None,
                "load_cpu_ms_per_req": round(own / n * 1000, 3) if n else None,
                "loadavg_before": load, "loadavg_after": load_average()}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def throughput(a: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as d:
        tmp = Path(d)
        engine_port = free_port()
        engine = subprocess.Popen(
            [str(BIN / "pharos"), "sim-engine", "--kind", "vllm", "--port", str(engine_port),
             "--slots", "128", "--prefill-ms", "0", "--decode-ms", "0",
             "--prefill-fixed-ms", "0", "--prefill-pair-ns", "0", "--decode-seq-us", "0",
             "--max-tokens", "1", "--model", "tiny"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        runs: list[dict[str, Any]] = []
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    _get(engine_port, "/v1/models")
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            variants = a.variants.split(",")
            for r in range(a.rounds):
                order = variants if r % 2 == 0 else variants[::-1]
                for w in order:
                    run = _run(w, engine_port, engine.pid, a.clients, a.seconds, a.warmup, tmp)
                    run["round"] = r
                    runs.append(run)
                    print(json.dumps(run), file=sys.stderr, flush=True)
        finally:
            engine.terminate()
            engine.wait(timeout=30)

    def median(xs: list[float]) -> float:
        xs = sorted(xs)
        return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2

    summary: dict[str, Any] = {}
    variants = a.variants.split(",")
    for w in variants:
        mine = [r for r in runs if r["variant"] == w]
        summary[w] = {
            "rps_median": median([r["rps"] for r in mine]),
            "rps_all": [r["rps"] for r in mine],
            "router_cpu_ms_per_req_median": median([r["router_cpu_ms_per_req"] for r in mine]),
            "engine_cpu_ms_per_req_median": median([r["engine_cpu_ms_per_req"] for r in mine]),
            "load_cpu_ms_per_req_median": median([r["load_cpu_ms_per_req"] for r in mine])}
    base = [r for r in runs if r["variant"] == variants[0]]
    for w in variants[1:]:
        ratios = [b["rps"] / a_["rps"] for a_, b in zip(
            base, [r for r in runs if r["variant"] == w], strict=True)]
        summary[f"ratio_{w}_over_{variants[0]}_by_round"] = [round(x, 3) for x in ratios]
        summary[f"ratio_{w}_over_{variants[0]}_median"] = round(median(ratios), 3)
    return {"machine": machine(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "clients": a.clients, "seconds": a.seconds, "rounds": a.rounds,
            "variants": variants,
            "summary": summary, "runs": runs}


def w1(a: argparse.Namespace, rest: list[str]) -> int:
    import pharos.bench.fleet as fleet
    from pharos.bench.compare import main_compare

    original = fleet.pharos_config

    def with_workers(*args: Any, **kwargs: Any) -> str:
        return original(*args, **kwargs) + f"workers: {a.workers}\n"

    fleet.pharos_config = with_workers
    from twisted.internet import reactor

    return main_compare(rest, reactor)


def main() -> int:
    p = argparse.ArgumentParser(prog="bench_workers.py")
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--clients", type=int, default=64)
    t.add_argument("--seconds", type=float, default=10.0)
    t.add_argument("--warmup", type=float, default=2.0)
    t.add_argument("--rounds", type=int, default=4)
    t.add_argument("--variants", default="1,2:shared,2:reuseport,2:shared-burst",
                   help="comma-separated: 1 (one process) or 2:MODE (two workers, a listen "
                        "mode of pharos.workers.LISTEN_MODES); the first is the baseline")
    t.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("w1")
    c.add_argument("--workers", type=int, required=True)
    a, rest = p.parse_known_args()
    if a.what == "throughput":
        result = throughput(a)
        a.out.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result["summary"], indent=1))
        return 0
    return w1(a, [x for x in rest if x != "--"])


if __name__ == "__main__":
    sys.exit(main())
