"""Reading a client's request body once: model, prompt size, streaming, the body to forward."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pharos.models import rewrite_model
from pharos.prefix import EMPTY, Chain, chain, unfollowed
from pharos.proxy import errors

#: Routes whose prompt the prefix index follows: chat messages or a prompt string.
CHAINED = frozenset({"/v1/chat/completions", "/v1/completions", "/api/chat", "/api/generate",
                     "/v1/messages"})

#: JSON nested deeper than this is refused (400): no client needs it, and walking it would
#: recurse as deep (a RecursionError, a 500, near 1,000 levels).
MAX_DEPTH = 128

#: Bytes of decoded prompt text per estimated token (real tokenizers: 2.8-6.2, by language).
BYTES_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class Parsed:
    """What routing needs from a request; the body is re-encoded only when it must change."""

    model: str
    prompt_tokens: int
    stream: bool
    body: Any  # the decoded JSON object
    pharos_asked_usage: bool  # Pharos set stream_options.include_usage for this client
    control: bool  # an Ollama load/unload request (no messages or prompt)
    raw: bytes  # the body as the client sent it
    insert_usage: bool = False  # Pharos asked and the client sent no stream_options at all
    chain: Chain = EMPTY  # the prompt's prefix chain (empty: no prediction)
    unfollowed: str | None = None  # why a chained route has no chain (a counter label)
    user: str | None = None  # the body's ``user`` field: a conversation name for affinity
    #: The client's output limit (``output_limit``); None when it set none.
    max_tokens: int | None = None
    #: The model as the body names it when the fleet resolved it to another name (an alias:
    #: ``pharos.models``); "" when the body named none; None: ``model`` is the body's.
    sent_model: str | None = None

    def forward_body(self, served: str) -> bytes:
        """The body to send to the engine, naming the model as the engine knows it: the
        client's bytes when they already do, else with only the model's bytes rewritten
        (``rewrite_model``); re-encoded only where that cannot be done."""
        sent = self.model if self.sent_model is None else self.sent_model
        if served == sent and not self.pharos_asked_usage:
            return self.raw
        if not self.pharos_asked_usage or self.insert_usage:
            raw = self.raw if served == sent else rewrite_model(self.raw, served, bool(sent))
            if raw is not None and not self.insert_usage:
                return raw
            if raw is not None:
                # Insert the option before the object's closing brace instead of re-encoding
                # a large body (the decode proved it is one JSON object without that key).
                return raw.rstrip()[:-1] + b',"stream_options":{"include_usage":true}}'
        body = dict(self.body)
        body["model"] = served
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def _text_bytes(content: Any) -> int:
    """UTF-8 bytes of a message's decoded text (parts: their text; anything else as sent)."""
    if isinstance(content, str):
        return len(content.encode("utf-8", "surrogatepass"))
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                total += len(part["text"].encode("utf-8", "surrogatepass"))
            else:
                total += len(json.dumps(part))
        return total
    if content is None:
        return 0
    return len(json.dumps(content))


def _depth_over(doc: Any, limit: int) -> bool:
    """Whether ``doc`` nests containers deeper than ``limit`` (iterative: no recursion)."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node if isinstance(v, dict | list))
    return False


#: The fleet's name for a request's model (``Fleet.resolve`` bound to the state): an alias's
#: model, or for None (no model sent) the one model served; None: not known.
Resolve = Callable[[str | None], str | None]


def parse(raw: bytes, path: str, resolve: Resolve | None = None) -> Parsed:
    """Decode a request body (see ``_parse``); nesting deeper than ``MAX_DEPTH`` is a 400."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise errors.too_deep(MAX_DEPTH) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise errors.bad_json(str(e)) from None
    # Only a body with more brackets than the bound can nest past it: the walk is rare.
    if raw.count(b"{") + raw.count(b"[") > MAX_DEPTH and _depth_over(body, MAX_DEPTH):
        raise errors.too_deep(MAX_DEPTH)
    try:
        return _parse(body, raw, path, resolve)
    except RecursionError:  # a bound above the interpreter's own: still the client's 400
        raise errors.too_deep(MAX_DEPTH) from None


def _parse(body: Any, raw: bytes, path: str, resolve: Resolve | None = None) -> Parsed:
    """Decode a request body; malformed JSON or a missing model is a 400 in the client's shape.
    A streamed chat completion not asking for usage gets ``stream_options.include_usage`` set,
    so every request is metered; the tap strips the usage chunk from that client's stream."""
    if not isinstance(body, dict):
        raise errors.bad_json("expected a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise errors.wrong_type("model", "a string", model)
    sent = None
    if resolve is not None:
        name = resolve(model or None)
        if name is not None and name != model:
            sent, model = model or "", name
    if not model:
        raise errors.missing_model()
    ollama = path.startswith("/api/")
    # Ollama streams unless told not to; OpenAI routes only when asked.
    if ollama:
        stream = body.get("stream") is not False
    else:
        stream = body.get("stream") is True
    size = 0
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict):
                size += _text_bytes(m.get("content"))
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        size += len(prompt.encode("utf-8", "surrogatepass"))
    elif isinstance(prompt, list):
        size += sum(_text_bytes(p) for p in prompt)
    inputs = body.get("input")
    if inputs is not None:
        size += _text_bytes(inputs)
    # Anthropic's system prompt and a Responses request's instructions head the prompt too.
    head = body.get("system") if path == "/v1/messages" else (
        body.get("instructions") if path == "/v1/responses" else None)
    if head is not None:
        size += _text_bytes(head)
    tools = body.get("tools")
    if tools:
        size += len(json.dumps(tools))
    control = ollama and (
        (path == "/api/chat" and not messages) or (path == "/api/generate" and not prompt))
    asked = False
    insert = False
    if path == "/v1/chat/completions" and stream:
        options = body.get("stream_options")
        insert = "stream_options" not in body
        if not (isinstance(options, dict) and options.get("include_usage") is True):
            body = dict(body)
            body["stream_options"] = {**(options if isinstance(options, dict) else {}),
                                      "include_usage": True}
            asked = True
    links, why = _chain(path, model, body, messages, tools, prompt, control)
    user = body.get("user")
    return Parsed(model, (size + BYTES_PER_TOKEN - 1) // BYTES_PER_TOKEN, stream, body, asked,
                  control, raw, insert_usage=asked and insert, chain=links, unfollowed=why,
                  user=user if isinstance(user, str) and user else None,
                  max_tokens=output_limit(body, path), sent_model=sent)


#: Where each route family puts the output limit, in the order an engine reads them (OpenAI's
#: chat: ``max_completion_tokens`` over ``max_tokens``; Responses: ``max_output_tokens``;
#: Anthropic: ``max_tokens``, required; Ollama: ``options.num_predict``, -1 and -2: no limit).
def output_limit(body: dict[str, Any], path: str) -> int | None:
    """The most output tokens the client allows, or None when it sets no limit (a bad value
    is the engine's to refuse, and counts as none here)."""
    if path.startswith("/api/"):
        options = body.get("options")
        raw = options.get("num_predict") if isinstance(options, dict) else None
    elif path == "/v1/responses":
        raw = body.get("max_output_tokens")
    else:
        raw = body.get("max_completion_tokens")
        if raw is None:
            raw = body.get("max_tokens")
    if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0:
        return raw
    return None


def _chain(path: str, model: str, body: dict[str, Any], messages: Any, tools: Any, prompt: Any,
           control: bool) -> tuple[Chain, str | None]:
    """The prefix chain of a chained route, or why there is none."""
    if path not in CHAINED or control:
        return EMPTY, None
    if path == "/v1/messages" and isinstance(messages, list) and body.get("system") is not None:
        # Anthropic's system prompt is a field of its own; it heads the prompt all the same.
        messages = [{"role": "system", "content": body["system"]}, *messages]
    links = chain(model, messages, tools, None if isinstance(messages, list) else prompt)
    if links:
        return links, None
    return EMPTY, unfollowed(messages, prompt)
