"""Request bodies bounded while they arrive.

twisted.web reads the whole body before dispatch, spilling anything over 100 kB to a temporary
file. Pharos keeps bodies in memory (no disk I/O on the hot path) and stops reading one at its
limit: the client gets 413 in its API's error shape and the connection is closed.
"""

from __future__ import annotations

from collections.abc import Callable
from io import BytesIO
from typing import Any, ClassVar

from twisted.web.server import Request

from pharos.proxy.errors import is_ollama_path, too_large

#: Default body limit (room for base64 images).
MAX_BODY_BYTES = 32 * 1024 * 1024


class BoundedRequest(Request):
    """A request whose body may not pass ``max_body`` bytes."""

    max_body = MAX_BODY_BYTES
    #: Told of each 413 (the request and its path), so a refused body still makes a ``Done``.
    on_too_large: ClassVar[Callable[[Request, bytes], None] | None] = None

    def __init__(self, *args: Any, **kw: Any) -> None:
        # No form parsing: twisted.web parses every POST's Content-Type with the ``email``
        # package (about 30 us) to fill ``args`` from a form body; Pharos reads JSON only.
        kw.setdefault("parsePOSTFormSubmission", False)
        super().__init__(*args, **kw)
        self._received = 0
        self._refused = False

    def gotLength(self, length: int | None) -> None:
        self.content = BytesIO()
        if length is not None and length > self.max_body:
            self._refuse()

    def handleContentChunk(self, data: bytes) -> None:
        if self._refused:
            return
        self._received += len(data)
        if self._received > self.max_body:
            self._refuse()
            return
        assert self.content is not None
        self.content.write(data)

    def process(self) -> None:
        if not self._refused:
            super().process()

    def _refuse(self) -> None:
        """Answer 413 at once and close: the rest of the body is never read."""
        self._refused = True
        self.content = BytesIO()
        path = getattr(self.channel, "_path", b"") or b""  # the URI is set only after the body
        body = too_large(self.max_body).body(ollama=is_ollama_path(path))
        head = (b"HTTP/1.1 413 Request Entity Too Large\r\n"
                b"Content-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n"
                b"Connection: close\r\n\r\n")
        transport = self.channel.transport
        assert transport is not None
        transport.write(head + body)
        transport.loseConnection()
        hook = type(self).on_too_large
        if hook is not None:
            hook(self, path)


def bounded_request_factory(limit: int, on_too_large: Callable[[Request, bytes], None] | None
                            = None) -> type[BoundedRequest]:
    """A request class with its own limit, telling ``on_too_large`` of each 413."""
    return type("BoundedRequest", (BoundedRequest,),
                {"max_body": limit, "on_too_large": staticmethod(on_too_large)
                 if on_too_large is not None else None})
