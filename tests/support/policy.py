"""The interpreted reference of a compiled policy module."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def reference(source: Path) -> ModuleType:
    """A compiled module's source interpreted, as a module of its own (``pharos_<stem>_
    reference``), whatever ``pharos.compiled`` imported under its name."""
    spec = importlib.util.spec_from_file_location(f"pharos_{source.stem}_reference", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    return module
