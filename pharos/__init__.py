"""Pharos: a router for self-hosted LLM inference engines."""

__version__ = "0.1.0"
