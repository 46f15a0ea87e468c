"""``pharos bench memory`` measures what it says it does (its figures are never asserted)."""

from __future__ import annotations

from pharos.bench.memory import _conversations, _one_link, index_bytes


def test_index_figures_come_from_a_full_turned_over_index() -> None:
    """Both shapes of traffic fill a small index to within one eviction batch of its capacity,
    and the bytes reported are per entry held; a conversation's links share their slots, so
    they cost less than one-link records."""
    one = index_bytes(_one_link, capacity=5000)
    conv = index_bytes(_conversations, capacity=5000)
    for m in (one, conv):
        assert 5000 - 5000 // 64 <= m["entries"] <= 5000
        assert abs(m["bytes_per_entry"] * m["entries"] / 1e6 - m["mb"]) < 0.1
    assert conv["bytes_per_entry"] < one["bytes_per_entry"]
