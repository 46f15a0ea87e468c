"""Layer 1: the config's JSON Schema stays in step with the parser (issue 10 item 8): every
property the schema names is a field the parser knows at that place, every object in the
schema refuses unknown fields as the parser does, the schema's fields are the config
dataclasses' fields, and ``pharos config-schema`` prints it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pharos import config as cfg
from pharos.config import ConfigError, parse_config
from pharos.config.describe import schema

#: (path of an object in the schema, its schema); path segments are (name, is_array_item).
Place = tuple[tuple[tuple[str, bool], ...], dict[str, Any]]


def objects(node: dict[str, Any], at: tuple[tuple[str, bool], ...] = ()) -> Iterator[Place]:
    """Every object schema with properties, and where it stands."""
    if node.get("type") == "object" and "properties" in node:
        yield at, node
        for name, child in node["properties"].items():
            if child.get("type") == "array" and isinstance(child.get("items"), dict):
                yield from objects(child["items"], (*at, (name, True)))
            elif isinstance(child, dict):
                yield from objects(child, (*at, (name, False)))


def document(at: tuple[tuple[str, bool], ...], leaf: dict[str, Any]) -> Any:
    """A config with ``leaf`` as the mapping at ``at``."""
    node: Any = leaf
    for name, is_item in reversed(at):
        node = {name: [node] if is_item else node}
    return node


def path_text(at: tuple[tuple[str, bool], ...]) -> str:
    return ".".join(name + ("[0]" if item else "") for name, item in at)


def errors(doc: Any) -> list[str]:
    try:
        parse_config(yaml.safe_dump(doc))
    except ConfigError as e:
        return e.errors
    return []


PLACES = list(objects(schema()))


def test_the_schema_has_every_section() -> None:
    """The walk sees the sections (so the checks below check them)."""
    names = {path_text(at) for at, _ in PLACES}
    assert {"", "backends[0]", "backends[0].probes[0]", "backends[0].probes[0].prom",
            "routing", "timeouts", "timeouts.first_byte", "keys[0]", "peers"} <= names


@pytest.mark.parametrize(("at", "node"), PLACES, ids=[path_text(a) or "top" for a, _ in PLACES])
def test_each_schema_object_matches_the_parser(at: Any, node: dict[str, Any]) -> None:
    """At this place the parser knows every property the schema names (setting each gives
    no unknown-field error) and refuses a field the schema does not name."""
    assert node["additionalProperties"] is False
    for prop in node["properties"]:
        msgs = errors(document(at, {prop: None}))
        assert not any(f"unknown field {prop!r}" in m for m in msgs), (prop, msgs)
    msgs = errors(document(at, {"zz_not_a_field": 1}))
    where = path_text(at)
    assert any(m.startswith(f"{where or 'top level'}: unknown field 'zz_not_a_field'")
               for m in msgs), msgs


@pytest.mark.parametrize(("section", "klass"), [
    ((), cfg.Config), ((("backends", True),), cfg.Backend), ((("keys", True),), cfg.Key),
    ((("tenants", True),), cfg.Tenant), ((("models", True),), cfg.ModelSpec),
    ((("usage", False),), cfg.UsageConfig), ((("drain", False),), cfg.DrainConfig),
    ((("peers", False),), cfg.PeersConfig), ((("routing", False),), cfg.RoutingConfig),
    ((("observability", False),), cfg.Observability),
    ((("responses", False),), cfg.Responses),
    ((("observability", False), ("decision_log", False)), cfg.DecisionLogConfig),
])
def test_schema_fields_are_the_dataclasses_fields(section: Any, klass: type) -> None:
    """Each section's properties are its dataclass's fields (timeouts: first_byte groups two)."""
    node = dict(PLACES)[section]
    # A backends: item is a Backend or a DnsBackends (dns, port, refresh and a Backend's
    # settings), which Config keeps apart as dns_backends.
    apart = {cfg.Config: {"dns_backends"}, cfg.Backend: {"dns", "port", "refresh"}}
    assert set(node["properties"]) - apart.get(klass, set()) == {
        f.name for f in dataclasses.fields(klass)} - apart.get(klass, set())


def test_timeouts_fields_cover_the_dataclass() -> None:
    """timeouts' properties, with first_byte's two families, are Timeouts's fields."""
    node = dict(PLACES)[(("timeouts", False),)]
    names = {f"first_byte_{k}" for k in node["properties"]["first_byte"]["properties"]}
    names |= set(node["properties"]) - {"first_byte"}
    assert names == {f.name for f in dataclasses.fields(cfg.Timeouts)}


def test_config_schema_command_prints_it() -> None:
    """``pharos config-schema`` prints the schema as JSON."""
    exe = Path(sys.executable).parent / "pharos"
    r = subprocess.run([str(exe), "config-schema"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == schema()
