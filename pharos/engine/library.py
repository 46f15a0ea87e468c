"""The probe library and the recipe of every engine kind. Each probe was seen in a capture
under fixtures/ (live, or from the engine's source named in its meta.yaml), and the replay
tests in tests/replay/ hold it there."""

from __future__ import annotations

import re
from typing import Any

from pharos.engine.probes import (
    Probe,
    ProbeError,
    count_value,
    field,
    json_body,
    load_snapshot,
    log_line,
    prom,
    prom_series,
)
from pharos.engine.signals import WHOLE_BACKEND, Residency, Signal, Snapshot

# --- kinds ---------------------------------------------------------------------------------

OLLAMA = "ollama"
LLAMACPP = "llamacpp"
LLAMASWAP = "llama-swap"
VLLM = "vllm"
SGLANG = "sglang"
OPENAI = "openai"
AUTO = "auto"

#: Every recipe kind in detection order; ``openai`` is the generic fallback (mlx-lm, LM Studio).
KINDS: tuple[str, ...] = (LLAMASWAP, OLLAMA, LLAMACPP, VLLM, SGLANG, OPENAI)


# --- generic ---------------------------------------------------------------------------------


def _openai_models(body: bytes) -> Snapshot:
    doc = json_body(body)
    if not isinstance(doc, dict) or "data" not in doc:
        raise ProbeError("/v1/models: no 'data' list")
    data = doc["data"]
    if data is None:  # Ollama answers data: null when it has no models
        return Snapshot(models=())
    if not isinstance(data, list):
        raise ProbeError("/v1/models: 'data' is not a list")
    names: list[str] = []
    for i, entry in enumerate(data):
        ident = field(entry, "id", str, f"data[{i}]")
        if ident is None:
            raise ProbeError(f"/v1/models: data[{i}] has no id")
        names.append(ident)
    return Snapshot(models=tuple(names))


openai_models = Probe("openai-models", Signal.MODELS, _openai_models, path="/v1/models")


# --- Ollama ----------------------------------------------------------------------------------


_OLLAMA_VERSION = re.compile(r"^\d+\.\d+")
_LLAMASWAP_VERSION = re.compile(r"^v?\d+$")


def _ollama_version(body: bytes) -> Snapshot:
    version = field(json_body(body), "version", str, "/api/version")
    # llama-swap answers /api/version too: "v250", or a bare "200" before v233. Ollama's
    # versions are dotted (a dev build says "0.0.0").
    if version is None or not _OLLAMA_VERSION.match(version):
        return Snapshot()
    return Snapshot(version=version)


def _ollama_entries(body: bytes, where: str) -> list[dict[str, Any]]:
    models = field(json_body(body), "models", list, where)
    if models is None:
        raise ProbeError(f"{where}: no 'models' list")
    for i, m in enumerate(models):
        if field(m, "name", str, f"{where} models[{i}]") is None:
            raise ProbeError(f"{where}: models[{i}] has no name")
    return models


def _ollama_ps_residency(body: bytes) -> Snapshot:
    # From v0.30 a model appears in /api/ps only once its runner is healthy: listed = loaded.
    entries = _ollama_entries(body, "/api/ps")
    return Snapshot(residency={m["name"]: Residency.LOADED for m in entries})


def _ollama_ps_vram(body: bytes) -> Snapshot:
    out: dict[str, int] = {}
    for i, m in enumerate(_ollama_entries(body, "/api/ps")):
        vram = field(m, "size_vram", int, f"/api/ps models[{i}]")
        if vram is not None:
            out[m["name"]] = count_value(vram, f"/api/ps models[{i}].size_vram")
    return Snapshot(vram_bytes=out)


def _ollama_tags_size(body: bytes) -> Snapshot:
    out: dict[str, int] = {}
    for i, m in enumerate(_ollama_entries(body, "/api/tags")):
        size = field(m, "size", int, f"/api/tags models[{i}]")
        # SGLang serves /api/tags with size 0: zero is unknown, not an empty model.
        if size:
            out[m["name"]] = count_value(size, f"/api/tags models[{i}].size")
    return Snapshot(size_bytes=out or None)


def ollama_remote_models(body: bytes) -> list[str]:
    """Names of /api/tags entries that are cloud stubs (``remote_host``): prompts leave."""
    try:
        entries = _ollama_entries(body, "/api/tags")
    except ProbeError:
        return []
    return [m["name"] for m in entries if m.get("remote_host")]


ollama_version = Probe("ollama-version", Signal.VERSION, _ollama_version, path="/api/version")
ollama_ps_residency = Probe(
    "ollama-ps-residency", Signal.RESIDENCY, _ollama_ps_residency, path="/api/ps"
)
ollama_ps_vram = Probe("ollama-ps-vram", Signal.VRAM_BYTES, _ollama_ps_vram, path="/api/ps")
ollama_tags_size = Probe("ollama-tags-size", Signal.SIZE_BYTES, _ollama_tags_size, path="/api/tags")
#: The startup "server config" line; 0 (older builds: "auto") is no capacity, so no match.
ollama_log_num_parallel = log_line(
    "ollama-log-num-parallel",
    Signal.CAPACITY,
    r'msg="server config" env="map\[.*?\bOLLAMA_NUM_PARALLEL:(?P<value>[1-9][0-9]*)\b',
)


# --- llama.cpp -------------------------------------------------------------------------------

_BUILD = re.compile(r"^b(\d+)(?:-[0-9a-f]+)?$")


def llamacpp_build(version: str) -> int | None:
    """The build number of a llama.cpp version string (``b11312``), if it is one."""
    m = _BUILD.match(version)
    return int(m.group(1)) if m else None


def _llamacpp_props_version(body: bytes) -> Snapshot:
    info = field(json_body(body), "build_info", str, "/props")
    if info is None:
        return Snapshot()
    m = re.match(r"^(b\d+)", info)
    return Snapshot(version=m.group(1) if m else info)


def _llamacpp_props_capacity(body: bytes) -> Snapshot:
    slots = field(json_body(body), "total_slots", int, "/props")
    if slots is None:
        return Snapshot()
    n = count_value(slots, "/props total_slots")
    if n == 0:
        raise ProbeError("/props total_slots: 0 slots")
    return load_snapshot(Signal.CAPACITY, {WHOLE_BACKEND: n})


def _llamacpp_slots_running(body: bytes) -> Snapshot:
    slots = json_body(body)
    if not isinstance(slots, list):
        raise ProbeError("/slots: expected a list")
    busy = 0
    for i, slot in enumerate(slots):
        flag = field(slot, "is_processing", bool, f"/slots[{i}]")
        if flag is None:
            raise ProbeError(f"/slots[{i}]: no is_processing")
        busy += flag
    return load_snapshot(Signal.RUNNING, {WHOLE_BACKEND: busy})


def _deferred_counts_queue(version: str) -> bool:
    build = llamacpp_build(version)
    return build is not None and build >= 8772


llamacpp_props_version = Probe(
    "llamacpp-props-version", Signal.VERSION, _llamacpp_props_version, path="/props"
)
llamacpp_props_capacity = Probe(
    "llamacpp-props-capacity", Signal.CAPACITY, _llamacpp_props_capacity, path="/props"
)
llamacpp_running = prom(
    "llamacpp-running", "/metrics", Signal.RUNNING, "llamacpp:requests_processing"
)
#: Before b8772 requests_deferred read 0 with a queue: unknown there, never wrong.
llamacpp_waiting = prom(
    "llamacpp-waiting",
    "/metrics",
    Signal.WAITING,
    "llamacpp:requests_deferred",
    when=_deferred_counts_queue,
    guard=">= b8772",
)
llamacpp_slots_running = Probe(
    "llamacpp-slots-running", Signal.RUNNING, _llamacpp_slots_running, path="/slots"
)


# --- llama-swap ------------------------------------------------------------------------------

_SWAP_STATES = {"ready": Residency.LOADED, "starting": Residency.LOADING}


def _llamaswap_version(body: bytes) -> Snapshot:
    version = field(json_body(body), "version", str, "/api/version")
    # Its tags are v<N> (a bare <N> before v233, "0" for a dev build); never dotted like Ollama's.
    if version is None or not _LLAMASWAP_VERSION.match(version):
        return Snapshot()
    return Snapshot(version=version)


def _llamaswap_running(body: bytes) -> Snapshot:
    running = field(json_body(body), "running", list, "/running")
    if running is None:
        return Snapshot()
    out: dict[str, Residency] = {}
    for i, proc in enumerate(running):
        model = field(proc, "model", str, f"/running[{i}]")
        state = field(proc, "state", str, f"/running[{i}]")
        if model is None or state is None:
            raise ProbeError(f"/running[{i}]: needs model and state")
        # "stopping" (and any state no capture has shown) is neither loaded nor cold.
        out[model] = _SWAP_STATES.get(state, Residency.UNKNOWN)
    return Snapshot(residency=out)


llamaswap_version = Probe(
    "llamaswap-version", Signal.VERSION, _llamaswap_version, path="/api/version"
)
llamaswap_running = Probe(
    "llamaswap-running", Signal.RESIDENCY, _llamaswap_running, path="/running"
)


# --- vLLM ------------------------------------------------------------------------------------


def _vllm_version(body: bytes) -> Snapshot:
    return Snapshot(version=field(json_body(body), "version", str, "/version") or None)


vllm_version = Probe("vllm-version", Signal.VERSION, _vllm_version, path="/version")
# Data-parallel vLLM runs one engine per rank, each with its own requests: ranks add up.
vllm_running = prom(
    "vllm-running", "/metrics", Signal.RUNNING, "vllm:num_requests_running",
    per_model="model_name", sum_labels=("engine",),
)
vllm_waiting = prom(
    "vllm-waiting", "/metrics", Signal.WAITING, "vllm:num_requests_waiting",
    per_model="model_name", sum_labels=("engine",),
)
vllm_kv_usage = prom(
    "vllm-kv-cache-usage-perc", "/metrics", Signal.KV_USAGE, "vllm:kv_cache_usage_perc",
    per_model="model_name",
)


def _vllm_kv_pool(body: bytes) -> Snapshot:
    """The KV pool in tokens: ``vllm:cache_config_info``'s labels ``num_gpu_blocks`` x
    ``block_size`` (an info gauge, value 1; fixtures/vllm/0.32.0/*/metrics). Data-parallel
    ranks (``engine``) each have their own pool: they add up, as their requests do."""
    total = 0
    infos = prom_series(body, "vllm:cache_config_info")
    for labels, _ in infos:
        blocks, size = labels.get("num_gpu_blocks"), labels.get("block_size")
        if blocks is None or size is None or not blocks.isdigit() or not size.isdigit():
            raise ProbeError("vllm:cache_config_info: num_gpu_blocks and block_size must be "
                             f"counts, not {blocks!r} and {size!r}")
        total += int(blocks) * int(size)
    if not infos or total <= 0:
        return Snapshot()  # not exported (or no pool yet): unknown
    return load_snapshot(Signal.KV_POOL_TOKENS, {WHOLE_BACKEND: total})


vllm_kv_pool = Probe("vllm-kv-pool", Signal.KV_POOL_TOKENS, _vllm_kv_pool, path="/metrics")


# --- SGLang ----------------------------------------------------------------------------------


def _sglang_info(body: bytes) -> dict[str, Any]:
    doc = json_body(body)
    if not isinstance(doc, dict):
        raise ProbeError("/get_server_info: expected an object")
    return doc


def _sglang_version(body: bytes) -> Snapshot:
    return Snapshot(version=field(_sglang_info(body), "version", str, "/get_server_info"))


def _sglang_capacity(body: bytes) -> Snapshot:
    info = _sglang_info(body)
    states = field(info, "internal_states", list, "/get_server_info")
    # The top-level max_running_requests is the configured value, often null; each DP rank
    # reports the cap the scheduler really applies, and the ranks serve requests side by side.
    if states:
        caps = [
            field(s, "effective_max_running_requests_per_dp", int, f"internal_states[{i}]")
            for i, s in enumerate(states)
        ]
        if all(c is not None for c in caps):
            total = sum(count_value(c, "effective_max_running_requests_per_dp") for c in caps)
            if total > 0:
                return load_snapshot(Signal.CAPACITY, {WHOLE_BACKEND: total})
    cap = field(info, "max_running_requests", int, "/get_server_info")
    if cap is None:
        return Snapshot()
    return load_snapshot(Signal.CAPACITY, {WHOLE_BACKEND: count_value(cap, "max_running_requests")})


sglang_version = Probe(
    "sglang-version", Signal.VERSION, _sglang_version, path="/get_server_info"
)
sglang_capacity = Probe(
    "sglang-capacity", Signal.CAPACITY, _sglang_capacity, path="/get_server_info"
)
_SGLANG_RANKS: dict[str, Any] = {
    "per_model": "model_name",
    "sum_labels": ("dp_rank",),
    "replica_labels": ("tp_rank", "pp_rank", "moe_ep_rank"),
}
sglang_running = prom(
    "sglang-running", "/metrics", Signal.RUNNING, "sglang:num_running_reqs", **_SGLANG_RANKS
)
sglang_waiting = prom(
    "sglang-waiting", "/metrics", Signal.WAITING, "sglang:num_queue_reqs", **_SGLANG_RANKS
)
#: The KV pool's use, 0..1: (total - available - evictable) / total, the largest of the
#: full/SWA/Mamba pools, rounded to 2 places (so a cached but evictable prefix does not count,
#: as with vLLM's). One pool per data-parallel rank, equal in size: averaged over DP ranks
#: (sglang 0.5.23 pool_stats_observer.py, metrics_collector.py; fixtures' meta.yaml).
sglang_kv_usage = prom(
    "sglang-kv-usage", "/metrics", Signal.KV_USAGE, "sglang:token_usage", average=True,
    **_SGLANG_RANKS
)


# --- recipes ---------------------------------------------------------------------------------

#: The probes trusted per kind; order is priority when two read the same signal.
RECIPES: dict[str, tuple[Probe, ...]] = {
    VLLM: (vllm_version, openai_models, vllm_running, vllm_waiting, vllm_kv_usage, vllm_kv_pool),
    LLAMACPP: (
        llamacpp_props_version,
        openai_models,
        llamacpp_props_capacity,
        llamacpp_running,
        llamacpp_waiting,
        llamacpp_slots_running,
    ),
    OLLAMA: (
        ollama_version,
        openai_models,
        ollama_ps_residency,
        ollama_ps_vram,
        ollama_tags_size,
        ollama_log_num_parallel,
    ),
    LLAMASWAP: (llamaswap_version, openai_models, llamaswap_running),
    SGLANG: (sglang_version, openai_models, sglang_capacity, sglang_running, sglang_waiting,
             sglang_kv_usage),
    OPENAI: (openai_models,),
}

#: Every library probe by name (own probes may not reuse these names).
LIBRARY: dict[str, Probe] = {p.name: p for recipe in RECIPES.values() for p in recipe}
LIBRARY_PROBE_NAMES: frozenset[str] = frozenset(LIBRARY)

#: Detection fingerprints in order: the first kind whose probes all read a value wins.
FINGERPRINTS: tuple[tuple[str, tuple[Probe, ...]], ...] = (
    (LLAMASWAP, (llamaswap_running,)),
    (OLLAMA, (ollama_version,)),
    (LLAMACPP, (llamacpp_props_version,)),
    (VLLM, (vllm_version, vllm_running)),
    (SGLANG, (sglang_version,)),
)
