"""Layer 4: ``pharos calibrate`` against the real llama.cpp server (issue 17 item 5). The fit
on a CPU-run tiny model is reported, not asserted against numbers: what must hold is that a
real engine's own timings give a sound fit (every probe kept, terms non-negative, the
prompt-length term carrying the time)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.live.engines import engines
from tests.support.live import wait_idle

#: Where the last fit is written, for the issue note and anyone curious.
REPORT = Path(__file__).resolve().parents[2] / "build" / "calibrate-llamacpp.json"


def test_calibrate_fits_the_live_llamacpp(llamacpp: engines.RunningEngine) -> None:
    """``pharos calibrate --url`` on the live llama-server detects it, times every probe by
    ``timings.prompt_ms`` and prints a fit whose terms are non-negative and whose per-token
    term is positive (a longer prompt costs more on a real engine)."""
    wait_idle(llamacpp)
    r = subprocess.run(
        [sys.executable, "-m", "pharos.cli", "calibrate", "--url", llamacpp.url, "--json",
         "--seed", "5", "--cached", "0,256,512", "--uncached", "64,128,256",
         "--busy-wait", "60"],
        capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text(json.dumps(doc, indent=1))
    fit = doc["fit"]
    assert doc["kind"] == "llamacpp"
    assert not doc["refused"]
    assert len(doc["samples"]) >= 9
    assert min(fit["prefill_token_s"], fit["prefill_pair_s"], fit["prefill_fixed_s"]) >= 0
    assert fit["prefill_token_s"] > 0
    assert max(s["cached"] for s in doc["samples"]) > 0
