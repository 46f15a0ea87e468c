"""Layer 3: KV pressure never erases the cache signal (issue 10 item 1). Three simulated vLLM
engines whose caches each hold about half of eight shared system prompts, once reporting KV
usage as vLLM counts it (blocks of running requests: near 0 here) and once as the cache's fill
(near 1 once the pool has cycled, as a busy engine shows): the hit rate is the same within a
few points, and the decisions say the guard was waived."""

from __future__ import annotations

import json
import random

import pytest_twisted
import treq
from twisted.internet.defer import ensureDeferred, gatherResults

from tests.support.fleet import Fleet, eventually, start_fleet, within

#: Eight system prompts of 2,000 characters (~500 tokens); each pool holds ~2,400 tokens.
SYSTEMS = [" ".join(f"rule{n}-{i} keep the light burning" for i in range(60))[:2000]
           for n in range(8)]


async def _chat(fleet: Fleet, system: str, question: str) -> tuple[int, int, str]:
    """(prompt tokens, cached tokens, reason) of one non-streamed chat."""
    r = await fleet.post("/v1/chat/completions", {
        "model": "tiny", "max_tokens": 2, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": question}]})
    doc = json.loads(await r.content())
    assert r.code == 200, doc
    usage = doc["usage"]
    reason = (r.headers.getRawHeaders(b"x-pharos-reason") or [b""])[0].decode()
    return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], reason


async def _hit_rate(kv_usage_counts: str) -> tuple[float, list[str], list[float]]:
    engine = {"seed": 0, "cache_tokens": 2400, "kv_usage_counts": kv_usage_counts}
    fleet = await start_fleet([("vllm", {**engine, "seed": i}, {"kind": "vllm"})
                               for i in range(3)])
    try:
        rng = random.Random(7)
        # Fill every pool with prompts nobody repeats (the cache a busy fleet has), sent to
        # each engine directly so every pool cycles.
        for d in fleet.doubles:
            for i in range(8):
                body = {"model": "tiny", "max_tokens": 1, "messages": [
                    {"role": "user", "content": f"filler {d.url} {i} " * 200}]}
                r = await treq.post(d.url + "/v1/chat/completions", json.dumps(body).encode(),
                                    pool=fleet.pool)
                await r.content()
        await eventually(lambda: all(fleet.pharos.state.view(t).kv_usage is not None
                                     for t in fleet.pharos.state.targets), timeout=10)
        kv: list[float] = []
        prompt = cached = 0
        reasons: list[str] = []
        for batch in range(60):
            replies = await gatherResults([ensureDeferred(_chat(fleet, rng.choice(SYSTEMS),
                                                                f"q{batch}-{k}"))
                                           for k in range(3)])
            for p, c, reason in replies:
                if batch >= 6:  # after each prompt found its owners
                    prompt, cached = prompt + p, cached + c
                reasons.append(reason)
            if batch >= 6:
                kv += [u for t in fleet.pharos.state.targets
                       if (u := fleet.pharos.state.view(t).kv_usage) is not None]
        return cached / prompt, reasons, kv
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_full_kv_usage_keeps_prefix_affinity() -> None:
    """Engines reporting KV usage >= 0.95 throughout keep their prefix affinity: the hit rate
    is within a few points of the same run with usage counted as vLLM does, and the guard is
    reported waived (the old penalty, which took back every match above the threshold, gave
    0.74 against 0.93 in this test; the issue's run against round robin's 0.42 gave 0.40)."""
    near_zero, _, kv_idle = await _hit_rate("running")
    full, reasons, kv_full = await _hit_rate("fill")
    idle = sorted(kv_idle)[len(kv_idle) // 2]
    print(f"hit rate {near_zero:.3f} (KV as vLLM counts it, median {idle:.2f}) vs "
          f"{full:.3f} (the cache's fill, min {min(kv_full):.2f})")
    assert idle < 0.3 and min(kv_full) >= 0.95
    assert near_zero > 0.6, near_zero
    assert abs(full - near_zero) < 0.08, (full, near_zero)
    assert sum("kv pressure waived" in r for r in reasons) > len(reasons) / 2




@pytest_twisted.ensureDeferred
async def test_a_64_sequence_vllm_gets_its_slots_learned() -> None:
    """A simulated vLLM with --max-num-seqs 64 and no capacity in config: under saturating
    load Pharos learns at least 48 slots (it starts from 2), and explain names the source."""
    fleet = await start_fleet([("vllm", {"slots": 64, "decode_s": 0.05,
                                         "max_output_tokens": 100}, {"kind": "vllm"})])
    double = fleet.doubles[0]
    (target,) = fleet.pharos.state.targets
    try:
        replies = [ensureDeferred(fleet.chat("tiny", max_tokens=100)) for _ in range(150)]
        await eventually(lambda: (target.learned_capacity or 0) >= 48, timeout=60)
        await eventually(lambda: double.running >= 48, timeout=30)
        r = await fleet.post("/admin/explain/v1/chat/completions", {
            "model": "tiny", "messages": [{"role": "user", "content": "x"}]})
        (cand,) = json.loads(await r.content())["candidates"]
        assert cand["capacity_source"] == "learned" and cand["capacity"] >= 48
        for d in replies:
            r = await within(d, 60)
            await r.content()
            assert r.code == 200
    finally:
        await fleet.stop()
