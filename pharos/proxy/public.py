"""The public Klein app: every route of spec §9's table.

OpenAI routes go to any engine; Ollama's native routes only to Ollama backends (no API
translation). A request is read once, parsed for what routing needs, given a lease by the
scheduler, sent with treq and streamed back through the tap with backpressure. Before the
first byte reaches the client, a refused connection or a 5xx is retried once elsewhere.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
import uuid
from collections.abc import Callable
from datetime import date, timedelta
from typing import Any, Protocol

from klein import Klein
from treq.client import HTTPClient
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import HTTPConnectionPool
from twisted.web.iweb import IRequest, IResponse
from twisted.web.server import Request
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound

from pharos.config import Reloaded, Timeouts
from pharos.engine.fetch import make_client
from pharos.engine.library import OLLAMA
from pharos.models import Fleet, request_key
from pharos.proxy import errors
from pharos.proxy.admin import ConfigAdmin, backends_document, index_document, listed_count
from pharos.proxy.admission import Admission
from pharos.proxy.auth import Identity, Keyring
from pharos.proxy.conversation import RESPONSES_PATH, ConversationState, Turn
from pharos.proxy.done import CLIENT_CLOSED, Done, Trace, request_id
from pharos.proxy.drain import Health
from pharos.proxy.errors import ApiError
from pharos.proxy.exchange import EMBEDDING_ROUTES, OK, Exchange, Inflight, Limits
from pharos.proxy.explain import ROUTES as EXPLAIN_ROUTES
from pharos.proxy.explain import explain
from pharos.proxy.manage import BLOB_METHODS, MANAGE_METHODS, ModelManager
from pharos.proxy.parse import Parsed, parse
from pharos.proxy.relay import collect, response_headers, send
from pharos.proxy.unload import unload
from pharos.sched import Lease, Scheduler
from pharos.state.registry import BackendState, Target
from pharos.state.state import State
from pharos.usage import Ledger, to_csv

log = Logger()

#: Ollama clients probe ``HEAD /`` before every command, without a key.
OLLAMA_BANNER = b"Ollama is running"
#: Ollama routes Pharos serves, with their methods (for the 405 of a wrong one).
OLLAMA_METHODS: dict[str, tuple[str, ...]] = {
    "chat": ("POST",), "generate": ("POST",), "embed": ("POST",), "embeddings": ("POST",),
    "show": ("POST",), "tags": ("GET", "HEAD"), "ps": ("GET", "HEAD"),
    "version": ("GET", "HEAD"),
}
JSON = b"application/json"
#: Days ``/usage`` covers without ``from``.
USAGE_DAYS = 30


def _json(request: Request, status: int, doc: object) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"content-type", JSON)
    body = json.dumps(doc).encode()
    request.setHeader(b"content-length", b"%d" % len(body))
    return body


def _ascii(text: str) -> bytes:
    return text.encode("ascii", "replace")[:512]


class PublicAPI:
    """The routes clients call. ``state.ready`` gates ``/healthz``."""

    app = Klein()

    def __init__(self, state: State, sched: Scheduler, client: HTTPClient,
                 clock: IReactorTime, seed: Callable[[], int] | None = None,
                 timeouts: Timeouts | None = None, keyring: Keyring | None = None,
                 ledger: Ledger | None = None) -> None:
        #: Swapped whole by a reload; open (everyone ``anonymous``) without keys.
        self.keyring = keyring or Keyring()
        self.ledger = ledger or Ledger(clock, origin=uuid.uuid4().hex)
        self.admission = Admission(self.ledger)
        self.state = state
        self.timeouts = timeouts or Timeouts()
        self.inflight = Inflight()
        self.sched = sched
        self.client = client
        #: One connection per request, closed after it: the retry after a dead pooled one
        #: (made at its first use: the clock is the reactor then).
        self._fresh: HTTPClient | None = None
        self.clock = clock
        self.seed = seed or sched.seed
        self.started = int(time.time())
        #: Subscribers to every finished data-plane request's ``Done`` (refusals included):
        #: metrics, the journal, the request log line, the status page and the live map.
        #: The decision log (``observability.decision_log``), if configured.
        self.decision_log: DecisionSink | None = None
        self.on_done: list[Callable[[Done], object]] = []
        #: Restored yet, draining yet (``pharos.proxy.drain``): ``/healthz`` reads it.
        self.health = Health()
        #: Reads the config file again (``pharos.reload``); None without a config file.
        self.reload_config: Callable[[], Reloaded] | None = None
        #: The fleet's models: aliases and each model's policy (``pharos.models``); swapped
        #: whole by a reload.
        self.fleet = Fleet()
        #: The shadow policies' counts (``pharos.shadow``), for ``GET /admin/shadow``.
        self.shadow: ShadowView | None = None
        #: The config in effect and its patches (``/admin/config``); None: not wired (tests).
        self.config_admin: ConfigAdmin | None = None
        #: Model management on Ollama backends (``pharos.proxy.manage``), made on first use.
        self.manager: ModelManager | None = None
        #: ``/v1/responses`` conversation state (``pharos.proxy.conversation``); off (no
        #: store) unless ``responses.store``.
        self.conversations = ConversationState()

    # --- Pharos itself ---------------------------------------------------------------------

    @app.route("/", methods=["GET", "HEAD"])
    def root(self, request: Request) -> bytes:
        """Answer like Ollama, so the ollama CLI talks to Pharos; no key needed."""
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        return OLLAMA_BANNER

    @app.route("/healthz", methods=["GET", "HEAD"])
    def healthz(self, request: Request) -> bytes:
        """503 until the state is restored and the first scrape round has finished, so a load
        balancer never sends traffic blind; 503 from the first moment of a drain (spec §9);
        503 again while requests wait and none has started (nor a lease been given back) for
        ``timeouts.queue_stuck``: a wedged scheduler is unhealthy."""
        why = self.health.status()
        if why is not None:
            return _json(request, 503, {"status": why})
        if not self.state.ready:
            return _json(request, 503, {"status": "starting"})
        stuck = self.sched.stuck_for(self.clock.seconds())
        if stuck is not None and stuck > self.timeouts.queue_stuck:
            return _json(request, 503, {"status": "stuck", "waiting": self.sched.waiting,
                                        "stuck_seconds": round(stuck, 1)})
        return _json(request, 200, {"status": "ok"})

    # --- errors in the client's shape ------------------------------------------------------

    @app.handle_errors(ApiError)
    def api_error(self, request: IRequest, failure: Failure) -> bytes:
        """An error Pharos answers itself, in the route's API shape."""
        e = failure.value
        assert isinstance(e, ApiError)
        return self._error(_req(request), e)

    @app.handle_errors(NotFound)
    def not_found(self, request: IRequest, failure: Failure) -> bytes:
        """Unknown paths: 404 in the shape of the API the path belongs to."""
        req = _req(request)
        path = req.path.decode("latin-1")
        return self._error(req, ApiError(404, f"no route {errors.echo(path)}",
                                         code="not_found"))

    @app.handle_errors(MethodNotAllowed)
    def bad_method(self, request: IRequest, failure: Failure) -> bytes:
        """A known path with the wrong method: 405."""
        e = failure.value
        assert isinstance(e, HTTPException)
        req = _req(request)
        allowed = e.get_response({}).headers.get("Allow", "")
        req.setHeader(b"allow", allowed.encode())
        method = errors.echo(req.method.decode("latin-1"))
        return self._error(req, ApiError(405, f"method {method} not allowed here",
                                         code="method_not_allowed"))

    @app.handle_errors(Exception)
    def unexpected(self, request: IRequest, failure: Failure) -> bytes:
        """A fault of Pharos's own: logged, and a 500 in the client's shape, no traceback."""
        log.failure("request to {path} failed", failure, path=_req(request).path[:200])
        return self._error(_req(request), ApiError(500, "internal error in Pharos",
                                                   type="server_error", code="pharos_error"))

    def _error(self, request: Request, e: ApiError) -> bytes:
        request.setResponseCode(e.status)
        for name, value in e.headers:
            request.setHeader(name, value)
        request.setHeader(b"content-type", JSON)
        body = e.body(ollama=errors.is_ollama_path(request.path),
                      anthropic=errors.is_anthropic_path(request.path))
        request.setHeader(b"content-length", b"%d" % len(body))
        return body

    # --- who calls -------------------------------------------------------------------------

    def _who(self, request: Request) -> Identity:
        """The caller (a 401 without a valid key, once keys are configured)."""
        return self.keyring.identify(request)

    def _admin(self, request: Request) -> Identity:
        who = self._who(request)
        if not who.admin:
            raise errors.admin_only()
        return who

    # --- model lists -----------------------------------------------------------------------

    @app.route("/v1/models", methods=["GET"])
    def models(self, request: Request) -> bytes:
        """Every model an up backend lists that the caller's key may use."""
        who = self._who(request)
        data: list[dict[str, Any]] = []
        for name, alias_of in self.fleet.listing(self.state.models()):
            if who.may_use(alias_of or name):
                entry = {"id": name, "object": "model", "created": self.started,
                         "owned_by": "pharos"}
                data.append(entry if alias_of is None else {**entry, "alias_of": alias_of})
        return _json(request, 200, {"object": "list", "data": data})

    @app.route("/v1/models/<path:model>", methods=["GET"])
    def model(self, request: Request, model: str) -> bytes:
        """One model, 404 when no up backend serves it (an alias: its model's)."""
        who = self._who(request)
        model = self.fleet.names.get(model, model)
        if not who.may_use(model):
            raise errors.model_not_allowed(who.name, model)
        if model not in self.state.models():
            raise errors.unknown_model(model)
        return _json(request, 200, {"id": model, "object": "model", "created": self.started,
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
        return _json(request, 200, {"models": await self._gather("/api/tags", who)})

    @app.route("/api/ps", methods=["GET", "HEAD"])
    async def ps(self, request: Request) -> bytes:
        """Models loaded on any up Ollama backend."""
        who = self._who(request)
        return _json(request, 200, {"models": await self._gather("/api/ps", who)})

    @app.route("/api/version", methods=["GET", "HEAD"])
    def version(self, request: Request) -> bytes:
        """The oldest version among up Ollama backends: clients gate features on it."""
        self._who(request)
        versions = [b.version for b in self._ollama_backends() if b.version]
        if not versions:
            raise ApiError(503, "no Ollama backend is up")

        def key(v: str) -> tuple[int, ...]:
            return tuple(int(x) if x.isdigit() else 0 for x in v.split("-")[0].split("."))

        return _json(request, 200, {"version": min(versions, key=key)})

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
        self._start_reply(request, response, t, "model information")
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
            await self._manager().forward(request)
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
        await self._manager().forward(request)

    def _manager(self) -> ModelManager:
        if self.manager is None:
            self.manager = ModelManager(self.state, self.client, self.clock,
                                        lambda: self.timeouts.stream_idle)
        return self.manager

    # --- usage -----------------------------------------------------------------------------

    @app.route("/usage", methods=["GET"])
    def usage(self, request: Request) -> bytes:
        """Usage per day by key, model or tenant (admin): ``from``/``to`` dates in
        usage.timezone (default: the last 30 days), ``format=json|csv``."""
        self._admin(request)
        args = {k.decode("latin-1"): v[-1].decode("utf-8", "replace")
                for k, v in (request.args or {}).items() if v}
        unknown = set(args) - {"from", "to", "by", "format"}
        if unknown:
            raise ApiError(400, f"unknown parameter {sorted(unknown)[0]!r}: from, to, by, "
                                f"format", code="invalid_parameter")
        today = self.ledger.today()
        try:
            to_day = date.fromisoformat(args["to"]) if "to" in args else today
            from_day = (date.fromisoformat(args["from"]) if "from" in args
                        else to_day - timedelta(days=USAGE_DAYS - 1))
        except ValueError as e:
            raise ApiError(400, f"from and to are dates, YYYY-MM-DD: {e}",
                           code="invalid_parameter") from None
        if from_day > to_day:
            raise ApiError(400, "from is after to", code="invalid_parameter")
        by = args.get("by", "key")
        if by not in ("key", "model", "tenant"):
            raise ApiError(400, f"by is key, model or tenant, not {errors.echo(by)!r}",
                           code="invalid_parameter")
        fmt = args.get("format", "json")
        if fmt not in ("json", "csv"):
            raise ApiError(400, f"format is json or csv, not {errors.echo(fmt)!r}",
                           code="invalid_parameter")
        rows = self.ledger.rows(from_day, to_day, by)
        if fmt == "csv":
            body = to_csv(rows, by).encode()
            request.setHeader(b"content-type", b"text/csv; charset=utf-8")
            request.setHeader(b"content-length", b"%d" % len(body))
            return body
        return _json(request, 200, {"from": from_day.isoformat(), "to": to_day.isoformat(),
                                    "by": by, "rows": rows})

    # --- explain ---------------------------------------------------------------------------

    @app.route("/admin/explain/<path:route>", methods=["POST"])
    def explain(self, request: Request, route: str) -> bytes:
        """What the policy would do with this request now; routes nothing, changes nothing.
        Needs an admin key once keys are configured."""
        self._admin(request)
        path = "/" + route.lstrip("/")
        if path not in EXPLAIN_ROUTES:
            known = ", ".join(sorted(EXPLAIN_ROUTES))
            raise ApiError(404, f"cannot explain {errors.echo(path)}: one of {known}",
                           code="not_found")
        parsed = self._parse(request, path)
        doc = explain(self.sched, path, parsed, _session(request, parsed), self.seed())
        return _json(request, 200, doc)

    # --- shadow policies -------------------------------------------------------------------

    @app.route("/admin/shadow", methods=["GET"])
    def shadow_stats(self, request: Request) -> bytes:
        """The shadow policies' agreement and estimated gain per model and policy, what was
        dropped or raised (admin; ``pharos.shadow``)."""
        self._admin(request)
        if self.shadow is None:
            return _json(request, 200, {"tallies": [], "dropped": 0, "errors": {}})
        return _json(request, 200, self.shadow.doc())

    # --- admin API (``pharos.proxy.admin``) ------------------------------------------------

    @app.route("/admin/config", methods=["GET"])
    def admin_config(self, request: Request) -> bytes:
        """The config in effect (secrets redacted) and its generation (admin)."""
        self._admin(request)
        return _json(request, 200, self._config_admin().document())

    @app.route("/admin/config", methods=["PATCH"])
    def patch_config(self, request: Request) -> bytes:
        """A JSON merge patch of the config, applied like a reload or refused whole (422
        with every error); the file's next change replaces it (admin)."""
        self._admin(request)
        assert request.content is not None
        admin = self._config_admin()
        done = admin.patch(request.content.read())
        if done.errors:
            return _json(request, 422, {"error": {
                "message": f"the patch has {len(done.errors)} error(s) and was not applied; "
                           f"the running config stays",
                "type": "invalid_request_error", "param": None, "code": "invalid_config"},
                "errors": list(done.errors)})
        return _json(request, 200, {"applied": list(done.applied), **admin.document()})

    def _config_admin(self) -> ConfigAdmin:
        if self.config_admin is None:
            raise ApiError(409, "no config to show or patch here", code="no_config")
        return self.config_admin

    @app.route("/admin/backends", methods=["GET"])
    def admin_backends(self, request: Request) -> bytes:
        """Each backend's plan, signals, ejection, and per target its capacity with its
        source and learned estimates (admin)."""
        self._admin(request)
        return _json(request, 200, backends_document(self.state, self.sched))

    @app.route("/admin/index", methods=["GET"])
    async def admin_index(self, request: Request) -> bytes:
        """The prefix index: entries, bytes, per target the entries a lookup can match;
        ``?list=N``: the N most recent entries as hashes (admin). Counted a shard per reactor
        turn."""
        self._admin(request)
        listed = listed_count(request.args)
        targets = self.state.targets

        def gen_of(tid: int) -> int | None:
            return targets[tid].gen if 0 <= tid < len(targets) else None

        def key_of(tid: int) -> str | None:
            return targets[tid].key if 0 <= tid < len(targets) else None

        census = None
        for step in self.sched.index.census_in_steps(gen_of):
            if step is None:
                await deferLater(self.clock, 0, lambda: None)
            else:
                census = step
        assert census is not None
        return _json(request, 200, index_document(census, self.sched.index, self.state,
                                                  listed, key_of, gen_of))

    # --- reload ----------------------------------------------------------------------------

    @app.route("/admin/reload", methods=["POST"])
    def reload(self, request: Request) -> bytes:
        """Read the config file again now (admin; spec §10): 200 naming the fields applied
        live and those needing a restart (both empty: nothing changed); 422 with every error
        when the file does not parse (the running config stays); 409 without a file."""
        self._admin(request)
        if self.reload_config is None:
            raise ApiError(409, "Pharos runs without a config file: nothing to reload",
                           code="no_config_file")
        done = self.reload_config()
        if done.errors:
            return _json(request, 422, {"error": {
                "message": f"the config file has {len(done.errors)} error(s) and was not "
                           f"reloaded; the running config stays",
                "type": "invalid_request_error", "param": None, "code": "invalid_config"},
                "errors": list(done.errors)})
        return _json(request, 200, {"changed": done.changed, "applied": list(done.applied),
                                    "needs_restart": list(done.restart)})

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
        return self.fleet.resolve(model, self.state.models)

    async def _proxy(self, request: Request, path: str, kind: str | None,
                     responses: ConversationState | None = None) -> None:
        """Auth, parse, allow-list, admission, then the exchange; every ending becomes one
        ``Done`` for the subscribers (the stages in order: DESIGN §4)."""
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
                ex = self._exchange(request, parsed, path, kind, who, trace.request_id)
                if turn is not None:
                    ex.capture = turn.tap
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
                  who: Identity, rid: str = "") -> Exchange:
        if parsed.unfollowed is not None:
            self.sched.unfollowed[parsed.unfollowed] += 1
        limits = Limits(
            first_byte=(self.timeouts.first_byte_embeddings if path in EMBEDDING_ROUTES
                        else self.timeouts.first_byte_generate),
            stream_idle=self.timeouts.stream_idle)
        ex = Exchange(request, parsed, path, kind, sched=self.sched, state=self.state,
                      send=self._send, clock=self.clock, limits=limits, inflight=self.inflight,
                      session=_session(request, parsed), start_reply=self._start_reply,
                      who=who, on_lease=self._decision_logger(rid, parsed.prompt_tokens),
                      unload=self._unload)
        ex.policy = self.fleet.policy_for(parsed.model, request_key(ex.session, rid))
        return ex

    def _decision_logger(self, rid: str, prompt_tokens: int) -> Callable[[Lease], None] | None:
        """The decision log's callback for a sampled request (None for the rest)."""
        dlog = self.decision_log
        if dlog is None or not dlog.sampled(rid):
            return None
        attempts = itertools.count(1)
        return lambda lease: dlog.decided(rid, next(attempts), prompt_tokens, lease)

    def _send(self, target: Target, path: str, body: bytes,
              fresh: bool = False) -> Deferred[IResponse]:
        client = self.client
        if fresh:
            if self._fresh is None:
                self._fresh = make_client(self.clock, HTTPConnectionPool(self.clock,
                                                                         persistent=False))
            client = self._fresh
        return send(client, target.backend.url + path, body)

    def _unload(self, target: Target, models: tuple[str, ...]) -> Deferred[int]:
        return unload(self.client, self.clock, target.backend.url, models)

    def backend_down(self, backend: BackendState, why: str) -> None:
        """A backend stopped answering: its requests without a first byte go elsewhere."""
        self.inflight.backend_down(backend, why)

    def _start_reply(self, request: Request, response: IResponse, target: Target,
                     reason: str, lease: Lease | None = None) -> None:
        request.setResponseCode(response.code)
        ours = request.responseHeaders.getRawHeaders(b"x-request-id")
        for k, vs in response_headers(response):
            request.responseHeaders.setRawHeaders(k, vs)
        if ours:  # the request's id, not the engine's
            request.responseHeaders.setRawHeaders(b"x-request-id", ours)
        request.setHeader(b"x-pharos-backend", target.backend.url.encode())
        request.setHeader(b"x-pharos-reason", _ascii(reason))
        if lease is not None:
            if lease.policy:
                request.setHeader(b"x-pharos-policy", lease.policy.encode())
            if lease.chain:
                request.setHeader(b"x-pharos-predicted-cached-tokens",
                                  str(lease.predicted_tokens).encode())
            if lease.est_ttft is not None:
                request.setHeader(b"x-pharos-estimated-ttft-ms",
                                  f"{lease.est_ttft * 1000:.1f}".encode())


class ShadowView(Protocol):
    """What ``/admin/shadow`` reads (``pharos.shadow.Shadow``)."""

    def doc(self) -> dict[str, Any]: ...


class DecisionSink(Protocol):
    """What the proxy asks of the decision log (``pharos.obs.decisions``; the proxy imports
    no subscriber)."""

    def sampled(self, request_id: str) -> bool: ...

    def decided(self, request_id: str, attempt: int, prompt_tokens: int, lease: Lease
                ) -> None: ...


def _session(request: Request, parsed: Parsed) -> int | None:
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


def _req(request: IRequest) -> Request:
    assert isinstance(request, Request)
    return request


