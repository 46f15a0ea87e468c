"""Unloading the models a cold load pushes out, before it is sent.

An Ollama host needing room takes the idle model with the shortest keep-alive, then the lowest
model path (server/sched.go ``findRunnerToUnload``): an order blind to which models are asked
for, so on a full host it can push out the most popular one. Pharos prices every idle model's
eviction and names the cheapest (``Lease.unload``); a request with no prompt and
``keep_alive: 0`` expires it before the reply (server/routes.go ``GenerateHandler``, sched.go
``expireRunner``), so the load sent after takes that one first.

Failure costs nothing but the choice: the load is sent anyway and the host picks its own
victim, so an unload that fails or is slow (``UNLOAD_TIMEOUT_SEC`` for the whole step) is
logged and dropped. A model loaded for good (``keep_alive`` below 0: ``/api/ps`` says it
expires in about 292 years) is never unloaded by Pharos: the host then chooses, as it would
have, and keeps it last.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Final

from treq.client import HTTPClient
from twisted.internet.defer import CancelledError, Deferred, ensureDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from pharos.proxy.relay import collect, send

log = Logger()

#: Seconds the step may take before the load is sent without it (Ollama answers at once:
#: the expiry is set before the reply; the unload itself runs after it).
UNLOAD_TIMEOUT_SEC: Final = 2.0
#: Ollama's route for it (a generate request with no prompt).
UNLOAD_PATH: Final = "/api/generate"
#: Where Ollama lists its loaded models with their ``expires_at``.
PS_PATH: Final = "/api/ps"
#: An ``expires_at`` this many years ahead or more is a model loaded for good (Ollama:
#: ``keep_alive`` < 0 gives about 292 years, the year 2318 in every capture).
PINNED_YEARS: Final = 100


def unload_body(model: str) -> bytes:
    """The request that unloads ``model`` (no prompt, ``keep_alive: 0``)."""
    return json.dumps({"model": model, "keep_alive": 0}).encode()


def unload(client: HTTPClient, clock: IReactorTime, url: str, models: Sequence[str]
           ) -> Deferred[int]:
    """Asks the host at ``url`` to unload each of ``models``, one after the other; fires with
    how many it accepted (never fails: a failure is logged and the load goes ahead)."""

    deadline = clock.seconds() + UNLOAD_TIMEOUT_SEC

    def left() -> float:
        return max(0.05, deadline - clock.seconds())

    async def run() -> int:
        accepted = 0
        keep = await _pinned(client, clock, url, left)
        for model in models:
            if model in keep:
                log.info("{url}: {model} is loaded for good (keep_alive < 0): not unloaded for "
                         "a load, the host chooses", url=url, model=model)
                continue
            d = send(client, url + UNLOAD_PATH, unload_body(model))
            d.addTimeout(left(), clock)
            try:
                response = await d
                body = collect(response, 4096)
                body.addTimeout(left(), clock)
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


async def _pinned(client: HTTPClient, clock: IReactorTime, url: str,
                  left: Callable[[], float]) -> frozenset[str]:
    """The models the host has loaded for good (none when ``/api/ps`` does not say)."""
    d = send(client, url + PS_PATH, b"", method="GET")
    d.addTimeout(left(), clock)
    try:
        response = await d
        body = collect(response, 1 << 20)
        body.addTimeout(left(), clock)
        raw = await body
        if response.code != 200:
            return frozenset()
        return pinned_models(raw, datetime.now(UTC).year + PINNED_YEARS)
    except CancelledError:
        raise
    except Exception as e:
        log.warn("{url}: reading {path} before an unload failed: {why}", url=url,
                 path=PS_PATH, why=str(e) or type(e).__name__)
        return frozenset()


def pinned_models(body: bytes, year: int) -> frozenset[str]:
    """The names in an ``/api/ps`` body whose ``expires_at`` is in ``year`` or later (its
    first four characters: RFC 3339, Go's ``time.Time``). Unreadable: none."""
    try:
        doc = json.loads(body)
        models = doc.get("models") if isinstance(doc, dict) else None
    except ValueError:
        return frozenset()
    out = set()
    for m in models if isinstance(models, list) else ():
        if not isinstance(m, dict):
            continue
        name, expires = m.get("name"), m.get("expires_at")
        if (isinstance(name, str) and isinstance(expires, str) and expires[:4].isdigit()
                and int(expires[:4]) >= year):
            out.add(name)
    return frozenset(out)
