"""Live-layer helpers: installing an engine, waiting for it to go idle."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.live.engines import engines

HERE = Path(__file__).resolve().parents[1] / "live"  # the live tests and their engines


def ensure_installed(what: str) -> None:
    """Run setup.sh for one engine when it is missing (idempotent, cached outside the clone)."""
    if os.environ.get("PHAROS_LIVE") == "0":
        pytest.skip("PHAROS_LIVE=0: live engine tests not requested")
    ready = engines.llamacpp_available() if what == "llamacpp" else engines.vllm_available()
    if ready:
        return
    r = subprocess.run(["bash", str(HERE / "engines" / "setup.sh"), what],
                       capture_output=True, text=True, timeout=45 * 60)
    if r.returncode != 0:
        pytest.fail(f"setup.sh {what} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")


def wait_idle(eng: engines.RunningEngine, timeout: float = 60.0) -> None:
    """Wait until the engine has no request running (after streams were cancelled)."""
    deadline = time.monotonic() + timeout
    while engines.get_metrics(eng.url).get("llamacpp:requests_processing", 0) != 0:
        assert time.monotonic() < deadline, "engine did not go idle"
        time.sleep(0.2)
