"""Unloading the models a cold load pushes out, before it is sent (issue 15 item 1).

An Ollama host that needs room for a model takes the idle one with the shortest keep-alive,
then the lowest model path (server/sched.go ``findRunnerToUnload``): an order that has nothing
to do with which models are asked for, so on a full host it can push out the most popular
one. Pharos prices every idle model's eviction and names the cheapest (``Lease.unload``); a
request with no prompt and ``keep_alive: 0`` makes its keep-alive 0 and expires it before
the reply (server/routes.go ``GenerateHandler``, sched.go ``expireRunner``), so the load sent
after the reply takes that one first.

Failure costs nothing but the choice: the load is sent anyway and the host picks its own
victim, so an unload that fails or is slow (``UNLOAD_TIMEOUT_SEC``) is logged and dropped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final

from treq.client import HTTPClient
from twisted.internet.defer import CancelledError, Deferred, ensureDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from pharos.proxy.relay import collect, send

log = Logger()

#: Seconds an unload may take before the load is sent without it (Ollama answers at once:
#: the expiry is set before the reply; the unload itself runs after it).
UNLOAD_TIMEOUT_SEC: Final = 2.0
#: Ollama's route for it (a generate request with no prompt).
UNLOAD_PATH: Final = "/api/generate"


def unload_body(model: str) -> bytes:
    """The request that unloads ``model`` (no prompt, ``keep_alive: 0``)."""
    return json.dumps({"model": model, "keep_alive": 0}).encode()


def unload(client: HTTPClient, clock: IReactorTime, url: str, models: Sequence[str]
           ) -> Deferred[int]:
    """Asks the host at ``url`` to unload each of ``models``, one after the other; fires with
    how many it accepted (never fails: a failure is logged and the load goes ahead)."""

    async def run() -> int:
        accepted = 0
        for model in models:
            d = send(client, url + UNLOAD_PATH, unload_body(model))
            d.addTimeout(UNLOAD_TIMEOUT_SEC, clock)
            try:
                response = await d
                body = collect(response, 4096)
                body.addTimeout(UNLOAD_TIMEOUT_SEC, clock)
                await body
            except CancelledError:
                raise  # the client left: so does its load
            except Exception as e:
                log.warn("{url}: unloading {model} before a load failed: {why}", url=url,
                         model=model, why=str(e) or type(e).__name__)
                continue
            if response.code == 200:
                accepted += 1
            else:
                log.warn("{url}: unloading {model} before a load answered {code}", url=url,
                         model=model, code=response.code)
        return accepted

    return ensureDeferred(run())
