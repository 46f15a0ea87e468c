"""The configuration examples of the README."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.rst"
_CONFIG_START = re.compile(r"(listen|policy|backends|routing|timeouts|keys):")


def config_examples() -> list[str]:
    """The literal blocks of README.rst that are config files (they start with a top-level
    config field)."""
    lines = README.read_text(encoding="utf-8").splitlines()
    blocks: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i].rstrip().endswith("::"):
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            body = []
            while j < len(lines) and (not lines[j].strip() or lines[j].startswith(" ")):
                body.append(lines[j])
                j += 1
            text = textwrap.dedent("\n".join(body)).strip("\n")
            if _CONFIG_START.match(text):
                blocks.append(text + "\n")
            i = j
        else:
            i += 1
    return blocks
