"""The admin API's config documents (issue 17 item 4): the running config written back in the
file's shape parses to the same config, secrets are redacted, RFC 7386 merge patches, and a
patch applied like a reload or refused whole."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from pharos.config import Config, parse_config
from pharos.proxy.admin import (
    REDACTED,
    ConfigAdmin,
    merge_patch,
    redact,
    redact_url,
    to_document,
)
from pharos.proxy.errors import ApiError
from tests.support.readme import config_examples

HASH_A = "a" * 64
HASH_B = "b" * 64

#: Every section, every field away from its default.
RICH = f"""
listen: 127.0.0.1:9000
policy: least-load
state_file: /tmp/pharos-state.json.gz
workers: 1
backends:
  - url: http://user:hunter2@10.0.0.1:11434
    kind: ollama
    memory_gb: 24
    capacity: 4
    max_loaded_models: 2
    aliases: {{"llama3.1:8b": llama-8b-engine}}
    logs: file:///var/log/ollama.log
    cost_model: {{prefill_token_s: 0.0001, prefill_pair_s: 3.0e-9, prefill_fixed_s: 0.005}}
    probes:
      - name: my_running
        signal: running
        prom: {{path: /metrics, metric: my_running_total, per_model: model}}
      - name: my_kv
        signal: kv_usage
        prom: {{path: /metrics, metric: kv_pct, scale: percent}}
      - name: my_residency
        signal: residency
        log: {{match: 'loaded (?P<model>\\S+)', value: loaded}}
      - name: my_waiting
        signal: waiting
        log: {{match: 'waiting=(?P<value>\\d+)'}}
  - url: http://10.0.0.2:8000
    kind: vllm
    logs: docker://vllm-1
  - dns: engines.default.svc
    port: 8000
    refresh: 30s
    kind: vllm
    capacity: 8
keys:
  - {{name: ops, sha256: {HASH_A}, admin: true}}
  - {{name: alice, sha256: {HASH_B}, rpm: 10, tokens_per_day: 5000, weight: 3,
     models: [llama-8b], tenant: lab}}
tenants:
  - {{name: lab, weight: 2, rpm: 100, tokens_per_day: 100000}}
usage: {{timezone: Europe/Paris, retention_days: 30, journal: /tmp/usage.jsonl}}
drain: {{grace: 2s, timeout: 1m}}
peers:
  secret_file: /etc/pharos/peer.secret
  listen: 127.0.0.1:8081
  members: ["10.0.0.5:8081", "10.0.0.6:8081"]
routing:
  bounded_load_epsilon: null
  kv_pressure_threshold: 0.8
  hot_prefix_utilization: null
  session_affinity: false
  eviction_pricing: false
  prefix_entries: 5000
  replica_utilization: 0.5
  load_wait_bound: 10s
  swap_grouping: false
  split: {{cost: 90, least-load: 10}}
  shadow: [p2c, prefix-hash]
observability:
  decision_log: {{path: /tmp/decisions.jsonl, sample_rate: 0.25}}
  shadow_log: /tmp/shadow.jsonl
timeouts:
  first_byte: {{generate: 5m, embeddings: 30s}}
  stream_idle: 45s
  request_headers: 5s
  queue_stuck: 2m
  request_body: 60s
  idle: 30s
models:
  - name: llama-8b
    aliases: [llama3.1:8b, meta-llama/Llama-3.1-8B-Instruct]
    shadow: [random]
    cost_model: {{prefill_token_s: 0.0002, prefill_pair_s: 0, prefill_fixed_s: 0.01}}
  - name: qwen
    policy: p2c
"""


def round_trip(config: Config) -> Config:
    return parse_config(yaml.safe_dump(to_document(config)))


def test_document_parses_back_to_the_running_config() -> None:
    """A config with every section and field away from its default comes back equal from its
    document: a patch over it changes only what the patch names."""
    config = parse_config(RICH)
    assert round_trip(config) == config


def test_default_config_round_trips() -> None:
    """An empty file's config comes back equal from its document."""
    assert round_trip(Config()) == Config()


@pytest.mark.parametrize("text", config_examples())
def test_readme_examples_round_trip(text: str) -> None:
    """Every config example of README.rst comes back equal from its document."""
    config = parse_config(text)
    assert round_trip(config) == config


def test_redaction_hides_key_hashes_and_url_passwords() -> None:
    """The shown document carries no key hash and no URL password; the path of the peers'
    secret file is shown (the secret itself is never in the config)."""
    doc = redact(to_document(parse_config(RICH)))
    text = json.dumps(doc)
    assert HASH_A not in text and HASH_B not in text
    assert "hunter2" not in text
    assert [k["sha256"] for k in doc["keys"]] == [REDACTED, REDACTED]
    assert doc["backends"][0]["url"] == f"http://user:{REDACTED}@10.0.0.1:11434"
    assert doc["peers"]["secret_file"] == "/etc/pharos/peer.secret"


def test_redact_url_leaves_plain_urls_alone() -> None:
    """A URL without a password is shown as it is."""
    assert redact_url("http://10.0.0.2:8000") == "http://10.0.0.2:8000"
    assert redact_url("https://user@h:1") == "https://user@h:1"


# RFC 7386 appendix A, every example.
RFC_7386 = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("target", "patch", "result"), RFC_7386)
def test_merge_patch_follows_rfc_7386(target: Any, patch: Any, result: Any) -> None:
    """Each example of RFC 7386's appendix A gives its result, and neither input changes."""
    before = json.dumps([target, patch])
    assert merge_patch(target, patch) == result
    assert json.dumps([target, patch]) == before


class Running:
    """A stand-in for the service: the running config, its generation, what was applied."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.generation = 0
        self.applied: list[Config] = []

    def apply(self, config: Config) -> None:
        self.config = config
        self.generation += 1
        self.applied.append(config)

    def admin(self) -> ConfigAdmin:
        return ConfigAdmin(lambda: self.config, self.apply, lambda: self.generation,
                           "/etc/pharos/pharos.yaml")


BASE = f"""
listen: 127.0.0.1:9000
backends: [{{url: "http://10.0.0.1:11434", kind: ollama}}]
keys: [{{name: ops, sha256: {HASH_A}, admin: true}}]
"""


def test_a_live_patch_applies_and_bumps_the_generation() -> None:
    """A patch of live fields is put in force (only those fields change) and the generation
    moves; the document shows it."""
    run = Running(parse_config(BASE))
    admin = run.admin()
    done = admin.patch(json.dumps({"policy": "p2c", "routing": {"shadow": ["random"]},
                                   "timeouts": {"stream_idle": 30}}).encode())
    assert done.errors == ()
    assert set(done.applied) == {"policy", "routing.shadow", "timeouts.stream_idle"}
    assert run.config.policy == "p2c"
    assert run.config.routing.shadow == ("random",)
    assert run.config.timeouts.stream_idle == 30.0
    assert run.config.listen.address == "127.0.0.1:9000"
    doc = admin.document()
    assert doc["generation"] == 1 and doc["patched"] is True
    assert doc["config"]["policy"] == "p2c"


def test_an_empty_or_unchanged_patch_applies_nothing() -> None:
    """A patch that changes nothing is accepted, applies nothing, and keeps the generation."""
    run = Running(parse_config(BASE))
    assert run.admin().patch(b"{}").applied == ()
    assert run.admin().patch(b'{"policy": "cost"}').applied == ()
    assert run.applied == []


@pytest.mark.parametrize(("patch", "needle"), [
    ({"listen": ":9999"}, "listen: needs a restart"),
    ({"routing": {"prefix_entries": 10}}, "routing.prefix_entries: needs a restart"),
    ({"timeouts": {"idle": 5}}, "timeouts.idle: needs a restart"),
    ({"routing": {"nonsense": 1}}, "routing: unknown field 'nonsense'"),
    ({"polcy": "p2c"}, "unknown field 'polcy'"),
    ({"policy": "fastest"}, "policy: expected one of"),
    ({"routing": {"split": {"cost": 50, "p2c": 20}}}, "add up to 70"),
])
def test_refused_patches_apply_nothing(patch: dict[str, Any], needle: str) -> None:
    """A patch naming a restart-only field, an unknown field or a bad value is refused whole
    with an error naming it; a live field in the same patch is not applied either."""
    run = Running(parse_config(BASE))
    done = run.admin().patch(json.dumps({**patch, "policy": patch.get("policy", "p2c")})
                             .encode())
    assert done.applied == ()
    assert any(needle in e for e in done.errors), done.errors
    assert run.applied == [] and run.config.policy == "cost"


def test_every_error_is_reported() -> None:
    """A patch with several mistakes gets all of them at once."""
    run = Running(parse_config(BASE))
    done = run.admin().patch(json.dumps({"listen": ":1", "drain": {"grace": 1},
                                         "routing": {"x": 1}, "policy": "?"}).encode())
    assert len(done.errors) >= 2
    text = "\n".join(done.errors)
    assert "routing: unknown field 'x'" in text and "policy" in text


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'"cost"', b"null"])
def test_a_body_that_is_not_a_json_object_is_400(body: bytes) -> None:
    """The patch must be a JSON object: anything else is a 400, nothing applied."""
    run = Running(parse_config(BASE))
    with pytest.raises(ApiError) as e:
        run.admin().patch(body)
    assert e.value.status == 400
    assert run.applied == []


def test_a_redacted_hash_sent_back_keeps_the_running_one() -> None:
    """The keys list as GET shows it (hashes redacted) can be sent back with a change: each
    key keeps its running hash; a new key needs a real one."""
    run = Running(parse_config(BASE))
    admin = run.admin()
    keys = admin.document()["config"]["keys"]
    keys[0]["rpm"] = 7
    done = admin.patch(json.dumps({"keys": keys}).encode())
    assert done.applied == ("keys",)
    assert run.config.keys[0].sha256 == HASH_A and run.config.keys[0].rpm == 7
    done = admin.patch(json.dumps({"keys": [*keys, {"name": "new", "sha256": REDACTED}]})
                       .encode())
    assert any("keys[1].sha256" in e for e in done.errors)


def test_workers_refuse_patches() -> None:
    """With workers sharing the port a patch would reach one of them: 409."""
    run = Running(parse_config("listen: 127.0.0.1:9000\nworkers: 2\n"))
    with pytest.raises(ApiError) as e:
        run.admin().patch(b'{"policy": "p2c"}')
    assert e.value.status == 409


def test_peers_by_dns_round_trips() -> None:
    """A mesh found by DNS (no members) comes back equal from its document."""
    config = parse_config("peers: {secret_file: /s, dns: pharos-peers.default.svc}\n")
    assert round_trip(config) == config
