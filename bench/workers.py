"""``workers: 1`` against ``workers: 2`` with an engine and a load that cost almost nothing:
the "Several processes" table of docs/performance.rst (requests per second at 64 connections,
kept alive or new for each request, and their ratio). Reported, never asserted.

Run from a checkout after ``make install``, with nginx and wrk installed (bench tools, not
Pharos dependencies: ``apt-get install -y nginx-light wrk iproute2``)::

    .venv/bin/python bench/workers.py --rounds 6 --seconds 8 --warmup 2 \
        --direct-seconds 2 --variants 1,2,2x1 --out bench/results/workers.json

It prints the summary (for ``keepalive`` and ``close`` connections: each variant's median
requests per second, ``rps_median``, and the ratios ``ratio_2_over_1`` and
``ratio_2x1_over_1`` by round and their median) and writes every run to ``--out``.

The engine is nginx answering fixed OpenAI-compatible replies (``POST /v1/chat/completions``:
a vLLM-shaped non-streamed chat completion with usage, one output token; ``GET /v1/models``:
one model, ``tiny``), a single nginx process; Pharos reaches it as a ``kind: openai`` backend
(the generic recipe: only ``/v1/models`` is probed) with ``capacity: 256``, so it never
queues. The load is ``wrk`` (one thread, ``--connections`` connections, ``CHAT_LUA``), either
keep-alive (each connection sends its next request when the last is answered) or
``Connection: close`` (a new connection for every request). nginx and wrk are bench tools,
not Pharos dependencies.

Per round, in an order reversed every other round: nginx directly (the floor), then a fresh
``twistd -n pharos`` per variant (``1``: one process; ``2`` or ``2:MODE``: two workers, MODE a
``PHAROS_WORKERS_LISTEN`` listen mode), each measured keep-alive and close (order alternating
by round) after a warm-up. Per measured run: requests per second, wrk's latency percentiles,
its error counts, the CPU (``/proc/PID/stat``; wrk's from ``wait4``) of every process (the
supervisor and each worker apart), the machine's busy CPU from ``/proc/stat`` (so ``other`` =
busy less ours: what else ran), nginx's accepted connections and requests (stub_status:
Pharos's new engine connections per request), the keep-alive connections each worker held
midway (``ss``), and the load average before and after. Nothing is pinned.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
TICK = os.sysconf("SC_CLK_TCK")

#: The engine's replies: the shape of vLLM 0.32's (fixtures/vllm/0.32.0/idle), one token.
CHAT_REPLY = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1796195675,
    "model": "tiny",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"},
                 "logprobs": None, "finish_reason": "length", "stop_reason": None}],
    "usage": {"prompt_tokens": 9, "total_tokens": 10, "completion_tokens": 1,
              "prompt_tokens_details": None}}, separators=(",", ":"))
MODELS_REPLY = json.dumps({"object": "list", "data": [
    {"id": "tiny", "object": "model", "created": 1796195675, "owned_by": "vllm",
     "max_model_len": 1024}]}, separators=(",", ":"))

#: wrk's script: a tiny non-streamed chat (one output token) on every request; ``wrk ... --
#: close`` adds ``Connection: close`` (every request on a new connection: wrk reconnects when
#: the server closes). done() prints one line ``WRKJSON {...}`` for this script to read.
CHAT_LUA = """\
wrk.method = "POST"
wrk.body = '{"model":"tiny","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}'
wrk.headers["Content-Type"] = "application/json"

function init(args)
  if args[1] == "close" then
    wrk.headers["Connection"] = "close"
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,"err_connect":%d,"err_read":%d,' ..
    '"err_write":%d,"err_status":%d,"err_timeout":%d,"p50_us":%d,"p90_us":%d,' ..
    '"p99_us":%d,"max_us":%d,"mean_us":%.1f}\\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, latency.mean))
end
"""
#: Where ``main`` writes ``CHAT_LUA`` for wrk (its temporary directory).
WRK_SCRIPT = Path("chat.lua")

NGINX_CONF = """\
daemon off;
master_process off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
    server {{
        listen 127.0.0.1:{port};
        location = /v1/chat/completions {{
            default_type application/json;
            return 200 '{chat}';
        }}
        location = /v1/models {{
            default_type application/json;
            return 200 '{models}';
        }}
        location / {{ return 404; }}
    }}
    server {{
        listen 127.0.0.1:{status_port};
        location / {{ stub_status; }}
    }}
}}
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def machine_cpu() -> tuple[float, float, float]:
    """(busy, steal, total) CPU seconds of the whole machine so far (``/proc/stat``): busy
    is user, nice, system, irq and softirq; steal is what the hypervisor gave elsewhere."""
    first = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    v = [int(x) for x in first[:8]]  # user nice system idle iowait irq softirq steal
    busy = v[0] + v[1] + v[2] + v[5] + v[6]
    return busy / TICK, v[7] / TICK, sum(v) / TICK


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return sorted(out)


def get(port: int, path: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return int(r.status), r.read()


def stub_status(port: int) -> tuple[int, int]:
    """nginx's (accepted connections, requests) so far."""
    _, body = get(port, "/")
    nums = body.decode().splitlines()[2].split()
    return int(nums[0]), int(nums[2])


def spread(port: int, pids: list[int]) -> dict[str, int]:
    """Established connections to ``port`` held by each pid (``ss``)."""
    out = subprocess.run(["ss", "-Htnp", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True, check=False).stdout
    counts = {str(p): 0 for p in pids}
    for pid in re.findall(r"pid=(\d+)", out):
        if pid in counts:
            counts[pid] += 1
    return counts


class Nginx:
    """One nginx process (``master_process off``) in a temporary prefix."""

    def __init__(self, tmp: Path) -> None:
        self.port, self.status_port = free_port(), free_port()
        conf = tmp / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=tmp, port=self.port, status_port=self.status_port,
                                          chat=CHAT_REPLY, models=MODELS_REPLY))
        self.proc = subprocess.Popen(["nginx", "-p", str(tmp), "-c", str(conf)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                if get(self.port, "/v1/models")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("nginx did not come up (see nginx-error.log)")
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _wrk_args(port: int, seconds: float, connections: int, close: bool) -> list[str]:
    args = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s",
            "-s", str(WRK_SCRIPT), f"http://127.0.0.1:{port}/v1/chat/completions"]
    return [*args, "--", "close"] if close else args


def wrk(ports: list[int], seconds: float, connections: int, close: bool,
        on_midway: Any = None) -> dict[str, Any]:
    """wrk against each port at once (``connections`` split evenly), summed: requests,
    errors, requests per second (each wrk's own, added), the largest percentiles, and wrk's
    own CPU seconds (``wait4``)."""
    procs = [subprocess.Popen(_wrk_args(p, seconds, connections // len(ports), close),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for p in ports]
    timer = None
    if on_midway is not None:
        timer = threading.Timer(seconds / 2, on_midway)
        timer.start()
    parts = []
    for proc in procs:
        assert proc.stdout is not None
        out = proc.stdout.read().decode()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        line = next((x for x in out.splitlines() if x.startswith("WRKJSON ")), None)
        if proc.returncode != 0 or line is None:
            raise RuntimeError(f"wrk failed ({proc.returncode}): {out[-2000:]}")
        part: dict[str, Any] = json.loads(line[len("WRKJSON "):])
        part["cpu_s"] = usage.ru_utime + usage.ru_stime
        parts.append(part)
    if timer is not None:
        timer.join()
    total: dict[str, Any] = {k: sum(x[k] for x in parts) for k in parts[0]
                             if k.startswith("err_") or k in ("requests", "cpu_s")}
    total["rps"] = sum(x["requests"] / (x["duration_us"] / 1e6) for x in parts)
    total["seconds"] = max(x["duration_us"] for x in parts) / 1e6
    for k in ("p50_us", "p90_us", "p99_us", "max_us"):
        total[k] = max(x[k] for x in parts)
    return total


def measure(ports: list[int], seconds: float, connections: int, close: bool,
            pids: dict[str, int], nginx: Nginx) -> dict[str, Any]:
    """One measured wrk run against ``ports``, with every process's CPU around it."""
    cpu0 = {name: cpu_seconds(p) for name, p in pids.items()}
    ng0 = cpu_seconds(nginx.proc.pid)
    st0 = stub_status(nginx.status_port)
    busy0, steal0, total0 = machine_cpu()
    load0 = loadavg()
    held: dict[str, int] = {}

    def midway() -> None:
        for port in ports:
            for pid, n in spread(port, list(pids.values())).items():
                held[pid] = held.get(pid, 0) + n

    w = wrk(ports, seconds, connections, close, None if close or not pids else midway)
    busy1, steal1, total1 = machine_cpu()
    st1 = stub_status(nginx.status_port)
    ng = cpu_seconds(nginx.proc.pid) - ng0
    cpu = {name: round(cpu_seconds(p) - cpu0[name], 3) for name, p in pids.items()}
    n = w["requests"]
    pharos = sum(cpu.values())
    ours = pharos + ng + w["cpu_s"]
    busy = busy1 - busy0

    def ms(x: float) -> float | None:
        return round(x / n * 1000, 4) if n else None

    return {
        "close": close, "seconds": round(w["seconds"], 3), "requests": n,
        "rps": round(w["rps"], 1),
        "errors": {k[4:]: w[k] for k in w if k.startswith("err_")},
        "latency_ms": {"p50": w["p50_us"] / 1000, "p90": w["p90_us"] / 1000,
                       "p99": w["p99_us"] / 1000, "max": w["max_us"] / 1000},
        "cpu_s": {**cpu, "nginx": round(ng, 3), "wrk": round(w["cpu_s"], 3)},
        "cpu_ms_per_req": {"pharos": ms(pharos), "nginx": ms(ng), "wrk": ms(w["cpu_s"]),
                           **{name: ms(c) for name, c in cpu.items()}},
        "machine_busy_cores": round(busy / (total1 - total0) * (os.cpu_count() or 1), 3)
        if total1 > total0 else None,
        "machine_steal_cores": round((steal1 - steal0) / (total1 - total0)
                                     * (os.cpu_count() or 1), 3) if total1 > total0 else None,
        "other_cpu_s": round(busy - ours, 3),
        "engine_conns_per_req": round((st1[0] - st0[0]) / n, 4) if n else None,
        "engine_reqs_per_req": round((st1[1] - st0[1]) / n, 4) if n else None,
        "conns_held": held or None,
        "loadavg_before": load0, "loadavg_after": loadavg()}


def start_pharos(workers: int, nginx: Nginx, tmp: Path, env: dict[str, str],
                 name: str) -> tuple[subprocess.Popen[bytes], int]:
    """``twistd -n pharos`` with ``workers``, up (every worker answering /metrics)."""
    port = free_port()
    cfg = tmp / f"pharos-{name}.yaml"
    cfg.write_text(f"listen: 127.0.0.1:{port}\nworkers: {workers}\n"
                   "drain: {grace: 0s, timeout: 10s}\n"
                   f"backends:\n  - url: http://127.0.0.1:{nginx.port}\n"
                   "    kind: openai\n    capacity: 256\n")
    with (tmp / "pharos.log").open("ab") as log:
        proc = subprocess.Popen(
            [str(BIN / "twistd"), "-n", "--pidfile=", "pharos", "-c", str(cfg)],
            stdout=log, stderr=subprocess.STDOUT, cwd=tmp, env=env)
    want = [f'pharos_worker_up{{worker="{i}"}} 1.0'.encode() for i in range(workers)]
    deadline = time.monotonic() + 90
    while True:
        try:
            code, body = get(port, "/metrics")
            if code == 200 and (workers == 1 or all(w in body for w in want)):
                return proc, port
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            stop_pharos(proc)
            raise RuntimeError(f"Pharos {name} did not come up (see pharos.log)")
        time.sleep(0.2)


def stop_pharos(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def pharos(variant: str, nginx: Nginx, tmp: Path, a: argparse.Namespace,
           round_: int) -> list[dict[str, Any]]:
    """Fresh Pharos processes for ``variant``, measured keep-alive and close: ``1``, ``2``
    or ``2:MODE`` (``workers: 2``, MODE a ``PHAROS_WORKERS_LISTEN``), or ``2x1``: two
    independent ``workers: 1`` instances, each loaded by its own wrk with half the
    connections (two processes with nothing shared: the machine's own ceiling). A suffix
    ``@TREE`` runs the code of ``--tree TREE=PATH`` (``PYTHONPATH``); without one, the tree
    named ``default`` if given, else whatever this interpreter imports."""
    full = variant
    variant, _, tree = variant.partition("@")
    env = dict(os.environ)
    path = a.trees.get(tree or "default")
    if path is not None:
        env["PYTHONPATH"] = path
    procs: list[subprocess.Popen[bytes]] = []
    ports: list[int] = []
    runs = []
    try:
        if variant == "2x1":
            for name in ("a", "b"):
                proc, port = start_pharos(1, nginx, tmp, env, f"2x1{name}")
                procs.append(proc)
                ports.append(port)
            pids = {"pharos_a": procs[0].pid, "pharos_b": procs[1].pid}
        else:
            workers = int(variant.split(":")[0])
            if ":" in variant:
                env["PHAROS_WORKERS_LISTEN"] = variant.split(":", 1)[1]
            proc, port = start_pharos(workers, nginx, tmp, env, variant.replace(":", "-"))
            procs.append(proc)
            ports.append(port)
            pids = {"pharos": proc.pid} if workers == 1 else {
                "supervisor": proc.pid,
                **{f"worker{i}": p for i, p in enumerate(children(proc.pid))}}
        modes = [False, True] if round_ % 2 == 0 else [True, False]
        for close in modes:
            warm = wrk(ports, a.warmup, a.connections, close)
            run = measure(ports, a.seconds, a.connections, close, pids, nginx)
            run.update(variant=full, tree=path, round=round_, pids=pids,
                       warmup_errors={k[4:]: warm[k] for k in warm if k.startswith("err_")})
            runs.append(run)
            print(json.dumps(run), file=sys.stderr, flush=True)
    finally:
        for proc in procs:
            stop_pharos(proc)
    return runs


def direct(nginx: Nginx, a: argparse.Namespace, round_: int) -> list[dict[str, Any]]:
    runs = []
    for close in (False, True):
        run = measure([nginx.port], a.direct_seconds, a.connections, close, {}, nginx)
        run.update(variant="nginx", round=round_)
        runs.append(run)
        print(json.dumps(run), file=sys.stderr, flush=True)
    return runs


def median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def summarize(runs: list[dict[str, Any]], variants: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for close in (False, True):
        conn = "close" if close else "keepalive"
        rows: dict[str, Any] = {}
        for v in ["nginx", *variants]:
            mine = [r for r in runs if r["variant"] == v and r["close"] == close]
            if not mine:
                continue
            per = {k: median([r["cpu_ms_per_req"].get(k) for r in mine])
                   for k in mine[0]["cpu_ms_per_req"]}
            rows[v] = {"rps": [r["rps"] for r in mine], "rps_median": median(
                [r["rps"] for r in mine]), "cpu_ms_per_req_median": per,
                "p50_ms_median": median([r["latency_ms"]["p50"] for r in mine]),
                "p99_ms_median": median([r["latency_ms"]["p99"] for r in mine]),
                "other_cpu_s": [r["other_cpu_s"] for r in mine],
                "engine_conns_per_req_median": median(
                    [r["engine_conns_per_req"] for r in mine]),
                "errors": sum(sum(r["errors"].values()) for r in mine)}
        for v in variants:
            name, _, tree = v.partition("@")
            one = "1@" + tree if tree else "1"
            if name == "1" or one not in variants:
                continue
            base = {r["round"]: r["rps"] for r in runs if r["variant"] == one
                    and r["close"] == close}
            ratios = [r["rps"] / base[r["round"]] for r in runs
                      if r["variant"] == v and r["close"] == close and r["round"] in base]
            rows[f"ratio_{v}_over_{one}"] = {
                "by_round": [round(x, 3) for x in ratios],
                "median": round(median(ratios) or 0, 3) if ratios else None}
        out[conn] = rows
    return out


def _past(hhmm: str, when: float) -> bool:
    """Whether ``when`` (epoch seconds) is after today's ``HH:MM`` UTC."""
    t = time.gmtime(when)
    h, m = (int(x) for x in hhmm.split(":"))
    return (t.tm_hour, t.tm_min) >= (h, m)


def git_commit(where: Path | str = HERE) -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> int:
    global WRK_SCRIPT
    p = argparse.ArgumentParser(prog="workers.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--direct-seconds", type=float, default=3.0)
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--variants", default="1,2,2x1",
                   help="comma-separated: 1 (one process), 2 or 2:MODE (two workers, MODE one "
                        "of pharos.workers.LISTEN_MODES), 2x1 (two independent one-process "
                        "instances, half the connections each), each with an optional @TREE; "
                        "ratios are against 1 of the same tree")
    p.add_argument("--stop-by", metavar="HH:MM",
                   help="UTC: start no round that would end after this (rounds timed by the "
                        "first)")
    p.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                   help="a code tree for variants ending @NAME (default: for the others)")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    a.trees = dict(t.split("=", 1) for t in a.tree)
    for tool in ("nginx", "wrk", "ss"):
        if shutil.which(tool) is None:
            print(f"{tool} not found (bench only: apt-get install -y nginx-light wrk iproute2)",
                  file=sys.stderr)
            return 2
    variants = a.variants.split(",")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_start = loadavg()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as d:
        tmp = Path(d)
        WRK_SCRIPT = tmp / "chat.lua"
        WRK_SCRIPT.write_text(CHAT_LUA)
        nginx = Nginx(tmp)
        try:
            first: float | None = None
            for r in range(a.rounds):
                t0 = time.time()
                if a.stop_by and first is not None and _past(a.stop_by, t0 + first):
                    print(f"stopping before round {r}: it would end after {a.stop_by} UTC",
                          file=sys.stderr, flush=True)
                    break
                order = ["nginx", *variants]
                if r % 2:
                    order.reverse()
                for v in order:
                    runs += direct(nginx, a, r) if v == "nginx" else pharos(v, nginx, tmp, a, r)
                first = first or time.time() - t0
        finally:
            nginx.stop()
            for name in ("pharos.log", "nginx-error.log"):
                if (tmp / name).exists():
                    shutil.copy(tmp / name, a.out.with_suffix(f".{name}"))
    result = {"started": started, "ended": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "commit": git_commit(),
              "trees": {k: {"path": v, "commit": git_commit(v), "changed": subprocess.run(
                  ["git", "diff", "--stat", "HEAD"], cwd=v, capture_output=True, text=True,
                  check=False).stdout.strip() or None} for k, v in a.trees.items()},
              "loadavg_start": load_start, "loadavg_end": loadavg(),
              "cpus": os.cpu_count(), "python": sys.version.split()[0],
              "args": {k: str(v) for k, v in vars(a).items()}, "variants": variants,
              "summary": summarize(runs, variants), "runs": runs}
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
