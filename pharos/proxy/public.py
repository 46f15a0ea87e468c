"""The public Klein app. The data plane's routes land here (spec §9)."""

from __future__ import annotations

import json

from klein import Klein
from twisted.web.iweb import IRequest

#: Ollama clients probe ``HEAD /`` before every command, without a key.
OLLAMA_BANNER = b"Ollama is running"


class PublicAPI:
    """The routes clients call; ``ready`` gates ``/healthz``."""

    app = Klein()

    def __init__(self) -> None:
        self.ready = False

    @app.route("/", methods=["GET", "HEAD"])
    def root(self, request: IRequest) -> bytes:
        """Answer like Ollama, so the ollama CLI talks to Pharos."""
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        return OLLAMA_BANNER

    @app.route("/healthz", methods=["GET", "HEAD"])
    def healthz(self, request: IRequest) -> bytes:
        """503 until the instance may route, so a load balancer never sends it traffic blind."""
        request.setHeader(b"content-type", b"application/json")
        if not self.ready:
            request.setResponseCode(503)
            return json.dumps({"status": "starting"}).encode()
        return json.dumps({"status": "ok"}).encode()
