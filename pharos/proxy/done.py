"""A finished request as one immutable record.

The proxy builds one ``Done`` per data-plane request, whatever became of it (refused at
admission, answered, failed, left), and hands it to every ``PublicAPI.on_done`` subscriber:
the metrics, the usage journal, the debug request line, and the status page and live map as
they come. Subscribers read it; none of them is imported by the proxy.

``DECISIONS`` is the fixed table of ``stage`` and ``outcome`` values (one truth: the metrics
pre-declare every pair from it, and a test checks every value the request path records is in
it). A new branch gets a row here in the same change.
"""

from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from pharos.proxy.errors import ApiError

if TYPE_CHECKING:
    from twisted.web.server import Request

    from pharos.proxy.auth import Identity
    from pharos.proxy.exchange import Exchange
    from pharos.proxy.parse import Parsed

#: The decision table: every stage and its fixed outcomes. Request-path stages are recorded
#: on ``Done.decisions``; ``resolve``, ``scrape`` and ``generation`` come from the state's
#: background rounds (``State.on_decision``). ``upstream`` ``timed_out``: no first byte within
#: ``timeouts.first_byte``; ``load`` ``victims_unloaded`` / ``unload_failed``: the idle models
#: named for a cold load were unloaded first, or not all of them (``pharos.proxy.unload``).
DECISIONS: Final[dict[str, tuple[str, ...]]] = {
    "admission": ("ok", "unauthorized", "bad_request", "too_large", "model_not_allowed",
                  "rate_limited", "quota_exceeded"),
    "usage": ("pharos_asked", "client_asked"),
    "route": ("only_choice", "least_loaded", "cache", "warm", "affinity", "baseline",
              "unknown_model",
              "unavailable", "queue_full", "client_left"),
    "queue": ("immediate", "waited"),
    "load": ("cold_start", "unexpected_load", "control", "victims_unloaded", "unload_failed"),
    "prefix": ("predicted_hit", "wrong_prediction", "unpredicted_hit", "miss", "unknown"),
    "upstream": ("ok", "error_status", "connect_failed", "busy_retried", "error_retried",
                 "died_mid_reply", "client_left", "pharos_error", "timed_out"),
    "resolve": ("new_plan", "same_plan", "failed"),
    "scrape": ("ok", "probe_failed", "new_version", "unreachable"),
    "generation": ("unloaded", "unlisted", "new_version"),
}

#: The status of a request whose client left before its reply ended (nginx's convention).
CLIENT_CLOSED = 499

#: A client's ``x-request-id`` is echoed only when it looks like an id: 1-128 of these.
_WELL_FORMED_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")

#: ``ApiError.code`` of a refusal before the exchange → its ``admission`` outcome.
_REFUSALS: Final = {
    "invalid_api_key": "unauthorized",
    "model_not_allowed": "model_not_allowed",
    "rate_limited": "rate_limited",
    "quota_exceeded": "quota_exceeded",
    "request_exceeds_quota": "quota_exceeded",
    "request_too_large": "too_large",
}


#: Fresh request ids: 128 random bits from a generator seeded from the OS once (again in a
#: forked child), not a ``getrandom`` call per request. An id names a request; no secret.
_IDS = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _IDS.seed(os.urandom(32)))


def request_id(request: Request) -> str:
    """The client's ``x-request-id`` when well formed (so its logs and Pharos's join), else
    a fresh one (32 hex digits)."""
    sent = request.getHeader(b"x-request-id")
    if sent is not None and _WELL_FORMED_ID.fullmatch(sent):
        return sent.decode("ascii")
    return f"{_IDS.getrandbits(128):032x}"


@dataclass(frozen=True, slots=True)
class Done:
    """One finished request; never prompt text, only names, numbers and fixed values.

    Identity and what was asked: ``request_id``, the client's ``x-request-id`` (well formed)
    or one Pharos made; the reply carries it. ``key``: the key's configured name
    (``anonymous`` without keys; ``None``: no valid key, a 401); ``tenant`` its tenant.
    ``model``: as the client named it (``""`` when not read or absent: a subscriber making
    labels of it must bound it, as the metrics do). ``route``: the request path.

    Where it went and why: ``target``, the URL of the backend whose reply went to the client
    (``None``: none did); ``target_model``, its model as Pharos names it; ``reason``, the
    policy's reason, for people. ``decisions``: every branch taken as ``(stage, outcome)``
    pairs in order, from ``DECISIONS`` (route, queue and upstream once per attempt).
    ``attempts``: leases taken.

    How it ended: ``status``, the HTTP status the client got (``CLIENT_CLOSED``, 499, when the
    client left first); ``outcome``, the exchange's ending (``ok``, ``error_status``,
    ``connect_failed``, ``died_mid_reply``, ``client_left``, ``timed_out``, ``pharos_error``;
    ``None`` when refused before the exchange).

    Timings (seconds; ``None`` when it did not happen): ``time``, when it ended (epoch).
    ``ttft``: first engine byte less the send of the attempt that answered; ``est_ttft`` the
    policy's estimate. ``overhead``: Pharos's own time from the route starting to the first
    upstream send, queue wait excluded. ``queue_wait``: time in the fair queue over all
    attempts. ``duration``: the route starting to the end of the reply.

    Usage and prediction: ``prompt_tokens``, ``cached_tokens``, ``completion_tokens`` as the
    engine reported them. ``metered``: a reply went to the client with usage read.
    ``predicted_tokens``: the prefix index's prediction for the target (0: none), from a slot
    of ``prediction_source`` (``local``, ``peer``, ``restored``). ``prefix``: the prediction
    against the engine's cached tokens (``None`` without a prefix chain or a reply).
    ``policy``: the routing policy of the attempt that answered (``None``: no lease).
    """

    time: float
    request_id: str
    key: str | None
    tenant: str | None
    model: str
    route: str
    status: int
    target: str | None = None
    target_model: str | None = None
    reason: str | None = None
    decisions: tuple[tuple[str, str], ...] = ()
    outcome: str | None = None
    attempts: int = 0
    ttft: float | None = None
    est_ttft: float | None = None
    overhead: float | None = None
    queue_wait: float | None = None
    duration: float = 0.0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    metered: bool = False
    predicted_tokens: int = 0
    prediction_source: str | None = None
    prefix: str | None = None
    #: The policy that routed the attempt that answered (its model's, or its split arm).
    policy: str | None = None

    def decision_text(self) -> str:
        """The decisions as ``stage=outcome`` pairs, space separated (the request line's)."""
        return " ".join(f"{s}={o}" for s, o in self.decisions)

    def journal(self) -> dict[str, Any]:
        """The usage journal's line: the key, tenant and counts, and the rest of the record."""
        return {
            "time": round(self.time, 3),
            "request_id": self.request_id,
            "key": self.key,
            "tenant": self.tenant,
            "model": self.model,
            "route": self.route,
            "target": self.target,
            "status": self.status,
            "outcome": self.outcome,
            "reason": self.reason,
            "decisions": [f"{s}={o}" for s, o in self.decisions],
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_ms": _ms(self.ttft),
            "est_ttft_ms": _ms(self.est_ttft),
            "overhead_ms": _ms(self.overhead, 3),
            "queue_wait_ms": _ms(self.queue_wait),
            "duration_ms": _ms(self.duration),
        }


def _ms(seconds: float | None, digits: int = 1) -> float | None:
    return None if seconds is None else round(seconds * 1000, digits)


@dataclass(slots=True)
class Trace:
    """What the route learns about a request before its exchange (mutable, one request's
    own), turned into a ``Done`` by ``finish``."""

    started: float
    request_id: str
    route: str
    who: Identity | None = None
    model: str = ""
    decisions: list[tuple[str, str]] = field(default_factory=list)
    admitted: bool = False

    def parsed(self, parsed: Parsed) -> None:
        self.model = parsed.model

    def admit(self, parsed: Parsed) -> None:
        """Admission passed: record it and whether Pharos asked for usage (streamed chat)."""
        self.admitted = True
        self.decisions.append(("admission", "ok"))
        if self.route == "/v1/chat/completions" and parsed.stream:
            self.decisions.append(
                ("usage", "pharos_asked" if parsed.pharos_asked_usage else "client_asked"))

    def refused(self, e: ApiError) -> None:
        """A refusal before the exchange: its admission outcome (other 4xx: bad_request)."""
        if not self.admitted:
            self.decisions.append(("admission", _REFUSALS.get(e.code or "", "bad_request")))

    def finish(self, ended: float, status: int, ex: Exchange | None = None) -> Done:
        who = self.who
        decisions = self.decisions
        if ex is None:
            return Done(time=ended, request_id=self.request_id,
                        key=who.name if who else None, tenant=who.tenant if who else None,
                        model=self.model, route=self.route, status=status,
                        decisions=tuple(decisions), duration=ended - self.started)
        if ex.outcome == "client_left":
            status = CLIENT_CLOSED
        lease = ex.answered
        target = ex.replied
        usage = ex.usage
        sample = ex.sample
        overhead = None
        if ex.first_sent is not None:
            overhead = max(0.0, ex.first_sent - self.started - ex.queue_wait_before_send)
        return Done(
            time=ended, request_id=self.request_id,
            key=who.name if who else None, tenant=who.tenant if who else None,
            model=self.model, route=self.route, status=status,
            target=target.backend.url if target is not None else None,
            target_model=target.model if target is not None else None,
            reason=ex.reason,
            decisions=tuple(decisions) + tuple(ex.decisions),
            outcome=ex.outcome, attempts=ex.attempts,
            ttft=sample.ttft_sec if sample is not None else None,
            est_ttft=lease.est_ttft if lease is not None else None,
            overhead=overhead,
            queue_wait=ex.queue_wait if ex.attempts else None,
            duration=ended - self.started,
            prompt_tokens=usage.prompt_tokens if usage else None,
            cached_tokens=usage.cached_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            metered=(target is not None and usage is not None
                     and usage.prompt_tokens is not None),
            predicted_tokens=lease.predicted_tokens if lease is not None else 0,
            prediction_source=(lease.source if lease is not None and lease.predicted_tokens
                               else None),
            prefix=lease.prefix if lease is not None else None,
            policy=lease.policy or None if lease is not None else None,
        )
