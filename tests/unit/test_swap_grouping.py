"""Layer 1: swap-thrash grouping on a host that holds one model at a time (issue 15 item 4),
on a Clock (``pharos.bench.swaps``: the real scheduler in front of an in-memory Ollama whose
``/api/ps`` lists the one model it loaded last). A swap is a dispatch of another model than the
host's loaded one. Counting swaps is behaviour, not timing: the ratio against FIFO dispatch is
asserted."""

from __future__ import annotations

from pharos.bench.swaps import pattern, run_swaps
from pharos.placement import ReplicaRule

FIFO = ReplicaRule(swap_grouping=False)
GROUPED = ReplicaRule()


def test_grouping_swaps_at_least_three_times_less_than_fifo() -> None:
    """On A-B-A-A-C twelve times (a request every 0.1 s, faster than the host serves), FIFO
    dispatch (swap grouping off, one key: arrival order) swaps at every change of model;
    grouping serves the queued requests of the loaded model before a swap: at least 3x fewer
    swaps, and every request is served."""
    arrivals = pattern(12)
    fifo = run_swaps(FIFO, arrivals)
    grouped = run_swaps(GROUPED, arrivals)
    assert fifo.served == grouped.served == len(arrivals)
    assert list(fifo.order) == [m for _, m in arrivals]  # FIFO is arrival order
    assert fifo.swaps >= 40
    assert grouped.swaps * 3 <= fifo.swaps, (grouped.swaps, fifo.swaps)


def test_a_swap_waits_while_the_loaded_model_has_requests_queued() -> None:
    """Every request under its own key (the fair queue's heads in arrival order) on a host
    with one slot: each time the loaded model's request ends, the next head asks for another
    model, and without grouping it swaps although requests for the loaded model are queued;
    with grouping the swap is held (``placement.swap_hold``) until they are served, and past
    the bound each model that gets the host serves the requests queued before it loaded."""
    arrivals = pattern(12)
    grouped = run_swaps(GROUPED, arrivals, key=None, slots=1)
    ungrouped = run_swaps(FIFO, arrivals, key=None, slots=1)
    assert grouped.served == ungrouped.served == len(arrivals)
    assert ungrouped.swaps >= 20
    assert grouped.swaps * 3 <= ungrouped.swaps, (grouped.swaps, ungrouped.swaps)


def test_a_tail_model_is_served_within_the_wait_bound() -> None:
    """The loaded model asked for without a pause (never idle, its queue never empty) does
    not starve a tail request: past the bound the host takes no more of the loaded model, it
    drains, and the tail model loads; without the bound's drain it would wait for ever."""
    bound, service = 20.0, 1.0
    arrivals = [(0.4 * i, "a") for i in range(300)]
    arrivals.insert(10, (3.9, "c"))
    run = run_swaps(ReplicaRule(wait_bound_sec=bound), arrivals, key=None, service=service)
    assert run.served == len(arrivals)
    c_wait = run.waits[10]
    assert bound <= c_wait <= bound + 3 * service, c_wait
    assert run.swaps == 2  # a -> c -> a


def test_max_loaded_models_groups_without_memory_gb() -> None:
    """A host Pharos is told holds one model (``max_loaded_models: 1``, as for
    ``OLLAMA_MAX_LOADED_MODELS=1`` or llama.cpp router mode) and no memory: its swaps are
    grouped as with memory for one model; told neither, Pharos sends every model at once."""
    arrivals = pattern(12)
    told = run_swaps(GROUPED, arrivals, memory_gb=None, max_loaded_models=1)
    fifo = run_swaps(FIFO, arrivals, memory_gb=None, max_loaded_models=1)
    assert told.served == fifo.served == len(arrivals)
    assert told.swaps * 3 <= fifo.swaps, (told.swaps, fifo.swaps)
    blind = run_swaps(GROUPED, arrivals, memory_gb=None)
    assert blind.swaps > 3 * told.swaps  # nothing said: models dispatched side by side
