"""Layer 1 property tests: the Prometheus probe against a naive reading of the same page, and
the merge rule against its definition."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pharos.engine.probes import prom
from pharos.engine.signals import LOAD_ORDER, Load, Signal, Snapshot, merge

models = st.text(alphabet="abcdefghij:._-0123456789", min_size=1, max_size=12)
pages = st.dictionaries(models, st.integers(min_value=0, max_value=10_000), max_size=8)


@given(pages, st.sampled_from(["%d", "%d.0", "%.1f", "%e"]), st.booleans())
def test_prom_reads_each_models_count(counts: dict[str, int], fmt: str, extra: bool) -> None:
    """Whatever the number format, label order or unrelated metrics around it, a per-model
    probe reads exactly each model's count and nothing for models that are not on the page."""
    lines = ["# TYPE engine:running gauge"]
    for model, n in counts.items():
        value = fmt % n
        lines.append(f'engine:running{{zone="a",model="{model}"}} {value}')
        if extra:
            lines.append(f'engine:running_other{{model="{model}"}} 7.5')
    page = ("\n".join(lines) + "\n").encode()
    probe = prom("p", "/metrics", Signal.RUNNING, "engine:running", per_model="model")
    snap = probe.parse(page)
    assert {m: load.running for m, load in snap.load.items()} == counts
    assert snap.known(Signal.RUNNING) == bool(counts)


loads = st.builds(
    Load,
    running=st.none() | st.integers(0, 50),
    waiting=st.none() | st.integers(0, 50),
    capacity=st.none() | st.integers(1, 50),
    kv_usage=st.none() | st.floats(0, 1),
)
snapshots = st.builds(Snapshot, load=st.dictionaries(st.sampled_from(["", "a", "b"]), loads,
                                                     max_size=3))


@given(st.lists(st.tuples(st.sampled_from(LOAD_ORDER), snapshots), max_size=6))
def test_merge_takes_first_known_probe_per_signal(parts: list[tuple[Signal, Snapshot]]) -> None:
    """For each signal the merged value is exactly the first part knowing it, and unknown
    (never 0) when no part knows it."""
    named = [(f"p{i}", sig, snap) for i, (sig, snap) in enumerate(parts)]
    merged = merge(named)
    for signal in LOAD_ORDER:
        owners = [(n, snap) for n, sig, snap in named if sig is signal and snap.known(signal)]
        if not owners:
            assert not merged.known(signal)
            assert signal not in merged.sources
            continue
        name, snap = owners[0]
        assert merged.sources[signal] == name
        assert merged.value(signal) == snap.value(signal)
