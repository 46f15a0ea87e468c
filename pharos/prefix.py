"""Prefix index: which target most likely holds a request's prompt prefix in its cache.

A chained hash per message, not a character radix tree: bounded memory, and no prompt text is
ever stored, only 64-bit hashes and byte lengths. Pure: no I/O, no clock, no locking.

Chain (``chain``)::

    h0 = sha256(SEED, kind, model, tools)        no link of its own
    h1 = sha256(h0, role_1, content_1, extra_1)  so h1 covers the tools and the first message
    hi = sha256(h(i-1), role_i, content_i, extra_i)

Every field is length-prefixed (8 bytes, big-endian), so ``("ab", "c")`` and ``("a", "bc")``
differ. The full 32-byte digest is chained; each link's key is its first 8 bytes as an unsigned
64-bit int. The seed is a constant, so chains agree across instances and restarts.

* A string content is hashed as its decoded text (UTF-8, lone surrogates passed through), so a
  client that escapes non-ASCII as ``\\uXXXX`` and one that sends UTF-8 build the same chain and
  the matched bytes are the text's bytes.
* A content that is not a string (an array of parts, images, ``null``) is hashed as canonical
  JSON (sorted keys, no spaces, no ASCII escaping). Its length counts only the ``text`` of its
  text parts (``{"type": "text", "text": ...}``): images and other parts have no byte length that
  says anything about their tokens.
* ``extra_i`` is the canonical JSON of the message's other fields (``tool_calls``,
  ``tool_call_id``, ``name``, Ollama's ``images``...), empty when there are none, so two
  assistant turns that differ only in their tool calls don't share a link. It adds no length.
* ``cache_control`` (Anthropic's prompt-caching marker, also sent in OpenAI-shaped bodies) is
  left out: every ``"cache_control"`` member of a non-string content and of the tools (cut
  out of their canonical JSON, not encoded again), and a message's own. No engine renders it
  into the prompt, and Claude Code moves it to the newest block on every turn. A content that
  is one text block and its marker hashes as that text, the string Claude Code sends for that
  message on the next turn.
* The tools' canonical JSON bytes count towards the first link's length: the engine renders and
  caches them with the system message (tools and the system message are one unit).
* A completion or Ollama generate prompt is split into fixed 1 KiB blocks of its UTF-8 bytes, one
  link each (the last block may be shorter). A prompt of token ids is 4 bytes per token (so 256
  tokens per block, and its matched bytes / 4 are exact tokens); a batch of prompts has no chain.
* No messages and no prompt, or a body too odd to encode (say, nested past the recursion limit),
  give an empty chain: the caller routes without a prediction. ``chain`` never raises.

Index (``PrefixIndex``): an LRU over entries keyed by the 64-bit link hash, default 200k entries.
Each entry holds up to 4 ``(target_id, gen, last_used, source)`` slots; on a 5th target the
least recently used slot goes, and on a tie in ``last_used`` the first arrival keeps it.

Memory: about 110-140 B an entry: plain dicts in shards (``SHARD_ENTRIES``), a slot packed
into one int shared by every link a record writes.

LRU: ``record`` and ``merge`` touch the entries they write; ``lookup`` does not (a lookup whose
request then fails must not keep entries alive; a success records, which touches). A record
touches its links from the longest to the shortest, so the shared short prefixes end up most
recent and the capacity bound evicts the deep links of old conversations first.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple, TypeAlias

from pharos.linkhash import common_links

Source: TypeAlias = Literal["local", "peer", "restored"]
Outcome: TypeAlias = Literal[
    "predicted_hit", "wrong_prediction", "unpredicted_hit", "miss", "unknown"
]

#: The fixed seed of h0: chains agree across instances and survive restarts.
SEED: Final = b"pharos/prefix/v1"
#: Completion and generate prompts are chained in blocks of this many UTF-8 bytes.
BLOCK_BYTES: Final = 1024
#: Matched bytes to estimated tokens (engines' tokenizers: 2.8-6.2 bytes of decoded text).
BYTES_PER_TOKEN: Final = 4
#: Slots per entry.
MAX_SLOTS: Final = 4
#: Default number of entries.
DEFAULT_CAPACITY: Final = 200_000

_LEN: Final = 8  # bytes of each field's length prefix
_TOKEN_BYTES: Final = 4  # bytes per token id in a token prompt


@dataclass(frozen=True, slots=True)
class Chain:
    """A request's links: ``keys[i]`` is h(i+1) as a 64-bit int and ``ends[i]`` the cumulative
    decoded-text byte length up to and including that link."""

    keys: tuple[int, ...] = ()
    ends: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def total_bytes(self) -> int:
        """The byte length of the whole chain (0 when empty)."""
        return self.ends[-1] if self.ends else 0


EMPTY: Final = Chain()


class Match(NamedTuple):
    """A target's longest live match: the matched byte length and where its slot came from.

    A named tuple: ``lookup`` builds one per matched target on every decision, and a frozen
    dataclass's ``__init__`` sets each field through the slower ``object.__setattr__``."""

    matched_bytes: int
    source: Source

    @property
    def tokens(self) -> int:
        """Estimated cached tokens, at ``BYTES_PER_TOKEN``."""
        return self.matched_bytes // BYTES_PER_TOKEN


@dataclass(frozen=True, slots=True)
class WireSlot:
    """One slot on the wire: the target's string key and when it was last used."""

    target_key: str
    last_used: float


@dataclass(frozen=True, slots=True)
class Entry:
    """One exported entry: a link hash and its live slots, oldest arrival first."""

    key: int
    slots: tuple[WireSlot, ...]


@dataclass(frozen=True, slots=True)
class PrefixOp:
    """A peer delta: a record (or, with ``remove``, a correction) of one request's links.

    ``dispatched``: a prediction made when the request was sent, before any byte came back;
    the sender's later records confirm it, its correction or error removal drops it. Only on
    dispatched ops: ``root_tokens``, the root's estimated tokens (a peer that never sent that
    root cannot size it otherwise), and ``moved``: this send puts the root into a cache that
    lacked it (so peers are told at once)."""

    target_key: str
    hashes: tuple[int, ...]
    last_used: float
    remove: bool = False
    dispatched: bool = False
    root_tokens: int | None = None
    moved: bool = False


@dataclass(slots=True)
class IndexCensus:
    """The index counted (``PrefixIndex.census_in_steps``): its entries, an estimate of their
    bytes, and per target id the entries holding a slot for it at its current gen and at an
    older one (stale: matches nothing until overwritten or evicted)."""

    entries: int = 0
    bytes: int = 0
    current: dict[int, int] = field(default_factory=dict)
    stale: dict[int, int] = field(default_factory=dict)


# --- chain -------------------------------------------------------------------------------------


def _field(data: bytes) -> bytes:
    return len(data).to_bytes(_LEN, "big") + data


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _canonical(value: object) -> bytes:
    text = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr
    )
    return _utf8(text)


def _text_len(content: object) -> int:
    """Byte length of a content: a string's UTF-8 bytes, or an array's text parts."""
    if isinstance(content, str):
        return len(_utf8(content))
    if isinstance(content, list):
        n = 0
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                text = part.get("text")
                if isinstance(text, str):
                    n += len(_utf8(text))
        return n
    return 0


def _key(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "big")


def _head(kind: bytes, model: str, tools: bytes) -> bytes:
    return hashlib.sha256(SEED + _field(kind) + _field(_utf8(model)) + _field(tools)).digest()


#: The annotation a chain leaves out: Anthropic's (and OpenAI-shaped clients' copies of it)
#: prompt-caching marker, which no engine renders into the prompt. As a JSON key it is this
#: byte string (a quote inside a string value is escaped, so text that mentions it is not).
_ANNOTATION: Final = b'"cache_control":'
#: Message fields that are not ``extra``: its role, its content and the annotation.
_NOT_EXTRA: Final = frozenset({"role", "content", "cache_control"})


#: A marker's value as canonical JSON: an object without nested objects or arrays (Anthropic's
#: ``{"type":"ephemeral"}``, with ``"ttl"`` or not), a string without escapes, or a scalar.
_MARKER_VALUE: Final = re.compile(rb'\{[^{}\[\]\\]*\}|"[^"\\]*"|[-+.0-9a-zA-Z]+')


def _unmarked(data: bytes) -> bytes | None:
    """Canonical JSON bytes without their ``cache_control`` members (each with one comma
    beside it cut out: the bytes of the value encoded without them). None for a marker value
    it does not read."""
    out: list[bytes] = []
    start = 0
    i = data.find(_ANNOTATION)
    while i >= 0:
        m = _MARKER_VALUE.match(data, i + len(_ANNOTATION))
        if m is None:
            return None
        j = m.end()
        if data[j : j + 1] == b",":
            j += 1  # {"cache_control":V,"text":...}
        elif data[i - 1 : i] == b",":
            i -= 1  # {...,"cache_control":V}
        out.append(data[start:i])
        start = j
        i = data.find(_ANNOTATION, j)
    out.append(data[start:])
    return b"".join(out)


def _lone_text(content: object) -> str | None:
    """The text of a content that is one text block and its ``cache_control`` marker: llama.cpp
    renders a single text part as the plain string, and Claude Code sends the message whose
    block carried the marker as a string once the marker has moved on. None otherwise."""
    if type(content) is list and len(content) == 1:
        block = content[0]
        if type(block) is dict and len(block) == 3 and block.get("type") == "text" \
                and "cache_control" in block:
            text = block.get("text")
            if isinstance(text, str):
                return text
    return None


#: A role's length-prefixed field, for the roles clients send (computed once each).
_ROLE_FIELDS: Final[dict[str, bytes]] = {
    r: len(r).to_bytes(_LEN, "big") + r.encode() for r in
    ("system", "user", "assistant", "tool", "developer", "function", "")}
#: The field of no extra fields.
_NO_EXTRA: Final = bytes(_LEN)


def _chat_chain(model: str, messages: list[object], tools: object) -> Chain:
    """Each link hashes the previous link's digest and the message's role, content and other
    fields, each length-prefixed, fed to one SHA-256 piece by piece so a long content is
    encoded once and never copied (the same digests as hashing their concatenation). Runs of
    common messages (a known role, a string content, nothing else) go to ``pharos.linkhash``
    (compiled): per-message overhead is most of a chain's time."""
    tools_bytes = _canonical(tools) if tools else b""
    if _ANNOTATION in tools_bytes:
        tools_bytes = _unmarked(tools_bytes) or tools_bytes
    prev = _head(b"chat", model, tools_bytes)
    total = len(tools_bytes)
    keys: list[int] = []
    ends: list[int] = []
    sha256 = hashlib.sha256
    from_bytes = int.from_bytes
    roles = _ROLE_FIELDS
    i, count = 0, len(messages)
    while True:
        i, prev, total = common_links(prev, messages, i, total, keys, ends)
        if i >= count:
            break
        message = messages[i]
        i += 1
        extra_field = _NO_EXTRA
        if type(message) is dict:
            role = message.get("role", "")
            content = message.get("content")
            if len(message) - ("role" in message) - ("content" in message):
                extra = {k: v for k, v in message.items() if k not in _NOT_EXTRA}
                if extra:
                    extra_field = _field(_canonical(extra))
        else:
            role, content = "", message
        role_field = roles.get(role) if type(role) is str else None
        if role_field is None:
            role_field = _field(_utf8(role) if isinstance(role, str) else _canonical(role))
        if type(content) is str:
            text = content.encode("utf-8", "surrogatepass")
            n = len(text)
            h = sha256(prev + role_field + (n + 1).to_bytes(_LEN, "big") + b"s")
            h.update(text)
            total += n
        else:
            h = sha256(prev + role_field)
            data = b""
            if not isinstance(content, str):
                data = _canonical(content)
                if _ANNOTATION in data:  # a cache_control marker: hashed without it
                    lone = _lone_text(content)
                    if lone is not None:
                        content = lone
                    else:
                        data = _unmarked(data) or data
            if isinstance(content, str):  # a str subclass, or a marked lone text block
                text = _utf8(content)
                h.update((len(text) + 1).to_bytes(_LEN, "big") + b"s")
                h.update(text)
                total += len(text)
            else:
                h.update(_field(b"j" + data))
                total += _text_len(content)
        h.update(extra_field)
        prev = h.digest()
        keys.append(from_bytes(prev[:8], "big"))
        ends.append(total)
    return Chain(tuple(keys), tuple(ends))


def _block_chain(model: str, kind: bytes, data: bytes) -> Chain:
    prev = _head(kind, model, b"")
    keys: list[int] = []
    ends: list[int] = []
    for start in range(0, len(data), BLOCK_BYTES):
        block = data[start : start + BLOCK_BYTES]
        prev = hashlib.sha256(prev + _field(block)).digest()
        keys.append(_key(prev))
        ends.append(start + len(block))
    return Chain(tuple(keys), tuple(ends))


def _prompt_chain(model: str, prompt: object) -> Chain:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return _block_chain(model, b"prompt", _utf8(prompt))
    if isinstance(prompt, list) and all(
        type(t) is int and 0 <= t < 2 ** (8 * _TOKEN_BYTES) for t in prompt
    ):
        data = b"".join(t.to_bytes(_TOKEN_BYTES, "big") for t in prompt)
        return _block_chain(model, b"tokens", data)
    return EMPTY  # a batch of prompts, or something else: no single prefix to predict


def chain(model: str, messages: object, tools: object, prompt: object) -> Chain:
    """The request's chain: over ``messages`` when it is a list (chat routes), else over
    ``prompt``. Empty when neither is there or the body is too odd to encode; never raises."""
    if not isinstance(model, str):
        return EMPTY
    try:
        if isinstance(messages, list):
            return _chat_chain(model, messages, tools)
        if messages is None and prompt is not None:
            return _prompt_chain(model, prompt)
    except (ValueError, TypeError, RecursionError, OverflowError):
        pass
    return EMPTY


def unfollowed(messages: object, prompt: object) -> str:
    """Why ``chain`` gave no links for these fields (a counter label, never prompt text)."""
    if isinstance(messages, list):
        return "no_messages" if not messages else "unencodable"
    if messages is not None:
        return "messages_not_a_list"
    if prompt is None:
        return "no_prompt"
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return "batch_prompt"
    if isinstance(prompt, str) and not prompt:
        return "empty_prompt"
    return "prompt_not_text"


# --- index -------------------------------------------------------------------------------------

# A slot is one int: target id, gen (mod 2**24), source and last_used in whole milliseconds.
# One record packs its slot once and every link it writes shares that object, so an entry with
# one slot costs its key and its dict row and nothing else.
_TARGET_BITS: Final = 20
_GEN_BITS: Final = 24
_TARGET_MASK: Final = (1 << _TARGET_BITS) - 1
_GEN_MASK: Final = (1 << _GEN_BITS) - 1
_GEN_SHIFT: Final = _TARGET_BITS
_SOURCE_SHIFT: Final = _TARGET_BITS + _GEN_BITS
_MS_SHIFT: Final = _SOURCE_SHIFT + 2
_MS_MAX: Final = (1 << 44) - 1
_SOURCES: Final[tuple[Source, ...]] = ("local", "peer", "restored")
_SOURCE_CODE: Final[Mapping[str, int]] = {s: i for i, s in enumerate(_SOURCES)}
_NO_GEN: Final = -1  # matches no stored gen (an unknown target's)

#: Entries per shard at most. A shard is a plain dict; CPython 3.11 sizes a dict's table from
#: three times its live entries at each resize, so a shard that never holds more than a third
#: of a 2**16-row table (21,845) stays in that table for good (about 65 bytes a row), where
#: one dict of 200,000 jumps to a 2**20-row table (about 105 bytes a row).
SHARD_ENTRIES: Final = 20_000
#: A full shard drops this fraction of its oldest entries at once (``drop_oldest``).
EVICT_FRACTION: Final = 64

Slots: TypeAlias = "int | tuple[int, ...]"


def _pack(target: int, gen: int, last_used: float, source: Source) -> int:
    if not 0 <= target <= _TARGET_MASK:
        raise ValueError(f"target id {target} out of range")
    ms = round(last_used * 1000) if last_used > 0 else 0  # NaN and negatives are 0
    return ((min(ms, _MS_MAX) << _MS_SHIFT) | (_SOURCE_CODE[source] << _SOURCE_SHIFT)
            | ((gen & _GEN_MASK) << _GEN_SHIFT) | target)


def _ms(slot: int) -> int:
    return slot >> _MS_SHIFT


def _unpack(slot: int) -> tuple[int, int, float, Source]:
    return (slot & _TARGET_MASK, (slot >> _GEN_SHIFT) & _GEN_MASK, (slot >> _MS_SHIFT) / 1000,
            _SOURCES[(slot >> _SOURCE_SHIFT) & 3])


def _as_tuple(slots: Slots) -> tuple[int, ...]:
    return (slots,) if type(slots) is int else slots  # type: ignore[return-value]


def _gen_getter(gens: Mapping[int, int] | Callable[[int], int | None]) -> Callable[
    [int], int | None
]:
    if type(gens) is dict or (not callable(gens) and isinstance(gens, Mapping)):
        return gens.get
    return gens


class PrefixIndex:
    """A bounded LRU of link hash → up to ``MAX_SLOTS`` target slots.

    Held in ``ceil(capacity / SHARD_ENTRIES)`` shards by ``key % shards``, each an exact LRU
    of its share of the capacity (the keys are hashes, so the shares fill evenly); a shard
    that passes its share drops its oldest 1/``EVICT_FRACTION``. ``last_used`` is kept in
    whole milliseconds and ``gen`` modulo 2**24."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY,
                 shard_entries: int = SHARD_ENTRIES) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        if shard_entries < 1:
            raise ValueError(f"shard_entries must be at least 1, got {shard_entries}")
        self.capacity = capacity
        n = -(-capacity // shard_entries)
        self._n = n
        self._shards: list[dict[int, Slots]] = [{} for _ in range(n)]
        self._caps = [capacity // n + (i < capacity % n) for i in range(n)]

    def __len__(self) -> int:
        return sum(len(s) for s in self._shards)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and key in self._shards[key % self._n]

    def lookup(
        self, ch: Chain, gens: Mapping[int, int] | Callable[[int], int | None]
    ) -> dict[int, Match]:
        """Per target, the longest link of ``ch`` whose slot's gen is the target's current gen
        (an unknown gen matches nothing). O(links); does not touch the LRU order."""
        gen_of = _gen_getter(gens)
        new_match = tuple.__new__  # ``Match(...)`` without its Python-level ``__new__``
        keys, ends = ch.keys, ch.ends
        shards, n = self._shards, self._n
        found: dict[int, Match] = {}
        current: dict[int, int] = {}
        for i in range(len(keys) - 1, -1, -1):
            key = keys[i]
            got = shards[key % n].get(key) if n > 1 else shards[0].get(key)
            if got is None:
                continue
            for slot in (got,) if type(got) is int else got:  # type: ignore[union-attr]
                target = slot & _TARGET_MASK
                if target in found:
                    continue
                want = current.get(target)
                if want is None:
                    g = gen_of(target)
                    current[target] = want = _NO_GEN if g is None else g & _GEN_MASK
                if (slot >> _GEN_SHIFT) & _GEN_MASK == want:
                    found[target] = new_match(Match, (ends[i],
                                                      _SOURCES[(slot >> _SOURCE_SHIFT) & 3]))
        return found

    def record(
        self, ch: Chain | Sequence[int], target_id: int, gen: int, now: float,
        source: Source = "local",
    ) -> None:
        """Add the target to every link of the chain. Call it when the request succeeded, never
        at dispatch or at the first byte: engines cache per slot, so a prompt is reusable only
        once the request that brought it has ended."""
        keys = ch.keys if isinstance(ch, Chain) else ch
        slot = _pack(target_id, gen, now, source)
        shards, caps, n = self._shards, self._caps, self._n
        over: list[int] = []
        for key in reversed(keys):
            i = key % n if n > 1 else 0
            shard = shards[i]
            old = shard.pop(key, None)
            shard[key] = slot if old is None else _put(old, slot)
            if len(shard) > caps[i]:
                over.append(i)
        for i in over:  # after the whole chain, so a record never evicts its own links first
            if len(shards[i]) > caps[i]:
                drop_oldest(shards[i], caps[i])

    def correct(self, ch: Chain | Sequence[int], target_id: int) -> None:
        """Remove the target from every link of the chain: the engine reported cached tokens far
        below the prediction (``classify``'s ``wrong_prediction``)."""
        keys = ch.keys if isinstance(ch, Chain) else ch
        shards, n = self._shards, self._n
        for key in keys:
            shard = shards[key % n]
            got = shard.get(key)
            if got is None:
                continue
            kept = tuple(s for s in _as_tuple(got) if s & _TARGET_MASK != target_id)
            if not kept:
                del shard[key]
            elif len(kept) == 1:
                shard[key] = kept[0]  # in place: a correction is not a use
            elif len(kept) != len(_as_tuple(got)):
                shard[key] = kept

    def forget(self, ch: Chain | Sequence[int], target_id: int) -> None:
        """Remove the target from every link of the chain after an error reply: whatever the
        engine holds now, this request taught nothing about it."""
        self.correct(ch, target_id)

    def export(
        self, key_of: Callable[[int], str | None],
        gens: Mapping[int, int] | Callable[[int], int | None] | None = None,
    ) -> list[Entry]:
        """All live entries, most recently used first, targets named by ``key_of`` (None: left
        out). With ``gens``, stale slots are left out too: a receiver stamps what it merges
        with its own current gen, so a dead slot must not travel."""
        return list(self.iter_export(key_of, gens))

    def iter_export(
        self, key_of: Callable[[int], str | None],
        gens: Mapping[int, int] | Callable[[int], int | None] | None = None,
        *, newest_first: bool = True,
    ) -> Iterator[Entry]:
        """``export`` one entry at a time, for a caller that yields to the reactor between
        batches; the index must not change meanwhile (iterate a ``copy_in_steps`` copy).
        ``newest_first=False``: least recently used first (a snapshot's order, so a reader
        merging each part as it arrives rebuilds the LRU order)."""
        gen_of = _gen_getter(gens) if gens is not None else None
        for key in self._ordered(newest_first=newest_first):
            shard = self._shards[key % self._n]
            wire: list[WireSlot] = []
            for slot in _as_tuple(shard[key]):
                target, gen, last_used, _ = _unpack(slot)
                if gen_of is not None:
                    g = gen_of(target)
                    if g is None or g & _GEN_MASK != gen:
                        continue
                target_key = key_of(target)
                if target_key is not None:
                    wire.append(WireSlot(target_key, last_used))
            if wire:
                yield Entry(key, tuple(wire))

    def copy_in_steps(self) -> Iterator[PrefixIndex | None]:
        """An independent copy, one shard per step: yields ``None`` after each shard but the
        last, then the copy. Slots are immutable ints and tuples, so copying each shard's dict
        is enough; a shard of 2**16 entries takes a few ms, and a snapshot must not hold the
        reactor for every shard at once."""
        other = PrefixIndex.__new__(PrefixIndex)
        other.capacity, other._n, other._caps = self.capacity, self._n, list(self._caps)
        other._shards = []
        for i, shard in enumerate(self._shards):
            other._shards.append(dict(shard))
            if i < self._n - 1:
                yield None
        yield other

    def merge(
        self, items: Iterable[Entry | PrefixOp],
        id_of: Callable[[str], int | None],
        gens: Mapping[int, int] | Callable[[int], int | None],
        now: float,
        source: Source = "peer",
    ) -> int:
        """Apply a peer's deltas (``PrefixOp``, in order) or a snapshot (``export``'s entries,
        applied from the oldest so the LRU order carries over) as local records and removals,
        stamped with the receiver's current gen and ``source``; ``last_used`` is capped at
        ``now`` (clock skew). Returns how many were dropped (unknown targets or gens)."""
        gen_of = _gen_getter(gens)
        dropped = 0
        run: list[Entry] = []

        def flush() -> int:
            lost = 0
            for entry in reversed(run):
                for ws in entry.slots:
                    lost += not self._merge_one(
                        (entry.key,), ws.target_key, min(ws.last_used, now), False,
                        id_of, gen_of, source,
                    )
            run.clear()
            return lost

        for item in items:
            if isinstance(item, Entry):
                run.append(item)
                continue
            dropped += flush()
            dropped += not self._merge_one(
                item.hashes, item.target_key, min(item.last_used, now), item.remove,
                id_of, gen_of, source,
            )
        dropped += flush()
        return dropped

    def _merge_one(
        self, keys: Sequence[int], target_key: str, last_used: float, remove: bool,
        id_of: Callable[[str], int | None], gen_of: Callable[[int], int | None], source: Source,
    ) -> bool:
        target_id = id_of(target_key)
        if target_id is None:
            return False
        if remove:
            self.correct(keys, target_id)
            return True
        gen = gen_of(target_id)
        if gen is None:
            return False
        self.record(keys, target_id, gen, last_used, source)
        return True

    def slots(self, key: int) -> list[tuple[int, int, float, Source]]:
        """The slots of one entry as ``(target_id, gen, last_used, source)``, arrival order."""
        got = self._shards[key % self._n].get(key)
        return [] if got is None else [_unpack(s) for s in _as_tuple(got)]

    def census_in_steps(self, gens: Mapping[int, int] | Callable[[int], int | None]
                        ) -> Iterator[IndexCensus | None]:
        """Count the index one shard per step (``GET /admin/index``): ``None`` after each
        shard, then the census (of a moving index, as any live figure is)."""
        gen_of = _gen_getter(gens)
        out = IndexCensus()
        ints: set[int] = set()  # a record's links share one slot int: count each once
        for shard in self._shards:
            out.bytes += sys.getsizeof(shard)
            for key, got in shard.items():
                out.bytes += sys.getsizeof(key)
                if type(got) is not int:
                    out.bytes += sys.getsizeof(got)
                for slot in _as_tuple(got):
                    ints.add(id(slot))
                    target = slot & _TARGET_MASK
                    g = gen_of(target)
                    fresh = g is not None and g & _GEN_MASK == (slot >> _GEN_SHIFT) & _GEN_MASK
                    by = out.current if fresh else out.stale
                    by[target] = by.get(target, 0) + 1
            out.entries += len(shard)
            yield None
        out.bytes += len(ints) * sys.getsizeof(1 << 62)
        yield out

    def lru_order(self) -> list[int]:
        """All entry keys, least recently used first: each shard's order kept, interleaved by
        each entry's newest ``last_used`` (a snapshot merged in rebuilds every shard's order)."""
        return list(self._ordered(newest_first=False))

    def _ordered(self, newest_first: bool) -> Iterator[int]:
        if self._n == 1:
            shard = self._shards[0]
            return iter(reversed(shard) if newest_first else shard)

        def stamped(shard: dict[int, Slots]) -> Iterator[tuple[int, int]]:
            for key in reversed(shard) if newest_first else shard:
                newest = max(_ms(s) for s in _as_tuple(shard[key]))
                yield (-newest if newest_first else newest), key

        merged = heapq.merge(*(stamped(s) for s in self._shards), key=lambda p: p[0])
        return (key for _, key in merged)


def drop_oldest(table: dict[Any, Any], cap: int) -> None:
    """Drop a plain dict's oldest keys, down to ``cap`` less 1/EVICT_FRACTION of it: a dict
    has no cheap "oldest" (its first live row is past earlier pops' holes), so it is trimmed
    in batches, one walk each."""
    it = iter(table)
    victims = [next(it) for _ in range(len(table) - cap + cap // EVICT_FRACTION)]
    for key in victims:
        del table[key]


def _put(old: Slots, slot: int) -> Slots:
    """The entry's slots with ``slot`` recorded: its target's slot updated (``_updated``),
    else appended, the least recently used going past ``MAX_SLOTS`` (a tie: the latest)."""
    target = slot & _TARGET_MASK
    if type(old) is int:
        if old & _TARGET_MASK == target:
            return _updated(old, slot)
        slots: tuple[int, ...] = (old, slot)
    else:
        slots = old  # type: ignore[assignment]
        for i, s in enumerate(slots):
            if s & _TARGET_MASK == target:
                return (*slots[:i], _updated(s, slot), *slots[i + 1 :])
        slots = (*slots, slot)
    if len(slots) > MAX_SLOTS:
        victim = len(slots) - 1
        for i in range(len(slots) - 2, -1, -1):
            if _ms(slots[i]) < _ms(slots[victim]):
                victim = i
        slots = slots[:victim] + slots[victim + 1 :]
    return slots


def _updated(old: int, new: int) -> int:
    """A target's slot recorded again: the new one, or (same gen, older last_used) the old
    one with the new gen."""
    gen_bits = _GEN_MASK << _GEN_SHIFT
    if (old & gen_bits) != (new & gen_bits) or _ms(new) >= _ms(old):
        return new
    return old  # same gen, so the gen is the new one already


# --- outcome -----------------------------------------------------------------------------------


def classify(predicted_tokens: int | None, cached_tokens: int | None,
             prompt_tokens: int | None = None, chain_tokens: int | None = None) -> Outcome:
    """The ``prefix`` outcome: the prediction against the engine's cached tokens.

    ``unknown`` when the engine reported no cached tokens; without a prediction (None or 0),
    ``unpredicted_hit`` when anything was cached, else ``miss``; with one, ``wrong_prediction``
    when fewer than half the predicted tokens were cached, else ``predicted_hit``. The
    prediction is in the index's tokens (``BYTES_PER_TOKEN``), the cached count in the
    engine's: with the engine's ``prompt_tokens`` and the chain's ``chain_tokens`` both known,
    the two are compared as shares of the prompt, so a tokenizer of many bytes a token does
    not turn a full hit into a wrong prediction. Without them, as absolute counts."""
    if cached_tokens is None:
        return "unknown"
    if not predicted_tokens or predicted_tokens <= 0:
        return "unpredicted_hit" if cached_tokens > 0 else "miss"
    if prompt_tokens and chain_tokens and prompt_tokens > 0 and chain_tokens > 0:
        # cached / prompt < (predicted / chain) / 2, without division
        share = min(predicted_tokens, chain_tokens)
        wrong = 2 * cached_tokens * chain_tokens < share * prompt_tokens
    else:
        wrong = 2 * cached_tokens < predicted_tokens
    return "wrong_prediction" if wrong else "predicted_hit"
