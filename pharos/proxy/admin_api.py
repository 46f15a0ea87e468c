"""The admin app: ``/admin/*`` and ``/usage``. The public tree puts it behind its one admin
check (``pharos.proxy.site.Authorized``), so no route here checks the caller."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import date, timedelta
from typing import Any, Protocol

import attr
from klein import Klein
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.web.server import Request

from pharos.config import Reloaded
from pharos.proxy import errors
from pharos.proxy.admin import ConfigAdmin, backends_document, index_document, listed_count
from pharos.proxy.errors import ApiError
from pharos.proxy.explain import ROUTES as EXPLAIN_ROUTES
from pharos.proxy.explain import explain
from pharos.proxy.live import LiveConfig
from pharos.proxy.parse import parse
from pharos.proxy.public import session_of
from pharos.proxy.site import add_error_handling, reply
from pharos.sched import Scheduler
from pharos.state.state import State
from pharos.usage import Ledger, to_csv

#: Days ``/usage`` covers without ``from``.
USAGE_DAYS = 30


class ShadowView(Protocol):
    """What ``/admin/shadow`` reads (``pharos.shadow.Shadow``)."""

    def doc(self) -> dict[str, Any]: ...


@attr.s(auto_attribs=True, kw_only=True, eq=False)
class AdminAPI:
    """The operator's routes."""

    app = Klein()
    add_error_handling(app)

    state: State
    sched: Scheduler
    clock: IReactorTime
    live: LiveConfig
    ledger: Ledger
    #: The seed of ``/admin/explain``'s policy draw (the scheduler's).
    seed: Callable[[], int]
    #: The shadow policies' counts (``pharos.shadow``).
    shadow: ShadowView | None = None
    #: The config in effect and its patches (``/admin/config``); None: none to show.
    config_admin: ConfigAdmin | None = None
    #: Reads the config file again (``pharos.reload``); None without a config file.
    reload_config: Callable[[], Reloaded] | None = None

    @app.route("/usage", methods=["GET"])
    def usage(self, request: Request) -> bytes:
        """Usage per day by key, model or tenant (admin): ``from``/``to`` dates in
        usage.timezone (default: the last 30 days), ``format=json|csv``."""
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
        return reply(request, 200, {"from": from_day.isoformat(), "to": to_day.isoformat(),
                                    "by": by, "rows": rows})

    @app.route("/admin/explain/<path:route>", methods=["POST"])
    def explain(self, request: Request, route: str) -> bytes:
        """What the policy would do with this request now; routes nothing, changes nothing."""
        path = "/" + route.lstrip("/")
        if path not in EXPLAIN_ROUTES:
            known = ", ".join(sorted(EXPLAIN_ROUTES))
            raise ApiError(404, f"cannot explain {errors.echo(path)}: one of {known}",
                           code="not_found")
        assert request.content is not None
        fleet, models = self.live.now.fleet, self.state.models
        parsed = parse(request.content.read(), path, lambda m: fleet.resolve(m, models))
        doc = explain(self.sched, path, parsed, session_of(request, parsed), self.seed())
        return reply(request, 200, doc)

    @app.route("/admin/shadow", methods=["GET"])
    def shadow_stats(self, request: Request) -> bytes:
        """The shadow policies' agreement and estimated gain per model and policy, what was
        dropped or raised (admin; ``pharos.shadow``)."""
        if self.shadow is None:
            return reply(request, 200, {"tallies": [], "dropped": 0, "errors": {}})
        return reply(request, 200, self.shadow.doc())

    @app.route("/admin/config", methods=["GET"])
    def admin_config(self, request: Request) -> bytes:
        """The config in effect (secrets redacted) and its generation (admin)."""
        return reply(request, 200, self._config_admin().document())

    @app.route("/admin/config", methods=["PATCH"])
    def patch_config(self, request: Request) -> bytes:
        """A JSON merge patch of the config, applied like a reload or refused whole (422
        with every error); the file's next change replaces it (admin)."""
        assert request.content is not None
        admin = self._config_admin()
        done = admin.patch(request.content.read())
        if done.errors:
            return _invalid(request, done.errors, "the patch", "applied")
        return reply(request, 200, {"applied": list(done.applied), **admin.document()})

    def _config_admin(self) -> ConfigAdmin:
        if self.config_admin is None:
            raise ApiError(409, "no config to show or patch here", code="no_config")
        return self.config_admin

    @app.route("/admin/backends", methods=["GET"])
    def admin_backends(self, request: Request) -> bytes:
        """Each backend's plan, signals, ejection, and per target its capacity with its
        source and learned estimates (admin)."""
        return reply(request, 200, backends_document(self.state, self.sched))

    @app.route("/admin/index", methods=["GET"])
    async def admin_index(self, request: Request) -> bytes:
        """The prefix index: entries, bytes, per target the entries a lookup can match; ``?list=N``:
        the N most recent entries as hashes (admin). Counted a shard per reactor turn."""
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
        return reply(request, 200, index_document(census, self.sched.index, self.state,
                                                  listed, key_of, gen_of))

    @app.route("/admin/reload", methods=["POST"])
    def reload(self, request: Request) -> bytes:
        """Read the config file again now (admin): 200 naming the fields applied
        live and those needing a restart (both empty: nothing changed); 422 with every error
        when the file does not parse (the running config stays); 409 without a file."""
        if self.reload_config is None:
            raise ApiError(409, "Pharos runs without a config file: nothing to reload",
                           code="no_config_file")
        done = self.reload_config()
        if done.errors:
            return _invalid(request, done.errors, "the config file", "reloaded")
        return reply(request, 200, {"changed": done.changed, "applied": list(done.applied),
                                    "needs_restart": list(done.restart)})


def _invalid(request: Request, errs: Sequence[str], what: str, not_done: str) -> bytes:
    """422 listing every error of a config that was refused whole."""
    return reply(request, 422, {"error": {
        "message": f"{what} has {len(errs)} error(s) and was not {not_done}; the running "
                   f"config stays",
        "type": "invalid_request_error", "param": None, "code": "invalid_config"},
        "errors": list(errs)})
