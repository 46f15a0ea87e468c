"""HTTPFetcher, resolve and the recorder over real loopback sockets, against a server that
answers like a recorded capture."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.web.client import HTTPConnectionPool

from pharos.engine.capture import Capture
from pharos.engine.fetch import MAX_BODY_BYTES, FetchError, HTTPFetcher, make_client
from pharos.engine.library import VLLM
from pharos.engine.plan import resolve
from pharos.engine.record import record
from pharos.engine.signals import Signal
from tests.support.capture_server import CaptureResource, close, serve
from tests.support.captures import all_captures, capture_id

SGLANG_BUSY = next(c for c in all_captures() if capture_id(c) == "sglang/0.5.23/busy")


class Served:
    """A capture on a loopback port and a fetcher for it."""

    def __init__(self, capture: Capture, timeout: float = 2.0) -> None:
        self.resource = CaptureResource(capture, reactor)
        self.port, url = serve(self.resource)
        self.pool = HTTPConnectionPool(reactor, persistent=True)
        self.pool.cachedConnectionTimeout = 1
        self.fetcher = HTTPFetcher(url, make_client(reactor, self.pool), reactor,
                                   timeout=timeout)

    async def close(self) -> None:
        await self.pool.closeCachedConnections()
        await close(self.port)


@pytest_twisted.async_yield_fixture()
async def served() -> AsyncIterator[Served]:
    s = Served(SGLANG_BUSY)
    yield s
    await s.close()


@pytest_twisted.ensureDeferred
async def test_resolve_over_http_matches_the_capture(served: Served) -> None:
    """resolve over a real socket reads what the replay of the same capture reads."""
    plan, snap = await resolve(served.fetcher, "auto")
    assert plan.kind == "sglang"
    assert snap.load["meta-llama/Llama-3.1-8B-Instruct"].running == 47
    served.resource.gets.clear()
    await plan.scrape(served.fetcher, full=True)
    assert sorted(served.resource.gets) == sorted(set(served.resource.gets)), "one GET per path"


@pytest_twisted.ensureDeferred
async def test_huge_page_is_a_fetch_error_for_that_round(served: Served) -> None:
    """A body over 4 MiB fails that probe's fetch; the next round reads normally again."""
    served.resource.bodies["/metrics"] = b"# " + b"x" * (MAX_BODY_BYTES + 10) + b"\n"
    with pytest.raises(FetchError, match="larger than"):
        await served.fetcher.fetch("/metrics")
    del served.resource.bodies["/metrics"]
    got = await served.fetcher.fetch("/metrics")
    assert got.status == 200


@pytest_twisted.ensureDeferred
async def test_slow_page_is_a_fetch_error(served: Served) -> None:
    """A page slower than the scrape timeout is an error for that round, not a hang."""
    plan, _ = await resolve(served.fetcher, "sglang")
    served.resource.delays["/metrics"] = 3.0  # past the 2 s timeout of this fetcher
    snap, failures = await plan.scrape(served.fetcher, full=False)
    assert {f.probe.name for f in failures} == {"sglang-running", "sglang-waiting",
                                                "sglang-kv-usage"}
    assert all("no answer within" in f.reason for f in failures), failures
    assert snap.load == {}


@pytest_twisted.ensureDeferred
async def test_malformed_metrics_is_a_parse_error_never_a_value(served: Served) -> None:
    """A malformed metrics page drops the metric probes with a parse error."""
    served.resource.bodies["/metrics"] = b'sglang:num_running_reqs{model_name="m" 3\n'
    plan, snap = await resolve(served.fetcher, "sglang")
    reasons = {d.probe.name: d.reason for d in plan.dropped}
    assert reasons["sglang-running"] == "parse error"
    assert not snap.known(Signal.RUNNING)


@pytest_twisted.ensureDeferred
async def test_refused_connection_is_unreachable() -> None:
    """A backend that refuses every connection makes resolve fail, not return an empty plan."""
    from pharos.engine.plan import BackendUnreachable

    pool = HTTPConnectionPool(reactor, persistent=False)
    fetcher = HTTPFetcher("http://127.0.0.1:9", make_client(reactor, pool), reactor)
    with pytest.raises(BackendUnreachable):
        await resolve(fetcher, VLLM)


@pytest.mark.parametrize("capture", all_captures(), ids=capture_id)
@pytest_twisted.ensureDeferred
async def test_record_round_trips_every_capture(capture: Capture, tmp_path: Path) -> None:
    """Recording a server that answers like a capture writes that capture back, byte for byte."""
    s = Served(capture)
    try:
        await record(s.fetcher, tmp_path / "rec", {"engine": capture.engine,
                                                   "version": capture.version,
                                                   "command": "test"})
    finally:
        await s.close()
    again = Capture.load(tmp_path / "rec")
    assert again.meta["capture"] == "live"
    for path, rec in capture.paths.items():
        got = again.paths[path]
        assert (got.status, got.body) == (rec.status, rec.body), path
        if rec.content_type:
            assert got.content_type == rec.content_type, path
