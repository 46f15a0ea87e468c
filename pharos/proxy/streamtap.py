"""The stream tap: a line scanner over an engine's reply body on its way to the client.

The relay hands every upstream chunk to ``StreamTap.feed`` and writes what it returns; at the
end it writes ``StreamTap.finish()`` and reads ``StreamTap.usage``. The tap

- passes bytes through unchanged and at once (the very chunk object, no copy), except when it
  strips, when it holds a partial line until its newline (at most ``MAX_LINE`` bytes);
- reads the usage of every usage-bearing JSON line (SSE ``data:`` lines, Ollama NDJSON, a
  one-line non-streamed body, or at ``finish`` a whole multi-line body of at most ``MAX_LINE``
  bytes), a later line's values replacing an earlier one's and the rest kept (``merge_usage``:
  Anthropic gives the prompt in ``message_start`` and the completion in ``message_delta``);
  longer lines pass unparsed, so a huge one-line reply gives no usage;
- decodes only lines that can carry usage: a byte search for ``USAGE_KEYS`` (``"usage"``,
  ``"timings"``, ``_count"``, ``_duration"``, each followed by ``:`` and anything but
  ``null``) comes first, so a content chunk costs four ``bytes.find`` calls and a blank line
  none (the Responses events before ``response.completed`` say ``"usage":null``);
- with ``strip_usage_chunk`` (Pharos asked for ``stream_options.include_usage`` on the
  client's behalf), drops the usage-only chunk: the ``data:`` line whose top-level
  ``choices`` is an empty list, and the blank line ending its event. Nothing else.

Lines end at ``\\n`` (an ``\\r`` before it stays in the line, so CRLF streams work); SSE
comments and ``data: [DONE]`` carry no usage marker and pass without a look.
"""

from __future__ import annotations

import json
from typing import Any

from pharos.engine.usage import USAGE_KEYS, Usage, merge_usage, parse_usage

#: The longest line (without its ``\n``) the tap parses, and the most it ever holds back.
MAX_LINE = 64 * 1024

_DATA = b"data:"
#: Byte forms of an empty ``choices`` list: compact JSON, and Python's default separators
#: (mlx-lm). Only a hint; the decoded object decides.
_EMPTY_CHOICES = (b'"choices":[]', b'"choices": []')


def _marker(key: str) -> bytes:
    """What to search for to find ``key``: the quoted key, or for a snake_case key only its
    last part (``_count"`` stands for ``"prompt_eval_count"`` and ``"eval_count"`` alike), so
    a line costs fewer searches; a stray hit only costs one decode."""
    cut = key.rfind("_")
    return (key[cut:] if cut > 0 else '"' + key).encode() + b'"'


#: The byte strings a usage-bearing line must contain, derived from ``USAGE_FIELDS``.
_MARKERS: tuple[bytes, ...] = tuple(sorted({_marker(k) for k in USAGE_KEYS}))
_SHORTEST = min(len(m) for m in _MARKERS)
_SPACE = b" \t"


def _may_carry_usage(buf: bytes, s: int, e: int) -> bool:
    """Whether ``buf[s:e]`` may hold a usage key with a non-null value, judged by bytes alone:
    a quote cannot occur unescaped inside a JSON string, so a hit ends a key, or a string
    value, which the following ``:`` rules out."""
    for marker in _MARKERS:
        i = buf.find(marker, s, e)
        while i >= 0:
            j = i + len(marker)
            while j < e and buf[j] in _SPACE:
                j += 1
            if j < e and buf[j] == 0x3A:  # ':'
                j += 1
                while j < e and buf[j] in _SPACE:
                    j += 1
                if not buf.startswith(b"null", j, e):
                    return True
            i = buf.find(marker, j, e)
    return False


def _decode(payload: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(payload)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
        return None
    return obj if isinstance(obj, dict) else None


class StreamTap:
    """Scan one reply body line by line on its way through; see the module docstring."""

    def __init__(self, *, strip_usage_chunk: bool = False, embeddings: bool = False) -> None:
        """``strip_usage_chunk``: Pharos added ``include_usage`` for a client that did not
        ask, so drop the usage-only chunk from what the client gets. ``embeddings``: the reply
        answers an embeddings request (its completion count is 0, see ``parse_usage``)."""
        self._strip = strip_usage_chunk
        self._embeddings = embeddings
        self._usage: Usage | None = None
        # the partial line so far (pieces, never joined until its newline), and its length
        self._held: list[bytes] = []
        self._held_len = 0
        # inside a line longer than MAX_LINE: passing it through, not parsing it
        self._overlong = False
        # the line before was a stripped usage chunk: drop this one if it is blank
        self._drop_blank = False
        # the whole body while it may be one multi-line JSON object of at most MAX_LINE bytes
        self._body: list[bytes] | None = []
        self._body_len = 0
        self._first_line = True

    @property
    def usage(self) -> Usage | None:
        """The usage the reply's lines said so far, later lines winning (final after ``finish``)."""
        return self._usage

    def feed(self, chunk: bytes) -> bytes:
        """Scan one upstream chunk; return the bytes to write to the client now."""
        n = len(chunk)
        if not n:
            return b""
        if self._body is not None:
            self._remember(chunk)
        strip = self._strip
        out: list[bytes] = []  # strip mode: what goes out, in order, before chunk[emit:]
        emit = 0
        start = 0
        nl = chunk.find(b"\n")
        if nl >= 0:
            # first, the line that began in an earlier chunk
            if self._overlong:
                self._overlong = False
                self._drop_blank = False
                start = nl + 1
            elif self._held:
                line = b"".join(self._held) + chunk[: nl + 1]
                too_long = self._held_len + nl > MAX_LINE
                self._held = []
                self._held_len = 0
                if too_long:
                    self._drop_blank = False
                    drop = False
                else:
                    drop = self._line(line, 0, len(line))
                if strip:
                    if not drop:
                        out.append(line)
                    emit = nl + 1
                start = nl + 1
                nl = chunk.find(b"\n", start)
            while nl >= 0:
                if nl - start > MAX_LINE:
                    self._drop_blank = False
                elif self._line(chunk, start, nl + 1):  # True only when stripping
                    if start > emit:
                        out.append(chunk[emit:start])
                    emit = nl + 1
                start = nl + 1
                nl = chunk.find(b"\n", start)
        # the rest has no newline: hold it (strip mode: not passed yet) or, past the limit,
        # give up on the line and pass it through
        end = n
        if start < n and not self._overlong:
            tail = n - start
            if self._held_len + tail > MAX_LINE:
                self._overlong = True
                if strip:
                    out.extend(self._held)
                self._held = []
                self._held_len = 0
            else:
                self._held.append(chunk[start:] if start else chunk)
                self._held_len += tail
                end = start
        if not strip:
            return chunk
        if not out and emit == 0 and end == n:
            return chunk
        if end > emit:
            out.append(chunk[emit:end])
        return b"".join(out)

    def finish(self) -> bytes:
        """The body ended: scan the last line if it had no newline; return what is still to be
        written (only ever non-empty when stripping held a partial line)."""
        out = b""
        if self._held:
            line = b"".join(self._held)
            self._held = []
            self._held_len = 0
            drop = self._line(line, 0, len(line))
            if self._strip and not drop:
                out = line
        self._overlong = False
        self._drop_blank = False
        body, self._body = self._body, None
        if self._usage is None and body:
            whole = b"".join(body)
            if whole.lstrip().startswith(b"{") and _may_carry_usage(whole, 0, len(whole)):
                obj = _decode(whole)
                if obj is not None:
                    self._usage = parse_usage(obj, embeddings=self._embeddings)
        return out

    def _remember(self, chunk: bytes) -> None:
        """Keep the body while it may still be one multi-line JSON object within the limit."""
        assert self._body is not None
        if not self._body_len:
            i = 0
            while i < len(chunk) and chunk[i] in b" \t\r\n":
                i += 1
            if i == len(chunk):
                return  # only white space so far: wait for the first real byte
            if chunk[i] != 0x7B:  # '{'
                self._body = None  # SSE, or not a JSON object: parsed line by line only
                return
        self._body_len += len(chunk)
        if self._body_len > MAX_LINE:
            self._body = None
        else:
            self._body.append(chunk)

    def _line(self, buf: bytes, s: int, e: int) -> bool:
        """Scan the complete line ``buf[s:e]`` (with its ``\\n``, if any); return whether the
        client must not get it (only ever true when stripping)."""
        if self._drop_blank:
            self._drop_blank = False
            if e - s <= 2 and buf[s:e] in (b"\n", b"\r\n"):
                return True
        if e - s <= _SHORTEST:
            return False  # blank lines, SSE pings: nothing to parse
        if self._first_line and self._body is not None:
            text = buf[s:e].strip()
            if text:
                self._first_line = False
                if text.startswith(b"{") and text.endswith(b"}"):
                    self._body = None  # NDJSON or a one-line body: the lines say it all
        is_data = buf.startswith(_DATA, s, e)
        empty_choices = (
            self._strip
            and is_data
            and (buf.find(_EMPTY_CHOICES[0], s, e) >= 0 or buf.find(_EMPTY_CHOICES[1], s, e) >= 0)
        )
        if not empty_choices and not _may_carry_usage(buf, s, e):
            return False
        obj = _decode(buf[s + len(_DATA) : e] if is_data else buf[s:e])
        if obj is None:
            return False
        usage = parse_usage(obj, embeddings=self._embeddings)
        if usage is not None:
            self._usage = merge_usage(self._usage, usage)
        if empty_choices and obj.get("choices") == []:
            self._drop_blank = True
            return True
        return False
