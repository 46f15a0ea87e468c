"""How ``workers: 2`` spreads keep-alive connections, per listen mode (issue 16 item 3).

For each trial and mode (``PHAROS_WORKERS_LISTEN``): a fresh ``twistd -n pharos`` with
``workers: 2``; 64 connections opened one after another (``sequential``) or all at once
(``burst``, asyncio), each sending one ``GET /`` and reading the reply, then the established
connections each worker holds (``ss -tnp``). Reported, never asserted.

Usage: python balance_workers.py [--trials N] > results/balance.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
MODES = ("reuseport", "shared", "shared-burst")
CONNECTIONS = 64


def _free() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _children(pid: int) -> list[int]:
    out = []
    for st in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = st.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(st.parent.name))
    return out


def _up(port: int) -> None:
    deadline = time.monotonic() + 90
    want = [b'pharos_worker_up{worker="0"} 1.0', b'pharos_worker_up{worker="1"} 1.0']
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as r:
                body = r.read()
            if all(w in body for w in want):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("workers not up")
        time.sleep(0.2)


def _sequential(port: int) -> list[socket.socket]:
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(CONNECTIONS)]
    for s in socks:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    for s in socks:
        s.recv(65536)
    return socks


async def _burst(port: int) -> list[Any]:
    conns = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port)
                                   for _ in range(CONNECTIONS)))
    for _, w in conns:
        w.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    for r, _ in conns:
        await r.read(65536)
    return list(conns)


def one(mode: str, how: str) -> list[int]:
    port = _free()
    cfg = Path(f"/tmp/balance-{os.getpid()}-{mode}.yaml")
    cfg.write_text(f"listen: 127.0.0.1:{port}\nworkers: 2\ndrain: {{grace: 0s}}\n")
    env = dict(os.environ, PHAROS_WORKERS_LISTEN=mode)
    log = cfg.with_suffix(".log").open("wb")
    p = subprocess.Popen([str(BIN / "twistd"), "-n", "--pidfile=", "pharos", "-c", str(cfg)],
                         env=env, stdout=log, stderr=subprocess.STDOUT)
    loop = asyncio.new_event_loop()
    try:
        try:
            _up(port)
        except RuntimeError:
            print(cfg.with_suffix(".log").read_text()[-3000:], file=sys.stderr)
            raise
        if how == "sequential":
            socks = _sequential(port)
        else:
            conns = loop.run_until_complete(_burst(port))
        time.sleep(0.5)
        out = subprocess.run(["ss", "-tnpH", "state", "established", f"( sport = :{port} )"],
                             capture_output=True, text=True, check=True).stdout
        counts = sorted(len(re.findall(rf"pid={w},", out)) for w in _children(p.pid))
        if how == "sequential":
            for s in socks:
                s.close()
        else:
            for _, w in conns:
                w.close()
        return counts
    finally:
        loop.close()
        p.terminate()
        p.wait(30)
        log.close()
        cfg.unlink()
        cfg.with_suffix(".log").unlink()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=3)
    a = ap.parse_args()
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "connections": CONNECTIONS, "runs": []}
    for trial in range(a.trials):
        for how in ("sequential", "burst"):
            for mode in MODES:
                counts = one(mode, how)
                run = {"trial": trial, "how": how, "mode": mode, "per_worker": counts,
                       "loadavg": [round(x, 2) for x in os.getloadavg()]}
                res["runs"].append(run)
                print(json.dumps(run), file=sys.stderr, flush=True)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
