"""A large blob upload through Pharos with bounded memory: the uploading client and what it
measures, shared by the layer-3 test and the 1 GiB benchmark (``bench/blob_upload.py``)."""

from __future__ import annotations

import functools
import hashlib
import os
import time
from dataclasses import dataclass
from typing import Any

import treq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IConsumer, IDelayedCall
from twisted.internet.task import LoopingCall
from twisted.web.http_headers import Headers
from twisted.web.iweb import IBodyProducer
from zope.interface import implementer

#: The block the upload repeats (random, so nothing on the way can compress it).
BLOCK = os.urandom(1 << 20)
#: Chunks written per reactor turn while not paused.
CHUNK = 64 * 1024


@functools.cache
def digest_of(size: int) -> str:
    """The sha256 digest of ``size`` bytes of ``BLOCK`` repeated."""
    h = hashlib.sha256()
    full, rest = divmod(size, len(BLOCK))
    for _ in range(full):
        h.update(BLOCK)
    h.update(BLOCK[:rest])
    return "sha256:" + h.hexdigest()


@implementer(IBodyProducer)
class Upload:
    """``size`` bytes of ``BLOCK`` repeated, written as fast as the connection takes them
    (a streaming producer: paused while the socket is full). ``cut_at``: stop there and
    abort the connection, an upload cut half way."""

    def __init__(self, size: int, cut_at: int | None = None) -> None:
        self.length = size
        self.sent = 0
        self.cut_at = cut_at
        self.paused = False
        self.pauses = 0
        self._consumer: IConsumer | None = None
        self._done: Deferred[None] = Deferred()
        self._call: IDelayedCall | None = None

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        self._consumer = consumer
        self._schedule()
        return self._done

    def _schedule(self) -> None:
        if self._call is None and not self.paused:
            self._call = reactor.callLater(0, self._write)

    def _write(self) -> None:
        self._call = None
        consumer = self._consumer
        assert consumer is not None
        for _ in range(16):
            if self.paused or self.sent >= self.length:
                break
            if self.cut_at is not None and self.sent >= self.cut_at:
                transport = getattr(consumer, "_transport", None) or getattr(
                    consumer, "transport", None)
                if transport is not None and hasattr(transport, "abortConnection"):
                    transport.abortConnection()
                return
            offset = self.sent % len(BLOCK)
            n = min(CHUNK, self.length - self.sent, len(BLOCK) - offset)
            consumer.write(BLOCK[offset:offset + n])
            self.sent += n
        if self.sent >= self.length:
            if not self._done.called:
                self._done.callback(None)
            return
        self._schedule()

    def pauseProducing(self) -> None:
        self.paused = True
        self.pauses += 1

    def resumeProducing(self) -> None:
        self.paused = False
        self._schedule()

    def stopProducing(self) -> None:
        self.paused = True
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None


def rss_bytes() -> int:
    """This process's resident set size now (Linux ``/proc``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@dataclass
class Measured:
    """One upload: its reply, time and the process's RSS before and at its peak."""

    status: int
    body: bytes
    seconds: float
    rss_before: int
    rss_peak: int
    sent: int
    pauses: int

    @property
    def growth(self) -> int:
        return self.rss_peak - self.rss_before


async def upload(url: str, key: str, size: int, pool: Any,
                 headers: dict[bytes, list[bytes]] | None = None) -> Measured:
    """POST ``size`` bytes to ``url``/api/blobs/<digest> as an admin, sampling RSS every
    50 ms."""
    digest = digest_of(size)
    producer = Upload(size)
    before = peak = rss_bytes()

    def sample() -> None:
        nonlocal peak
        peak = max(peak, rss_bytes())

    sampler = LoopingCall(sample)
    sampler.start(0.05)
    start = time.monotonic()
    try:
        hdrs = Headers({b"authorization": [f"Bearer {key}".encode()],
                        b"content-type": [b"application/octet-stream"], **(headers or {})})
        r = await treq.request("POST", f"{url}/api/blobs/{digest}", data=producer,
                               headers=hdrs, pool=pool)
        body = await r.content()
    finally:
        sampler.stop()
    sample()
    return Measured(r.code, body, time.monotonic() - start, before, peak, producer.sent,
                    producer.pauses)
