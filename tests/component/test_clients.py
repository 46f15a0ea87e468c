"""Layer 3: the clients users point at Pharos work unchanged, each pinned (setup.cfg extra
``test``; tests/clients/package-lock.json): the OpenAI Python and Node SDKs, the ollama Python
and JS clients, LangChain's ChatOpenAI, the Anthropic Python SDK and Claude Code, with a key,
streamed and not, against an Ollama-like engine double and llama.cpp's recorded replies. Each
``*_capture`` test records what its client sent through a sink in front of Pharos and fails
with the diff against the committed capture in tests/clients/<client>/<version>/
(docs/clients.rst); ``PHAROS_RECORD_CLIENTS=1`` re-records. test_clients_replay.py replays
the captures, test_clients_live.py runs the clients against a real llama.cpp."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import ollama
import openai
import pytest_twisted
from twisted.internet.threads import deferToThread

from tests.support.clients import CLIENTS, SECRET, claude_code, node_version
from tests.support.fleet import start_fleet
from tests.support.recorded_engine import start_recorded_llamacpp
from tests.support.sink import Call, Recorder, compare

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


# --- each client driven through a recording sink, its capture compared (issue 18 items 4-5) ---

#: An Ollama-like double holding LLAMA, and llama.cpp's recorded replies as "tiny" (the doubles
#: serve no /v1/messages or /v1/responses; recorded_engine.py does).
ENGINES: Any = [("ollama", {"loaded": [LLAMA]}, {"kind": "ollama"})]
NODE = shutil.which("node")
HOW = "tests/component/test_clients.py with PHAROS_RECORD_CLIENTS=1"


async def recorded(run: Callable[[str], Any], client: str, version: str,
                   engines: Any = None, scrub: Any = ()) -> tuple[Any, str, list[Call]]:
    """``run(pharos_url)`` in a thread against the demo-like fleet with a key configured and a
    recording sink in front of Pharos; what it returned, the diff of its calls against the
    committed capture of ``client`` ``version`` ("" when the same), and the calls."""
    from pharos.config import Key
    from pharos.proxy.auth import digest

    engine, url = start_recorded_llamacpp()
    fleet = await start_fleet(engines or ENGINES, extra=[url],
                              keys=(Key(name="team", sha256=digest(SECRET)),))
    fleet.ports.append(engine)
    recorder = Recorder.around(fleet.ports[-2].factory,  # type: ignore[attr-defined]
                               keys=(SECRET,), extra_scrub=scrub)
    try:
        got = await deferToThread(run, fleet.url)
    finally:
        await fleet.stop()
    return got, compare(client, version, recorder.calls, HOW), recorder.calls


def run_node(client: str) -> Callable[[str], Any]:
    """A runner for ``tests/clients/node/drive.mjs CLIENT``: its JSON output."""
    def run(url: str) -> Any:
        assert NODE is not None, "node is not installed"
        r = subprocess.run([NODE, str(CLIENTS / "node" / "drive.mjs"), client, url, SECRET],
                           capture_output=True, text=True, timeout=120, cwd=CLIENTS)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout)
    return run


def paths(calls: list[Call]) -> list[str]:
    return [f"{c.method} {c.path}" for c in calls]


HELLO: Any = [{"role": "user", "content": "Hello"}]
#: Every driver's second turn: non-ASCII text, so a capture shows whether the client sends it
#: as \\uXXXX escapes or raw UTF-8 (spec §14: escaped text once broke prefix feedback).
NEXT = "And then? Grüße, 你好"


def openai_python(url: str) -> dict[str, Any]:
    """The OpenAI Python SDK's calls (the Node driver makes the same ones)."""
    api = openai.OpenAI(base_url=url + "/v1", api_key=SECRET, max_retries=0)
    out: dict[str, Any] = {"models": [m.id for m in api.models.list()]}
    plain = api.chat.completions.create(model=LLAMA, messages=HELLO, max_tokens=5)
    out["plain"] = plain
    out["stream"] = list(api.chat.completions.create(model=LLAMA, messages=HELLO,
                                                     max_tokens=5, stream=True))
    out["stream_usage"] = list(api.chat.completions.create(
        model=LLAMA, messages=HELLO, max_tokens=5, stream=True,
        stream_options={"include_usage": True}))
    turn2: Any = [*HELLO, {"role": "assistant", "content": plain.choices[0].message.content},
                  {"role": "user", "content": NEXT}]
    out["turn2"] = api.chat.completions.create(model=LLAMA, messages=turn2, max_tokens=5)
    out["completion"] = api.completions.create(model=LLAMA, prompt="Once upon", max_tokens=5)
    out["responses"] = api.responses.create(model="tiny", input="Hello", max_output_tokens=16)
    out["responses_stream"] = [e.type for e in api.responses.create(
        model="tiny", input="Hello", max_output_tokens=16, stream=True)]
    try:
        api.chat.completions.create(model="nope", messages=HELLO)
        out["missing"] = None
    except openai.NotFoundError as e:
        out["missing"] = e.code
    bad = openai.OpenAI(base_url=url + "/v1", api_key="phk-guess", max_retries=0)
    try:
        bad.chat.completions.create(model=LLAMA, messages=HELLO)
        out["wrong_key"] = None
    except openai.AuthenticationError as e:
        out["wrong_key"] = e.status_code
    api.close()
    bad.close()
    return out


@pytest_twisted.ensureDeferred
async def test_openai_python_sdk_capture() -> None:
    """The OpenAI Python SDK with a key: models, chat plain, streamed (no usage chunk unless
    asked, then one), a second turn, completions, responses plain and streamed, a 404 for an
    unknown model and a 401 for a wrong key; what it sent equals its committed capture."""
    version = importlib.metadata.version("openai")
    got, diff, calls = await recorded(openai_python, "openai-python", version)
    assert {LLAMA, "tiny"} <= set(got["models"])
    assert got["plain"].choices[0].message.content and got["plain"].usage.prompt_tokens > 0
    assert all(c.usage is None for c in got["stream"])
    assert got["stream_usage"][-1].usage.completion_tokens > 0
    assert got["turn2"].choices[0].message.content
    assert got["completion"].choices[0].text
    assert got["responses"].output_text and got["responses"].usage.input_tokens > 0
    assert got["responses_stream"][-1] == "response.completed"
    assert got["missing"] == "model_not_found" and got["wrong_key"] == 401
    assert "POST /v1/responses" in paths(calls)
    assert not diff, diff


@pytest_twisted.ensureDeferred
async def test_openai_node_sdk_capture() -> None:
    """The OpenAI Node SDK (npm ``openai``, pinned in tests/clients/package.json) with a key:
    the same calls as the Python SDK, the same answers, and its committed capture."""
    got, diff, calls = await recorded(run_node("openai"), "openai-node", node_version("openai"))
    assert {LLAMA, "tiny"} <= set(got["models"])
    assert got["plain"]["content"] and got["plain"]["usage"]["prompt_tokens"] > 0
    assert got["stream"]["text"] and got["stream"]["usage_chunks"] == 0
    assert got["stream_usage"]["completion_tokens"] > 0
    assert got["turn2"] and got["completion"]
    assert got["responses"]["text"] and got["responses"]["usage"]["input_tokens"] > 0
    assert got["responses_stream"][-1] == "response.completed"
    assert got["missing"]["status"] == 404 and got["missing"]["code"] == "model_not_found"
    assert got["wrong_key"]["status"] == 401
    assert not diff, diff


def ollama_python(url: str) -> dict[str, Any]:
    """The ollama Python client's calls (the JS driver makes the same ones)."""
    api = ollama.Client(host=url, headers={"Authorization": f"Bearer {SECRET}"})
    out: dict[str, Any] = {"listed": [m.model for m in api.list().models]}
    chat = api.chat(model=LLAMA, messages=HELLO, options={"num_predict": 5})
    out["chat"] = chat
    out["stream"] = list(api.chat(model=LLAMA, messages=HELLO, stream=True,
                                  options={"num_predict": 5}))
    turn2: Any = [*HELLO, {"role": "assistant", "content": chat.message.content},
                  {"role": "user", "content": NEXT}]
    out["turn2"] = api.chat(model=LLAMA, messages=turn2, options={"num_predict": 5})
    out["generate"] = api.generate(model=LLAMA, prompt="Once upon", options={"num_predict": 5})
    out["generate_stream"] = list(api.generate(model=LLAMA, prompt="Once upon", stream=True,
                                               options={"num_predict": 5}))
    try:
        ollama.Client(host=url).chat(model=LLAMA, messages=HELLO)
        out["no_key"] = None
    except ollama.ResponseError as e:
        out["no_key"] = e.status_code
    return out


@pytest_twisted.ensureDeferred
async def test_ollama_python_capture() -> None:
    """The ollama Python client with a key header: list, chat plain and streamed, a second
    turn, generate plain and streamed, 401 without the key; its committed capture."""
    got, diff, _ = await recorded(ollama_python, "ollama-python",
                                  importlib.metadata.version("ollama"))
    assert LLAMA in got["listed"]
    assert got["chat"].message.content and got["chat"].prompt_eval_count
    assert got["stream"][-1].done and got["stream"][-1].eval_count
    assert got["turn2"].message.content and got["generate"].response
    assert got["generate_stream"][-1].done
    assert got["no_key"] == 401
    assert not diff, diff


@pytest_twisted.ensureDeferred
async def test_ollama_js_capture() -> None:
    """The ollama JS client (npm ``ollama``) with a key header: version, list, chat plain and
    streamed, a second turn, generate plain and streamed, 401 without the key; its capture."""
    got, diff, _ = await recorded(run_node("ollama"), "ollama-js", node_version("ollama"))
    assert got["version"] and LLAMA in got["listed"]
    assert got["chat"]["content"] and got["chat"]["done"] and got["chat"]["prompt_eval_count"]
    assert got["stream"]["text"] and got["stream"]["done"] and got["stream"]["eval_count"]
    assert got["turn2"] and got["generate"] and got["generate_stream_done"]
    assert got["no_key"]["status"] == 401
    assert not diff, diff


def langchain_openai(url: str) -> dict[str, Any]:
    """LangChain's ChatOpenAI: invoke, stream, a second turn."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(model=LLAMA, base_url=url + "/v1", api_key=SECRET,  # type: ignore[arg-type]
                      max_tokens=5, max_retries=0)  # type: ignore[call-arg]
    first = chat.invoke([HumanMessage("Hello")])
    parts = list(chat.stream([HumanMessage("Hello")]))
    second = chat.invoke([HumanMessage("Hello"), AIMessage(str(first.content)),
                          HumanMessage(NEXT)])
    return {"first": first, "parts": parts, "second": second}


@pytest_twisted.ensureDeferred
async def test_langchain_chatopenai_capture() -> None:
    """LangChain's ChatOpenAI with a key: invoke (usage metadata filled), stream (the text and
    the usage LangChain asks for), a second turn; its committed capture."""
    version = importlib.metadata.version("langchain-openai")
    got, diff, _ = await recorded(langchain_openai, "langchain-openai", version)
    assert got["first"].content and got["first"].usage_metadata["input_tokens"] > 0
    assert "".join(str(p.content) for p in got["parts"])
    assert got["second"].content
    assert not diff, diff


def anthropic_python(url: str, model: str = "tiny") -> dict[str, Any]:
    """The Anthropic Python SDK's calls on /v1/messages (this version sends its key as
    ``Authorization: Bearer``, not ``x-api-key``)."""
    api = anthropic.Anthropic(base_url=url, api_key=SECRET, max_retries=0)
    msgs: Any = [{"role": "user", "content": "Hello"}]
    out: dict[str, Any] = {"plain": api.messages.create(model=model, max_tokens=16,
                                                        system="Be brief.", messages=msgs)}
    with api.messages.stream(model=model, max_tokens=16, messages=msgs) as stream:
        out["text"] = "".join(stream.text_stream)
        out["final"] = stream.get_final_message()
    turn2: Any = [*msgs, {"role": "assistant", "content": out["plain"].content[0].text},
                  {"role": "user", "content": NEXT}]
    out["turn2"] = api.messages.create(model=model, max_tokens=16, system="Be brief.",
                                       messages=turn2)
    bad = anthropic.Anthropic(base_url=url, api_key="phk-guess", max_retries=0)
    try:
        bad.messages.create(model=model, max_tokens=16, messages=msgs)
        out["wrong_key"] = None
    except anthropic.AuthenticationError as e:
        out["wrong_key"] = e.status_code
    api.close()
    bad.close()
    return out


@pytest_twisted.ensureDeferred
async def test_anthropic_python_capture() -> None:
    """The Anthropic Python SDK on /v1/messages with its key (sent as ``Authorization:
    Bearer``; against llama.cpp's recorded /v1/messages replies, the doubles serving no such
    route; the live llama.cpp run is in test_clients_live.py): plain and a second turn with a
    system prompt, streamed, 401 for a wrong key; its committed capture."""
    version = importlib.metadata.version("anthropic")
    got, diff, _ = await recorded(anthropic_python, "anthropic-python", version)
    assert got["plain"].content[0].text and got["plain"].usage.input_tokens > 0
    assert got["text"] and got["final"].usage.output_tokens > 0
    assert got["turn2"].content
    assert got["wrong_key"] == 401
    assert not diff, diff


#: What Claude Code fills in from the machine: its device id, the kernel in its system prompt.
CLAUDE_SCRUB = ((re.compile(r"\b[0-9a-f]{64}\b"), "<DEVICE-ID>"),
                (re.compile(r"OS Version: [^\\\n\"]*"), "OS Version: <OS>"))


@pytest_twisted.ensureDeferred
async def test_claude_code_capture(tmp_path: Path) -> None:
    """Claude Code (``claude -p``) through Pharos on llama.cpp's recorded /v1/messages stream
    with its key in x-api-key: every request is a streamed POST /v1/messages?beta=true with
    its tools and beta headers, Pharos relays the stream whole (Claude Code reads the recorded
    ``stop_reason: max_tokens`` and, after retrying with a higher limit, reports it: the
    recorded model never ends a turn; test_clients_live.py has it answer), and what it sent
    equals its committed capture."""
    version = node_version("@anthropic-ai/claude-code")
    (code, out, err), diff, calls = await recorded(
        claude_code("Say hello", tmp_path), "claude-code", version, scrub=CLAUDE_SCRUB)
    assert code == 1 and "output token maximum" in out, (code, out, err[-2000:])
    assert calls and all(c.method == "POST" and c.path == "/v1/messages" and
                         c.query == "beta=true" and c.status == 200 for c in calls), paths(calls)
    first = calls[0]
    assert first.headers["x-api-key"] == "<KEY>" and "authorization" not in first.headers
    assert first.json()["stream"] is True and first.json()["tools"]
    assert not diff, diff
