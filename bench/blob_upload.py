"""A 1 GiB blob upload through Pharos: Pharos's own RSS while it relays (the blob figures of
docs/performance.rst's Memory section).

Pharos runs as its own process (``twistd -n pharos``) in front of a simulated Ollama engine
that reads blob uploads at a set rate (``OllamaManagement.read_rate``; 0: as fast as they
come); this script is the client (``tests.support.blob_upload.Upload``: a streaming producer
of a repeated random 1 MiB block) and the engine. For each rate it reports the upload's time,
the engine's verdict (201: digest matched) and Pharos's RSS before and at its peak (sampled
every 50 ms from /proc). Run from a checkout after ``make install`` (the client comes from
``tests/``, hence ``PYTHONPATH=.``; about a minute for the three rates)::

    PYTHONPATH=. .venv/bin/python bench/blob_upload.py --out bench/results/blob.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import treq
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.task import LoopingCall, deferLater, react
from twisted.web.client import HTTPConnectionPool
from twisted.web.http_headers import Headers

from pharos.proxy.auth import digest
from pharos.sim.double import start_double
from tests.support.blob_upload import Upload, digest_of

ADMIN = "phk-bench-admin"
MIB = 1 << 20


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run(size: int, rates: list[float], out: str | None) -> None:
    double, listening = start_double("ollama", reactor, prefill_s=0.00005, decode_s=0.002,
                                     load_s=0.2)
    store = double.manage
    assert store is not None
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="pharos-blob-bench-"))
    cfg = tmp / "pharos.yaml"
    cfg.write_text(f"listen: 127.0.0.1:{port}\nbackends:\n  - url: {double.url}\n"
                   f"    kind: ollama\nkeys:\n  - name: ops\n    sha256: {digest(ADMIN)}\n"
                   f"    admin: true\n")
    twistd = str(Path(sys.executable).with_name("twistd"))
    proc = subprocess.Popen([twistd, "-n", "--pidfile=", "pharos", "-c", str(cfg)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pool = HTTPConnectionPool(reactor, persistent=False)
    url = f"http://127.0.0.1:{port}"
    runs: list[dict[str, Any]] = []
    try:
        for _ in range(300):
            try:
                r = await treq.get(url + "/healthz", pool=pool)
                await r.content()
                if r.code == 200:
                    break
            except Exception:
                pass
            await deferLater(reactor, 0.1, lambda: None)
        else:
            raise SystemExit("Pharos did not become healthy")
        blob = digest_of(size)
        for rate in rates:
            store.read_rate = rate or None
            store.blobs.clear()
            before = peak = rss_of(proc.pid)

            def sample() -> None:
                nonlocal peak
                peak = max(peak, rss_of(proc.pid))

            sampler = LoopingCall(sample)
            sampler.start(0.05)
            producer = Upload(size)
            start = time.monotonic()
            r = await treq.request(
                "POST", f"{url}/api/blobs/{blob}", data=producer, pool=pool,
                headers=Headers({b"authorization": [f"Bearer {ADMIN}".encode()]}))
            body = await r.content()
            seconds = time.monotonic() - start
            sampler.stop()
            sample()
            row = {"read_rate_mib_s": rate / MIB if rate else None, "status": r.code,
                   "stored": store.blobs.get(blob), "seconds": round(seconds, 2),
                   "mib_per_s": round(size / MIB / seconds, 1),
                   "pharos_rss_before_mib": round(before / MIB, 1),
                   "pharos_rss_peak_mib": round(peak / MIB, 1),
                   "pharos_rss_growth_mib": round((peak - before) / MIB, 1),
                   "client_pauses": producer.pauses, "reply": body.decode()[:200]}
            print(json.dumps(row), flush=True)
            runs.append(row)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        await pool.closeCachedConnections()
        double.stop()
        stopped = listening.stopListening()
        if stopped is not None:
            await stopped
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores "
                         f"{platform.python_implementation()} {platform.python_version()}",
              "load_average_after": os.getloadavg(), "size_bytes": size, "runs": runs}
    if out:
        Path(out).write_text(json.dumps(result, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=1 << 30, help="bytes to upload (1 GiB)")
    ap.add_argument("--rates", default="0,128,32",
                    help="engine read rates in MiB/s, comma-separated (0: unlimited)")
    ap.add_argument("--out", help="write the result JSON here")
    a = ap.parse_args()
    rates = [float(x) * MIB for x in a.rates.split(",")]
    print(f"load average before: {os.getloadavg()}", flush=True)
    react(lambda _: ensureDeferred(run(a.size, rates, a.out)))


if __name__ == "__main__":
    main()
