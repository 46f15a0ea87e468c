"""What the harness measured for one request: no prompt text, only its shape and timings."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

#: Error kinds (``RequestRecord.error``); an HTTP status other than 200 is ``http_<status>``.
REFUSED = "refused"
TIMEOUT = "timeout"
DISCONNECTED = "disconnected"
TRUNCATED = "truncated"
STREAM_ERROR = "stream_error"
NO_TOKEN = "no_token"


@dataclass(slots=True)
class RequestRecord:
    """One scheduled request and what became of it. Seconds; ``at`` and ``sent`` from the run's
    start, ``ttft`` and ``e2e`` from the *scheduled* ``at`` (so a late send or a queue shows),
    ``lag`` is ``sent - at``. ``None`` is unknown, never 0."""

    index: int
    at: float
    tag: str
    model: str
    max_tokens: int
    session: str | None = None
    #: The client group and API key that sent it, when the run names clients (``clients``).
    client: str | None = None
    key: str | None = None
    #: Scheduled before the warm-up ended: sent, but left out of the summary.
    warmup: bool = False
    url: str | None = None
    sent: float | None = None
    lag: float | None = None
    #: The engine that served it: ``x-pharos-backend``, or the base URL when sent directly.
    engine: str | None = None
    #: ``x-pharos-reason``, when Pharos routed it.
    reason: str | None = None
    status: int | None = None
    error: str | None = None
    ttft: float | None = None
    e2e: float | None = None
    #: ``(e2e - ttft) / (completion_tokens - 1)``, tokens from usage (not stream chunks).
    tpot: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None

    @property
    def ok(self) -> bool:
        """Answered with 200 and a complete stream."""
        return self.error is None and self.status == 200

    def to_json(self) -> dict[str, Any]:
        """A JSON object (the result file's ``records`` entries)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RequestRecord:
        """A record from its JSON object; fields this version does not know are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in names})
