"""In-process engine doubles: an Ollama, llama.cpp, vLLM or llama-swap look-alike on a loopback
port.

A double is a wire format (a ``Flavor``, cloned from the engine's pinned capture) in front of
a behaviour model (an ``EngineModel``). The twisted.web resource here only moves bytes: it
turns a request into a ``GenRequest``, writes each token as the model produces it (a streaming
push producer, so a slow reader pauses the writes instead of filling the socket buffer), and
cancels the job when the client leaves, freeing its slot as a real engine does.

Controls for tests: ``hold()``/``release()``, ``kill()`` (an engine dying mid-reply),
``when(predicate)`` (fires once the state satisfies it), and ``stats`` / ``jobs``.
"""

from __future__ import annotations

import dataclasses
import random
import site
import sys
import sysconfig
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import (
    IListeningPort,
    IPushProducer,
    IReactorTCP,
    IReactorTime,
)
from twisted.logger import Logger
from twisted.protocols.policies import WrappingFactory
from twisted.python.failure import Failure
from twisted.web import http
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site
from zope.interface import implementer

from pharos.engine.capture import Capture, Recorded
from pharos.engine.library import LLAMACPP, LLAMASWAP, OLLAMA, VLLM
from pharos.sim.batch import VLLM_KNOBS, BatchModel
from pharos.sim.llamacpp import LlamacppFlavor
from pharos.sim.llamaswap import LlamaswapFlavor
from pharos.sim.manage import OllamaManagement, blob_request_class, is_manage
from pharos.sim.model import (
    DEFAULT_SLOTS,
    LOAD,
    UNLOAD,
    EngineModel,
    GenRequest,
    Job,
    Knobs,
    ModelTooLarge,
    PromptTooLong,
    UnknownModel,
)
from pharos.sim.ollama import KEEP_ALIVE_S, OllamaFlavor
from pharos.sim.prompt import (
    GENERATION_ROUTES,
    BadRequest,
    ReplyKey,
    is_control,
    keep_alive,
    max_tokens,
    parse_body,
    prompt_text,
    reply_key,
)
from pharos.sim.slots import EVICT_LRU, EVICT_OLLAMA, SlotModel
from pharos.sim.vllm import VllmFlavor
from pharos.sim.wire import Flavor, Numbers, ReplyContext, ReplyTemplate

log = Logger()

def _fixtures() -> Path:
    """fixtures/ of a source checkout, else ``<data>/share/pharos/fixtures`` as the wheel
    installs it: ``<data>`` is the install scheme's, not ``sys.prefix`` under Debian's own
    Python (/usr/local) nor for ``pip install --user``."""
    checkout = Path(__file__).resolve().parents[2] / "fixtures"
    if checkout.is_dir():
        return checkout
    found = [Path(data) / "share" / "pharos" / "fixtures"
             for data in (sysconfig.get_path("data"), sys.prefix, site.USER_BASE or "/")]
    return next((p for p in found if p.is_dir()), found[0])


FIXTURES = _fixtures()

#: The capture each double is cloned from: kind → (engine/version, state). The busy state of
#: llama.cpp lends only the shape of a processing slot in /slots.
PINNED: Mapping[str, tuple[str, str]] = {
    OLLAMA: ("ollama/0.32.15", "loaded"),
    LLAMACPP: ("llamacpp/b11312", "idle"),
    VLLM: ("vllm/0.32.0", "idle"),
    LLAMASWAP: ("llama-swap/v250", "loaded"),
}
_LLAMACPP_BUSY = "busy"

KINDS: tuple[str, ...] = tuple(PINNED)

#: How many past requests a double remembers (``jobs``, ``stats.prompt_tokens``).
HISTORY = 10_000


@cache
def _load(directory: Path) -> Capture:
    return Capture.load(directory)


def pinned_capture(kind: str, fixtures: Path | None = None, state: str | None = None) -> Capture:
    """The capture the double of ``kind`` is cloned from (read once per process)."""
    if kind not in PINNED:
        raise ValueError(f"no engine double for kind {kind!r} (have: {', '.join(KINDS)})")
    version_dir, pinned_state = PINNED[kind]
    directory = (fixtures or FIXTURES) / version_dir / (state or pinned_state)
    if not (directory / "paths.tsv").exists():
        raise FileNotFoundError(f"{directory}: the pinned capture of the {kind} double is "
                                "missing (run from a source checkout, or pass fixtures=)")
    return _load(directory.resolve())


@dataclass(slots=True)
class DoubleStats:
    """What a double saw: generation requests started, completed and cancelled, control
    requests, recorded refusals served, and the prompt tokens of the last ``HISTORY`` started
    requests in arrival order (``EngineDouble.jobs`` has the rest)."""

    started: int = 0
    completed: int = 0
    cancelled: int = 0
    controls: int = 0
    refused: int = 0
    prompt_tokens: deque[int] = field(default_factory=lambda: deque(maxlen=HISTORY))

    @property
    def active(self) -> int:
        """Requests started and not yet over."""
        return self.started - self.completed - self.cancelled


class EngineDouble:
    """One simulated engine: a twisted.web resource, its behaviour model and test controls.

    ``kind``: ``ollama``, ``llamacpp``, ``vllm`` or ``llama-swap`` (one model at a time unless
    ``host_memory`` holds more; replies are llama.cpp's). ``clock``: the model's time.
    ``models``: name → size in bytes (default: the capture's catalogue). ``slots``: parallel
    requests per model (``OLLAMA_NUM_PARALLEL``, ``--parallel``, ``--max-num-seqs``).
    ``loaded``: models in memory at start (default: none for Ollama and llama-swap, the one
    model otherwise). ``knobs`` and any ``Knobs`` field as a keyword set the latency model
    (Ollama's ``keep_alive`` is its 5 minutes and vLLM's unset fields ``VLLM_KNOBS`` unless
    ``knobs`` is given). ``seed``: the ids' random source. ``engine_model`` replaces the
    behaviour model (the wire format stays).
    """

    def __init__(
        self,
        kind: str,
        clock: IReactorTime,
        *,
        models: Mapping[str, int] | None = None,
        slots: int = DEFAULT_SLOTS,
        loaded: tuple[str, ...] | list[str] | None = None,
        knobs: Knobs | None = None,
        fixtures: Path | None = None,
        seed: int = 0,
        engine_model: EngineModel | None = None,
        **knob_values: Any,
    ) -> None:
        self.kind = kind
        self.clock = clock
        self.rng = random.Random(seed)
        capture = pinned_capture(kind, fixtures)
        self.flavor: Flavor = self._flavor(kind, capture, models, fixtures)
        if kind == OLLAMA and "keep_alive" not in knob_values and knobs is None:
            knob_values["keep_alive"] = KEEP_ALIVE_S
        if kind == VLLM and knobs is None:
            knob_values = {**VLLM_KNOBS, **knob_values}
        if kind == LLAMASWAP and knobs is None and "host_memory" not in knob_values:
            # llama-swap's default group: one model at a time.
            knob_values["host_memory"] = max(self.flavor.catalogue().values())
        base = knobs or Knobs()
        self.knobs = dataclasses.replace(base, **knob_values) if knob_values else base
        catalogue = self.flavor.catalogue()
        if loaded is None:
            loaded = () if kind in (OLLAMA, LLAMASWAP) else tuple(catalogue)
        self.slots = slots
        self.model: EngineModel = engine_model or default_model(
            kind, clock, catalogue, slots, self.knobs, tuple(loaded))
        self.stats = DoubleStats()
        #: The last ``HISTORY`` generation jobs, in arrival order (prompt text dropped once over).
        self.jobs: deque[Job] = deque(maxlen=HISTORY)
        self.url = ""
        self._replies: set[_Reply] = set()
        self._factories: list[WrappingFactory] = []
        self._waiters: list[tuple[Callable[[], bool], Deferred[None]]] = []
        self.hung = False
        self._unanswered: list[Request] = []  # requests that came while hung
        self.resource = _DoubleResource(self)
        #: Ollama's model management (``pharos.sim.manage``).
        self.manage = (OllamaManagement(self.flavor, clock)  # type: ignore[arg-type]
                       if kind == OLLAMA else None)

    def _flavor(self, kind: str, capture: Capture, models: Mapping[str, int] | None,
                fixtures: Path | None) -> Flavor:
        now = self.clock.seconds
        if kind == OLLAMA:
            return OllamaFlavor(capture, now, self.rng, models)
        if kind == LLAMACPP:
            busy = pinned_capture(kind, fixtures, _LLAMACPP_BUSY)
            return LlamacppFlavor(capture, now, self.rng, models, busy)
        if kind == LLAMASWAP:
            return LlamaswapFlavor(capture, now, self.rng, models,
                                   pinned_capture(LLAMACPP, fixtures))
        return VllmFlavor(capture, now, self.rng, models)

    # -- serving --

    def factory(self, reactor: IReactorTime | None = None) -> WrappingFactory:
        """A protocol factory serving this double: a ``Site`` (``reactor``: the one that runs
        its connections), wrapped so that ``kill`` can find every connection."""
        site = _QuietSite(self.resource, reactor=reactor)
        if self.manage is not None:  # blob uploads hashed as they arrive, never kept
            site.requestFactory = blob_request_class(site.reactor, self.manage)
        wrapped = WrappingFactory(site)
        self._factories.append(wrapped)
        return wrapped

    @property
    def loads(self) -> int:
        """Model loads the double's engine has started (0 for one that never loads)."""
        return int(getattr(self.model, "loads", 0))

    def log_lines(self) -> list[bytes] | None:
        """The engine's log as the double would have written it (Ollama), else ``None``."""
        return self.flavor.log_lines(self.slots)

    # -- test controls --

    def hold(self) -> None:
        """Requests keep their slots and make no progress until ``release``."""
        self.model.hold()

    def release(self) -> None:
        """Let held requests go on where they stopped."""
        self.model.release()

    def kill(self) -> None:
        """Drop every connection at once, replies cut mid-way (an engine dying). Requests in
        flight are cancelled in the model first, so the slots are free when this returns; the
        connections close on the reactor's next turn."""
        for reply in list(self._replies):
            reply.cut()
        for factory in self._factories:
            for proto in list(factory.protocols):
                if proto.transport is not None:
                    proto.transport.abortConnection()
        self._changed()

    def hang(self) -> None:
        """Answer nothing from now on, requests in flight included (an engine process that
        was stopped: connections still open, no byte comes back) until ``unhang``."""
        self.hung = True
        self.model.hold()

    def unhang(self) -> None:
        """Answer again; requests that came while hung stay unanswered."""
        self.hung = False
        self.model.release()

    def when(self, predicate: Callable[[], bool]) -> Deferred[None]:
        """Fires once ``predicate()`` holds, checked after every request event."""
        waiter: tuple[Callable[[], bool], Deferred[None]]

        def cancel(_: Deferred[None]) -> None:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

        d: Deferred[None] = Deferred(cancel)
        waiter = (predicate, d)
        if predicate():
            d.callback(None)
        else:
            self._waiters.append(waiter)
        return d

    def stop(self) -> None:
        """Cancel the model's timers and forget the waiters (the double is going away)."""
        self.model.stop()
        waiters, self._waiters = self._waiters, []
        for _, d in waiters:
            d.cancel()

    @property
    def running(self) -> int:
        """Requests holding a slot now."""
        return self.model.status().running

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot or a model load now."""
        return self.model.status().waiting

    def _changed(self) -> None:
        for waiter in list(self._waiters):
            predicate, d = waiter
            if waiter in self._waiters and predicate():
                self._waiters.remove(waiter)
                d.callback(None)

    # -- requests --

    def _get(self, request: Request) -> bytes:
        path = request.path.decode("latin-1")
        return _answer(request, self.flavor.get(path, self.model.status()))

    def _post(self, request: Request) -> bytes | int:
        path = request.path.decode("latin-1")
        book = self.flavor.book
        refusal = book.refusals.get(path)
        if refusal is not None:
            self.stats.refused += 1
            return _answer(request, refusal)
        if path not in GENERATION_ROUTES or path not in book.routes:
            return _answer(request, self.flavor.not_found)
        try:
            assert request.content is not None
            doc = parse_body(request.content.read())
            key = reply_key(path, doc)
            control = is_control(path, doc)
            if control:
                key = ReplyKey(path, False, False)
            template = book.find(key)
            if template is None:
                return _answer(request, self.flavor.error(
                    501, f"the pinned capture recorded no reply of this shape ({key})", path))
            requested = doc.get("model")
            model = self.flavor.served_model(requested if isinstance(requested, str) else None)
            if model is None:
                return _answer(request, self.flavor.error(
                    404, f"model {requested!r} not found", path))
            alive = keep_alive(doc) if self.kind == OLLAMA else None
            if control:
                gen = GenRequest(model, control=UNLOAD if alive == 0 else LOAD,
                                 keep_alive=alive)
            else:
                gen = GenRequest(model, prompt_text(path, doc), max_tokens(path, doc),
                                 keep_alive=alive)
        except BadRequest as e:
            return _answer(request, self.flavor.error(400, str(e), path))
        name = requested if isinstance(requested, str) and requested else model
        reply = _Reply(self, request, template, self.flavor.context(name, template), control)
        try:
            job = self.model.submit(gen, reply)
        except UnknownModel:
            return _answer(request, self.flavor.error(404, f"model {model!r} not found", path))
        except PromptTooLong as e:
            return _answer(request, self.flavor.error(400, str(e), path))
        except ModelTooLarge as e:
            return _answer(request, self.flavor.error(500, str(e), path))
        reply.start(job)
        if control:
            self.stats.controls += 1
        else:
            self.jobs.append(job)
            self.stats.started += 1
            self.stats.prompt_tokens.append(job.prompt_tokens)
        self._changed()
        return NOT_DONE_YET


def _answer(request: Request, rec: Recorded) -> bytes:
    """Send a recorded (or rebuilt) answer: its status, content type and body."""
    request.setResponseCode(rec.status)
    request.defaultContentType = None
    request.responseHeaders.removeHeader(b"content-type")
    if rec.content_type:
        request.setHeader(b"content-type", rec.content_type.encode("latin-1"))
    return rec.body


@implementer(IPushProducer)
class _Reply:
    """One reply in flight: the job's listener and the request's producer."""

    def __init__(self, double: EngineDouble, request: Request, template: ReplyTemplate,
                 ctx: ReplyContext, control: bool) -> None:
        self._double = double
        self._request = request
        self._template = template
        self._ctx = ctx
        self._control = control
        self._job: Job | None = None
        self._pieces: list[str] = []
        self._pending: list[bytes] = []
        self._paused = False
        self._closing = False
        self._over = False

    def start(self, job: Job) -> None:
        """The model took the job: send the headers' status and type, watch the client."""
        self._job = job
        self._double._replies.add(self)
        request = self._request
        request.setResponseCode(self._template.status)
        request.defaultContentType = None
        request.responseHeaders.removeHeader(b"content-type")
        if self._template.content_type:
            request.setHeader(b"content-type", self._template.content_type.encode("latin-1"))
        if self._template.streamed and not self._control:
            request.registerProducer(self, True)
        request.notifyFinish().addErrback(self._client_gone)

    # -- JobListener --

    def token(self, job: Job, index: int, text: str, last: bool) -> None:
        """Write one token's event (a non-streamed reply collects the text)."""
        if self._over:
            return
        if self._template.streamed:
            head = self._template.opening(self._ctx) if index == 0 else b""
            self._write(head + self._template.token(self._ctx, index, text, last,
                                                    job.finish_reason or "stop"))
        else:
            self._pieces.append(text)
        self._double._changed()

    def done(self, job: Job) -> None:
        """Write the end (finish, usage, ``[DONE]``) or the whole body, and finish."""
        if self._over:
            return
        t = self._template
        if self._control:
            data = t.control(self._ctx, job.control_reason or LOAD)
        elif t.streamed:
            data = t.closing(self._ctx, Numbers.of(job, self._double.clock.seconds()))
        else:
            data = t.body(self._ctx, "".join(self._pieces),
                          Numbers.of(job, self._double.clock.seconds()))
        if not t.streamed or self._control:
            self._request.setHeader(b"content-length", str(len(data)).encode())
        self._write(data)
        self._closing = True
        self._flush()

    # -- IPushProducer --

    def pauseProducing(self) -> None:
        """The client's socket is full: keep the next events here."""
        self._paused = True

    def resumeProducing(self) -> None:
        """The client reads again: send what waited."""
        self._paused = False
        self._flush()

    def stopProducing(self) -> None:
        """The connection is going away."""
        self._client_gone(None)

    # -- internals --

    def cut(self) -> None:
        """``kill``: stop without an end and drop the connection."""
        self._abandon(count=True)
        channel = self._request.channel
        transport = getattr(channel, "transport", None)
        if transport is not None:
            transport.abortConnection()

    def _write(self, data: bytes) -> None:
        if self._paused or self._pending:
            self._pending.append(data)
        else:
            self._request.write(data)

    def _flush(self) -> None:
        while self._pending and not self._paused and not self._over:
            self._request.write(self._pending.pop(0))
        if self._closing and not self._pending and not self._over:
            self._over = True
            self._double._replies.discard(self)
            if not self._control:
                self._double.stats.completed += 1
            request = self._request
            if request.channel is not None:
                if self._template.streamed and not self._control:
                    request.unregisterProducer()
                request.finish()
            self._double._changed()

    def _client_gone(self, reason: Failure | None) -> None:
        self._abandon(count=True)

    def _abandon(self, count: bool) -> None:
        if self._over:
            return
        self._over = True
        self._pending.clear()
        self._double._replies.discard(self)
        if self._job is not None:
            self._double.model.cancel(self._job)
        if count and not self._control:
            self._double.stats.cancelled += 1
        self._double._changed()


class _DoubleResource(Resource):
    """Every path of the engine: GET answers from the status bodies, POST runs requests."""

    isLeaf = True

    def __init__(self, double: EngineDouble) -> None:
        super().__init__()
        self._double = double

    def render(self, request: Request) -> bytes | int:
        """GET and HEAD read, POST generates; any other method is the engine's 404. A hung
        double answers nothing."""
        if self._double.hung:
            self._double._unanswered.append(request)
            return NOT_DONE_YET
        manage = self._double.manage
        if manage is not None and is_manage(request.path):
            return manage.render(request)
        if request.method in (b"GET", b"HEAD", b"POST"):
            result: bytes | int = super().render(request)
            return result
        return _answer(request, self._double.flavor.not_found)

    def render_GET(self, request: Request) -> bytes:
        """A status body."""
        return self._double._get(request)

    def render_POST(self, request: Request) -> bytes | int:
        """A generation request, a recorded refusal, or a 404."""
        return self._double._post(request)


class _QuietSite(Site):
    """No access log: a simulated fleet would fill the demo's log with it."""

    def log(self, request: http.Request) -> None:
        """Nothing."""


def default_model(kind: str, clock: IReactorTime, catalogue: Mapping[str, int], slots: int,
                  knobs: Knobs, loaded: tuple[str, ...]) -> EngineModel:
    """The behaviour model a double of ``kind`` runs unless given one."""
    if kind == VLLM:
        return BatchModel(clock, catalogue, slots=slots, knobs=knobs, loaded=loaded)
    if kind == LLAMACPP:
        return SlotModel(clock, catalogue, slots=slots, knobs=knobs, loaded=loaded)
    return SlotModel(clock, catalogue, slots=slots, knobs=knobs, loaded=loaded,
                     in_order=kind == LLAMASWAP, evict=EVICT_OLLAMA if kind == OLLAMA
                     else EVICT_LRU)


def start_double(
    kind: str,
    reactor: IReactorTCP,
    port: int = 0,
    interface: str = "127.0.0.1",
    clock: IReactorTime | None = None,
    **model_args: Any,
) -> tuple[EngineDouble, IListeningPort]:
    """Start a double of ``kind`` listening on ``interface:port`` (0: any free port).

    ``clock`` defaults to ``reactor`` (then also an ``IReactorTime``); ``model_args`` go to
    ``EngineDouble``. The caller stops both: ``double.stop()``, ``listening.stopListening()``.
    """
    time = clock if clock is not None else reactor
    if not IReactorTime.providedBy(time):
        raise TypeError("start_double needs a clock: pass clock= or a reactor with callLater")
    double = EngineDouble(kind, time, **model_args)
    site_clock = reactor if IReactorTime.providedBy(reactor) else None
    factory = double.factory(site_clock)
    listening = reactor.listenTCP(port, factory, interface=interface)  # type: ignore[arg-type]
    host = listening.getHost()
    number = getattr(host, "port", port)
    shown = f"[{interface}]" if ":" in interface else interface
    double.url = f"http://{shown}:{number}"
    log.info("{kind} double on {url}", kind=kind, url=double.url)
    return double, listening
