"""Layer 3 set-up: Pharos in front of engine doubles, all on loopback in this process."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import treq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IListeningPort
from twisted.internet.task import deferLater
from twisted.web.client import HTTPConnectionPool
from twisted.web.http_headers import Headers

from pharos.config import Backend as BackendSpec
from pharos.config import Config, Listen, Timeouts
from pharos.service import PharosService
from pharos.sim.double import EngineDouble, start_double
from tests.support.capture_server import close, serve

#: Fast doubles: tests wait on events, not on the latency model.
FAST = {"prefill_s": 0.00005, "decode_s": 0.002, "load_s": 0.2}


@dataclass
class Fleet:
    """Pharos (``url``) in front of ``doubles``; ``client`` talks to Pharos."""

    doubles: list[EngineDouble]
    pharos: PharosService
    url: str
    pool: HTTPConnectionPool
    ports: list[IListeningPort] = field(default_factory=list)

    async def post(self, path: str, body: dict[str, Any], **kw: Any) -> Any:
        return await treq.post(self.url + path, json.dumps(body).encode(),
                               headers=Headers({b"content-type": [b"application/json"]}),
                               pool=self.pool, **kw)

    async def chat(self, model: str, stream: bool = False, **extra: Any) -> Any:
        body = {"model": model, "messages": [{"role": "user", "content": "hello there"}],
                "max_tokens": 8, "stream": stream, **extra}
        return await self.post("/v1/chat/completions", body)

    def target(self, double: EngineDouble, model: str) -> Any:
        return next(t for t in self.pharos.state.targets
                    if t.backend.url == double.url and t.model == model)

    async def stop(self) -> None:
        await self.pool.closeCachedConnections()
        await self.pharos.stopService()
        for d in self.doubles:
            d.stop()
        for p in self.ports:
            await close(p)


async def start_fleet(engines: Sequence[tuple[str, dict[str, Any], dict[str, Any]]],
                      policy: str = "cost", extra: Sequence[str] = (),
                      timeouts: Timeouts | None = None, **config: Any) -> Fleet:
    """Start one double per (kind, double options, backend options) and Pharos in front;
    ``extra``: more backend URLs (engines the test serves itself), detected by kind;
    ``config``: more Config fields (keys, tenants, usage)."""
    doubles, ports, specs = [], [], []
    for kind, opts, backend in engines:
        d, port = start_double(kind, reactor, **{**FAST, **opts})
        doubles.append(d)
        ports.append(port)
        specs.append(BackendSpec(url=d.url, **backend))
    specs.extend(BackendSpec(url=u) for u in extra)
    cfg = Config(listen=Listen("127.0.0.1:0"), policy=policy,  # type: ignore[arg-type]
                 backends=tuple(specs), timeouts=timeouts or Timeouts(), **config)
    top = PharosService.from_config(reactor, cfg, load_interval=0.1)
    top.startService()
    listening, url = serve(top.site)
    ports.append(listening)
    await top.state.when_ready()
    pool = HTTPConnectionPool(reactor, persistent=False)
    return Fleet(doubles, top, url, pool, ports)


def sleep(seconds: float) -> Deferred[None]:
    """Real time passing (component tests only)."""
    return deferLater(reactor, seconds, lambda: None)


def within(d: Deferred[Any], seconds: float = 30.0) -> Deferred[Any]:
    """``d``, failed with TimeoutError if it has not fired in ``seconds`` (a regression fails
    the test instead of hanging it)."""
    return d.addTimeout(seconds, reactor)


async def eventually(check: Any, timeout: float = 5.0) -> None:
    """Wait until ``check()`` is true, polling the real reactor."""
    waited = 0.0
    while not check():
        assert waited < timeout, "condition not reached in time"
        await sleep(0.02)
        waited += 0.02
