"""Seeded open-loop workloads for the benchmark harness: W1-W4, W6, ``mix``, ``hot`` and
``multi-model``, with Poisson or Gamma arrivals.

A workload is a list of ``Request`` sorted by ``at``, the second of the run at which the
harness sends it to ``/v1/chat/completions`` (streamed, with a usage chunk), whatever the
earlier ones are doing, so a server that falls behind cannot slow the offered load.

Everything is deterministic: each generator draws from ``random.Random`` streams derived from
its seed (arrivals, and each request, session or document), with no global state, so the same
arguments give byte-identical requests. Texts are pseudo-words sized at 4 bytes a token
(``pharos.sim.prompt.BYTES_PER_TOKEN``), each led by its own 8-hex-digit nonce, so different
texts differ from their first bytes while a shared text is the very same string.

``rate`` is always the mean *request* rate per second. The session workloads (W2, W3) start
sessions at ``rate`` over their mean requests per session, so they reach ``rate`` once
sessions overlap (less early on and at the end, where turns past ``duration`` are dropped).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from itertools import accumulate
from typing import Any

from pharos.sim.prompt import BYTES_PER_TOKEN, CHAT, prompt_text

#: An inclusive ``(low, high)`` range of integers (tokens, turns, steps, ...), drawn uniformly.
Range = tuple[int, int]

__all__ = [
    "ARRIVALS",
    "BYTES_PER_TOKEN",
    "WORKLOADS",
    "Range",
    "Request",
    "gamma",
    "generate",
    "hot",
    "mix",
    "multi_model",
    "poisson",
    "shared_prefix_ratio",
    "w1_shared_system",
    "w2_chat",
    "w3_agent",
    "w4_rag",
    "w6_unique",
]


@dataclass(frozen=True, slots=True)
class Request:
    """One scheduled chat completion request."""

    #: Seconds from the start of the run: when the harness sends it.
    at: float
    model: str
    #: OpenAI chat messages, each with a string ``content``.
    messages: tuple[dict[str, Any], ...]
    max_tokens: int
    #: The conversation or agent it belongs to (for session affinity), if any.
    session: str | None = None
    #: OpenAI tool (function) definitions, if any.
    tools: tuple[dict[str, Any], ...] | None = None
    #: The workload that made it (``mix`` tags its halves ``mix/w1`` and ``mix/w6``).
    tag: str = ""

    def body(self) -> dict[str, Any]:
        """The JSON body for ``/v1/chat/completions``: streamed, with a usage chunk. A fresh copy
        each call, so the caller may change it."""
        doc: dict[str, Any] = {
            "model": self.model,
            "messages": copy.deepcopy(list(self.messages)),
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.tools:
            doc["tools"] = copy.deepcopy(list(self.tools))
        return doc

    def headers(self) -> dict[str, str]:
        """Extra HTTP headers: ``x-session-id`` naming the session, when there is one."""
        return {"x-session-id": self.session} if self.session is not None else {}

    def prompt_bytes(self) -> int:
        """Bytes of prompt text, counted as the simulator counts them (tools, then each
        message's content and tool calls)."""
        return len(prompt_text(CHAT, self.body()))

    def prompt_tokens(self) -> int:
        """Estimated prompt tokens: 4 bytes a token, rounded up."""
        return -(-self.prompt_bytes() // BYTES_PER_TOKEN)


# -- arrivals ---------------------------------------------------------------------------------


def poisson(rate: float, duration: float, rng: random.Random) -> list[float]:
    """Poisson arrival times at ``rate`` per second in ``[0, duration)``, sorted."""
    _check_schedule(rate, duration)
    out: list[float] = []
    t = rng.expovariate(rate)
    while t < duration:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def gamma(rate: float, cv: float, duration: float, rng: random.Random) -> list[float]:
    """Arrival times in ``[0, duration)``, sorted, with Gamma gaps of mean ``1 / rate`` and
    coefficient of variation ``cv`` (shape ``1 / cv**2``): ``cv = 1`` is Poisson, larger values
    come in bursts separated by long lulls."""
    _check_schedule(rate, duration)
    if not cv > 0:
        raise ValueError(f"cv must be positive, not {cv}")
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    out: list[float] = []
    t = rng.gammavariate(shape, scale)
    while t < duration:
        out.append(t)
        t += rng.gammavariate(shape, scale)
    return out


#: The arrival processes by name.
ARRIVALS = ("poisson", "gamma")


def _check_schedule(rate: float, duration: float) -> None:
    if not rate > 0:
        raise ValueError(f"rate must be positive, not {rate}")
    if not duration >= 0:
        raise ValueError(f"duration must not be negative, not {duration}")


def _times(
    seed: int, tag: str, rate: float, duration: float, arrivals: str, cv: float
) -> list[float]:
    rng = _rng(seed, tag, "arrivals")
    if arrivals == "poisson":
        if cv != 1.0:
            raise ValueError("cv applies to gamma arrivals only (arrivals='gamma')")
        return poisson(rate, duration, rng)
    if arrivals == "gamma":
        return gamma(rate, cv, duration, rng)
    raise ValueError(f"unknown arrivals {arrivals!r}: one of {', '.join(ARRIVALS)}")


# -- randomness and text ----------------------------------------------------------------------


def _rng(seed: int, *parts: object) -> random.Random:
    """An independent stream for one purpose (a string seed is hashed with SHA-512 by
    ``random``, the same on every run and platform)."""
    return random.Random(":".join(str(p) for p in ("pharos.workloads", seed, *parts)))


def _draw(rng: random.Random, span: Range) -> int:
    return rng.randint(span[0], span[1])


def _check_range(name: str, span: Range, low: int = 0) -> None:
    if len(span) != 2 or not low <= span[0] <= span[1]:
        raise ValueError(f"{name} must be a (low, high) range with {low} <= low <= high: {span}")


_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"
#: Syllables in a generator's table, and how many end a word: words average 256 / 96 = 2.7.
_SYLLABLES = 256
_WORD_ENDS = 96
#: Texts are runs of phrases (of ``_PHRASE_WORDS`` words) drawn from a table of ``_PHRASES``
#: made per generator, so the cost is per phrase rather than per byte.
_PHRASES = 4096
_PHRASE_WORDS = 8


class _Text:
    """Pseudo-word text, sized in tokens, from a seeded table of phrases built of a seeded table
    of syllables, each text led by a nonce unique within this generator."""

    def __init__(self, seed: int) -> None:
        rng = _rng(seed, "syllables")
        open_ = [c + v for c in _CONSONANTS for v in _VOWELS]
        closed = rng.sample([cv + c for cv in open_ for c in _CONSONANTS], _SYLLABLES - len(open_))
        self._ends = closed[:_WORD_ENDS]
        self._inner = rng.sample(open_, len(open_)) + closed[_WORD_ENDS:]
        table = [s + " " for s in self._ends] + self._inner
        words: list[str] = []
        while len(words) < _PHRASES * _PHRASE_WORDS:
            run = "".join(map(table.__getitem__, rng.randbytes(_PHRASES * _PHRASE_WORDS * 3)))
            words += run.split(" ")[1:-1]
        self._phrases = [
            " ".join(words[i : i + _PHRASE_WORDS]) + " "
            for i in range(0, _PHRASES * _PHRASE_WORDS, _PHRASE_WORDS)
        ]
        self._phrase_bytes = sum(map(len, self._phrases)) / len(self._phrases)
        self._nonces: set[str] = set()

    def nonce(self, rng: random.Random) -> str:
        while True:
            value = f"{rng.getrandbits(32):08x}"
            if value not in self._nonces:
                self._nonces.add(value)
                return value

    def word(self, rng: random.Random) -> str:
        """One pseudo-word of one to three syllables."""
        inner = [rng.choice(self._inner) for _ in range(rng.randint(0, 2))]
        return "".join(inner) + rng.choice(self._ends)

    def text(self, rng: random.Random, tokens: int, end: str = ".") -> str:
        """Exactly ``tokens * 4`` bytes of ASCII: a nonce, then words, then ``end``."""
        size = tokens * BYTES_PER_TOKEN
        head = self.nonce(rng) + " "
        if size <= len(head) + len(end):
            return (head + end)[:size]
        need = size - len(head) - len(end)
        parts: list[str] = []
        have = 0
        while have <= need:
            chunk = "".join(rng.choices(self._phrases, k=int(need / self._phrase_bytes) + 2))
            parts.append(chunk)
            have += len(chunk)
        body = "".join(parts)[:need].rstrip(" ")
        return head + body + "e" * (need - len(body)) + end


class _Zipf:
    """Ranks ``0 .. n - 1`` drawn with weight ``1 / (rank + 1) ** exponent``: rank 0 is the most
    popular; exponent 0 is uniform."""

    def __init__(self, n: int, exponent: float) -> None:
        if n < 1:
            raise ValueError(f"need at least one item, not {n}")
        if exponent < 0:
            raise ValueError(f"the Zipf exponent must not be negative, not {exponent}")
        self.n = n
        self._cumulative = list(accumulate(1.0 / (k**exponent) for k in range(1, n + 1)))

    def draw(self, rng: random.Random) -> int:
        return min(bisect_right(self._cumulative, rng.random() * self._cumulative[-1]), self.n - 1)

    def distinct(self, rng: random.Random, count: int) -> list[int]:
        """``count`` different ranks, in the order drawn."""
        count = min(count, self.n)
        out: list[int] = []
        while len(out) < count:
            rank = self.draw(rng)
            if rank not in out:
                out.append(rank)
        return out


def _system(content: str) -> dict[str, Any]:
    return {"role": "system", "content": content}


def _user(content: str) -> dict[str, Any]:
    return {"role": "user", "content": content}


def _assistant(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


# -- W1, hot, W6 and mix ----------------------------------------------------------------------


def _shared_system(
    seed: int,
    tag: str,
    text: _Text,
    model: str,
    *,
    prompts: int,
    prompt_tokens: Range,
    question_tokens: Range,
    output_tokens: Range,
    exponent: float,
) -> Callable[[int, float], Request]:
    """A maker of W1-shaped requests: one of ``prompts`` shared system prompts, by Zipf weight
    (uniform at exponent 0), then a question of its own."""
    _check_range("prompt_tokens", prompt_tokens)
    _check_range("question_tokens", question_tokens, 1)
    _check_range("output_tokens", output_tokens, 1)
    popularity = _Zipf(prompts, exponent)
    systems = []
    for j in range(prompts):
        rng = _rng(seed, tag, "prompt", j)
        systems.append(_system(text.text(rng, _draw(rng, prompt_tokens))))

    def make(i: int, at: float) -> Request:
        rng = _rng(seed, tag, "request", i)
        system = systems[popularity.draw(rng)]
        question = _user(text.text(rng, _draw(rng, question_tokens), end="?"))
        return Request(at, model, (system, question), _draw(rng, output_tokens), tag=tag)

    return make


def _unique(
    seed: int,
    tag: str,
    text: _Text,
    model: str,
    *,
    prompt_tokens: Range,
    output_tokens: Range,
) -> Callable[[int, float], Request]:
    """A maker of W6-shaped requests: one user message shared with nothing."""
    _check_range("prompt_tokens", prompt_tokens, 1)
    _check_range("output_tokens", output_tokens, 1)

    def make(i: int, at: float) -> Request:
        rng = _rng(seed, tag, "request", i)
        prompt = _user(text.text(rng, _draw(rng, prompt_tokens), end="?"))
        return Request(at, model, (prompt,), _draw(rng, output_tokens), tag=tag)

    return make


def w1_shared_system(
    seed: int,
    rate: float,
    duration: float,
    *,
    model: str = "tiny",
    arrivals: str = "poisson",
    cv: float = 1.0,
    prompts: int = 8,
    prompt_tokens: Range = (2000, 8000),
    question_tokens: Range = (50, 500),
    output_tokens: Range = (50, 300),
) -> list[Request]:
    """W1: ``prompts`` system prompts of 2k to 8k tokens shared by every user, each request one
    of them (uniformly) and a 50 to 500 token question of its own."""
    make = _shared_system(
        seed, "w1", _Text(seed), model, prompts=prompts, prompt_tokens=prompt_tokens,
        question_tokens=question_tokens, output_tokens=output_tokens, exponent=0.0,
    )
    return [make(i, at) for i, at in enumerate(_times(seed, "w1", rate, duration, arrivals, cv))]


def hot(
    seed: int,
    rate: float,
    duration: float,
    *,
    model: str = "tiny",
    arrivals: str = "poisson",
    cv: float = 1.0,
    prompts: int = 8,
    exponent: float = 1.1,
    prompt_tokens: Range = (2000, 8000),
    question_tokens: Range = (50, 500),
    output_tokens: Range = (50, 300),
) -> list[Request]:
    """``hot``: W1 with system prompts drawn by Zipf weight (``1 / rank ** exponent``)."""
    make = _shared_system(
        seed, "hot", _Text(seed), model, prompts=prompts, prompt_tokens=prompt_tokens,
        question_tokens=question_tokens, output_tokens=output_tokens, exponent=exponent,
    )
    return [make(i, at) for i, at in enumerate(_times(seed, "hot", rate, duration, arrivals, cv))]


def w6_unique(
    seed: int,
    rate: float,
    duration: float,
    *,
    model: str = "tiny",
    arrivals: str = "poisson",
    cv: float = 1.0,
    prompt_tokens: Range = (1000, 6000),
    output_tokens: Range = (50, 300),
) -> list[Request]:
    """W6, the control: prompts of 1k to 6k tokens that share nothing (each a single user message
    with its own first bytes), where cache affinity must not hurt."""
    make = _unique(
        seed, "w6", _Text(seed), model, prompt_tokens=prompt_tokens, output_tokens=output_tokens
    )
    return [make(i, at) for i, at in enumerate(_times(seed, "w6", rate, duration, arrivals, cv))]


def mix(
    seed: int,
    rate: float,
    duration: float,
    *,
    model: str = "tiny",
    arrivals: str = "poisson",
    cv: float = 1.0,
    shared: float = 0.5,
    prompts: int = 8,
    prompt_tokens: Range = (2000, 8000),
    question_tokens: Range = (50, 500),
    unique_tokens: Range = (1000, 6000),
    output_tokens: Range = (50, 300),
) -> list[Request]:
    """``mix``: W1 and W6 requests arriving together, one arrival stream at ``rate`` whose requests
    are W1's (tag ``mix/w1``) with probability ``shared`` and W6's (``mix/w6``) otherwise, so a
    policy must weigh the cache one kind finds against the prefill the other queues."""
    if not 0.0 <= shared <= 1.0:
        raise ValueError(f"shared must be within [0, 1], not {shared}")
    text = _Text(seed)
    w1 = _shared_system(
        seed, "mix/w1", text, model, prompts=prompts, prompt_tokens=prompt_tokens,
        question_tokens=question_tokens, output_tokens=output_tokens, exponent=0.0,
    )
    w6 = _unique(
        seed, "mix/w6", text, model, prompt_tokens=unique_tokens, output_tokens=output_tokens
    )
    pick = _rng(seed, "mix", "pick")
    return [
        (w1 if pick.random() < shared else w6)(i, at)
        for i, at in enumerate(_times(seed, "mix", rate, duration, arrivals, cv))
    ]


# -- W2 and W3: sessions ----------------------------------------------------------------------


def w2_chat(
    seed: int,
    rate: float,
    duration: float,
    *,
    model: str = "tiny",
    arrivals: str = "poisson",
    cv: float = 1.0,
    turns: Range = (3, 8),
    think: float = 15.0,
    min_think: float = 0.0,
    system_tokens: int = 0,
    question_tokens: Range = (20, 200),
    reply_tokens: Range = (50, 400),
) -> list[Request]:
    """W2: multi-turn chats whose whole history is resent each turn.

    Sessions (``w2-<n>``, also sent as ``x-session-id``) start at ``rate / mean turns``. Each
    turn appends a question and is sent with ``max_tokens`` the length of the assistant reply
    the next turn's history carries (50 to 400 tokens), at the previous turn's *send* time plus
    a think time (``min_think`` plus an exponential draw, ``think`` seconds on average). Open
    loop: the history holds the generated reply text, not the engine's answer, so turns of one
    session can overlap on a server that falls behind. With ``system_tokens`` every session
    starts with the same system prompt of that size. Turns past ``duration`` are dropped.
    """
    _check_range("turns", turns, 1)
    _check_range("question_tokens", question_tokens, 1)
    _check_range("reply_tokens", reply_tokens, 1)
    if not 0 <= min_think <= think:
        raise ValueError(f"need 0 <= min_think <= think, not {min_think} and {think}")
    if system_tokens < 0:
        raise ValueError(f"system_tokens must not be negative, not {system_tokens}")
    text = _Text(seed)
    start: list[dict[str, Any]] = []
    if system_tokens:
        start.append(_system(text.text(_rng(seed, "w2", "system"), system_tokens)))
    mean_turns = (turns[0] + turns[1]) / 2
    out: list[Request] = []
    for n, at in enumerate(_times(seed, "w2", rate / mean_turns, duration, arrivals, cv)):
        rng = _rng(seed, "w2", "session", n)
        session = f"w2-{n}"
        history = list(start)
        for turn in range(_draw(rng, turns)):
            if turn:
                extra = think - min_think
                at += min_think + (rng.expovariate(1.0 / extra) if extra > 0 else 0.0)
            if at >= duration:
                break
            history.append(_user(text.text(rng, _draw(rng, question_tokens), end="?")))
            reply = _draw(rng, reply_tokens)
            out.append(Request(at, model, tuple(history), reply, session, tag="w2"))
            history.append(_assistant(text.text(rng, reply)))
    out.sort(key=lambda r: r.at)
    return out


_PARAMETER_NAMES = ("query", "path", "limit", "filter", "target", "mode", "content", "scope")


def _toolset(
    seed: int, text: _Text, index: int, tools: int, tool_tokens: Range
) -> list[dict[str, Any]]:
    rng = _rng(seed, "w3", "toolset", index)
    out: list[dict[str, Any]] = []
    names: set[str] = set()
    while len(out) < tools:
        name = f"{text.word(rng)}_{text.word(rng)}"
        if name in names:
            continue
        names.add(name)
        params = rng.sample(_PARAMETER_NAMES, rng.randint(1, 3))
        properties = {
            p: {"type": "string", "description": text.text(rng, rng.randint(8, 24))}
            for p in params
        }
        out.append({
            "type": "function",
            "function": {
                "name": name,
                "description": text.text(rng, _draw(rng, tool_tokens)),
                "parameters": {"type": "object", "properties": properties, "required": params[:1]},
            },
        })
    return out


def w3_agent(
    seed: int,
    rate: float,
    duration: float,
    *,
    model: str = "tiny",
    arrivals: str = "poisson",
    cv: float = 1.0,
    toolsets: int = 1,
    tools: int = 8,
    tool_tokens: Range = (60, 250),
    system_tokens: int = 800,
    task_tokens: Range = (100, 400),
    steps: Range = (4, 12),
    call_tokens: Range = (20, 100),
    result_tokens: Range = (100, 1000),
    gap: float = 2.0,
    output_tokens: Range = (50, 300),
) -> list[Request]:
    """W3: agent loops resending a context that grows by a tool call and its result each step,
    over shared tool definitions.

    Agents (``w3-<n>``) start at ``rate / mean steps``; each uses one of ``toolsets`` sets of
    ``tools`` definitions with the set's shared system prompt, then a task of its own. Step
    ``k`` sends those and the ``k`` earlier tool calls, each followed by its result. Steps are
    ``gap`` seconds apart on average (exponential), open loop as in W2.
    """
    for name, span in (("tool_tokens", tool_tokens), ("task_tokens", task_tokens),
                       ("steps", steps), ("call_tokens", call_tokens),
                       ("result_tokens", result_tokens), ("output_tokens", output_tokens)):
        _check_range(name, span, 1)
    if toolsets < 1 or tools < 1:
        raise ValueError("need at least one toolset of at least one tool")
    if gap < 0 or system_tokens < 0:
        raise ValueError("gap and system_tokens must not be negative")
    text = _Text(seed)
    sets = []
    for index in range(toolsets):
        defs = tuple(_toolset(seed, text, index, tools, tool_tokens))
        system = _system(text.text(_rng(seed, "w3", "system", index), system_tokens))
        sets.append((defs, system))
    mean_steps = (steps[0] + steps[1]) / 2
    out: list[Request] = []
    for n, at in enumerate(_times(seed, "w3", rate / mean_steps, duration, arrivals, cv)):
        rng = _rng(seed, "w3", "agent", n)
        session = f"w3-{n}"
        defs, system = sets[rng.randrange(toolsets)]
        context = [system, _user(text.text(rng, _draw(rng, task_tokens)))]
        for step in range(_draw(rng, steps)):
            if step:
                at += rng.expovariate(1.0 / gap) if gap > 0 else 0.0
            if at >= duration:
                break
            out.append(Request(
                at, model, tuple(context), _draw(rng, output_tokens), session, defs, "w3"
            ))
            call_id = f"call_{n}_{step}"
            tool = defs[rng.randrange(len(defs))]["function"]
            arguments = {tool["parameters"]["required"][0]: text.text(rng, _draw(rng, call_tokens))}
            context.append({
                "role": "assistant",
                "content": "",
                "tool_calls": [{
                    "id": call_id,
                    "type": "function",
                    "function": {"name": tool["name"], "arguments": json.dumps(arguments)},
                }],
            })
            context.append({
                "role": "tool",
                "tool_call_id": call_id,
                "content": text.text(rng, _draw(rng, result_tokens)),
            })
    out.sort(key=lambda r: r.at)
    return out


# -- W4 and multi-model -----------------------------------------------------------------------


def w4_rag(
    seed: int,
    rate: float,
    duration: float,
    *,
    model: str = "tiny",
    arrivals: str = "poisson",
    cv: float = 1.0,
    documents: int = 2000,
    exponent: float = 1.1,
    per_request: Range = (1, 3),
    document_tokens: Range = (200, 1500),
    instruction_tokens: int = 150,
    question_tokens: Range = (20, 100),
    output_tokens: Range = (50, 300),
) -> list[Request]:
    """W4: RAG over ``documents`` documents of Zipf popularity (weight ``1 / (d + 1) ** exponent``):
    a short shared instruction (system), then one user message of 1 to 3 different documents, each
    headed ``Document <d>:``, and a question of its own."""
    _check_range("per_request", per_request, 1)
    _check_range("document_tokens", document_tokens, 1)
    _check_range("question_tokens", question_tokens, 1)
    _check_range("output_tokens", output_tokens, 1)
    if instruction_tokens < 0:
        raise ValueError(f"instruction_tokens must not be negative, not {instruction_tokens}")
    text = _Text(seed)
    popularity = _Zipf(documents, exponent)
    instruction = _system(text.text(_rng(seed, "w4", "instruction"), instruction_tokens))
    corpus: dict[int, str] = {}

    def document(d: int) -> str:
        if d not in corpus:
            rng = _rng(seed, "w4", "document", d)
            corpus[d] = f"Document {d}:\n{text.text(rng, _draw(rng, document_tokens))}"
        return corpus[d]

    out: list[Request] = []
    for i, at in enumerate(_times(seed, "w4", rate, duration, arrivals, cv)):
        rng = _rng(seed, "w4", "request", i)
        docs = popularity.distinct(rng, _draw(rng, per_request))
        question = text.text(rng, _draw(rng, question_tokens), end="?")
        content = "\n\n".join([*(document(d) for d in docs), f"Question: {question}"])
        out.append(Request(
            at, model, (instruction, _user(content)), _draw(rng, output_tokens), tag="w4"
        ))
    return out


def multi_model(
    seed: int,
    rate: float,
    duration: float,
    *,
    model: str = "tiny",
    arrivals: str = "poisson",
    cv: float = 1.0,
    models: int = 8,
    names: Sequence[str] | None = None,
    exponent: float = 1.1,
    system_tokens: Range = (200, 1000),
    question_tokens: Range = (50, 500),
    output_tokens: Range = (50, 300),
) -> list[Request]:
    """``multi-model``: requests over ``models`` models named ``model-0 .. model-<M-1>`` (or
    ``names``), model ``m`` with Zipf weight ``1 / (m + 1) ** exponent``, so there can be more
    models than fit and residency and load time steer routing. Each model has its own shared
    system prompt; each request adds a question of its own. ``model`` is ignored."""
    del model
    chosen = list(names) if names is not None else [f"model-{m}" for m in range(models)]
    if not chosen:
        raise ValueError("need at least one model")
    _check_range("system_tokens", system_tokens)
    _check_range("question_tokens", question_tokens, 1)
    _check_range("output_tokens", output_tokens, 1)
    text = _Text(seed)
    popularity = _Zipf(len(chosen), exponent)
    systems = []
    for m in range(len(chosen)):
        rng = _rng(seed, "multi-model", "prompt", m)
        systems.append(_system(text.text(rng, _draw(rng, system_tokens))))
    out: list[Request] = []
    for i, at in enumerate(_times(seed, "multi-model", rate, duration, arrivals, cv)):
        rng = _rng(seed, "multi-model", "request", i)
        m = popularity.draw(rng)
        question = _user(text.text(rng, _draw(rng, question_tokens), end="?"))
        out.append(Request(
            at, chosen[m], (systems[m], question), _draw(rng, output_tokens), tag="multi-model"
        ))
    return out


# -- registry and measures --------------------------------------------------------------------

#: The workloads by name.
WORKLOADS: dict[str, Callable[..., list[Request]]] = {
    "w1": w1_shared_system,
    "w2": w2_chat,
    "w3": w3_agent,
    "w4": w4_rag,
    "w6": w6_unique,
    "mix": mix,
    "hot": hot,
    "multi-model": multi_model,
}


#: How the traffic starts: ``open`` as the arrivals have it; ``burst``: the first
#: ``start_requests`` all at 0; ``serial``: those one at a time, ``start_gap`` seconds apart, the
#: rest shifted by that. Cache-aware routers are path dependent: where each prompt's first
#: requests land decides what every cache holds (peers pin every prompt on one engine then).
STARTS = ("open", "burst", "serial")
#: Requests ``burst`` and ``serial`` re-time, and ``serial``'s gap, seconds.
START_REQUESTS = 16
START_GAP_SEC = 0.5


def starting(requests: list[Request], how: str, count: int = START_REQUESTS,
          gap: float = START_GAP_SEC) -> list[Request]:
    """``requests`` with their first ``count`` re-timed as ``how`` (one of ``STARTS``) says."""
    if how not in STARTS:
        raise ValueError(f"unknown start {how!r}: one of {', '.join(STARTS)}")
    if not count >= 0:
        raise ValueError(f"start_requests must not be negative, not {count}")
    if not gap > 0:
        raise ValueError(f"start_gap must be positive, not {gap}")
    if how == "open" or not requests:
        return requests
    head, tail = requests[:count], requests[count:]
    if how == "burst":
        first = [dataclasses.replace(r, at=0.0) for r in head]
        return first + tail
    first = [dataclasses.replace(r, at=i * gap) for i, r in enumerate(head)]
    shift = len(head) * gap - (tail[0].at if tail else 0.0)
    return first + [dataclasses.replace(r, at=r.at + shift) for r in tail]


def generate(name: str, seed: int, rate: float, duration: float, *, start: str = "open",
             start_requests: int = START_REQUESTS, start_gap: float = START_GAP_SEC,
             **kw: Any) -> list[Request]:
    """The requests of workload ``name`` (a key of ``WORKLOADS``), sorted by send time; ``kw``
    are its keyword arguments (``model``, ``arrivals``, ``cv`` and its own knobs); ``start``,
    ``start_requests`` and ``start_gap`` say how the traffic starts (``STARTS``)."""
    try:
        make = WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}: one of {', '.join(WORKLOADS)}") from None
    return starting(make(seed, rate, duration, **kw), start, start_requests, start_gap)


def _units(request: Request) -> Iterable[bytes]:
    """A request's prompt in message-sized units, as the simulator reads it: the tools, then
    each message's content and tool calls."""
    if request.tools:
        yield _compact(list(request.tools))
    for message in request.messages:
        content = message.get("content")
        unit = content.encode() if isinstance(content, str) else b""
        if message.get("tool_calls"):
            unit += _compact(message["tool_calls"])
        yield unit


def _compact(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def shared_prefix_ratio(requests: Iterable[Request]) -> float:
    """The fraction of prompt bytes that repeat a prefix seen in an earlier request, by message:
    a unit (the tools, then each message) counts as shared when the request's units up to and
    including it all equal an earlier request's leading units (and the same model). A cheap
    estimate of what a prefix cache could reuse with unbounded room; 0.0 for no prompt."""
    seen: set[bytes] = set()
    shared = total = 0
    for request in requests:
        chain = blake2b(request.model.encode(), digest_size=16).digest()
        matching = True
        for unit in _units(request):
            chain = blake2b(chain + blake2b(unit, digest_size=16).digest(), digest_size=16).digest()
            total += len(unit)
            if matching and chain in seen:
                shared += len(unit)
            else:
                matching = False
                seen.add(chain)
    return shared / total if total else 0.0
