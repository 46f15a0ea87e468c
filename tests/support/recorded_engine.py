"""A llama.cpp that answers only with what the real one served (fixtures/llamacpp/b11312/idle):
its status pages, and for each client request the recorded reply of the same route and kind
(plain, streamed, streamed with usage). The engine doubles serve chat, completions and Ollama's
native routes; this one adds the Anthropic ``/v1/messages`` and OpenAI ``/v1/responses``
replies llama.cpp recorded, so clients of those routes run at layer 3 too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from twisted.internet.interfaces import IListeningPort
from twisted.web.server import Request

from pharos.engine.capture import Capture
from tests.support.capture_server import CaptureResource, serve

CAPTURE = Path(__file__).resolve().parents[2] / "fixtures" / "llamacpp" / "b11312" / "idle"


class RecordedLlamacpp(CaptureResource):
    """GETs as the capture; POSTs with the recorded reply for the route and stream flags."""

    def __init__(self) -> None:
        from twisted.internet import reactor

        super().__init__(Capture.load(CAPTURE), reactor)
        self.posts: list[str] = []

    def render_POST(self, request: Request) -> Any:
        path = request.path.decode()
        assert request.content is not None
        try:
            doc = json.loads(request.content.read() or b"{}")
        except ValueError:
            doc = {}
        streamed = isinstance(doc, dict) and doc.get("stream") is True
        usage = streamed and isinstance(doc.get("stream_options"), dict) and \
            doc["stream_options"].get("include_usage") is True
        self.posts.append(path)
        replies = [r for r in self.capture.replies if r.path == path]
        wanted = [r for r in replies if r.name.endswith("_stream_usage") == usage
                  and ("_stream" in r.name) == streamed]
        if not replies:
            request.setResponseCode(404)
            return b'{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}'
        reply = (wanted or replies)[0]
        request.setResponseCode(reply.status)
        request.setHeader(b"content-type", reply.content_type.encode())
        return reply.body


def start_recorded_llamacpp() -> tuple[IListeningPort, str]:
    """Listen on a free loopback port; the port and its URL."""
    return serve(RecordedLlamacpp())
