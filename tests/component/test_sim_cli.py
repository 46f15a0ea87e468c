"""``pharos sim-engine``: one double in its own process, on the global reactor, until Ctrl-C."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from pharos.sim.cli import double_args, parser

ROOT = Path(__file__).resolve().parents[2]


def test_sim_engine_serves_until_interrupted() -> None:
    """The process prints its URL, answers like its engine (vLLM's /version and a chat), and
    exits 0 on SIGINT, within a few seconds."""
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "pharos"), "sim-engine", "--kind", "vllm", "--port",
         "0",
         "--decode-ms", "1", "--max-tokens", "3"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        assert ready, "no URL printed within 20 s"
        line = proc.stdout.readline()
        assert line.startswith("vllm double listening on http://127.0.0.1:"), line
        url = line.rsplit(" ", 1)[1].strip()
        with urllib.request.urlopen(url + "/version", timeout=5) as r:
            assert json.loads(r.read()) == {"version": "0.32.0"}
        req = urllib.request.Request(
            url + "/v1/chat/completions",
            data=json.dumps({"model": "tiny", "messages": [{"role": "user",
                                                              "content": "hi"}]}).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            doc = json.loads(r.read())
        assert doc["choices"][0]["message"]["content"] == "The quick brown"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_arguments_become_the_double_knobs() -> None:
    """Milliseconds, gigabytes and model lists on the command line map onto the model."""
    args = parser().parse_args(["--kind", "ollama", "--prefill-ms", "2", "--decode-ms", "20",
                                "--model", "a:1b=1.5", "--model", "b:7b=4",
                                "--loaded", "a:1b", "--host-memory-gb", "8"])
    got = double_args(args)
    assert got["prefill_s"] == 0.002 and got["decode_s"] == 0.02
    assert got["models"] == {"a:1b": 1_500_000_000, "b:7b": 4_000_000_000}
    assert got["loaded"] == ("a:1b",) and got["host_memory"] == 8_000_000_000
