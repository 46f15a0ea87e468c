"""Backends, targets and what Pharos knows about them now (spec §5)."""
