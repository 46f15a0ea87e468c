"""Layer 1 tests of the prefix index (spec §6): the chained hash, the bounded LRU with its slot
rules, correction, export/merge, the outcome table, and property tests against a naive model."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pharos.prefix import (
    BLOCK_BYTES,
    EMPTY,
    MAX_SLOTS,
    SHARD_ENTRIES,
    Chain,
    Entry,
    Match,
    PrefixIndex,
    PrefixOp,
    Source,
    WireSlot,
    chain,
    classify,
)

# --- chain -------------------------------------------------------------------------------------


def msgs(*pairs: tuple[str, object]) -> list[object]:
    return [{"role": role, "content": content} for role, content in pairs]


def test_escaped_and_utf8_bodies_give_the_same_chain() -> None:
    """A client escaping non-ASCII as \\uXXXX and one sending UTF-8 build the same chain, and the
    matched bytes are the decoded text's bytes (2 per Cyrillic letter, not 6)."""
    escaped = (
        rb'{"messages":[{"role":"user",'
        rb'"content":"\u041f\u0440\u0438\u0432\u0435\u0442"}]}'
    )
    assert b"\\u041f" in escaped
    raw = '{"messages":[{"role":"user","content":"Привет"}]}'.encode()
    a = chain("m", json.loads(escaped)["messages"], None, None)
    b = chain("m", json.loads(raw)["messages"], None, None)
    assert a == b
    assert len(a) == 1
    assert a.ends == (12,)


def test_keys_are_64_bit_and_deterministic() -> None:
    """Keys are unsigned 64-bit ints and the same request always gives the same chain (fixed
    seed), while another model gives another chain."""
    m = msgs(("system", "s"), ("user", "u"))
    a = chain("m", m, None, None)
    assert all(0 <= k < 2**64 for k in a.keys)
    assert a == chain("m", m, None, None)
    assert set(a.keys).isdisjoint(chain("other", m, None, None).keys)


def test_tools_change_the_first_link() -> None:
    """Tools and the first message are one unit: other tools change h1 and so every link, and
    the tools' bytes count towards the first link's length."""
    m = msgs(("system", "be brief"), ("user", "hi"))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    plain = chain("m", m, None, None)
    with_tools = chain("m", m, tools, None)
    assert set(plain.keys).isdisjoint(with_tools.keys)
    assert with_tools.ends[0] > plain.ends[0]
    assert chain("m", m, [], None) == plain  # no tools and an empty list are the same
    reordered = [{"function": {"parameters": {}, "name": "f"}, "type": "function"}]
    assert chain("m", m, reordered, None) == with_tools  # canonical JSON: key order is moot


def test_changed_later_message_keeps_the_shared_links() -> None:
    """Two conversations that differ from the third message on share exactly the first two
    links, and the byte ends accumulate the decoded content lengths."""
    a = chain("m", msgs(("system", "sys"), ("user", "hello"), ("assistant", "x")), None, None)
    b = chain("m", msgs(("system", "sys"), ("user", "hello"), ("assistant", "y")), None, None)
    assert a.keys[:2] == b.keys[:2]
    assert a.keys[2] != b.keys[2]
    assert a.ends == (3, 8, 9)


def test_fields_are_length_prefixed() -> None:
    """Moving bytes between role and content changes the link: ("ab", "c") is not ("a", "bc")."""
    assert chain("m", msgs(("ab", "c")), None, None) != chain("m", msgs(("a", "bc")), None, None)


def test_other_message_fields_are_part_of_the_link() -> None:
    """Two assistant turns with null content but different tool calls don't share a link."""
    a = [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]
    b = [{"role": "assistant", "content": None, "tool_calls": [{"id": "2"}]}]
    assert chain("m", a, None, None) != chain("m", b, None, None)


#: Keys the chain gave before ``cache_control`` was left out (commit f7eac52): a message
#: without the marker must hash as it always has (state files and peers carry these keys).
_PINNED_TOOLS = [{"name": "Read", "description": "read a file",
                  "input_schema": {"type": "object"}}]
_PINNED_MESSAGES: list[object] = [
    {"role": "system", "content": [{"type": "text", "text": "sys A"},
                                   {"type": "text", "text": "sys B"}]},
    {"role": "user", "content": "h\u00e9llo"},
    {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read",
                                       "input": {"path": "x"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                  "content": [{"type": "text", "text": "data"}]}]},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "c", "type": "function",
                     "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c", "content": "ok"},
    {"role": "user", "content": [{"type": "text", "text": "look"},
                                 {"type": "image_url", "image_url": {"url": "data:x"}}]},
]
_PINNED_KEYS = (0x36bda49dac0c2ff6, 0x130cf796b49d15c, 0xaefbaa6496fb36cf, 0x73d0d68f486f1297,
                0x3b8563c00a41b654, 0x55ad4e12ec0b1766, 0x578d05fdbcad17e6, 0x380df6687f1db8c5)


def test_messages_without_cache_control_hash_as_before() -> None:
    """Strings, one-text-block lists, tool use and results, tool calls, images and tools with
    no ``cache_control`` give the very keys and lengths they gave before the marker was left
    out: no state file or mixed-version peer is invalidated."""
    ch = chain("m", _PINNED_MESSAGES, _PINNED_TOOLS, None)
    assert ch.keys == _PINNED_KEYS
    assert ch.ends == (88, 94, 96, 96, 96, 96, 98, 102)


def _marked(text: str) -> list[object]:
    return [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]


def test_claude_code_moving_cache_control_keeps_the_chain() -> None:
    """Claude Code marks the newest message's block with cache_control and, next turn, sends
    that message as a plain string with the marker on the new last message: turn 1's chain
    is a prefix of turn 2's, so turn 2 is predicted from the whole of turn 1."""
    system = {"role": "system", "content": [
        {"type": "text", "text": "billing header"},
        {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}]}
    first = {"role": "user", "content": [{"type": "text", "text": "<reminder>"},
                                         {"type": "text", "text": "do the task"}]}
    tools = [{"name": "Bash", "input_schema": {"type": "object"}},
             {"name": "Read", "input_schema": {"type": "object"},
              "cache_control": {"type": "ephemeral"}}]
    turn1 = [system, first, {"role": "system", "content": _marked("# Environment")}]
    turn2 = [system, first, {"role": "system", "content": "# Environment"},
             {"role": "assistant", "content": [{"type": "text", "text": "partial"}]},
             {"role": "user", "content": _marked("Resume.")}]
    a, b = chain("m", turn1, tools, None), chain("m", turn2, tools, None)
    assert len(a) == 3 and b.keys[:3] == a.keys and b.ends[:3] == a.ends
    # The marked message hashes as the string the client sends for it once unmarked.
    bare = [system, first, {"role": "system", "content": "# Environment"}]
    assert chain("m", bare, tools, None) == a


def test_cache_control_is_left_out_wherever_it_is() -> None:
    """The marker on a block of several, on a tool result's block, on an OpenAI-shaped
    message and on a tool changes nothing; the rest of the block still counts, and text that
    merely mentions the marker is hashed as it is."""
    cc = {"type": "ephemeral"}
    two = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    result = [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "text", "text": "out"}]}]
    cases = [
        ([{"role": "user", "content": [two[0], {**two[1], "cache_control": cc}]}],
         [{"role": "user", "content": two}]),
        ([{"role": "user", "content": [{**result[0], "cache_control": cc,
                                        "content": [{"type": "text", "text": "out",
                                                     "cache_control": cc}]}]}],
         [{"role": "user", "content": result}]),
        ([{"role": "user", "content": "hi", "cache_control": cc}],
         [{"role": "user", "content": "hi"}]),
        ([{"role": "tool", "tool_call_id": "c", "content": "x", "cache_control": cc}],
         [{"role": "tool", "tool_call_id": "c", "content": "x"}]),
    ]
    for marked, plain in cases:
        assert chain("m", marked, None, None) == chain("m", plain, None, None), marked
    tool = {"type": "function", "function": {"name": "f"}}
    one = msgs(("user", "hi"))
    assert chain("m", one, [{**tool, "cache_control": cc}], None) == chain("m", one, [tool], None)
    # An image block keeps the list (only a lone text block becomes its text).
    image = [{"type": "image", "source": {"type": "url", "url": "u"}, "cache_control": cc}]
    assert chain("m", msgs(("user", image)), None, None) == \
        chain("m", msgs(("user", [{"type": "image", "source": {"type": "url", "url": "u"}}])),
              None, None)
    mention = '{"cache_control": {"type": "ephemeral"}}'
    assert chain("m", msgs(("user", [{"type": "text", "text": mention}])), None, None) != \
        chain("m", msgs(("user", [{"type": "text", "text": ""}])), None, None)


_MARKERS = st.sampled_from([{"type": "ephemeral"}, {"ttl": "1h", "type": "ephemeral"},
                            {"type": "ephemeral", "ttl": "5m"}, {}, None, True, "x"])
_KEYS = st.sampled_from(["type", "text", "content", "input", "a", "zz", "cache_controls",
                         '"cache_control":'])
_TEXT = st.text(max_size=8) | st.just('"cache_control":{"type":"ephemeral"},')


def _json_with_markers(leaves: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4)
        | st.builds(lambda d, m, put: {**d, "cache_control": m} if put else d,
                    st.dictionaries(_KEYS, inner, max_size=4), _MARKERS, st.booleans()),
        max_leaves=12)


def _strip(value: object) -> object:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


@settings(max_examples=300, deadline=None)
@given(_json_with_markers(st.none() | st.booleans() | st.integers() | _TEXT))
def test_cutting_markers_out_equals_encoding_without_them(value: object) -> None:
    """Cutting the ``cache_control`` members out of canonical JSON bytes gives exactly the
    canonical JSON of the value without them, wherever they are, whatever text mentions them."""
    from pharos.prefix import _canonical, _unmarked
    assert _unmarked(_canonical(value)) == _canonical(_strip(value))


def test_completion_prompt_in_1kib_blocks() -> None:
    """A prompt is chained in 1 KiB blocks of its UTF-8 bytes: a longer prompt with the same
    start shares the whole blocks, a one-string list is that string, and a batch has no chain."""
    prompt = "a" * 2500
    c = chain("m", None, None, prompt)
    assert c.ends == (BLOCK_BYTES, 2 * BLOCK_BYTES, 2500)
    longer = chain("m", None, None, prompt + "b" * 100)
    assert longer.keys[:2] == c.keys[:2]
    assert longer.keys[2] != c.keys[2]
    assert chain("m", None, None, [prompt]) == c
    assert chain("m", None, None, ["a", "b"]) == EMPTY
    assert chain("m", None, None, "") == EMPTY
    cyr = chain("m", None, None, "ж" * 600)  # 1200 bytes: a block boundary mid-character
    assert cyr.ends == (BLOCK_BYTES, 1200)


def test_token_prompt_counts_four_bytes_per_token() -> None:
    """A prompt of token ids is chained at 4 bytes per token, so matched bytes / 4 are tokens."""
    c = chain("m", None, None, list(range(300)))
    assert c.ends == (BLOCK_BYTES, 1200)
    assert chain("m", None, None, [1, -1]) == EMPTY
    assert chain("m", None, None, [True]) == EMPTY


def test_non_string_content_hashes_without_error() -> None:
    """An array of parts (with an image) is hashed as canonical JSON, counts only its text
    parts' bytes, and differs from a string content with the same text."""
    parts = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
    c = chain("m", msgs(("user", parts)), None, None)
    assert c.ends == (len("what is this?"),)
    assert c != chain("m", msgs(("user", "what is this?")), None, None)


@pytest.mark.parametrize(
    "messages",
    [
        [None, 3, "text", ["x"], {"role": 5, "content": {"a": 1}}],
        [{"content": "no role"}, {}],
        [{"role": "user", "content": "\ud800 lone surrogate"}],
        [{"role": "user", "content": 1e308, "x": float("nan")}],
    ],
)
def test_odd_bodies_give_a_chain_without_raising(messages: list[object]) -> None:
    """Odd message lists still give one link per message and never raise."""
    c = chain("m", messages, None, None)
    assert len(c) == len(messages)


def test_hopeless_bodies_give_an_empty_chain() -> None:
    """No messages nor prompt, a non-list body, or nesting past the recursion limit give an
    empty chain (routed without a prediction), never an exception."""
    deep: object = "x"
    for _ in range(100_000):
        deep = [deep]
    assert chain("m", None, None, None) == EMPTY
    assert chain("m", "not a list", None, None) == EMPTY
    assert chain("m", [{"role": "user", "content": deep}], None, None) == EMPTY
    assert chain("m", msgs(("user", "x")), deep, None) == EMPTY
    assert chain(None, msgs(("user", "x")), None, None) == EMPTY  # type: ignore[arg-type]
    assert EMPTY.total_bytes == 0 and len(EMPTY) == 0


def test_enormous_tool_list() -> None:
    """Thousands of tools hash into the first link without trouble."""
    tools = [{"type": "function", "function": {"name": f"f{i}", "description": "d" * 200}}
             for i in range(5000)]
    c = chain("m", msgs(("user", "hi")), tools, None)
    assert len(c) == 1
    assert c.ends[0] > 5000 * 200


# --- index -------------------------------------------------------------------------------------


def conv(n: int, tag: str = "") -> Chain:
    return chain("m", msgs(*[("user", f"{tag}message {i}") for i in range(n)]), None, None)


def test_lookup_returns_the_longest_match_per_target() -> None:
    """Lookup walks longest first: each target gets the longest link it holds, with the byte end
    of that link and the source of its slot."""
    idx = PrefixIndex()
    long = conv(5)
    short = Chain(long.keys[:2], long.ends[:2])
    idx.record(short, 1, 0, now=1.0)
    idx.record(long, 2, 0, now=2.0, source="peer")
    got = idx.lookup(long, {1: 0, 2: 0})
    assert got == {1: Match(long.ends[1], "local"), 2: Match(long.ends[4], "peer")}
    assert got[2].tokens == long.ends[4] // 4
    assert idx.lookup(conv(3, "other"), {1: 0, 2: 0}) == {}


def test_lookup_skips_stale_generations() -> None:
    """A slot whose gen is no longer the target's current gen matches nothing; a shorter link
    recorded at the current gen still does; an unknown gen matches nothing."""
    idx = PrefixIndex()
    long = conv(4)
    idx.record(long, 7, 2, now=1.0)
    idx.record(Chain(long.keys[:1], long.ends[:1]), 7, 3, now=2.0)  # only h1 is at gen 3
    assert idx.lookup(long, {7: 3}) == {7: Match(long.ends[0], "local")}
    assert idx.lookup(long, lambda t: 2) == {7: Match(long.ends[3], "local")}
    assert idx.lookup(long, {}) == {}


def test_at_most_four_slots_and_the_oldest_slot_goes() -> None:
    """An entry holds at most 4 targets; a 5th evicts the least recently used slot; on a tie in
    last_used the first arrival keeps it."""
    idx = PrefixIndex()
    c = conv(1)
    for t, now in [(1, 5.0), (2, 3.0), (3, 6.0), (4, 7.0)]:
        idx.record(c, t, 0, now)
    idx.record(c, 5, 0, 8.0)
    assert [s[0] for s in idx.slots(c.keys[0])] == [1, 3, 4, 5]  # 2 was oldest
    idx.record(c, 6, 0, 8.0)  # ties: 1 (5.0) is the least recently used
    assert [s[0] for s in idx.slots(c.keys[0])] == [3, 4, 5, 6]

    tie = PrefixIndex()
    for t in range(1, 6):
        tie.record(c, t, 0, 1.0)
    assert [s[0] for s in tie.slots(c.keys[0])] == [1, 2, 3, 4]  # all tied: the newcomer goes
    assert len(tie.slots(c.keys[0])) == MAX_SLOTS


def test_rerecording_updates_the_slot_in_place() -> None:
    """Recording a target again updates its gen, last_used and source without a second slot."""
    idx = PrefixIndex()
    c = conv(1)
    idx.record(c, 1, 0, 1.0, source="peer")
    idx.record(c, 1, 1, 2.0)
    assert idx.slots(c.keys[0]) == [(1, 1, 2.0, "local")]


def test_capacity_evicts_least_recently_used_entries() -> None:
    """Beyond the capacity the least recently recorded entries go; lookup does not refresh."""
    idx = PrefixIndex(capacity=3)
    a, b, c = conv(1, "a"), conv(1, "b"), conv(1, "c")
    idx.record(a, 1, 0, 1.0)
    idx.record(b, 1, 0, 2.0)
    idx.record(c, 1, 0, 3.0)
    idx.lookup(a, {1: 0})
    idx.record(a, 2, 0, 4.0)  # a is touched by a record, so b is now the oldest
    idx.record(conv(1, "d"), 1, 0, 5.0)
    assert len(idx) == 3
    assert b.keys[0] not in idx
    assert a.keys[0] in idx and c.keys[0] in idx
    with pytest.raises(ValueError):
        PrefixIndex(capacity=0)


def test_a_long_record_keeps_its_shortest_links() -> None:
    """A record touches its links longest first, so under a tight capacity the shared short
    prefix survives and the deep links go."""
    idx = PrefixIndex(capacity=2)
    c = conv(4)
    idx.record(c, 1, 0, 1.0)
    assert idx.lru_order() == [c.keys[1], c.keys[0]]


def test_correct_and_forget_remove_the_target_from_every_link() -> None:
    """Correction and forgetting remove only that target, from every link of the chain, and
    drop entries left without slots."""
    idx = PrefixIndex()
    c = conv(3)
    idx.record(c, 1, 0, 1.0)
    idx.record(c, 2, 0, 2.0)
    idx.correct(c, 1)
    assert idx.lookup(c, {1: 0, 2: 0}) == {2: Match(c.ends[2], "local")}
    idx.forget(c.keys, 2)
    assert idx.lookup(c, {1: 0, 2: 0}) == {}
    assert len(idx) == 0
    idx.correct(conv(2, "never"), 1)  # removing what isn't there is fine


def test_export_merge_round_trip_onto_fresh_ids() -> None:
    """export names targets by key, most recent first, without stale slots; merge maps keys to
    the receiver's own ids, drops unknown targets, stamps the receiver's gens, marks the source
    and keeps the LRU order."""
    sender = PrefixIndex(capacity=SHARD_ENTRIES)  # one shard: one exact LRU order
    a, b = conv(2, "a"), conv(1, "b")
    sender.record(a, 1, 0, 10.0)
    sender.record(b, 2, 5, 20.0)
    sender.record(b, 3, 0, 21.0)  # target 3 is unknown to the receiver
    sender.record(a, 4, 1, 30.0)  # stale on the sender (gen now 2): never exported
    names = {1: "b1/m", 2: "b2/m", 3: "b3/m", 4: "b4/m"}
    sender_gens = {1: 0, 2: 5, 3: 0, 4: 2}
    exported = sender.export(names.get, sender_gens)
    assert [e.key for e in exported] == [a.keys[0], a.keys[1], b.keys[0]]
    assert exported[2] == Entry(b.keys[0], (WireSlot("b2/m", 20.0), WireSlot("b3/m", 21.0)))

    receiver = PrefixIndex(capacity=SHARD_ENTRIES)
    ids = {"b1/m": 100, "b2/m": 200}
    dropped = receiver.merge(exported, ids.get, {100: 7, 200: 9}, now=15.0, source="restored")
    assert dropped == 1
    assert receiver.lru_order() == list(reversed([e.key for e in exported]))
    assert receiver.slots(b.keys[0]) == [(200, 9, 15.0, "restored")]  # capped at now
    assert receiver.lookup(a, {100: 7}) == {100: Match(a.ends[1], "restored")}
    assert receiver.export({100: "b1/m", 200: "b2/m"}.get) == [
        Entry(a.keys[0], (WireSlot("b1/m", 10.0),)),
        Entry(a.keys[1], (WireSlot("b1/m", 10.0),)),
        Entry(b.keys[0], (WireSlot("b2/m", 15.0),)),
    ]


def test_merge_applies_peer_ops_in_order() -> None:
    """Peer deltas are records and removals in order; unknown targets and targets of unknown
    gen are dropped."""
    idx = PrefixIndex()
    c = conv(2)
    ops = [
        PrefixOp("x", c.keys, 1.0),
        PrefixOp("y", c.keys, 2.0),
        PrefixOp("x", c.keys, 3.0, remove=True),
        PrefixOp("ghost", c.keys, 4.0),
        PrefixOp("nogen", c.keys, 5.0),
    ]
    ids = {"x": 1, "y": 2, "nogen": 3}
    assert idx.merge(ops, ids.get, {1: 0, 2: 4}, now=10.0) == 2
    assert idx.lookup(c, {1: 0, 2: 4}) == {2: Match(c.ends[1], "peer")}


@pytest.mark.parametrize(
    ("predicted", "cached", "outcome"),
    [
        (100, None, "unknown"),
        (None, None, "unknown"),
        (100, 50, "predicted_hit"),
        (100, 200, "predicted_hit"),
        (100, 49, "wrong_prediction"),
        (100, 0, "wrong_prediction"),
        (None, 10, "unpredicted_hit"),
        (0, 10, "unpredicted_hit"),
        (None, 0, "miss"),
        (0, 0, "miss"),
    ],
)
def test_classify_table(predicted: int | None, cached: int | None, outcome: str) -> None:
    """The §13 prefix outcomes: a prediction is wrong below half of it; no cached tokens
    reported is unknown; a hit without a prediction is unpredicted."""
    assert classify(predicted, cached) == outcome


def test_classify_compares_shares_of_the_prompt_across_tokenizers() -> None:
    """With the engine's prompt tokens and the chain's own estimate known, a prediction is
    judged as a share of the prompt: a whole-prompt prediction on a tokenizer of 6 bytes a
    token (index: 15,000 tokens, engine: 10,000) whose engine cached 70 % is a hit, not the
    wrong prediction absolute counts made it (14,000 < 15,000); on one of 2.8 bytes a token,
    42 % cached of a whole-prompt prediction is wrong, not the hit absolute counts made it.
    Unknown counts keep the absolute judgement."""
    assert classify(15_000, 7_000) == "wrong_prediction"
    assert classify(15_000, 7_000, prompt_tokens=10_000, chain_tokens=15_000) == \
        "predicted_hit"
    assert classify(10_000, 6_000) == "predicted_hit"
    assert classify(10_000, 6_000, prompt_tokens=14_286, chain_tokens=10_000) == \
        "wrong_prediction"
    # Half the prompt predicted, a quarter (engine tokens) cached: the boundary holds.
    assert classify(5_000, 2_500, prompt_tokens=10_000, chain_tokens=10_000) == "predicted_hit"
    assert classify(5_000, 2_499, prompt_tokens=10_000, chain_tokens=10_000) == \
        "wrong_prediction"
    for prompt, est in ((None, 100), (0, 100), (100, None), (100, 0)):
        assert classify(100, 49, prompt, est) == "wrong_prediction"
        assert classify(100, 50, prompt, est) == "predicted_hit"
    assert classify(100, None, 100, 100) == "unknown"
    assert classify(None, 5, 100, 100) == "unpredicted_hit"


# --- property tests against a naive reference model --------------------------------------------


@dataclass
class RefSlot:
    target: int
    gen: int
    last_used: float
    source: str


@dataclass
class Reference:
    """The naive model: a dict of key → slots and a list for the LRU order, same rules."""

    capacity: int
    shards: int = 1  # each an LRU of its share of the capacity, keys by key % shards
    slots: dict[int, list[RefSlot]] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)  # least recently used first

    def cap(self, i: int) -> int:
        return self.capacity // self.shards + (i < self.capacity % self.shards)

    def shard_order(self, i: int) -> list[int]:
        return [k for k in self.order if k % self.shards == i]

    def record(self, keys: tuple[int, ...], target: int, gen: int, now: float, src: str) -> None:
        for key in reversed(keys):
            if key in self.order:
                self.order.remove(key)
            self.order.append(key)
            slots = self.slots.setdefault(key, [])
            mine = [s for s in slots if s.target == target]
            if mine:
                s = mine[0]
                if s.gen != gen or now >= s.last_used:
                    s.last_used, s.source = now, src
                s.gen = gen
                continue
            slots.append(RefSlot(target, gen, now, src))
            if len(slots) > MAX_SLOTS:
                oldest = min(s.last_used for s in slots)
                tied = [i for i, s in enumerate(slots) if s.last_used == oldest]
                del slots[max(tied)]
        for shard in range(self.shards):
            held = self.shard_order(shard)
            cap = self.cap(shard)
            if len(held) > cap:  # a full shard drops its oldest, 1/64 of it extra
                for old in held[: len(held) - cap + cap // 64]:
                    self.order.remove(old)
                    del self.slots[old]

    def remove(self, keys: tuple[int, ...], target: int) -> None:
        for key in keys:
            if key in self.slots:
                self.slots[key] = [s for s in self.slots[key] if s.target != target]
                if not self.slots[key]:
                    del self.slots[key]
                    self.order.remove(key)

    def lookup(self, ch: Chain, gens: dict[int, int]) -> dict[int, Match]:
        out: dict[int, Match] = {}
        targets = {s.target for k in ch.keys for s in self.slots.get(k, [])}
        for t in targets:
            live = [
                i for i, k in enumerate(ch.keys)
                if any(s.target == t and s.gen == gens.get(t) for s in self.slots.get(k, []))
            ]
            if live:
                i = max(live)
                src = next(s.source for s in self.slots[ch.keys[i]] if s.target == t)
                out[t] = Match(ch.ends[i], src)  # type: ignore[arg-type]
        return out


key_pool = st.integers(0, 11)
chains = st.lists(key_pool, unique=True, max_size=6).map(
    lambda ks: Chain(tuple(ks), tuple(range(10, 10 * len(ks) + 1, 10)))
)
targets = st.integers(0, 5)
sources: st.SearchStrategy[Source] = st.sampled_from(["local", "peer", "restored"])
ops = st.one_of(
    st.tuples(st.just("record"), chains, targets, st.integers(0, 5), sources),
    st.tuples(st.just("correct"), chains, targets),
    st.tuples(st.just("forget"), chains, targets),
    st.tuples(st.just("bump"), targets),
    st.tuples(st.just("lookup"), chains),
)


def assert_same(idx: PrefixIndex, ref: Reference) -> None:
    if ref.shards == 1:
        assert idx.lru_order() == ref.order
    else:  # across shards the order interleaves by timestamp; each shard's own is exact
        got = idx.lru_order()
        assert sorted(got) == sorted(ref.order)
        for i in range(ref.shards):
            assert [k for k in got if k % ref.shards == i] == ref.shard_order(i)
    for key in ref.order:
        want = [(s.target, s.gen, s.last_used, s.source) for s in ref.slots[key]]
        assert idx.slots(key) == want


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 8), st.sampled_from([SHARD_ENTRIES, 3, 2]), st.lists(ops, max_size=40))
def test_index_matches_the_reference_model(capacity: int, shard_entries: int,
                                           script: list[tuple]) -> None:
    """Under any sequence of records (with tied and out-of-order timestamps), corrections,
    forgets, generation bumps and lookups, the index holds exactly the reference model's entries,
    slots and LRU order (per shard when it has several), and answers every lookup the same."""
    idx = PrefixIndex(capacity, shard_entries=shard_entries)
    ref = Reference(capacity, shards=-(-capacity // shard_entries))
    gens = {t: 0 for t in range(6)}
    for op in script:
        kind = op[0]
        if kind == "record":
            _, ch, target, now, src = op
            idx.record(ch, target, gens[target], float(now), src)
            ref.record(ch.keys, target, gens[target], float(now), src)
        elif kind in ("correct", "forget"):
            _, ch, target = op
            getattr(idx, kind)(ch, target)
            ref.remove(ch.keys, target)
        elif kind == "bump":
            gens[op[1]] += 1
        else:
            assert idx.lookup(op[1], gens) == ref.lookup(op[1], gens)
        assert_same(idx, ref)
        assert len(idx) <= capacity


def test_a_full_shard_drops_its_oldest_in_one_batch() -> None:
    """Past its capacity an index drops its least recently used entries, 1/64 of the capacity
    more than the overflow at once (one walk of the table per batch): the newest survive, and
    the size never passes the capacity."""
    idx = PrefixIndex(capacity=1000)
    keys = list(range(10_000, 11_001))
    for k, key in enumerate(keys):
        idx.record([key], 1, 0, float(k))
        assert len(idx) <= 1000
    assert len(idx) == 1000 - 1000 // 64
    assert idx.lru_order() == keys[-len(idx):]


def test_a_sharded_index_keeps_each_shards_lru_and_exports_newest_first() -> None:
    """An index larger than one shard: every shard keeps its own newest entries and nothing
    past its share; export is newest first across shards; and a snapshot merged into an index
    of the same capacity rebuilds each shard's order and every slot."""
    import random

    rng = random.Random(7)
    sender = PrefixIndex(capacity=3 * SHARD_ENTRIES)
    keys = [rng.getrandbits(64) for _ in range(4 * SHARD_ENTRIES)]
    for k, key in enumerate(keys):
        sender.record([key], k % 3, 0, float(k))
    assert 3 * SHARD_ENTRIES - 3 * (SHARD_ENTRIES // 64 + 1) <= len(sender) <= 3 * SHARD_ENTRIES
    assert all(key in sender for key in keys[-SHARD_ENTRIES:])  # the newest third: all held
    assert sum(key in sender for key in keys[:SHARD_ENTRIES]) == 0  # the oldest: all gone
    exported = sender.export(lambda t: f"t{t}")
    stamps = [e.slots[0].last_used for e in exported]
    assert stamps == sorted(stamps, reverse=True)
    receiver = PrefixIndex(capacity=3 * SHARD_ENTRIES)
    assert receiver.merge(exported, lambda k: int(k[1:]), lambda t: 0, now=1e9) == 0
    assert receiver.lru_order() == sender.lru_order()
    assert all(receiver.slots(k) == [(t, g, lu, "peer") for t, g, lu, _ in sender.slots(k)]
               for k in keys[-100:])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(chains, targets, st.integers(0, 5)), max_size=20))
def test_export_then_merge_reproduces_the_index(records: list[tuple[Chain, int, int]]) -> None:
    """A snapshot merged into an empty index of the same capacity reproduces every entry, its
    slots (arrival order and timestamps) and the LRU order, with the receiver's ids and gens."""
    sender = PrefixIndex(capacity=8)
    for ch, target, now in records:
        sender.record(ch, target, 0, float(now))
    receiver = PrefixIndex(capacity=8)
    dropped = receiver.merge(
        sender.export(lambda t: f"t{t}"), lambda k: 100 + int(k[1:]), lambda t: 1, now=99.0,
        source="restored",
    )
    assert dropped == 0
    assert receiver.lru_order() == sender.lru_order()
    for key in sender.lru_order():
        want = [(100 + t, 1, lu, "restored") for t, _, lu, _ in sender.slots(key)]
        assert receiver.slots(key) == want


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), st.text(max_size=40)),
             min_size=1, max_size=6),
    st.integers(0, 5),
)
def test_escaping_never_changes_the_chain(pairs: list[tuple[str, str]], cut: int) -> None:
    """For any text, the ASCII-escaped and UTF-8 JSON bodies give the same chain, and a
    conversation shares exactly its common leading messages' links with any prefix of it."""
    messages = [{"role": r, "content": c} for r, c in pairs]
    escaped = json.loads(json.dumps(messages, ensure_ascii=True))
    utf8 = json.loads(json.dumps(messages, ensure_ascii=False))
    full = chain("m", escaped, None, None)
    assert full == chain("m", utf8, None, None)
    head = chain("m", messages[:cut], None, None)
    assert full.keys[: len(head)] == head.keys
    assert full.ends[: len(head)] == head.ends


def _reference_chat_chain(model: str, messages: list[object], tools: object) -> Chain:
    """The chain as first written (each link the SHA-256 of the concatenated fields): the
    streaming version must give the same keys, or every recorded prefix would be lost."""
    import hashlib

    from pharos.prefix import _canonical, _field, _head, _key, _text_len, _utf8

    tools_bytes = _canonical(tools) if tools else b""
    prev = _head(b"chat", model, tools_bytes)
    total = len(tools_bytes)
    keys: list[int] = []
    ends: list[int] = []
    for message in messages:
        if isinstance(message, dict):
            role = message.get("role", "")
            content = message.get("content")
            extra = {k: v for k, v in message.items() if k not in ("role", "content")}
        else:
            role, content, extra = "", message, {}
        role_bytes = _utf8(role) if isinstance(role, str) else _canonical(role)
        content_bytes = (b"s" + _utf8(content) if isinstance(content, str)
                         else b"j" + _canonical(content))
        extra_bytes = _canonical(extra) if extra else b""
        prev = hashlib.sha256(
            prev + _field(role_bytes) + _field(content_bytes) + _field(extra_bytes)).digest()
        total += _text_len(content)
        keys.append(_key(prev))
        ends.append(total)
    return Chain(tuple(keys), tuple(ends))


_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
_MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": _TEXT, "content": _TEXT}),
    st.fixed_dictionaries({"role": _TEXT, "content": st.lists(
        st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT}), max_size=3)}),
    st.fixed_dictionaries({"role": _TEXT, "content": st.none(), "name": _TEXT}),
    st.dictionaries(st.sampled_from(["role", "content", "tool_call_id"]), _TEXT, max_size=3),
    _TEXT,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_MESSAGE, max_size=6), st.none() | st.lists(_TEXT, max_size=2))
def test_streamed_chain_hashing_keeps_every_key(messages: list[object], tools: object) -> None:
    """Hashing each link piece by piece gives the keys and ends of the concatenated form."""
    from pharos.prefix import _chat_chain

    assert _chat_chain("m", messages, tools) == _reference_chat_chain("m", messages, tools)
