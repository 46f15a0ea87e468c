"""Observability: /metrics, the status page and the live map."""
