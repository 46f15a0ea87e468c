"""Pharos with keys and a fleet, for the status and live-map pages."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import treq
from twisted.internet.interfaces import IListeningPort
from twisted.web.http_headers import Headers

from pharos.config import Key
from pharos.obs.pages import Pages
from pharos.proxy.auth import digest
from tests.support.capture_server import close, serve
from tests.support.fleet import Fleet, start_fleet

ADMIN, USER = "phk-admin", "phk-user"


#: A key name and a model name an operator or a client could choose: markup, quotes, newline.
EVIL = '<script>alert("x")</script>\'\n'
KEYS = (Key(name="ops", sha256=digest(ADMIN), admin=True),
        Key(name=EVIL, sha256=digest(USER)))


#: Sent in every prompt; must appear on no page and in no event.
MARKER = "PROMPT-MARKER-7f3a9c"


@dataclass
class PagesRig:
    """A fleet, its pages mounted, and a site serving both (``url``)."""

    fleet: Fleet
    pages: Pages
    url: str
    port: IListeningPort

    async def close(self) -> None:
        await close(self.port)
        await self.fleet.stop()

    async def get(self, path: str, key: str | None = ADMIN) -> tuple[int, bytes, Headers]:
        headers = Headers({b"authorization": [f"Bearer {key}".encode()]} if key else {})
        r = await treq.get(self.url + path, headers=headers, pool=self.fleet.pool)
        return r.code, await r.content(), r.headers

    async def chat(self, model: str = "tiny", key: str = USER, text: str = MARKER,
                   stream: bool = False) -> tuple[int, bytes]:
        body = {"model": model, "max_tokens": 6, "stream": stream,
                "messages": [{"role": "user", "content": f"{text} please"}]}
        if stream:
            body["stream_options"] = {"include_usage": True}
        r = await treq.post(self.url + "/v1/chat/completions", json.dumps(body).encode(),
                            headers=Headers({b"content-type": [b"application/json"],
                                             b"authorization": [f"Bearer {key}".encode()]}),
                            pool=self.fleet.pool)
        return r.code, await r.content()


async def start_pages(keys: tuple[Key, ...] = KEYS, **config: Any) -> PagesRig:
    """Two vLLM doubles and an Ollama double behind Pharos, with the pages mounted."""
    fleet = await start_fleet([("vllm", {}, {"kind": "vllm"}),
                               ("vllm", {"seed": 1}, {"kind": "vllm"}),
                               ("ollama", {"loaded": ["llama3.2:3b"]}, {"kind": "ollama"})],
                              keys=keys, **config)
    port, url = serve(fleet.pharos.site)
    return PagesRig(fleet, fleet.pharos.pages, url, port)
