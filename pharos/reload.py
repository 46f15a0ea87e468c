"""Hot reload: the config file is read again when its modification time changes (a ``stat``
every ``RELOAD_EVERY`` seconds on the reactor), on SIGHUP, and on ``POST /admin/reload``.
The live fields (``config.LIVE_FIELDS``) apply; any other changed field is logged as needing
a restart; a file that does not parse is logged with every error and the config stays.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from twisted.application.service import Service
from twisted.internet.interfaces import IReactorFromThreads, IReactorTime
from twisted.logger import Logger

from pharos.config import (
    Config,
    ConfigError,
    Reloaded,
    file_name,
    load_config,
    reload_diff,
    with_live,
)
from pharos.periodic import Periodic

log = Logger()

#: Seconds between checks of the config file's modification time.
RELOAD_EVERY = 10.0

_Handler = Callable[[int, FrameType | None], Any] | int | None


class ConfigWatcher(Periodic):
    """Re-reads ``path`` when it changes (or when told to) and hands ``apply`` the config in
    force (``current``) with the changed live fields. The first check runs at start."""

    def __init__(self, path: str, current: Config, apply: Callable[[Config], None],
                 clock: IReactorTime, interval: float = RELOAD_EVERY) -> None:
        super().__init__(clock, interval, self.check, now=True,
                         what=f"config {path}: applying the reloaded config")
        self.path = path
        self.current = current
        self.apply = apply
        self._stamp = self._stat()

    def _stat(self) -> tuple[float, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime, st.st_size

    def check(self) -> bool:
        """The timer's check: reload when the file's mtime or size changed; True when a new
        config was applied."""
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return False
        return bool(self.reload().applied)

    def reload(self) -> Reloaded:
        """Read the file now, changed or not (SIGHUP, ``/admin/reload``), and apply its live
        fields; what happened, for the caller to show."""
        self._stamp = self._stat()
        try:
            new = load_config(self.path)
        except ConfigError as e:
            log.error("config {path} not reloaded, the running config stays:\n{errors}",
                      path=self.path, errors=str(e))
            return Reloaded(errors=tuple(e.errors))
        live, restart = reload_diff(self.current, new)
        shown = Reloaded(applied=tuple(dict.fromkeys(map(file_name, live))),
                         restart=tuple(dict.fromkeys(map(file_name, restart))))
        if restart:
            log.warn("config {path}: {fields} changed and need a restart; not applied",
                     path=self.path, fields=", ".join(shown.restart))
        if live:
            applied = with_live(self.current, new, live)
            self.apply(applied)
            self.current = applied
            log.info("config {path} reloaded: {fields}", path=self.path,
                     fields=", ".join(shown.applied))
        elif not restart:
            log.info("config {path} read again: nothing changed", path=self.path)
        return shown


class Sighup(Service):
    """SIGHUP calls ``reload`` on the reactor thread while this service runs.

    The handler only schedules (``callFromThread``, as Twisted's own SIGINT handler does): a
    signal arrives between any two bytecodes, and the reload touches state the reactor owns.
    twistd leaves HUP alone; the handler there before comes back when the service stops,
    unless someone replaced ours meanwhile. Nothing is installed off the main thread
    (``signal.signal`` works only there) or where the platform has no SIGHUP."""

    def __init__(self, reactor: IReactorFromThreads, reload: Callable[[], object]) -> None:
        self.reactor = reactor
        self.reload = reload
        self._previous: _Handler = None
        self._installed = False

    def startService(self) -> None:
        super().startService()
        hup = getattr(signal, "SIGHUP", None)
        if hup is None or threading.current_thread() is not threading.main_thread():
            return
        self._previous = signal.signal(hup, self._handle)
        self._installed = True

    def stopService(self) -> None:
        super().stopService()
        if not self._installed:
            return
        self._installed = False
        if signal.getsignal(signal.SIGHUP) == self._handle:
            # None: a handler not installed from Python; the default is the nearest.
            previous = signal.SIG_DFL if self._previous is None else self._previous
            signal.signal(signal.SIGHUP, previous)
        self._previous = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.reactor.callFromThread(self._reload)

    def _reload(self) -> None:
        log.info("SIGHUP: reading the config file again")
        try:
            self.reload()
        except Exception:
            log.failure("reload on SIGHUP failed; the running config stays")
