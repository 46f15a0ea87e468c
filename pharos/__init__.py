"""Pharos: a router for self-hosted LLM inference engines."""

from pharos import compiled as _compiled

__version__ = "0.1.0"

# ``pharos.policy`` compiled by mypyc when built from its current source (``pharos.compiled``).
_compiled.install()
