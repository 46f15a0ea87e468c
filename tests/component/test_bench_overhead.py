"""Layer 3: ``pharos bench overhead`` runs its engine and Pharos as processes and measures;
with ``--observe`` a live map reader is connected throughout, so the figure includes what
the observability records per request (issue 12 item 9); ``--floor`` runs the floor's relays
beside Pharos on the same engine (issue 16 items 1, 2 and 4)."""

from __future__ import annotations

import os

from pharos.bench.floor import ROUTERS, bench_floor
from pharos.bench.overhead import bench_overhead


def test_observed_overhead_reads_every_live_event() -> None:
    """20 measured requests after 50 warm-up ones, observed: the reader was connected
    throughout and read the four events (admitted, routed, first byte, done) of nearly all
    of the 70 (the last may still be in flight to it when the bench stops), and the CPU
    figure is there."""
    r = bench_overhead(requests=20, body_kib=1, observe=True)
    assert r["observe"] is True and r["live_events_read"] >= 4 * 65
    assert r["pharos_cpu_ms_per_request"] > 0


def test_floor_measures_every_router_stream_and_soak() -> None:
    """A short floor run: direct and every router answered every request 200 at one client
    and at 8, each has latency, throughput and CPU figures; the 30-token stream was read
    event by event on both paths; the soak sent all its requests through Pharos and sampled
    its RSS; and this process's CPU affinity is given back as it was."""
    affinity = os.sched_getaffinity(0)
    r = bench_floor(requests=20, clients=8, seconds=0.5, rounds=1, stream_tokens=30,
                    stream_decode_ms=1, streams=1, soak=350, idle_seconds=1.0)
    assert os.sched_getaffinity(0) == affinity
    assert set(r["targets"]) == {"direct", *ROUTERS}
    for t, v in r["targets"].items():
        assert v["not_ok"] == 0, t
        assert v["req_per_s"] > 0 and v["one_client_ms"]["p50"] > 0, t
        assert v["cpu_ms_per_request"] is not None, t
    s = r["stream"]
    # the role chunk, 30 tokens, [DONE]: at least the tokens' events on each path
    assert s["events_per_stream"]["direct"] >= 30 and s["events_per_stream"]["pharos"] >= 30
    assert s["events_per_stream"]["direct"] == s["events_per_stream"]["pharos"]
    k = r["soak"]
    assert k["ok"] == 350 and k["not_ok"] == 0
    assert k["rss_max_mb"] >= k["rss_after_warmup_mb"] > 0
