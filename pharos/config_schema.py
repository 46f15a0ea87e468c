"""The config file's JSON Schema (``pharos config-schema``), so editors complete and check
``pharos.yaml`` (yaml-language-server reads a JSON Schema).

The parser in ``pharos.config`` stays the authority: it checks what a schema cannot (a URL's
form, an own probe's rules, duplicate names, durations' grammar in full). A test walks this
schema against the parser: every property here is a field the parser knows, every object
here refuses unknown fields as the parser does, and the README's example validates.
"""

from __future__ import annotations

from typing import Any

from pharos.config import BACKEND_KINDS, COST_MODEL_FIELDS, MAX_WORKERS, POLICIES, SCALES
from pharos.engine.signals import LOAD_SIGNALS, LOG_SIGNALS, Signal

_DURATION: dict[str, Any] = {
    "description": "a duration such as 5s, 10m or 1h30m, or a number of seconds",
    "anyOf": [{"type": "number", "minimum": 0},
              {"type": "string", "pattern": r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)"
                                            r"(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))*$"}],
}
_POSITIVE_INT: dict[str, Any] = {"type": "integer", "minimum": 1}
_LISTEN: dict[str, Any] = {
    "description": ":port, host:port, [ipv6]:port or a Twisted endpoint such as "
                   "tcp:8090:interface=127.0.0.1",
    "anyOf": [{"type": "string"}, {"type": "integer", "minimum": 1, "maximum": 65535}],
}
_NULLABLE_NUMBER: dict[str, Any] = {"type": ["number", "null"]}


def _object(properties: dict[str, Any], required: tuple[str, ...] = (),
            description: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": properties,
                           "additionalProperties": False}
    if required:
        out["required"] = list(required)
    if description:
        out["description"] = description
    return out


def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``pharos.yaml``."""
    prom = _object({
        "path": {"type": "string", "pattern": "^/"},
        "metric": {"type": "string"},
        "per_model": {"type": "string"},
        "scale": {"enum": list(SCALES)},
    }, required=("path", "metric"))
    log = _object({"match": {"type": "string"}, "value": {}}, required=("match",))
    probe = _object({
        "name": {"type": "string", "minLength": 1},
        "signal": {"enum": sorted(s.value for s in Signal
                                  if s in LOAD_SIGNALS or s in LOG_SIGNALS)},
        "prom": prom,
        "log": log,
    }, required=("name", "signal"), description="an own probe (spec §4)")
    backend = _object({
        "url": {"type": "string", "pattern": "^https?://"},
        "kind": {"enum": list(BACKEND_KINDS)},
        "memory_gb": {"type": "number", "exclusiveMinimum": 0},
        "capacity": _POSITIVE_INT,
        "max_loaded_models": {**_POSITIVE_INT,
                              "description": "models the host keeps loaded at once"},
        "aliases": {"type": "object", "additionalProperties": {"type": "string"}},
        "logs": {"type": "string", "pattern": "^(docker://.+|file:///.*)$",
                 "description": "the engine's log, for log probes: docker://<container> "
                                "or file:///<absolute path>"},
        "probes": {"type": "array", "items": probe},
        "cost_model": _object({name: {"type": "number", "minimum": 0}
                               for name in COST_MODEL_FIELDS},
                              required=COST_MODEL_FIELDS,
                              description="prefill seconds a·u + b·u·(c + u/2) + d, "
                                          "as `pharos calibrate` prints it"),
        "dns": {"type": "string", "description": "instead of url: every address this name "
                                                 "resolves to is a backend"},
        "port": {"type": "integer", "minimum": 1, "maximum": 65535,
                 "description": "with dns: the members' port"},
        "refresh": {**_DURATION, "description": "with dns: how often the name is resolved"},
    })
    backend["oneOf"] = [{"required": ["url"]}, {"required": ["dns", "port"]}]
    key = _object({
        "name": {"type": "string", "minLength": 1},
        "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "rpm": _POSITIVE_INT,
        "tokens_per_day": _POSITIVE_INT,
        "weight": _POSITIVE_INT,
        "models": {"type": "array", "items": {"type": "string", "minLength": 1}},
        "admin": {"type": "boolean"},
        "tenant": {"type": "string", "minLength": 1,
                   "description": "a name from tenants (default: the tenant 'default')"},
    }, required=("name", "sha256"), description="an API key (pharos keys new --name NAME)")
    tenant = _object({
        "name": {"type": "string", "minLength": 1},
        "weight": _POSITIVE_INT,
        "rpm": _POSITIVE_INT,
        "tokens_per_day": _POSITIVE_INT,
    }, required=("name",), description="a group of keys: fair-queue share and budgets")
    policy_name = {"enum": list(POLICIES)}
    split = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0},
             "propertyNames": policy_name,
             "description": "A/B: policy to percent, adding up to 100"}
    shadow = {"type": "array", "items": policy_name, "uniqueItems": True,
              "description": "policies run beside the routing one, off the request path"}
    fleet_model = _object({
        "name": {"type": "string", "minLength": 1},
        "aliases": {"type": "array", "items": {"type": "string", "minLength": 1}},
        "policy": policy_name,
        "split": split,
        "shadow": shadow,
        "cost_model": backend["properties"]["cost_model"],
    }, required=("name",), description="one name for a model engines serve under others")
    unbuilt = "not supported yet: refused at start"
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "pharos.yaml",
        **_object({
            "listen": _LISTEN,
            "policy": {"enum": list(POLICIES)},
            "backends": {"type": "array", "items": backend},
            "models": {"type": "array", "items": fleet_model},
            "keys": {"type": "array", "items": key},
            "tenants": {"type": "array", "items": tenant},
            "state_file": {"type": "string", "minLength": 1, "description": unbuilt},
            "workers": {"oneOf": [{"type": "integer", "minimum": 1, "maximum": MAX_WORKERS},
                                  {"const": "auto"}],
                        "description": "processes sharing the public port (auto: the cores)"},
            "usage": _object({"timezone": {"type": "string"},
                              "retention_days": _POSITIVE_INT,
                              "journal": {"type": "string", "minLength": 1,
                                          "description": "a file: one JSON line per request"}},
                             description="usage accounting: day boundary, history, journal"),
            "drain": _object({"grace": _DURATION, "timeout": _DURATION}, description=unbuilt),
            "peers": _object({"listen": _LISTEN, "secret_file": {"type": "string"},
                              "members": {"type": "array", "items": {"type": "string"}},
                              "dns": {"type": "string"}},
                             required=("secret_file",), description=unbuilt),
            "routing": _object({
                "bounded_load_epsilon": _NULLABLE_NUMBER,
                "kv_pressure_threshold": {"type": ["number", "null"], "minimum": 0,
                                          "maximum": 1},
                "hot_prefix_utilization": {"type": ["number", "null"], "minimum": 0.01,
                                           "maximum": 1},
                "session_affinity": {"type": ["boolean", "null"]},
                "eviction_pricing": {"type": ["boolean", "null"]},
                "prefix_entries": {"type": ["integer", "null"], "minimum": 1},
                "replica_utilization": {"type": ["number", "null"], "minimum": 0.01,
                                        "maximum": 1},
                "load_wait_bound": {"oneOf": [_DURATION, {"type": "null"}]},
                "swap_grouping": {"type": ["boolean", "null"]},
                "split": split,
                "shadow": shadow,
            }, description="the cost policy's guards; null turns a guard off"),
            "observability": _object({
                "decision_log": _object({
                    "path": {"type": "string", "minLength": 1},
                    "sample_rate": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                }, required=("path",), description="a JSON line per sampled routing decision"),
                "shadow_log": {"type": "string", "minLength": 1,
                               "description": "JSON lines of config generations and shadow "
                                              "decisions (pharos replay-shadow)"},
            }),
            "responses": _object({
                "store": {"type": "boolean",
                          "description": "keep store: true conversations and expand "
                                         "previous_response_id"},
                "key_file": {"type": "string", "minLength": 1,
                             "description": "the AES-256 key: 32 bytes or 64 hex digits "
                                            "(required with store: true)"},
                "max_responses": _POSITIVE_INT,
                "max_age": _DURATION,
                "max_bytes_per_conversation": _POSITIVE_INT,
            }, description="Responses conversation state, kept in memory, encrypted; restart "
                           "only"),
            "timeouts": _object({
                "first_byte": _object({"generate": _DURATION, "embeddings": _DURATION}),
                "stream_idle": _DURATION,
                "request_headers": _DURATION,
                "queue_stuck": _DURATION,
                "request_body": _DURATION,
                "idle": _DURATION,
            }),
        }),
    }
