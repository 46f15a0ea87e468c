"""Who the peers are: the ``peers.members`` list, or every address ``peers.dns`` resolves to
(re-resolved every ``DNS_INTERVAL`` seconds), each a ``host:port`` (``[v6]:port``) string.
``DnsResolver`` asks Twisted's resolver chain for every A record, as a Kubernetes headless
Service answers. Which member is this instance is learned from ``Pharos-Origin``, not here.
"""

from __future__ import annotations

import socket
from typing import Final, Protocol

from twisted.internet.defer import Deferred

from pharos.config import PeersConfig

#: Seconds between re-resolutions of ``peers.dns``.
DNS_INTERVAL: Final = 10.0


class Resolver(Protocol):
    """Resolves a host name to every address it has."""

    def resolve(self, host: str) -> Deferred[list[str]]: ...


class DnsResolver:
    """Every A and AAAA record of a name through ``twisted.names`` (hosts file, then DNS)."""

    def resolve(self, host: str) -> Deferred[list[str]]:
        return Deferred.fromCoroutine(self._resolve(host))

    async def _resolve(self, host: str) -> list[str]:
        from twisted.names import client, dns

        out: list[str] = []
        for lookup, kind in ((client.lookupAddress, dns.A), (client.lookupIPV6Address, dns.AAAA)):
            try:
                answers, _, _ = await lookup(host)
            except Exception:
                continue
            for rr in answers:
                if rr.type == kind:
                    out.append(socket.inet_ntop(
                        socket.AF_INET if kind == dns.A else socket.AF_INET6,
                        rr.payload.address))
        return out


def split(address: str, default_port: int | None) -> tuple[str, int | None]:
    """``host:port``, ``[v6]:port`` or a bare host → (host, port or ``default_port``)."""
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else default_port
    host, sep, port = address.rpartition(":")
    if sep and port.isdigit():
        return host, int(port)
    return address, default_port


def join(host: str, port: int) -> str:
    """The member string of an address: IPv6 in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Membership:
    """The current member set of ``peers``; ``refresh`` re-resolves ``dns`` (a static list
    never changes). A failed resolution keeps the last set: a DNS hiccup is not every
    peer leaving."""

    def __init__(self, peers: PeersConfig, resolver: Resolver | None = None) -> None:
        self.dns = peers.dns
        self.default_port = peers.listen.port()
        self.resolver = resolver if resolver is not None else DnsResolver()
        self.members: frozenset[str] = frozenset(peers.members)
        #: Why the last resolution failed (None: it answered, or there is nothing to resolve).
        self.failing: str | None = None

    @property
    def dynamic(self) -> bool:
        """Whether members come from DNS (and ``refresh`` is worth a loop)."""
        return self.dns is not None

    async def refresh(self) -> frozenset[str]:
        """Re-resolve ``peers.dns`` (a name without a port takes ``peers.listen``'s)."""
        if self.dns is None:
            return self.members
        host, port = split(self.dns, self.default_port)
        if port is None:
            self.failing = f"peers.dns {self.dns!r} has no port and peers.listen names none"
            return self.members
        try:
            addresses = await self.resolver.resolve(host)
        except Exception as e:
            self.failing = f"cannot resolve {host!r}: {e}"
            return self.members
        self.failing = None
        self.members = frozenset(join(a, port) for a in addresses)
        return self.members
