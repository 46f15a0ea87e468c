"""twistd's entry: ``Options`` and ``makeService``, the one composition root (DESIGN §1)."""

from __future__ import annotations

from typing import Any

from twisted.application import strports
from twisted.application.service import IService, MultiService
from twisted.internet.error import CannotListenError
from twisted.python import usage
from twisted.web.server import Site

from pharos.config import Config, ConfigError, load_config
from pharos.proxy.public import PublicAPI


class Options(usage.Options):
    """``twistd pharos -c FILE``: a config that does not parse never starts the service."""

    optParameters = [["config", "c", None, "the Pharos config file (YAML)"]]

    def postOptions(self) -> None:
        """Load and validate the config now, so twistd refuses to start on a bad file."""
        path = self["config"]
        if not path:
            raise usage.UsageError("-c/--config FILE is required")
        try:
            self["parsed"] = load_config(path)
        except ConfigError as e:
            raise usage.UsageError(f"{path}: invalid config\n{e}") from None
        except OSError as e:
            raise usage.UsageError(f"{path}: {e.strerror}") from None


class ListenError(Exception):
    """The public port cannot be bound; twistd prints this (cut to 100 bytes) and exits 1."""


class PharosService(MultiService):
    """The top of the service tree; children start in order and stop in reverse."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.public = PublicAPI()

    def privilegedStartService(self) -> None:
        """Bind the listeners; a busy port fails start-up with a message naming it."""
        try:
            super().privilegedStartService()
        except CannotListenError as e:
            why = e.socketError.strerror if isinstance(e.socketError, OSError) else e.socketError
            where = f"{e.interface or '*'}:{e.port}"
            raise ListenError(f"cannot listen on {where}: {why}") from None


def makeService(options: Any) -> IService:
    """Wire the service tree from the parsed config."""
    config: Config = options["parsed"]
    top = PharosService(config)
    site = Site(top.public.app.resource())
    # strports raises at start when the port is busy, so twistd exits non-zero naming it.
    strports.service(config.listen.strports(), site).setServiceParent(top)
    top.public.ready = True
    return top
