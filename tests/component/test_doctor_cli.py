"""``pharos doctor -c FILE`` end to end: a config with own probes, a file log feed, capacity
and aliases, against a loopback server answering like an Ollama capture."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.utils import getProcessOutputAndValue

from tests.support.capture_server import CaptureResource, close, serve
from tests.support.captures import all_captures, capture_id

PHAROS = str(Path(sys.executable).parent / "pharos")
OLLAMA = next(c for c in all_captures() if capture_id(c) == "ollama/0.32.15/loaded")


async def doctor(*args: str) -> tuple[int, str, str]:
    out, err, code = await getProcessOutputAndValue(PHAROS, ["doctor", *args], reactor=reactor)
    return code, out.decode(), err.decode()


@pytest_twisted.ensureDeferred
async def test_doctor_config_reports_every_backend(tmp_path: Path) -> None:
    """doctor -c reads each backend with its own probes and log feed, and names the surprises:
    config capacity unused when the engine's log gives one, an alias the engine does not list,
    a cloud stub, the coding-agent routes; an unreachable backend is an error in its entry."""
    resource = CaptureResource(OLLAMA, reactor)
    port, url = serve(resource)
    try:
        log = tmp_path / "ollama.log"
        assert OLLAMA.log_lines is not None
        log.write_text("\n".join(OLLAMA.log_lines) + "\n")
        cfg = tmp_path / "pharos.yaml"
        cfg.write_text(f"""
backends:
  - url: {url}
    kind: auto
    capacity: 3
    logs: file://{log}
    aliases:
      llama3.2:3b: llama-small
      missing:1b: tiny
    probes:
      - name: my-version
        signal: version
        log: {{match: 'version (?P<value>[0-9.]+)\\)'}}
  - url: http://127.0.0.1:9
    kind: vllm
""")
        code, out, err = await doctor("-c", str(cfg), "--json")
    finally:
        await close(port)
    assert code == 1, err  # the second backend answers nothing
    first, second = json.loads(out)["backends"]
    assert first["kind"] == "ollama"
    assert first["signals"]["backend"]["capacity"] == 4  # last server config line of the log
    assert first["signals"]["models"]["llama3.2:3b"]["residency"] == "loaded"
    notes = "\n".join(first["surprises"])
    assert "capacity: 3 in config is not used" in notes
    assert "alias llama3.2:3b -> llama-small: listed" in notes
    assert "alias missing:1b -> tiny: NOT listed" in notes
    assert "/v1/messages: not served (404)" in notes
    active = {a["probe"]: a for a in first["active"]}
    assert active["ollama-log-num-parallel"]["source"] == "log"
    # an own probe goes ahead of the recipe for its signal, even a log probe
    assert active["my-version"]["source"] == "own"
    assert active["my-version"]["value"] == "0.32.15"
    dropped = {d["probe"]: d["reason"] for d in first["dropped"]}
    assert dropped["ollama-version"] == "redundant"
    assert second["error"].startswith("BackendUnreachable")
    assert second["signals"]["models"] is None


@pytest_twisted.ensureDeferred
async def test_doctor_text_names_its_source() -> None:
    """doctor on a capture says it replays a recording, and shows unknown signals as unknown."""
    code, out, _ = await doctor("--capture", str(OLLAMA.directory))
    assert code == 0
    assert "replaying the recorded capture" in out
    assert "unknown signals: running, waiting, kv_usage" in out
