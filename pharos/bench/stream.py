"""Reading one streamed chat reply as it arrives: when its first token came, its usage, and how
it ended.

The first token is the first event carrying a generated token (``pharos.sim.wire.
is_token_event``, the doubles' rule): not the role chunk opening a vLLM or llama.cpp stream
with empty content, but vLLM's empty-text chunk for a token ending inside a UTF-8 sequence
does count. Usage is read with ``pharos.engine.usage.parse_usage``, Pharos's own parse, so
each engine's fields mean the same here. After the first token only events that can carry
usage or an error are decoded.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss

from pharos.engine.usage import USAGE_KEYS, Usage, parse_usage
from pharos.sim.wire import is_token_event

#: Byte markers of the events worth decoding once the first token is in.
_MARKERS = (*(f'"{k}"'.encode() for k in sorted(USAGE_KEYS)), b'"error"')
#: A line longer than this without a newline is not an event stream; stop buffering it.
_MAX_LINE = 1 << 24


class StreamReader(Protocol):
    """Collects one reply body; ``done`` fires (with ``None``) when the body ends, however it
    ends. Times come from ``clock`` at the moment the bytes are read."""

    def __init__(self, clock: IReactorTime) -> None:
        self.clock = clock
        self.first_token: float | None = None
        self.ended: float | None = None
        self.usage: Usage | None = None
        self.saw_done = False
        self.stream_error = False
        #: How the body ended: ``None`` cleanly, else the failure.
        self.failure: Failure | None = None
        self.done: Deferred[None] = Deferred()
        self._buffer = b""

    def dataReceived(self, data: bytes) -> None:
        """Split into lines and read every complete ``data:`` line."""
        self._buffer += data
        if b"\n" not in data:
            if len(self._buffer) > _MAX_LINE:
                self._buffer = b""
            return
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            self._line(line)

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.saw_done = True
            return
        if self.first_token is not None and not any(m in payload for m in _MARKERS):
            return
        try:
            event: Any = json.loads(payload)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if self.first_token is None and is_token_event(event):
            self.first_token = self.clock.seconds()
        if "error" in event:
            self.stream_error = True
        usage = parse_usage(event)
        if usage is not None:
            self.usage = usage

    def connectionLost(self, reason: Failure = ResponseDone) -> None:  # type: ignore[assignment]
        """The body is over: note when and how, then fire ``done``."""
        if self._buffer:
            self._line(self._buffer)
            self._buffer = b""
        self.ended = self.clock.seconds()
        clean = reason.check(ResponseDone) or (reason.check(PotentialDataLoss) and self.saw_done)
        self.failure = None if clean else reason
        self.done.callback(None)

    def cancel(self) -> None:
        """Stop reading: the connection is dropped, ``done`` fires with the failure."""
        if self.transport is not None and not self.done.called:
            self.transport.stopProducing()  # type: ignore[attr-defined]
