"""A fake Docker daemon: the Engine API (version 1.50) on a UNIX socket, for the discovery
tests and the docker CLI (no engine runs on these machines).

Every body is cloned from fixtures/docker/1.50/ (recorded from the Engine API's spec and the
daemon's source; its meta.yaml names the files) with the fake's ids, names, labels, ports,
networks and times put in. Containers are driven by hand: ``run``, ``stop``, ``die``,
``start``, ``restart``, ``remove``, ``recreate`` (new labels: a new container, as compose
does) each emit the events the daemon emits; ``write_log`` appends to a container's log, which
``/containers/{id}/logs`` serves multiplexed (stdcopy frames) or raw for a TTY container, and
follows until the container stops. Bad-input switches: ``garbage`` (the socket answers bytes
that are not HTTP), ``list_garbage`` (``/containers/json`` answers 200 with non-JSON),
``list_stalls`` (it sends the start of a list and nothing more),
``cut_events`` (open event streams send half a line and close).
"""

from __future__ import annotations

import copy
import json
import re
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from twisted.internet import reactor
from twisted.internet.interfaces import IListeningPort
from twisted.internet.protocol import Factory, Protocol
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

FIXTURES: Final = Path(__file__).resolve().parents[2] / "fixtures" / "docker" / "1.50"
API_VERSION: Final = "1.50"
MIN_API_VERSION: Final = "1.24"
ENGINE_VERSION: Final = json.loads((FIXTURES / "version").read_bytes())["Version"]

_SUMMARY: Final = json.loads((FIXTURES / "containers_json").read_bytes())[0]
_INSPECT: Final = json.loads((FIXTURES / "containers_id_json").read_bytes())
_EVENT: Final = json.loads((FIXTURES / "events").read_bytes().splitlines()[0])
_VERSIONED = re.compile(r"/v([0-9]+\.[0-9]+)(/.*)")
_CONTAINER = re.compile(r"/containers/([^/]+)/(json|logs)")


def _key(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


def _rfc3339(ns: int) -> str:
    secs, frac = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{frac:09d}Z"


@dataclass
class FakeContainer:
    """One container of the fake daemon."""

    id: str
    name: str
    labels: dict[str, str]
    ports: tuple[int, ...] = (8080,)
    networks: dict[str, str] = field(default_factory=lambda: {"bridge": "172.17.0.4"})
    tty: bool = False
    image: str = "docker.io/library/ubuntu:latest"
    created: int = 1739811096
    running: bool = False
    started_ns: int = 0
    finished_ns: int = 0
    exit_code: int = 0
    #: (stream 1 or 2, line with its newline, time in ns)
    log: list[tuple[int, bytes, int]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Its ``/containers/json`` entry, cloned from the fixture."""
        s = copy.deepcopy(_SUMMARY)
        template = s["NetworkSettings"]["Networks"]["bridge"]
        s.update(
            Id=self.id, Names=[f"/{self.name}"], Image=self.image, Created=self.created,
            Ports=[{"PrivatePort": p, "Type": "tcp"} for p in self.ports],
            Labels=dict(self.labels),
            State="running" if self.running else "exited",
            Status="Up 3 seconds" if self.running else f"Exited ({self.exit_code}) 1 second ago",
        )
        s["HostConfig"]["NetworkMode"] = next(iter(sorted(self.networks)), "none")
        s["NetworkSettings"]["Networks"] = {
            net: {**template, "IPAddress": ip if self.running else "",
                  "Gateway": ip.rsplit(".", 1)[0] + ".1" if self.running and ip else ""}
            for net, ip in self.networks.items()}
        return s

    def inspect(self) -> dict[str, Any]:
        """Its ``/containers/{id}/json`` answer, cloned from the fixture."""
        s = copy.deepcopy(_INSPECT)
        template = s["NetworkSettings"]["Networks"]["bridge"]
        s.update(Id=self.id, Name=f"/{self.name}")
        for path in ("ResolvConfPath", "HostnamePath", "HostsPath", "LogPath"):
            s[path] = s[path].replace(_INSPECT["Id"], self.id)
        s["State"].update(
            Status="running" if self.running else "exited", Running=self.running,
            Pid=1234 if self.running else 0, ExitCode=self.exit_code,
            StartedAt=_rfc3339(self.started_ns) if self.started_ns else "0001-01-01T00:00:00Z",
            FinishedAt=(_rfc3339(self.finished_ns) if self.finished_ns
                        else "0001-01-01T00:00:00Z"))
        s["Config"].update(Tty=self.tty, Labels=dict(self.labels), Image=self.image,
                           ExposedPorts={f"{p}/tcp": {} for p in self.ports})
        s["NetworkSettings"]["Ports"] = {f"{p}/tcp": None for p in self.ports}
        s["NetworkSettings"]["Networks"] = {
            net: {**template, "IPAddress": ip if self.running else ""}
            for net, ip in self.networks.items()}
        return s


def frame(stream: int, data: bytes) -> bytes:
    """One stdcopy frame (fixtures/docker/1.50/containers_id_logs.multiplexed)."""
    return struct.pack(">BxxxL", stream, len(data)) + data


class _Garbage(Protocol):
    """Not HTTP at all."""

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(b"\x00\x17garbage, not an HTTP answer\r\n\r\n\xff\xfe")
        self.transport.loseConnection()


class _EitherFactory(Factory):
    """The site, or garbage while the fake's ``garbage`` switch is on."""

    def __init__(self, fake: FakeDocker, site: Site) -> None:
        self.fake = fake
        self.site = site

    def buildProtocol(self, addr: Any) -> Protocol | None:
        if self.fake.garbage:
            return _Garbage()
        return self.site.buildProtocol(addr)


@dataclass
class _Watcher:
    request: Request
    filters: dict[str, list[str]]


@dataclass
class _Follower:
    request: Request
    container: FakeContainer
    streams: tuple[int, ...]


class FakeDocker(Resource):
    """The fake daemon's API (a leaf resource: it routes by path itself)."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.containers: dict[str, FakeContainer] = {}
        self.requests: list[str] = []
        self.garbage = False
        self.list_garbage = False
        self.list_stalls = False
        self._stalled: list[Request] = []
        self._watchers: list[_Watcher] = []
        self._followers: list[_Follower] = []
        self._serial = 0
        self._port: IListeningPort | None = None

    # --- the socket ----------------------------------------------------------------------

    def listen(self, path: str) -> None:
        """Serve on the UNIX socket ``path``."""
        site = Site(self)
        site.noisy = False
        unix: Any = reactor
        self._port = unix.listenUNIX(path, _EitherFactory(self, site))

    async def close(self) -> None:
        """End every open stream and stop listening."""
        for r in ([w.request for w in self._watchers] + [f.request for f in self._followers]
                  + self._stalled):
            self._finish(r)
        self._watchers.clear()
        self._followers.clear()
        if self._port is not None and (stopped := self._port.stopListening()) is not None:
            await stopped

    @property
    def watching(self) -> int:
        """Open ``/events`` streams."""
        return len(self._watchers)

    @property
    def following(self) -> int:
        """Open ``/containers/{id}/logs?follow=1`` streams."""
        return len(self._followers)

    # --- driving containers --------------------------------------------------------------

    def _new_id(self) -> str:
        self._serial += 1
        return f"{self._serial:06x}" + "aa86eacfb3b3ed4cd362c1e88fc89a53908ad05fb3a4103bca3f9b2829"

    def run(self, name: str, labels: dict[str, str] | None = None, *,
            ports: tuple[int, ...] = (8080,), networks: dict[str, str] | None = None,
            tty: bool = False, emit: bool = True) -> FakeContainer:
        """``docker run -d``: create, then start."""
        c = FakeContainer(self._new_id(), name, dict(labels or {}), ports,
                          dict(networks) if networks is not None else {"bridge": "172.17.0.4"},
                          tty)
        self.containers[c.id] = c
        if emit:
            self._emit(c, "create")
        self.start(c, emit=emit)
        return c

    def start(self, c: FakeContainer, emit: bool = True) -> None:
        c.running, c.started_ns, c.finished_ns = True, time.time_ns(), 0
        if emit:
            self._emit(c, "start")

    def die(self, c: FakeContainer, exit_code: int = 1) -> None:
        """The main process exits on its own."""
        c.running, c.finished_ns, c.exit_code = False, time.time_ns(), exit_code
        self._end_follows(c)
        self._emit(c, "die", {"exitCode": str(exit_code), "execDuration": "1"})

    def stop(self, c: FakeContainer) -> None:
        """``docker stop``: kill (SIGTERM), die, stop."""
        self._emit(c, "kill", {"signal": "15"})
        self.die(c, exit_code=0)
        self._emit(c, "stop")

    def restart(self, c: FakeContainer) -> None:
        """``docker restart``: stopped, started again, then the restart event."""
        self.stop(c)
        self.start(c)
        self._emit(c, "restart")

    def remove(self, c: FakeContainer) -> None:
        """``docker rm`` (of a stopped container)."""
        if c.running:
            self.stop(c)
        del self.containers[c.id]
        self._emit(c, "destroy")

    def recreate(self, c: FakeContainer, labels: dict[str, str]) -> FakeContainer:
        """New labels: labels are fixed at create, so (as compose does) the container is
        removed and a new one runs with the same name and settings."""
        self.remove(c)
        return self.run(c.name, labels, ports=c.ports, networks=c.networks, tty=c.tty)

    def write_log(self, c: FakeContainer, line: str | bytes, stream: int = 1) -> None:
        """The container prints ``line`` (a newline is added) on stdout (1) or stderr (2)."""
        data = (line.encode() if isinstance(line, str) else line) + b"\n"
        c.log.append((stream, data, time.time_ns()))
        for f in list(self._followers):
            if f.container is c and stream in f.streams:
                f.request.write(data if c.tty else frame(stream, data))

    def cut_events(self) -> None:
        """Every open events stream sends half a line, then the connection drops."""
        for w in self._watchers:
            w.request.write(b'{"Type":"container","Act')
            transport = w.request.channel.transport if w.request.channel else None
            if transport is not None:
                transport.loseConnection()
        self._watchers.clear()

    # --- events --------------------------------------------------------------------------

    def _emit(self, c: FakeContainer, action: str, extra: dict[str, str] | None = None) -> None:
        now = time.time_ns()
        attrs = {**c.labels, "image": c.image, "name": c.name, **(extra or {})}
        ev = dict(_EVENT)
        ev.update(Action=action, status=action, id=c.id, **{"from": c.image},
                  Actor={"ID": c.id, "Attributes": dict(sorted(attrs.items()))},
                  time=now // 1_000_000_000, timeNano=now)
        line = json.dumps(dict(sorted(ev.items())), separators=(",", ":")).encode() + b"\n"
        for w in list(self._watchers):
            if self._matches(w.filters, c, action, attrs):
                w.request.write(line)

    @staticmethod
    def _matches(filters: dict[str, list[str]], c: FakeContainer, action: str,
                 attrs: dict[str, str]) -> bool:
        if "type" in filters and "container" not in filters["type"]:
            return False
        if "event" in filters and action not in filters["event"]:
            return False
        return all(_label_match(attrs, want) for want in filters.get("label", []))

    # --- HTTP ----------------------------------------------------------------------------

    def render(self, request: Request) -> bytes | int:
        path = (request.path or b"/").decode("utf-8", "replace")
        self.requests.append(f"{request.method.decode()} {path}")
        request.setHeader(b"Server", f"Docker/{ENGINE_VERSION} (linux)".encode())
        request.setHeader(b"Api-Version", API_VERSION.encode())
        request.setHeader(b"Ostype", b"linux")
        if m := _VERSIONED.fullmatch(path):
            version, path = m[1], m[2]
            if _key(version) > _key(API_VERSION):
                return self._error(request, 400, f"client version {version} is too new. "
                                   f"Maximum supported API version is {API_VERSION}")
            if _key(version) < _key(MIN_API_VERSION):
                return self._error(request, 400, f"client version {version} is too old. "
                                   f"Minimum supported API version is {MIN_API_VERSION}, "
                                   "please upgrade your client to a newer version")
        args = {k.decode(): v[-1].decode() for k, v in request.args.items()}
        if path == "/_ping":
            request.setHeader(b"Cache-Control", b"no-cache, no-store, must-revalidate")
            request.setHeader(b"Pragma", b"no-cache")
            request.setHeader(b"Builder-Version", b"2")
            request.setHeader(b"Swarm", b"inactive")
            request.setHeader(b"Content-Type", b"text/plain; charset=utf-8")
            if request.method == b"HEAD":
                request.setHeader(b"Content-Length", b"0")
                return b""
            return (FIXTURES / "_ping").read_bytes()
        if request.method != b"GET":
            return self._error(request, 404, "page not found")
        if path == "/version":
            return self._json(request, json.loads((FIXTURES / "version").read_bytes()))
        if path == "/containers/json":
            return self._list(request, args)
        if path == "/events":
            return self._events(request, args)
        if m := _CONTAINER.fullmatch(path):
            c = self._find(m[1])
            if c is None:
                return self._error(request, 404, f"No such container: {m[1]}")
            if m[2] == "json":
                return self._json(request, c.inspect())
            return self._logs(request, c, args)
        return self._error(request, 404, "page not found")

    def _find(self, ref: str) -> FakeContainer | None:
        for c in self.containers.values():
            if ref in (c.id, c.name):
                return c
        hits = [c for c in self.containers.values() if c.id.startswith(ref)]
        return hits[0] if len(hits) == 1 else None

    def _list(self, request: Request, args: dict[str, str]) -> bytes | int:
        if self.list_stalls:
            request.setHeader(b"Content-Type", b"application/json")
            request.write(b'[{"Id":"')  # and nothing more
            self._stalled.append(request)
            return NOT_DONE_YET
        if self.list_garbage:
            request.setHeader(b"Content-Type", b"application/json")
            return b"<html>502 Bad Gateway</html>"
        filters = _filters(args)
        everything = args.get("all") in ("1", "true", "True")
        out = []
        for c in self.containers.values():
            status = "running" if c.running else "exited"
            if not everything and not c.running and "status" not in filters:
                continue
            if "status" in filters and status not in filters["status"]:
                continue
            if not all(_label_match(c.labels, want) for want in filters.get("label", [])):
                continue
            if "name" in filters and not any(n in c.name for n in filters["name"]):
                continue
            if "id" in filters and not any(c.id.startswith(i) for i in filters["id"]):
                continue
            out.append(c.summary())
        out.reverse()  # newest first, as the daemon lists
        return self._json(request, out)

    def _events(self, request: Request, args: dict[str, str]) -> int:
        request.setHeader(b"Content-Type", b"application/json")
        request.write(b"")  # the daemon flushes the head at once
        watcher = _Watcher(request, _filters(args))
        self._watchers.append(watcher)
        request.notifyFinish().addBoth(lambda _: self._drop(self._watchers, watcher))
        return NOT_DONE_YET

    def _logs(self, request: Request, c: FakeContainer, args: dict[str, str]) -> bytes | int:
        streams = tuple(s for s, name in ((1, "stdout"), (2, "stderr"))
                        if args.get(name) in ("1", "true", "True"))
        if not streams:
            return self._error(request, 400, "must specify at least one of 'stdout' or 'stderr'")
        since_ns = 0
        if args.get("since"):
            secs, _, frac = args["since"].partition(".")
            since_ns = int(secs) * 1_000_000_000 + int(frac.ljust(9, "0")[:9] or 0)
        media = b"application/vnd.docker.raw-stream" if c.tty else (
            b"application/vnd.docker.multiplexed-stream")
        request.setHeader(b"Content-Type", media)
        request.write(b"")
        lines = [(s, data) for s, data, at in c.log if s in streams and at >= since_ns]
        tail = args.get("tail", "all")
        if tail.isdigit():
            lines = lines[len(lines) - int(tail):] if int(tail) else []
        for s, data in lines:
            request.write(data if c.tty else frame(s, data))
        if args.get("follow") in ("1", "true", "True") and c.running:
            follower = _Follower(request, c, streams)
            self._followers.append(follower)
            request.notifyFinish().addBoth(lambda _: self._drop(self._followers, follower))
            return NOT_DONE_YET
        request.finish()
        return NOT_DONE_YET

    def _end_follows(self, c: FakeContainer) -> None:
        for f in [f for f in self._followers if f.container is c]:
            self._followers.remove(f)
            self._finish(f.request)

    @staticmethod
    def _drop(items: list[Any], item: Any) -> None:
        if item in items:
            items.remove(item)

    @staticmethod
    def _finish(request: Request) -> None:
        if not request.finished and not request._disconnected:
            request.finish()

    @staticmethod
    def _json(request: Request, body: Any) -> bytes:
        request.setHeader(b"Content-Type", b"application/json")
        return json.dumps(body, separators=(",", ":")).encode() + b"\n"

    @staticmethod
    def _error(request: Request, code: int, message: str) -> bytes:
        request.setResponseCode(code)
        request.setHeader(b"Content-Type", b"application/json")
        return json.dumps({"message": message}).encode() + b"\n"


def _filters(args: dict[str, str]) -> dict[str, list[str]]:
    """The ``filters`` query argument: a JSON map of lists (or, from old clients, of maps)."""
    raw = json.loads(args.get("filters") or "{}")
    return {k: list(v) if isinstance(v, list) else [x for x, on in v.items() if on]
            for k, v in raw.items()}


def _label_match(labels: dict[str, str], want: str) -> bool:
    key, eq, value = want.partition("=")
    return key in labels and (not eq or labels[key] == value)


def sockets(base: Path) -> Iterator[str]:
    """Socket paths under ``base`` (kept short: a UNIX socket path has 107 bytes)."""
    n = 0
    while True:
        n += 1
        yield str(base / f"d{n}.sock")
