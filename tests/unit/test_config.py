"""Config parsing (spec §10): the example file, defaults, strict errors with paths, own probes."""

from __future__ import annotations

import copy
import dataclasses
import re
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
import yaml
from twisted.internet import endpoints
from twisted.internet.testing import MemoryReactor

from pharos.config import (
    BACKEND_KINDS,
    Backend,
    Config,
    ConfigError,
    DrainConfig,
    Key,
    Listen,
    LogFeed,
    LogSpec,
    OwnProbe,
    PeersConfig,
    PromSpec,
    UsageConfig,
    load_config,
    parse_config,
    parse_duration,
    reload_diff,
)
from pharos.engine.signals import Residency, Signal

SAMPLES = Path(__file__).parent / "config_samples"
LIBRARY = frozenset({"vllm-running", "ollama-ps-residency"})
ALICE = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
OPS = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
P = "backends[0].probes[0]"
PROM = {"path": "/metrics", "metric": "vllm:num_requests_running"}


def parse(text: str) -> Config:
    return parse_config(textwrap.dedent(text), library_names=LIBRARY)


def parse_obj(obj: object) -> Config:
    return parse_config(yaml.safe_dump(obj), library_names=LIBRARY)


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(text)
    return info.value.errors


def obj_errors(obj: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_obj(obj)
    return info.value.errors


def with_probes(*probes: dict[str, Any]) -> dict[str, Any]:
    return {"backends": [{"url": "http://gpu-box:8000", "probes": copy.deepcopy(list(probes))}]}


def probe_errors(**probe: Any) -> list[str]:
    return obj_errors(with_probes(probe))


def twisted_endpoint(description: str) -> Any:
    """The endpoint Twisted builds from a strports description (nothing listens)."""
    server_from_string: Any = endpoints.serverFromString
    memory_reactor: Any = MemoryReactor
    return server_from_string(memory_reactor(), description)


def test_spec_example_parses() -> None:
    """The §10 example file parses into exactly the values it spells out."""
    config = parse_config((SAMPLES / "spec_example.yaml").read_text(), library_names=LIBRARY)
    assert config.listen == Listen(":8090")
    assert config.policy == "cost"
    ollama, vllm = config.backends
    assert ollama == Backend(
        url="http://gpu-box:11434",
        kind="auto",
        memory_gb=24.0,
        capacity=4,
        aliases={"qwen2.5:3b-instruct-q4_K_M": "qwen2.5:3b"},
    )
    assert vllm.url == "http://gpu-box:8000"
    assert vllm.kind == "vllm"
    assert vllm.logs == LogFeed("docker", "vllm-1")
    assert vllm.probes[0] == OwnProbe(
        name="my-vllm-running",
        signal=Signal.RUNNING,
        spec=PromSpec(path="/metrics", metric="vllm:num_requests_running", per_model="model_name"),
    )
    loaded = vllm.probes[1]
    assert (loaded.name, loaded.signal) == ("my-model-loaded", Signal.RESIDENCY)
    assert isinstance(loaded.spec, LogSpec)
    assert loaded.spec.value is Residency.LOADED
    match = loaded.spec.match.search("model qwen2.5:3b loaded")
    assert match is not None and match["model"] == "qwen2.5:3b"
    assert config.keys == (
        Key(name="alice", sha256=ALICE, rpm=60, tokens_per_day=2_000_000, weight=1, models=()),
        Key(name="ops", sha256=OPS, admin=True),
    )
    assert config.state_file == "/data/pharos.state"
    assert config.usage == UsageConfig(timezone="Asia/Bangkok", retention_days=400)
    assert config.drain == DrainConfig(grace=5.0, timeout=600.0)
    assert config.peers == PeersConfig(
        secret_file="/run/secrets/pharos-peer",
        listen=Listen(":8081"),
        members=("pharos-a:8081", "pharos-b:8081", "pharos-c:8081"),
    )


@pytest.mark.parametrize("text", ["", "# nothing set yet\n", "{}", "---\n"])
def test_empty_file_is_all_defaults(text: str) -> None:
    """An empty file is a valid config: no backends, no keys, and the spec's defaults."""
    config = parse(text)
    assert config == Config()
    assert config.listen.strports() == "tcp:8090:interface=127.0.0.1:backlog=1024"
    assert config.policy == "cost"
    assert (config.backends, config.keys, config.state_file, config.peers) == ((), (), None, None)
    assert config.usage == UsageConfig(timezone=None, retention_days=400)
    assert config.drain == DrainConfig(grace=5.0, timeout=600.0)


def test_backend_key_and_peer_defaults() -> None:
    """Fields left out of a backend, a key or peers take the spec's defaults."""
    config = parse(f"""
        backends: [{{url: http://e:11434}}]
        keys: [{{name: alice, sha256: {ALICE}}}]
        peers: {{secret_file: /s, dns: pharos-peers}}
        """)
    assert config.backends == (Backend(url="http://e:11434"),)
    backend = config.backends[0]
    assert (backend.kind, backend.memory_gb, backend.capacity) == ("auto", None, None)
    assert (dict(backend.aliases), backend.logs, backend.probes) == ({}, None, ())
    key = config.keys[0]
    assert (key.rpm, key.tokens_per_day, key.weight, key.models, key.admin) == (
        None, None, 1, (), False
    )
    assert config.peers == PeersConfig(secret_file="/s", listen=Listen(":8081"), dns="pharos-peers")


def test_null_means_left_out() -> None:
    """An optional field written with no value (YAML null) takes its default instead of failing."""
    config = parse("""
        listen:
        policy:
        backends:
          - url: http://e:1
            kind:
            capacity:
            aliases:
            logs:
            probes:
        keys:
        usage:
        drain: {grace: , timeout: }
        peers:
        """)
    assert config == Config(backends=(Backend(url="http://e:1"),))


def test_config_objects_are_frozen() -> None:
    """Parsed config is immutable, so a reload swaps it whole instead of mutating shared state."""
    config = parse("backends: [{url: 'http://e:1', aliases: {a: b}}]")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.policy = "least-load"  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.backends[0].aliases["c"] = "d"  # type: ignore[index]


def test_kinds_match_the_library() -> None:
    """Every recipe kind the library ships is accepted, plus auto, and nothing else."""
    from pharos.engine.library import KINDS

    assert set(BACKEND_KINDS) == {"auto", *KINDS}


def test_top_level_must_be_a_mapping() -> None:
    """A file that isn't a mapping is one clear error, not a crash."""
    assert errors("- a\n- b\n") == ["top level: expected a mapping, got a list"]
    assert errors("just words") == ["top level: expected a mapping, got 'just words'"]


def test_yaml_syntax_error_has_line_and_column() -> None:
    """Broken YAML is reported once, with the line and column the parser stopped at."""
    assert errors("listen: :8090\npolicy: [cost\n") == [
        "line 3, column 1: expected ',' or ']', but got '<stream end>'"
    ]
    assert errors("a: b: c\n") == ["line 1, column 5: mapping values are not allowed here"]


def test_duplicate_mapping_key_is_an_error() -> None:
    """A field written twice is an error: YAML would otherwise keep the last one silently."""
    assert errors("policy: cost\npolicy: least-load\n") == [
        "line 2, column 1: duplicate mapping key 'policy'"
    ]


def test_anchors_and_merge_keys_share_settings() -> None:
    """YAML anchors share own probes between backends, and a merge key can be overridden."""
    config = parse("""
        backends:
          - &gpu
            url: http://a:1
            kind: ollama
            capacity: 2
            probes:
              - &mine {name: mine, signal: running, prom: {path: /metrics, metric: m}}
          - <<: *gpu
            url: http://b:1
            probes: [*mine]
        """)
    a, b = config.backends
    assert (b.url, b.kind, b.capacity) == ("http://b:1", "ollama", 2)
    assert a.probes == b.probes
    assert a.probes[0].name == "mine"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("lissen: ':8090'", "top level: unknown field 'lissen'"),
        ("backends: [{url: 'http://e:1', kidn: vllm}]", "backends[0]: unknown field 'kidn'"),
        ("keys: [{name: a, sha256: " + ALICE + ", rmp: 3}]", "keys[0]: unknown field 'rmp'"),
        ("usage: {tz: UTC}", "usage: unknown field 'tz'"),
        ("drain: {grace_period: 5s}", "drain: unknown field 'grace_period'"),
        ("peers: {secret_file: /s, dns: p, member: [a:1]}", "peers: unknown field 'member'"),
        ("1: x", "top level: unknown field 1"),
    ],
)
def test_unknown_field_names_its_path(text: str, error: str) -> None:
    """An unknown field anywhere is an error that names where it is."""
    assert errors(text) == [error]


def test_unknown_field_in_own_probe() -> None:
    """The spec's own example typo (per-model for per_model) fails with its full path."""
    config = with_probes({"name": "ok", "signal": "running", "prom": PROM})
    config["backends"].insert(0, {"url": "http://gpu-box:11434"})
    config["backends"][1]["probes"][0]["prom"]["per-model"] = "model_name"
    assert obj_errors(config) == ["backends[1].probes[0].prom: unknown field 'per-model'"]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("backends: [{}]", "backends[0]: missing required field 'url'"),
        ("keys: [{sha256: " + ALICE + "}]", "keys[0]: missing required field 'name'"),
        ("keys: [{name: a}]", "keys[0]: missing required field 'sha256'"),
        ("peers: {dns: p}", "peers: missing required field 'secret_file'"),
    ],
)
def test_missing_required_field(text: str, error: str) -> None:
    """A required field left out names the field and the object that lacks it."""
    assert errors(text) == [error]

#: Every policy name, as a refused ``policy:`` lists them.
ONE_OF = "cost, least-load, round-robin, random, p2c, prefix-hash"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("policy: fastest", f"policy: expected one of {ONE_OF}, got 'fastest'"),
        ("policy: 3", f"policy: expected one of {ONE_OF}, got 3"),
        (
            "backends: [{url: 'http://e:1', capacity: four}]",
            "backends[0].capacity: expected a positive integer, got 'four'",
        ),
        (
            "backends: [{url: 'http://e:1', capacity: true}]",
            "backends[0].capacity: expected a positive integer, got true",
        ),
        (
            "backends: [{url: 'http://e:1', capacity: 0}]",
            "backends[0].capacity: expected a positive integer, got 0",
        ),
        (
            "backends: [{url: 'http://e:1', capacity: 2.5}]",
            "backends[0].capacity: expected a positive integer, got 2.5",
        ),
        (
            "backends: [{url: 'http://e:1', kind: trtllm}]",
            "backends[0].kind: expected one of auto, ollama, llamacpp, llama-swap, vllm, sglang, "
            "openai, got 'trtllm'",
        ),
        (
            "backends: [{url: 'http://e:1', memory_gb: 0}]",
            "backends[0].memory_gb: expected a positive number, got 0",
        ),
        (
            "backends: [{url: 'http://e:1', memory_gb: '24'}]",
            "backends[0].memory_gb: expected a positive number, got '24'",
        ),
        (
            "backends: [{url: 'http://e:1', memory_gb: .inf}]",
            "backends[0].memory_gb: expected a positive number, got inf",
        ),
        ("backends: {url: 'http://e:1'}", "backends: expected a list, got a mapping"),
        ("backends: [http://e:1]", "backends[0]: expected a mapping, got 'http://e:1'"),
        (
            "backends: [{url: 'http://e:1', probes: {name: x}}]",
            "backends[0].probes: expected a list, got a mapping",
        ),
        ("state_file: ''", "state_file: expected a path, got ''"),
        ("state_file: [a]", "state_file: expected a path, got a list"),
        (
            "usage: {timezone: Mars/Olympus_Mons}",
            "usage.timezone: expected an IANA time zone name, got 'Mars/Olympus_Mons'",
        ),
        (
            "usage: {timezone: ../etc/passwd}",
            "usage.timezone: expected an IANA time zone name, got '../etc/passwd'",
        ),
        (
            "usage: {retention_days: -1}",
            "usage.retention_days: expected a positive integer, got -1",
        ),
        ("usage: UTC", "usage: expected a mapping, got 'UTC'"),
        (
            "drain: {timeout: forever}",
            "drain.timeout: expected a duration such as 5s, 10m or 1h30m, or a number of "
            "seconds, got 'forever'",
        ),
    ],
)
def test_wrong_type_or_value(text: str, error: str) -> None:
    """A value of the wrong type or out of range names its path, what was expected and what the
    file has (bool is not an integer, even though Python says so)."""
    assert errors(text) == [error]


@pytest.mark.parametrize(
    ("key", "error"),
    [
        ({"sha256": ALICE.upper()}, "keys[0].sha256: expected 64 lowercase hex digits, got '9F8"),
        ({"sha256": ALICE[:-1]}, "keys[0].sha256: expected 64 lowercase hex digits, got '9f8"),
        ({"rpm": 0}, "keys[0].rpm: expected a positive integer, got 0"),
        ({"tokens_per_day": 1.5}, "keys[0].tokens_per_day: expected a positive integer, got 1.5"),
        ({"weight": 0}, "keys[0].weight: expected a positive integer, got 0"),
        ({"models": "llama3"}, "keys[0].models: expected a list, got 'llama3'"),
        ({"models": ["a", 3]}, "keys[0].models[1]: expected a non-empty string, got 3"),
        ({"admin": "maybe"}, "keys[0].admin: expected true or false, got 'maybe'"),
        ({"name": ""}, "keys[0].name: expected a non-empty string, got ''"),
    ],
)
def test_key_errors(key: dict[str, object], error: str) -> None:
    """Each key field is checked: the hash's form, the limits, the allow-list, admin."""
    found = obj_errors({"keys": [{"name": "alice", "sha256": ALICE, **key}]})
    assert len(found) == 1 and found[0].startswith(error)


def test_key_limits_and_allow_list() -> None:
    """Key limits, weight and allow-list are kept as written."""
    (key,) = parse_obj(
        {"keys": [{"name": "a", "sha256": ALICE, "rpm": 5, "weight": 3, "models": ["m1", "m2"]}]}
    ).keys
    assert key == Key(name="a", sha256=ALICE, rpm=5, weight=3, models=("m1", "m2"))


def test_duplicate_key_name_and_hash() -> None:
    """Key names are unique (usage is recorded by name) and so are their hashes."""
    assert obj_errors(
        {
            "keys": [
                {"name": "alice", "sha256": ALICE},
                {"name": "bob", "sha256": OPS},
                {"name": "alice", "sha256": "0" * 64},
                {"name": "carol", "sha256": OPS},
            ]
        }
    ) == [
        "keys[2].name: duplicate key name 'alice'",
        "keys[3].sha256: duplicate key hash, already used by 'bob'",
    ]


@pytest.mark.parametrize(
    ("url", "normalized"),
    [
        ("http://gpu-box:11434", "http://gpu-box:11434"),
        ("http://gpu-box:11434/", "http://gpu-box:11434"),
        ("https://llm.example.com/ollama/", "https://llm.example.com/ollama"),
        ("http://[::1]:8000", "http://[::1]:8000"),
    ],
)
def test_backend_url_accepted(url: str, normalized: str) -> None:
    """Absolute http(s) URLs are accepted without a trailing slash, so paths join onto them."""
    assert parse_obj({"backends": [{"url": url}]}).backends[0].url == normalized


@pytest.mark.parametrize(
    "url", ["gpu-box:11434", "ftp://e:21", "http://", "http://e:99999", "http://e/?a=1", 11434]
)
def test_backend_url_rejected(url: object) -> None:
    """Anything but an absolute http or https URL, without query or fragment, is an error."""
    assert obj_errors({"backends": [{"url": url}]}) == [
        f"backends[0].url: expected an absolute http or https URL, got {url!r}"
    ]


def test_duplicate_backend_url() -> None:
    """Two backends with the same URL (trailing slash aside) are one engine listed twice."""
    assert errors("backends: [{url: 'http://e:1'}, {url: 'http://e:1/'}]") == [
        "backends[1].url: duplicate backend url 'http://e:1'"
    ]


@pytest.mark.parametrize(
    ("logs", "feed"),
    [
        ("docker://vllm-1", LogFeed("docker", "vllm-1")),
        ("file:///var/log/ollama/server.log", LogFeed("file", "/var/log/ollama/server.log")),
    ],
)
def test_log_feed_forms(logs: str, feed: LogFeed) -> None:
    """A log feed is a Docker container or an absolute local file."""
    assert parse_obj({"backends": [{"url": "http://e:1", "logs": logs}]}).backends[0].logs == feed


@pytest.mark.parametrize(
    "logs", ["docker://", "docker://a b", "file://relative/x", "/var/log/x", "journal://ollama"]
)
def test_log_feed_rejected(logs: str) -> None:
    """Anything else as a log feed is an error naming the two accepted forms."""
    assert obj_errors({"backends": [{"url": "http://e:1", "logs": logs}]}) == [
        "backends[0].logs: expected docker://<container> or file:///<absolute path>, "
        f"got {logs!r}"
    ]


def test_aliases_are_checked() -> None:
    """Aliases map engine names to client names; two engine names can't claim one client name,
    and both sides must be strings."""
    aliases = {"a": "x", "b": "x", "c": 3, "d": "y"}
    assert obj_errors({"backends": [{"url": "http://e:1", "aliases": aliases}]}) == [
        "backends[0].aliases['b']: 'a' and 'b' both map to 'x'",
        "backends[0].aliases['c']: expected a non-empty string, got 3",
    ]
    assert errors("backends: [{url: 'http://e:1', aliases: [a, b]}]") == [
        "backends[0].aliases: expected a mapping of engine model name to client model name, "
        "got a list"
    ]


def test_several_errors_all_reported() -> None:
    """Every error in a file is reported at once, in file order, one per line of the message."""
    with pytest.raises(ConfigError) as info:
        parse_config((SAMPLES / "many_errors.yaml").read_text(), library_names=LIBRARY)
    expected = [
        "top level: unknown field 'lissen'",
        "listen: expected :port, host:port, [ipv6]:port or a Twisted endpoint such as "
        "tcp:8090:interface=127.0.0.1, got 'nowhere'",
        f"policy: expected one of {ONE_OF}, got 'fastest'",
        "backends[0]: missing required field 'url'",
        "backends[1].capacity: expected a positive integer, got 'four'",
        "backends[1].probes[0].name: 'vllm-running' is already a library probe's name",
        "backends[1].probes[0].prom: unknown field 'per-model'",
        "keys[1].weight: expected a positive integer, got 0",
        "keys[2].name: duplicate key name 'alice'",
        "usage.timezone: expected an IANA time zone name, got 'Mars/Olympus_Mons'",
        "drain.grace: expected a duration such as 5s, 10m or 1h30m, or a number of seconds, "
        "got 'soon'",
    ]
    assert info.value.errors == expected
    assert str(info.value) == "\n".join(expected)


def test_duplicate_key_reported_with_other_errors() -> None:
    """A duplicate mapping key doesn't hide the file's other errors."""
    assert errors("policy: cost\npolicy: cost\ncolour: blue\n") == [
        "line 2, column 1: duplicate mapping key 'policy'",
        "top level: unknown field 'colour'",
    ]


def test_valid_prom_probe() -> None:
    """A prom probe for a load signal keeps its path, metric, label and scale."""
    prom = {"path": "/metrics", "metric": "vllm:kv_cache_usage_perc", "per_model": "model_name"}
    config = parse_obj(with_probes({"name": "kv", "signal": "kv_usage", "prom": prom}))
    assert config.backends[0].probes == (
        OwnProbe("kv", Signal.KV_USAGE, PromSpec(**prom, scale="ratio")),
    )
    percent = parse_obj(
        with_probes({"name": "kv", "signal": "kv_usage", "prom": {**prom, "scale": "percent"}})
    )
    spec = percent.backends[0].probes[0].spec
    assert isinstance(spec, PromSpec) and spec.scale == "percent"


@pytest.mark.parametrize(
    ("signal", "log", "value"),
    [
        ("residency", {"match": r"model (?P<model>\S+) loaded", "value": "loaded"},
         Residency.LOADED),
        ("residency", {"match": r"unloading (?P<model>\S+)", "value": "cold"}, Residency.COLD),
        ("capacity", {"match": r"OLLAMA_NUM_PARALLEL:(?P<value>\d+)"}, None),
        ("capacity", {"match": r"single slot", "value": 1}, 1),
        ("running", {"match": r"idle", "value": 0}, 0),
        ("kv_usage", {"match": r"cache full", "value": 1}, 1.0),
        ("version", {"match": r"version=(?P<value>\S+)"}, None),
        ("version", {"match": r"starting v2", "value": "2.0"}, "2.0"),
    ],
)
def test_valid_log_probe(signal: str, log: dict[str, object], value: object) -> None:
    """A log probe keeps its compiled pattern and a fixed value typed for its signal."""
    (probe,) = parse_obj(with_probes({"name": "mine", "signal": signal, "log": log})).backends[
        0
    ].probes
    assert probe.signal is Signal(signal)
    assert isinstance(probe.spec, LogSpec)
    assert isinstance(probe.spec.match, re.Pattern)
    assert probe.spec.match.pattern == log["match"]
    assert probe.spec.value == value
    assert type(probe.spec.value) is type(value)


@pytest.mark.parametrize(
    ("probe", "error"),
    [
        ({"signal": "running", "prom": PROM}, f"{P}: missing required field 'name'"),
        ({"name": "mine", "prom": PROM}, f"{P}: missing required field 'signal'"),
        ({"name": "", "signal": "running", "prom": PROM},
         f"{P}.name: expected a non-empty string, got ''"),
        ({"name": "vllm-running", "signal": "running", "prom": PROM},
         f"{P}.name: 'vllm-running' is already a library probe's name"),
        ({"name": "mine", "signal": "queue", "prom": PROM},
         f"{P}.signal: expected one of version, models, residency, vram_bytes, size_bytes, "
         "running, waiting, capacity, kv_usage, kv_pool_tokens, got 'queue'"),
        ({"name": "mine", "signal": "running", "prom": PROM, "log": {"match": "(?P<value>x)"}},
         f"{P}: expected exactly one of prom, log, got both"),
        ({"name": "mine", "signal": "running"}, f"{P}: missing required field: one of prom, log"),
        ({"name": "mine", "signal": "residency", "prom": PROM},
         f"{P}.prom: a prom probe reads only running, waiting, capacity, kv_usage, "
         "kv_pool_tokens, not 'residency'"),
        ({"name": "mine", "signal": "version", "prom": PROM},
         f"{P}.prom: a prom probe reads only running, waiting, capacity, kv_usage, "
         "kv_pool_tokens, not 'version'"),
        ({"name": "mine", "signal": "models", "log": {"match": "(?P<value>x)"}},
         f"{P}.log: a log probe reads only version, residency, running, waiting, capacity, "
         "kv_usage, kv_pool_tokens, not 'models'"),
        ({"name": "mine", "signal": "running", "log": {"match": "(?P<value>x"}},
         f"{P}.log.match: pattern does not compile: missing ), unterminated subpattern at "
         "position 0"),
        ({"name": "mine", "signal": "running", "log": {"match": "(?<value>x)"}},
         f"{P}.log.match: pattern does not compile: unknown extension ?<v at position 1"),
        ({"name": "mine", "signal": "running", "log": {"match": r"running (\d+)"}},
         f"{P}.log.match: needs a named group 'value', as in (?P<value>...), or a fixed value"),
        ({"name": "mine", "signal": "running", "log": {"match": r"(?P<value>\d+)", "value": 1}},
         f"{P}.log: expected a named group 'value' in match or a fixed value, got both"),
        ({"name": "mine", "signal": "running", "log": {"value": 1}},
         f"{P}.log: missing required field 'match'"),
        ({"name": "mine", "signal": "running", "log": {"match": "(?P<value>x)", "valu": 1}},
         f"{P}.log: unknown field 'valu'"),
        ({"name": "mine", "signal": "residency",
          "log": {"match": "(?P<model>x)", "value": "warm"}},
         f"{P}.log.value: expected one of loaded, loading, cold, got 'warm'"),
        ({"name": "mine", "signal": "residency",
          "log": {"match": "(?P<model>x)", "value": "unknown"}},
         f"{P}.log.value: expected one of loaded, loading, cold, got 'unknown'"),
        ({"name": "mine", "signal": "residency", "log": {"match": "x", "value": "loaded"}},
         f"{P}.log.match: a residency line must name its model: add a group (?P<model>...)"),
        ({"name": "mine", "signal": "waiting", "log": {"match": "x", "value": -1}},
         f"{P}.log.value: expected a non-negative integer, got -1"),
        ({"name": "mine", "signal": "capacity", "log": {"match": "x", "value": 1.5}},
         f"{P}.log.value: expected a non-negative integer, got 1.5"),
        ({"name": "mine", "signal": "running", "log": {"match": "x", "value": True}},
         f"{P}.log.value: expected a non-negative integer, got true"),
        ({"name": "mine", "signal": "kv_usage", "log": {"match": "x", "value": 1.5}},
         f"{P}.log.value: expected a number from 0 to 1, got 1.5"),
        ({"name": "mine", "signal": "version", "log": {"match": "x", "value": 1.2}},
         f"{P}.log.value: expected a non-empty string, got 1.2"),
        ({"name": "mine", "signal": "running", "prom": {**PROM, "scale": "percent"}},
         f"{P}.prom.scale: applies only to kv_usage, not 'running'"),
        ({"name": "mine", "signal": "kv_usage", "prom": {**PROM, "scale": "fraction"}},
         f"{P}.prom.scale: expected one of ratio, percent, got 'fraction'"),
        ({"name": "mine", "signal": "running", "prom": {"path": "/metrics"}},
         f"{P}.prom: missing required field 'metric'"),
        ({"name": "mine", "signal": "running", "prom": {**PROM, "path": "metrics"}},
         f"{P}.prom.path: expected a path starting with /, got 'metrics'"),
        ({"name": "mine", "signal": "running", "prom": {**PROM, "metric": "num running"}},
         f"{P}.prom.metric: expected a Prometheus metric name, got 'num running'"),
        ({"name": "mine", "signal": "running", "prom": {**PROM, "per_model": "model-name"}},
         f"{P}.prom.per_model: expected a Prometheus label name, got 'model-name'"),
        ({"name": "mine", "signal": "running", "prom": "/metrics"},
         f"{P}.prom: expected a mapping, got '/metrics'"),
    ],
)
def test_own_probe_rule_rejected(probe: dict[str, Any], error: str) -> None:
    """Each own-probe rule of §4 rejects a bad probe with a message naming the probe's path."""
    assert obj_errors(with_probes(probe)) == [error]


def test_own_probe_names_unique_per_backend() -> None:
    """Two own probes of one backend can't share a name; other backends may reuse it."""
    probe = {"name": "mine", "signal": "running", "prom": PROM}
    assert obj_errors(with_probes(probe, probe)) == [
        "backends[0].probes[1].name: duplicate probe name 'mine'"
    ]
    two = {"backends": [{"url": f"http://e:{port}", "probes": [probe]} for port in (1, 2)]}
    assert [b.probes[0].name for b in parse_obj(two).backends] == ["mine", "mine"]


def test_library_names_default_to_the_probe_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``library_names`` the probe library's own names are the reserved ones."""
    fake = types.SimpleNamespace(LIBRARY_PROBE_NAMES=frozenset({"lib-probe"}))
    monkeypatch.setitem(sys.modules, "pharos.engine.library", fake)
    text = yaml.safe_dump(with_probes({"name": "lib-probe", "signal": "running", "prom": PROM}))
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert info.value.errors == [f"{P}.name: 'lib-probe' is already a library probe's name"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5s", 5.0),
        ("10m", 600.0),
        ("1h30m", 5400.0),
        ("250ms", 0.25),
        ("1.5h", 5400.0),
        ("1m30.5s", 90.5),
        ("0", 0.0),
        ("500us", 0.0005),
        ("2h0m0s", 7200.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    """Go-style durations, as the spec writes them, become float seconds."""
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "-5s", "5 s", "s", "1d", "1h 30m", "5S", "h1"])
def test_parse_duration_rejects(text: str) -> None:
    """Anything that isn't a non-negative Go duration is refused rather than guessed."""
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(("raw", "seconds"), [("7", 7.0), ("0.5", 0.5), ("1h30m", 5400.0)])
def test_drain_accepts_bare_seconds(raw: str, seconds: float) -> None:
    """drain takes a YAML number as seconds as well as a duration string."""
    assert parse(f"drain: {{grace: {raw}}}").drain == DrainConfig(grace=seconds, timeout=600.0)


@pytest.mark.parametrize("raw", ["-1", "true", "'5'", "[5s]"])
def test_drain_rejects(raw: str) -> None:
    """A negative number, a bool, a unitless string or a list is not a drain time."""
    assert len(errors(f"drain: {{timeout: {raw}}}")) == 1


@pytest.mark.parametrize(
    ("text", "strports", "port"),
    [
        (":8090", "tcp:8090:backlog=1024", 8090),
        ("127.0.0.1:8090", "tcp:8090:interface=127.0.0.1:backlog=1024", 8090),
        ("0.0.0.0:80", "tcp:80:interface=0.0.0.0:backlog=1024", 80),
        ("localhost:8090", "tcp:8090:interface=localhost:backlog=1024", 8090),
        ("[::1]:8090", "tcp6:8090:interface=\\:\\:1:backlog=1024", 8090),
        ("[::]:8090", "tcp6:8090:interface=\\:\\::backlog=1024", 8090),
        ("tcp:8090:interface=127.0.0.1", "tcp:8090:interface=127.0.0.1", 8090),
        ("tcp:8090", "tcp:8090", 8090),
        ("tcp6:8090:interface=\\:\\:1", "tcp6:8090:interface=\\:\\:1", 8090),
        ("unix:/run/pharos.sock", "unix:/run/pharos.sock", None),
    ],
)
def test_listen_forms(text: str, strports: str, port: int | None) -> None:
    """Every listen form maps to the strports description Twisted reads as the same address."""
    listen = parse_obj({"listen": text}).listen
    assert listen == Listen(text)
    assert listen.strports() == strports
    assert listen.port() == port
    endpoint = twisted_endpoint(strports)
    if port is not None:
        assert endpoint._port == port


def test_listen_interface_reaches_twisted() -> None:
    """The interface in a host:port form is the one Twisted binds, IPv6 included."""
    for text, interface in [("127.0.0.1:8090", "127.0.0.1"), ("[::1]:8090", "::1")]:
        assert twisted_endpoint(Listen(text).strports())._interface == interface


def test_listen_bare_port_number() -> None:
    """A bare YAML number is a port on every interface."""
    assert parse("listen: 9000").listen.strports() == "tcp:9000:backlog=1024"
    assert errors("listen: 99999")[0].endswith(", got 99999")


@pytest.mark.parametrize("text", ["nowhere", ":99999", "host:", "[nope]:80", "", "tcp:", "a b:1"])
def test_listen_rejected(text: str) -> None:
    """A listen value in none of the accepted forms is an error listing them."""
    assert obj_errors({"listen": text}) == [
        "listen: expected :port, host:port, [ipv6]:port or a Twisted endpoint such as "
        f"tcp:8090:interface=127.0.0.1, got {text!r}"
    ]


def test_peers_with_dns() -> None:
    """peers.dns replaces members; a name without a port takes peers.listen's port later."""
    peers = parse("peers: {secret_file: /s, listen: ':9001', dns: pharos-peers.default.svc}").peers
    assert peers == PeersConfig(secret_file="/s", listen=Listen(":9001"),
                                dns="pharos-peers.default.svc")
    assert peers.listen.port() == 9001


@pytest.mark.parametrize(
    ("peers", "error"),
    [
        ({"secret_file": "/s", "members": ["a:1"], "dns": "p"},
         "peers: expected exactly one of members, dns, got both"),
        ({"secret_file": "/s"}, "peers: missing required field: one of members, dns"),
        ({"members": ["a:1"]}, "peers: missing required field 'secret_file'"),
        ({"secret_file": "/s", "members": ["pharos-a"]},
         "peers.members[0]: expected host:port, got 'pharos-a'"),
        ({"secret_file": "/s", "members": ["a:0"]},
         "peers.members[0]: expected host:port, got 'a:0'"),
        ({"secret_file": "/s", "members": []},
         "peers.members: expected a non-empty list of host:port, got a list"),
        ({"secret_file": "/s", "dns": "bad name"},
         "peers.dns: expected a host name or host:port, got 'bad name'"),
        ({"secret_file": "/s", "dns": "p", "listen": "nowhere"},
         "peers.listen: expected :port, host:port, [ipv6]:port or a Twisted endpoint such as "
         "tcp:8090:interface=127.0.0.1, got 'nowhere'"),
    ],
)
def test_peers_rules(peers: dict[str, object], error: str) -> None:
    """Peers need a secret file and exactly one of members and dns, with valid addresses."""
    assert obj_errors({"peers": peers}) == [error]


def test_peer_members_forms() -> None:
    """Members may be host names, IPv4 or bracketed IPv6, each with a port."""
    members = ["pharos-a:8081", "10.0.0.2:8081", "[fd00::2]:8081"]
    peers = parse_obj({"peers": {"secret_file": "/s", "members": members}}).peers
    assert peers is not None and peers.members == tuple(members)


def test_reload_diff_splits_live_from_restart() -> None:
    """Keys, backends and the policy (issue 17) apply live; listen, state_file, peers, usage
    and drain need a restart; an unchanged file changes nothing."""
    text = (SAMPLES / "spec_example.yaml").read_text()
    old = parse_config(text, library_names=LIBRARY)
    assert reload_diff(old, parse_config(text, library_names=LIBRARY)) == ([], [])
    new = dataclasses.replace(
        old,
        keys=old.keys[:1],
        policy="least-load",
        drain=DrainConfig(grace=1.0),
        listen=Listen(":9000"),
        state_file=None,
        peers=None,
        usage=UsageConfig(),
    )
    assert reload_diff(old, new) == (
        ["policy", "keys"],
        ["listen", "state_file", "usage", "drain", "peers"],
    )


def test_reload_diff_sees_own_probe_change() -> None:
    """Changing only an own probe's pattern counts as a backend change (it triggers a
    re-resolve)."""
    log_1, log_2 = {"match": "(?P<value>1)"}, {"match": "(?P<value>2)"}
    old = parse_obj(with_probes({"name": "m", "signal": "running", "log": log_1}))
    new = parse_obj(with_probes({"name": "m", "signal": "running", "log": log_2}))
    assert reload_diff(old, new) == (["backends"], [])


def test_load_config_reads_a_file(tmp_path: Path) -> None:
    """load_config parses a file; a file that can't be read is a ConfigError naming it."""
    path = tmp_path / "pharos.yaml"
    path.write_text("policy: least-load\n")
    assert load_config(path).policy == "least-load"
    assert load_config(str(path)) == load_config(path)
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    (message,) = info.value.errors
    assert message.startswith(f"{missing}: cannot read: ")


def test_routing_section() -> None:
    """The routing guards parse with their defaults, null turns a guard off, and bad values
    are errors with their path."""
    from pharos.config import ConfigError as _ConfigError
    from pharos.config import RoutingConfig, parse_config

    assert parse_config("").routing == RoutingConfig()
    r = parse_config("routing:\n  bounded_load_epsilon: null\n  hot_prefix_utilization: 0.5\n"
                     "  session_affinity: false\n  prefix_entries: 1000\n"
                     "  eviction_pricing: null\n").routing
    assert r.bounded_load_epsilon is None and r.hot_prefix_utilization == 0.5
    assert r.session_affinity is False and r.prefix_entries == 1000
    assert r.eviction_pricing is False and RoutingConfig().eviction_pricing is True
    try:
        parse_config("routing:\n  kv_pressure_threshold: 1.5\n  session_affinity: 1\n"
                     "  prefix_entries: 0\n  epsilon: 2\n  eviction_pricing: yes please\n")
    except _ConfigError as e:
        text = str(e)
    else:
        raise AssertionError("accepted a bad routing section")
    for path in ("routing.kv_pressure_threshold", "routing.session_affinity",
                 "routing.prefix_entries", "unknown field 'epsilon'", "routing.eviction_pricing"):
        assert path in text


def test_timeouts_section() -> None:
    """timeouts: durations or seconds, defaults for what is left out, and every bad value (zero,
    negative, a bool, an unknown field, a family that does not exist) an error with its
    path, all at once."""
    from pharos.config import ConfigError as _ConfigError
    from pharos.config import Timeouts, parse_config

    assert parse_config("").timeouts == Timeouts()
    t = parse_config("timeouts:\n  first_byte: {generate: 90s, embeddings: 5}\n"
                     "  stream_idle: 1m\n  request_headers: 2.5\n  queue_stuck: 1h\n"
                     "  request_body: 2m\n  idle: 15s\n").timeouts
    assert t == Timeouts(first_byte_generate=90, first_byte_embeddings=5, stream_idle=60,
                         request_headers=2.5, queue_stuck=3600, request_body=120, idle=15)
    with pytest.raises(_ConfigError) as info:
        parse_config("timeouts:\n  first_byte: {generate: 0, chat: 5s}\n  stream_idle: -1\n"
                     "  request_headers: true\n  keepalive: 5s\n  idle: 0\n"
                     "  request_body: -2s\n")
    text = str(info.value)
    for path in ("timeouts.first_byte.generate", "timeouts.first_byte: unknown field 'chat'",
                 "timeouts.stream_idle", "timeouts.request_headers", "timeouts.idle",
                 "timeouts.request_body", "timeouts: unknown field 'keepalive'"):
        assert path in text, path


def test_decision_log_config() -> None:
    """observability.decision_log takes a path and a sample rate in (0, 1] (default 1);
    a rate outside it, or no path, is an error naming the field."""
    from pharos.config import ConfigError, DecisionLogConfig

    cfg = parse_config("observability: {decision_log: {path: /tmp/d.jsonl}}\n")
    assert cfg.observability.decision_log == DecisionLogConfig("/tmp/d.jsonl", 1.0)
    cfg = parse_config("observability: {decision_log: {path: d, sample_rate: 0.01}}\n")
    assert cfg.observability.decision_log == DecisionLogConfig("d", 0.01)
    for text, error in (
            ("{path: d, sample_rate: 0}", "observability.decision_log.sample_rate: expected"),
            ("{path: d, sample_rate: 1.5}", "observability.decision_log.sample_rate: expected"),
            ("{sample_rate: 0.5}", "observability.decision_log: missing required field 'path'"),
    ):
        try:
            parse_config(f"observability: {{decision_log: {text}}}\n")
        except ConfigError as e:
            assert any(m.startswith(error) for m in e.errors), e.errors
        else:
            raise AssertionError(f"{text} accepted")


def test_every_section_reports_every_bad_field_at_once() -> None:
    """The walker over the dataclasses' settings names the path of every bad field in one
    run, whatever section it is in."""
    text = ("routing: {kv_pressure_threshold: 2, prefix_entries: 0}\n"
            "timeouts: {first_byte: {generate: 0}, idle: never}\n"
            "responses: {max_responses: -1, max_age: 0}\n"
            "observability: {decision_log: {path: d, sample_rate: 2}}\n"
            "usage: {retention_days: 0}\n"
            "tenants: [{name: lab, weight: 0}]\n"
            "peers: {secret_file: /s, members: [nowhere]}\n"
            "workers: 0\n")
    assert [m.split(":")[0] for m in errors(text)] == [
        "tenants[0].weight", "usage.retention_days", "peers.members[0]",
        "routing.kv_pressure_threshold", "routing.prefix_entries",
        "observability.decision_log.sample_rate", "timeouts.first_byte.generate",
        "timeouts.idle", "workers", "responses.max_responses", "responses.max_age",
    ]
