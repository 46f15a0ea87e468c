"""Child processes of a comparison: engine doubles and Pharos, started on the reactor, waited for
until they answer, and stopped with bounded waits.

Each child logs to a file of its own. An engine double listens on a port the kernel picks and
prints its URL; Pharos gets a free port chosen here. Stopping sends SIGTERM, then SIGKILL after
the grace time; only processes started here are ever signalled.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import treq
from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessDone, ProcessExitedAlready
from twisted.internet.interfaces import IReactorProcess, IReactorTime
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.task import deferLater
from twisted.python.failure import Failure
from twisted.web.client import HTTPConnectionPool

_URL = re.compile(rb"listening on (http://\S+)")
#: Seconds a child has to answer after it starts.
START_TIMEOUT = 60.0
#: Seconds between SIGTERM and SIGKILL, and the wait after SIGKILL.
STOP_GRACE = 10.0
_POLL = 0.1


class StartError(Exception):
    """A child did not come up; the message says which and ends with its log's last lines."""


def console_script(name: str) -> list[str]:
    """The command of a console script installed beside this Python."""
    path = Path(sys.executable).parent / name
    if path.exists():
        return [str(path)]
    if name == "pharos":
        return [sys.executable, "-m", "pharos.cli"]
    raise FileNotFoundError(f"{path}: not installed")


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Child(ProcessProtocol):
    """One child process: its output goes to ``log``; ``url`` fires with the first URL it prints
    after ``listening on`` (when it ``announces`` one); ``ended`` fires with its exit status."""

    def __init__(self, name: str, log: BinaryIO, announces: bool = True) -> None:
        self.name = name
        self.announces = announces
        self.log = log
        self.log_path = Path(log.name) if isinstance(log.name, str) else None
        self.url: Deferred[str] = Deferred()
        self.ended: Deferred[int | None] = Deferred()
        self.exit: int | None = None
        self._head = b""

    def outReceived(self, data: bytes) -> None:
        """Log it; look for the URL until it is found."""
        self.log.write(data)
        if not self.url.called:
            self._head = (self._head + data)[-4096:]
            m = _URL.search(self._head)
            if m:
                self.url.callback(m.group(1).decode())

    def errReceived(self, data: bytes) -> None:
        """Log it."""
        self.log.write(data)

    def processEnded(self, reason: Failure) -> None:
        """Close the log; fire ``ended`` (and fail ``url`` if it never came)."""
        self.exit = 0 if reason.check(ProcessDone) else getattr(reason.value, "exitCode", None)
        self.log.close()
        if self.announces and not self.url.called:
            self.url.errback(StartError(f"{self.name} exited ({self.exit}) before listening:\n"
                                        f"{self.tail()}"))
        self.ended.callback(self.exit)

    @property
    def running(self) -> bool:
        """Whether the process has not ended."""
        return not self.ended.called

    def cpu_seconds(self) -> float | None:
        """User and system CPU seconds used so far (Linux ``/proc``), or ``None`` when unknown."""
        pid = getattr(self.transport, "pid", None)
        if pid is None:
            return None
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None

    def tail(self, lines: int = 15) -> str:
        """The last lines of its log."""
        if self.log_path is None:
            return ""
        if not self.log.closed:
            self.log.flush()
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def spawn(reactor: IReactorProcess, name: str, argv: Sequence[str], log_path: Path,
          cwd: Path | None = None, announces: bool = True) -> Child:
    """Start ``argv`` with its output in ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    child = Child(name, log_path.open("wb"), announces)
    reactor.spawnProcess(child, argv[0], list(argv), env=dict(os.environ),
                         path=str(cwd) if cwd else None, childFDs={0: "w", 1: "r", 2: "r"})
    return child


async def wait_until(reactor: IReactorTime, child: Child, url: str, pool: HTTPConnectionPool,
                     timeout: float = START_TIMEOUT) -> None:
    """Poll ``GET url`` until 200; ``StartError`` if ``child`` ends or ``timeout`` passes first."""
    deadline = reactor.seconds() + timeout
    while True:
        if not child.running:
            raise StartError(f"{child.name} exited ({child.exit}):\n{child.tail()}")
        try:
            response = await treq.get(url, pool=pool, timeout=2.0)
            await treq.content(response)
            if response.code == 200:
                return
        except Exception:  # refused, reset, timed out: not up yet
            pass
        if reactor.seconds() > deadline:
            raise StartError(f"{child.name}: {url} not answering 200 after {timeout:g} s:\n"
                             f"{child.tail()}")
        await deferLater(reactor, _POLL, lambda: None)


async def stop(reactor: IReactorTime, child: Child, grace: float = STOP_GRACE) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; returns once it ended (or gave up
    waiting ``grace`` more seconds after SIGKILL)."""
    for signal, wait in (("TERM", grace), ("KILL", grace)):
        if not child.running:
            return
        _signal(child, signal)
        await _ended_within(reactor, child, wait)


def _signal(child: Child, signal: str) -> None:
    try:
        if child.running and child.transport is not None:
            child.transport.signalProcess(signal)
    except ProcessExitedAlready:
        pass


async def _ended_within(reactor: IReactorTime, child: Child, seconds: float) -> None:
    deadline = reactor.seconds() + seconds
    while child.running and reactor.seconds() < deadline:
        await deferLater(reactor, _POLL, lambda: None)
