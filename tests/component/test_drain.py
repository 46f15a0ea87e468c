"""Drain and the state file as an operator meets them (spec §9, §12): a real ``twistd -n pharos``
on loopback in front of a ``pharos sim-engine`` process, stopped with SIGTERM."""

from __future__ import annotations

import json
import select
import signal
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.drain import PHAROS, until
from tests.support.twistd import TWISTD, free_port, wait_healthy

SYSTEM = "You are a careful assistant. " * 40  # a prefix long enough to predict tokens from


def body(stream: bool, max_tokens: int, user: str = "hello") -> bytes:
    return json.dumps({"model": MODEL, "stream": stream, "max_tokens": max_tokens,
                       "messages": [{"role": "system", "content": SYSTEM},
                                    {"role": "user", "content": user}]}).encode()


MODEL = "tiny"


@pytest.fixture
def engine() -> Iterator[str]:
    """A vLLM double decoding a token every 200 ms, so a stream outlasts the grace."""
    proc = subprocess.Popen([PHAROS, "sim-engine", "--kind", "vllm", "--port", "0",
                             "--model", MODEL, "--decode-ms", "200", "--max-tokens", "1000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "the engine printed no URL within 30 s"
        yield proc.stdout.readline().rsplit(" ", 1)[1].strip()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Pharos:
    """One ``twistd -n pharos -c cfg`` process."""

    def __init__(self, tmp: Path, engine: str, port: int, grace: str = "2s") -> None:
        self.port = port
        self.state = tmp / "pharos.state"
        self.cfg = tmp / "pharos.yaml"
        self.cfg.write_text(
            f"listen: 127.0.0.1:{port}\nstate_file: {self.state}\n"
            f"drain: {{grace: {grace}, timeout: 10m}}\n"
            f"backends:\n  - url: {engine}\n    kind: vllm\n")
        self.proc = subprocess.Popen([TWISTD, "-n", "--pidfile=", "pharos", "-c",
                                      str(self.cfg)], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, cwd=tmp)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def post(self, path: str, data: bytes) -> Any:
        req = urllib.request.Request(self.url(path), data=data,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def healthz(self) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.url("/healthz"), timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def output(self, timeout: float = 60) -> str:
        out, _ = self.proc.communicate(timeout=timeout)
        return out.decode()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


class Stream(threading.Thread):
    """A streamed chat read to its end in a thread; ``started`` once its first line came."""

    def __init__(self, pharos: Pharos, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.pharos, self.max_tokens = pharos, max_tokens
        self.started = threading.Event()
        self.text = ""
        self.error: BaseException | None = None

    def run(self) -> None:
        req = urllib.request.Request(self.pharos.url("/v1/chat/completions"),
                                     data=body(True, self.max_tokens, "tell me more"),
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                lines = []
                for line in r:
                    lines.append(line.decode())
                    self.started.set()
                self.text = "".join(lines)
        except BaseException as e:  # a cut stream, for the assertion to show
            self.error = e
        finally:
            self.started.set()


def refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
    return False


def test_sigterm_drains_writes_the_state_file_and_a_restart_restores_it(
        engine: str, tmp_path: Path) -> None:
    """SIGTERM: /healthz 503 draining at once; a stream in flight finishes with [DONE]; new
    connections are refused after the grace; the process exits and leaves the state file; a
    restarted instance answers /healthz 200 only after restoring it: today's usage is back and
    the restored prefix predicts cached tokens for the same prompt."""
    port = free_port()
    first = Pharos(tmp_path, engine, port)
    try:
        assert wait_healthy(port, timeout=30) == 200
        first.post("/v1/chat/completions", body(False, 4))
        stream = Stream(first, max_tokens=25)  # about 5 s at 200 ms a token
        stream.start()
        assert stream.started.wait(30) and stream.error is None
        first.proc.send_signal(signal.SIGTERM)
        assert until(lambda: first.healthz() == (503, {"status": "draining"}))
        assert until(lambda: refused(port))
        stream.join(60)
        assert stream.error is None, stream.error
        assert stream.text.rstrip().endswith("data: [DONE]"), stream.text[-200:]
        out = first.output()
        assert first.proc.returncode in (0, -signal.SIGTERM), out
        assert "Traceback" not in out, out
        assert first.state.exists(), out
    finally:
        first.kill()

    second = Pharos(tmp_path, engine, port)
    try:
        assert wait_healthy(port, timeout=30) == 200
        with urllib.request.urlopen(second.url("/usage?by=model"), timeout=10) as r:
            rows = json.loads(r.read())["rows"]
        assert sum(row["requests"] for row in rows) == 2, rows
        explained = second.post("/admin/explain/v1/chat/completions", body(False, 4))
        [candidate] = explained["candidates"]
        assert candidate["prediction_source"] == "restored", candidate
        assert candidate["predicted_cached_tokens"] > 0, candidate
        second.proc.send_signal(signal.SIGTERM)
        assert "state file" in second.output()
    finally:
        second.kill()


def test_a_second_sigterm_ends_pharos_at_once(engine: str, tmp_path: Path) -> None:
    """While draining (a long grace, a stream in flight), a second SIGTERM ends the process
    with that signal instead of waiting for the drain."""
    port = free_port()
    pharos = Pharos(tmp_path, engine, port, grace="10m")
    try:
        assert wait_healthy(port, timeout=30) == 200
        stream = Stream(pharos, max_tokens=900)
        stream.start()
        assert stream.started.wait(30)
        pharos.proc.send_signal(signal.SIGTERM)
        assert until(lambda: pharos.healthz() == (503, {"status": "draining"}))
        pharos.proc.send_signal(signal.SIGTERM)
        out = pharos.output(timeout=30)
        assert pharos.proc.returncode == -signal.SIGTERM, out
        assert "ending at once" in out
        assert "ReactorNotRunning" not in out
    finally:
        pharos.kill()
