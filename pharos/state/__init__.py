"""Backends, targets and what Pharos knows about them now."""
