"""Layer 1: the probe constructors and the signal merge rule, on hand-written inputs."""

from __future__ import annotations

import dataclasses

import pytest

from pharos.engine import library as lib
from pharos.engine.probes import ProbeError, log_line, prom
from pharos.engine.signals import WHOLE_BACKEND, Load, Residency, Signal, Snapshot, merge

VLLM_PAGE = b"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
"""


def running(page: bytes, **kw: object) -> Snapshot:
    probe = prom("t", "/metrics", Signal.RUNNING, "vllm:num_requests_running", **kw)  # type: ignore[arg-type]
    return probe.parse(page)


def test_prom_reads_per_model_label() -> None:
    """A per-model probe keys its value by the label's value."""
    snap = running(VLLM_PAGE, per_model="model_name")
    assert snap.load == {"tiny": Load(running=3)}


def test_prom_without_per_model_is_whole_backend() -> None:
    """Without a per-model label the value belongs to the whole backend."""
    page = b"llamacpp:requests_processing 2\n"
    probe = prom("t", "/metrics", Signal.RUNNING, "llamacpp:requests_processing")
    assert probe.parse(page).load == {WHOLE_BACKEND: Load(running=2)}


def test_prom_missing_metric_is_unknown_not_zero() -> None:
    """A metric that is not on the page yields no value at all."""
    snap = prom("t", "/metrics", Signal.WAITING, "vllm:num_requests_waiting").parse(VLLM_PAGE)
    assert not snap.known(Signal.WAITING)
    assert snap.load == {}


def test_prom_nan_is_unknown() -> None:
    """NaN is unknown, not a number."""
    snap = running(b'vllm:num_requests_running{model_name="a"} NaN\n', per_model="model_name")
    assert not snap.known(Signal.RUNNING)


@pytest.mark.parametrize("value", [b"1.5", b"-1", b"+Inf"])
def test_prom_count_must_be_a_count(value: bytes) -> None:
    """A fractional, negative or infinite count is an error, not a rounded guess."""
    with pytest.raises(ProbeError):
        running(b'vllm:num_requests_running{model_name="a"} ' + value + b"\n",
                per_model="model_name")


def test_prom_two_series_for_one_model_is_an_error() -> None:
    """Two series that fold to one model cannot be told apart: an error."""
    page = (b'vllm:num_requests_running{model_name="a",x="1"} 1\n'
            b'vllm:num_requests_running{model_name="a",x="2"} 2\n')
    with pytest.raises(ProbeError):
        running(page, per_model="model_name")


def test_prom_series_without_the_model_label_is_an_error() -> None:
    """A per-model probe that meets a series without its label does not invent a model."""
    with pytest.raises(ProbeError):
        running(b"vllm:num_requests_running 1\n", per_model="model_name")


def test_prom_kv_ratio_and_percent() -> None:
    """KV usage is 0..1; a percent gauge is scaled, and out-of-range values are errors."""
    ratio = prom("k", "/metrics", Signal.KV_USAGE, "kv", per_model="m")
    pct = prom("k", "/metrics", Signal.KV_USAGE, "kv", per_model="m", scale="percent")
    assert ratio.parse(b'kv{m="a"} 0.5\n').load["a"].kv_usage == 0.5
    assert pct.parse(b'kv{m="a"} 50\n').load["a"].kv_usage == 0.5
    with pytest.raises(ProbeError):
        ratio.parse(b'kv{m="a"} 50\n')
    with pytest.raises(ProbeError):
        pct.parse(b'kv{m="a"} 150\n')


def test_prom_malformed_page_is_an_error() -> None:
    """A page that is not Prometheus text is an error for the probe, never a value."""
    with pytest.raises(ProbeError):
        running(b'vllm:num_requests_running{model_name="a" 1\n', per_model="model_name")


def test_prom_sum_and_replica_labels() -> None:
    """Data-parallel ranks add up; tensor-parallel replicas are one state, rank 0 speaks."""
    page = b"".join(
        f'sglang:num_running_reqs{{dp_rank="{dp}",model_name="m",tp_rank="{tp}"}} {v}\n'.encode()
        for dp, tp, v in [(0, 0, 2), (0, 1, 2), (1, 0, 3), (1, 1, 3)]
    )
    snap = lib.sglang_running.parse(page)
    assert snap.load == {"m": Load(running=5)}


def test_prom_constructor_rejects_non_load_signals() -> None:
    """Prometheus probes read load signals only."""
    with pytest.raises(ValueError):
        prom("p", "/metrics", Signal.VERSION, "x")


def test_log_line_group_value_and_model() -> None:
    """A log probe reads its named group, keyed by the model group."""
    probe = log_line("l", Signal.RUNNING, r"model (?P<model>\S+) running (?P<value>\d+)")
    assert probe.parse(b"model a running 3").load == {"a": Load(running=3)}
    assert probe.parse(b"something else") == Snapshot()


def test_log_line_fixed_value() -> None:
    """A fixed value is reported by every matching line."""
    probe = log_line("l", Signal.RESIDENCY, r"model (?P<model>\S+) loaded", "loaded")
    assert probe.parse(b"model a loaded").residency == {"a": Residency.LOADED}


def test_log_line_unusable_value_is_a_parse_error() -> None:
    """A matching line whose value cannot be the signal is an error, not a guess."""
    probe = log_line("l", Signal.CAPACITY, r"parallel=(?P<value>\S+)")
    with pytest.raises(ProbeError):
        probe.parse(b"parallel=auto")


@pytest.mark.parametrize(
    ("signal", "pattern", "value"),
    [
        (Signal.MODELS, r"x", "a"),                        # not a log signal
        (Signal.RUNNING, r"(?P<value>\d+)", "3"),          # both group and fixed value
        (Signal.RUNNING, r"x", None),                      # neither
        (Signal.RESIDENCY, r"loaded", "loaded"),           # residency names no model
        (Signal.RESIDENCY, r"(?P<model>\S+)", "warm"),     # not a residency
    ],
)
def test_log_line_constructor_rejects(signal: Signal, pattern: str, value: str | None) -> None:
    """Constructor errors are config errors, found before any line is read."""
    with pytest.raises(ValueError):
        log_line("l", signal, pattern, value)


def test_ollama_log_num_parallel_reads_capacity() -> None:
    """Ollama's startup line gives the capacity; 0 (older 'auto') gives none."""
    line = (b'time=2026-08-22T10:00:00.101-07:00 level=INFO source=routes.go:1951 '
            b'msg="server config" env="map[CUDA_VISIBLE_DEVICES: OLLAMA_NUM_PARALLEL:4 '
            b'OLLAMA_ORIGINS:[http://localhost https://localhost] no_proxy:]"')
    assert lib.ollama_log_num_parallel.parse(line).load == {"": Load(capacity=4)}
    assert not lib.ollama_log_num_parallel.parse(
        line.replace(b"PARALLEL:4", b"PARALLEL:0")).known(Signal.CAPACITY)


def test_ollama_version_rejects_non_numeric() -> None:
    """llama-swap's 'v260' on /api/version is not an Ollama version."""
    assert lib.ollama_version.parse(b'{"version":"0.32.15"}').version == "0.32.15"
    assert lib.ollama_version.parse(b'{"version":"v260"}').version is None


def test_ollama_tags_size_zero_is_unknown() -> None:
    """SGLang's /api/tags has size 0: zero sizes are unknown, and all-unknown is no value."""
    body = b'{"models":[{"name":"a","size":0},{"name":"b","size":0}]}'
    assert lib.ollama_tags_size.parse(body).size_bytes is None
    body = b'{"models":[{"name":"a","size":10},{"name":"b","size":0}]}'
    assert lib.ollama_tags_size.parse(body).size_bytes == {"a": 10}


def test_ollama_ps_empty_means_every_model_cold() -> None:
    """An empty /api/ps is a known value: nothing is in memory."""
    snap = lib.ollama_ps_residency.parse(b'{"models":[]}')
    assert snap.known(Signal.RESIDENCY)
    assert snap.model_info("anything").state is Residency.COLD


def test_json_probe_wrong_type_is_an_error() -> None:
    """A field of the wrong type is a parse error, not an unknown."""
    with pytest.raises(ProbeError):
        lib.llamacpp_props_capacity.parse(b'{"total_slots":"4"}')
    with pytest.raises(ProbeError):
        lib.ollama_ps_vram.parse(b'{"models":[{"name":"a","size_vram":true}]}')


def test_openai_models_null_data_is_empty_list() -> None:
    """Ollama's /v1/models says data: null with no models: a known empty list."""
    snap = lib.openai_models.parse(b'{"object":"list","data":null}')
    assert snap.models == ()
    assert snap.known(Signal.MODELS)


def test_llamaswap_running_states() -> None:
    """ready is loaded, starting is loading, any other state stays unknown."""
    body = (b'{"running":[{"model":"a","state":"ready"},{"model":"b","state":"starting"},'
            b'{"model":"c","state":"stopping"}]}')
    snap = lib.llamaswap_running.parse(body)
    assert snap.residency == {"a": Residency.LOADED, "b": Residency.LOADING,
                              "c": Residency.UNKNOWN}


def test_sglang_capacity_sums_per_rank_effective_caps() -> None:
    """The effective per-DP cap of every rank adds up; the configured null is ignored."""
    body = (b'{"version":"0.5.23","max_running_requests":null,"internal_states":['
            b'{"effective_max_running_requests_per_dp":16},'
            b'{"effective_max_running_requests_per_dp":16}]}')
    assert lib.sglang_capacity.parse(body).load == {"": Load(capacity=32)}


def test_merge_first_known_value_wins_per_signal() -> None:
    """In priority order, the first probe with a known value fills each signal."""
    a = Snapshot(load={"m": Load(running=1)})
    b = Snapshot(load={"m": Load(running=2, waiting=5)})
    c = Snapshot(load={"m": Load(waiting=7)})
    merged = merge([("a", Signal.RUNNING, a), ("b", Signal.RUNNING, b),
                    ("c", Signal.WAITING, c)])
    assert merged.load == {"m": Load(running=1, waiting=7)}
    assert merged.sources == {Signal.RUNNING: "a", Signal.WAITING: "c"}


def test_merge_reads_only_each_probes_own_signal() -> None:
    """A probe's result is read for its signal only, whatever else it holds."""
    b = Snapshot(version="1", load={"m": Load(running=2)})
    merged = merge([("b", Signal.RUNNING, b)])
    assert merged.version is None
    assert merged.load == {"m": Load(running=2)}


def test_average_folds_data_parallel_ratios_into_their_mean() -> None:
    """A usage ratio reported per data-parallel rank (one equal pool each) is their mean, not
    their sum; tensor-parallel replicas still read rank 0; a NaN rank makes it unknown."""
    probe = prom("p", "/metrics", Signal.KV_USAGE, "sglang:token_usage", per_model="model_name",
                 sum_labels=("dp_rank",), replica_labels=("tp_rank",), average=True)
    body = b"".join(
        b'sglang:token_usage{dp_rank="%d",model_name="m",tp_rank="%d"} %s\n' % (dp, tp, v)
        for dp, tp, v in [(0, 0, b"0.9"), (0, 1, b"0.9"), (1, 0, b"0.5"), (1, 1, b"0.1")])
    snap = probe.parse(body)
    assert snap.load_for("m").kv_usage == pytest.approx(0.7)
    nan = body.replace(b"} 0.5", b"} NaN")
    assert probe.parse(nan).load_for("m").kv_usage is None


def test_load_for_merges_the_models_entry_over_the_whole_backends_per_signal() -> None:
    """A model's load takes each signal from its own entry when known, else from the whole
    backend's (vLLM: Running per model, the KV pool from cache_config_info); the answer is
    kept, and a snapshot made from another by ``replace`` answers for itself."""
    own = Load(running=3, kv_usage=0.5)
    whole = Load(running=9, waiting=1, kv_pool_tokens=4096)
    snap = Snapshot(load={"m": own, WHOLE_BACKEND: whole})
    assert snap.load_for("m") == Load(running=3, waiting=1, kv_usage=0.5, kv_pool_tokens=4096)
    assert snap.load_for("m") is snap.load_for("m")
    assert snap.load_for("other") == whole
    assert Snapshot(load={"m": own}).load_for("m") == own
    assert Snapshot().load_for("m") == Load()
    other = dataclasses.replace(snap, load={"m": Load(running=1)})
    assert other.load_for("m") == Load(running=1)
    assert snap.load_for("m").running == 3
