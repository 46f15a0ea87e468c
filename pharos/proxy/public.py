"""The data plane: the OpenAI, Anthropic and Ollama routes clients call.

OpenAI routes go to any engine; Ollama's native routes only to Ollama backends (no API
translation). A request is read once, parsed for what routing needs, given a lease by the
scheduler, sent with treq and streamed back through the tap with backpressure. Before the
first byte reaches the client, a refused connection or a 5xx is retried once elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

import attr
from klein import Klein
from treq.client import HTTPClient
from twisted.internet.defer import CancelledError
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web.server import Request

from pharos.engine.library import OLLAMA
from pharos.models import request_key
from pharos.proxy import errors
from pharos.proxy.admission import Admission
from pharos.proxy.auth import Identity
from pharos.proxy.conversation import RESPONSES_PATH, ConversationState, Turn
from pharos.proxy.done import CLIENT_CLOSED, Done, Trace, request_id
from pharos.proxy.errors import ApiError
from pharos.proxy.exchange import (
    EMBEDDING_ROUTES,
    OK,
    DecisionSink,
    EngineLeg,
    Exchange,
    Inflight,
    Limits,
    Watch,
)
from pharos.proxy.live import LiveConfig
from pharos.proxy.manage import BLOB_METHODS, MANAGE_METHODS, ModelManager
from pharos.proxy.parse import Parsed, parse
from pharos.proxy.relay import Tap, collect, send
from pharos.proxy.site import add_error_handling, reply, require_loopback
from pharos.proxy.streamtap import StreamTap
from pharos.sched import Scheduler
from pharos.state.registry import BackendState
from pharos.state.state import State
from pharos.usage import Ledger

log = Logger()

#: Ollama clients probe ``HEAD /`` before every command, without a key.
OLLAMA_BANNER = b"Ollama is running"
#: Ollama routes Pharos serves, with their methods (for the 405 of a wrong one).
OLLAMA_METHODS: dict[str, tuple[str, ...]] = {
    "chat": ("POST",), "generate": ("POST",), "embed": ("POST",), "embeddings": ("POST",),
    "show": ("POST",), "tags": ("GET", "HEAD"), "ps": ("GET", "HEAD"),
    "version": ("GET", "HEAD"),
}


@attr.s(auto_attribs=True, kw_only=True, eq=False)
class PublicAPI:
    """The data plane: the routes clients call, each request read under one generation of
    the live config (``live.now``)."""

    app = Klein()
    add_error_handling(app)

    state: State
    sched: Scheduler
    #: The engines' pooled client (model lists, ``/api/show``), and the engine leg of every
    #: attempt of the data plane's exchanges.
    client: HTTPClient
    engine: EngineLeg
    clock: IReactorTime
    #: Key ring, timeouts and the fleet's models, swapped whole by a reload.
    live: LiveConfig
    ledger: Ledger
    #: The exchanges in progress by backend (a backend going down abandons its attempts).
    inflight: Inflight
    #: Model management on Ollama backends (``pharos.proxy.manage``).
    manager: ModelManager
    #: ``/v1/responses`` conversation state; off (no store) unless ``responses.store``.
    conversations: ConversationState = attr.Factory(ConversationState)
    #: Subscribers to every finished data-plane request's ``Done`` (refusals included):
    #: metrics, the journal, the request log line, the status page and the live map.
    on_done: list[Callable[[Done], object]] = attr.Factory(list)
    #: The decision log (``observability.decision_log``), if configured.
    decision_log: DecisionSink | None = None
    #: Who follows every request's steps (the live map).
    watch: Watch | None = None
    admission: Admission = attr.ib(
        default=attr.Factory(lambda self: Admission(self.ledger), takes_self=True))
    started: int = attr.ib(factory=lambda: int(time.time()), init=False)

    # --- Pharos itself ---------------------------------------------------------------------

    @app.route("/", methods=["GET", "HEAD"])
    def root(self, request: Request) -> bytes:
        """Answer like Ollama, so the ollama CLI talks to Pharos; no key needed."""
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        return OLLAMA_BANNER

    def _who(self, request: Request) -> Identity:
        """The caller (a 401 without a valid key, once keys are configured)."""
        return self.live.now.keyring.identify(request)

    def _admin(self, request: Request) -> Identity:
        """An admin caller: an admin key, or without keys a loopback client (model management
        changes the hosts' models)."""
        keyring = self.live.now.keyring
        if keyring.open:
            require_loopback(request)
        who = keyring.identify(request)
        if not who.admin:
            raise errors.admin_only()
        return who

    # --- model lists -----------------------------------------------------------------------

    @app.route("/v1/models", methods=["GET"])
    def models(self, request: Request) -> bytes:
        """Every model an up backend lists that the caller's key may use."""
        who = self._who(request)
        data: list[dict[str, Any]] = []
        for name, alias_of in self.live.now.fleet.listing(self.state.models()):
            if who.may_use(alias_of or name):
                entry = {"id": name, "object": "model", "created": self.started,
                         "owned_by": "pharos"}
                data.append(entry if alias_of is None else {**entry, "alias_of": alias_of})
        return reply(request, 200, {"object": "list", "data": data})

    @app.route("/v1/models/<path:model>", methods=["GET"])
    def model(self, request: Request, model: str) -> bytes:
        """One model, 404 when no up backend serves it (an alias: its model's)."""
        who = self._who(request)
        model = self.live.now.fleet.names.get(model, model)
        if not who.may_use(model):
            raise errors.model_not_allowed(who.name, model)
        if model not in self.state.models():
            raise errors.unknown_model(model)
        return reply(request, 200, {"id": model, "object": "model", "created": self.started,
                                    "owned_by": "pharos"})

    def _ollama_backends(self) -> list[BackendState]:
        return [b for b in self.state.backends.values()
                if b.kind == OLLAMA and self.state.is_up(b)]

    async def _gather(self, path: str, who: Identity) -> list[dict[str, Any]]:
        """The ``models`` entries of ``path`` on every up Ollama backend, client names, once
        each, those the caller's key may use."""
        seen: dict[str, dict[str, Any]] = {}
        for b in self._ollama_backends():
            try:
                response = await send(self.client, b.url + path, b"", method="GET")
                body = await collect(response, 8 * 1024 * 1024)
                entries = json.loads(body).get("models") or []
            except Exception as e:
                log.warn("{path} of {url} failed: {why}", path=path, url=b.url, why=str(e))
                continue
            for entry in entries:
                if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                    continue
                name = b.spec.aliases.get(entry["name"], entry["name"])
                if name not in seen and who.may_use(name):
                    seen[name] = {**entry, "name": name, "model": name}
        return list(seen.values())

    @app.route("/api/tags", methods=["GET", "HEAD"])
    async def tags(self, request: Request) -> bytes:
        """Models of every up Ollama backend."""
        who = self._who(request)
        return reply(request, 200, {"models": await self._gather("/api/tags", who)})

    @app.route("/api/ps", methods=["GET", "HEAD"])
    async def ps(self, request: Request) -> bytes:
        """Models loaded on any up Ollama backend."""
        who = self._who(request)
        return reply(request, 200, {"models": await self._gather("/api/ps", who)})

    @app.route("/api/version", methods=["GET", "HEAD"])
    def version(self, request: Request) -> bytes:
        """The oldest version among up Ollama backends: clients gate features on it."""
        self._who(request)
        versions = [b.version for b in self._ollama_backends() if b.version]
        if not versions:
            raise ApiError(503, "no Ollama backend is up")

        def key(v: str) -> tuple[int, ...]:
            return tuple(int(x) if x.isdigit() else 0 for x in v.split("-")[0].split("."))

        return reply(request, 200, {"version": min(versions, key=key)})

    @app.route("/api/show", methods=["POST"])
    async def show(self, request: Request) -> None:
        """Forwarded to an up Ollama backend serving the model; takes no slot."""
        who = self._who(request)
        parsed = self._parse(request, "/api/show")
        if not who.may_use(parsed.model):
            raise errors.model_not_allowed(who.name, parsed.model)
        targets = [t for t in self.state.targets_for(parsed.model) if t.backend.kind == OLLAMA]
        if not targets:
            raise (errors.unknown_model(parsed.model)
                   if not self.state.listed_anywhere(parsed.model, OLLAMA)
                   else errors.unavailable(parsed.model))
        t = targets[0]
        response = await send(self.client, t.backend.url + "/api/show",
                              parsed.forward_body(t.served))
        self.engine.start_reply(request, response, t, "model information")
        request.write(await collect(response, 64 * 1024 * 1024))

    @app.route("/api/<string:name>", methods=["GET", "POST", "DELETE", "HEAD", "PUT"])
    async def ollama_other(self, request: Request, name: str) -> bytes | None:
        """The rest of /api/: model management (pull, push, create, copy, delete) goes to one
        Ollama backend for an admin (``pharos.proxy.manage``); a served route with the wrong
        method is 405 naming the allowed ones; any other name is 404, all in Ollama's
        shape."""
        manage = MANAGE_METHODS.get(name)
        if manage is not None and request.method.decode("latin-1") in manage:
            self._admin(request)
            await self.manager.forward(request)
            return None
        self._who(request)
        allowed = OLLAMA_METHODS.get(name) or manage
        if allowed is not None:
            request.setHeader(b"allow", ", ".join(allowed).encode())
            method = errors.echo(request.method.decode("latin-1"))
            raise ApiError(405, f"method {method} not allowed on /api/{name}",
                           code="method_not_allowed")
        raise ApiError(404, f"no route /api/{errors.echo(name)}", code="not_found")

    @app.route("/api/blobs/<path:rest>", methods=["GET", "POST", "HEAD", "PUT", "DELETE"])
    async def ollama_blobs(self, request: Request, rest: str) -> None:
        """A blob's existence (HEAD) or upload (POST, streamed), for an admin, on one Ollama
        backend (``pharos.proxy.manage``)."""
        self._admin(request)
        if request.method.decode("latin-1") not in BLOB_METHODS:
            request.setHeader(b"allow", ", ".join(BLOB_METHODS).encode())
            method = errors.echo(request.method.decode("latin-1"))
            raise ApiError(405, f"method {method} not allowed on /api/blobs",
                           code="method_not_allowed")
        await self.manager.forward(request)

    # --- the data plane --------------------------------------------------------------------

    @app.route("/v1/chat/completions", methods=["POST"])
    @app.route("/v1/completions", methods=["POST"])
    @app.route("/v1/embeddings", methods=["POST"])
    @app.route("/v1/messages", methods=["POST"])
    async def openai(self, request: Request) -> None:
        """OpenAI-compatible routes: any engine serving the model."""
        await self._proxy(request, request.path.decode("latin-1"), kind=None)

    @app.route("/v1/responses", methods=["POST"])
    async def responses(self, request: Request) -> None:
        """OpenAI's Responses: any engine serving the model, ``previous_response_id``
        expanded and ``store: true`` conversations kept when ``responses.store`` is on
        (``pharos.proxy.conversation``)."""
        await self._proxy(request, RESPONSES_PATH, kind=None, responses=self.conversations)

    @app.route("/api/chat", methods=["POST"])
    @app.route("/api/generate", methods=["POST"])
    @app.route("/api/embed", methods=["POST"])
    @app.route("/api/embeddings", methods=["POST"])
    async def ollama(self, request: Request) -> None:
        """Ollama's native routes: Ollama backends only."""
        await self._proxy(request, request.path.decode("latin-1"), kind=OLLAMA)

    def _parse(self, request: Request, path: str) -> Parsed:
        assert request.content is not None
        return parse(request.content.read(), path, self._resolve)

    def _resolve(self, model: str | None) -> str | None:
        """A request's model as the fleet names it (``Fleet.resolve``)."""
        return self.live.now.fleet.resolve(model, self.state.models)

    async def _proxy(self, request: Request, path: str, kind: str | None,
                     responses: ConversationState | None = None) -> None:
        """Auth, parse, allow-list, admission, then the exchange; every ending becomes one
        ``Done`` for the subscribers."""
        trace = Trace(self.clock.seconds(), request_id(request), path)
        request.setHeader(b"x-request-id", trace.request_id.encode())
        ex: Exchange | None = None
        status: int | None = None
        try:
            who = trace.who = self._who(request)
            turn: Turn | None = None
            if responses is None:
                parsed = self._parse(request, path)
            else:
                assert request.content is not None
                parsed, turn = responses.parse(request.content.read(), who, self._resolve)
            trace.parsed(parsed)
            if not who.may_use(parsed.model):
                raise errors.model_not_allowed(who.name, parsed.model)
            held = self.admission.admit(who, parsed, path)
            trace.admit(parsed)
            try:
                ex = self._exchange(request, parsed, path, kind, who, trace.request_id,
                                    None if turn is None else turn.tap)
                await ex.run()
                if turn is not None:
                    turn.finish(ex.outcome == OK)
            finally:
                self.admission.finish(held, parsed.model, ex)
        except ApiError as e:
            status = e.status
            trace.refused(e)
            raise
        except CancelledError:
            status = CLIENT_CLOSED
            raise
        except Exception:
            status = 500
            raise
        finally:
            if self.on_done:
                self._done(trace.finish(self.clock.seconds(), status or request.code, ex))

    def _done(self, done: Done) -> None:
        for subscriber in self.on_done:
            try:
                subscriber(done)
            except Exception:
                log.failure("an on_done subscriber failed")

    def too_large(self, request: Request, path: bytes) -> None:
        """A body over the limit was refused with 413 before any route ran (``body.py``)."""
        if not self.on_done:
            return
        trace = Trace(self.clock.seconds(), request_id(request),
                      path.decode("latin-1")[:200])
        trace.decisions.append(("admission", "too_large"))
        self._done(trace.finish(self.clock.seconds(), 413))

    def _exchange(self, request: Request, parsed: Parsed, path: str, kind: str | None,
                  who: Identity, rid: str, capture: Callable[[StreamTap], Tap] | None
                  ) -> Exchange:
        if parsed.unfollowed is not None:
            self.sched.unfollowed[parsed.unfollowed] += 1
        live = self.live.now
        timeouts = live.config.timeouts
        limits = Limits(
            first_byte=(timeouts.first_byte_embeddings if path in EMBEDDING_ROUTES
                        else timeouts.first_byte_generate),
            stream_idle=timeouts.stream_idle)
        session = session_of(request, parsed)
        return Exchange(request, parsed, path, kind, sched=self.sched, state=self.state,
                        engine=self.engine, clock=self.clock, limits=limits,
                        inflight=self.inflight, session=session, who=who,
                        policy=live.fleet.policy_for(parsed.model, request_key(session, rid)),
                        capture=capture, decision_log=self.decision_log, request_id=rid,
                        watch=self.watch)


def session_of(request: Request, parsed: Parsed) -> int | None:
    """The conversation a request names (``x-session-id``, else the body's ``user``), kept
    as a 64-bit hash: a client's string is never stored at the length it was sent, and a
    full session table (100k) takes 9 MB. Two sessions sharing a hash (about one in 10^9
    at 100k) share only their engine preference."""
    header = request.getHeader(b"x-session-id")
    name = header if header else (parsed.user.encode("utf-8", "surrogatepass")
                                  if parsed.user else None)
    if not name:
        return None
    return int.from_bytes(hashlib.blake2b(name, digest_size=8).digest(), "big")

