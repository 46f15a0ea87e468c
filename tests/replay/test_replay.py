"""Layer 2: every library probe, ``resolve``, ``Plan.follow`` and detection, replayed on every
capture in fixtures/.

Expected values live here, keyed ``engine/`` (every version), ``engine//state``,
``engine/version`` or ``engine/version/state``; the most specific key wins. A probe with no
expectation on a capture must read nothing there, which catches one engine's probe matching
another engine's body.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from pharos.engine.capture import RECORD_PATHS, Capture
from pharos.engine.doctor import examine, render_json
from pharos.engine.fetch import CaptureFetcher, Fetched
from pharos.engine.library import LIBRARY
from pharos.engine.plan import DetectionFailed, detect_kind, resolve, run_probe
from pharos.engine.probes import Probe
from pharos.engine.signals import Residency, Signal
from tests.support.captures import KIND_OF_ENGINE, MISSING, all_captures, capture_id, lookup
from tests.support.plan import run

L, C, G = "loaded", "cold", "loading"
OLLAMA_SIZES = {"qwen3:8b": 5225388164, "llama3.2:3b": 2019393189,
                "nomic-embed-text:latest": 274302450}
OLLAMA_MODELS = ["qwen3:8b", "llama3.2:3b", "nomic-embed-text:latest"]
SWAP_MODELS = ["gemma-3-12b", "qwen2.5-coder-7b", "qwen3-8b"]

#: What each library probe reads, per capture (probe name → the value of its signal).
EXPECTED: dict[str, dict[str, object]] = {
    "ollama/": {
        "openai-models": OLLAMA_MODELS,
        "ollama-tags-size": OLLAMA_SIZES,
        "ollama-ps-residency": {},
        "ollama-ps-vram": {},
    },
    "ollama//loaded": {
        "ollama-ps-residency": {"llama3.2:3b": L, "qwen3:8b": L},
        # qwen3:8b is 6542057472 bytes in memory, partly on the CPU: VRAM is the GPU part.
        "ollama-ps-vram": {"llama3.2:3b": 3318030336, "qwen3:8b": 4439670784},
    },
    "ollama/0.32.15": {"ollama-version": "0.32.15"},
    "ollama/0.32.15/idle": {"ollama-log-num-parallel": {"": 1}},
    # two restarts: OLLAMA_NUM_PARALLEL 2, then 4; the last server config line wins
    "ollama/0.32.15/loaded": {"ollama-log-num-parallel": {"": 4}},
    "ollama/0.32.15/cloud": {
        "openai-models": ["gpt-oss:120b-cloud", "qwen3:8b", "llama3.2:3b"],
        "ollama-tags-size": {"gpt-oss:120b-cloud": 384, "qwen3:8b": 5225388164,
                             "llama3.2:3b": 2019393189},
    },
    "ollama/0.33.3": {"ollama-version": "0.33.3"},
    "llama-swap/": {"openai-models": SWAP_MODELS, "llamaswap-running": {"qwen3-8b": L}},
    "llama-swap/v250": {"llamaswap-version": "v250"},
    "llama-swap/v250/idle": {"llamaswap-running": {}},
    "llama-swap/v250/loaded": {"llamaswap-running": {"gemma-3-12b": G, "qwen3-8b": L}},
    "llama-swap/200": {"llamaswap-version": "200"},
    "llama-swap/180": {"llamaswap-version": "180"},
    "sglang/": {"sglang-version": "0.5.23"},
    "sglang//idle": {
        "openai-models": ["Qwen/Qwen2.5-7B-Instruct"],
        "sglang-capacity": {"": 4096},
        "sglang-running": {"Qwen/Qwen2.5-7B-Instruct": 0},
        "sglang-waiting": {"Qwen/Qwen2.5-7B-Instruct": 0},
        "sglang-kv-usage": {"Qwen/Qwen2.5-7B-Instruct": 0.0},
    },
    # 2 DP ranks x 2 TP ranks: tp_rank 0 speaks for its replica, DP ranks add up.
    "sglang//busy": {
        "openai-models": ["meta-llama/Llama-3.1-8B-Instruct"],
        "sglang-capacity": {"": 7408},
        "sglang-running": {"meta-llama/Llama-3.1-8B-Instruct": 47},
        "sglang-waiting": {"meta-llama/Llama-3.1-8B-Instruct": 10},
        # the KV pool's use: one pool per DP rank (0.31 and 0.29), averaged
        "sglang-kv-usage": {"meta-llama/Llama-3.1-8B-Instruct": pytest.approx(0.30)},
    },
    "llamacpp/": {
        "openai-models": ["tiny"],
        "llamacpp-props-capacity": {"": 2},
        "llamacpp-running": {"": 0},
        "llamacpp-waiting": {"": 0},
        "llamacpp-slots-running": {"": 0},
    },
    "llamacpp/b11312": {"llamacpp-props-version": "b11312"},
    # three slow streams on two slots: two processing, one deferred
    "llamacpp//busy": {
        "llamacpp-running": {"": 2},
        "llamacpp-waiting": {"": 1},
        "llamacpp-slots-running": {"": 2},
    },
    # started without --metrics: /metrics is 501, one stream in flight seen by /slots
    "llamacpp//nometrics": {
        "llamacpp-running": None,
        "llamacpp-waiting": None,
        "llamacpp-slots-running": {"": 1},
    },
    "vllm/": {
        "openai-models": ["tiny"],
        "vllm-running": {"tiny": 0},
        "vllm-waiting": {"tiny": 0},
        "vllm-kv-cache-usage-perc": {"tiny": 0.0},
        # vllm:cache_config_info's num_gpu_blocks x block_size (8192 x 32, as started)
        "vllm-kv-pool": {"": 262144},
    },
    "vllm/0.32.0": {"vllm-version": "0.32.0"},
    # twelve slow streams at --max-num-seqs 8: eight run, four wait, their KV in use
    "vllm//busy": {
        "vllm-running": {"tiny": 8},
        "vllm-waiting": {"tiny": 4},
        "vllm-kv-cache-usage-perc": {"tiny": 0.013185203271883772},
    },
    "mlx-lm/": {
        "openai-models": ["mlx-community/Mistral-7B-Instruct-v0.3-4bit",
                          "mlx-community/Llama-3.2-3B-Instruct-4bit"],
    },
}

#: The kind detection picks on each capture (or the exception it raises).
DETECTED: dict[str, dict[str, object]] = {
    "ollama/": {"kind": "ollama"},
    "llama-swap/": {"kind": "llama-swap"},
    "sglang/": {"kind": "sglang"},
    "mlx-lm/": {"kind": "openai"},
    "llamacpp/": {"kind": "llamacpp"},
    "vllm/": {"kind": "vllm"},
}


def plain(v: object) -> object:
    """A signal value as the expectation tables write it."""
    if isinstance(v, Mapping):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, Residency):
        return v.value
    if isinstance(v, tuple):
        return list(v)
    return v


def read(probe: Probe, capture: Capture) -> object:
    """What one probe reads from a capture: its value, or None when it reads nothing."""
    if probe.is_log:
        if capture.log_lines is None:
            return None
        values = [s.value(probe.signal) for s in (probe.parse(ln.encode())
                  for ln in capture.log_lines) if s.known(probe.signal)]
        return plain(values[-1]) if values else None
    assert probe.path is not None
    rec = capture.paths[probe.path]
    snap, _ = run_probe(probe, Fetched(rec.status, rec.content_type, rec.body))
    return None if snap is None else plain(snap.value(probe.signal))


def feeds(probe: Probe, capture: Capture) -> bool:
    """Whether the capture holds the probe's feed."""
    return capture.log_lines is not None if probe.is_log else probe.path in capture.paths


CASES = [(c, p) for c in all_captures() for p in LIBRARY.values() if feeds(p, c)]


def test_fixtures_exist_for_every_engine() -> None:
    """The suite replays real captures of every engine with a recipe."""
    engines = {capture_id(c).split("/")[0] for c in all_captures()}
    assert engines >= {"ollama", "llama-swap", "sglang", "mlx-lm", "llamacpp", "vllm"}


@pytest.mark.parametrize(("capture", "probe"), CASES,
                         ids=[f"{capture_id(c)}:{p.name}" for c, p in CASES])
def test_probe_replays(capture: Capture, probe: Probe) -> None:
    """Each library probe reads exactly the expected value, or nothing where none is expected."""
    expected = lookup(EXPECTED, capture, probe.name)
    got = read(probe, capture)
    if expected is MISSING or expected is None:
        assert got is None, f"{probe.name} reads {got!r} on {capture_id(capture)}"
    else:
        assert got == expected


@pytest.mark.parametrize("capture", all_captures(), ids=capture_id)
def test_capture_is_complete(capture: Capture) -> None:
    """Every capture records every RECORD_PATH and says where it came from."""
    assert set(RECORD_PATHS) <= set(capture.paths)
    meta = capture.meta
    assert meta["capture"] in ("live", "from-source")
    assert str(meta["version"]) == capture.directory.parent.name
    assert meta.get("date")
    if meta["capture"] == "from-source":
        source = meta["source"]
        assert source.get("files"), "from-source captures name the file behind every shape"
        assert any(source.get(k) for k in ("commit", "base_commit", "pypi", "wheel"))
    else:
        assert meta.get("command"), "live captures say how they were recorded"


@pytest.mark.parametrize("capture", all_captures(), ids=capture_id)
def test_resolve_reads_every_expected_value(capture: Capture) -> None:
    """resolve on the whole capture, with its engine's recipe, keeps one probe per signal and
    its snapshot holds each active probe's expected value."""
    kind = KIND_OF_ENGINE[capture_id(capture).split("/")[0]]
    fetcher = CaptureFetcher(capture)
    plan, snap = run(resolve(fetcher, kind, has_log_feed=capture.log_lines is not None))
    signals = [p.signal for p in plan.active]
    assert len(signals) == len(set(signals)), "one probe per signal"
    for probe in plan.http_probes:
        assert plain(snap.value(probe.signal)) == lookup(EXPECTED, capture, probe.name)
        assert snap.sources[probe.signal] == probe.name
    for d in plan.dropped:
        expected = lookup(EXPECTED, capture, d.probe.name)
        assert expected in (MISSING, None) or d.reason == "redundant", (d.probe.name,
                                                                       d.describe())
    if capture.log_lines is not None:
        follow = [s for s in plan.follow(ln.encode() for ln in capture.log_lines)]
        for probe in plan.log_probes:
            values = [plain(s.value(probe.signal)) for s in follow if probe.signal in s.sources]
            assert (values[-1] if values else MISSING) == lookup(EXPECTED, capture, probe.name)


@pytest.mark.parametrize("capture", all_captures(), ids=capture_id)
def test_detection(capture: Capture) -> None:
    """Kind detection in the §4 order finds each capture's engine (or refuses to guess)."""
    expected = lookup(DETECTED, capture, "kind")
    assert expected is not MISSING
    if expected is DetectionFailed:
        with pytest.raises(DetectionFailed):
            run(detect_kind(CaptureFetcher(capture)))
    else:
        assert run(detect_kind(CaptureFetcher(capture))) == expected


@pytest.mark.parametrize("capture", all_captures(), ids=capture_id)
def test_doctor_reports_capture(capture: Capture) -> None:
    """doctor's JSON for a capture holds the kind, version and every signal, null if unknown."""
    lines = [ln.encode() for ln in capture.log_lines] if capture.log_lines is not None else None
    report = run(examine("capture", CaptureFetcher(capture), "auto", log_lines=lines))
    import json

    doc: dict[str, Any] = json.loads(render_json([report]))["backends"][0]
    assert doc["kind"] == lookup(DETECTED, capture, "kind")
    assert set(doc) >= {"url", "kind", "version", "signals", "active", "dropped"}
    for name, values in (doc["signals"]["models"] or {}).items():
        assert set(values) == {"residency", "vram_bytes", "size_bytes", "running", "waiting",
                               "capacity", "kv_usage", "kv_pool_tokens"}, name
    unknown = set(doc["unknown"])
    for s in Signal:
        assert (s.value in unknown) == (report.merged().known(s) is False)


def test_support_md_is_current() -> None:
    """SUPPORT.md is what the captures and the live tests prove today."""
    from pathlib import Path

    from tests.support.replay import render

    path = Path(__file__).resolve().parents[2] / "SUPPORT.md"
    assert path.read_text() == render(), "run: python -m tests.replay.support > SUPPORT.md"
