"""Layer 1: the hot-prefix demand counter (``pharos.hot``): demand decays, owners grow with
demand, the counter stays bounded."""

from __future__ import annotations

import math

import pytest

from pharos.hot import HotPrefixes


def test_demand_is_slots_kept_busy_and_decays() -> None:
    """A steady rate r of requests holding a slot s seconds converges to r·s busy slots, and
    demand halves every half-life once requests stop."""
    hot = HotPrefixes(half_life=10.0)
    for i in range(2000):  # 2 requests a second, 3 s each, for 1000 s
        hot.add(1, 3.0, i * 0.5)
    now = 999.5
    assert hot.demand(1, now) == pytest.approx(6.0, rel=0.05)
    assert hot.demand(1, now + 10) == pytest.approx(hot.demand(1, now) / 2, rel=1e-6)
    assert hot.demand(2, now) == 0.0


def test_owners_follow_demand() -> None:
    """One owner while demand fits in one target's slots at the utilization, more after."""
    hot = HotPrefixes(half_life=10.0)
    assert hot.owners(1, 0.0, slots_per_owner=4) == 1
    for i in range(2000):
        hot.add(1, 3.0, i * 0.5)
    expected = math.ceil(hot.demand(1, 999.5) / 2)
    assert expected in (3, 4)
    assert hot.owners(1, 999.5, slots_per_owner=4, utilization=0.5) == expected
    assert hot.owners(1, 999.5, slots_per_owner=100) == 1


def test_bounded() -> None:
    """Only the most recently seen roots are kept."""
    hot = HotPrefixes(capacity=3)
    for root in range(10):
        hot.add(root, 1.0, float(root))
    assert len(hot) == 3
    assert hot.demand(0, 10.0) == 0.0 and hot.demand(9, 10.0) > 0
