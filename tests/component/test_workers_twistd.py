"""``workers: 2`` as an operator runs it (issue 16 item 3): real twistd processes on loopback.

One supervisor and two workers share the public port; a killed worker is started again while
the other keeps serving; SIGHUP reaches both; SIGTERM drains both and ends everything; and a
daily token budget shared by the workers is passed by at most one in-flight request per
worker."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
TWISTD = str(BIN / "twistd")
PHAROS = str(BIN / "pharos")
#: Generous: two workers start on a loaded 2-core machine.
WAIT = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_for(what: str, check: object, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():  # type: ignore[operator]
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def workers_up(port: int) -> dict[str, float]:
    """``pharos_worker_up`` by worker, from the merged /metrics."""
    code, body = get(port, "/metrics")
    assert code == 200
    return {m[1]: float(m[2]) for m in re.finditer(
        rb'pharos_worker_up\{worker="(\d+)"\} ([0-9.]+)'.decode(), body.decode())}


def bound_port(log: Path) -> int:
    """The public port the supervisor bound (``listen: 127.0.0.1:0``: the kernel's choice, so
    no other socket can take it between a probe and the bind), from its log."""
    found: list[int] = []

    def logged() -> bool:
        m = re.search(r"\[pharos\.workers#info\] 2 workers on 127\.0\.0\.1:(\d+)",
                      log.read_text())
        if m:
            found.append(int(m[1]))
        return bool(m)

    wait_for("the supervisor's port", logged)
    assert found[0] != 0
    return found[0]


def started(log: Path) -> dict[int, list[int]]:
    """Worker index -> the pids it was started with, in order (from the supervisor's log)."""
    out: dict[int, list[int]] = {}
    for m in re.finditer(r"\[pharos\.workers#info\] worker (\d+) started \(pid (\d+)",
                         log.read_text()):
        out.setdefault(int(m[1]), []).append(int(m[2]))
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        # A process is gone once its last thread is: after a SIGKILL the leader can be a
        # zombie while another thread still runs its exit and holds the process's files,
        # the listening socket among them (a connection the kernel queued there is reset
        # when that thread ends: seen as "Connection reset by peer" on the next request).
        if len(os.listdir(f"/proc/{pid}/task")) > 1:
            return True
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


ADMIN = "phk-workers-admin"


def reloads(log: Path, index: int) -> int:
    """How many times worker ``index`` read its config file again."""
    return log.read_text().count(f"worker {index}: [pharos.reload#info] config")


@pytest.fixture
def supervisor(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[
        tuple[subprocess.Popen[bytes], int, Path]]:
    extra: str = getattr(request, "param", "")
    cfg = tmp_path / "pharos.yaml"
    admin = hashlib.sha256(ADMIN.encode()).hexdigest()
    cfg.write_text("listen: 127.0.0.1:0\nworkers: 2\n"
                   f"drain: {{grace: 1s, timeout: 20s}}\n"
                   f"keys:\n  - name: ops\n    sha256: {admin}\n    admin: true\n{extra}")
    log = tmp_path / "out.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([TWISTD, "-n", "--pidfile=", "pharos", "-c", str(cfg)],
                                stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        yield proc, bound_port(log), log
    finally:
        pids = [p for ps in started(log).values() for p in ps]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_two_workers_serve_restart_reload_and_drain(
        supervisor: tuple[subprocess.Popen[bytes], int, Path]) -> None:
    """Both workers answer on the one port (each counted up in the merged /metrics); a
    worker killed with SIGKILL is started again (a new pid, same index) while the other
    keeps answering every request; SIGHUP, and ``POST /admin/reload`` answered by either
    worker, make both read the config again; SIGTERM drains both and the supervisor and
    every worker end, with no traceback."""
    proc, port, log = supervisor
    try:
        serve_restart_reload_and_drain(proc, port, log)
    except (AssertionError, OSError) as e:
        # The supervisor's log (every worker's lines too) says what happened.
        raise AssertionError(f"{e}\n--- log tail ---\n{log.read_text()[-6000:]}") from e


def serve_restart_reload_and_drain(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    wait_for("both workers up", lambda: workers_up(port) == {"0": 1.0, "1": 1.0})
    for _ in range(20):
        assert get(port, "/")[0] == 200
    first = started(log)
    assert sorted(first) == [0, 1]
    victim = first[1][-1]
    os.kill(victim, signal.SIGKILL)
    wait_for("worker 1 gone", lambda: not alive(victim), timeout=10)
    for _ in range(20):  # the other worker takes every connection meanwhile
        assert get(port, "/")[0] == 200
    wait_for("worker 1 restarted", lambda: len(started(log).get(1, [])) == 2)
    assert started(log)[1][-1] != victim
    assert f"worker 1 (pid {victim}) ended" in log.read_text()
    wait_for("both workers up again", lambda: workers_up(port) == {"0": 1.0, "1": 1.0})
    assert get(port, "/healthz")[0] == 200

    proc.send_signal(signal.SIGHUP)
    wait_for("both workers reloaded", lambda: all(reloads(log, i) >= 1 for i in (0, 1)))
    before = [reloads(log, i) for i in (0, 1)]
    req = urllib.request.Request(f"http://127.0.0.1:{port}/admin/reload", data=b"",
                                 method="POST", headers={"Authorization": f"Bearer {ADMIN}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
        assert json.loads(r.read())["changed"] is False
    wait_for("both workers reloaded again",
             lambda: all(reloads(log, i) > before[i] for i in (0, 1)))

    pids = [started(log)[0][-1], started(log)[1][-1]]
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=WAIT)
    text = log.read_text()
    assert proc.returncode in (0, -signal.SIGTERM), text[-3000:]
    assert "Server Shut Down" in text
    assert text.count("[pharos.proxy.drain#info] draining: done") == 2, text[-3000:]
    for i, pid in enumerate(pids):
        assert f"worker {i} (pid {pid}) stopped" in text
    wait_for("every worker gone", lambda: not any(alive(p) for p in pids), timeout=10)
    assert "Traceback" not in text


KEY = "phk-workers-quota"
PROMPT_TOKENS = 1  # the vLLM double counts "hi" as one token
MAX_TOKENS = 2
PER_REQUEST = PROMPT_TOKENS + MAX_TOKENS
REQUESTS_IN_BUDGET = 20


@pytest.fixture
def engine() -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen([PHAROS, "sim-engine", "--kind", "vllm", "--port", str(port),
                             "--model", "tiny", "--slots", "8", "--prefill-ms", "0",
                             "--decode-ms", "60", "--max-tokens", str(MAX_TOKENS)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for("the engine", lambda: get(port, "/v1/models")[0] == 200)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def chat(port: int) -> tuple[int, int]:
    """One chat over a new connection (so consecutive ones spread over the workers):
    (status, tokens the reply says it used)."""
    body = json.dumps({"model": "tiny", "max_tokens": MAX_TOKENS,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"Authorization": f"Bearer {KEY}",
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            usage = json.loads(r.read())["usage"]
            return int(r.status), int(usage["total_tokens"])
    except urllib.error.HTTPError as e:
        return e.code, 0


def test_daily_quota_is_exact_to_one_in_flight_request_per_worker(
        tmp_path: Path, engine: int) -> None:
    """Two clients, each with one request in flight at a time over fresh connections, spend
    one key's daily token budget through two workers: the workers see each other's
    reservations through the peer protocol, so the spend passes the budget by at most one
    in-flight request per worker (each request's estimate covers its real usage), and every
    request after that is refused with 429."""
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    budget = REQUESTS_IN_BUDGET * PER_REQUEST
    cfg = tmp_path / "pharos.yaml"
    cfg.write_text("listen: 127.0.0.1:0\nworkers: 2\n"
                   f"drain: {{grace: 0s, timeout: 20s}}\n"
                   f"backends:\n  - url: http://127.0.0.1:{engine}\n    kind: vllm\n"
                   f"keys:\n  - name: quota\n    sha256: {digest}\n"
                   f"    tokens_per_day: {budget}\n")
    log = tmp_path / "out.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([TWISTD, "-n", "--pidfile=", "pharos", "-c", str(cfg)],
                                stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        port = bound_port(log)
        wait_for("both workers up", lambda: workers_up(port) == {"0": 1.0, "1": 1.0})
        spent: list[int] = []
        refused: list[int] = []
        lock = threading.Lock()

        def client() -> None:
            for _ in range(REQUESTS_IN_BUDGET * 2):
                code, tokens = chat(port)
                with lock:
                    if code == 200:
                        assert tokens <= PER_REQUEST
                        spent.append(tokens)
                    else:
                        refused.append(code)
                        if len(refused) >= 6:
                            return

        threads = [threading.Thread(target=client) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=WAIT * 2)
        assert not any(t.is_alive() for t in threads)
        assert set(refused) == {429}, refused
        assert sum(spent) >= budget - PER_REQUEST
        assert sum(spent) <= budget + 2 * PER_REQUEST, (sum(spent), budget)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
