"""Compiled modules: ``pharos.policy``, ``pharos.linkhash`` and ``pharos.reasons`` compiled by
mypyc, each imported in place of its source only when it was built from that very source.

Interpreted, the pick's per-candidate arithmetic is about half of a decision. ``make install``
builds ``pharos/policy.mypyc<EXT_SUFFIX>`` (``contrib/build_compiled.py``, embedding the
source's SHA-256), a name no import statement reaches: only this finder loads it, and only
when the hash is the source's beside it. Otherwise (no build, the source edited since, another
Python, ``PHAROS_COMPILED=0``) the source is imported, with a warning when a built file was
refused; ``status`` says which. Tests compare compiled and interpreted results.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Final

#: The modules built by ``contrib/build_compiled.py``.
COMPILED: Final = ("pharos.policy", "pharos.linkhash", "pharos.reasons")
#: The sources (beside it) a compiled module was type-checked against besides its own: part of
#: its digest, so a change there rebuilds it.
IMPORTS: Final = {"reasons": ("policy.py",)}
#: The environment variable that, set to ``0``, imports the sources (A/B, debugging).
ENV: Final = "PHAROS_COMPILED"
#: How each module of ``COMPILED`` was imported in this process: ``compiled``, or
#: ``interpreted (<why>)``.
status: dict[str, str] = {}


def artifact(source: str) -> str:
    """The compiled file built from ``source`` (``x/policy.py`` -> ``x/policy.mypyc<suffix>``)."""
    return source[: -len(".py")] + ".mypyc" + importlib.machinery.EXTENSION_SUFFIXES[0]


def source_digest(path: str) -> str:
    """The SHA-256 of a source file and of the sources it was compiled against (``IMPORTS``),
    as the build embeds it (``SOURCE_SHA256``)."""
    import hashlib

    digest = hashlib.sha256()
    stem = os.path.basename(path)[: -len(".py")]
    for name in (os.path.basename(path), *IMPORTS.get(stem, ())):
        with open(os.path.join(os.path.dirname(path), name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def load(name: str, source: str) -> tuple[ModuleType | None, str]:
    """The compiled module of ``source`` under ``name`` when it is current, with the status;
    (None, why) when the source must be imported instead (warned when a built file was
    refused)."""
    if os.environ.get(ENV) == "0":
        return None, f"interpreted ({ENV}=0)"
    path = artifact(source)
    if not os.path.exists(path):
        return None, "interpreted (not built: make install builds it)"
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    why = None
    if spec is None:
        why = "no import spec"
    else:
        # Listed in sys.modules while executed, as an import does (the old entry put back).
        previous = sys.modules.get(name)
        try:
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            loader.exec_module(module)
        except Exception as e:  # a broken build: the source, said why
            why = f"{path} failed to import: {e!r}"
        else:
            if getattr(module, "SOURCE_SHA256", None) == source_digest(source):
                return module, "compiled"
            why = (f"{path} was built from another {os.path.basename(source)} "
                   "(make install rebuilds it)")
        finally:
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
    import warnings

    warnings.warn(f"{name}: {why}; the source is imported instead", RuntimeWarning,
                  stacklevel=2)
    return None, f"interpreted ({why})"


class _Loaded(importlib.abc.Loader):
    """A loader of a module already loaded (the compiled one ``load`` checked)."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        return None


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the modules of ``COMPILED``: the compiled one when current, else None."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in COMPILED or path is None:
            return None
        stem = fullname.rpartition(".")[2]
        for entry in path:
            source = os.path.join(entry, stem + ".py")
            if os.path.isfile(source):
                break
        else:
            return None
        module, status[fullname] = load(fullname, source)
        if module is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Loaded(module),
                                               origin=artifact(source))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
