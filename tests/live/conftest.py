"""Layer 4 set-up: real engines on loopback, built or installed the first time.

``PHAROS_LIVE=0`` skips these tests (the quick loop of ``make check``); otherwise an engine
that cannot be installed is a failure, never a silent skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live.engines import engines
from tests.support.live import HERE, ensure_installed


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/live is a live test."""
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.live)


@pytest.fixture(scope="module")
def llamacpp() -> Iterator[engines.RunningEngine]:
    """llama-server b11312 with the slow GGUF, 2 slots, metrics and slots on."""
    ensure_installed("llamacpp")
    model = engines.gguf_slow_model()
    assert model is not None
    with engines.start_llama_server(model, parallel=engines.LLAMA_PARALLEL) as eng:
        yield eng


@pytest.fixture(scope="module")
def vllm() -> Iterator[engines.RunningEngine]:
    """vLLM 0.32.0 CPU build with the tiny HF model, prefix caching and cached-token usage."""
    ensure_installed("vllm")
    model = engines.hf_model_dir()
    assert model is not None
    # Dev mode serves POST /reset_prefix_cache (loopback only), which the eviction test uses.
    with engines.start_vllm(model, max_num_seqs=engines.VLLM_MAX_NUM_SEQS,
                            extra_env={"VLLM_SERVER_DEV_MODE": "1"}) as eng:
        yield eng
