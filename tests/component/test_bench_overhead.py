"""Layer 3: ``pharos bench overhead`` runs its engine and Pharos as processes and measures;
with ``--observe`` a live map reader is connected throughout, so the figure includes what
the observability records per request (issue 12 item 9)."""

from __future__ import annotations

from pharos.sim.overhead import bench_overhead


def test_observed_overhead_reads_every_live_event() -> None:
    """20 measured requests after 50 warm-up ones, observed: the reader was connected
    throughout and read the four events (admitted, routed, first byte, done) of nearly all
    of the 70 (the last may still be in flight to it when the bench stops), and the CPU
    figure is there."""
    r = bench_overhead(requests=20, body_kib=1, observe=True)
    assert r["observe"] is True and r["live_events_read"] >= 4 * 65
    assert r["pharos_cpu_ms_per_request"] > 0
