"""Layer 1: what is generated from the config's one description stays true: the committed
configuration reference is what the generator writes, and the JSON Schema calls no working
section unsupported."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pharos.config import load_config
from pharos.config.describe import reference, schema

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.rst"


def descriptions(node: Any, at: str = "") -> Iterator[tuple[str, str]]:
    """Every description in the schema, with where it stands."""
    if isinstance(node, dict):
        if isinstance(node.get("description"), str):
            yield at, node["description"]
        for name, child in node.items():
            yield from descriptions(child, f"{at}.{name}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from descriptions(child, f"{at}[{i}]")


def test_committed_reference_is_generated() -> None:
    """docs/configuration.rst is exactly what ``pharos config-schema --rst`` writes: edit the
    dataclasses' settings and regenerate, never the file."""
    assert DOC.read_text(encoding="utf-8") == reference()


def test_config_schema_rst_prints_the_reference() -> None:
    """``pharos config-schema --rst`` prints the reference; without it, the JSON Schema."""
    exe = Path(sys.executable).parent / "pharos"
    r = subprocess.run([str(exe), "config-schema", "--rst"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == reference()


def test_schema_calls_no_working_section_unsupported(tmp_path: Path) -> None:
    """state_file, drain and peers load at start (pharos check), so no description in the
    schema may call anything unsupported or refused."""
    secret = tmp_path / "peer.secret"
    secret.write_text("s3cret\n")
    path = tmp_path / "pharos.yaml"
    path.write_text(f"state_file: {tmp_path / 'state.json'}\ndrain: {{grace: 1s}}\n"
                    f"peers: {{secret_file: {secret}, members: ['a:8081']}}\n")
    config = load_config(path)
    assert config.state_file and config.drain.grace == 1.0 and config.peers is not None
    found = [(at, text) for at, text in descriptions(schema())
             if "not supported" in text.lower() or "refused" in text.lower()]
    assert not found, json.dumps(found)
