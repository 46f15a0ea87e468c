"""What treq's ``HTTPClient.request`` adds on the engine leg (issue 16 item 2), in process: one
``relay.send`` through treq over ``EngineAgent`` against the same call straight to
``EngineAgent.request``, both over a stub connection that answers at once (no sockets, no
HTTP parsing: only the layers). treq wraps every request in ``CookieAgent`` (a
``_FakeStdlibRequest``, i.e. a URL parse, and the jar's header check) and
``ContentDecoderAgent`` (a header copy, an ``accept-encoding``), and its response in
``_Response``. Run under callgrind at two ``--n`` and difference for instructions per request.

Usage: python treq_layer_cost.py --side treq|agent --n N
"""

from __future__ import annotations

import argparse
from typing import Any

from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.internet.defer import Deferred, succeed
from twisted.web.client import HTTPConnectionPool
from twisted.web.http_headers import Headers

from pharos.engine.agent import EngineAgent, NoCookies
from pharos.proxy.relay import send


class Stub:
    """An answered response."""

    code = 200
    phrase = b"OK"
    version = (b"HTTP", 1, 1)
    length = 10
    previousResponse = None
    request = None

    def __init__(self) -> None:
        self.headers = Headers({b"content-type": [b"application/json"]})

    def deliverBody(self, protocol: Any) -> None:
        pass


class StubAgent(EngineAgent):
    def _requestWithEndpoint(self, *a: Any) -> Deferred[Any]:
        return succeed(Stub())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", choices=("treq", "agent"), required=True)
    ap.add_argument("--n", type=int, default=1000)
    a = ap.parse_args()
    agent = StubAgent(reactor, pool=HTTPConnectionPool(reactor, persistent=True))
    client = HTTPClient(agent, cookiejar=NoCookies())
    url = "http://127.0.0.1:8000/v1/chat/completions"
    got: list[Any] = []
    for _ in range(a.n):
        if a.side == "treq":
            send(client, url, b'{"model":"m"}').addCallback(got.append)
        else:
            agent.request(b"POST", url.encode(),
                          Headers({b"content-type": [b"application/json"]}),
                          None).addCallback(got.append)
        got.clear()


if __name__ == "__main__":
    main()
