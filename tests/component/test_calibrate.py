"""``pharos calibrate`` against simulated engines on loopback (issue 17 item 5): it recovers
each double's latency model from the engine's own numbers, refuses a busy engine and one
whose numbers cannot be true, and prints a fragment ``pharos check`` accepts."""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.web.http_headers import Headers
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from pharos.calibrate import CalibrationError, Calibrator, engine_for, fragment, parse_args
from pharos.config import parse_config
from pharos.engine.fetch import HTTPFetcher, make_client
from pharos.sim.double import start_double
from tests.support.capture_server import close
from tests.support.fleet import within

#: Short probes: the doubles compute them in real time.
CACHED = (0, 512, 1536)
UNCACHED = (64, 256, 1024)


async def _calibrate(url: str, kind: str, model: str | None = None,
                     busy_wait: float = 5.0) -> Any:
    fetcher = HTTPFetcher(url, make_client(reactor), reactor, timeout=5.0)
    engine = await engine_for(fetcher, kind, model, timeout=30.0, clock=reactor)
    cal = Calibrator(engine, reactor, seed=11, cached=CACHED, uncached=UNCACHED,
                     busy_wait=busy_wait)
    return await within(Deferred.fromCoroutine(cal.run()), 120)


@pytest.mark.parametrize("kind,knobs", [
    ("vllm", {"prefill_s": 40e-6, "prefill_pair_s": 3.3e-9, "prefill_fixed_s": 0.004}),
    ("vllm", {"prefill_s": 15e-6, "prefill_pair_s": 8e-9, "prefill_fixed_s": 0.010}),
    ("llamacpp", {"prefill_s": 30e-6, "prefill_pair_s": 5e-9, "prefill_fixed_s": 0.006}),
    ("ollama", {"prefill_s": 25e-6, "prefill_pair_s": 4e-9, "prefill_fixed_s": 0.003,
                "load_s": 0.05}),
])
@pytest_twisted.ensureDeferred
async def test_calibrate_recovers_the_doubles_latency_model(kind: str,
                                                            knobs: dict[str, Any]) -> None:
    """Against a simulated engine with known P(u, c), the fit from the engine's own timings
    (vLLM's prefill histogram, llama.cpp's timings, Ollama's prompt_eval_duration) gives a, b
    and d within 5 %, and every probe's cached part was found cached."""
    double, port = start_double(kind, reactor, decode_s=0.001, **knobs)
    try:
        model = next(iter(double.flavor.catalogue())) if kind == "ollama" else None
        report = await _calibrate(double.url, kind, model)
    finally:
        double.stop()
        await close(port)
    f = report.fit
    assert f.a == pytest.approx(knobs["prefill_s"], rel=0.05)
    assert f.b == pytest.approx(knobs["prefill_pair_s"], rel=0.05)
    assert f.d == pytest.approx(knobs["prefill_fixed_s"], rel=0.05)
    assert not report.refused
    assert max(s.cached for s in report.samples) >= 1500


@pytest_twisted.ensureDeferred
async def test_a_busy_engine_is_waited_for_then_refused() -> None:
    """While a long request runs on the vLLM double, calibration waits ``busy_wait`` and
    then fails saying the engine is busy: it never fits times a queue inflated."""
    double, port = start_double("vllm", reactor, prefill_s=0.00005, decode_s=0.5)
    client = make_client(reactor)
    long = client.post(double.url + "/v1/completions", data=json.dumps(
        {"model": "tiny", "prompt": "x" * 40, "max_tokens": 60}).encode(),
        headers=Headers({b"content-type": [b"application/json"]}))
    try:
        with pytest.raises(CalibrationError, match="busy"):
            await _calibrate(double.url, "vllm", busy_wait=1.0)
    finally:
        long.cancel()
        long.addErrback(lambda _: None)
        double.stop()
        await close(port)


class _Liar(Resource):
    """A llama.cpp-shaped engine whose timings cannot be true: negative prompt time."""

    isLeaf = True

    def render_GET(self, request: Request) -> bytes:
        if request.path == b"/v1/models":
            return json.dumps({"data": [{"id": "liar"}]}).encode()
        if request.path == b"/slots":
            return b"[]"
        request.setResponseCode(404)
        return b"{}"

    def render_POST(self, request: Request) -> bytes:
        assert request.content is not None
        body = json.loads(request.content.read())
        n = len(body["prompt"]) // 4
        return json.dumps({"choices": [{"text": "x"}], "timings": {
            "cache_n": 0, "prompt_n": n, "prompt_ms": -3.0}}).encode()


@pytest_twisted.ensureDeferred
async def test_an_engine_that_lies_fails_with_every_refusal() -> None:
    """An engine reporting impossible prefill times gets no fit: every probe is refused with
    what it said and the run fails for too few good probes."""
    port = reactor.listenTCP(0, Site(_Liar()), interface="127.0.0.1")  # type: ignore[arg-type]
    url = f"http://127.0.0.1:{port.getHost().port}"  # type: ignore[attr-defined]
    try:
        with pytest.raises(CalibrationError, match="good probes"):
            await _calibrate(url, "llamacpp")
    finally:
        await close(port)


@pytest_twisted.ensureDeferred
async def test_the_printed_fragment_passes_check_and_routes() -> None:
    """The fragment for a calibrated double parses into a backend whose cost model routing
    uses; the command line refuses bad lengths before any request."""
    double, port = start_double("llamacpp", reactor, prefill_s=30e-6, decode_s=0.001)
    try:
        report = await _calibrate(double.url, "auto")
    finally:
        double.stop()
        await close(port)
    cfg = parse_config(fragment(double.url, report))
    assert cfg.backends[0].kind == "llamacpp"
    assert cfg.backends[0].cost_model_terms is not None
    with pytest.raises(SystemExit):
        parse_args(["--url", double.url, "--uncached", "0,12"])
