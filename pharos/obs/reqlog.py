"""The debug request line: one log event per finished request at debug level (``twistd pharos
--log-level debug``), with the request id, key, model, target, reason, the decisions as
``stage=outcome`` pairs, status, TTFT, overhead, queue wait and duration; never prompt text.
The event's fields carry the same values for a JSON log observer.
"""

from __future__ import annotations

from twisted.logger import Logger

from pharos.proxy.done import Done

log = Logger(namespace="pharos.request")

#: The line's format: every field is one of the event's keys.
LINE = ("request {request_id} key={key} model={model} target={target} status={status} "
        "ttft_ms={ttft_ms} overhead_ms={overhead_ms} queue_wait_ms={queue_wait_ms} "
        "duration_ms={duration_ms} reason={reason!r} decisions: {decisions}")


class RequestLog:
    """An ``on_done`` subscriber emitting the request line."""

    def __init__(self, logger: Logger = log) -> None:
        self.log = logger

    def __call__(self, d: Done) -> None:
        j = d.journal()
        self.log.debug(LINE, request_id=d.request_id, key=d.key, model=d.model,
                       target=d.target, status=d.status, ttft_ms=j["ttft_ms"],
                       overhead_ms=j["overhead_ms"], queue_wait_ms=j["queue_wait_ms"],
                       duration_ms=j["duration_ms"], reason=d.reason,
                       decisions=d.decision_text())
