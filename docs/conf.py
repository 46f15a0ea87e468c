"""Sphinx configuration of the Pharos documentation (``make docs``)."""

import re
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent


def _version() -> str:
    """The package's version, read from its source (importing pharos is not needed)."""
    text = (_ROOT / "pharos" / "__init__.py").read_text(encoding="utf-8")
    found = re.search(r'^__version__ = "([^"]+)"', text, re.MULTILINE)
    return found.group(1) if found else ""


project = "Pharos"
author = "the Pharos authors"
copyright = "the Pharos authors"
release = version = _version()

extensions: list[str] = []
root_doc = "index"
exclude_patterns = ["_build"]
highlight_language = "none"
html_theme = "alabaster"
html_title = f"Pharos {release}".strip()
html_static_path: list[str] = []
