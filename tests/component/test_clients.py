"""Layer 3: the clients users point at Pharos work unchanged: the OpenAI Python SDK (streamed
and not) and the ``ollama`` Python client, against the demo's fleet of engine doubles."""

from __future__ import annotations

from typing import Any

import ollama
import openai
import pytest_twisted
from twisted.internet.threads import deferToThread

from tests.component.fleet import start_fleet

LLAMA = "llama3.2:3b"


@pytest_twisted.ensureDeferred
async def test_openai_sdk_streamed_and_not() -> None:
    """openai.OpenAI against Pharos: a plain chat, a streamed chat (no usage chunk unless
    asked), model listing, and a 404 the SDK raises as NotFoundError."""
    fleet = await start_fleet([("ollama", {"loaded": [LLAMA]}, {"kind": "ollama"}),
                               ("vllm", {}, {"kind": "vllm"})])
    client = openai.OpenAI(base_url=fleet.url + "/v1", api_key="unused", max_retries=0)

    def run() -> dict[str, Any]:
        msgs: Any = [{"role": "user", "content": "Hello"}]
        plain = client.chat.completions.create(model="tiny", messages=msgs,
                                               max_tokens=5)
        chunks = list(client.chat.completions.create(model=LLAMA, messages=msgs,
                                                     max_tokens=5, stream=True))
        usage_chunks = list(client.chat.completions.create(
            model=LLAMA, messages=msgs, max_tokens=5, stream=True,
            stream_options={"include_usage": True}))
        models = [m.id for m in client.models.list()]
        try:
            client.chat.completions.create(model="nope", messages=msgs)
            missing = "no error"
        except openai.NotFoundError as e:
            missing = str(e.code)
        return {"plain": plain, "chunks": chunks, "usage": usage_chunks, "models": models,
                "missing": missing}

    try:
        got: dict[str, Any] = await deferToThread(run)
    finally:
        client.close()
        await fleet.stop()
    plain = got["plain"]
    assert plain.choices[0].message.content
    assert plain.usage.prompt_tokens > 0
    chunks = got["chunks"]
    assert chunks and all(c.usage is None for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks
                   if c.choices)
    assert got["usage"][-1].usage.completion_tokens > 0
    assert {"tiny", LLAMA} <= set(got["models"])
    assert got["missing"] == "model_not_found"


@pytest_twisted.ensureDeferred
async def test_ollama_client() -> None:
    """ollama.Client against Pharos: chat streamed and not, generate, list, version."""
    fleet = await start_fleet([("ollama", {"loaded": [LLAMA]}, {"kind": "ollama"})])
    client = ollama.Client(host=fleet.url)

    def run() -> dict[str, Any]:
        msgs: Any = [{"role": "user", "content": "Hello"}]
        chat = client.chat(model=LLAMA, messages=msgs, options={"num_predict": 5})
        parts = list(client.chat(model=LLAMA, messages=msgs, stream=True,
                                 options={"num_predict": 5}))
        gen = client.generate(model=LLAMA, prompt="Hello", options={"num_predict": 5})
        listed = [m.model for m in client.list().models]
        return {"chat": chat, "parts": parts, "gen": gen, "listed": listed}

    try:
        got: dict[str, Any] = await deferToThread(run)
    finally:
        await fleet.stop()
    assert got["chat"].message.content
    assert got["chat"].done
    parts = got["parts"]
    assert parts[-1].done and parts[-1].eval_count
    assert got["gen"].response
    assert LLAMA in got["listed"]


KEY = "phk-team-key"


async def keyed_fleet() -> Any:
    from pharos.config import Key
    from pharos.proxy.auth import digest

    return await start_fleet([("ollama", {"loaded": [LLAMA]}, {"kind": "ollama"})],
                             keys=(Key(name="team", sha256=digest(KEY), rpm=4,
                                       models=(LLAMA,)),))


@pytest_twisted.ensureDeferred
async def test_openai_sdk_with_keys() -> None:
    """With keys configured the SDK's api_key is the key: a right key chats and lists only
    its models, a wrong one raises AuthenticationError, a model outside the list
    PermissionDeniedError, and past its RPM RateLimitError (status 429 with Retry-After)."""
    fleet = await keyed_fleet()
    good = openai.OpenAI(base_url=fleet.url + "/v1", api_key=KEY, max_retries=0)
    bad = openai.OpenAI(base_url=fleet.url + "/v1", api_key="phk-guess", max_retries=0)

    def run() -> dict[str, Any]:
        msgs: Any = [{"role": "user", "content": "Hello"}]
        out: dict[str, Any] = {}
        out["reply"] = good.chat.completions.create(model=LLAMA, messages=msgs, max_tokens=5)
        out["models"] = [m.id for m in good.models.list()]
        for name, call in (("wrong", lambda: bad.chat.completions.create(
                                model=LLAMA, messages=msgs, max_tokens=5)),
                           ("other", lambda: good.chat.completions.create(
                               model="tiny", messages=msgs, max_tokens=5))):
            try:
                call()
                out[name] = None
            except openai.APIStatusError as e:
                out[name] = e
        errors = []
        for _ in range(4):
            try:
                good.chat.completions.create(model=LLAMA, messages=msgs, max_tokens=5)
            except openai.APIStatusError as e:
                errors.append(e)
        out["limited"] = errors
        return out

    try:
        got: dict[str, Any] = await deferToThread(run)
    finally:
        await fleet.stop()
    assert got["reply"].choices[0].message.content
    assert got["models"] == [LLAMA]
    assert isinstance(got["wrong"], openai.AuthenticationError)
    assert isinstance(got["other"], openai.PermissionDeniedError)
    assert got["other"].code == "model_not_allowed"
    (limited,) = got["limited"]  # 1 + 3 of the 4 fit the 4 a minute
    assert isinstance(limited, openai.RateLimitError) and limited.code == "rate_limited"
    assert int(limited.response.headers["retry-after"]) >= 1


@pytest_twisted.ensureDeferred
async def test_ollama_client_with_keys() -> None:
    """The ollama client sends the key as a header: with it, chat and list work; without
    it, the client raises ResponseError 401 carrying Pharos's message."""
    fleet = await keyed_fleet()
    keyed = ollama.Client(host=fleet.url, headers={"Authorization": f"Bearer {KEY}"})
    bare = ollama.Client(host=fleet.url)

    def run() -> dict[str, Any]:
        msgs: Any = [{"role": "user", "content": "Hello"}]
        out: dict[str, Any] = {"chat": keyed.chat(model=LLAMA, messages=msgs,
                                                  options={"num_predict": 5}),
                               "listed": [m.model for m in keyed.list().models]}
        try:
            bare.chat(model=LLAMA, messages=msgs)
            out["bare"] = None
        except ollama.ResponseError as e:
            out["bare"] = e
        return out

    try:
        got: dict[str, Any] = await deferToThread(run)
    finally:
        await fleet.stop()
    assert got["chat"].message.content and got["listed"] == [LLAMA]
    assert got["bare"].status_code == 401 and "API key" in got["bare"].error
