"""Layer 4: real clients through Pharos to a real llama.cpp (``llama-server`` b11312 built from
source, the tiny generated GGUF; tests/live/engines), with a key: the OpenAI Python SDK's
chat, completions, embeddings and responses, the Anthropic Python SDK on ``/v1/messages``
(which llama.cpp serves), streamed and not, and Claude Code (``claude -p``) answering a prompt.
Live tests: skipped with ``PHAROS_LIVE=0`` (``make check``), and the engine is built the first
time otherwise (tests/live/conftest.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import pytest_twisted
from twisted.internet.threads import deferToThread

from pharos.config import Key
from pharos.proxy.auth import digest
from pharos.proxy.done import Done
from tests.live.engines import engines
from tests.support.clients import CLIENTS, SECRET, claude_code, node_version
from tests.support.fleet import start_fleet
from tests.support.live import ensure_installed

pytestmark = pytest.mark.live

#: llama.cpp's end-of-turn token in the generated GGUF (the tokenizer's third special token):
#: the model never picks it by itself, so Claude Code's engine is started with it favoured and
#: its turns end (stop_reason end_turn) instead of running to max_tokens.
IM_END = 2


@pytest.fixture(scope="module")
def llama() -> Iterator[engines.RunningEngine]:
    """llama-server with the tiny GGUF as ``tiny``, embeddings on, 2 slots."""
    ensure_installed("llamacpp")
    model = engines.gguf_tiny_model()
    assert model is not None
    with engines.start_llama_server(model, alias="tiny", ctx=8192,
                                    extra_args=("--embeddings", "--pooling", "mean")) as eng:
        yield eng


@pytest.fixture(scope="module")
def llama_ends_turns() -> Iterator[engines.RunningEngine]:
    """llama-server with the tiny GGUF, a context large enough for Claude Code's ~40 KB
    system prompt and tools, and the end-of-turn token favoured."""
    ensure_installed("llamacpp")
    model = engines.gguf_tiny_model()
    assert model is not None
    with engines.start_llama_server(model, alias="tiny", ctx=65536, parallel=1,
                                    extra_args=("--logit-bias", f"{IM_END}+100")) as eng:
        yield eng


async def through_pharos(engine: engines.RunningEngine,
                         run: Callable[[str], Any]) -> tuple[Any, list[Done]]:
    """``run(pharos_url)`` in a thread with Pharos (a key configured) in front of ``engine``;
    what it returned and the requests Pharos finished."""
    fleet = await start_fleet([], extra=[engine.url],
                              keys=(Key(name="team", sha256=digest(SECRET)),))
    dones: list[Done] = []
    fleet.pharos.public.on_done.append(dones.append)
    try:
        got = await deferToThread(run, fleet.url)
    finally:
        await fleet.stop()
    return got, dones


def openai_calls(url: str) -> dict[str, Any]:
    api = openai.OpenAI(base_url=url + "/v1", api_key=SECRET, max_retries=0)
    msgs: Any = [{"role": "user", "content": "Hello"}]
    out: dict[str, Any] = {
        "chat": api.chat.completions.create(model="tiny", messages=msgs, max_tokens=8),
        "stream": list(api.chat.completions.create(model="tiny", messages=msgs, max_tokens=8,
                                                   stream=True)),
        "completion": api.completions.create(model="tiny", prompt="Once upon", max_tokens=8),
        "embedding": api.embeddings.create(model="tiny", input=["Hello", "Grüße"]),
        "responses": api.responses.create(model="tiny", input="Hello", max_output_tokens=16),
        "responses_stream": list(api.responses.create(model="tiny", input="Hello",
                                                      max_output_tokens=16, stream=True)),
    }
    api.close()
    return out


@pytest_twisted.ensureDeferred
async def test_openai_python_sdk_on_llamacpp(llama: engines.RunningEngine) -> None:
    """The OpenAI Python SDK through Pharos to llama.cpp: chat plain and streamed (no usage
    chunk, metered all the same), completions, embeddings of two inputs, responses plain and
    streamed; every request routed to llama.cpp and its prompt tokens counted."""
    got, dones = await through_pharos(llama, openai_calls)
    assert got["chat"].choices[0].message.content and got["chat"].usage.prompt_tokens > 0
    assert all(c.usage is None for c in got["stream"])
    assert "".join(c.choices[0].delta.content or "" for c in got["stream"] if c.choices)
    assert got["completion"].choices[0].text
    vectors = [d.embedding for d in got["embedding"].data]
    assert len(vectors) == 2 and len(vectors[0]) == len(vectors[1]) > 0
    assert got["responses"].output_text and got["responses"].usage.input_tokens > 0
    assert got["responses_stream"][-1].type == "response.completed"
    routes = [d.route for d in dones]
    assert routes == ["/v1/chat/completions"] * 2 + ["/v1/completions", "/v1/embeddings"] + \
        ["/v1/responses"] * 2
    assert all(d.status == 200 and d.target == llama.url for d in dones), dones
    assert all(d.prompt_tokens for d in dones if d.route != "/v1/embeddings"), dones
    assert ("usage", "pharos_asked") in dones[1].decisions and dones[1].metered


def anthropic_calls(url: str) -> dict[str, Any]:
    api = anthropic.Anthropic(base_url=url, api_key=SECRET, max_retries=0)
    msgs: Any = [{"role": "user", "content": "Hello"}]
    out: dict[str, Any] = {"plain": api.messages.create(model="tiny", max_tokens=16,
                                                        system="Be brief.", messages=msgs)}
    with api.messages.stream(model="tiny", max_tokens=16, system="Be brief.",
                             messages=msgs) as stream:
        out["text"] = "".join(stream.text_stream)
        out["final"] = stream.get_final_message()
    turn2: Any = [*msgs, {"role": "assistant", "content": out["plain"].content[0].text},
                  {"role": "user", "content": "And then?"}]
    out["turn2"] = api.messages.create(model="tiny", max_tokens=16, system="Be brief.",
                                       messages=turn2)
    api.close()
    return out


@pytest_twisted.ensureDeferred
async def test_anthropic_python_sdk_on_llamacpp(llama: engines.RunningEngine) -> None:
    """The Anthropic Python SDK through Pharos to llama.cpp's /v1/messages: plain, streamed
    (text events and a final message with usage), and a second turn predicted from the
    first's prefix on the same engine; all metered."""
    got, dones = await through_pharos(llama, anthropic_calls)
    assert got["plain"].content[0].text and got["plain"].usage.input_tokens > 0
    assert got["text"] and got["final"].usage.output_tokens > 0
    assert got["turn2"].content[0].text
    assert [d.route for d in dones] == ["/v1/messages"] * 3
    assert all(d.status == 200 and d.metered and d.prompt_tokens for d in dones), dones
    assert dones[2].predicted_tokens > 0 and dones[2].target == dones[0].target


@pytest_twisted.ensureDeferred
async def test_claude_code_on_llamacpp(llama_ends_turns: engines.RunningEngine,
                                       tmp_path: Path) -> None:
    """Claude Code (``claude -p``) with ANTHROPIC_BASE_URL at Pharos and a llama.cpp backend
    that ends its turns (the end-of-turn token comes first, so the answer is empty): it exits
    0 having sent only /v1/messages, each routed to llama.cpp and metered, the first carrying
    its thousands of prompt tokens (system prompt and tools)."""
    node_version("@anthropic-ai/claude-code")
    (code, out, err), dones = await through_pharos(
        llama_ends_turns, claude_code("Say hello", tmp_path))
    assert code == 0, (code, out, err[-3000:])
    assert dones and all(d.route == "/v1/messages" and d.status == 200 for d in dones), dones
    assert all(d.target == llama_ends_turns.url and d.metered and d.prompt_tokens
               for d in dones), dones
    assert dones[0].prompt_tokens and dones[0].prompt_tokens > 1000  # its prompt and tools


def test_live_clients_use_the_pinned_versions() -> None:
    """The live tests run the versions the captures were recorded with (docs/clients.rst)."""
    lock = json.loads((CLIENTS / "package-lock.json").read_text())
    pinned = lock["packages"]["node_modules/@anthropic-ai/claude-code"]["version"]
    assert node_version("@anthropic-ai/claude-code") == pinned
