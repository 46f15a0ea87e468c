"""The floor's relays for ``pharos bench overhead --floor``: the least a router on Pharos's
stack can do for one request, each run as its own process.

- ``web``: a bare ``twisted.web`` resource answering a canned chat reply itself, no engine leg.
- ``web-agent``: a ``twisted.web`` resource relaying to the engine through ``Agent`` on a
  persistent ``HTTPConnectionPool``.
- ``klein-treq``: the same as a Klein route through treq on a persistent pool, as Pharos's
  engine leg is built.

Both relays read the whole engine reply before answering (the floor's chat is not streamed).
Run: ``python -m pharos.bench.floor_relay MODE PORT [ENGINE_URL]``.
"""

from __future__ import annotations

import sys
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IConsumer, IReactorTime
from twisted.web.client import Agent, HTTPConnectionPool, readBody
from twisted.web.http_headers import Headers
from twisted.web.iweb import IBodyProducer, IResponse
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site
from zope.interface import implementer

MODES = ("web", "web-agent", "klein-treq")
#: A vLLM-like one-token chat reply for ``web``.
CANNED = (b'{"id":"chatcmpl-floor","object":"chat.completion","created":0,"model":"floor",'
          b'"choices":[{"index":0,"message":{"role":"assistant","content":"x"},'
          b'"finish_reason":"length"}],"usage":{"prompt_tokens":1,"total_tokens":2,'
          b'"completion_tokens":1}}')
JSON = b"application/json"


@implementer(IBodyProducer)
class BytesBody:
    """A request body already in memory, written at once."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.length = len(data)

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        consumer.write(self.data)
        return succeed(None)

    def pauseProducing(self) -> None:
        """Nothing to pause: written at once."""

    def resumeProducing(self) -> None:
        """Nothing to resume."""

    def stopProducing(self) -> None:
        """Nothing to stop."""


class Canned(Resource):
    """``web``: answers every request with ``CANNED``."""

    isLeaf = True

    def render(self, request: Request) -> bytes:
        _body(request)
        request.setHeader(b"content-type", JSON)
        return CANNED


class AgentRelay(Resource):
    """``web-agent``: the request body to the engine through ``Agent``, the reply back."""

    isLeaf = True

    def __init__(self, reactor: IReactorTime, engine: bytes) -> None:
        super().__init__()
        pool = HTTPConnectionPool(reactor, persistent=True)
        pool.maxPersistentPerHost = 128
        self.agent = Agent(reactor, pool=pool)
        self.engine = engine

    def render(self, request: Request) -> Any:
        body = _body(request)
        ctype = request.getHeader(b"content-type") or JSON
        d = self.agent.request(request.method, self.engine + request.uri,
                               Headers({b"content-type": [ctype]}), BytesBody(body))

        def got(response: IResponse) -> Deferred[None]:
            request.setResponseCode(response.code)
            request.setHeader(b"content-type",
                              (response.headers.getRawHeaders(b"content-type") or [JSON])[0])
            return readBody(response).addCallback(lambda data: _finish(request, data))

        d.addCallback(got)
        d.addErrback(lambda f: _fail(request, f))
        return NOT_DONE_YET


def _body(request: Request) -> bytes:
    content = request.content
    return b"" if content is None else content.read()


def _finish(request: Request, data: bytes) -> None:
    request.write(data)
    request.finish()


def _fail(request: Request, failure: Any) -> None:
    if request.finished or request._disconnected:
        return
    request.setResponseCode(502)
    request.setHeader(b"content-type", JSON)
    request.write(b'{"error":{"message":"engine failed","type":"server_error","code":502}}')
    request.finish()


def klein_treq(reactor: IReactorTime, engine: str) -> Resource:
    """``klein-treq``: a Klein route relaying through treq."""
    from klein import Klein
    from treq.client import HTTPClient

    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = 128
    client = HTTPClient(Agent(reactor, pool=pool))
    app = Klein()

    @app.route("/<path:rest>", methods=["POST", "GET"])
    async def relay(request: Request, rest: str) -> bytes:
        body = _body(request)
        ctype = request.getHeader(b"content-type") or JSON
        response = await client.request(request.method.decode(), engine + "/" + rest,
                                        data=body, headers=Headers({b"content-type": [ctype]}))
        request.setResponseCode(response.code)
        request.setHeader(b"content-type",
                          (response.headers.getRawHeaders(b"content-type") or [JSON])[0])
        data: bytes = await response.content()
        return data

    resource: Resource = app.resource()
    return resource


class QuietSite(Site):
    """No access log line per request (Pharos writes none either)."""

    def log(self, request: Any) -> None:
        """Nothing."""


def main(argv: list[str]) -> int:
    """Serve ``MODE`` on ``127.0.0.1:PORT`` until terminated."""
    mode, port = argv[0], int(argv[1])
    engine = argv[2] if len(argv) > 2 else ""
    from twisted.internet import reactor

    if mode == "web":
        root: Resource = Canned()
    elif mode == "web-agent":
        root = AgentRelay(reactor, engine.encode())
    elif mode == "klein-treq":
        root = klein_treq(reactor, engine)
    else:
        print(f"floor_relay: unknown mode {mode!r} (one of {', '.join(MODES)})",
              file=sys.stderr)
        return 2
    reactor.listenTCP(port, QuietSite(root),  # type: ignore[arg-type]
                      interface="127.0.0.1")
    reactor.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
