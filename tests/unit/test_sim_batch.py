"""The vLLM-like batch model of the engine doubles, on a ``Clock``: the KV block pool against a
naive model, prefill/decode timing on the step timeline, preemption, cancellation and the
status counters."""

from __future__ import annotations

import random
from dataclasses import replace
from itertools import pairwise

import pytest
from twisted.internet.task import Clock

from pharos.sim.batch import VLLM_KNOBS, BatchModel, BlockPool, Chain
from pharos.sim.cli import double_args, parser
from pharos.sim.model import (
    CANCELLED,
    DONE,
    LENGTH,
    RUNNING,
    STOP,
    WAITING,
    GenRequest,
    Job,
    Knobs,
    PromptTooLong,
    token_text,
)
from pharos.sim.prompt import chain_blocks
from tests.support.sim import Listener, run

#: The vLLM double's defaults, with a short output cap.
K = Knobs(**VLLM_KNOBS, max_output_tokens=8)  # type: ignore[arg-type]


def prompt(n_tokens: int, seed: str = "a") -> bytes:
    """A prompt of exactly ``n_tokens`` tokens whose blocks differ from another seed's."""
    unit = f"{seed}:{'x' * 60}".encode()
    return (unit * (n_tokens // 8 + 2))[: 4 * n_tokens]


def engine(clock: Clock, slots: int = 8, **knobs: object) -> BatchModel:
    return BatchModel(clock, {"m": 0}, slots=slots, knobs=replace(K, **knobs))  # type: ignore[arg-type]


def submit(model: BatchModel, clock: Clock, text: bytes,
           max_tokens: int | None = None) -> tuple[Job, Listener]:
    seen = Listener(clock)
    return model.submit(GenRequest("m", text, max_tokens=max_tokens), seen), seen


def decode(k: Knobs, n: int) -> float:
    return k.decode_s + k.decode_seq_s * (n - 1)


# --- the block pool ----------------------------------------------------------------------------


def hashes(*segments: int) -> list[bytes]:
    """The chain of a text made of 64-byte segments (one 16-token block each)."""
    return Chain(64, b"".join(bytes([65 + s]) * 64 for s in segments)).hashes


class NaivePool:
    """The pool's rules written plainly: lists scanned from end to end."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.ref = [0] * n
        self.hash: list[bytes | None] = [None] * n
        self.registry: list[tuple[bytes, int]] = []  # (hash, block), first registered first
        self.free = list(range(n))
        self.owners: dict[int, list[int]] = {}
        self.cached: dict[int, int] = {}

    def lookup(self, hs: list[bytes], limit: int | None = None) -> list[int]:
        out: list[int] = []
        for h in hs:
            if limit is not None and len(out) >= limit:
                break
            found = [b for hh, b in self.registry if hh == h]
            if not found:
                break
            out.append(found[0])
        return out

    def take(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            b = self.free.pop(0)
            if self.hash[b] is not None:
                self.registry.remove((self.hash[b], b))  # type: ignore[arg-type]
                self.hash[b] = None
            self.ref[b] = 1
            out.append(b)
        return out

    def allocate(self, owner: int, hits: list[int], new: int) -> bool:
        if new + len([b for b in hits if self.ref[b] == 0]) > len(self.free):
            return False
        for b in hits:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1
        self.owners[owner] = hits + self.take(new)
        self.cached[owner] = len(hits)
        return True

    def grow(self, owner: int, new: int) -> bool:
        if new > len(self.free):
            return False
        self.owners[owner] += self.take(new)
        return True

    def cache(self, owner: int, hs: list[bytes], full: int) -> None:
        blocks = self.owners[owner]
        end = min(full, len(hs), len(blocks))
        for i in range(self.cached[owner], end):
            self.hash[blocks[i]] = hs[i]
            self.registry.append((hs[i], blocks[i]))
        self.cached[owner] = max(self.cached[owner], end)

    def release(self, owner: int) -> None:
        blocks = self.owners.pop(owner)
        del self.cached[owner]
        plain: list[int] = []
        kept: list[int] = []
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (kept if self.hash[b] is not None else plain).append(b)
        self.free = plain + self.free + kept

    def reset(self) -> bool:
        if len(self.free) < self.n:
            return False
        self.hash = [None] * self.n
        self.registry.clear()
        return True


def same(pool: BlockPool, naive: NaivePool, probes: list[list[bytes]]) -> None:
    assert pool.free_order() == naive.free
    assert {o: list(pool.blocks_of(o)) for o in pool.owners()} == naive.owners
    assert [pool.hash_of(b) for b in range(naive.n)] == naive.hash
    assert [pool.refs(b) for b in range(naive.n)] == naive.ref
    assert pool.usage() == (naive.n - len(naive.free)) / naive.n
    for hs in probes:
        assert pool.lookup(hs) == naive.lookup(hs)


@pytest.mark.parametrize("seed", range(40))
def test_block_pool_matches_a_naive_pool_under_random_operations(seed: int) -> None:
    """Random allocations (with prefix hits), growth, caching, frees and resets leave the pool
    exactly as the plain rules say: the same free queue order, holders, hashes, ref counts,
    usage and prefix hits."""
    rng = random.Random(seed)
    n = rng.randint(4, 24)
    pool, naive = BlockPool(n), NaivePool(n)
    texts: dict[int, list[bytes]] = {}
    probes = [hashes(*[rng.randint(0, 2) for _ in range(6)]) for _ in range(6)]
    probes += [hashes(0, 0, 0, 0), hashes(1, 1, 1), hashes(0, 1, 2)]
    next_owner = 0
    for _ in range(150):
        op = rng.random()
        owners = list(naive.owners)
        if op < 0.35 or not owners:
            hs = hashes(*[rng.randint(0, 2) for _ in range(rng.randint(1, 8))])
            limit = rng.randint(0, len(hs))
            hits = pool.lookup(hs, limit)
            assert hits == naive.lookup(hs, limit)
            new = rng.randint(0, 3)
            assert pool.allocate(next_owner, hits, new) == naive.allocate(next_owner, hits, new)
            texts[next_owner] = hs
            next_owner += 1
        elif op < 0.55:
            o = rng.choice(owners)
            k = rng.randint(1, 2)
            assert pool.grow(o, k) == naive.grow(o, k)
        elif op < 0.75:
            o = rng.choice(owners)
            full = rng.randint(0, len(naive.owners[o]))
            pool.cache(o, texts[o], full)
            naive.cache(o, texts[o], full)
        elif op < 0.97:
            o = rng.choice(owners)
            pool.free(o)
            naive.release(o)
        else:
            assert pool.reset() == naive.reset()
        same(pool, naive, probes)
    for o in list(naive.owners):
        pool.free(o)
        naive.release(o)
    same(pool, naive, probes)
    assert pool.held == 0


def test_a_shared_prefix_is_held_once() -> None:
    """Two holders of the same three cached blocks and one block of their own each hold five
    blocks between them, not eight; the shared blocks stay held until both let go."""
    pool = BlockPool(10)
    hs = hashes(0, 1, 2)
    assert pool.allocate(1, [], 4)
    pool.cache(1, hs, 3)
    hits = pool.lookup(hs)
    assert hits == list(pool.blocks_of(1)[:3])
    assert pool.allocate(2, hits, 1)
    assert pool.held == 5 and pool.usage() == 0.5
    assert [pool.refs(b) for b in hits] == [2, 2, 2]
    pool.free(1)
    assert pool.held == 4
    pool.free(2)
    assert pool.held == 0


def test_freed_blocks_serve_hits_until_reused_tail_first_least_recent_first() -> None:
    """A freed request's cached blocks still serve hits; the pool hands out never-used blocks
    first, then an unhashed freed block (at the head), then cached blocks least recently freed,
    a request's tail before its head, so a cached prefix shortens from its end."""
    pool = BlockPool(8)
    a, b = hashes(0, 1, 2), hashes(3, 4)
    assert pool.allocate(1, [], 4)  # three cached blocks and a partial fourth
    pool.cache(1, a, 3)
    assert pool.allocate(2, [], 2)
    pool.cache(2, b, 2)
    blocks_a, blocks_b = pool.blocks_of(1), pool.blocks_of(2)
    pool.free(1)
    pool.free(2)
    assert pool.lookup(a) == list(blocks_a[:3]) and pool.lookup(b) == list(blocks_b)
    assert pool.free_order() == [blocks_a[3], 6, 7, blocks_a[2], blocks_a[1], blocks_a[0],
                                 blocks_b[1], blocks_b[0]]
    assert pool.allocate(3, [], 4)  # the unhashed block and the two never used, then a's tail
    assert len(pool.lookup(a)) == 2 and len(pool.lookup(b)) == 2
    pool.free(3)
    # A hit takes a free cached block back out of the queue; the rest keep their order.
    assert pool.allocate(4, pool.lookup(b), 0)
    assert blocks_b[0] not in pool.free_order() and pool.lookup(a) == list(blocks_a[:2])


def test_reset_forgets_hashes_only_when_nothing_is_held() -> None:
    """Like POST /reset_prefix_cache: refused while a block is held, else every hash goes."""
    pool = BlockPool(4)
    hs = hashes(0, 1)
    assert pool.allocate(1, [], 2)
    pool.cache(1, hs, 2)
    assert not pool.reset() and len(pool.lookup(hs)) == 2
    pool.free(1)
    assert pool.reset() and pool.lookup(hs) == []


def test_chain_matches_the_prompt_module_and_grows_incrementally() -> None:
    """With 16-token blocks the chain is prompt.chain_blocks; fed piece by piece it is the
    same as fed whole."""
    text = bytes(range(256)) * 3
    assert Chain(64, text).hashes == list(chain_blocks(text))
    grown = Chain(64)
    for i in range(0, len(text), 7):
        grown.extend(text[i : i + 7])
    assert grown.hashes == list(chain_blocks(text))


# --- timing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens", [1, 100, 2048, 5000])
def test_idle_ttft_is_exactly_the_prefill_cost(tokens: int) -> None:
    """On an idle engine the first token comes after exactly P(u, 0), also when the prompt is
    longer than one step's budget (chunked prefill: the chunks add up to P); then one token per
    decode step; the listener is never called inside submit and hears the finish reason before
    the last token."""
    clock = Clock()
    clock.advance(3.25)
    model = engine(clock)
    job, seen = submit(model, clock, prompt(tokens), max_tokens=3)
    assert seen.tokens == []
    run(clock, 100)
    assert job.ttft == pytest.approx(K.prefill_seconds(tokens, 0), abs=1e-9)
    t = seen.times()
    assert [e.index for e in seen.tokens] == [0, 1, 2]
    assert [e.text for e in seen.tokens] == [token_text(i) for i in range(3)]
    assert t[1] - t[0] == pytest.approx(K.decode_s, abs=1e-9)
    assert seen.tokens[-1].last and seen.tokens[-1].reason == LENGTH
    assert seen.done_at == t[-1] and job.state == DONE


@pytest.mark.parametrize(("first", "extra"), [(300, 200), (3000, 1500)])
def test_idle_ttft_with_a_cached_prefix_is_p_of_the_rest(first: int, extra: int) -> None:
    """A prompt extending an earlier one finds its whole blocks cached (c > 0) and its first
    token comes after exactly P(u, c) for the uncached rest, chunked or not."""
    clock = Clock()
    model = engine(clock)
    base = prompt(first)
    submit(model, clock, base)
    run(clock, 100)
    job, _ = submit(model, clock, base + prompt(extra, "z"))
    run(clock, 100)
    c = (first // 16) * 16
    assert job.cached_tokens == c
    assert job.ttft == pytest.approx(K.prefill_seconds(first + extra - c, c), abs=1e-9)


def test_a_repeated_prompt_recomputes_its_last_block() -> None:
    """A prompt sent twice hits all but its last token, rounded down to whole blocks: 64
    tokens hit 48, 65 hit 64."""
    for tokens, hit in ((64, 48), (65, 64)):
        clock = Clock()
        model = engine(clock)
        submit(model, clock, prompt(tokens))
        run(clock, 10)
        job, _ = submit(model, clock, prompt(tokens))
        run(clock, 10)
        assert job.cached_tokens == hit


def test_ttft_rises_with_load() -> None:
    """More requests arriving together: each one's first token comes later on average, and
    the last one's later still."""
    means, lasts = [], []
    for n in (1, 2, 3, 4, 8, 16):
        clock = Clock()
        model = engine(clock, slots=16)
        jobs = [submit(model, clock, prompt(1000, f"s{i}"))[0] for i in range(n)]
        run(clock, 100)
        ttfts = [j.ttft for j in jobs]
        assert None not in ttfts
        means.append(sum(t for t in ttfts if t is not None) / n)
        lasts.append(max(t for t in ttfts if t is not None))
    assert means == sorted(means) and len(set(means)) == len(means)
    assert lasts == sorted(lasts) and len(set(lasts)) == len(lasts)


@pytest.mark.parametrize("n", [1, 4, 16])
def test_decode_steps_stretch_with_the_batch(n: int) -> None:
    """n sequences decoding together: each step takes decode_s + decode_seq_s·(n-1)."""
    clock = Clock()
    model = engine(clock, slots=16)
    pairs = [submit(model, clock, prompt(10, f"s{i}"), max_tokens=6) for i in range(n)]
    assert model.status().running == n  # arrivals at one instant share the first step
    run(clock, 100)
    for job, seen in pairs:
        t = seen.times()
        assert t[0] == pytest.approx(n * K.prefill_seconds(10, 0), abs=1e-9)
        assert [b - a for a, b in pairwise(t)] == pytest.approx(
            [decode(K, n)] * 5, abs=1e-9)
        assert job.finish_reason == LENGTH


def test_a_prefill_in_the_step_stretches_the_decodes() -> None:
    """A request arriving while others decode is prefilled in the next step, alongside their
    decodes: that step lasts decode(n) + P(u, 0); the steps after it decode n + 1."""
    clock = Clock()
    model = engine(clock, slots=16, max_output_tokens=30)
    pairs = [submit(model, clock, prompt(10, f"s{i}")) for i in range(4)]
    run(clock, 0.1)
    late, late_seen = submit(model, clock, prompt(500, "late"))
    run(clock, 100)
    t = pairs[0][1].times()
    gaps = [b - a for a, b in pairwise(t)]
    stretched = decode(K, 4) + K.prefill_seconds(500, 0)
    i = next(i for i, g in enumerate(gaps) if g == pytest.approx(stretched, abs=1e-9))
    assert gaps[:i] == pytest.approx([decode(K, 4)] * i, abs=1e-9)
    assert gaps[i + 1 : i + 5] == pytest.approx([decode(K, 5)] * 4, abs=1e-9)
    assert late_seen.times()[0] == t[i + 1]
    assert late.ttft is not None and late.ttft > K.prefill_seconds(500, 0)


def test_hold_freezes_the_timeline() -> None:
    """hold() keeps a request where it is (no token however long); release() resumes and the
    first token comes after what remained of the prefill."""
    clock = Clock()
    model = engine(clock)
    job, seen = submit(model, clock, prompt(1000))
    p = K.prefill_seconds(1000, 0)
    run(clock, p / 2)
    model.hold()
    run(clock, 50)
    assert seen.tokens == [] and job.state == RUNNING
    model.release()
    run(clock, 100)
    assert job.ttft == pytest.approx(p + 50, abs=1e-9)
    t = seen.times()
    assert t[1] - t[0] == pytest.approx(K.decode_s, abs=1e-9)


# --- capacity ----------------------------------------------------------------------------------


def test_a_dry_pool_preempts_and_every_request_still_finishes() -> None:
    """Eight requests that grow past a 12-block pool: newer ones are preempted and recomputed,
    the preemptions are counted, every request gets all its tokens once and in order, and no
    block is held at the end."""
    clock = Clock()
    model = engine(clock, slots=8, cache_tokens=12 * 16, max_output_tokens=40)
    pairs = [submit(model, clock, prompt(40, f"s{i}"), max_tokens=40) for i in range(8)]
    run(clock, 1000)
    status = model.status()
    assert status.preemptions > 0
    assert status.finished == {LENGTH: 8}
    for job, seen in pairs:
        assert [e.index for e in seen.tokens] == list(range(40))
        assert job.state == DONE and seen.done_at is not None
    assert model.pool.held == 0 and status.running == status.waiting == 0
    assert status.generated_tokens_total == 8 * 40
    assert status.prompt_tokens_total == 8 * 40  # counted once, not again on recompute


def test_a_request_that_does_not_fit_blocks_those_behind_it() -> None:
    """First come, first served: a waiting request without room for its blocks keeps a smaller
    one behind it waiting, until the running request ends."""
    clock = Clock()
    model = engine(clock, slots=4, cache_tokens=10 * 16, max_output_tokens=20)
    a, _ = submit(model, clock, prompt(100, "a"), max_tokens=20)
    run(clock, 0.05)
    b, _ = submit(model, clock, prompt(60, "b"), max_tokens=4)
    c, _ = submit(model, clock, prompt(5, "c"), max_tokens=4)
    run(clock, 0.2)
    assert (a.state, b.state, c.state) == (RUNNING, WAITING, WAITING)
    assert model.status().waiting == 2
    run(clock, 100)
    assert a.finished_at is not None and b.admitted_at is not None and c.admitted_at is not None
    assert a.finished_at <= b.admitted_at <= c.admitted_at
    assert model.status().finished == {LENGTH: 3}


def test_the_sequence_cap_holds_requests_back() -> None:
    """max_num_seqs sequences run at once; the rest wait and start as sequences end."""
    clock = Clock()
    model = engine(clock, slots=2)
    jobs = [submit(model, clock, prompt(10, f"s{i}"), max_tokens=2)[0] for i in range(3)]
    assert [j.state for j in jobs] == [RUNNING, RUNNING, WAITING]
    assert {j.slot for j in jobs[:2]} == {0, 1}
    run(clock, 100)
    assert all(j.state == DONE for j in jobs)
    assert jobs[2].admitted_at == jobs[0].finished_at


def test_cancellation_frees_sequences_and_blocks() -> None:
    """A cancelled running request gives back its sequence and blocks at once and hears
    nothing more; a cancelled waiting one is withdrawn; both count as aborts."""
    clock = Clock()
    model = engine(clock, slots=1, max_output_tokens=50)
    a, seen_a = submit(model, clock, prompt(100, "a"), max_tokens=50)
    b, seen_b = submit(model, clock, prompt(100, "b"), max_tokens=2)
    c, seen_c = submit(model, clock, prompt(100, "c"), max_tokens=2)
    run(clock, 0.2)
    assert model.pool.held > 0 and seen_a.tokens
    heard = len(seen_a.tokens)
    model.cancel(c)
    model.cancel(a)
    assert (a.state, c.state) == (CANCELLED, CANCELLED)
    assert model.pool.held == 0 and model.status().waiting == 1
    run(clock, 100)
    assert len(seen_a.tokens) == heard and seen_c.tokens == []
    assert b.state == DONE and [e.index for e in seen_b.tokens] == [0, 1]
    status = model.status()
    assert status.finished == {"abort": 2, LENGTH: 1}
    assert model.pool.held == 0


def test_refusals() -> None:
    """Like vLLM at start: a pool smaller than max_model_len, or a step budget below
    max_num_seqs, is refused; a prompt beyond the context is refused at submit, and an
    unbounded reply is cut to the context ("length")."""
    clock = Clock()
    with pytest.raises(ValueError, match="cannot hold"):
        BatchModel(clock, {"m": 0}, knobs=replace(K, cache_tokens=64), max_model_len=128)
    with pytest.raises(ValueError, match="max_num_seqs"):
        BatchModel(clock, {"m": 0}, slots=300, knobs=replace(K, batch_tokens=256))
    with pytest.raises(ValueError, match="exactly one model"):
        BatchModel(clock, {"a": 0, "b": 0}, knobs=K)
    model = engine(clock, cache_tokens=128, max_output_tokens=64)
    with pytest.raises(PromptTooLong):
        submit(model, clock, prompt(128))
    with pytest.raises(PromptTooLong):
        submit(model, clock, prompt(100), max_tokens=40)
    job, _ = submit(model, clock, prompt(100))
    assert job.output_tokens == 28 and job.finish_reason == LENGTH
    run(clock, 100)
    assert job.tokens_done == 28 and model.pool.held == 0


# --- caching and counters ----------------------------------------------------------------------


def test_the_next_turn_hits_the_previous_reply() -> None:
    """Generated blocks are cached as they are computed: a next turn that repeats prompt and
    reply hits beyond the prompt; a finished request's blocks serve hits until reused."""
    clock = Clock()
    model = engine(clock, max_output_tokens=40, cache_tokens=40 * 16)
    turn1 = prompt(64)
    submit(model, clock, turn1)
    run(clock, 100)
    reply = "".join(token_text(i) for i in range(40)).encode()
    turn2 = turn1 + reply + prompt(64, "b")
    assert model.cached_prefix("m", turn2) > 64
    job, _ = submit(model, clock, turn2)
    run(clock, 100)
    assert job.cached_tokens > 64
    # Other prompts take the whole pool: the cached blocks are handed out again.
    for i in range(4):
        submit(model, clock, prompt(300, f"o{i}"), max_tokens=1)
        run(clock, 100)
    assert model.cached_prefix("m", turn2) == 0


def test_status_counters() -> None:
    """The status holds the gauges and counters the metrics page shows: running, waiting, KV
    tokens held against the pool's, prompt/cached/computed/generated tokens, finish reasons,
    prefix queries and hits."""
    clock = Clock()
    model = engine(clock, slots=1)
    text = prompt(100)
    a, _ = submit(model, clock, text, max_tokens=2)
    b, _ = submit(model, clock, text, max_tokens=2)
    status = model.status()
    assert (status.running, status.waiting) == (1, 1)
    assert status.kv_capacity == 4096 * 16
    assert status.model("m").kv_tokens == 7 * 16 and status.kv_usage == 7 / 4096
    run(clock, 100)
    status = model.status()
    assert (status.running, status.waiting, status.kv_usage) == (0, 0, 0.0)
    assert b.cached_tokens == 96
    assert status.prompt_tokens_total == 200
    assert status.cached_tokens_total == 96
    assert status.computed_tokens_total == 104
    assert status.generated_tokens_total == 4
    assert status.finished == {LENGTH: 2}
    assert (status.prefix_queries_total, status.prefix_hits_total) == (200, 96)
    assert status.preemptions == 0
    assert status.tokens_max == 102
    assert a.prefill_seconds == pytest.approx(K.prefill_seconds(100, 0), abs=1e-9)


@pytest.mark.parametrize("seed", range(25))
def test_random_schedules_keep_the_rules_and_drain_clean(seed: int) -> None:
    """Random arrivals of prompts sharing prefixes, random output lengths and cancellations on
    a small pool with a small step budget: the sequence cap always holds, requests start in
    arrival order, the pool holds exactly the running requests' blocks, and once drained every
    request either finished with all its tokens or was cancelled, and no block is held."""
    rng = random.Random(seed)
    clock = Clock()
    slots = rng.randint(1, 6)
    model = engine(clock, slots=slots, cache_tokens=rng.randint(10, 24) * 16,
                   batch_tokens=rng.choice([slots, 64, 256, 2048]), max_output_tokens=30)
    heads = [prompt(rng.randint(10, 60), f"h{i}") for i in range(3)]
    jobs: list[tuple[Job, Listener]] = []
    cancelled: set[int] = set()

    def check() -> None:
        status = model.status()
        assert status.running <= slots
        running = [j for j, _ in jobs if j.state == RUNNING]
        assert len(running) == status.running
        held = {b for j in running for b in model.pool.blocks_of(j.id)}
        assert len(held) == model.pool.held
        for j, _ in jobs:
            if j.state != RUNNING:
                assert model.pool.blocks_of(j.id) == ()
        admitted = [j.admitted_at for j, _ in jobs if j.admitted_at is not None]
        assert admitted == sorted(admitted)
        never = [j.id for j, _ in jobs if j.admitted_at is None and j.state == WAITING]
        if never:
            assert all(j.admitted_at is None for j, _ in jobs if j.id > never[0])

    for _ in range(60):
        run(clock, rng.expovariate(20.0))
        if rng.random() < 0.8 or not jobs:
            text = rng.choice(heads) + prompt(rng.randint(1, 40), f"t{rng.randint(0, 3)}")
            want = rng.choice([None, rng.randint(1, 30)])
            jobs.append(submit(model, clock, text, max_tokens=want))
        else:
            job, _ = rng.choice(jobs)
            if job.state in (RUNNING, WAITING):
                cancelled.add(job.id)
            model.cancel(job)
        check()
    run(clock, 1000)
    check()
    status = model.status()
    assert status.running == status.waiting == 0 and model.pool.held == 0
    for job, seen in jobs:
        if job.id in cancelled:
            assert job.state == CANCELLED
            assert len(seen.tokens) == job.tokens_done and seen.done_at is None
        else:
            assert job.state == DONE and job.tokens_done == job.output_tokens
            assert [e.index for e in seen.tokens] == list(range(job.output_tokens))
            assert seen.done_at == seen.tokens[-1].at
    finished = dict(status.finished)
    assert finished.pop("abort", 0) == len(cancelled)
    assert sum(finished.values()) == len(jobs) - len(cancelled)
    assert set(finished) <= {STOP, LENGTH}


def test_vllm_flags_of_the_sim_cli() -> None:
    """The sim CLI's vLLM flags become knobs; unset numbers stay unset (the kind's default)."""
    args = parser().parse_args(["--kind", "vllm", "--max-num-seqs", "64", "--block-size", "32",
                                "--num-gpu-blocks-override", "100",
                                "--max-num-batched-tokens", "512", "--prefill-pair-ns", "2",
                                "--prefill-fixed-ms", "4", "--decode-seq-us", "50"])
    got = double_args(args)
    assert got["slots"] == 64 and got["block_tokens"] == 32 and got["cache_tokens"] == 3200
    assert got["batch_tokens"] == 512 and got["prefill_pair_s"] == pytest.approx(2e-9)
    assert got["prefill_fixed_s"] == 0.004 and got["decode_seq_s"] == pytest.approx(5e-5)
    plain = double_args(parser().parse_args(["--kind", "vllm"]))
    assert not {"prefill_s", "decode_s", "cache_tokens", "batch_tokens"} & set(plain)


def test_kv_usage_counts_running_blocks_or_the_caches_fill() -> None:
    """KV usage as vLLM counts it is the blocks running requests hold (0 once they finish,
    however full the prefix cache); ``fill`` also counts free blocks still caching a prefix,
    so an idle engine whose cache has cycled reports it full. ``--kv-usage fill`` sets it."""
    results = {}
    for counts in ("running", "fill"):
        clock = Clock()
        model = engine(clock, slots=4, cache_tokens=64 * 16, kv_usage_counts=counts)
        for i in range(6):  # 6 x 20 blocks of distinct prompts through a 64-block pool
            submit(model, clock, prompt(300, f"p{i}"), max_tokens=1)
            run(clock, 100)
        results[counts] = model.status().kv_usage
    assert results["running"] == 0.0
    assert results["fill"] > 0.9
    args = double_args(parser().parse_args(["--kind", "vllm", "--kv-usage", "fill"]))
    assert args["kv_usage_counts"] == "fill"
    with pytest.raises(ValueError):
        Knobs(kv_usage_counts="blocks")
