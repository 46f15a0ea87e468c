"""Benchmark workloads: determinism, arrival statistics and the shape of W1-W4, W6, mix, hot
and multi-model."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import re
import statistics
import subprocess
import sys
from collections import Counter

import pytest

from pharos.bench.workloads import (
    BYTES_PER_TOKEN,
    WORKLOADS,
    Request,
    gamma,
    generate,
    hot,
    mix,
    multi_model,
    poisson,
    shared_prefix_ratio,
    w1_shared_system,
    w2_chat,
    w3_agent,
    w4_rag,
    w6_unique,
)
from pharos.sim.prompt import CHAT, prompt_text


def dump(requests: list[Request]) -> list[str]:
    return [json.dumps([r.at, r.session, r.tag, r.body()], sort_keys=True) for r in requests]


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_same_seed_same_requests(name: str) -> None:
    """The same seed gives the same requests, byte for byte, sorted by send time and within
    the duration; another seed gives different ones."""
    first = generate(name, 7, 4.0, 60.0)
    again = generate(name, 7, 4.0, 60.0)
    other = generate(name, 8, 4.0, 60.0)
    assert first, name
    assert dump(first) == dump(again)
    assert dump(first) != dump(other)
    times = [r.at for r in first]
    assert times == sorted(times)
    assert all(0.0 <= t < 60.0 for t in times)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_bodies_are_streamed_json(name: str) -> None:
    """Every body is JSON-serializable, streamed with a usage chunk, with string contents and
    a positive max_tokens; the tag names the workload."""
    for request in generate(name, 3, 3.0, 40.0):
        body = json.loads(json.dumps(request.body()))
        assert body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert body["model"] == request.model
        assert body["max_tokens"] == request.max_tokens > 0
        assert all(isinstance(m["content"], str) for m in body["messages"])
        assert request.tag.split("/")[0] == name
        assert request.prompt_bytes() == len(prompt_text(CHAT, body))


def test_body_is_a_copy() -> None:
    """Changing a body leaves the request unchanged."""
    request = generate("w3", 1, 2.0, 30.0)[0]
    body = request.body()
    body["messages"][0]["content"] = "changed"
    body["tools"][0]["function"]["name"] = "changed"
    assert request.body() != body


def test_poisson_rate_and_window() -> None:
    """Poisson arrivals fall in [0, duration), sorted, at the chosen mean rate, with
    exponential gaps (CV close to 1)."""
    times = poisson(20.0, 2000.0, random.Random(1))
    assert times == sorted(times)
    assert times[0] >= 0.0 and times[-1] < 2000.0
    assert len(times) / 2000.0 == pytest.approx(20.0, rel=0.03)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0, 4.0])
def test_gamma_rate_and_cv(cv: float) -> None:
    """Gamma arrivals keep the mean rate and have gaps of the chosen coefficient of
    variation."""
    times = gamma(10.0, cv, 5000.0, random.Random(2))
    assert times == sorted(times)
    assert times[0] >= 0.0 and times[-1] < 5000.0
    assert len(times) / 5000.0 == pytest.approx(10.0, rel=0.1)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, rel=0.1)


def test_arrival_arguments() -> None:
    """Bad rates, durations, CVs and arrival names are refused; no duration, no arrivals."""
    rng = random.Random(0)
    assert poisson(5.0, 0.0, rng) == []
    with pytest.raises(ValueError):
        poisson(0.0, 10.0, rng)
    with pytest.raises(ValueError):
        gamma(1.0, 0.0, 10.0, rng)
    with pytest.raises(ValueError):
        generate("w1", 1, 1.0, 10.0, arrivals="uniform")
    with pytest.raises(ValueError):
        generate("w1", 1, 1.0, 10.0, cv=3.0)  # a CV without Gamma arrivals
    with pytest.raises(ValueError):
        generate("w5", 1, 1.0, 10.0)


def test_workloads_take_gamma_arrivals() -> None:
    """Any workload can arrive in Gamma bursts; the mean rate is kept."""
    requests = w1_shared_system(
        5, 10.0, 1500.0, arrivals="gamma", cv=3.0, prompt_tokens=(20, 40), question_tokens=(5, 10)
    )
    assert len(requests) / 1500.0 == pytest.approx(10.0, rel=0.2)
    gaps = [b.at - a.at for a, b in itertools.pairwise(requests)]
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) > 2.0


def test_w1_shared_system_prompts() -> None:
    """W1: every request is one of the N system prompts (2k-8k tokens at 4 bytes a token,
    byte-identical wherever shared, differing from their first bytes) and a 50-500 token
    question of its own; users pick prompts about uniformly; most prompt bytes are shared."""
    requests = w1_shared_system(11, 10.0, 300.0, prompts=6)
    systems = Counter(r.messages[0]["content"] for r in requests)
    assert len(systems) == 6
    for system in systems:
        assert system.isascii()
        assert 2000 * BYTES_PER_TOKEN <= len(system.encode()) <= 8000 * BYTES_PER_TOKEN
        assert len(system) % BYTES_PER_TOKEN == 0
    firsts = {s[:8] for s in systems}
    assert len(firsts) == 6
    assert min(systems.values()) > len(requests) / 6 / 2
    questions = [r.messages[1]["content"] for r in requests]
    assert len(set(questions)) == len(questions)
    assert all(50 * 4 <= len(q) <= 500 * 4 for q in questions)
    assert all([m["role"] for m in r.messages] == ["system", "user"] for r in requests)
    assert all(r.session is None and r.tools is None for r in requests)
    assert shared_prefix_ratio(requests) > 0.8


def test_hot_prompts_are_zipf() -> None:
    """hot: the same shape as W1, but the most popular system prompt takes far more requests
    than the least, ranked by Zipf weight."""
    requests = hot(12, 20.0, 300.0, prompts=8, exponent=1.1)
    systems = Counter(r.messages[0]["content"] for r in requests)
    counts = [n for _, n in systems.most_common()]
    assert counts[0] > 0.25 * len(requests)
    assert counts[0] > 5 * counts[-1]
    uniform = Counter(r.messages[0]["content"] for r in w1_shared_system(12, 20.0, 300.0))
    assert max(uniform.values()) < 0.25 * sum(uniform.values())


def test_w2_sessions_resend_history() -> None:
    """W2: each turn of a session resends the previous turn's messages, then the assistant's
    reply (as long as that turn's max_tokens) and a new question; turns come later, think
    times are not negative, and each session is named in x-session-id."""
    requests = w2_chat(21, 8.0, 300.0, turns=(3, 6), think=15.0)
    sessions: dict[str, list[Request]] = {}
    for request in requests:
        assert request.session is not None
        assert request.headers() == {"x-session-id": request.session}
        sessions.setdefault(request.session, []).append(request)
    assert len(sessions) > 20
    assert max(len(turns) for turns in sessions.values()) >= 3
    gaps = []
    for turns in sessions.values():
        assert len(turns) <= 6
        for before, after in itertools.pairwise(turns):
            gaps.append(after.at - before.at)
            n = len(before.messages)
            assert after.messages[:n] == before.messages
            assert len(after.messages) == n + 2
            reply, question = after.messages[n:]
            assert reply["role"] == "assistant" and question["role"] == "user"
            assert len(reply["content"]) == before.max_tokens * BYTES_PER_TOKEN
            assert after.prompt_bytes() > before.prompt_bytes()
    assert min(gaps) >= 0.0
    assert statistics.fmean(gaps) == pytest.approx(15.0, rel=0.25)
    assert shared_prefix_ratio(requests) > 0.4


def test_w2_request_rate() -> None:
    """W2's request rate approaches the asked rate once sessions overlap."""
    requests = w2_chat(22, 10.0, 2000.0)
    steady = [r for r in requests if 200.0 <= r.at < 1800.0]
    assert len(steady) / 1600.0 == pytest.approx(10.0, rel=0.15)


def test_w2_min_think() -> None:
    """With min_think every gap between turns is at least that long and the mean stays at
    think; min_think above think is refused."""
    requests = w2_chat(24, 8.0, 400.0, think=15.0, min_think=10.0, reply_tokens=(5, 10))
    sessions: dict[str | None, list[float]] = {}
    for request in requests:
        sessions.setdefault(request.session, []).append(request.at)
    gaps = [b - a for times in sessions.values() for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 10.0
    assert statistics.fmean(gaps) == pytest.approx(15.0, rel=0.15)
    with pytest.raises(ValueError):
        w2_chat(24, 8.0, 10.0, think=5.0, min_think=6.0)


def test_w2_shared_system_prompt() -> None:
    """With system_tokens every W2 session starts with the same system prompt."""
    requests = w2_chat(23, 4.0, 100.0, system_tokens=500)
    systems = {r.messages[0]["content"] for r in requests}
    assert len(systems) == 1
    assert len(next(iter(systems))) == 500 * BYTES_PER_TOKEN


def test_w3_agents_grow_over_shared_tools() -> None:
    """W3: every agent sends the same tool definitions; each step resends the previous
    context plus an assistant tool call and its tool result."""
    requests = w3_agent(31, 3.0, 300.0)
    tools = {json.dumps(r.tools) for r in requests}
    assert len(tools) == 1
    agents: dict[str, list[Request]] = {}
    for request in requests:
        assert request.session is not None and request.tools
        agents.setdefault(request.session, []).append(request)
    assert len(agents) > 10
    names = {t["function"]["name"] for t in requests[0].tools or ()}
    for steps in agents.values():
        assert steps[0].messages[0]["role"] == "system"
        assert steps[0].messages[1]["role"] == "user"
        for before, after in itertools.pairwise(steps):
            n = len(before.messages)
            assert after.messages[:n] == before.messages
            call, result = after.messages[n:]
            assert call["role"] == "assistant" and result["role"] == "tool"
            (tool_call,) = call["tool_calls"]
            assert tool_call["function"]["name"] in names
            assert isinstance(json.loads(tool_call["function"]["arguments"]), dict)
            assert result["tool_call_id"] == tool_call["id"]
            assert after.prompt_bytes() > before.prompt_bytes()
            assert after.at >= before.at
    assert shared_prefix_ratio(requests) > 0.7


def test_w3_toolsets() -> None:
    """W3 with several toolsets spreads agents over them, each set sent whole."""
    requests = w3_agent(32, 3.0, 300.0, toolsets=3, tools=5)
    sets = Counter(json.dumps(r.tools) for r in requests)
    assert len(sets) == 3
    assert all(len(r.tools or ()) == 5 for r in requests)


def test_w4_documents_are_zipf() -> None:
    """W4: a shared instruction, then 1-3 different documents drawn by Zipf weight, then a
    question; document text is identical wherever it recurs."""
    requests = w4_rag(41, 20.0, 300.0, documents=500)
    instructions = {r.messages[0]["content"] for r in requests}
    assert len(instructions) == 1
    drawn: Counter[int] = Counter()
    texts: dict[int, set[str]] = {}
    for request in requests:
        content = request.messages[1]["content"]
        docs = [int(d) for d in re.findall(r"^Document (\d+):$", content, re.MULTILINE)]
        assert 1 <= len(docs) <= 3
        assert len(set(docs)) == len(docs)
        assert "\n\nQuestion: " in content
        drawn.update(docs)
        for part in content.split("\n\n"):
            if part.startswith("Document "):
                head = int(part.split(":", 1)[0].removeprefix("Document "))
                texts.setdefault(head, set()).add(part)
    assert all(len(t) == 1 for t in texts.values())
    total = sum(drawn.values())
    top = sum(n for d, n in drawn.items() if d < 10)
    assert top > 0.25 * total  # 2% of the corpus takes over a quarter of the draws
    assert drawn[0] > drawn[1] > drawn[10]
    assert len(drawn) < 500


def test_w6_shares_nothing() -> None:
    """W6: no two prompts share a message or their first bytes, while W1 shares most of its
    prompt bytes."""
    requests = w6_unique(61, 10.0, 200.0)
    assert shared_prefix_ratio(requests) < 0.01
    firsts = {r.messages[0]["content"][:8] for r in requests}
    assert len(firsts) == len(requests)
    assert all(1000 * 4 <= r.prompt_bytes() <= 6000 * 4 for r in requests)
    assert shared_prefix_ratio(w1_shared_system(61, 10.0, 200.0)) > 0.8


def test_mix_interleaves_w1_and_w6() -> None:
    """mix: one arrival stream, about half W1 requests and half W6, interleaved in time."""
    requests = mix(71, 10.0, 300.0)
    tags = Counter(r.tag for r in requests)
    assert set(tags) == {"mix/w1", "mix/w6"}
    assert tags["mix/w1"] / len(requests) == pytest.approx(0.5, abs=0.08)
    switches = sum(a.tag != b.tag for a, b in itertools.pairwise(requests))
    assert switches > len(requests) / 4
    ratio = shared_prefix_ratio(requests)
    assert 0.2 < ratio < 0.8
    only_w1 = mix(71, 10.0, 300.0, shared=1.0)
    assert {r.tag for r in only_w1} == {"mix/w1"}


def test_multi_model_popularity() -> None:
    """multi-model: requests over M models named model-0.., the first far more popular than
    the last; each model has its own shared system prompt."""
    requests = multi_model(81, 20.0, 300.0, models=6)
    models = Counter(r.model for r in requests)
    assert set(models) == {f"model-{m}" for m in range(6)}
    assert models["model-0"] > 3 * models["model-5"]
    assert models["model-0"] > 0.3 * len(requests)
    systems = {(r.model, r.messages[0]["content"]) for r in requests}
    assert len(systems) == 6
    named = multi_model(81, 5.0, 60.0, names=["a", "b"])
    assert {r.model for r in named} <= {"a", "b"}


def test_shared_prefix_ratio_by_message() -> None:
    """The ratio counts the bytes of messages whose whole prefix an earlier request sent."""
    system = {"role": "system", "content": "s" * 300}

    def ask(content: str) -> Request:
        return Request(0.0, "m", (system, {"role": "user", "content": content}), 1)

    assert shared_prefix_ratio([]) == 0.0
    assert shared_prefix_ratio([ask("a" * 100)]) == 0.0
    assert shared_prefix_ratio([ask("a" * 100), ask("b" * 100)]) == pytest.approx(300 / 800)
    assert shared_prefix_ratio([ask("a" * 100), ask("a" * 100)]) == pytest.approx(0.5)
    other = Request(0.0, "n", (system,), 1)
    assert shared_prefix_ratio([ask("a"), other]) == 0.0


def test_prefix_stable_over_duration() -> None:
    """A longer run of the same seed starts with the shorter run's requests."""
    for name in ("w1", "w4", "w6", "hot", "multi-model"):
        short = generate(name, 9, 5.0, 30.0)
        long = generate(name, 9, 5.0, 90.0)
        assert dump(long[: len(short)]) == dump(short)


def test_token_sizing() -> None:
    """Texts are sized in tokens at 4 bytes a token: a 2,000-token prompt is 8,000 bytes."""
    requests = w1_shared_system(1, 5.0, 30.0, prompts=1, prompt_tokens=(2000, 2000),
                                question_tokens=(50, 50))
    assert {len(r.messages[0]["content"].encode()) for r in requests} == {8000}
    assert {len(r.messages[1]["content"].encode()) for r in requests} == {200}
    assert {r.prompt_tokens() for r in requests} == {2050}


def test_deterministic_across_processes() -> None:
    """Workloads do not depend on the interpreter's string hash seed: two processes with
    different PYTHONHASHSEED values generate the same bytes."""
    code = (
        "import hashlib, json\n"
        "from pharos.bench.workloads import WORKLOADS, generate\n"
        "h = hashlib.sha256()\n"
        "for name in sorted(WORKLOADS):\n"
        "    for r in generate(name, 5, 2.0, 30.0):\n"
        "        h.update(json.dumps([r.at, r.session, r.tag, r.body()]).encode())\n"
        "print(h.hexdigest())\n"
    )
    digests = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        digests.add(out.stdout.strip())
    here = hashlib.sha256()
    for name in sorted(WORKLOADS):
        for r in generate(name, 5, 2.0, 30.0):
            here.update(json.dumps([r.at, r.session, r.tag, r.body()]).encode())
    assert digests == {here.hexdigest()}


def test_start_burst_and_serial() -> None:
    """``burst`` sends the first requests all at 0; ``serial`` spaces them ``start_gap`` apart
    and shifts the rest after them, keeping the rest's gaps and every request's content."""
    base = generate("w1", 3, 10.0, 20.0)
    burst = generate("w1", 3, 10.0, 20.0, start="burst", start_requests=12)
    serial = generate("w1", 3, 10.0, 20.0, start="serial", start_requests=8, start_gap=0.7)
    assert [r.messages for r in burst] == [r.messages for r in base]
    assert [r.messages for r in serial] == [r.messages for r in base]
    assert [r.at for r in burst[:12]] == [0.0] * 12
    assert [r.at for r in burst[12:]] == [r.at for r in base[12:]]
    assert [r.at for r in serial[:8]] == pytest.approx([i * 0.7 for i in range(8)])
    assert serial[8].at == pytest.approx(8 * 0.7)
    gaps = [b.at - a.at for a, b in itertools.pairwise(serial[8:])]
    assert gaps == pytest.approx([b.at - a.at for a, b in itertools.pairwise(base[8:])])
    assert generate("w1", 3, 10.0, 20.0, start="open") == base


def test_start_arguments() -> None:
    """An unknown start, a negative count or a gap that is not positive is refused."""
    with pytest.raises(ValueError, match="unknown start"):
        generate("w1", 1, 5.0, 5.0, start="slow")
    with pytest.raises(ValueError, match="start_requests"):
        generate("w1", 1, 5.0, 5.0, start="burst", start_requests=-1)
    with pytest.raises(ValueError, match="start_gap"):
        generate("w1", 1, 5.0, 5.0, start="serial", start_gap=0)
