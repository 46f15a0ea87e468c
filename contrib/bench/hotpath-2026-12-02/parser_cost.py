"""What a C parser (httptools) could save on the engine leg (issue 16 item 2): the CPU of one
request/reply exchange on a kept-alive connection through Twisted's HTTP/1.1 client protocol
(request written, reply parsed, ``Response`` built, body delivered to a protocol, connection
back to idle) against httptools parsing the same reply bytes into headers and body callbacks
(the least a httptools-based agent would do; it would still build a request, a ``Response``
and run the pool). In-process, no sockets: microseconds per exchange, best of 7 runs.

Usage: python parser_cost.py [--n 20000]
"""

from __future__ import annotations

import argparse
import importlib
import time
from typing import Any

from twisted.internet.protocol import Protocol
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web._newclient import HTTP11ClientProtocol, Request
from twisted.web.http_headers import Headers

# Not a dependency of Pharos (the point of this script is to price it): `pip install httptools`.
httptools: Any = importlib.import_module("httptools")

BODY = (b'{"id":"chatcmpl-1","object":"chat.completion","created":1764680000,"model":"tiny",'
        b'"choices":[{"index":0,"message":{"role":"assistant","content":"lorem"},'
        b'"finish_reason":"length"}],"usage":{"prompt_tokens":9,"completion_tokens":1,'
        b'"total_tokens":10}}')
REPLY = (b"HTTP/1.1 200 OK\r\ndate: Wed, 02 Dec 2026 14:00:00 GMT\r\nserver: uvicorn\r\n"
         b"content-length: %d\r\ncontent-type: application/json\r\n\r\n" % len(BODY)) + BODY
REQ_BODY = b'{"model":"tiny","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}'


class Sink(Protocol):
    def dataReceived(self, data: bytes) -> None:
        pass

    def connectionLost(self, reason: Failure | None = None) -> None:
        pass


def twisted_exchange(n: int) -> float:
    transport = StringTransport()
    proto = HTTP11ClientProtocol()
    proto.makeConnection(transport)
    headers = Headers({b"content-type": [b"application/json"], b"host": [b"127.0.0.1:8000"]})
    t0 = time.perf_counter()
    for _ in range(n):
        from io import BytesIO
        req = Request._construct(b"POST", b"/v1/chat/completions", headers,
                                 _Bytes(REQ_BODY), persistent=True)
        d = proto.request(req)
        got: list[Any] = []
        d.addCallback(got.append)
        proto.dataReceived(REPLY)
        got[0].deliverBody(Sink())
        transport.clear()
        del BytesIO
    return (time.perf_counter() - t0) / n * 1e6


class _Bytes:
    """A body producer that writes its bytes at once (what treq's is for ``bytes`` data)."""

    def __init__(self, data: bytes) -> None:
        self.length = len(data)
        self.data = data

    def startProducing(self, consumer: Any) -> Any:
        from twisted.internet.defer import succeed
        consumer.write(self.data)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


def httptools_parse(n: int) -> float:
    class CB:
        def __init__(self) -> None:
            self.headers: list[tuple[bytes, bytes]] = []
            self.body: list[bytes] = []
            self.done = False

        def on_header(self, name: bytes, value: bytes) -> None:
            self.headers.append((name, value))

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            self.done = True

    cb = CB()
    parser = httptools.HttpResponseParser(cb)
    head = (b"POST /v1/chat/completions HTTP/1.1\r\ncontent-type: application/json\r\n"
            b"host: 127.0.0.1:8000\r\ncontent-length: %d\r\n\r\n" % len(REQ_BODY))
    t0 = time.perf_counter()
    for _ in range(n):
        out = head + REQ_BODY  # the request's bytes, as a minimal writer would make them
        cb.headers = []
        cb.body = []
        parser.feed_data(REPLY)
        assert cb.done and out
        cb.done = False
        parser.get_status_code()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--only", choices=("twisted", "httptools"), default=None,
                    help="run one side once (for callgrind: Ir at two --n, differenced)")
    a = ap.parse_args()
    if a.only:
        (twisted_exchange if a.only == "twisted" else httptools_parse)(a.n)
        return
    tw = min(twisted_exchange(a.n) for _ in range(7))
    ht = min(httptools_parse(a.n) for _ in range(7))
    print(f"twisted HTTP11ClientProtocol exchange: {tw:.1f} us; httptools parse (+ request "
          f"bytes): {ht:.1f} us; the most a httptools agent could save: {tw - ht:.1f} us a "
          f"request")


if __name__ == "__main__":
    main()
