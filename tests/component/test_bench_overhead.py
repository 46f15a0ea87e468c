"""Layer 3: ``pharos bench overhead`` runs its engine and Pharos as processes and measures;
with ``--observe`` a live map reader is connected throughout, so the figure includes what
the observability records per request (issue 12 item 9)."""

from __future__ import annotations

from pharos.sim.overhead import bench_overhead


def test_observed_overhead_reads_every_live_event() -> None:
    """20 measured requests after 50 warm-up ones, observed: the reader got the four events
    of each of the 70 (admitted, routed, first byte, done), and the CPU figure is there."""
    r = bench_overhead(requests=20, body_kib=1, observe=True)
    assert r["observe"] is True and r["live_events_read"] >= 4 * 70  # and the fleet
    assert r["pharos_cpu_ms_per_request"] > 0
