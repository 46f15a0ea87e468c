"""``pharos doctor --record``: write what a live backend serves in the fixture format: every
path of ``RECORD_PATHS`` (404s included) and, with ``streams``, replies to fixed requests."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pharos.engine.capture import RECORD_PATHS, Recorded, RecordedReply, write_capture
from pharos.engine.fetch import FetchError, HTTPFetcher
from pharos.engine.library import OLLAMA

#: A prompt with nothing personal in it: captures are committed.
_PROMPT = "Count from one to five."
#: The Anthropic and Responses requests' system text: over one 32-token KV block, so the later
#: ones find it in the prefix cache and their replies show a cached count.
_SYSTEM = ("You are a careful counting assistant. Answer with the numbers only, written as "
           "words, separated by commas, in increasing order, with no other text before or "
           "after them, and stop after the last number you were asked for.")


def client_requests(kind: str, model: str) -> list[tuple[str, str, dict[str, Any]]]:
    """The replies a capture holds: (name, path, request body), streamed and not."""
    chat = {"model": model, "messages": [{"role": "user", "content": _PROMPT}],
            "max_tokens": 12, "temperature": 0}
    comp = {"model": model, "prompt": _PROMPT, "max_tokens": 12, "temperature": 0}
    reqs: list[tuple[str, str, dict[str, Any]]] = [
        ("chat", "/v1/chat/completions", {**chat, "stream": False}),
        ("chat_stream", "/v1/chat/completions", {**chat, "stream": True}),
        ("chat_stream_usage", "/v1/chat/completions",
         {**chat, "stream": True, "stream_options": {"include_usage": True}}),
        ("completion", "/v1/completions", {**comp, "stream": False}),
        ("completion_stream_usage", "/v1/completions",
         {**comp, "stream": True, "stream_options": {"include_usage": True}}),
        ("embeddings", "/v1/embeddings", {"model": model, "input": "one two three"}),
    ]
    # Anthropic Messages and OpenAI Responses, streamed and not (all but the first hit the cache)
    messages = {"model": model, "system": _SYSTEM, "messages": chat["messages"],
                "max_tokens": 12, "temperature": 0}
    responses = {"model": model, "instructions": _SYSTEM, "input": _PROMPT,
                 "max_output_tokens": 12, "temperature": 0}
    reqs += [
        ("messages", "/v1/messages", {**messages, "stream": False}),
        ("messages_stream", "/v1/messages", {**messages, "stream": True}),
        ("responses", "/v1/responses", {**responses, "stream": False}),
        ("responses_stream", "/v1/responses", {**responses, "stream": True}),
    ]
    if kind == OLLAMA:
        native = {"model": model, "options": {"num_predict": 12, "temperature": 0}}
        reqs += [
            ("api_chat", "/api/chat",
             {**native, "messages": chat["messages"], "stream": False}),
            ("api_chat_stream", "/api/chat", {**native, "messages": chat["messages"]}),
            ("api_generate_stream", "/api/generate", {**native, "prompt": _PROMPT}),
            ("api_embed", "/api/embed", {"model": model, "input": "one two three"}),
        ]
    return reqs


async def record(
    fetcher: HTTPFetcher,
    directory: Path,
    meta: Mapping[str, Any],
    streams_for: tuple[str, str] | None = None,
) -> Path:
    """Record the backend into ``directory``; ``streams_for`` = (kind, model) adds replies."""
    paths: dict[str, Recorded] = {}
    for path in RECORD_PATHS:
        try:
            got = await fetcher.fetch(path)
        except FetchError as e:
            paths[path] = Recorded(0, "", str(e).encode())
            continue
        paths[path] = Recorded(got.status, got.content_type, got.body)
    replies: list[RecordedReply] = []
    if streams_for is not None:
        kind, model = streams_for
        for name, path, body in client_requests(kind, model):
            req = json.dumps(body).encode()
            try:
                got = await fetcher.post(path, req, timeout=120)
            except FetchError as e:
                replies.append(RecordedReply(name, "POST", path, 0, "", req, str(e).encode()))
                continue
            replies.append(RecordedReply(name, "POST", path, got.status, got.content_type,
                                         req, got.body))
    full_meta = {"date": datetime.date.today().isoformat(), "capture": "live", **meta}
    write_capture(directory, full_meta, paths, tuple(replies))
    return directory
