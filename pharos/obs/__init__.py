"""Observability: /metrics, the status page and the live map (spec §13, issue 12)."""
