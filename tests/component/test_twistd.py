"""The twistd service as an operator runs it: real processes on loopback ports."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.twistd import BIN, TWISTD, free_port, wait_healthy

PHAROS = str(BIN / "pharos")


@pytest.fixture
def config(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    port = free_port()
    path = tmp_path / "pharos.yaml"
    path.write_text(f"listen: 127.0.0.1:{port}\n")
    yield path, port


def test_foreground_serves_and_sigterm_stops_cleanly(
    config: tuple[Path, int], tmp_path: Path
) -> None:
    """twistd -n pharos -c FILE serves on the configured port (its start-up objects frozen
    out of the collector's reach before the listener opens); SIGTERM shuts it down cleanly."""
    path, port = config
    proc = subprocess.Popen([TWISTD, "-n", "--pidfile", str(tmp_path / "p.pid"), "pharos",
                             "-c", str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=tmp_path)
    try:
        assert wait_healthy(port) == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
            assert r.read() == b"Ollama is running"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    # twistd re-raises the signal that stopped it once shutdown is done, as daemons should.
    assert proc.returncode in (0, -signal.SIGTERM), out.decode()
    assert b"Server Shut Down" in out
    assert b"Traceback" not in out
    assert not (tmp_path / "p.pid").exists()
    frozen = re.search(rb"(\d+) start-up objects frozen", out)
    assert frozen and int(frozen[1]) > 10_000, out.decode()[-2000:]


def test_daemon_pidfile_refuses_second_start(config: tuple[Path, int], tmp_path: Path) -> None:
    """A daemonized instance writes its pidfile; a second start with it is refused."""
    path, port = config
    pid, log = tmp_path / "pharos.pid", tmp_path / "pharos.log"
    cmd = [TWISTD, "--pidfile", str(pid), "--logfile", str(log), "pharos", "-c", str(path)]
    first = subprocess.run(cmd, capture_output=True, timeout=30, cwd=tmp_path)
    assert first.returncode == 0, first.stderr.decode()
    try:
        assert wait_healthy(port) == 200
        assert pid.exists()
        second = subprocess.run(cmd, capture_output=True, timeout=30, cwd=tmp_path)
        assert second.returncode != 0
        assert b"Another twistd server is running" in second.stdout + second.stderr
    finally:
        daemon = int(pid.read_text())
        os.kill(daemon, signal.SIGTERM)
        deadline = time.monotonic() + 15
        # twistd removes its pidfile before it logs its last line: wait for both.
        while (pid.exists() or "Server Shut Down" not in log.read_text()) and \
                time.monotonic() < deadline:
            time.sleep(0.1)
    assert not pid.exists(), "the daemon did not stop on SIGTERM"
    assert "Server Shut Down" in log.read_text()


@pytest.mark.parametrize("daemon", [False, True])
def test_busy_port_exits_nonzero_naming_it(tmp_path: Path, daemon: bool) -> None:
    """A port that is taken fails start-up, foreground or daemon, with a message naming it."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"listen: 127.0.0.1:{port}\n")
        opts = ["--pidfile", str(tmp_path / "p.pid")]
        opts += ["--logfile", str(tmp_path / "l.log")] if daemon else ["-n"]
        r = subprocess.run([TWISTD, *opts, "pharos", "-c", str(cfg)], capture_output=True,
                           timeout=30, cwd=tmp_path)
    assert r.returncode != 0
    assert f"127.0.0.1:{port}".encode() in r.stdout + r.stderr


def test_bad_config_never_starts(tmp_path: Path) -> None:
    """A config that does not parse is refused before anything starts, every error listed."""
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("listen: 127.0.0.1:1\npolicy: fastest\nbackends:\n  - kind: vllm\n")
    r = subprocess.run([TWISTD, "-n", "--pidfile=", "pharos", "-c", str(cfg)],
                       capture_output=True, timeout=30, cwd=tmp_path)
    out = (r.stdout + r.stderr).decode()
    assert r.returncode != 0
    assert ("policy: expected one of cost, least-load, round-robin, random, p2c, prefix-hash, "
            "got 'fastest'") in out
    assert "backends[0]: missing required field 'url'" in out


def test_demo_with_a_bad_config_prints_its_errors(tmp_path: Path) -> None:
    """``twistd pharos --demo -c bad.yaml`` lists every error of the config and exits
    non-zero, with no traceback."""
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("policy: fastest\ndrain: {grace: soon}\n")
    r = subprocess.run([TWISTD, "-n", "--pidfile=", "pharos", "--demo", "-c", str(cfg)],
                       capture_output=True, timeout=30, cwd=tmp_path)
    out = (r.stdout + r.stderr).decode()
    assert r.returncode != 0
    assert ("policy: expected one of cost, least-load, round-robin, random, p2c, prefix-hash, "
            "got 'fastest'") in out
    assert "drain.grace: expected a duration" in out
    assert "Traceback" not in out


def test_pharos_check_exit_codes(tmp_path: Path) -> None:
    """pharos check exits 0 on a valid file and 1 on an invalid one, naming the error."""
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("backends:\n  - url: http://127.0.0.1:8000\n    kind: vllm\n")
    bad.write_text("backends:\n  - url: http://127.0.0.1:8000\n    capacty: 4\n")
    ok = subprocess.run([PHAROS, "check", "-c", str(good)], capture_output=True, timeout=30)
    assert ok.returncode == 0, ok.stderr.decode()
    no = subprocess.run([PHAROS, "check", "-c", str(bad)], capture_output=True, timeout=30)
    assert no.returncode == 1
    assert b"backends[0]: unknown field 'capacty'" in no.stderr
