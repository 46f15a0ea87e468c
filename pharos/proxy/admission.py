"""Admission and settling: the usage stage of the request path.

Before a request is queued it reserves its estimated tokens against its key's and tenant's
daily budgets, then counts against their requests-per-minute windows (in that order, so a
request the RPM window refuses holds no tokens and one the budget refuses is not counted).
When the exchange ends the reservation is settled with the reply's usage (read by the tap, or
unknown and counted as unmetered) or released when no reply reached the client.
"""

from __future__ import annotations

import math

from pharos.proxy.auth import Identity
from pharos.proxy.errors import ApiError
from pharos.proxy.exchange import EMBEDDING_ROUTES, Exchange
from pharos.proxy.parse import Parsed
from pharos.usage import Ledger, Refusal, Reservation, estimate_tokens


def _retry_after(seconds: float) -> tuple[tuple[bytes, bytes], ...]:
    return ((b"retry-after", b"%d" % max(1, math.ceil(seconds))),)


def rate_limited(who: Identity, seconds: float) -> ApiError:
    whose = f"key {who.name!r}"
    if who.tenant_rpm is not None:
        whose += f" (or its tenant {who.tenant!r})"
    return ApiError(429, f"{whose} is over its requests per minute; retry in "
                         f"{max(1, math.ceil(seconds))} s",
                    type="rate_limit_error", code="rate_limited", headers=_retry_after(seconds))


def quota_exceeded(who: Identity, refusal: Refusal, tokens: int) -> ApiError:
    whose = f"tenant {who.tenant!r}" if refusal.budget == "tenant" else f"key {who.name!r}"
    if refusal.retry_after is None:
        # No wait helps: a 429 would have SDKs retry it for nothing.
        return ApiError(400, f"this request's estimated {tokens} tokens exceed {whose}'s whole "
                             f"daily token budget; lower max_tokens",
                        code="request_exceeds_quota")
    return ApiError(429, f"{whose} has used its tokens for today (this request needs about "
                         f"{tokens}); the budget renews at midnight, usage.timezone",
                    type="rate_limit_error", code="quota_exceeded",
                    headers=_retry_after(refusal.retry_after))


class Admission:
    """Quotas at admission and usage at the end, over one ``Ledger``."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def admit(self, who: Identity, parsed: Parsed, path: str) -> Reservation:
        """Reserve the request's tokens and count it per minute; raises the 429 (or the 400
        of a request no day's budget holds) in the route's shape."""
        ledger = self.ledger
        output = 0 if path in EMBEDDING_ROUTES else parsed.max_tokens
        tokens = estimate_tokens(parsed.prompt_tokens, output)
        held = ledger.reserve(who.name, who.tenant, tokens, who.tokens_per_day,
                              who.tenant_tokens_per_day)
        if isinstance(held, Refusal):
            raise quota_exceeded(who, held, tokens)
        wait = ledger.admit_rpm(who.name, who.tenant, who.rpm, who.tenant_rpm)
        if wait is not None:
            ledger.release(held)
            raise rate_limited(who, wait)
        return held

    def finish(self, held: Reservation, model: str, ex: Exchange | None) -> None:
        """Settle with the reply's usage when the engine's reply went to the client with a
        success status; release otherwise."""
        code = ex.request.code if ex is not None else None
        if ex is None or ex.replied is None or code is None or code >= 400:
            self.ledger.release(held)
            return
        u = ex.usage
        self.ledger.settle(held, model, u.prompt_tokens if u else None,
                           u.cached_tokens if u else None,
                           u.completion_tokens if u else None)
