"""``/status``: one server-rendered page of what Pharos knows now.

Each backend with its kind, version and resolved plan, the age of its rounds, each target's
residency, load signals (unknown shown as unknown, never 0), in-flight, capacity with its
source and learned speeds; the last requests and usage by key. ``twisted.web.template``
escapes every string: model names, key names and probe labels come from clients and engines.
No prompt text reaches the page: the records it reads carry none.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from twisted.internet.defer import Deferred
from twisted.web.template import Tag, flattenString, tags

from pharos.engine.doctor import BackendReport
from pharos.engine.signals import FAST_SIGNALS, LOAD_ORDER, Residency, Signal, Snapshot, merge
from pharos.peer.node import PeerNode
from pharos.sched import Scheduler
from pharos.state.registry import BackendState, Target
from pharos.state.state import State
from pharos.usage import COUNT_FIELDS, Ledger

#: Requests the page lists.
RECENT = 50
#: Days of the longer usage table.
USAGE_DAYS = 30
#: Seconds between the page's reloads.
REFRESH_SECONDS = 10
#: Fields of a finished request the page and the live map read (never prompt text).
DONE_FIELDS = ("time", "key", "tenant", "model", "route", "target", "target_model", "status",
               "outcome", "reason", "prompt_tokens", "cached_tokens", "completion_tokens",
               "ttft_ms", "duration_ms")
UNKNOWN = "unknown"

_CSS = """
body{font:13px/1.4 system-ui,sans-serif;margin:1.2em;color:#222;background:#fafafa}
h1{font-size:20px}h2{font-size:16px;margin-top:1.6em}h3{font-size:14px;margin:.8em 0 .3em}
table{border-collapse:collapse;margin:.3em 0 .8em}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#eee}.backend{border:1px solid #bbb;background:#fff;padding:.5em 1em;
margin:.6em 0}.unknown{color:#999;font-style:italic}.own{color:#a50}.down{color:#b00}
.up{color:#070}code{font-size:12px}
"""


def done_fields(record: Any) -> dict[str, Any]:
    """The ``DONE_FIELDS`` of a finished request's record, a dict or a ``Done``; missing ones are
    None. ``Done.ttft`` and ``Done.duration`` (seconds) stand in for missing ``*_ms``."""
    def get(name: str) -> Any:
        if isinstance(record, Mapping):
            return record.get(name)
        return getattr(record, name, None)

    out = {k: get(k) for k in DONE_FIELDS}
    for ms, sec in (("ttft_ms", "ttft"), ("duration_ms", "duration")):
        seconds = get(sec)
        if out[ms] is None and isinstance(seconds, int | float):
            out[ms] = round(seconds * 1000, 1)
    return out


class RecentRequests:
    """An ``on_done`` subscriber keeping the last ``RECENT`` requests' prompt-free fields."""

    def __init__(self, size: int = RECENT) -> None:
        self.items: deque[dict[str, Any]] = deque(maxlen=size)

    def __call__(self, record: Any) -> None:
        """Keep one finished request (a subscriber never raises into the proxy)."""
        try:
            self.items.append(done_fields(record))
        except Exception:  # a malformed record is skipped, not fatal
            return


def backend_report(b: BackendState) -> BackendReport:
    """Doctor's report of a backend from its last rounds: the fast signals from the last
    load round, the rest from the last full one."""
    parts: list[tuple[str, Signal, Snapshot]] = []
    if b.load is not None:
        parts += [(name, s, b.load) for s, name in b.load.sources.items() if s in FAST_SIGNALS]
    if b.full is not None:
        parts += [(name, s, b.full) for s, name in b.full.sources.items()]
    return BackendReport(b.url, kind=b.kind, version=b.version, plan=b.plan,
                         snapshot=merge(parts), error=b.failing)


def _show(v: object) -> Tag | str:
    if v is None:
        return tags.span(UNKNOWN, class_="unknown")
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, Residency):
        return v.value if v is not Residency.UNKNOWN else tags.span(UNKNOWN, class_="unknown")
    if isinstance(v, Mapping | list | tuple):
        return ", ".join(f"{k}={x}" for k, x in (v.items() if isinstance(v, Mapping)
                                                  else enumerate(v)))
    return str(v)


def _age(now: float, at: float | None) -> Tag | str:
    if at is None:
        return tags.span("never", class_="unknown")
    return f"{max(0.0, now - at):.1f} s ago"


def _table(head: Iterable[str], rows: Iterable[Iterable[Any]], **attrs: str) -> Tag:
    return tags.table(tags.tr(*(tags.th(h) for h in head)),
                      *(tags.tr(*(tags.td(c) for c in row)) for row in rows), **attrs)


class StatusPage:
    """Renders ``/status`` from the live state, scheduler, ledger and the recent requests."""

    def __init__(self, state: State, sched: Scheduler, ledger: Ledger,
                 recent: RecentRequests, peers: PeerNode | None = None) -> None:
        self.state = state
        self.sched = sched
        self.ledger = ledger
        self.recent = recent
        #: The peer node, when peers are configured (a Peers section then).
        self.peers = peers

    def render(self) -> Deferred[bytes]:
        """The page, as bytes (fires at once: nothing in it waits)."""
        d = flattenString(None, self.page())
        return d.addCallback(lambda body: b"<!DOCTYPE html>\n" + body)

    def page(self) -> Tag:
        """The whole page as a tag tree (every string in it is escaped when flattened)."""
        now = self.state.clock.seconds()
        return tags.html(
            tags.head(tags.meta(charset="utf-8"),
                      tags.meta(**{"http-equiv": "refresh", "content": str(REFRESH_SECONDS)}),
                      tags.title("Pharos status"), tags.style(_CSS)),
            tags.body(
                tags.h1("Pharos status"),
                tags.p(f"{len(self.state.backends)} backends, {len(self.state.targets)} "
                       f"targets, {self.sched.waiting} waiting in the queue"),
                tags.h2("Backends"),
                *(self.backend(b, now) for b in self.state.backends.values()),
                tags.h2(f"Last {self.recent.items.maxlen} requests"),
                self.requests(),
                tags.h2("Usage by key"),
                *self.usage(),
                *(self.peer_section(self.peers, now) if self.peers is not None else ()),
            ))

    @staticmethod
    def peer_section(node: PeerNode, now: float) -> list[Tag]:
        """Each peer member: its origin, whether it is connected, when last heard, and what
        is wrong with the link (a partition, another proto, another fingerprint)."""
        rows = [(p.member, _show(p.origin), "this instance" if p.myself else
                 "yes" if p.connected else "no", _age(now, p.heard_at), p.failing or "",
                 "proto" if p.proto_mismatch else
                 "fingerprint" if p.origin in node.fingerprint_mismatch else "",
                 str(len(p.pending)), str(p.dropped_ops))
                for p in node.peers.values()]
        return [tags.h2("Peers"),
                tags.p("origin ", tags.code(node.origin), ", fingerprint ",
                       tags.code(node.fingerprint())),
                _table(("member", "origin", "connected", "last heard", "failing", "mismatch",
                        "pending ops", "dropped ops"), rows)]

    def backend(self, b: BackendState, now: float) -> Tag:
        """One backend's section: identity, rounds, plan, targets."""
        doc = backend_report(b).as_json()
        up = self.state.is_up(b, now)
        head = tags.h3(tags.code(b.url), " ",
                       tags.span("up" if up else "down", class_="up" if up else "down"))
        facts = _table(
            ("kind", "version", "last full round", "last load round", "failing"),
            [(_show(b.kind), _show(b.version), _age(now, b.full_at), _age(now, b.load_at),
              _show(b.failing) if b.failing else "no")])
        active = _table(
            ("probe", "signal", "source", "value"),
            [(tags.code(a["probe"]), a["signal"],
              tags.span("own", class_="own") if a["source"] == "own" else
              f"{a['source']} {a['feed']}" if a["feed"] != "log" else a["source"],
              _show(a["value"]))
             for a in doc["active"]], class_="probes")
        dropped = _table(
            ("dropped probe", "signal", "source", "reason"),
            [(tags.code(d["probe"]), d["signal"], d["source"],
              d["reason"] + (f": {d['detail']}" if d["detail"] else ""))
             for d in doc["dropped"]], class_="dropped") if doc["dropped"] else tags.p(
            "no dropped probes")
        mine = [t for t in self.state.targets if t.backend is b]
        return tags.div(head, facts, tags.h3("Plan: active probes"), active, dropped,
                        tags.h3("Targets"), self.targets(mine),
                        class_="backend", **{"data-backend": b.url})

    def targets(self, targets: list[Target]) -> Tag:
        """The targets' table: residency, load signals, in-flight, capacity, speeds."""
        rows = []
        for t in targets:
            v = self.state.view(t)
            cap, source = self.sched.capacity_of(t)
            s = t.stats
            rows.append((
                tags.code(t.model), _show(v.residency),
                *(_show(getattr(v, sig.value)) for sig in LOAD_ORDER),
                str(t.inflight), tags.span(_show(cap), f" ({source})"),
                _show(s.prefill_sec_per_token.value), _show(s.load_sec.value),
                _show(s.service_sec.value)))
        head = ("model", "residency", *(sig.value for sig in LOAD_ORDER), "in-flight",
                "capacity (source)", "prefill s/token", "load s", "request s")
        return _table(head, rows, class_="targets")

    def requests(self) -> Tag:
        """The last requests, newest first."""
        rows = []
        for r in reversed(self.recent.items):
            tokens = (f"{_n(r['prompt_tokens'])} in ({_n(r['cached_tokens'])} cached), "
                      f"{_n(r['completion_tokens'])} out")
            rows.append((_show(r["key"]), _show(r["model"]), _show(r["status"]),
                         _show(r["target"]), _show(r["reason"] or r["outcome"]), tokens,
                         _show(r["ttft_ms"]), _show(r["duration_ms"])))
        return _table(("key", "model", "status", "target", "reason", "tokens", "TTFT ms",
                       "duration ms"), rows, class_="recent")

    def usage(self) -> list[Tag]:
        """Usage by key today and over the last ``USAGE_DAYS`` days."""
        today = self.ledger.today()
        out = []
        for title, first in (("today", today),
                             (f"last {USAGE_DAYS} days", today - timedelta(days=USAGE_DAYS - 1))):
            sums: dict[str, dict[str, int]] = {}
            for row in self.ledger.rows(first, today, "key"):
                acc = sums.setdefault(str(row["key"]), dict.fromkeys(COUNT_FIELDS, 0))
                for f in COUNT_FIELDS:
                    acc[f] += int(row[f])
            out.append(tags.h3(title))
            out.append(_table(("key", *COUNT_FIELDS),
                              [(k, *(str(v[f]) for f in COUNT_FIELDS))
                               for k, v in sorted(sums.items())], class_="usage")
                       if sums else tags.p("no usage"))
        return out


def _n(v: object) -> str:
    return "?" if v is None else str(v)
