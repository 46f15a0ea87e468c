"""Ollama's model management in the engine double: ``/api/pull``, ``/api/push``,
``/api/create``, ``/api/copy``, ``/api/delete`` and ``/api/blobs/:digest``.

Shapes as Ollama's ``server/routes.go`` writes them: pull, push and create stream
``application/x-ndjson`` progress lines (``{"status": "pulling manifest"}``, ``{"status":
"pulling <digest>", "digest", "total", "completed"}``, ..., ``{"status": "success"}``; with
``"stream": false`` only the last), an error mid-stream is a ``{"error": "..."}`` line; copy and
delete answer 200 with no body, or 404 ``{"error": "model 'x' not found"}``; ``HEAD
/api/blobs/:digest`` is 200 or 404; ``POST /api/blobs/:digest`` hashes the body as it arrives
and answers 201, or 400 ``digest mismatch, expected "...", got "..."``.

The double keeps no blob bytes: a blob is its digest and length (``blobs``), hashed as it
arrives (``BlobRequest``, optionally at ``read_rate`` bytes per second). An upload cut before
its end stores nothing and counts in ``cut_uploads``. Pulled, created and copied models join
the catalogue; deleted ones leave it.
"""

from __future__ import annotations

import hashlib
import json
from io import BytesIO
from typing import TYPE_CHECKING, Any

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure
from twisted.web.server import NOT_DONE_YET, Request

from pharos.sim.wire import go_json

if TYPE_CHECKING:
    from pharos.sim.ollama import OllamaFlavor

#: The routes this module answers (``/api/blobs/...`` too).
MANAGE_PATHS = frozenset({b"/api/pull", b"/api/push", b"/api/create", b"/api/copy",
                          b"/api/delete"})
BLOBS = b"/api/blobs/"
NDJSON = b"application/x-ndjson"
#: Seconds between progress lines.
STEP_S = 0.005
#: A pulled model's size when the double has no size for it.
PULLED_SIZE = 2_019_393_189
#: A name the registry does not have (pull fails with Ollama's error line).
MISSING_TAG = ":missing"


def is_manage(path: bytes) -> bool:
    """Whether a path is one of the management routes."""
    return path in MANAGE_PATHS or path.startswith(BLOBS)


class BlobRequest(Request):
    """The double's request class: a blob upload's body is hashed as it arrives, never kept,
    its reads paced by the store's ``read_rate``. Every other body is buffered as usual.
    ``blob_request_class`` makes one per double, with its clock and store."""

    clock: IReactorTime
    store: OllamaManagement | None = None

    hasher: Any = None
    blob_bytes = 0
    _started = 0.0
    _ended = False
    _resume: IDelayedCall | None = None

    def gotLength(self, length: int | None) -> None:
        channel = self.channel
        path = getattr(channel, "_path", b"")
        if getattr(channel, "_command", b"") == b"POST" and path.startswith(BLOBS):
            self.content = BytesIO()
            self.hasher = hashlib.sha256()
            self._started = self.clock.seconds()
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self.hasher is None:
            super().handleContentChunk(data)
            return
        self.hasher.update(data)
        self.blob_bytes += len(data)
        rate = self.store.read_rate if self.store is not None else None
        if rate and self._resume is None and self.channel is not None:
            ahead = self._started + self.blob_bytes / rate - self.clock.seconds()
            if ahead > 0.002:
                self.channel.transport.pauseProducing()  # type: ignore[union-attr]
                self._resume = self.clock.callLater(ahead, self._go_on)

    def _go_on(self) -> None:
        self._resume = None
        if self.channel is not None and self.channel.transport is not None:
            self.channel.transport.resumeProducing()  # type: ignore[attr-defined]

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        self._ended = True
        super().requestReceived(command, path, version)

    def connectionLost(self, reason: Failure) -> None:
        if self._resume is not None and self._resume.active():
            self._resume.cancel()
        if self.hasher is not None and not self._ended and self.store is not None:
            self.store.cut(self.blob_bytes)  # the body never ended: nothing stored
        super().connectionLost(reason)


def blob_request_class(clock: IReactorTime, store: OllamaManagement) -> type[BlobRequest]:
    """The request class of one double's site."""
    return type("BlobRequest", (BlobRequest,), {"clock": clock, "store": store})


class OllamaManagement:
    """The double's model store: its flavor's catalogue and the blobs' digests."""

    def __init__(self, flavor: OllamaFlavor, clock: IReactorTime) -> None:
        self.flavor = flavor
        self.clock = clock
        #: Digest → length of every blob uploaded whole.
        self.blobs: dict[str, int] = {}
        #: Bytes received by each upload cut before its end.
        self.cut_uploads: list[int] = []
        self.pulls = 0
        #: How fast blob uploads are read, bytes per second (None: as they come): a slow
        #: engine, so a client's upload through Pharos must be held back.
        self.read_rate: float | None = None

    def cut(self, received: int) -> None:
        """An upload's connection was lost before its end."""
        self.cut_uploads.append(received)

    def render(self, request: Request) -> bytes | int:
        """Answer one management request."""
        path = request.path
        method = request.method
        if path.startswith(BLOBS):
            digest = path[len(BLOBS):].decode("latin-1")
            if method == b"HEAD":
                return self._status(request, 200 if digest in self.blobs else 404)
            if method == b"POST":
                return self._blob(request, digest)
            return self._error(request, 404, "404 page not found")
        allowed = b"DELETE" if path == b"/api/delete" else b"POST"
        if method != allowed:
            return self._error(request, 404, "404 page not found")
        try:
            assert request.content is not None
            doc = json.loads(request.content.read() or b"null")
        except ValueError as e:
            return self._error(request, 400, str(e))
        if not isinstance(doc, dict):
            return self._error(request, 400, "missing request body")
        name = path.decode("latin-1").rsplit("/", 1)[1]
        handler = getattr(self, "_" + name)
        result: bytes | int = handler(request, doc)
        return result

    def _blob(self, request: Request, digest: str) -> bytes:
        hasher = getattr(request, "hasher", None)
        if hasher is None:  # not a BlobRequest: the body was buffered
            assert request.content is not None
            hasher = hashlib.sha256(request.content.read())
            size = request.content.tell()
        else:
            size = request.blob_bytes  # type: ignore[attr-defined]
        got = "sha256:" + hasher.hexdigest()
        if got != digest:
            return self._error(request, 400, f"digest mismatch, expected {json.dumps(digest)}, "
                                             f"got {json.dumps(got)}")
        self.blobs[digest] = size
        return self._status(request, 201)

    def _copy(self, request: Request, doc: dict[str, Any]) -> bytes:
        src, dst = doc.get("source"), doc.get("destination")
        models = self.flavor.catalogue()
        if not isinstance(src, str) or not isinstance(dst, str) or not src or not dst:
            return self._error(request, 400, "source and destination are required")
        served = self.flavor.served_model(src)
        if served is None:
            return self._error(request, 404, f"model {json.dumps(src)} not found")
        self.flavor.add_model(dst, models[served])
        return self._status(request, 200)

    def _delete(self, request: Request, doc: dict[str, Any]) -> bytes:
        name = doc.get("model") or doc.get("name")
        served = self.flavor.served_model(name if isinstance(name, str) else None)
        if served is None:
            return self._error(request, 404, f"model '{name}' not found")
        self.flavor.remove_model(served)
        return self._status(request, 200)

    def _pull(self, request: Request, doc: dict[str, Any]) -> bytes | int:
        name = doc.get("model") or doc.get("name")
        if not isinstance(name, str) or not name:
            return self._error(request, 400, "model is required")
        self.pulls += 1
        digest = "sha256:" + hashlib.sha256(name.encode()).hexdigest()
        total = self.flavor.catalogue().get(name, PULLED_SIZE)
        lines: list[dict[str, Any]] = [{"status": "pulling manifest"}]
        if name.endswith(MISSING_TAG):
            lines.append({"error": "pull model manifest: file does not exist"})
        else:
            lines += [{"status": f"pulling {digest[7:19]}", "digest": digest, "total": total,
                       "completed": total * i // 4} for i in range(5)]
            lines += [{"status": "verifying sha256 digest"}, {"status": "writing manifest"},
                      {"status": "success"}]
        return self._progress(request, doc, lines, lambda: self.flavor.add_model(name, total))

    def _push(self, request: Request, doc: dict[str, Any]) -> bytes | int:
        name = doc.get("model") or doc.get("name")
        served = self.flavor.served_model(name if isinstance(name, str) else None)
        if served is None:
            return self._error(request, 404, f"model '{name}' not found")
        digest = "sha256:" + hashlib.sha256(served.encode()).hexdigest()
        total = self.flavor.catalogue()[served]
        lines: list[dict[str, Any]] = [{"status": "retrieving manifest"}]
        lines += [{"status": "starting upload", "digest": digest, "total": total,
                   "completed": total * i // 2} for i in range(3)]
        lines += [{"status": "pushing manifest"}, {"status": "success"}]
        return self._progress(request, doc, lines, lambda: None)

    def _create(self, request: Request, doc: dict[str, Any]) -> bytes | int:
        name = doc.get("model") or doc.get("name")
        if not isinstance(name, str) or not name:
            return self._error(request, 400, "model is required")
        files = doc.get("files") or {}
        base = doc.get("from")
        if not isinstance(files, dict):
            return self._error(request, 400, "files must be a mapping of name to digest")
        missing = [d for d in files.values() if d not in self.blobs]
        if missing:
            return self._error(request, 400, f"blob {missing[0]} not found")
        size = sum(self.blobs[d] for d in files.values())
        if isinstance(base, str):
            served = self.flavor.served_model(base)
            if served is None:
                return self._error(request, 404, f"model '{base}' not found")
            size += self.flavor.catalogue()[served]
        lines: list[dict[str, Any]] = [{"status": "parsing GGUF"} if files else
                                       {"status": "reading model metadata"}]
        lines += [{"status": f"using existing layer {d}"} for d in files.values()]
        lines += [{"status": "writing manifest"}, {"status": "success"}]
        return self._progress(request, doc, lines,
                              lambda: self.flavor.add_model(name, max(size, 1)))

    def _progress(self, request: Request, doc: dict[str, Any], lines: list[dict[str, Any]],
                  on_success: Any) -> bytes | int:
        """Progress lines a ``STEP_S`` apart (streamed), or only the last (``stream:
        false``); ``on_success`` runs when the ``success`` line is written."""
        stream = doc.get("stream", True) is not False
        if not stream:
            last = lines[-1]
            if "error" in last:
                return self._error(request, 500, last["error"])
            on_success()
            request.setHeader(b"content-type", b"application/json; charset=utf-8")
            return go_json(last).encode()
        request.setHeader(b"content-type", NDJSON)
        pending: list[IDelayedCall] = []
        gone = [False]

        def step(i: int) -> None:
            pending.clear()
            if gone[0]:
                return
            line = lines[i]
            if line.get("status") == "success":
                on_success()
            request.write(go_json(line).encode() + b"\n")
            if i + 1 < len(lines) and "error" not in line:
                pending.append(self.clock.callLater(STEP_S, step, i + 1))
            else:
                request.finish()

        def left(_: object) -> None:
            gone[0] = True
            for call in pending:
                if call.active():
                    call.cancel()

        request.notifyFinish().addErrback(left)
        step(0)
        return NOT_DONE_YET

    @staticmethod
    def _status(request: Request, status: int) -> bytes:
        request.setResponseCode(status)
        request.defaultContentType = None
        request.responseHeaders.removeHeader(b"content-type")
        request.setHeader(b"content-length", b"0")
        return b""

    @staticmethod
    def _error(request: Request, status: int, message: str) -> bytes:
        request.setResponseCode(status)
        request.setHeader(b"content-type", b"application/json; charset=utf-8")
        return go_json({"error": message}).encode()
