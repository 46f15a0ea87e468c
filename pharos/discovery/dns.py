# -*- test-case-name: tests.unit.test_dns_backends -*-
"""DNS backends (``backends: [{dns: NAME, port, kind, refresh}]``): every address NAME resolves
to is a backend, NAME resolved again every ``refresh`` seconds (a Kubernetes headless Service
answers with one A record per ready pod).

The ``twisted.names`` resolver is injected (tests need no DNS server); by default Twisted's
chain (hosts file, then /etc/resolv.conf). A failed lookup (error, timeout, NXDOMAIN) keeps
the last set, logged once; an answer with no address is an empty set. Members that stay keep
their state; members that leave drain.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any, Final

from twisted.internet.defer import DeferredList
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from pharos.config import Backend, DnsBackends
from pharos.periodic import Periodic

log = Logger()

#: A lookup taking longer than this (or than the refresh, if shorter) counts as failed.
LOOKUP_TIMEOUT: Final = 5.0
#: A name resolving to more addresses than this keeps only the first (sorted) ones.
MAX_MEMBERS: Final = 256


def default_resolver() -> Any:
    """Twisted's resolver chain (hosts file, then DNS), built on first need."""
    from twisted.names import client

    return client.createResolver()


class DnsGroup(Periodic):
    """One ``dns:`` entry: its members' backends in ``backends``, ``on_change`` told when the
    set changes. Resolves at start, then ``refresh`` seconds after each answer."""

    def __init__(self, spec: DnsBackends, resolver: Any, clock: IReactorTime,
                 on_change: Callable[[], None] = lambda: None) -> None:
        super().__init__(clock, spec.refresh, self.resolve, now=True, cancel=True,
                         what=f"DNS backends dns {spec.name} port {spec.port}: a lookup")
        self.spec = spec
        self.resolver = resolver
        self.on_change = on_change
        self.backends: tuple[Backend, ...] = ()
        #: The addresses of the last answer; ``None`` before the first.
        self.addresses: tuple[str, ...] | None = None
        #: Why the last lookup failed; ``None`` while lookups succeed.
        self.failing: str | None = None
        self.lookups = 0

    def describe(self) -> str:
        return f"dns {self.spec.name} port {self.spec.port}"

    async def resolve(self) -> None:
        """One lookup of A and AAAA records; the set changes only on an answer."""
        self.lookups += 1
        name = self.spec.name
        lookups = [self.resolver.lookupAddress(name), self.resolver.lookupIPV6Address(name)]
        timeout = min(LOOKUP_TIMEOUT, self.spec.refresh)
        for d in lookups:
            d.addTimeout(timeout, self.clock)
        results = await DeferredList(lookups, consumeErrors=True)
        failed = [r for ok, r in results if not ok]
        if failed:
            why = _why(failed[0])
            if self.failing is None:
                kept = len(self.backends)
                log.warn("DNS backends {what}: lookup failed ({why}); keeping the last "
                         "{kept} member(s)", what=self.describe(), why=why, kept=kept)
            self.failing = why
            return
        if self.failing is not None:
            log.info("DNS backends {what}: resolving again", what=self.describe())
            self.failing = None
        addresses = sorted({a for _, r in results for a in _addresses(r)})
        if len(addresses) > MAX_MEMBERS:
            log.warn("DNS backends {what}: {n} addresses; the first {max} are used",
                     what=self.describe(), n=len(addresses), max=MAX_MEMBERS)
            addresses = addresses[:MAX_MEMBERS]
        self.addresses = tuple(addresses)
        backends = tuple(self.spec.member(a) for a in addresses)
        if backends != self.backends:
            log.info("DNS backends {what}: {n} member(s)", what=self.describe(), n=len(backends))
            self.backends = backends
            self.on_change()


def _addresses(result: Any) -> list[str]:
    """The addresses of a ``lookupAddress``/``lookupIPV6Address`` answer (answers,
    authority, additional): A and AAAA records only (a CNAME on the way is skipped)."""
    from twisted.names import dns

    out: list[str] = []
    answers = result[0] if isinstance(result, tuple) and result else []
    for rr in answers:
        if rr.type == dns.A:
            out.append(socket.inet_ntop(socket.AF_INET, rr.payload.address))
        elif rr.type == dns.AAAA:
            out.append(socket.inet_ntop(socket.AF_INET6, rr.payload.address))
    return out


def _why(failure: Failure) -> str:
    e = failure.value
    return f"{type(e).__name__}: {e}"[:200] if str(e) else type(e).__name__
