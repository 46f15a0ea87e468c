"""A rolling restart under streaming traffic (issue 13 item 6, spec §14 layer 3): three real
``twistd -n pharos`` processes on loopback, peers of each other, in front of three
``pharos sim-engine`` processes, restarted one at a time (SIGTERM, exit, start again, /healthz
200) while a round-robin client streams through them, skipping an instance whose /healthz is
not 200 as a load balancer would."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import random
import re
import select
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import pytest

from tests.support.drain import PHAROS, until
from tests.support.twistd import TWISTD, free_port

MODEL = "tiny"
KEYS = {"alice": "sk-alice-rolling", "bob": "sk-bob-rolling"}
ADMIN = "sk-admin-rolling"
SYSTEMS = [f"You are assistant number {n}, careful and brief. " * 20 for n in range(4)]
CLIENT_THREADS = 3


@dataclass
class Engine:
    proc: subprocess.Popen[str]
    url: str

    def served(self) -> dict[str, int]:
        """What the engine itself counted: finished requests by reason, prompt and
        generated tokens (its /metrics counters)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out: Counter[str] = Counter()
        for line in text.splitlines():
            m = re.match(r'vllm:request_success_total\{.*finished_reason="(\w+)".*\} (\S+)',
                         line)
            if m:
                out[m.group(1)] += int(float(m.group(2)))
            for name in ("prompt_tokens_total", "generation_tokens_total"):
                if line.startswith(f"vllm:{name}{{"):
                    out[name] += int(float(line.rsplit(" ", 1)[1]))
        return dict(out)


@dataclass
class Instance:
    """One ``twistd -n pharos`` and its config; its output goes to a log file (a pipe would
    fill with the peers' access log and block it)."""

    n: int
    tmp: Path
    port: int
    config: Path
    proc: subprocess.Popen[bytes] | None = None
    log: BinaryIO | None = None
    starts: int = 0
    logs: list[Path] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.starts += 1
        path = self.tmp / f"pharos-{self.n}.{self.starts}.log"
        self.logs.append(path)
        self.log = path.open("wb")
        self.proc = subprocess.Popen([TWISTD, "-n", "--pidfile=", "pharos", "-c",
                                      str(self.config)], stdout=self.log,
                                     stderr=subprocess.STDOUT, cwd=self.tmp)

    def healthz(self) -> int | None:
        """/healthz's status; None when the connection is refused or fails."""
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except OSError:
            return None

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM and wait for the exit; its return code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            self.kill()
        return code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.log is not None:
            self.log.close()

    def output(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs)


@pytest.fixture
def engines() -> Iterator[list[Engine]]:
    """Three vLLM doubles decoding a token every 20 ms (a stream of 30 tokens is ~0.6 s)."""
    started: list[Engine] = []
    procs: list[subprocess.Popen[str]] = []
    try:
        for _ in range(3):
            proc = subprocess.Popen([PHAROS, "sim-engine", "--kind", "vllm", "--port", "0",
                                     "--model", MODEL, "--decode-ms", "20",
                                     "--max-tokens", "1000"],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            procs.append(proc)
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            assert ready, "an engine printed no URL within 60 s"
            started.append(Engine(proc, proc.stdout.readline().rsplit(" ", 1)[1].strip()))
        yield started
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def instances(engines: list[Engine], tmp_path: Path) -> Iterator[list[Instance]]:
    """Three instances, each listing all three peer addresses (itself included), a shared
    secret file, keys for alice and bob (usage counted per key) and an admin key."""
    secret = tmp_path / "peers.secret"
    secret.write_text("rolling-restart-secret\n")
    secret.chmod(0o600)
    ports = [free_port() for _ in range(3)]
    peer_ports = [free_port() for _ in range(3)]
    members = json.dumps([f"127.0.0.1:{p}" for p in peer_ports])
    keys = "keys:\n" + "".join(
        f"  - name: {name}\n    sha256: {hashlib.sha256(key.encode()).hexdigest()}\n"
        for name, key in KEYS.items()) + (
        f"  - name: ops\n    sha256: {hashlib.sha256(ADMIN.encode()).hexdigest()}\n"
        "    admin: true\n")
    backends = "backends:\n" + "".join(f"  - url: {e.url}\n    kind: vllm\n" for e in engines)
    made = []
    for n, (port, peer_port) in enumerate(zip(ports, peer_ports, strict=True)):
        config = tmp_path / f"pharos-{n}.yaml"
        config.write_text(
            f"listen: 127.0.0.1:{port}\ndrain: {{grace: 3s, timeout: 1m}}\n{backends}{keys}"
            f"peers:\n  listen: 127.0.0.1:{peer_port}\n  secret_file: {secret}\n"
            f"  members: {members}\n")
        made.append(Instance(n, tmp_path, port, config))
    try:
        for inst in made:
            inst.start()
        yield made
    finally:
        for inst in made:
            if inst.proc is not None and inst.proc.poll() is None:
                inst.proc.send_signal(signal.SIGTERM)
        for inst in made:
            if inst.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    inst.proc.wait(timeout=30)
            inst.kill()


@dataclass
class Served:
    instance: int
    phase: int
    key: str
    completion_tokens: int


class Client:
    """Round-robin streaming traffic from a few threads: each request goes to the next
    instance in turn, skipped (before sending) when its /healthz is not 200 or refuses; every
    request sent must end with the whole reply and ``[DONE]``, else it is a failure."""

    def __init__(self, instances: list[Instance]) -> None:
        self.instances = instances
        self.turn = itertools.count()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.phase = 0
        self.served: list[Served] = []
        self.failed: list[str] = []
        self.skipped = 0
        self.threads = [threading.Thread(target=self._run, args=(t,), daemon=True)
                        for t in range(CLIENT_THREADS)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)
            assert not t.is_alive(), "a client thread did not finish its request in 120 s"

    def count(self, instance: int | None = None, since_phase: int = 0) -> int:
        with self.lock:
            return sum(1 for s in self.served if s.phase >= since_phase
                       and (instance is None or s.instance == instance))

    def _run(self, t: int) -> None:
        rng = random.Random(t)
        while not self.stop.is_set():
            with self.lock:
                inst = self.instances[next(self.turn) % len(self.instances)]
            if inst.healthz() != 200:
                with self.lock:
                    self.skipped += 1
                time.sleep(0.02)
                continue
            name = rng.choice(sorted(KEYS))
            max_tokens = rng.randint(5, 30)
            phase = self.phase
            try:
                tokens = self._stream(inst, KEYS[name], max_tokens, rng.choice(SYSTEMS))
            except Exception as e:  # a failure of any kind is what the test counts
                with self.lock:
                    self.failed.append(f"instance {inst.n} (phase {phase}): {e!r}")
                continue
            with self.lock:
                self.served.append(Served(inst.n, phase, name, tokens))

    @staticmethod
    def _stream(inst: Instance, key: str, max_tokens: int, system: str) -> int:
        """Send one streamed chat and read it whole; its completion tokens. Raises when the
        stream is cut, lacks its terminator, or its content does not match its usage."""
        body = {"model": MODEL, "stream": True, "max_tokens": max_tokens,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "system", "content": system},
                             {"role": "user", "content": "and then?"}]}
        req = urllib.request.Request(inst.url + "/v1/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json",
                                              "authorization": f"Bearer {key}"})
        events: list[str] = []
        with urllib.request.urlopen(req, timeout=60) as r:
            events.extend(line.decode().strip() for line in r if line.strip())
        assert events and events[-1] == "data: [DONE]", f"no [DONE]: {events[-3:]}"
        chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
        tokens = sum(1 for c in chunks for ch in c.get("choices") or ()
                     if (ch.get("delta") or {}).get("content"))
        finish = [ch["finish_reason"] for c in chunks for ch in c.get("choices") or ()
                  if ch.get("finish_reason")]
        usage = [c["usage"] for c in chunks if c.get("usage")]
        assert finish in (["length"], ["stop"]), f"finish reasons {finish}"
        assert len(usage) == 1 and usage[0]["completion_tokens"] == tokens, (usage, tokens)
        assert finish != ["length"] or tokens == max_tokens, (tokens, max_tokens)
        return tokens


def usage_totals(inst: Instance) -> dict[str, int]:
    """Today's usage over every key as this instance reports it (all origins)."""
    req = urllib.request.Request(inst.url + "/usage?by=key",
                                 headers={"authorization": f"Bearer {ADMIN}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        rows = json.loads(r.read())["rows"]
    return {f: sum(int(row[f]) for row in rows)
            for f in ("requests", "prompt_tokens", "completion_tokens", "unmetered")}


def test_rolling_restart_under_streaming_traffic(
        engines: list[Engine], instances: list[Instance]) -> None:
    """Three peered instances restarted one at a time (SIGTERM, exit, start again, /healthz
    200) under round-robin streaming traffic: no request fails and no stream is cut (every
    reply whole, ending with [DONE]); while one restarts the other two keep serving, and each
    restarted instance serves again; afterwards every instance's /usage (summed over keys,
    every origin's cells: a restarted instance's old counts reach it through its peers) equals
    what the engines themselves counted: requests, prompt and completion tokens."""
    for inst in instances:
        assert until(lambda i=inst: i.healthz() == 200, timeout=90), inst.output()
    client = Client(instances)
    client.start()
    try:
        assert until(lambda: client.count() >= 10 and not client.failed, timeout=60), \
            client.failed
        for inst in instances:
            client.phase += 1  # this instance's restart
            restart_phase = client.phase
            code = inst.stop()
            assert code in (0, -signal.SIGTERM), inst.output()[-3000:]
            inst.start()
            assert until(lambda i=inst: i.healthz() == 200, timeout=90), inst.output()[-3000:]
            client.phase += 1  # back
            assert until(lambda i=inst: client.count(i.n, client.phase) >= 2, timeout=60)
            for other in instances:
                if other is not inst:
                    assert client.count(other.n, restart_phase) > 0, (other.n, restart_phase)
    finally:
        client.join()
    assert client.failed == [], client.failed
    assert client.skipped > 0  # the client did see instances down
    for inst in instances:
        out = inst.output()
        assert "Traceback" not in out, out[-3000:]

    # Peers sync every 200 ms; poll until every instance agrees with the engines.
    deadline = time.monotonic() + 60
    while True:
        served: Counter[str] = Counter()
        for e in engines:
            served.update(e.served())
        want = {"requests": served["length"] + served["stop"],
                "prompt_tokens": served["prompt_tokens_total"],
                "completion_tokens": served["generation_tokens_total"], "unmetered": 0}
        seen = [usage_totals(i) for i in instances]
        if all(s == want for s in seen) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert seen == [want] * 3, (seen, served)
    assert served["abort"] == 0 and served["error"] == 0, served
    assert want["requests"] == len(client.served)
    assert want["completion_tokens"] == sum(s.completion_tokens for s in client.served)
