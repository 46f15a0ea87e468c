"""Layer 3: the real docker CLI reads the fake Engine API (issue 14 item 4), so the fake speaks
the API as the daemon does (version negotiation through ``HEAD /_ping`` and ``/v1.50/``
prefixes, the bodies' types, both log framings), not just what Pharos expects of it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import utils

from tests.support.fake_docker import FakeContainer, FakeDocker

DOCKER = shutil.which("docker")
pytestmark = pytest.mark.skipif(DOCKER is None, reason="the docker CLI is not installed")


class CliRig:
    """The fake on a socket and an environment pointing the CLI at it (and nowhere else)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pd", dir="/tmp"))
        self.fake = FakeDocker()
        sock = str(self.dir / "docker.sock")
        self.fake.listen(sock)
        self.env = {"DOCKER_HOST": f"unix://{sock}", "DOCKER_CONFIG": str(self.dir / "cfg"),
                    "HOME": str(self.dir), "PATH": os.environ.get("PATH", "/usr/bin")}

    async def docker(self, *args: str) -> tuple[str, str]:
        assert DOCKER is not None
        out, err, code = await utils.getProcessOutputAndValue(DOCKER, args, env=self.env)
        assert code == 0, (args, code, err)
        return out.decode(), err.decode()

    async def close(self) -> None:
        await self.fake.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest_twisted.async_yield_fixture()
async def cli() -> AsyncIterator[CliRig]:
    rig = CliRig()
    yield rig
    await rig.close()


def run(cli: CliRig) -> tuple[FakeContainer, FakeContainer]:
    fake = cli.fake
    ollama = fake.run("ollama-1", {"pharos.enable": "true", "pharos.memory_gb": "24"},
                      ports=(11434,))
    fake.write_log(ollama, "server config OLLAMA_NUM_PARALLEL:4")
    fake.write_log(ollama, "a warning on stderr", stream=2)
    tty = fake.run("tty-engine", {"pharos.enable": "true"}, tty=True)
    fake.write_log(tty, "a tty line")
    fake.run("postgres", {}, ports=(5432,))
    fake.stop(fake.run("stopped", {"pharos.enable": "true"}))
    return ollama, tty


@pytest_twisted.ensureDeferred
async def test_docker_ps_reads_the_fake(cli: CliRig) -> None:
    """``docker ps`` negotiates (HEAD /_ping, then /v1.50/) and lists the running containers
    with their ports; a label filter is applied by the fake as the daemon applies it."""
    ollama, _ = run(cli)
    out, _ = await cli.docker("ps", "--no-trunc")
    assert ollama.id in out and "11434/tcp" in out
    assert {"ollama-1", "tty-engine", "postgres"} <= set(out.split()) and "stopped" not in out
    out, _ = await cli.docker("ps", "--filter", "label=pharos.enable=true",
                              "--format", "{{.Names}} {{.Label \"pharos.memory_gb\"}}")
    assert sorted(out.splitlines()) == ["ollama-1 24", "tty-engine "]
    out, _ = await cli.docker("ps", "-a", "--format", "{{.Names}} {{.State}}")
    assert "stopped exited" in out.splitlines()
    assert cli.fake.requests[0] == "HEAD /_ping"
    assert "GET /v1.50/containers/json" in cli.fake.requests


@pytest_twisted.ensureDeferred
async def test_docker_logs_reads_both_framings(cli: CliRig) -> None:
    """``docker logs`` demultiplexes the fake's stdcopy frames into stdout and stderr, and
    prints a TTY container's raw stream as it is; inspect's StartedAt is the one Pharos reads
    for ``since``."""
    ollama, _ = run(cli)
    out, err = await cli.docker("logs", "ollama-1")
    assert out == "server config OLLAMA_NUM_PARALLEL:4\n"
    assert err == "a warning on stderr\n"
    out, err = await cli.docker("logs", "tty-engine")
    assert out == "a tty line\n" and err == ""
    out, _ = await cli.docker("inspect", "--format", "{{.State.StartedAt}} {{.Config.Tty}}",
                              "ollama-1")
    started, tty = out.split()
    assert started.startswith("20") and started.endswith("Z") and tty == "false"
    out, _ = await cli.docker("version", "--format", "{{.Server.APIVersion}}")
    assert out.strip() == "1.50"
