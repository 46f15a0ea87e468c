"""Hot reload (spec §10): the config file is read again when its modification time changes
(checked every ``RELOAD_EVERY`` seconds). Keys, tenants and static backends apply live; any
other changed field is logged as needing a restart; a file that does not parse is logged with
every error and the running config stays.

The check is a ``stat`` every 10 s on the reactor thread (microseconds, off the request
path); the read and parse run only when the file changed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from twisted.application.internet import TimerService
from twisted.logger import Logger

from pharos.config import Config, ConfigError, load_config, reload_diff

log = Logger()

#: Seconds between checks of the config file's modification time (spec §10).
RELOAD_EVERY = 10.0


class ConfigWatcher(TimerService):
    """Re-reads ``path`` when it changes and hands the new config to ``apply`` (which takes
    the live fields); ``current`` is the config in force."""

    def __init__(self, path: str, current: Config, apply: Callable[[Config], None],
                 interval: float = RELOAD_EVERY) -> None:
        super().__init__(interval, self.check)
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
        """One check; True when a new config was applied."""
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            new = load_config(self.path)
        except ConfigError as e:
            log.error("config {path} not reloaded, the running config stays:\n{errors}",
                      path=self.path, errors=str(e))
            return False
        live, restart = reload_diff(self.current, new)
        if restart:
            log.warn("config {path}: {fields} changed and need a restart; not applied",
                     path=self.path, fields=", ".join(restart))
        if not live:
            return False
        applied = dataclasses.replace(self.current, **{f: getattr(new, f) for f in live})
        self.apply(applied)
        self.current = applied
        log.info("config {path} reloaded: {fields}", path=self.path, fields=", ".join(live))
        return True
