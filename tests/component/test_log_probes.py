"""Layer 3: log probes end to end over loopback: an Ollama double whose log file (written with
twisted.python.logfile.LogFile) says ``OLLAMA_NUM_PARALLEL:4`` gets capacity 4 from it, shown
by /admin/explain and ``pharos doctor``; the capacity is unknown again while the file is gone
and back when it returns; an own log probe from config works the same way."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.utils import getProcessOutputAndValue
from twisted.python.logfile import LogFile

from pharos.config import LogFeed, parse_config
from pharos.sim.double import EngineDouble
from tests.support.fleet import Fleet, eventually, start_fleet

PHAROS = str(Path(sys.executable).parent / "pharos")
#: Generous: the file is polled once a second and a lost feed is retried after 1 s, 2 s, ...
WAIT = 30.0


def write_log(directory: Path, lines: list[bytes]) -> LogFile:
    """The engine's log, written the way twistd writes its own."""
    lf = LogFile("ollama.log", str(directory))
    lf.write(b"".join(ln + b"\n" for ln in lines))
    lf.flush()
    return lf


def capacity(fleet: Fleet, double: EngineDouble) -> int | None:
    t = next(t for t in fleet.pharos.state.targets if t.backend.url == double.url)
    return fleet.pharos.state.view(t).capacity


async def explain(fleet: Fleet) -> dict[str, Any]:
    model = fleet.pharos.state.targets[0].model
    r = await fleet.post("/admin/explain/v1/chat/completions",
                         {"model": model, "messages": [{"role": "user", "content": "hi"}]})
    body = await r.content()
    assert r.code == 200, body
    cand: dict[str, Any] = json.loads(body)["candidates"][0]
    return cand


@pytest_twisted.ensureDeferred
async def test_ollama_capacity_from_its_log_file_and_unknown_while_it_is_gone(
        tmp_path: Path) -> None:
    """Capacity 4 comes from the log's server config line (explain names the log probe as
    its source); with the file removed it is unknown (explain falls back, never 0); when the
    file returns the feed reconnects and reads it from its start."""
    double = EngineDouble("ollama", reactor, slots=4)
    lines = double.log_lines()
    assert lines is not None and any(b"OLLAMA_NUM_PARALLEL:4" in ln for ln in lines)
    lf = write_log(tmp_path, lines)
    path = tmp_path / "ollama.log"
    fleet = await start_fleet([("ollama", {"slots": 4},
                                {"kind": "ollama", "logs": LogFeed("file", str(path))})])
    d = fleet.doubles[0]
    try:
        b = fleet.pharos.state.backends[d.url]
        assert b.plan is not None
        assert [p.name for p in b.plan.log_probes] == ["ollama-log-num-parallel"]
        await eventually(lambda: capacity(fleet, d) == 4, WAIT)
        cand = await explain(fleet)
        assert cand["capacity"] == 4 and cand["capacity_source"] == "engine"
        assert cand["signal_sources"]["capacity"] == "log ollama-log-num-parallel"
        assert cand["signals"]["capacity"] == 4

        lf.close()
        path.unlink()
        await eventually(lambda: capacity(fleet, d) is None, WAIT)
        cand = await explain(fleet)
        assert cand["signals"]["capacity"] is None
        assert cand["capacity_source"] != "engine"
        assert "capacity" not in cand["signal_sources"]

        lf = write_log(tmp_path, lines)
        await eventually(lambda: capacity(fleet, d) == 4, WAIT)
    finally:
        lf.close()
        await fleet.stop()
    assert fleet.pharos.state.backends[d.url].log is None


@pytest_twisted.ensureDeferred
async def test_own_log_probe_from_config_and_rotation(tmp_path: Path) -> None:
    """An own log probe from config (ahead of the library's for its signal) reads its line;
    a later line after LogFile rotates the file replaces the value."""
    path = tmp_path / "ollama.log"
    cfg = parse_config(f"""
backends:
  - url: http://placeholder:1
    kind: ollama
    logs: file://{path}
    probes:
      - name: my-slots
        signal: capacity
        log: {{match: 'slots=(?P<value>[0-9]+)'}}
""")
    spec = cfg.backends[0]
    lf = write_log(tmp_path, [b"starting", b"slots=6"])
    fleet = await start_fleet([("ollama", {"slots": 6},
                                {"kind": "ollama", "logs": spec.logs, "probes": spec.probes})])
    d = fleet.doubles[0]
    try:
        b = fleet.pharos.state.backends[d.url]
        assert b.plan is not None
        assert [p.name for p in b.plan.log_probes] == ["my-slots"]
        dropped = {x.probe.name: x.reason for x in b.plan.dropped}
        assert dropped["ollama-log-num-parallel"] == "redundant"
        await eventually(lambda: capacity(fleet, d) == 6, WAIT)
        cand = await explain(fleet)
        assert cand["signal_sources"]["capacity"] == "log my-slots"
        lf.rotate()
        lf.write(b"slots=3\n")
        lf.flush()
        await eventually(lambda: capacity(fleet, d) == 3, WAIT)
    finally:
        lf.close()
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_doctor_shows_the_log_probe_and_its_source(tmp_path: Path) -> None:
    """``pharos doctor --url --log FILE`` runs the plan's log probes over the file: capacity 4
    from the probe ollama-log-num-parallel, shown as a log source; without --log the probe is
    dropped with "no log feed"."""
    double = EngineDouble("ollama", reactor, slots=4)
    lines = double.log_lines()
    assert lines is not None
    write_log(tmp_path, lines).close()
    fleet = await start_fleet([("ollama", {"slots": 4}, {"kind": "ollama"})])
    url = fleet.doubles[0].url
    try:
        out, err, code = await getProcessOutputAndValue(
            PHAROS, ["doctor", "--url", url, "--log", str(tmp_path / "ollama.log"), "--json"],
            reactor=reactor)
        assert code == 0, err
        (doc,) = json.loads(out)["backends"]
        active = {a["probe"]: a for a in doc["active"]}
        assert active["ollama-log-num-parallel"]["source"] == "log"
        assert active["ollama-log-num-parallel"]["value"] == {"": 4}
        assert doc["signals"]["backend"]["capacity"] == 4
        out, err, code = await getProcessOutputAndValue(
            PHAROS, ["doctor", "--url", url], reactor=reactor)
        assert code == 0, err
        assert "ollama-log-num-parallel" in out.decode() and "no log feed" in out.decode()
    finally:
        await fleet.stop()


async def doctor(*args: str) -> tuple[int, str, str]:
    out, err, code = await getProcessOutputAndValue(PHAROS, ["doctor", *args], reactor=reactor)
    return code, out.decode(), err.decode()


@pytest_twisted.ensureDeferred
async def test_doctor_record_logs_captures_the_log_with_a_warning(tmp_path: Path) -> None:
    """``--record DIR --logs`` writes the engine's log as the capture's engine.log and warns
    that engine logs can contain prompts; the capture replays with the log value; without
    --logs no log is recorded and nothing is warned; --logs alone, or with no log to read,
    is refused with a clear message."""
    double = EngineDouble("ollama", reactor, slots=4)
    lines = double.log_lines()
    assert lines is not None
    write_log(tmp_path, lines).close()
    log = str(tmp_path / "ollama.log")
    fleet = await start_fleet([("ollama", {"slots": 4}, {"kind": "ollama"})])
    url = fleet.doubles[0].url
    try:
        rec = tmp_path / "with-logs"
        code, out, err = await doctor("--url", url, "--log", log, "--record", str(rec),
                                      "--logs")
        assert code == 0, err
        assert "can contain prompts" in err
        assert (rec / "engine.log").read_bytes() == (tmp_path / "ollama.log").read_bytes()
        code, out, err = await doctor("--capture", str(rec), "--json")
        assert code == 0, err
        assert json.loads(out)["backends"][0]["signals"]["backend"]["capacity"] == 4

        bare = tmp_path / "without-logs"
        code, out, err = await doctor("--url", url, "--log", log, "--record", str(bare))
        assert code == 0, err
        assert not (bare / "engine.log").exists() and "prompts" not in err

        code, out, err = await doctor("--url", url, "--logs")
        assert code == 2 and "--record" in err
        code, out, err = await doctor("--url", url, "--record", str(tmp_path / "x"), "--logs")
        assert code == 2 and "--log FILE" in err
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_doctor_config_log_with_bad_lines(tmp_path: Path) -> None:
    """doctor -c with a ``logs:`` file holding a 10 MB line and invalid UTF-8 still reads the
    server config line after them; a missing log file is named on stderr and the backend is
    examined without its log."""
    double = EngineDouble("ollama", reactor, slots=4)
    lines = double.log_lines()
    assert lines is not None
    log = tmp_path / "ollama.log"
    log.write_bytes(b"y" * 10_000_000 + b"\n\xff\xfe\xc3 not utf-8\n"
                    + b"".join(ln + b"\n" for ln in lines))
    fleet = await start_fleet([("ollama", {"slots": 4}, {"kind": "ollama"})])
    url = fleet.doubles[0].url
    try:
        cfg = tmp_path / "pharos.yaml"
        cfg.write_text(f"backends:\n  - url: {url}\n    kind: ollama\n    logs: file://{log}\n")
        code, out, err = await doctor("-c", str(cfg), "--json")
        assert code == 0, err
        assert json.loads(out)["backends"][0]["signals"]["backend"]["capacity"] == 4
        cfg.write_text(f"backends:\n  - url: {url}\n    kind: ollama\n"
                       f"    logs: file://{tmp_path}/missing.log\n")
        code, out, err = await doctor("-c", str(cfg), "--json")
        assert code == 0, err
        assert "missing.log" in err
        (doc,) = json.loads(out)["backends"]
        assert {d["probe"]: d["reason"] for d in doc["dropped"]}[
            "ollama-log-num-parallel"] == "no log feed"
    finally:
        await fleet.stop()
