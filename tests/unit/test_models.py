"""The fleet's models (issue 17 items 1 and 3): ``models:`` parsing and its bad input, the
targeted rewrite of the body's model, aliases composed into backends, the listing, and split
arms."""

from __future__ import annotations

import json
from collections import Counter
from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pharos.config import Backend, ConfigError, parse_config
from pharos.models import Fleet, ModelSpec, arm, request_key, rewrite_model
from pharos.policy import PolicyConfig
from pharos.proxy.parse import parse


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    return info.value.errors


def test_models_parse_with_every_field() -> None:
    """A ``models:`` entry with every field, and ``routing.split``/``shadow``, parse."""
    c = parse_config("""
models:
  - name: llama-8b
    aliases: ["llama3.1:8b", meta-llama/Llama-3.1-8B-Instruct]
    split: {cost: 90, least-load: 10}
    shadow: [p2c, round-robin]
    cost_model: {prefill_token_s: 0.0001, prefill_pair_s: 3.3e-9, prefill_fixed_s: 0.005}
  - name: tiny
    policy: least-load
routing: {split: {cost: 50, random: 50}, shadow: [least-load]}
observability: {shadow_log: /tmp/shadow.jsonl}
""")
    assert c.models == (
        ModelSpec("llama-8b", ("llama3.1:8b", "meta-llama/Llama-3.1-8B-Instruct"), None,
                  (("cost", 90), ("least-load", 10)), ("p2c", "round-robin"),
                  (0.0001, 3.3e-9, 0.005)),
        ModelSpec("tiny", (), "least-load"))
    assert c.routing.split == (("cost", 50), ("random", 50))
    assert c.routing.shadow == ("least-load",)
    assert c.observability.shadow_log == "/tmp/shadow.jsonl"


@pytest.mark.parametrize(("text", "message"), [
    ("models: [{name: a, split: {cost: 90, least-load: 20}}]",
     "models[0].split: the weights add up to 110, not 100"),
    ("routing: {split: {cost: 99}}", "routing.split: the weights add up to 99, not 100"),
    ("routing: {split: {cost: 50, fastest: 50}}", "routing.split.fastest: unknown policy"),
    ("routing: {split: {cost: 50.5, least-load: 49.5}}",
     "routing.split.cost: expected a whole percent >= 0, got 50.5"),
    ("routing: {shadow: [cost, nope]}", "routing.shadow[1]: expected one of cost"),
    ("routing: {shadow: [p2c, p2c]}", "routing.shadow[1]: 'p2c' is listed twice"),
    ("models: [{name: a, policy: fastest}]", "models[0].policy: expected one of cost"),
    ("models: [{name: a, aliases: [b]}, {name: b}]",
     "models[1].name: 'b' is already used by models[0].aliases[0]"),
    ("models: [{name: a, policy: cost, split: {cost: 100}}]",
     "models[0].split: a model has a policy or a split, not both"),
    ("models: [{aliases: [x]}]", "models[0]: missing required field 'name'"),
    ("models: [{name: a, weight: 3}]", "models[0]: unknown field 'weight'"),
    ("models: {name: a}", "models: expected a list"),
])
def test_bad_models_are_refused_naming_the_field(text: str, message: str) -> None:
    """Splits not adding up to 100, unknown policy names, names used twice, unknown fields:
    the whole file is refused with a message naming the field (nothing is half-applied)."""
    assert any(e.startswith(message) for e in errors(text)), errors(text)


BODY = json.dumps({"messages": [{"role": "user", "content": "say \"model\": no"}],
                   "model": "llama-8b", "stream": False, "metadata": {"k": "v"}}).encode()


def test_rewrite_changes_only_the_model_bytes() -> None:
    """The top-level model value is replaced and every other byte stays as sent (the key
    inside a string is not touched)."""
    out = rewrite_model(BODY, "llama3.1:8b", True)
    assert out == BODY.replace(b'"model": "llama-8b"', b'"model": "llama3.1:8b"')
    assert json.loads(out)["model"] == "llama3.1:8b"
    unicode = rewrite_model(BODY, "modèle/ü", True)
    assert unicode is not None and json.loads(unicode)["model"] == "modèle/ü"


def test_rewrite_inserts_a_missing_model() -> None:
    """No model sent: one is inserted after the opening brace."""
    body = b' {"messages": []}'
    out = rewrite_model(body, "tiny", False)
    assert out == b' {"model":"tiny","messages": []}' and json.loads(out)["model"] == "tiny"
    assert rewrite_model(b"{}", "tiny", False) == b'{"model":"tiny"}'


@pytest.mark.parametrize("body", [
    b'{"extra": {"model": "x"}, "mod\\u0065l": "x"}',  # the top-level key is escaped
    b'{"model": "x", "tools": [{"model": "x"}]}',  # the key twice
    b'{"tools": [{"model": "x"}], "\\u006dodel": "x"}',  # nested plain, top escaped
    b'{"model": 5}',  # not a string
])
def test_rewrite_says_when_it_cannot_be_sure(body: bytes) -> None:
    """Where the top-level key (which the decode found) is not the one plain occurrence,
    the rewrite declines (the caller re-encodes) instead of touching the wrong bytes."""
    assert json.loads(body).get("model") is not None
    assert rewrite_model(body, "y", True) is None


@given(st.dictionaries(st.text(max_size=6).filter(lambda k: k != "model"),
                       st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                                    lambda inner: st.lists(inner, max_size=3)
                                    | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                                    max_leaves=8), max_size=5),
       st.text(min_size=1, max_size=20), st.text(min_size=1, max_size=20), st.booleans())
def test_rewrite_is_a_decode_equivalent(doc: dict[str, object], sent: str, served: str,
                                        ascii_only: bool) -> None:
    """Whatever the body holds, a rewrite (when it does one) decodes to the client's body
    with only ``model`` changed."""
    full = {**doc, "model": sent}
    raw = json.dumps(full, ensure_ascii=ascii_only).encode()
    out = rewrite_model(raw, served, True)
    if out is not None:
        assert json.loads(out) == {**full, "model": served}


def test_forward_body_rewrites_aliases_and_keeps_usage_insertion() -> None:
    """A request for the fleet name reaches each engine under its own name with the rest of
    the bytes untouched, and a streamed chat still gets include_usage appended."""
    fleet = Fleet([ModelSpec("llama-8b", ("llama3.1:8b", "tiny"))])

    def resolve(m: str | None) -> str | None:
        return fleet.resolve(m, lambda: {"llama-8b"})

    p = parse(BODY, "/v1/chat/completions", resolve)
    assert p.model == "llama-8b" and p.sent_model is None
    assert p.forward_body("llama-8b") is p.raw
    assert p.forward_body("tiny") == BODY.replace(b'"llama-8b"', b'"tiny"')
    alias = BODY.replace(b'"llama-8b"', b'"tiny"')
    p = parse(alias, "/v1/chat/completions", resolve)
    assert p.model == "llama-8b" and p.sent_model == "tiny"
    assert p.forward_body("tiny") is p.raw
    stream = json.dumps({"model": "tiny", "messages": [], "stream": True}).encode()
    p = parse(stream, "/v1/chat/completions", resolve)
    out = json.loads(p.forward_body("llama3.1:8b"))
    assert out["model"] == "llama3.1:8b" and out["stream_options"] == {"include_usage": True}
    none = parse(b'{"messages": []}', "/v1/chat/completions", resolve)
    assert none.model == "llama-8b" and none.sent_model == ""
    assert json.loads(none.forward_body("tiny")) == {"model": "tiny", "messages": []}


def test_omitted_model_needs_exactly_one_served() -> None:
    """No model: routed to the fleet's one model; with two (or none) it is the usual 400."""
    fleet = Fleet()
    assert fleet.resolve(None, lambda: {"a"}) == "a"
    assert fleet.resolve(None, lambda: {"a", "b"}) is None
    assert fleet.resolve(None, lambda: set()) is None


def test_aliases_compose_into_backend_specs() -> None:
    """A backend's own rename comes first and then the fleet's; engine names the fleet does
    not know stay; a backend's own alias onto an alias lands on the model's name."""
    fleet = Fleet([ModelSpec("llama-8b", ("llama3.1:8b", "tiny"))])
    plain, own = Backend(url="http://a"), Backend(url="http://b", aliases=MappingProxyType(
        {"cpp-model": "tiny", "other": "kept"}))
    a, b = fleet.with_aliases([plain, own])
    assert dict(a.aliases) == {"llama3.1:8b": "llama-8b", "tiny": "llama-8b"}
    assert dict(b.aliases) == {"cpp-model": "llama-8b", "other": "kept",
                               "llama3.1:8b": "llama-8b", "tiny": "llama-8b"}
    assert Fleet().with_aliases([plain]) == [plain]


def test_listing_names_aliases_of_served_models() -> None:
    """``/v1/models`` lists each served model, and each alias of a fleet model it serves."""
    fleet = Fleet([ModelSpec("llama-8b", ("llama3.1:8b", "tiny")), ModelSpec("off", ("x",))])
    assert fleet.listing({"llama-8b", "qwen"}) == [
        ("llama-8b", None), ("llama3.1:8b", "llama-8b"), ("tiny", "llama-8b"), ("qwen", None)]


def test_split_arms_follow_the_weights_and_the_key() -> None:
    """Arms are drawn in proportion to their weights over many keys, and one key (a
    conversation) always gets the same arm; a model's split beats the global one, a model's
    policy beats both, and a model with neither follows the scheduler (None)."""
    split = (("cost", 90), ("least-load", 10))
    counts = Counter(arm(split, request_key(None, f"req-{i}")) for i in range(4000))
    assert 3400 < counts["cost"] < 3800 and counts["cost"] + counts["least-load"] == 4000
    key = request_key(12345, "ignored")
    assert len({arm(split, key) for _ in range(20)}) == 1
    base = PolicyConfig(kv_pressure_threshold=0.8)
    fleet = Fleet([ModelSpec("a", split=(("p2c", 100),)), ModelSpec("b", policy="random"),
                   ModelSpec("c")], base, split=(("least-load", 100),))
    pa, pb, pc = (fleet.policy_for(m, key) for m in ("a", "b", "c"))
    assert pa is not None and pa.name == "p2c" and pa.kv_pressure_threshold == 0.8
    assert pb is not None and pb.name == "random"
    assert pc is not None and pc.name == "least-load"
    assert Fleet([ModelSpec("a")], base).policy_for("a", key) is None
