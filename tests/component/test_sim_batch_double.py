"""The vLLM double on its batch model, over a real loopback socket: a repeated prompt reports
its cached tokens in the reply's usage, and the metrics page read through Pharos's probe
library shows the running, waiting, KV usage and preemption numbers of the model."""

from __future__ import annotations

import json

import pytest_twisted
from twisted.internet.task import Clock
from twisted.web.client import ResponseDone

from pharos.engine.library import VLLM
from pharos.engine.plan import resolve
from pharos.engine.probes import prom_samples
from pharos.sim.batch import BatchModel
from pharos.sim.wire import split_events
from tests.support.doubles import Rig, chat, started
from tests.support.sim import run


def text(n_tokens: int, seed: str) -> str:
    """A message of ``n_tokens`` tokens whose blocks differ from another seed's."""
    unit = f"{seed}:{'x' * 60}"
    return (unit * (n_tokens // 8 + 2))[: 4 * n_tokens]


@pytest_twisted.ensureDeferred
async def test_repeated_prompt_reports_cached_tokens(rigs: list[Rig]) -> None:
    """The vLLM double runs the batch model; the same 100-token prompt sent twice reports 0
    then 96 cached tokens in usage.prompt_tokens_details, and the second comes sooner."""
    clock = Clock()
    rig = Rig(VLLM, clock, max_output_tokens=3)
    rigs.append(rig)
    double = rig.double
    assert isinstance(double.model, BatchModel)
    cached = []
    for turn in range(2):
        pending = rig.post("/v1/chat/completions", chat(
            text(100, "a"), stream=True, stream_options={"include_usage": True}))
        await double.when(started(double, turn + 1))
        run(clock, 10)
        body = await rig.read(await pending)
        assert (await body.ended()).check(ResponseDone)
        usage = split_events(body.data, "text/event-stream")[1][-2]["usage"]
        assert usage["prompt_tokens"] == 100 and usage["completion_tokens"] == 3
        cached.append(usage["prompt_tokens_details"]["cached_tokens"])
    assert cached == [0, 96]
    first, second = double.jobs
    assert first.ttft is not None and second.ttft is not None and second.ttft < first.ttft


@pytest_twisted.ensureDeferred
async def test_metrics_show_the_batch_model_through_the_probes(rigs: list[Rig]) -> None:
    """Held with three 150-token requests and two sequences, the probes read 2 running, 1
    waiting, the KV usage of their blocks (10 of 40 each) and the pool's 640 tokens (the
    recorded cache_config_info relabelled); on a pool too small for four
    growing requests, the metrics page counts preemptions and every reply still completes."""
    clock = Clock()
    rig = Rig(VLLM, clock, slots=2, cache_tokens=40 * 16)
    rigs.append(rig)
    double = rig.double
    double.hold()
    for i in range(3):
        rig.post("/v1/chat/completions", chat(text(150, f"s{i}"), stream=True))
    await double.when(started(double, 3))
    plan, _ = await resolve(rig.fetcher, VLLM)
    snap, failures = await plan.scrape(rig.fetcher, full=False)
    assert failures == ()
    load = snap.load["tiny"]
    assert (load.running, load.waiting, load.kv_usage) == (2, 1, 0.5)
    full, _ = await plan.scrape(rig.fetcher, full=True)
    # vllm:cache_config_info names the double's own pool: 40 blocks of 16 tokens
    assert full.load[""].kv_pool_tokens == 40 * 16
    info = prom_samples((await rig.fetcher.fetch("/metrics")).body)["vllm:cache_config_info"]
    assert [(lb["num_gpu_blocks"], lb["block_size"], lb["kv_cache_size_tokens"])
            for lb, _ in info] == [("40", "16", "640")]

    clock = Clock()
    tight = Rig(VLLM, clock, slots=4, cache_tokens=12 * 16, max_output_tokens=40)
    rigs.append(tight)
    pending = [tight.post("/v1/chat/completions",
                          chat(text(40, f"t{i}"), max_tokens=40)) for i in range(4)]
    await tight.double.when(started(tight.double, 4))
    run(clock, 100)
    for d in pending:
        body = await tight.read(await d)
        assert (await body.ended()).check(ResponseDone)
        assert json.loads(body.data)["usage"]["completion_tokens"] == 40
    page = (await tight.fetcher.fetch("/metrics")).body
    samples = prom_samples(page)
    preemptions = samples["vllm:num_preemptions_total"][0][1]
    assert preemptions > 0 and preemptions == tight.double.model.status().preemptions
    assert samples["vllm:kv_cache_usage_perc"][0][1] == 0.0
    assert samples["vllm:prefix_cache_queries_total"][0][1] >= 4 * 40
    snap, _ = await plan.scrape(tight.fetcher, full=False)
    assert (snap.load["tiny"].running, snap.load["tiny"].waiting) == (0, 0)


@pytest_twisted.ensureDeferred
async def test_prompt_longer_than_the_context_is_a_400(rigs: list[Rig]) -> None:
    """A prompt that cannot fit in the KV pool is refused at once with a 400 in vLLM's error
    shape, as vLLM refuses a request over its context length."""
    clock = Clock()
    rig = Rig(VLLM, clock, cache_tokens=256)
    rigs.append(rig)
    response = await rig.post("/v1/chat/completions", chat(text(1000, "b")))
    body = await rig.read(response)
    assert (await body.ended()).check(ResponseDone)
    assert response.code == 400
    assert "error" in json.loads(body.data)
    assert rig.double.stats.started == 0
