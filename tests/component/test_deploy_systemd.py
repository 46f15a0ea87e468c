"""The systemd unit, the daemonized twistd form and its logrotate snippet (issue 18 item 1).

The unit is checked by ``systemd-analyze verify`` where that tool exists (Debian's ``systemd``
package); the daemonized form runs for real: ``twistd --pidfile --logfile`` with SIGUSR1
rotating the log, and ``logrotate`` (where installed) driving that rotation.
"""

from __future__ import annotations

import datetime
import grp
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pharos.config import DEFAULT_DRAIN_GRACE, DEFAULT_DRAIN_TIMEOUT, load_config
from pharos.workers import STOP_MARGIN

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "contrib/systemd/pharos.service"
UNIT_CONFIG = ROOT / "contrib/systemd/pharos.yaml"
LOGROTATE = ROOT / "contrib/logrotate/pharos"
BIN = Path(sys.executable).parent
TWISTD = str(BIN / "twistd")
PHAROS = str(BIN / "pharos")
#: Where the unit expects the virtualenv (its own install instructions).
UNIT_BIN = "/opt/pharos/bin/"


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """A unit file's sections as (key, value) lists, repeated keys kept in order."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"a directive outside any section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not a directive: {line!r}"
        current.append((key.strip(), value.strip()))
    return sections


def one(section: list[tuple[str, str]], key: str) -> str:
    """The value of a directive that must appear exactly once."""
    values = [v for k, v in section if k == key]
    assert len(values) == 1, f"{key}= appears {len(values)} times"
    return values[0]


def verify_unit(unit: Path, tmp_path: Path) -> str | None:
    """``systemd-analyze verify`` of ``unit`` with the virtualenv's commands in place of
    ``/opt/pharos/bin`` (verify requires every command to exist); ``None`` when it says
    nothing, else everything it said. It exits 0 on many problems (an unknown key, a bad
    signal name), reporting them on stderr, so any output is a failure."""
    copy = tmp_path / unit.name
    copy.write_text(unit.read_text().replace(UNIT_BIN, f"{BIN}/"))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", "--generators=no", str(copy)],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    said = (r.stdout + r.stderr).strip()
    if r.returncode != 0 or said:
        return f"systemd-analyze verify exited {r.returncode}:\n{said}"
    return None


needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is not installed (Debian's systemd package); .ci/run installs it")


def test_unit_follows_twistd_conventions() -> None:
    """The unit runs ``twistd -n pharos`` as a dedicated user, restarts on failure, stops with
    SIGTERM (twistd's drain) with TimeoutStopSec above drain grace + timeout of both the
    defaults and the config it ships, reloads with SIGHUP, and is hardened."""
    unit = parse_unit(UNIT.read_text())
    service = unit["Service"]
    assert one(service, "ExecStart") == (
        f"{UNIT_BIN}twistd -n --pidfile= pharos -c /etc/pharos/pharos.yaml")
    assert one(service, "ExecStartPre") == f"{UNIT_BIN}pharos check -c /etc/pharos/pharos.yaml"
    assert one(service, "ExecReload") == "/bin/kill -HUP $MAINPID"
    assert one(service, "KillSignal") == "SIGTERM"
    assert one(service, "Restart") in ("on-failure", "always")
    assert one(service, "User") not in ("root", "0")
    stop = one(service, "TimeoutStopSec")
    assert stop.isdigit(), f"TimeoutStopSec={stop}: plain seconds expected"
    drain = load_config(UNIT_CONFIG).drain
    # workers: N: the supervisor waits grace + timeout + STOP_MARGIN for its workers.
    assert int(stop) > DEFAULT_DRAIN_GRACE + DEFAULT_DRAIN_TIMEOUT + STOP_MARGIN
    assert int(stop) > drain.grace + drain.timeout + STOP_MARGIN
    for key, value in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                       ("ProtectHome", "yes"), ("PrivateTmp", "yes"),
                       ("CapabilityBoundingSet", "")]:
        assert one(service, key) == value, key
    assert one(unit["Install"], "WantedBy") == "multi-user.target"


def test_unit_config_passes_pharos_check() -> None:
    """The config the unit's ExecStartPre checks (shipped beside it) passes ``pharos check``,
    and its state file lives under the unit's StateDirectory."""
    r = subprocess.run([PHAROS, "check", "-c", str(UNIT_CONFIG)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    state_dir = one(parse_unit(UNIT.read_text())["Service"], "StateDirectory")
    assert load_config(UNIT_CONFIG).state_file == f"/var/lib/{state_dir}/pharos.state"


@needs_analyze
def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """``systemd-analyze verify`` says nothing about the unit (its message fails the test)."""
    problem = verify_unit(UNIT, tmp_path)
    if problem is not None:
        pytest.fail(problem)


@needs_analyze
def test_a_broken_unit_fails_with_the_validators_message(tmp_path: Path) -> None:
    """A misspelt signal name and a directive in the wrong section make ``verify_unit``
    fail with systemd-analyze's own words (it exits 0 on both)."""
    broken = tmp_path / "broken" / "pharos.service"
    broken.parent.mkdir()
    text = UNIT.read_text().replace("KillSignal=SIGTERM", "KillSignal=SIGTREM")
    broken.write_text(text.replace("[Service]\n", "[Service]\nStartLimitIntervalSec=60\n"))
    problem = verify_unit(broken, tmp_path)
    assert problem is not None
    assert "Failed to parse signal name" in problem and "SIGTREM" in problem
    assert "Unknown key 'StartLimitIntervalSec' in section [Service]" in problem


# --- the daemonized form ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, ok: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll ``ok()`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            return int(r.status) == 200
    except OSError:
        return False


@contextmanager
def daemon(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """``twistd --pidfile --logfile pharos -c FILE`` daemonized; yields its pid and log file,
    then stops it with SIGTERM by its pid and waits for its pidfile to go."""
    port = free_port()
    cfg = tmp_path / "pharos.yaml"
    cfg.write_text(f"listen: 127.0.0.1:{port}\ndrain: {{grace: 0s, timeout: 1s}}\n")
    pidfile, logfile = tmp_path / "pharos.pid", tmp_path / "pharos.log"
    r = subprocess.run([TWISTD, "--pidfile", str(pidfile), "--logfile", str(logfile),
                        "pharos", "-c", str(cfg)], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    wait_for("the pidfile", pidfile.exists)
    pid = int(pidfile.read_text())
    try:
        wait_for("/healthz 200", lambda: healthy(port))
        yield pid, logfile
    finally:
        os.kill(pid, signal.SIGTERM)
        wait_for("the daemon to remove its pidfile on SIGTERM", lambda: not pidfile.exists())


def sighup_line(pid: int, logfile: Path) -> None:
    """Send SIGHUP (config reload) and wait for its log line in ``logfile``."""
    os.kill(pid, signal.SIGHUP)
    wait_for(f"the reload's line in {logfile.name}",
             lambda: logfile.exists() and "SIGHUP" in logfile.read_text())


def test_sigusr1_rotates_the_daemons_log(tmp_path: Path) -> None:
    """SIGUSR1 makes a daemonized twistd rename pharos.log to pharos.log.1 (with the start-up
    lines) and carry on in a new pharos.log."""
    with daemon(tmp_path) as (pid, logfile):
        rotated = tmp_path / "pharos.log.1"
        os.kill(pid, signal.SIGUSR1)
        wait_for("pharos.log.1", rotated.exists)
        assert "public listener open" in rotated.read_text()
        sighup_line(pid, logfile)
        assert "public listener open" not in logfile.read_text()
        assert "SIGHUP" not in rotated.read_text()


@pytest.mark.skipif(shutil.which("logrotate") is None,
                    reason="logrotate is not installed (Debian's logrotate); .ci/run installs it")
def test_logrotate_snippet_rotates_a_running_daemon(tmp_path: Path) -> None:
    """contrib/logrotate/pharos, forced once against a running daemon (its paths moved under
    a temporary directory, its ``su`` user the test's): the start-up lines end in
    pharos.log-YYYYMMDD, closed by twistd on the signal; new lines go to a new pharos.log; the
    empty pharos.log.1 is removed."""
    conf = tmp_path / "logrotate.conf"
    text = LOGROTATE.read_text()
    assert "/var/log/pharos/" in text and "/run/pharos/pharos.pid" in text
    assert "\n    su pharos pharos\n" in text
    me = f"su {pwd.getpwuid(os.getuid()).pw_name} {grp.getgrgid(os.getgid()).gr_name}"
    text = text.replace("su pharos pharos", me).replace("/var/log/pharos", str(tmp_path))
    conf.write_text(text.replace("/run/pharos/pharos.pid", str(tmp_path / "pharos.pid")))
    conf.chmod(0o644)
    with daemon(tmp_path) as (pid, logfile):
        r = subprocess.run(["logrotate", "-v", "-f", "-s", str(tmp_path / "state"), str(conf)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        dated = tmp_path / f"pharos.log-{datetime.date.today():%Y%m%d}"
        assert dated.exists(), sorted(p.name for p in tmp_path.iterdir())
        assert "public listener open" in dated.read_text()
        assert not (tmp_path / "pharos.log.1").exists()
        sighup_line(pid, logfile)
        assert "SIGHUP" not in dated.read_text()
        assert "public listener open" not in logfile.read_text()
    assert not [p for p in tmp_path.iterdir() if re.fullmatch(r"pharos\.log\.\d+", p.name)]
