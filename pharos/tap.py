"""twistd's entry: ``Options`` and ``makeService``. The service tree itself is built in
``pharos.service``; the demo and the supervisor of workers are chosen here."""

from __future__ import annotations

import os

from twisted.application import strports
from twisted.application.service import IService
from twisted.logger import Logger
from twisted.python import usage

from pharos.config import Config, ConfigError, exposure_warning, load_config
from pharos.discovery.docker import socket_from_env
from pharos.service import PharosService

log = Logger()


#: ``--log-level`` values; ``debug`` adds the request line.
LOG_LEVELS = ("info", "debug")


class Options(usage.Options):
    """``twistd pharos -c FILE`` (or ``--demo``): a config that does not parse never starts."""

    optParameters = [["config", "c", None, "the Pharos config file (YAML)"],
                     ["log-level", None, "info",
                      "info, or debug: also one line per request (spec section 13)"],
                     ["worker", None, None,
                      "internal: set by the supervisor of workers: N (pharos.workers)"]]
    optFlags = [["demo", None, "serve in front of three simulated engines on loopback"]]

    def opt_version(self) -> None:
        """Print Pharos's version and exit (twistd --version prints Twisted's)."""
        from pharos import __version__

        print(f"pharos {__version__}")
        raise SystemExit(0)

    def postOptions(self) -> None:
        """Load and validate the config now, so twistd refuses to start on a bad file."""
        if self["log-level"] not in LOG_LEVELS:
            raise usage.UsageError(f"--log-level is one of {', '.join(LOG_LEVELS)}, not "
                                   f"{self['log-level']!r}")
        path = self["config"]
        if self["demo"]:
            try:
                self["parsed"] = load_config(path) if path else None
            except ConfigError as e:
                raise usage.UsageError(f"{path}: invalid config\n{e}") from None
            return
        if not path:
            raise usage.UsageError("-c/--config FILE is required (or --demo)")
        try:
            self["parsed"] = load_config(path)
        except ConfigError as e:
            raise usage.UsageError(f"{path}: invalid config\n{e}") from None
        except OSError as e:
            raise usage.UsageError(f"{path}: {e.strerror}") from None


def makeService(options: Options) -> IService:
    """Wire the service tree from the parsed config (or the demo fleet)."""
    from twisted.internet import reactor

    parsed: Config | None = options["parsed"]
    if parsed is not None and options["worker"] is None:  # workers: their supervisor says it
        risk = exposure_warning(parsed)
        if risk is not None:
            log.warn("{risk}", risk=risk)
    if options["demo"]:  # the engine doubles are imported only for the demo
        from pharos.sim.demo import demo_service

        return demo_service(reactor, options["parsed"], own_process=True)
    config: Config = options["parsed"]
    if options["worker"] is None and config.workers > 1:
        from pharos.workers import Supervisor

        return Supervisor(config, options["config"], reactor, log_level=options["log-level"])
    docker_socket, why = socket_from_env(os.environ)
    if docker_socket is None:
        log.info("Docker discovery off: {why}", why=why)
    request_log = options["log-level"] == "debug"
    if options["worker"] is not None:
        from pharos.workers import worker_service

        return worker_service(config, options["config"], options["worker"], reactor,
                              request_log=request_log, docker_socket=docker_socket)
    return PharosService.from_config(
        reactor, config, config_path=options["config"], request_log=request_log,
        docker_socket=docker_socket, listen=strports.service, own_process=True)
