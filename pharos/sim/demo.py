"""``twistd -n pharos --demo``: Pharos on 127.0.0.1:8090 in front of three engine doubles on
loopback (two Ollama-like hosts that each fit only some of three models, one vLLM-like), so a
fresh machine with no engine answers real requests."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from twisted.application.service import IService, MultiService, Service
from twisted.internet.interfaces import IListeningPort

from pharos.config import Backend, Config, Listen
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

    def startService(self) -> None:
        super().startService()
        print(CURL_HINT, file=sys.stderr)

    def stopService(self) -> None:
        super().stopService()
        for d in self.doubles:
            d.stop()
        for p in self.ports:
            p.stopListening()


CURL_HINT = (
    "Pharos demo on http://127.0.0.1:8090 in front of three simulated engines. Try:\n"
    "  curl -N http://127.0.0.1:8090/v1/chat/completions -H 'content-type: application/json'"
    " -d '{\"model\":\"llama3.2:3b\",\"stream\":true,"
    "\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]}'\n"
    "  curl http://127.0.0.1:8090/v1/models\n"
)


def demo_service(reactor: Any, config: Config | None = None) -> IService:
    """The demo's service tree; ``config`` (optional) supplies anything but the backends."""
    from pharos.tap import build

    doubles: list[EngineDouble] = []
    ports: list[IListeningPort] = []
    backends: list[Backend] = []
    for seed in (0, 1):
        d, p = start_double("ollama", reactor, host_memory=int(HOST_GB * 1e9), slots=2,
                            seed=seed, **KNOBS)
        doubles.append(d)
        ports.append(p)
        backends.append(Backend(url=d.url, kind="ollama", memory_gb=HOST_GB, capacity=2))
    d, p = start_double("vllm", reactor, slots=8, **KNOBS)
    doubles.append(d)
    ports.append(p)
    backends.append(Backend(url=d.url, kind="vllm"))
    base = config or Config(listen=Listen(DEMO_LISTEN))
    cfg = dataclasses.replace(base, backends=tuple(backends))
    top = MultiService()
    SimulatedFleet(doubles, ports).setServiceParent(top)
    build(cfg, reactor).setServiceParent(top)
    return top
