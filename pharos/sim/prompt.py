"""What a double reads from a client request: the prompt, its size, its prefix blocks, and the
reply shape asked for.

Prompt size is 4 bytes of *decoded* text per token, so ``\\uXXXX`` escapes and raw UTF-8 give
the same prompt, as for a real engine. The prompt text is the tools (compact JSON ahead of the
messages: the engine caches them with the rest), then each message's content (text parts,
then tool calls), or a completion's or generate's prompt.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

#: Real tokenizers give 2.8-6.2 bytes per token across languages and code.
BYTES_PER_TOKEN = 4
#: The prefix cache's unit, in tokens.
BLOCK_TOKENS = 16
BLOCK_BYTES = BLOCK_TOKENS * BYTES_PER_TOKEN

#: The generation routes a double serves.
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
OLLAMA_CHAT = "/api/chat"
OLLAMA_GENERATE = "/api/generate"
#: Ollama's native routes stream unless the request says ``"stream": false``.
NATIVE_ROUTES = frozenset({OLLAMA_CHAT, OLLAMA_GENERATE})
GENERATION_ROUTES = frozenset({CHAT, COMPLETIONS, OLLAMA_CHAT, OLLAMA_GENERATE})


class BadRequest(Exception):
    """The request body cannot be a generation request."""


def count_tokens(text: bytes) -> int:
    """Tokens in ``text``: one per 4 bytes, rounded up."""
    return -(-len(text) // BYTES_PER_TOKEN)


def chain_blocks(text: bytes) -> tuple[bytes, ...]:
    """The chained hashes of the full 16-token blocks of ``text``: block ``i``'s hash covers
    every byte before it, so equal hashes mean equal prefixes."""
    out: list[bytes] = []
    prev = b""
    for start in range(0, len(text) - BLOCK_BYTES + 1, BLOCK_BYTES):
        prev = blake2b(prev + text[start : start + BLOCK_BYTES], digest_size=16).digest()
        out.append(prev)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ReplyKey:
    """The shape of reply a request asks for: route, streamed, with a usage chunk."""

    path: str
    stream: bool
    usage: bool


def parse_body(body: bytes) -> dict[str, Any]:
    """The request's JSON object, or ``BadRequest``."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the body is not JSON") from None
    if not isinstance(doc, dict):
        raise BadRequest("the body is not a JSON object")
    return doc


def reply_key(path: str, doc: dict[str, Any]) -> ReplyKey:
    """The reply shape ``doc`` asks for on ``path``."""
    stream = doc.get("stream")
    streamed = stream is not False if path in NATIVE_ROUTES else stream is True
    options = doc.get("stream_options")
    usage = streamed and isinstance(options, dict) and options.get("include_usage") is True
    return ReplyKey(path, streamed, usage)


def prompt_text(path: str, doc: dict[str, Any]) -> bytes:
    """The decoded prompt text of a generation request, as UTF-8."""
    parts: list[str] = []
    tools = doc.get("tools")
    if tools:
        parts.append(_compact(tools))
    if path in (CHAT, OLLAMA_CHAT):
        messages = doc.get("messages") or []
        if not isinstance(messages, list):
            raise BadRequest("messages is not a list")
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict):
                raise BadRequest(f"messages[{i}] is not an object")
            parts.append(_content(msg.get("content"), f"messages[{i}].content"))
            if msg.get("tool_calls"):
                parts.append(_compact(msg["tool_calls"]))
    else:
        system = doc.get("system")
        if isinstance(system, str):
            parts.append(system)
        prompt = doc.get("prompt")
        if isinstance(prompt, list):
            if not all(isinstance(p, str) for p in prompt):
                raise BadRequest("prompt is not a string or a list of strings")
            parts.extend(prompt)
        elif prompt is not None:
            if not isinstance(prompt, str):
                raise BadRequest("prompt is not a string")
            parts.append(prompt)
    return "".join(parts).encode("utf-8", "surrogatepass")


def max_tokens(path: str, doc: dict[str, Any]) -> int | None:
    """The request's cap on generated tokens, if it sets one."""
    if path in NATIVE_ROUTES:
        options = doc.get("options")
        value = options.get("num_predict") if isinstance(options, dict) else None
    else:
        value = doc.get("max_completion_tokens", doc.get("max_tokens"))
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest("max_tokens is not an integer")
    return value if value > 0 else None


def is_control(path: str, doc: dict[str, Any]) -> bool:
    """An Ollama chat or generate with no messages or prompt: it only loads or unloads."""
    if path == OLLAMA_CHAT:
        return not doc.get("messages")
    if path == OLLAMA_GENERATE:
        return not doc.get("prompt")
    return False


_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def keep_alive(doc: dict[str, Any]) -> float | None:
    """Ollama's ``keep_alive``: seconds (a number or a Go duration such as ``5m``); negative
    means forever; ``None`` when the request does not set it."""
    value = doc.get("keep_alive")
    if value is None:
        return None
    if isinstance(value, bool):
        raise BadRequest("keep_alive is not a duration")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            pass
        pieces = _DURATION.findall(text)
        if pieces and "".join(n + u for n, u in pieces) == text:
            return sum(float(n) * _UNIT[u] for n, u in pieces)
    raise BadRequest(f"keep_alive {value!r} is not a duration")


def _content(content: object, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
        return "".join(texts)
    raise BadRequest(f"{where} is not a string or a list of parts")


def _compact(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
