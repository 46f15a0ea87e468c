# -*- test-case-name: tests.unit.test_dns_backends,tests.component.test_docker_discovery -*-
"""The backend set: the static list ∪ Docker-labelled containers ∪ DNS members, handed whole
to ``State.set_backends`` whenever a part changes. A URL is one backend: the static list wins
over discovery, Docker over DNS, and a discovered backend a static one hides is logged once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from twisted.application.service import MultiService
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from pharos.config import Backend, DnsBackends
from pharos.discovery.dns import DnsGroup, default_resolver
from pharos.discovery.docker import DockerAPI, DockerDiscovery

log = Logger()


class Discovery(MultiService):
    """Owns the Docker watcher and the DNS groups (children); pushes the union on change."""

    def __init__(self, set_backends: Callable[[Sequence[Backend]], None], clock: IReactorTime,
                 static: Sequence[Backend] = (), dns: Sequence[DnsBackends] = (), *,
                 docker: DockerAPI | None = None, resolver: Any = None) -> None:
        super().__init__()
        self.set_backends = set_backends
        self.clock = clock
        self.static: tuple[Backend, ...] = ()
        self._resolver = resolver
        self.groups: dict[DnsBackends, DnsGroup] = {}
        self.docker: DockerDiscovery | None = None
        if docker is not None:
            self.docker = DockerDiscovery(docker, clock, self._push)
            self.docker.setServiceParent(self)
        self._hidden: set[str] = set()
        self.set_static(static, dns)

    def set_static(self, backends: Sequence[Backend], dns: Sequence[DnsBackends] = ()) -> None:
        """The config's ``url:`` backends and ``dns:`` entries (start-up and reloads): a
        ``dns:`` entry that stays keeps its members, a removed one's members drain."""
        self.static = tuple(backends)
        wanted = set(dns)
        for spec in [s for s in self.groups if s not in wanted]:
            self.groups.pop(spec).disownServiceParent()
        for spec in dns:
            if spec not in self.groups:
                if self._resolver is None:
                    self._resolver = default_resolver()
                group = DnsGroup(spec, self._resolver, self.clock, self._push)
                self.groups[spec] = group
                group.setServiceParent(self)  # started now when running
        self._push()

    def backends(self) -> tuple[Backend, ...]:
        """The union, each URL once: static first, then Docker, then DNS."""
        out: dict[str, Backend] = {b.url: b for b in self.static}
        parts: list[tuple[str, tuple[Backend, ...]]] = []
        if self.docker is not None:
            parts.append(("Docker", self.docker.backends))
        parts.extend((g.describe(), g.backends) for g in self.groups.values())
        hidden: set[str] = set()
        for source, found in parts:
            for b in found:
                if b.url in out:
                    hidden.add(b.url)
                    if b.url not in self._hidden:
                        log.warn("{source} backend {url} is already a backend (the static "
                                 "list's or another source's); that one is used",
                                 source=source, url=b.url)
                    continue
                out[b.url] = b
        self._hidden = hidden
        return tuple(out.values())

    def _push(self) -> None:
        if self.running:
            self.set_backends(self.backends())

    def startService(self) -> None:
        """The static set at once; Docker and DNS add theirs as they answer."""
        super().startService()
        self._push()
