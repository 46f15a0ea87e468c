"""Pharos in this process in front of one live engine, for the cache-aware routing checks:
send chat requests through it and read what the prefix index predicted and learned."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import treq
from twisted.internet import reactor
from twisted.internet.interfaces import IListeningPort
from twisted.web.client import HTTPConnectionPool
from twisted.web.http_headers import Headers

from pharos.config import Backend, Config, Listen
from pharos.sched import Scheduler
from pharos.service import PharosService
from tests.support.capture_server import close, serve
from tests.support.fleet import eventually


@dataclass
class Reply:
    """One reply through Pharos: what it predicted and what the engine reported."""

    predicted: int | None
    cached: int | None
    doc: dict[str, Any] = field(repr=False)


@dataclass
class Front:
    """Pharos (``url``) in front of one engine."""

    pharos: PharosService
    url: str
    listening: IListeningPort
    pool: HTTPConnectionPool

    @property
    def sched(self) -> Scheduler:
        return self.pharos.sched

    async def chat(self, system: str, question: str) -> Reply:
        """One non-streamed chat; waits until Pharos has learned from it."""
        before = sum(self.sched.outcomes.values())
        body = {"model": "tiny", "max_tokens": 2, "temperature": 0,
                "messages": [{"role": "system", "content": system},
                             {"role": "user", "content": question}]}
        r = await treq.post(self.url + "/v1/chat/completions", json.dumps(body).encode(),
                            headers=Headers({b"content-type": [b"application/json"]}),
                            pool=self.pool)
        doc = json.loads(await r.content())
        assert r.code == 200, doc
        header = r.headers.getRawHeaders(b"x-pharos-predicted-cached-tokens")
        await eventually(lambda: sum(self.sched.outcomes.values()) == before + 1, timeout=10)
        usage = doc.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        if cached is None and isinstance(doc.get("timings"), dict):
            cached = doc["timings"].get("cache_n")
        return Reply(int(header[0]) if header else None, cached, doc)

    async def stop(self) -> None:
        await self.pool.closeCachedConnections()
        await self.pharos.stopService()
        await close(self.listening)


async def front(url: str, kind: str, load_interval: float = 0.5) -> Front:
    """Start Pharos in front of the engine at ``url`` and wait for its first round; rounds
    every ``load_interval`` s (half the default, so tests learn sooner)."""
    config = Config(listen=Listen("127.0.0.1:0"), backends=(Backend(url=url, kind=kind),))  # type: ignore[arg-type]
    pharos = PharosService.from_config(reactor, config, load_interval=load_interval)
    pharos.startService()
    listening, base = serve(pharos.site)
    await pharos.state.when_ready()
    return Front(pharos, base, listening, HTTPConnectionPool(reactor, persistent=False))
