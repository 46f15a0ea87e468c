"""The live map: ``/live`` draws the fleet on a canvas with a pulse
per request, fed by ``/live/events``, a Server-Sent Events stream of prompt-free lifecycle
events.

Events are small JSON objects with a fixed set of fields (``type`` one of ``EVENT_TYPES``),
strings cut to ``MAX_TEXT`` characters, encoded with ``json.dumps`` (ASCII only), so a model or
key name holding a newline, quotes or ``<script>`` stays inside one ``data:`` line.

Events go out in batches: ``emit`` encodes the event and appends it to the current batch, and
the batch is written to every reader ``flush_interval`` seconds after its first event (0.1 s:
the map's pulses take most of a second) or at once when it passes ``BATCH_BYTES``. One write
per reader per batch instead of one per event (a request makes four or five): the writes were
most of what a connected reader cost per request.

Each reader has a byte bound: while its socket is full (the channel paused us, the push
producer below), batches queue in its own buffer; a batch that would take that past
``max_buffer`` bytes drops the reader instead (its connection aborted), so a slow or stuck
reader never holds more. A reader that disconnects is removed. An idle stream carries a
comment every ``keepalive`` seconds so proxies do not cut it.
"""

from __future__ import annotations

import contextlib
import json
from collections import deque
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.logger import Logger
from twisted.web.server import Request
from twisted.web.template import flattenString, tags
from zope.interface import implementer

from pharos.obs.status import done_fields
from pharos.periodic import Periodic
from pharos.state.state import State

log = Logger()

#: Event types on the stream.
FLEET, ADMITTED, QUEUED, ROUTED, FIRST_BYTE, DONE = (
    "fleet", "admitted", "queued", "routed", "first_byte", "done")
EVENT_TYPES = (FLEET, ADMITTED, QUEUED, ROUTED, FIRST_BYTE, DONE)
#: A reader's own buffer bound, bytes: past it, the reader is dropped.
MAX_BUFFER = 256 * 1024
#: Seconds between keepalive comments.
KEEPALIVE = 15.0
#: Longest string an event carries (model and key names come from clients).
MAX_TEXT = 200
#: Readers at once; one more is refused with 503.
MAX_READERS = 64
#: Events kept for a reader that just connected (the map shows recent traffic at once).
BACKLOG = 20
#: Seconds an event waits for its batch to be written, at most.
FLUSH_INTERVAL = 0.1
#: A batch this big (bytes) is written at once.
BATCH_BYTES = 16 * 1024

_dumps = json.JSONEncoder(ensure_ascii=True, separators=(",", ":")).encode


def _text(v: object) -> str | None:
    return None if v is None else str(v)[:MAX_TEXT]


def _int(v: object) -> int | float | None:
    return v if isinstance(v, int | float) and not isinstance(v, bool) else None


def messages(texts: list[str]) -> bytes:
    """SSE messages, one per event's JSON text: each a single ``data:`` line of ASCII JSON (no
    raw newline can occur; ``<``, ``>`` and ``&`` escaped too, so the stream holds no markup
    even if mis-rendered). The escapes run once over the batch: the framing holds none of the
    three characters."""
    text = "data: " + "\n\ndata: ".join(texts) + "\n\n"
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return text.encode("ascii")


def encode(event: dict[str, Any]) -> bytes:
    """One event as one SSE message (see ``messages``)."""
    return messages([_dumps(event)])


@implementer(IPushProducer)
class Reader:
    """One ``/live/events`` connection: writes while its socket takes them, buffers up to the
    bound while it is paused, and is dropped past it."""

    def __init__(self, live: LiveMap, request: Request, max_buffer: int) -> None:
        self.live = live
        self.request = request
        self.max_buffer = max_buffer
        self.paused = False
        self.pending: deque[bytes] = deque()
        self.pending_bytes = 0
        self.gone = False
        self.done: Deferred[None] = Deferred(lambda _: self.close())

    def send(self, data: bytes) -> None:
        """Write ``data``, or queue it while paused; drop the reader rather than queue past
        its bound."""
        if self.gone:
            return
        if not self.paused:
            self.request.write(data)
            return
        if self.pending_bytes + len(data) > self.max_buffer:
            self.live.dropped += 1
            log.info("live map reader dropped: {n} bytes behind",
                     n=self.pending_bytes + len(data))
            self.abort()
            return
        self.pending.append(data)
        self.pending_bytes += len(data)

    def pauseProducing(self) -> None:
        """The reader's socket is full."""
        self.paused = True

    def resumeProducing(self) -> None:
        """The socket drained: write what queued meanwhile."""
        self.paused = False
        while self.pending and not self.paused and not self.gone:
            data = self.pending.popleft()
            self.pending_bytes -= len(data)
            self.request.write(data)

    def stopProducing(self) -> None:
        """The connection closed."""
        self.close()

    def abort(self) -> None:
        """Cut the connection now (a stuck reader never drains a graceful close)."""
        transport = getattr(self.request.channel, "transport", None)
        self.close()
        if transport is not None:
            abort = getattr(transport, "abortConnection", None)
            (abort or transport.loseConnection)()

    def close(self) -> None:
        """Forget the reader: no more writes, buffer freed, its route's Deferred fired."""
        if self.gone:
            return
        self.gone = True
        self.pending.clear()
        self.pending_bytes = 0
        self.live.readers.discard(self)
        if self.request.channel is not None:
            with contextlib.suppress(AttributeError, RuntimeError):
                self.request.unregisterProducer()
        if not self.done.called:
            self.done.callback(None)


class LiveMap(Service):
    """The events and their readers: ``on_done`` subscribes to the proxy's finished requests,
    and the map is the proxy's ``Watch`` for the earlier steps. A service: stopping it
    closes the readers and its timer."""

    def __init__(self, state: State, clock: IReactorTime, *, max_buffer: int = MAX_BUFFER,
                 keepalive: float = KEEPALIVE, max_readers: int = MAX_READERS,
                 flush_interval: float = FLUSH_INTERVAL) -> None:
        self.state = state
        self.clock = clock
        self.max_buffer = max_buffer
        self.keepalive = keepalive
        self.max_readers = max_readers
        self.flush_interval = flush_interval
        self.readers: set[Reader] = set()
        #: The last events written (JSON texts), for the next reader's backlog.
        self.recent: deque[str] = deque(maxlen=BACKLOG)
        self.dropped = 0
        self.sent = 0
        #: The keepalive beat, running while there are readers.
        self._beat = Periodic(clock, keepalive, self._tick, what="live map keepalive")
        self._fleet_sent: bytes = b""
        self._batch: list[str] = []
        self._batch_bytes = 0
        self._flush_timer: IDelayedCall | None = None

    # --- the fleet -----------------------------------------------------------------------

    def fleet(self) -> dict[str, Any]:
        """The topology: each backend with its kind, state and models."""
        now = self.clock.seconds()
        backends = []
        for b in self.state.backends.values():
            models = [_text(t.model) for t in self.state.targets if t.backend is b]
            backends.append({"url": _text(b.url), "kind": _text(b.kind),
                             "up": self.state.is_up(b, now), "models": models[:64]})
        return {"type": FLEET, "backends": backends[:64]}

    # --- events in -----------------------------------------------------------------------

    def on_done(self, record: Any) -> None:
        """An ``on_done`` subscriber: one ``done`` event per finished request (kept for the
        next reader's backlog only while someone watches: the map costs nothing unwatched)."""
        if not self.readers:
            return
        try:
            r = done_fields(record)
            self.emit({"type": DONE, "key": _text(r["key"]), "model": _text(r["model"]),
                       "target": _text(r["target"]),
                       "target_model": _text(r["target_model"]), "status": _int(r["status"]),
                       "outcome": _text(r["outcome"]), "reason": _text(r["reason"]),
                       "prompt_tokens": _int(r["prompt_tokens"]),
                       "cached_tokens": _int(r["cached_tokens"]),
                       "completion_tokens": _int(r["completion_tokens"]),
                       "ttft_ms": _int(r["ttft_ms"]), "duration_ms": _int(r["duration_ms"])})
        except Exception:  # the proxy's request never fails for the map
            log.failure("live map: done event failed")

    @property
    def watching(self) -> bool:
        """Someone reads the map: the proxy's events are worth sending."""
        return bool(self.readers)

    def admitted(self, key: object, model: object) -> None:
        """A request passed auth and admission and asks the scheduler for a slot."""
        self.emit({"type": ADMITTED, "key": _text(key), "model": _text(model)})

    def queued(self, key: object, model: object) -> None:
        """A request waits in the fair queue."""
        self.emit({"type": QUEUED, "key": _text(key), "model": _text(model)})

    def routed(self, key: object, target: Any, reason: object) -> None:
        """A request got a lease on ``target`` (a ``Target``) for ``reason``."""
        self.emit({"type": ROUTED, "key": _text(key), "target": _text(target.backend.url),
                   "model": _text(target.model), "reason": _text(reason)})

    def first_byte(self, target: Any, reason: object) -> None:
        """The engine's reply started (its headers go to the client)."""
        self.emit({"type": FIRST_BYTE, "target": _text(target.backend.url),
                   "model": _text(target.model), "reason": _text(reason)})

    def emit(self, event: dict[str, Any]) -> None:
        """Send one event to every reader, with the next batch."""
        text = _dumps(event)
        self._batch.append(text)
        self._batch_bytes += len(text)
        self.sent += 1
        if self._batch_bytes >= BATCH_BYTES:
            self.flush()
        elif self._flush_timer is None:
            self._flush_timer = self.clock.callLater(self.flush_interval, self.flush)

    def flush(self) -> None:
        """Write the batch to every reader (one write each) and keep it for the backlog."""
        if self._flush_timer is not None:
            if self._flush_timer.active():
                self._flush_timer.cancel()
            self._flush_timer = None
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        if not batch:
            return
        self.recent.extend(batch)
        if self.readers:
            data = messages(batch)
            for reader in list(self.readers):
                reader.send(data)

    # --- readers -------------------------------------------------------------------------

    def add(self, request: Request) -> Deferred[None] | bytes:
        """Serve ``request`` as an event stream; the Deferred fires when the reader goes (the
        route returns it, and Klein cancels it when the client leaves)."""
        if len(self.readers) >= self.max_readers:
            request.setResponseCode(503)
            request.setHeader(b"content-type", b"application/json")
            return b'{"error":"too many live map readers"}'
        request.setHeader(b"content-type", b"text/event-stream; charset=utf-8")
        request.setHeader(b"cache-control", b"no-cache")
        request.setHeader(b"x-accel-buffering", b"no")
        reader = Reader(self, request, self.max_buffer)
        request.registerProducer(reader, True)
        self.readers.add(reader)
        request.notifyFinish().addBoth(lambda _: reader.close())
        fleet = encode(self.fleet())
        backlog = messages(list(self.recent)) if self.recent else b""
        reader.send(b"retry: 3000\n\n" + fleet + backlog)
        if not self._beat.running:
            self._beat.interval = self.keepalive  # as it is now (tests shorten it)
            self._beat.startService()
        return reader.done

    def _tick(self) -> None:
        """Keepalive comment, and the fleet again when it changed; the last one once the
        readers have gone."""
        self.flush()
        fleet = encode(self.fleet())
        beat = b": keepalive\n\n" + (fleet if fleet != self._fleet_sent else b"")
        self._fleet_sent = fleet
        for reader in list(self.readers):
            reader.send(beat)
        if not self.readers:
            self._beat.stopService()

    def stopService(self) -> Deferred[None] | None:
        """Close every reader and the keepalive timer."""
        super().stopService()
        if self._beat.running:
            self._beat.stopService()
        if self._flush_timer is not None and self._flush_timer.active():
            self._flush_timer.cancel()
        self._flush_timer = None
        self._batch, self._batch_bytes = [], 0
        for reader in list(self.readers):
            reader.abort()
        return None

    # --- the page ------------------------------------------------------------------------

    def page(self) -> Deferred[bytes]:
        """``/live``: the canvas, a legend of the backends (server-rendered, escaped) and the
        inline script that draws the pulses."""
        fleet = self.fleet()
        legend = tags.ul(*(tags.li(tags.code(b["url"]), f" ({b['kind'] or 'unknown'}): ",
                                   ", ".join(m or "" for m in b["models"]),
                                   class_="backend", **{"data-backend": b["url"] or ""})
                           for b in fleet["backends"]), id="backends")
        doc = tags.html(
            tags.head(tags.meta(charset="utf-8"), tags.title("Pharos live map"),
                      tags.style(_CSS)),
            tags.body(
                tags.h1("Pharos live map"),
                tags.p("events: ", tags.span("0", id="events"), " · requests: ",
                       tags.span("0", id="requests"), " · errors: ",
                       tags.span("0", id="errors"), " · stream: ",
                       tags.span("connecting", id="stream")),
                tags.canvas(id="map", width="1100", height="560"),
                legend,
                tags.h3("last events"),
                tags.ol(id="log"),
                tags.script(src=SCRIPT_PATH)))
        d = flattenString(None, doc)
        return d.addCallback(lambda body: b"<!DOCTYPE html>\n" + body)


_CSS = """
body{font:13px/1.4 system-ui,sans-serif;margin:1em;background:#0f1520;color:#dde}
canvas{background:#151d2b;border:1px solid #334;display:block}
code{color:#9cf}#log{font:12px monospace;max-height:14em;overflow:hidden}
"""

#: Where the page's script is served (an inline script would be HTML-escaped by the template).
SCRIPT_PATH = "/live/map.js"

# Untrusted strings reach the DOM only through textContent and the canvas through fillText.
SCRIPT = r"""
(function(){
var cv=document.getElementById('map'),cx=cv.getContext('2d');
var fleet={backends:[]},pos={},pulses=[],flash={},n=0,reqs=0,errs=0;
function layout(){pos={};var bs=fleet.backends,H=cv.height,W=cv.width;
 pos['pharos']={x:90,y:H/2};
 var rows=0;bs.forEach(function(b){rows+=Math.max(1,b.models.length);});
 var step=H/Math.max(1,rows),y=0;
 bs.forEach(function(b){var k=Math.max(1,b.models.length);
  pos['b:'+b.url]={x:W*0.45,y:y+step*k/2,b:b};
  b.models.forEach(function(m,i){pos['m:'+b.url+'#'+m]={x:W*0.8,y:y+step*(i+0.5),m:m};});
  y+=step*k;});}
function node(p,r,c,label){cx.beginPath();cx.arc(p.x,p.y,r,0,7);cx.fillStyle=c;cx.fill();
 cx.fillStyle='#dde';cx.font='12px sans-serif';cx.fillText(label,p.x+r+4,p.y+4);}
function line(a,b){cx.beginPath();cx.moveTo(a.x,a.y);cx.lineTo(b.x,b.y);
 cx.strokeStyle='#2a3a55';cx.stroke();}
function draw(t){cx.clearRect(0,0,cv.width,cv.height);var ph=pos['pharos'];
 fleet.backends.forEach(function(b){var bp=pos['b:'+b.url];line(ph,bp);
  b.models.forEach(function(m){line(bp,pos['m:'+b.url+'#'+m]);});});
 node(ph,18,'#f5b942','Pharos');
 fleet.backends.forEach(function(b){var bp=pos['b:'+b.url];
  node(bp,12,b.up?'#4caf7a':'#c04848',b.url+' ('+(b.kind||'unknown')+')');
  b.models.forEach(function(m){var k='m:'+b.url+'#'+m,f=flash[k];
   node(pos[k],8,f&&t-f.t<600?f.c:'#5b8bd6',m);});});
 pulses=pulses.filter(function(p){var u=(t-p.t0)/900;if(u>1)return false;
  var a,b,v;if(u<0.5){a=ph;b=pos['b:'+p.b];v=u*2;}else{a=pos['b:'+p.b];b=pos[p.k]||a;v=u*2-1;}
  if(!a||!b)return false;cx.beginPath();cx.arc(a.x+(b.x-a.x)*v,a.y+(b.y-a.y)*v,5,0,7);
  cx.fillStyle=p.c;cx.fill();return true;});
 requestAnimationFrame(draw);}
function logline(e){var li=document.createElement('li');
 li.textContent=e.type+' '+(e.key||'')+' '+(e.model||'')+' '+(e.target||'')+' '+
  (e.reason||'')+(e.status!=null?' '+e.status:'')+
  (e.completion_tokens!=null?' tokens '+e.prompt_tokens+'/'+e.completion_tokens:'');
 var ol=document.getElementById('log');ol.insertBefore(li,ol.firstChild);
 while(ol.children.length>20)ol.removeChild(ol.lastChild);}
function legend(){var ul=document.getElementById('backends');ul.textContent='';
 fleet.backends.forEach(function(b){var li=document.createElement('li');li.className='backend';
  li.setAttribute('data-backend',b.url);li.textContent=b.url+' ('+(b.kind||'unknown')+'): '+
  b.models.join(', ');ul.appendChild(li);});}
var es=new EventSource('/live/events');
es.onopen=function(){document.getElementById('stream').textContent='open';};
es.onerror=function(){document.getElementById('stream').textContent='reconnecting';};
es.onmessage=function(m){var e;try{e=JSON.parse(m.data);}catch(x){return;}
 if(e.type==='fleet'){fleet=e;layout();legend();return;}
 n++;document.getElementById('events').textContent=n;logline(e);
 var k='m:'+e.target+'#'+(e.target_model||e.model);
 if(e.type==='routed'){pulses.push({t0:performance.now(),b:e.target,k:k,c:'#ffd86b'});}
 if(e.type==='done'){reqs++;document.getElementById('requests').textContent=reqs;
  var bad=e.status==null||e.status>=400;if(bad){errs++;
  document.getElementById('errors').textContent=errs;}
  if(e.target)flash[k]={t:performance.now(),c:bad?'#ff5a5a':'#7dffa8'};}};
layout();requestAnimationFrame(draw);
})();
"""
