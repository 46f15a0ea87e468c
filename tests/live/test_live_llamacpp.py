"""Layer 4 on llama.cpp b11312 (built from source): Pharos's probes against the real server."""

from __future__ import annotations

import time

import pytest_twisted

from tests.live.departure import client_leaves_mid_stream
from tests.live.engines import engines
from tests.live.load import (
    doctor,
    read,
    same_prompt_twice,
    start_streams,
    stop_all,
    wait_started,
)
from tests.live.routing import front
from tests.support.live import ensure_installed, wait_idle

SLOW = {"model": "tiny", "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": engines.LLAMA_SLOW_MAX_TOKENS, **engines.RUN_TO_MAX_TOKENS}


def test_detects_llamacpp_and_reads_idle_signals(llamacpp: engines.RunningEngine) -> None:
    """Detection finds llama.cpp; version, model, capacity are read and an idle server is 0/0."""
    wait_idle(llamacpp)
    r = doctor(llamacpp.url)
    assert r["kind"] == "llamacpp"
    assert r["version"] == f"b{engines.LLAMA_BUILD_NUMBER}"
    assert list(r["signals"]["models"]) == ["tiny"]
    whole = r["signals"]["backend"]
    assert whole["capacity"] == engines.LLAMA_PARALLEL
    assert whole["running"] == 0
    assert whole["waiting"] == 0
    active = {a["probe"] for a in r["active"]}
    assert {"llamacpp-running", "llamacpp-waiting", "llamacpp-props-capacity"} <= active


def test_running_equals_concurrent_requests(llamacpp: engines.RunningEngine) -> None:
    """N streams that all have their first token read as Running == N, Waiting == 0."""
    wait_idle(llamacpp)
    streams = start_streams(llamacpp.url, SLOW, engines.LLAMA_PARALLEL)
    try:
        wait_started(streams, engines.LLAMA_PARALLEL)
        whole = read(llamacpp.url)["signals"]["backend"]
    finally:
        stop_all(streams)
    assert whole["running"] == engines.LLAMA_PARALLEL
    assert whole["waiting"] == 0


def test_more_requests_than_slots_read_as_waiting(llamacpp: engines.RunningEngine) -> None:
    """One stream more than slots: both slots run and the extra one is deferred (Waiting 1)."""
    wait_idle(llamacpp)
    streams = start_streams(llamacpp.url, SLOW, engines.LLAMA_PARALLEL + 1)
    try:
        wait_started(streams, engines.LLAMA_PARALLEL)
        time.sleep(0.5)  # the third request has reached the server's queue by now
        assert sum(s.started.is_set() for s in streams) == engines.LLAMA_PARALLEL
        whole = read(llamacpp.url)["signals"]["backend"]
        still_waiting = sum(not s.started.is_set() for s in streams)
    finally:
        stop_all(streams)
    assert still_waiting == 1, "a slot freed during the read: rerun"
    assert whole["running"] == engines.LLAMA_PARALLEL
    assert whole["waiting"] == 1


def test_repeated_long_prefix_reports_cached_tokens(llamacpp: engines.RunningEngine) -> None:
    """The same long prompt twice: the second reply reports cached tokens (usage and timings)."""
    wait_idle(llamacpp)
    first, second = same_prompt_twice(llamacpp.url, seed=7)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert second["timings"]["cache_n"] > 0
    assert second["usage"]["prompt_tokens"] == first["usage"]["prompt_tokens"]


def test_without_metrics_slots_give_running() -> None:
    """Started without --metrics (/metrics is 501): /slots supplies Running, Waiting is unknown."""
    model = engines.gguf_slow_model()
    assert model is not None
    with engines.start_llama_server(model, parallel=engines.LLAMA_PARALLEL, metrics=False) as eng:
        streams = start_streams(eng.url, SLOW, 1)
        try:
            wait_started(streams, 1)
            r = read(eng.url)
        finally:
            stop_all(streams)
    assert r["signals"]["backend"]["running"] == 1
    assert r["signals"]["backend"]["waiting"] is None
    sources = {a["signal"]: a["probe"] for a in r["active"]}
    assert sources["running"] == "llamacpp-slots-running"
    dropped = {d["probe"]: d["reason"] for d in r["dropped"]}
    assert dropped["llamacpp-running"] == "status 501"


@pytest_twisted.ensureDeferred
async def test_pharos_predicts_a_repeated_prefix_and_corrects_an_evicted_one() -> None:
    """Through Pharos, on one slot without the host-memory prompt cache: a long system prompt
    sent again is predicted and confirmed by timings.cache_n (predicted_hit); once another
    prompt has taken the slot, the prediction is judged wrong and corrected."""
    ensure_installed("llamacpp")
    model = engines.gguf_tiny_model()
    assert model is not None
    system = engines.long_prompt(450, seed=29)
    with engines.start_llama_server(model, parallel=1,
                                    extra_args=["--cache-ram", "0"]) as eng:
        pharos = await front(eng.url, "llamacpp")
        try:
            assert (await pharos.chat(system, "Which port?")).predicted == 0
            second = await pharos.chat(system, "Which tide?")
            assert second.predicted and second.predicted > 300, second
            assert second.cached and second.cached > 0, second
            assert pharos.sched.predictions[("local", "predicted_hit")] == 1
            await pharos.chat(engines.long_prompt(450, seed=31), "Evict it")
            third = await pharos.chat(system, "Which light?")
            assert third.predicted and third.predicted > 300
            assert pharos.sched.predictions[("local", "wrong_prediction")] == 1, third
            assert (await pharos.chat(system, "Which buoy?")).predicted == 0
        finally:
            await pharos.stop()


@pytest_twisted.ensureDeferred
async def test_client_gone_mid_stream_through_pharos_stops_llamacpp(
        llamacpp: engines.RunningEngine) -> None:
    """A client that leaves a long stream through Pharos after its first token: Pharos closes
    the engine connection and llama.cpp frees the slot (requests_processing back to 0), with
    no lease left in Pharos."""
    wait_idle(llamacpp)
    await client_leaves_mid_stream(llamacpp, "llamacpp", SLOW,
                                          "llamacpp:requests_processing")
