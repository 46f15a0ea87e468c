"""How a double speaks: every body is a recorded body with the double's numbers put in.

A ``Flavor`` (one per engine) loads its pinned capture once. Status bodies are the recorded
ones re-serialized in the engine's own style with the double's values; paths it does not own
are served byte for byte. ``ReplyBook`` keys each recorded reply in ``streams/`` by the request
shape that produced it (route, streamed, usage chunk) as a ``ReplyTemplate``: the events
before the first token, the token events and those after; a double's reply keeps that framing,
keys and order with its own tokens, counts, ids and times. A recorded refusal is served as is.
"""

from __future__ import annotations

import copy
import json
import random
import re
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from pharos.engine.capture import Capture, Recorded, RecordedReply
from pharos.sim.model import EngineStatus, Job
from pharos.sim.prompt import GENERATION_ROUTES, NATIVE_ROUTES, ReplyKey, parse_body, reply_key

Dumps = Callable[[Any], str]
Event = Any  # a JSON object, or the raw payload of an SSE event such as "[DONE]"


# --- serializers -----------------------------------------------------------------------------


def compact_json(obj: Any) -> str:
    """Compact JSON, non-ASCII as is, keys in insertion order (nlohmann's and pydantic's
    ``dump``: llama.cpp's server and vLLM)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


_GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
               "\u2029": "\\u2029"}
_GO_SPECIAL = re.compile("[<>&\u2028\u2029]")


def go_json(obj: Any) -> str:
    """Go's ``encoding/json``: compact, non-ASCII as is, ``<``, ``>``, ``&``, U+2028, U+2029 escaped
    (Ollama); they only occur inside strings, so escaping the output is exact."""
    return _GO_SPECIAL.sub(lambda m: _GO_ESCAPES[m.group()], compact_json(obj))


# --- framing ---------------------------------------------------------------------------------

SSE = "sse"
NDJSON = "ndjson"
JSON = "json"


@dataclass(frozen=True, slots=True)
class Framing:
    """How a reply's events sit in its body: each payload between ``prefix`` and ``end``."""

    kind: str
    prefix: bytes = b""
    end: bytes = b""

    def frame(self, payload: str) -> bytes:
        """One framed event."""
        return self.prefix + payload.encode("utf-8", "surrogatepass") + self.end


def split_events(body: bytes, content_type: str) -> tuple[Framing, list[Event]]:
    """A recorded reply body as its framing and its events (JSON objects, or raw payloads)."""
    if "event-stream" in content_type:
        parts = body.split(b"\n\n")
        if parts and parts[-1] == b"":
            parts.pop()
        events: list[Event] = []
        for part in parts:
            if not part.startswith(b"data: "):
                raise ValueError(f"an SSE event that is not one data line: {part[:40]!r}")
            events.append(_payload(part[len(b"data: "):]))
        return Framing(SSE, b"data: ", b"\n\n"), events
    if "ndjson" in content_type:
        lines = [ln for ln in body.split(b"\n") if ln]
        return Framing(NDJSON, b"", b"\n"), [json.loads(ln) for ln in lines]
    end = b"\n" if body.endswith(b"\n") else b""
    return Framing(JSON, b"", end), [json.loads(body)]


def _payload(raw: bytes) -> Event:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8")


# --- structure -------------------------------------------------------------------------------


def shape_of(value: Any) -> Any:
    """The structure of a JSON value without its values: key order, nesting, kinds (numbers
    are one kind, null its own). A list's shape is the distinct shapes of its items in order,
    so a 12-token and a 3-token list look alike."""
    if isinstance(value, dict):
        return ("object", tuple((k, shape_of(v)) for k, v in value.items()))
    if isinstance(value, list):
        seen: list[Any] = []
        for item in value:
            s = shape_of(item)
            if s not in seen:
                seen.append(s)
        return ("list", tuple(seen))
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return "string"


# --- what goes into a reply ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Numbers:
    """A finished job's counts and times, as the reply's usage, timings and metrics show."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str
    load_s: float
    prefill_s: float
    decode_s: float
    total_s: float

    @classmethod
    def of(cls, job: Job, now: float) -> Numbers:
        """The numbers of ``job`` (finished, or cut at ``now``)."""
        return cls(
            prompt_tokens=job.prompt_tokens,
            cached_tokens=job.cached_tokens,
            completion_tokens=job.tokens_done,
            finish_reason=job.finish_reason or "stop",
            load_s=job.load_seconds,
            prefill_s=job.prefill_seconds,
            decode_s=job.decode_seconds,
            total_s=(job.finished_at if job.finished_at is not None else now) - job.queued_at,
        )


@dataclass(frozen=True, slots=True)
class ReplyContext:
    """One reply's identity: its id, ``created`` second, model name and clock."""

    id: str
    created: int
    model: str
    stamp: Callable[[], str]


def like_id(recorded: str, rng: random.Random) -> str:
    """A new id in the style of ``recorded``: same prefix, same kind of suffix."""
    head, sep, tail = recorded.rpartition("-")
    if not sep:
        head, tail = "", recorded
    if tail.isdigit():
        new = str(rng.randrange(999))  # Ollama: chatcmpl-<rand.Intn(999)>
    elif re.fullmatch(r"[0-9a-f]+", tail):
        new = "".join(rng.choice("0123456789abcdef") for _ in tail)
    else:
        new = "".join(rng.choice(string.ascii_letters + string.digits) for _ in tail)
    return head + sep + new


def rfc3339nano(t: float, offset: timedelta | None = None) -> str:
    """Go's ``time.RFC3339Nano``: nanoseconds with trailing zeros trimmed, ``Z`` for UTC."""
    total = round(t * 1e9)
    secs, ns = divmod(total, 10**9)
    tz = UTC if not offset else timezone(offset)
    dt = datetime.fromtimestamp(secs, tz)
    frac = f".{ns:09d}".rstrip("0") if ns else ""
    if not offset:
        zone = "Z"
    else:
        minutes = int(offset.total_seconds() // 60)
        sign = "-" if minutes < 0 else "+"
        zone = f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + frac + zone


def zone_of(stamp: str) -> timedelta | None:
    """The UTC offset of an RFC 3339 time stamp (``None`` for ``Z``)."""
    m = re.search(r"([+-])(\d\d):(\d\d)$", stamp)
    if not m:
        return None
    delta = timedelta(hours=int(m.group(2)), minutes=int(m.group(3)))
    return -delta if m.group(1) == "-" else delta


def _text_slot(ev: Any) -> tuple[dict[str, Any], str] | None:
    """Where an event holds generated text: (the object, its key)."""
    if not isinstance(ev, dict):
        return None
    choices = ev.get("choices")
    if isinstance(choices, list):
        if not choices or not isinstance(choices[0], dict):
            return None
        c = choices[0]
        for holder in ("delta", "message"):
            if isinstance(c.get(holder), dict):
                return c[holder], "content"
        return (c, "text") if "text" in c else None
    if isinstance(ev.get("message"), dict):
        return ev["message"], "content"
    return (ev, "response") if "response" in ev else None


def is_token_event(ev: Any) -> bool:
    """Whether a stream event carries one generated token: Ollama's native lines before ``done``;
    OpenAI-style chunks with a text string, unless empty and opening (role chunk) or closing (finish
    chunk) the stream: vLLM sends an empty text for a token ending in a UTF-8 sequence."""
    if not isinstance(ev, dict):
        return False
    if "done" in ev:
        return ev["done"] is False
    slot = _text_slot(ev)
    if slot is None:
        return False
    holder, key = slot
    text = holder.get(key)
    if not isinstance(text, str):
        return False
    finish = ev["choices"][0].get("finish_reason") if "choices" in ev else None
    return text != "" or (finish is None and "role" not in holder)


def _fill_ids(ev: dict[str, Any], ctx: ReplyContext) -> None:
    if isinstance(ev.get("id"), str):
        ev["id"] = ctx.id
    if isinstance(ev.get("created"), int) and not isinstance(ev.get("created"), bool):
        ev["created"] = ctx.created
    if isinstance(ev.get("model"), str):
        ev["model"] = ctx.model
    if isinstance(ev.get("created_at"), str):
        ev["created_at"] = ctx.stamp()


def _set_text(ev: dict[str, Any], text: str) -> None:
    slot = _text_slot(ev)
    if slot is not None:
        holder, key = slot
        holder[key] = text


def _set_finish(ev: dict[str, Any], reason: str) -> None:
    for c in ev.get("choices") or ():
        if isinstance(c, dict) and c.get("finish_reason") is not None:
            c["finish_reason"] = reason
    if ev.get("done_reason") is not None:
        ev["done_reason"] = reason


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else 0.0


def _fill_numbers(ev: dict[str, Any], n: Numbers) -> None:
    usage = ev.get("usage")
    if isinstance(usage, dict):
        _put(usage, "prompt_tokens", n.prompt_tokens)
        _put(usage, "completion_tokens", n.completion_tokens)
        _put(usage, "total_tokens", n.prompt_tokens + n.completion_tokens)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            _put(details, "cached_tokens", n.cached_tokens)
    timings = ev.get("timings")
    if isinstance(timings, dict):  # llama.cpp
        computed = n.prompt_tokens - n.cached_tokens
        prompt_ms = n.prefill_s * 1000
        predicted_ms = n.decode_s * 1000
        _put(timings, "cache_n", n.cached_tokens)
        _put(timings, "prompt_n", computed)
        _put(timings, "prompt_ms", prompt_ms)
        _put(timings, "prompt_per_token_ms", prompt_ms / computed if computed else 0.0)
        _put(timings, "prompt_per_second", _rate(computed, n.prefill_s))
        _put(timings, "predicted_n", n.completion_tokens)
        _put(timings, "predicted_ms", predicted_ms)
        _put(timings, "predicted_per_token_ms",
             predicted_ms / n.completion_tokens if n.completion_tokens else 0.0)
        _put(timings, "predicted_per_second", _rate(n.completion_tokens, n.decode_s))
    # Ollama's native metrics, integer nanoseconds; prompt_eval_count counts cached tokens too.
    _put(ev, "total_duration", round(n.total_s * 1e9))
    _put(ev, "load_duration", round(n.load_s * 1e9))
    _put(ev, "prompt_eval_count", n.prompt_tokens)
    _put(ev, "prompt_eval_duration", round(n.prefill_s * 1e9))
    _put(ev, "eval_count", n.completion_tokens)
    _put(ev, "eval_duration", round(n.decode_s * 1e9))
    if isinstance(ev.get("context"), list):  # /api/generate: the conversation's token ids
        ev["context"] = [(i * 7919) % 128000 for i in range(n.prompt_tokens
                                                            + n.completion_tokens)]


def _put(obj: dict[str, Any], key: str, value: int | float) -> None:
    """Replace ``key`` when the recorded object has it with a value (never add one)."""
    old = obj.get(key)
    if old is None or isinstance(old, bool):
        return
    if isinstance(old, int) and isinstance(value, float) and value.is_integer():
        value = int(value)
    obj[key] = value


# --- reply templates -------------------------------------------------------------------------


class ReplyTemplate:
    """One recorded reply, ready to be re-spoken with other tokens and numbers."""

    def __init__(
        self,
        name: str,
        status: int,
        content_type: str,
        framing: Framing,
        events: Sequence[Event],
        dumps: Dumps,
    ) -> None:
        self.name = name
        self.status = status
        self.content_type = content_type
        self.framing = framing
        self.events = tuple(events)
        self.dumps = dumps
        self.recorded_id = next(
            (e["id"] for e in self.events if isinstance(e, dict) and isinstance(e.get("id"), str)),
            None,
        )
        if framing.kind == JSON:
            self.prefix: tuple[Event, ...] = ()
            self.tokens: tuple[Event, ...] = ()
            self.suffix: tuple[Event, ...] = ()
            return
        marks = [i for i, e in enumerate(self.events) if is_token_event(e)]
        if not marks:
            raise ValueError(f"{name}: a stream without token events")
        if marks != list(range(marks[0], marks[-1] + 1)):
            raise ValueError(f"{name}: token events are not contiguous")
        self.prefix = self.events[: marks[0]]
        self.tokens = self.events[marks[0] : marks[-1] + 1]
        self.suffix = self.events[marks[-1] + 1 :]
        self._middle = self.tokens[len(self.tokens) // 2]
        self._first_special = shape_of(self.tokens[0]) != shape_of(self._middle)
        self._last_special = shape_of(self.tokens[-1]) != shape_of(self._middle)

    @classmethod
    def from_recorded(cls, r: RecordedReply, dumps: Dumps) -> ReplyTemplate:
        """A template from one recorded reply."""
        framing, events = split_events(r.body, r.content_type)
        return cls(r.name, r.status, r.content_type, framing, events, dumps)

    @property
    def streamed(self) -> bool:
        """Whether the reply is a stream of events."""
        return self.framing.kind != JSON

    def opening(self, ctx: ReplyContext) -> bytes:
        """The events before the first token (a role chunk), sent with the first token."""
        out = []
        for ev in self.prefix:
            ev = copy.deepcopy(ev)
            if isinstance(ev, dict):
                _fill_ids(ev, ctx)
            out.append(self._frame(ev))
        return b"".join(out)

    def token(self, ctx: ReplyContext, index: int, text: str, last: bool,
              finish_reason: str) -> bytes:
        """The event of token ``index``."""
        if last and self._last_special:
            ev = copy.deepcopy(self.tokens[-1])
            _set_finish(ev, finish_reason)
        elif index == 0 and self._first_special:
            ev = copy.deepcopy(self.tokens[0])
        else:
            ev = copy.deepcopy(self._middle)
        _fill_ids(ev, ctx)
        _set_text(ev, text)
        return self._frame(ev)

    def closing(self, ctx: ReplyContext, numbers: Numbers) -> bytes:
        """The events after the last token: finish, usage, timings, ``[DONE]``."""
        out = []
        for ev in self.suffix:
            ev = copy.deepcopy(ev)
            if isinstance(ev, dict):
                _fill_ids(ev, ctx)
                _set_finish(ev, numbers.finish_reason)
                _fill_numbers(ev, numbers)
            out.append(self._frame(ev))
        return b"".join(out)

    def body(self, ctx: ReplyContext, text: str, numbers: Numbers) -> bytes:
        """A whole non-streamed reply."""
        assert not self.streamed
        ev = copy.deepcopy(self.events[0])
        _fill_ids(ev, ctx)
        _set_text(ev, text)
        _set_finish(ev, numbers.finish_reason)
        _fill_numbers(ev, numbers)
        return self._frame(ev)

    def control(self, ctx: ReplyContext, reason: str) -> bytes:
        """Ollama's answer to a load or unload request: the final line's fields up to
        ``done_reason`` (no metrics), as one JSON object."""
        final = next(e for e in reversed(self.events) if isinstance(e, dict) and "done" in e)
        ev: dict[str, Any] = {}
        for k, v in final.items():
            ev[k] = copy.deepcopy(v)
            if k == "done_reason":
                break
        _fill_ids(ev, ctx)
        _set_text(ev, "")
        ev["done"] = True
        ev["done_reason"] = reason
        return self._frame(ev)

    def without_usage(self) -> ReplyTemplate:
        """The same stream without its usage-only chunk (``choices: []``), for a request
        without ``include_usage`` when only the one with it was recorded."""
        kept = [e for e in self.events
                if not (isinstance(e, dict) and e.get("choices") == [] and "usage" in e)]
        return ReplyTemplate(self.name + "~no-usage", self.status, self.content_type,
                             self.framing, kept, self.dumps)

    def collapsed(self, content_type: str, framing: Framing) -> ReplyTemplate:
        """A native Ollama stream as one object: its final line with the whole text (the
        shape Ollama answers with ``"stream": false``)."""
        final = next(e for e in reversed(self.events) if isinstance(e, dict) and e.get("done"))
        return ReplyTemplate(self.name + "~whole", self.status, content_type, framing,
                             [final], self.dumps)

    def _frame(self, ev: Event) -> bytes:
        return self.framing.frame(ev if isinstance(ev, str) else self.dumps(ev))


class ReplyBook:
    """Every recorded reply of a capture by request shape on the routes a double generates on
    (``GENERATION_ROUTES``: no Anthropic or Responses), and its refusals on any route."""

    def __init__(self, replies: Iterable[RecordedReply], dumps: Dumps) -> None:
        self.templates: dict[ReplyKey, ReplyTemplate] = {}
        self.refusals: dict[str, Recorded] = {}
        for r in replies:
            if r.status != 200:
                self.refusals[r.path] = Recorded(r.status, r.content_type, r.body)
                continue
            if r.path not in GENERATION_ROUTES:
                continue
            key = reply_key(r.path, parse_body(r.request))
            self.templates[key] = ReplyTemplate.from_recorded(r, dumps)
        self._derived: dict[ReplyKey, ReplyTemplate | None] = {}

    @property
    def routes(self) -> frozenset[str]:
        """The routes with a recorded reply (served or refused)."""
        return frozenset({k.path for k in self.templates} | set(self.refusals))

    def find(self, key: ReplyKey) -> ReplyTemplate | None:
        """The template for a request shape: recorded, or derived from a recorded sibling
        (without the usage chunk; a native stream collapsed), else ``None``."""
        found = self.templates.get(key)
        if found is not None:
            return found
        if key not in self._derived:
            self._derived[key] = self._derive(key)
        return self._derived[key]

    def _derive(self, key: ReplyKey) -> ReplyTemplate | None:
        if key.stream:
            other = self.templates.get(ReplyKey(key.path, True, not key.usage))
            if other is None:
                return None
            return other if key.usage else other.without_usage()
        if key.path in NATIVE_ROUTES:
            stream = self.templates.get(ReplyKey(key.path, True, False))
            whole = next((t for k, t in self.templates.items()
                          if k.path in NATIVE_ROUTES and not t.streamed), None)
            if stream is not None and whole is not None:
                return stream.collapsed(whole.content_type, whole.framing)
        return None


# --- Prometheus text -------------------------------------------------------------------------


class PromPage:
    """A recorded metrics page whose samples the double can overwrite one by one; every other
    byte (comments, labels, every sample it does not own) stays as recorded."""

    def __init__(self, body: bytes) -> None:
        self._lines: list[tuple[str, str, str, str] | str] = []
        self._trailing = body.endswith(b"\n")
        for line in body.decode("utf-8").split("\n")[: -1 if self._trailing else None]:
            if not line or line.startswith("#"):
                self._lines.append(line)
                continue
            series, _, value = line.rpartition(" ")
            name, brace, labels = series.partition("{")
            self._lines.append((series, name, brace + labels, value))

    def render(
        self,
        value: Callable[[str, str], float | None],
        fmt: Callable[[float], str],
        relabel: Mapping[str, str] | None = None,
    ) -> bytes:
        """The page with ``value(name, labels)`` wherever it is not ``None``; ``relabel``
        replaces label text (``'model_name="tiny"'`` → another name)."""
        out: list[str] = []
        for line in self._lines:
            if isinstance(line, str):
                out.append(line)
                continue
            series, name, labels, recorded = line
            v = value(name, labels)
            if relabel:
                for old, new in relabel.items():
                    series = series.replace(old, new)
            out.append(f"{series} {recorded if v is None else fmt(v)}")
        return ("\n".join(out) + ("\n" if self._trailing else "")).encode("utf-8")


# --- the base of every engine's wire format --------------------------------------------------


class Flavor:
    """One engine's wire format, cloned from its pinned capture. Subclasses set ``kind`` and
    ``dumps``, fill ``dynamic`` (path → body from the status) and say which models they serve."""

    kind = ""
    dumps: Dumps = staticmethod(compact_json)

    def __init__(self, capture: Capture, seconds: Callable[[], float], rng: random.Random,
                 ) -> None:
        self.capture = capture
        self.seconds = seconds
        self.rng = rng
        self.book = ReplyBook(capture.replies, type(self).dumps)
        self.dynamic: dict[str, Callable[[EngineStatus], bytes]] = {}
        not_found = [r for r in capture.paths.values() if r.status == 404]
        if not not_found:
            raise ValueError(f"{capture.directory}: no recorded 404 to answer unknown paths")
        self.not_found = not_found[0]

    # -- what a subclass provides --

    def catalogue(self) -> dict[str, int]:
        """The models the double serves, name → size in bytes."""
        raise NotImplementedError

    def served_model(self, requested: str | None) -> str | None:
        """The model a request's ``model`` names, or ``None`` when the engine has none such."""
        models = self.catalogue()
        if requested is None:
            return next(iter(models))
        return requested if requested in models else None

    def error(self, status: int, message: str, path: str = "") -> Recorded:
        """An error reply in the engine's style (not in the captures: shape by hand)."""
        raise NotImplementedError

    def log_lines(self, slots: int) -> list[bytes] | None:
        """The engine's log as the double would have written it, or ``None``."""
        return None

    def stamp(self) -> str:
        """``created_at`` of a reply event: now, UTC."""
        return rfc3339nano(self.seconds())

    # -- serving --

    def get(self, path: str, status: EngineStatus) -> Recorded:
        """The answer to ``GET path``."""
        build = self.dynamic.get(path)
        recorded = self.capture.paths.get(path)
        if build is not None and recorded is not None:
            return Recorded(recorded.status, recorded.content_type, build(status))
        if recorded is not None and recorded.status != 0:
            return recorded
        return self.not_found

    def context(self, model: str, template: ReplyTemplate) -> ReplyContext:
        """A fresh reply identity in the style of ``template``."""
        ident = like_id(template.recorded_id, self.rng) if template.recorded_id else ""
        return ReplyContext(ident, int(self.seconds()), model, self.stamp)

    def body_of(self, path: str) -> Any:
        """The recorded JSON body of ``path``."""
        return json.loads(self.capture.paths[path].body)
