"""``/v1/responses`` conversation state on the request path.

With ``responses.store`` on, a request naming ``previous_response_id`` is expanded here, before
admission and routing: the stored conversation's items (its input and its reply's output
items) go in front of the request's ``input``, the field is removed and the body re-encoded, so
admission and the prefix index see the whole conversation and an engine that keeps no state
(llama.cpp refuses the field) serves the turn. ``instructions`` are not carried over (OpenAI's
rule).

A request with an explicit ``store: true`` (OpenAI's default of true is not assumed: nothing is
kept that the client did not ask to keep) is store-eligible: its reply passes through
``Capture``, which keeps at most ``max_bytes`` (for a stream only the ``response.completed`` or
``response.incomplete`` event), and once the reply ended cleanly the conversation is stored
under the reply's own ``id`` (Pharos mints and rewrites no ids). Not stored: a reply over the
cap, an error, a cut or abandoned reply, a stream without its final event, a reply without a
string id, an id the tenant already holds. The capture never changes the client's bytes.

Ids are looked up for the caller's tenant only: an id not held for it (never stored, expired,
dropped, another tenant's, forged) is one 404 with one message, so nothing tells whether it
exists elsewhere. With ``responses.store`` off, ``previous_response_id`` is a 400 saying so (an
engine that ignored it would answer without the context).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from pharos.prefix import chain
from pharos.proxy import errors
from pharos.proxy.auth import Identity
from pharos.proxy.errors import ApiError
from pharos.proxy.parse import Parsed, Resolve, parse
from pharos.proxy.parse import _parse as parse_decoded
from pharos.proxy.relay import Tap
from pharos.responses import ConversationStore

RESPONSES_PATH = "/v1/responses"
#: The final events of a Responses stream whose response may be continued.
_FINAL_EVENTS = frozenset({"response.completed", "response.incomplete"})
_FINAL_STATUSES = frozenset({"completed", "incomplete"})


def not_found(rid: str) -> ApiError:
    """The one answer for an id not held for the caller's tenant."""
    return ApiError(404, f"Previous response with id {errors.echo(rid)!r} not found (never "
                         f"stored, expired, or not stored for this key on this Pharos)",
                    code="previous_response_not_found")


def state_off() -> ApiError:
    return ApiError(400, "previous_response_id needs conversation state, which is off on "
                         "this Pharos (config responses.store); send the whole conversation "
                         "in input instead", code="conversation_state_off")


def _items(value: Any) -> list[Any]:
    """A request's ``input`` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list):
        return value
    if value is None:
        return []
    raise errors.wrong_type("input", "a string or a list of items", value)


def _final(text: bytes) -> bool:
    """Whether these bytes name a final event of a Responses stream."""
    return b"response.completed" in text or b"response.incomplete" in text or \
        b"response.failed" in text


class Capture:
    """Wraps a reply's stream tap, passing every byte on unchanged, and keeps what storing
    needs: the whole body of a plain reply, or a stream's final event line, at most ``cap``
    bytes (past it nothing is kept and nothing will be stored)."""

    def __init__(self, inner: Tap, cap: int, stream: bool) -> None:
        self.inner = inner
        self.cap = cap
        self.stream = stream
        self.over = False
        self._parts: list[bytes] = []
        self._size = 0
        self._final: bytes | None = None
        self._named = False  # the last event line named a final event

    def feed(self, chunk: bytes) -> bytes:
        if not self.over:
            self._keep(chunk)
        return self.inner.feed(chunk)

    def finish(self) -> bytes:
        return self.inner.finish()

    def _keep(self, chunk: bytes) -> None:
        if not self.stream:
            self._size += len(chunk)
            if self._size > self.cap:
                self._drop()
            else:
                self._parts.append(chunk)
            return
        # A stream: whole lines only. A data line is kept when its event line (the line
        # before) names a final event, or its own ``type`` does (at either end: vLLM writes
        # ``type`` last); other lines are only split off.
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                rest = chunk[start:]
                if rest:
                    self._size += len(rest)
                    if self._size > self.cap:
                        self._drop()
                        return
                    self._parts.append(rest)
                return
            piece = chunk[start:end]
            start = end + 1
            if self._parts:
                self._parts.append(piece)
                line = b"".join(self._parts)
                self._parts, self._size = [], 0
            else:
                line = piece
            self._line(line.rstrip(b"\r"))

    def _line(self, line: bytes) -> None:
        if line.startswith(b"event:"):
            self._named = _final(line)
            return
        if not line.startswith(b"data:"):
            return
        named, self._named = self._named, False
        if named or _final(line[:80]) or _final(line[-80:]):
            if len(line) > self.cap:
                self._drop()
            else:
                self._final = line

    def _drop(self) -> None:
        self.over = True
        self._parts, self._size, self._final = [], 0, None

    def response(self) -> dict[str, Any] | None:
        """The finished reply's response object, or None (over the cap, unfinished, undecodable)."""
        if self.over:
            return None
        try:
            if not self.stream:
                doc = json.loads(b"".join(self._parts))
                ok = isinstance(doc, dict) and doc.get("status") in _FINAL_STATUSES
                return doc if ok else None
            if self._final is None:
                return None
            event = json.loads(self._final[5:])
        except (ValueError, RecursionError):
            return None
        if not isinstance(event, dict) or event.get("type") not in _FINAL_EVENTS:
            return None
        doc = event.get("response")
        return doc if isinstance(doc, dict) else None


class Turn:
    """One store-eligible request: its expanded input, the capture of its reply (the
    attempt that answered), and the storing once it ended cleanly."""

    def __init__(self, store: ConversationStore, tenant: str, items: list[Any],
                 stream: bool) -> None:
        self.store = store
        self.tenant = tenant
        self.items = items
        self.stream = stream
        self.capture: Capture | None = None
        self.stored: str | None = None

    def tap(self, inner: Tap) -> Tap:
        """The exchange's hook: each attempt's tap wrapped (the last one answered)."""
        self.capture = Capture(inner, self.store.max_bytes, self.stream)
        return self.capture

    def finish(self, ok: bool) -> None:
        """Store the conversation if the reply ended cleanly and was captured whole."""
        if not ok or self.capture is None:
            return
        doc = self.capture.response()
        if doc is None:
            return
        rid, output = doc.get("id"), doc.get("output")
        if not isinstance(rid, str) or not rid or len(rid) > 256 or not isinstance(output,
                                                                                   list):
            return
        if self.store.put(self.tenant, rid, [*self.items, *output]):
            self.stored = rid


def _as_message(item: Any) -> Any:
    """An input item as the chain hashes it: a message is its role and text, as an engine's chat
    template sees it (an output item's id, status and part types are not prompt); others as is."""
    if type(item) is not dict or not isinstance(item.get("role"), str):
        return item
    content = item.get("content")
    if isinstance(content, list) and all(type(p) is dict and isinstance(p.get("text"), str)
                                         for p in content):
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        return item
    return {"role": item["role"], "content": content}


class ConversationState:
    """The ``/v1/responses`` side of the proxy: ``store`` None means the feature is off."""

    def __init__(self, store: ConversationStore | None = None) -> None:
        self.store = store

    def parse(self, raw: bytes, who: Identity, resolve: Resolve | None
              ) -> tuple[Parsed, Turn | None]:
        """The request as routing sees it (expanded when it names a previous response) and the turn
        to store, if store-eligible; 400/404 in OpenAI's shape for an unusable previous response."""
        parsed = parse(raw, RESPONSES_PATH, resolve)
        store = self.store
        body = parsed.body
        previous = body.get("previous_response_id")
        if store is None:
            if previous is not None:
                raise state_off()
            return parsed, None
        eligible = body.get("store") is True
        if previous is None:
            items = _items(body.get("input")) if eligible else []
            return self._chained(parsed, body.get("input")), (
                Turn(store, who.tenant, items, parsed.stream) if eligible else None)
        if not isinstance(previous, str):
            raise errors.wrong_type("previous_response_id", "a string", previous)
        history = store.get(who.tenant, previous)
        if history is None:
            raise not_found(previous)
        items = [*history, *_items(body.get("input"))]
        expanded = {k: v for k, v in body.items() if k != "previous_response_id"}
        expanded["input"] = items
        raw = json.dumps(expanded, ensure_ascii=False, separators=(",", ":")).encode(
            "utf-8", "surrogatepass")
        # The expanded body is already decoded: parsed from its objects, not decoded again
        # (the request's part passed ``parse``'s checks; the stored part was JSON it wrote).
        parsed = parse_decoded(expanded, raw, RESPONSES_PATH, resolve)
        return self._chained(parsed, items), (
            Turn(store, who.tenant, items, parsed.stream) if eligible else None)

    @staticmethod
    def _chained(parsed: Parsed, items: Any) -> Parsed:
        """The prefix chain of the conversation (instructions first, as an engine's chat
        template puts them), so a turn goes where its conversation's cache is."""
        if not isinstance(items, list | str):
            return parsed
        messages = [_as_message(item) for item in _items(items)]
        instructions = parsed.body.get("instructions")
        if isinstance(instructions, str) and instructions:
            messages = [{"role": "system", "content": instructions}, *messages]
        links = chain(parsed.model, messages, parsed.body.get("tools"), None)
        return replace(parsed, chain=links) if links else parsed
