"""A llama.cpp that answers ``/v1/responses`` with its recorded replies (fixtures/llamacpp/
b11312/idle), each with a fresh response id as a real engine gives, keeping every request
body it received (what Pharos forwarded). ``cut_next``: the next streamed reply stops half
way with the connection aborted (an engine dying mid-reply). Like llama.cpp it refuses
``previous_response_id`` (it keeps no state)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from twisted.internet.interfaces import IListeningPort
from twisted.web.server import NOT_DONE_YET, Request

from tests.support.capture_server import serve
from tests.support.recorded_engine import RecordedLlamacpp

RECORDED_IDS = (b"resp_CmuluP1zd0Z3KZjzxCsboRBEtzEz9E4r", b"resp_24Ge5fFyP3NCM47QQ9VYDMGZ18yQECZI")


class ResponsesEngine(RecordedLlamacpp):
    """See the module docstring; ``received``: the decoded /v1/responses bodies received."""

    def __init__(self) -> None:
        super().__init__()
        self.received: list[dict[str, Any]] = []
        self.ids: list[str] = []
        self.cut_next = False

    def render_POST(self, request: Request) -> Any:
        if request.path != b"/v1/responses":
            return super().render_POST(request)
        assert request.content is not None
        doc = json.loads(request.content.read())
        self.received.append(doc)
        if doc.get("previous_response_id"):
            request.setResponseCode(400)
            return (b'{"error":{"code":400,"message":"llama.cpp does not support '
                    b'\'previous_response_id\'.","type":"invalid_request_error"}}')
        streamed = doc.get("stream") is True
        name = "responses_stream" if streamed else "responses"
        reply = next(r for r in self.capture.replies if r.name == name)
        rid = f"resp_{uuid.uuid4().hex}"
        self.ids.append(rid)
        body = reply.body
        for old in RECORDED_IDS:
            body = body.replace(old, rid.encode())
        request.setResponseCode(reply.status)
        request.setHeader(b"content-type", reply.content_type.encode())
        if streamed and self.cut_next:
            self.cut_next = False
            request.write(body[: body.index(b"event: response.output_text.done")])
            transport = request.channel.transport if request.channel is not None else None
            assert transport is not None
            # Once the half is on its way (an abort at once would discard it unsent).
            self.clock.callLater(0.3, transport.abortConnection)  # type: ignore[attr-defined]
            return NOT_DONE_YET
        return body


def start_responses_engine() -> tuple[ResponsesEngine, IListeningPort, str]:
    """Listen on a free loopback port: the engine, its port and its URL."""
    engine = ResponsesEngine()
    port, url = serve(engine)
    return engine, port, url
