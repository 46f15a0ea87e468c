# -*- test-case-name: tests.unit.test_docker_labels,tests.component.test_docker_discovery -*-
"""Docker label discovery and container log feeds over the Engine API.

A few HTTP calls on the daemon's UNIX socket through Twisted's Agent (no Docker SDK): the API
version is negotiated as the docker CLI does (``/_ping``'s ``Api-Version``); ``/events`` is
watched and the running containers labelled ``pharos.enable=true`` are listed after every
event (one list in flight, one more if events came during it); each becomes a ``Backend``
whose log feed is ``docker://<id>``. Log streams arrive as 8-byte-header frames (stdcopy)
or, for a TTY container, raw; ``DockerLogFeed`` strips the frames.

Bodies are bounded, a stream that stops speaking the protocol is dropped and reconnected with
backoff, and each problem is logged once (when it starts), not once per retry.
"""

from __future__ import annotations

import calendar
import json
import math
import os
import re
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from twisted.application.service import Service
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.endpoints import UNIXClientEndpoint
from twisted.internet.interfaces import IReactorTime, IReactorUNIX, IStreamClientEndpoint
from twisted.internet.protocol import Protocol
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool, ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory, IResponse
from zope.interface import implementer

from pharos.config import BACKEND_KINDS, Backend, BackendKind, LogFeed, backend_url
from pharos.discovery.feed import MAX_LINE_BYTES, LineSplitter, OnLine

log = Logger()

#: Where the daemon listens when ``DOCKER_HOST`` is unset.
DEFAULT_SOCKET: Final = "/var/run/docker.sock"
#: The newest Engine API version Pharos speaks (its fixtures' version); a daemon that offers
#: less is spoken to at its own version, as the docker CLI does.
API_VERSION: Final = "1.50"
#: The labels Pharos reads; any other ``pharos.*`` label is a typo and refused.
ENABLE = "pharos.enable"
LABELS: Final = ("pharos.enable", "pharos.url", "pharos.port", "pharos.kind",
                 "pharos.memory_gb", "pharos.capacity")
#: Containers Pharos lists: labelled, running (a paused one serves nothing).
LIST_FILTERS: Final = {"label": [f"{ENABLE}=true"], "status": ["running"]}
#: Events that can change that list (health checks' exec_* events would re-list for nothing).
EVENT_FILTERS: Final = {
    "type": ["container"],
    "label": [f"{ENABLE}=true"],
    "event": ["start", "restart", "die", "stop", "kill", "destroy", "pause", "unpause",
              "rename", "update"],
}
#: A JSON answer larger than this is refused (1,000 labelled containers are ~2 MB).
MAX_JSON_BYTES: Final = 32 * 1024 * 1024
#: One event is a few hundred bytes; a longer line is not the events stream.
MAX_EVENT_BYTES: Final = 1024 * 1024
#: Seconds a request may take to its response head.
REQUEST_TIMEOUT: Final = 10.0
#: Reconnect backoff for the events stream: 1 s doubling to 30 s.
BACKOFF_FIRST: Final = 1.0
BACKOFF_MAX: Final = 30.0
#: A daemon error carried in the log stream (stdcopy's Systemerr) is kept up to this length.
MAX_SYSTEMERR: Final = 4096

_STDIN, _STDOUT, _STDERR, _SYSTEMERR = 0, 1, 2, 3
_RFC3339 = re.compile(
    r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")
_VERSION = re.compile(r"[0-9]+\.[0-9]+")


class DockerError(Exception):
    """The socket answered, but not as the Engine API does (or with an API error)."""


def socket_from_env(environ: Mapping[str, str], default: str = DEFAULT_SOCKET,
                    exists: Callable[[str], bool] = os.path.exists) -> tuple[str | None, str]:
    """The daemon's socket path, and why (or why not) for the log line: only
    ``DOCKER_HOST=unix://PATH`` is watched; unset, ``default`` when it exists."""
    host = environ.get("DOCKER_HOST", "")
    if host:
        if host.startswith("unix://") and len(host) > len("unix://"):
            return host[len("unix://"):], f"DOCKER_HOST={host}"
        return None, f"DOCKER_HOST={host} is not a unix:// socket; Docker discovery reads " \
                     "only the local socket"
    if exists(default):
        return default, default
    return None, f"no DOCKER_HOST and no {default}"


def negotiate(server: str | None) -> str:
    """The version to speak: the daemon's ``Api-Version`` if older than ours, else ours."""
    if server is None or not _VERSION.fullmatch(server):
        raise DockerError(f"/_ping answered without an API version ({server!r}): not a "
                          "Docker Engine API socket")

    def key(v: str) -> tuple[int, int]:
        major, minor = v.split(".")
        return int(major), int(minor)

    return server if key(server) < key(API_VERSION) else API_VERSION


def unix_timestamp(rfc3339: object) -> str | None:
    """``State.StartedAt`` (RFC 3339 with nanoseconds) as the ``seconds.nanoseconds`` the
    logs endpoint's ``since`` takes; ``None`` for Go's zero time or anything else."""
    if not isinstance(rfc3339, str) or not (m := _RFC3339.fullmatch(rfc3339)):
        return None
    try:
        secs = calendar.timegm(time.strptime(m[1], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
    if m[3] != "Z":
        sign = 1 if m[3][0] == "+" else -1
        secs -= sign * (int(m[3][1:3]) * 3600 + int(m[3][4:6]) * 60)
    if secs <= 0:
        return None
    return f"{secs}.{(m[2] or '').ljust(9, '0')}"


@implementer(IAgentEndpointFactory)
class _UNIXEndpoints:
    """Every request goes to the one socket, whatever host the URL names."""

    def __init__(self, reactor: IReactorUNIX, path: str, timeout: float) -> None:
        self.reactor = reactor
        self.path = path
        self.timeout = timeout

    def endpointForURI(self, uri: Any) -> IStreamClientEndpoint:
        return UNIXClientEndpoint(self.reactor, self.path, timeout=int(self.timeout))


class _Body(Protocol):
    """A response body handed to ``on_data`` as it arrives; ``done`` fires at its end.
    ``on_data`` raising fails ``done``; cancelling ``done`` stops the body
    (``stopProducing``: a body's transport has no abort)."""

    def __init__(self, on_data: Callable[[bytes], None]) -> None:
        self.on_data = on_data
        self.done: Deferred[None] = Deferred(self._cancel)
        self._stopped = False

    def dataReceived(self, data: bytes) -> None:
        if self._stopped:
            return
        try:
            self.on_data(data)
        except Exception:
            failure = Failure()
            self._stop()
            if not self.done.called:
                self.done.errback(failure)

    def connectionLost(self, reason: Failure = ResponseDone) -> None:  # type: ignore[assignment]
        if self.done.called:
            return
        if reason.check(ResponseDone, PotentialDataLoss):
            self.done.callback(None)
        else:
            self.done.errback(reason)

    def _stop(self) -> None:
        self._stopped = True
        stop = getattr(self.transport, "stopProducing", None)  # TransportProxyProducer
        if stop is not None:
            stop()

    def _cancel(self, _: Deferred[None]) -> None:
        self._stop()


class DockerAPI:
    """The Engine API on one UNIX socket: requests under the negotiated version, bounded
    JSON answers, streamed bodies. Nothing here keeps a connection between requests."""

    def __init__(self, reactor: IReactorTime, path: str, timeout: float = REQUEST_TIMEOUT) -> None:
        self.reactor = self.clock = reactor
        self.path = path
        self.timeout = timeout
        self.agent = Agent.usingEndpointFactory(
            reactor, _UNIXEndpoints(IReactorUNIX(reactor), path, timeout),
            pool=HTTPConnectionPool(reactor, persistent=False))
        #: The negotiated API version; ``None`` until the first ``ping``.
        self.version: str | None = None

    def describe(self) -> str:
        return f"unix://{self.path}"

    # --- requests ------------------------------------------------------------------------

    def _request(self, path: str, query: Mapping[str, str] | None = None,
                 method: bytes = b"GET") -> Deferred[IResponse]:
        url = "http://docker" + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        d = self.agent.request(method, url.encode("ascii"),
                               Headers({b"User-Agent": [b"pharos"]}))
        d.addTimeout(self.timeout, self.clock)
        return d

    async def ping(self) -> str:
        """``GET /_ping``; sets and returns the negotiated version."""
        response = await self._request("/_ping")
        body = await self._read(response, 1024)
        if response.code != 200 or body.strip() != b"OK":
            raise DockerError(f"/_ping answered {response.code} {body[:80]!r}, not OK")
        raw = response.headers.getRawHeaders(b"api-version")
        self.version = negotiate(raw[0].decode("ascii", "replace") if raw else None)
        return self.version

    async def get(self, path: str, query: Mapping[str, str] | None = None) -> IResponse:
        """``GET /v<version><path>``; an answer other than 200 is a ``DockerError`` carrying
        the daemon's message."""
        if self.version is None:
            await self.ping()
        response = await self._request(f"/v{self.version}{path}", query)
        if response.code != 200:
            body = await self._read(response, 64 * 1024)
            try:
                message = json.loads(body)["message"]
            except (ValueError, TypeError, KeyError):
                message = body[:200].decode("utf-8", "replace")
            raise DockerError(f"{path} answered {response.code}: {message}")
        return response

    async def get_json(self, path: str, query: Mapping[str, str] | None = None) -> Any:
        """A JSON answer, at most ``MAX_JSON_BYTES``."""
        response = await self.get(path, query)
        body = await self._read(response, MAX_JSON_BYTES)
        try:
            return json.loads(body)
        except ValueError:
            raise DockerError(f"{path} answered {len(body)} bytes that are not JSON") from None

    async def _read(self, response: IResponse, limit: int) -> bytes:
        chunks = bytearray()

        def take(data: bytes) -> None:
            chunks.extend(data)
            if len(chunks) > limit:
                raise DockerError(f"an answer larger than {limit} bytes")

        # A body that stalls halfway is as dead as one that never starts.
        await self.stream(response, take).addTimeout(self.timeout, self.clock)
        return bytes(chunks)

    def stream(self, response: IResponse, on_data: Callable[[bytes], None]) -> Deferred[None]:
        """Hand the body to ``on_data`` as it arrives; the Deferred fires at its end and
        cancelling it stops the body."""
        body = _Body(on_data)
        response.deliverBody(body)
        return body.done

    # --- endpoints Pharos uses ------------------------------------------------------------

    async def containers(self, filters: Mapping[str, Sequence[str]]) -> list[Any]:
        """``/containers/json`` with ``filters``: the summaries, unchecked beyond a list."""
        answer = await self.get_json("/containers/json", {"filters": json.dumps(filters)})
        if not isinstance(answer, list):
            raise DockerError(f"/containers/json answered {type(answer).__name__}, not a list")
        return answer

    async def inspect(self, container: str) -> Mapping[str, Any]:
        """``/containers/{id}/json``."""
        answer = await self.get_json(f"/containers/{urllib.parse.quote(container)}/json")
        if not isinstance(answer, dict):
            raise DockerError(f"/containers/{container}/json answered "
                              f"{type(answer).__name__}, not an object")
        return answer

    def log_feed(self, container: str) -> DockerLogFeed:
        """The log feed of ``container`` (an id or a name): ``feed_for``'s Docker factory."""
        return DockerLogFeed(self, container)


# --- log streams ----------------------------------------------------------------------------


class Demux:
    """stdcopy's multiplexed stream (moby api/pkg/stdcopy): frames of ``[stream, 0, 0, 0,
    size (4 bytes, big-endian)]`` then ``size`` bytes. Stdin and stdout frames go to
    ``out``, stderr to ``err`` (each keeps its own partial line); a Systemerr frame is the
    daemon's error and ends the stream."""

    def __init__(self, out: Callable[[bytes], None], err: Callable[[bytes], None]) -> None:
        self._sinks = {_STDIN: out, _STDOUT: out, _STDERR: err}
        self._head = bytearray()
        self._stream = _STDOUT
        self._left = 0
        self._systemerr = bytearray()

    def feed(self, data: bytes) -> None:
        """Take the next bytes; raises ``DockerError`` on a frame that is not stdcopy's."""
        i, n = 0, len(data)
        while i < n:
            if self._left:
                take = min(self._left, n - i)
                part = data[i:i + take]
                i += take
                self._left -= take
                if self._stream == _SYSTEMERR:
                    self._systemerr += part[:MAX_SYSTEMERR - len(self._systemerr)]
                    if not self._left:
                        self._fail_systemerr()
                else:
                    self._sinks[self._stream](part)
                continue
            take = min(8 - len(self._head), n - i)
            self._head += data[i:i + take]
            i += take
            if len(self._head) < 8:
                return
            stream, pad, size = self._head[0], bytes(self._head[1:4]), self._head[4:8]
            self._head.clear()
            if stream > _SYSTEMERR or pad != b"\0\0\0":
                raise DockerError("the log stream is not multiplexed as stdcopy writes it")
            self._stream, self._left = stream, int.from_bytes(size, "big")
            if stream == _SYSTEMERR and not self._left:
                self._fail_systemerr()

    def _fail_systemerr(self) -> None:
        text = self._systemerr.decode("utf-8", "replace").strip()
        raise DockerError(f"the daemon ended the log stream: {text or 'no reason given'}")


MEDIA_MULTIPLEXED: Final = b"application/vnd.docker.multiplexed-stream"
MEDIA_RAW: Final = b"application/vnd.docker.raw-stream"


class DockerLogFeed:
    """A container's log stream as a ``LogFeed``, followed ``since=<State.StartedAt>``: a
    reconnect reads the start-up lines again (Ollama prints its ``OLLAMA_NUM_PARALLEL``
    once) and a restarted container is read from its new start."""

    def __init__(self, api: DockerAPI, container: str, started_at: str | None = None,
                 tty: bool | None = None, max_line: int = MAX_LINE_BYTES,
                 follow: bool = True) -> None:
        self.api = api
        #: False: the log as it is now, ending at its last line (doctor reads it so).
        self.follow = follow
        self.container = container
        self.started_at = started_at
        self.tty = tty
        self.max_line = max_line
        #: Lines dropped for length, over every connection.
        self.too_long = 0

    def describe(self) -> str:
        return f"docker://{self.container} on {self.api.describe()}"

    def connect(self, on_line: OnLine) -> Deferred[None]:
        return Deferred.fromCoroutine(self._follow(on_line))

    async def _follow(self, on_line: OnLine) -> None:
        started_at, tty = self.started_at, self.tty
        if started_at is None or tty is None:
            info = await self.api.inspect(self.container)
            state, config = info.get("State"), info.get("Config")
            if started_at is None:
                started_at = state.get("StartedAt") if isinstance(state, dict) else None
            if tty is None:
                tty = bool(config.get("Tty")) if isinstance(config, dict) else False
        query = {"follow": "1" if self.follow else "0", "stdout": "1", "stderr": "1"}
        if (since := unix_timestamp(started_at)) is not None:
            query["since"] = since
        path = f"/containers/{urllib.parse.quote(self.container)}/logs"
        response = await self.api.get(path, query)
        media = (response.headers.getRawHeaders(b"content-type") or [b""])[0].split(b";")[0]
        if media == MEDIA_MULTIPLEXED:
            tty = False
        elif media == MEDIA_RAW:
            tty = True
        out, err = LineSplitter(on_line, self.max_line), LineSplitter(on_line, self.max_line)
        try:
            if tty:
                await self.api.stream(response, out.feed)
            else:
                await self.api.stream(response, Demux(out.feed, err.feed).feed)
        finally:
            self.too_long += out.too_long + err.too_long


# --- labels -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Container:
    """What Pharos reads of one ``/containers/json`` entry."""

    id: str
    name: str
    labels: Mapping[str, str]
    tcp_ports: tuple[int, ...]
    #: (network name, IPv4 address, global IPv6 address), networks in name order.
    networks: tuple[tuple[str, str, str], ...]


def container_of(summary: object) -> Container | str:
    """A ``ContainerSummary`` read defensively: a field of the wrong shape is a reason."""
    if not isinstance(summary, dict):
        return "not a JSON object"
    cid = summary.get("Id")
    if not isinstance(cid, str) or not re.fullmatch(r"[0-9a-fA-F]{12,64}", cid):
        return f"no container id ({str(cid)[:80]!r})"
    names = summary.get("Names")
    name = (names[0].lstrip("/") if isinstance(names, list) and names
            and isinstance(names[0], str) else cid[:12])
    labels = summary.get("Labels") or {}
    if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        return "Labels is not a map of strings"
    ports: set[int] = set()
    for port in summary.get("Ports") or []:
        if isinstance(port, dict) and port.get("Type") == "tcp" and isinstance(
                port.get("PrivatePort"), int):
            ports.add(port["PrivatePort"])
    networks: list[tuple[str, str, str]] = []
    settings = summary.get("NetworkSettings")
    nets = settings.get("Networks") if isinstance(settings, dict) else None
    if isinstance(nets, dict):
        for net_name in sorted(k for k in nets if isinstance(k, str)):
            ep = nets[net_name] if isinstance(nets[net_name], dict) else {}
            v4, v6 = ep.get("IPAddress"), ep.get("GlobalIPv6Address")
            networks.append((net_name, v4 if isinstance(v4, str) else "",
                             v6 if isinstance(v6, str) else ""))
    return Container(cid, name, labels, tuple(sorted(ports)), tuple(networks))


def backend_of(c: Container) -> Backend | str:
    """The backend a labelled container makes (its labels), or why it makes none."""
    labels = c.labels
    unknown = sorted(k for k in labels if k.startswith("pharos.") and k not in LABELS)
    if unknown:
        return f"unknown label {unknown[0]!r} (known: {', '.join(LABELS)})"
    kind_text = labels.get("pharos.kind", "auto")
    kinds: dict[str, BackendKind] = {k: k for k in BACKEND_KINDS}
    if (kind := kinds.get(kind_text)) is None:
        return f"pharos.kind {kind_text!r} is not one of {', '.join(BACKEND_KINDS)}"
    memory_gb = None
    if "pharos.memory_gb" in labels:
        try:
            memory_gb = float(labels["pharos.memory_gb"])
        except ValueError:
            memory_gb = None
        if memory_gb is None or not math.isfinite(memory_gb) or memory_gb <= 0:
            return f"pharos.memory_gb {labels['pharos.memory_gb']!r} is not a positive number"
    capacity = None
    if "pharos.capacity" in labels:
        text = labels["pharos.capacity"]
        if not text.isascii() or not text.isdigit() or int(text) < 1:
            return f"pharos.capacity {text!r} is not a positive integer"
        capacity = int(text)
    if "pharos.url" in labels:
        if "pharos.port" in labels:
            return "pharos.url and pharos.port both set (the URL names the port)"
        url = backend_url(labels["pharos.url"])
        if url is None:
            return f"pharos.url {labels['pharos.url']!r} is not an absolute http(s) URL"
    else:
        if "pharos.port" in labels:
            text = labels["pharos.port"]
            if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= 65535:
                return f"pharos.port {text!r} is not a port from 1 to 65535"
            port = int(text)
        elif len(c.tcp_ports) == 1:
            port = c.tcp_ports[0]
        elif not c.tcp_ports:
            return "it exposes no TCP port; set pharos.port or pharos.url"
        else:
            shown = ", ".join(str(p) for p in c.tcp_ports[:8])
            return f"it exposes several TCP ports ({shown}); set pharos.port"
        if not c.networks:
            return "it is on no network; set pharos.url"
        net, v4, v6 = c.networks[0]
        if not v4 and not v6:
            return f"its first network {net!r} gives it no IP address; set pharos.url"
        url = f"http://{v4}:{port}" if v4 else f"http://[{v6}]:{port}"
    return Backend(url=url, kind=kind, memory_gb=memory_gb, capacity=capacity,
                   logs=LogFeed("docker", c.id))


# --- the watcher ----------------------------------------------------------------------------


class DockerDiscovery(Service):
    """Keeps ``backends`` the labelled running containers', told to ``on_change``. A silent
    socket, a broken events stream or a failed list keeps the last set and retries with
    backoff (logged once)."""

    def __init__(self, api: DockerAPI, clock: IReactorTime,
                 on_change: Callable[[], None] = lambda: None) -> None:
        self.api = api
        self.clock = clock
        self.on_change = on_change
        self.backends: tuple[Backend, ...] = ()
        #: ``None`` before the first answer, then whether the events stream is open.
        self.connected: bool | None = None
        #: Lists done (each answered and applied).
        self.lists = 0
        self._loop: Deferred[None] | None = None
        self._stream: Deferred[None] | None = None
        self._listing: Deferred[None] | None = None
        self._dirty = False
        self._broken: Exception | None = None
        self._problem: str | None = None
        #: Container id → the reason it makes no backend, as last logged.
        self._refused: dict[str, str] = {}

    # --- service ------------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        self._loop = Deferred.fromCoroutine(self._run())
        self._loop.addErrback(lambda f: f.trap(CancelledError))

    def stopService(self) -> Deferred[None] | None:
        super().stopService()
        for d in (self._listing, self._loop):
            if d is not None:
                d.cancel()
        self._loop = None
        return None

    # --- the loop -----------------------------------------------------------------------

    async def _run(self) -> None:
        delay = BACKOFF_FIRST
        while self.running:
            lists_before = self.lists
            try:
                await self._session()
                why = "the events stream ended"
            except CancelledError:
                if self._broken is None:
                    raise
                why = _why(self._broken)
            except Exception as e:
                why = _why(e)
            self._broken = None
            self._stream = None
            if self.lists > lists_before:
                delay = BACKOFF_FIRST  # it worked for a while: start the backoff over
            self._lost(why, delay)
            await deferLater(self.clock, delay, lambda: None)
            delay = min(delay * 2, BACKOFF_MAX)

    async def _session(self) -> None:
        version = await self.api.ping()
        response = await self.api.get("/events", {"filters": json.dumps(EVENT_FILTERS)})
        lines = LineSplitter(self._event, MAX_EVENT_BYTES)

        def take(data: bytes) -> None:
            lines.feed(data)
            if lines.too_long:
                raise DockerError(f"an events line longer than {MAX_EVENT_BYTES} bytes")

        first = self._listing = Deferred.fromCoroutine(self._list())
        self._stream = self.api.stream(response, take)
        try:
            await first
            if self.connected is not True:
                log.info("Docker discovery on: {socket} (Engine API {version}), {n} labelled "
                         "container(s) as backends", socket=self.api.describe(),
                         version=version, n=len(self.backends))
            self.connected, self._problem = True, None
            await self._stream
        finally:
            if self._stream is not None and not self._stream.called:
                self._stream.cancel()

    def _event(self, line: bytes) -> None:
        """One event line: anything that is not a JSON object breaks the stream."""
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if not isinstance(event, dict):
            raise DockerError(f"an events line that is not a JSON object ({len(line)} bytes)")
        self._relist()

    def _relist(self) -> None:
        """List again: now, or after the list in flight (coalescing a burst of events)."""
        if self._listing is not None:
            self._dirty = True
            return
        self._listing = Deferred.fromCoroutine(self._list())
        self._listing.addErrback(self._list_failed)

    def _list_failed(self, failure: Failure) -> None:
        if failure.check(CancelledError):
            return
        self._broken = failure.value if isinstance(failure.value, Exception) else None
        if self._stream is not None and not self._stream.called:
            self._stream.cancel()  # the loop logs it and reconnects with backoff

    async def _list(self) -> None:
        try:
            while True:
                self._dirty = False
                summaries = await self.api.containers(LIST_FILTERS)
                self._apply(summaries)
                if not self._dirty:
                    return
        finally:
            self._listing = None

    def _apply(self, summaries: list[Any]) -> None:
        """Turn one list into the backend set; refusals logged once per container."""
        self.lists += 1
        made: dict[str, tuple[str, Backend]] = {}
        refused: dict[str, str] = {}
        for summary in summaries:
            c = container_of(summary)
            if isinstance(c, str):
                key, name, why = f"#{len(refused)}", "?", c
            else:
                if c.labels.get(ENABLE) != "true":
                    continue
                b = backend_of(c)
                if isinstance(b, Backend):
                    if b.url not in made:
                        made[b.url] = (c.name, b)
                        continue
                    b_why = f"its URL {b.url} is {made[b.url][0]}'s too"
                else:
                    b_why = b
                key, name, why = c.id, c.name, b_why
            refused[key] = why
            if self._refused.get(key) != why:
                log.warn("Docker container {name} left out: {why}", name=name, why=why)
        self._refused = refused
        backends = tuple(b for _, b in sorted(made.values(), key=lambda nb: nb[0]))
        if backends != self.backends:
            self.backends = backends
            self.on_change()

    def _lost(self, why: str, delay: float) -> None:
        """Log a problem once: when it starts, not on every retry."""
        if self.connected is None:
            if self._problem is None:
                log.warn("Docker discovery off: {socket} does not answer ({why}); only the "
                         "static backends are used, trying again with backoff",
                         socket=self.api.describe(), why=why)
        elif self.connected:
            log.warn("Docker discovery: lost {socket} ({why}); the last {n} container "
                     "backend(s) stay, reconnecting in {delay:.0f} s",
                     socket=self.api.describe(), why=why, n=len(self.backends), delay=delay)
            self.connected = False
        self._problem = why


def _why(e: BaseException) -> str:
    """A short reason for a log line (never a body's content beyond a daemon message)."""
    text = str(e) or type(e).__name__
    if hasattr(e, "reasons") and e.reasons:  # ResponseFailed and friends wrap the cause
        inner = e.reasons[0]
        text = f"{type(e).__name__}: {inner.getErrorMessage()}"
    return text[:300]
