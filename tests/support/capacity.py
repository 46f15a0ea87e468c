"""Capacity-test engines and their load reports."""

from __future__ import annotations

from tests.support.plan import FakeBackend


def vllm() -> FakeBackend:
    return FakeBackend({
        "/version": (200, b'{"version":"0.32.0"}'),
        "/v1/models": (200, b'{"object":"list","data":[{"id":"m"}]}'),
        "/metrics": (200, b""),
    })


def report(engine: FakeBackend, running: object, waiting: object = 0, kv: float = 0.1) -> None:
    engine.answers["/metrics"] = (200, (
        f'vllm:num_requests_running{{model_name="m"}} {running}\n'
        f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
        f'vllm:kv_cache_usage_perc{{model_name="m"}} {kv}\n').encode())
