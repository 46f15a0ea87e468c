"""``twistd -n pharos --demo``: Pharos on 127.0.0.1:8090 in front of three engine doubles on
loopback (two Ollama-like hosts that each fit only some of three models, one vLLM-like), so a
fresh machine with no engine answers real requests."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, TextIO

import attr
from twisted.application import strports
from twisted.application.service import IService, MultiService, Service
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.interfaces import IListeningPort, IReactorTCP, IReactorTime

from pharos.config import Backend, Config, Listen
from pharos.service import PharosService
from pharos.sim.double import EngineDouble, start_double

#: Where the demo listens.
DEMO_LISTEN = "127.0.0.1:8090"
#: Each Ollama-like host holds two of the three models at once (7.5 GB of 7.8 GB in all).
HOST_GB = 7.5
#: A demo that answers in seconds: prefill 0.5 ms a token, decode 20 ms a token, load 3 s.
KNOBS: dict[str, Any] = {"prefill_s": 0.0005, "decode_s": 0.02, "load_s": 3.0,
                         "max_output_tokens": 48}


class SimulatedFleet(Service):
    """The doubles' lifetime: stopped with the service tree."""

    def __init__(self, doubles: list[EngineDouble], ports: list[IListeningPort]) -> None:
        self.doubles = doubles
        self.ports = ports

    def stopService(self) -> None:
        super().stopService()
        for d in self.doubles:
            d.stop()
        for p in self.ports:
            p.stopListening()


def curl_hint(port: int | None) -> str:
    """What the demo shows a newcomer once it serves: where, and two requests to try."""
    base = f"http://127.0.0.1:{port or 8090}"
    return (
        f"\nPharos demo on {base} in front of three simulated engines. Try:\n"
        f"  curl -N {base}/v1/chat/completions -H 'content-type: application/json'"
        " -d '{\"model\":\"llama3.2:3b\",\"stream\":true,"
        "\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]}'\n"
        f"  curl {base}/v1/models\n"
        f"  open {base}/status in a browser\n\n"
    )


class ReadyHint(Service):
    """Prints ``curl_hint`` once, when Pharos is ready: restored and its public listener open
    (not before the fleet answers, not when the port could not be bound). It goes to the
    process's real standard output, where ``twistd -n`` writes its log, as plain lines: under
    twistd, ``print`` (``sys.stdout``/``sys.stderr``) would become ``[stdout#info]`` or
    ``[stderr#error]`` log events."""

    def __init__(self, pharos: PharosService, out: TextIO | None = None) -> None:
        self.pharos = pharos
        self.out = out

    def startService(self) -> None:
        super().startService()
        starting = self.pharos.starting
        if starting is not None:
            starting.addBoth(self._show)

    def _show(self, result: object) -> object:
        p = self.pharos
        listener = p.public_listener
        if p.health.restored and not p.stopping and listener is not None and listener.running:
            out = self.out or sys.__stdout__
            if out is not None:
                out.write(curl_hint(p.config.listen.port()))
                out.flush()
        return result


def demo_service(reactor: IReactorTime, config: Config | None = None,
                 own_process: bool = False) -> IService:
    """The demo's service tree; ``config`` (optional) supplies anything but the backends;
    ``own_process``: twistd runs it (``PharosService.from_config``)."""
    doubles: list[EngineDouble] = []
    ports: list[IListeningPort] = []
    backends: list[Backend] = []
    tcp = IReactorTCP(reactor)
    for seed in (0, 1):
        d, p = start_double("ollama", tcp, host_memory=int(HOST_GB * 1e9), slots=2,
                            seed=seed, **KNOBS)
        doubles.append(d)
        ports.append(p)
        backends.append(Backend(url=d.url, kind="ollama", memory_gb=HOST_GB, capacity=2))
    d, p = start_double("vllm", tcp, slots=8, **KNOBS)
    doubles.append(d)
    ports.append(p)
    backends.append(Backend(url=d.url, kind="vllm"))
    base = config or Config(listen=Listen(DEMO_LISTEN))
    cfg = dataclasses.replace(base, backends=tuple(backends))
    return _Demo(SimulatedFleet(doubles, ports), PharosService.from_config(
        reactor, cfg, listen=strports.service, own_process=own_process))


@attr.s(auto_attribs=True, eq=False)
class _Demo(MultiService):
    """The demo's top: on stop, Pharos drains in front of a live fleet, and only then do the
    engine doubles stop (MultiService would stop them at once, and Pharos would report its
    engines unreachable and ejected while draining)."""

    fleet: SimulatedFleet
    pharos: PharosService

    def __attrs_post_init__(self) -> None:
        MultiService.__init__(self)
        self.fleet.setServiceParent(self)
        self.pharos.setServiceParent(self)
        ReadyHint(self.pharos).setServiceParent(self)  # started after Pharos: ``starting`` set

    def stopService(self) -> Deferred[None]:
        Service.stopService(self)
        for child in self:
            if child is not self.pharos and child is not self.fleet:
                child.stopService()
        d = maybeDeferred(self.pharos.stopService)
        d.addBoth(lambda _: self.fleet.stopService())
        return d
