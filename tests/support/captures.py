"""Loading captures and looking up expected values for the replay tests."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from pathlib import Path

from pharos.engine.capture import Capture, find_captures

ROOT = Path(__file__).resolve().parents[2] / "fixtures"

#: Engine directory → the Pharos kind whose recipe it runs (generic engines → openai).
KIND_OF_ENGINE: Mapping[str, str] = {
    "ollama": "ollama",
    "llamacpp": "llamacpp",
    "llama-swap": "llama-swap",
    "vllm": "vllm",
    "sglang": "sglang",
    "mlx-lm": "openai",
}


@cache
def all_captures() -> tuple[Capture, ...]:
    """Every capture under fixtures/, read once."""
    return tuple(Capture.load(d) for d in find_captures(ROOT))


def capture_id(c: Capture) -> str:
    """engine/version/state, as test ids and expectation keys use it."""
    return f"{c.directory.parent.parent.name}/{c.directory.parent.name}/{c.state}"


def keys_for(c: Capture) -> list[str]:
    """Expectation keys from least to most specific: engine/, engine//state, engine/version,
    engine/version/state."""
    engine, version, state = capture_id(c).split("/")
    return [
        f"{engine}/",
        f"{engine}//{state}",
        f"{engine}/{version}",
        f"{engine}/{version}/{state}",
    ]


_MISSING = object()


def lookup(table: Mapping[str, Mapping[str, object]], c: Capture, name: str) -> object:
    """The most specific expectation for ``name`` on ``c``, or ``MISSING``."""
    found: object = _MISSING
    for key in keys_for(c):
        row = table.get(key)
        if row is not None and name in row:
            found = row[name]
    return found


MISSING = _MISSING
