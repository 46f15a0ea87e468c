"""A fresh simulated fleet for one comparison run: ``engines`` engine doubles, each its own
``pharos sim-engine`` process (as real engines are separate processes), and, for a Pharos
policy, a fresh Pharos with a generated config naming that policy, answering ``/healthz`` 200
before the run; or several instances, peers of each other when asked, each with a state file
when asked, any of which can be restarted mid-run (``Fleet.restart``).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, FirstError, gatherResults
from twisted.internet.interfaces import IReactorProcess, IReactorTime

from pharos.bench.openloop import new_pool
from pharos.bench.processes import (
    Child,
    StartError,
    console_script,
    free_port,
    spawn,
    stop,
    wait_until,
)

#: Path every engine double answers 200 on once it serves (vLLM, llama.cpp and Ollama alike).
ENGINE_READY = "/v1/models"
#: Seconds a restarted instance has to drain (5 s grace, then its streams) before SIGKILL.
RESTART_GRACE = 60.0


@dataclass(frozen=True)
class FleetSpec:
    """What to start: ``engines`` doubles of ``kind`` with ``engine_args`` (``sim-engine``
    options), serving ``models`` (name → GB, 0 for unsized; empty: the double's own), and
    Pharos with ``policy`` in front when ``policy`` is set."""

    engines: int
    kind: str
    engine_args: tuple[str, ...] = ()
    models: Mapping[str, float] | None = None
    policy: str | None = None
    #: Each backend's ``capacity`` in Pharos's config (``None``: Pharos reads or assumes it).
    capacity: int | None = None
    #: The ``keys:``/``tenants:`` sections of Pharos's config (``None``: no keys, open).
    access: str | None = None
    #: Pharos instances, each in front of every engine (the harness balances round robin).
    instances: int = 1
    #: The instances are each other's peers.
    peers: bool = False
    #: Each instance keeps a state file (kept across a restart).
    state_file: bool = False

    def to_json(self) -> dict[str, Any]:
        """The ``fleet`` part of a result file's spec (the instance fields only when not the
        default, so older result files still match on ``--resume``)."""
        out: dict[str, Any] = {
            "engines": self.engines, "kind": self.kind, "engine_args": list(self.engine_args),
            "models": dict(self.models) if self.models else None,
            "pharos_policy": self.policy, "capacity": self.capacity, "access": self.access}
        if (self.instances, self.peers, self.state_file) != (1, False, False):
            out.update(instances=self.instances, peers=self.peers, state_file=self.state_file)
        return out


@dataclass(frozen=True)
class PeerSetup:
    """The ``peers:`` section of one instance: its peer listener, the secret file, and every
    instance's peer address (itself included: it skips itself by ``Pharos-Origin``)."""

    listen: str
    secret_file: str
    members: tuple[str, ...]


def engine_command(spec: FleetSpec) -> list[str]:
    """The command line of one engine double (on a port the kernel picks)."""
    models = []
    for name, gb in (spec.models or {}).items():
        models += ["--model", f"{name}={gb:g}" if gb else name]
    return [*console_script("pharos"), "sim-engine", "--kind", spec.kind, "--port", "0",
            *models, *spec.engine_args]


def pharos_config(port: int, urls: Sequence[str], kind: str, policy: str,
                  capacity: int | None = None, access: str | None = None, *,
                  state_file: str | None = None, peers: PeerSetup | None = None) -> str:
    """Pharos's YAML config: the engines as static backends, the policy, the keys and
    tenants when ``access`` holds them, and the state file and peers when given."""
    lines = [f"listen: 127.0.0.1:{port}", f"policy: {policy}", "backends:"]
    for url in urls:
        lines += [f"  - url: {url}", f"    kind: {kind}"]
        if capacity is not None:
            lines.append(f"    capacity: {capacity}")
    if state_file is not None:
        lines.append(f"state_file: {json.dumps(state_file)}")
    if peers is not None:
        lines += ["peers:", f"  listen: {peers.listen}",
                  f"  secret_file: {json.dumps(peers.secret_file)}",
                  f"  members: {json.dumps(list(peers.members))}"]
    return "\n".join(lines) + "\n" + (access or "")


def instance_name(k: int, instances: int) -> str:
    """A Pharos child's name: ``pharos`` alone, ``pharos K`` among several."""
    return "pharos" if instances == 1 else f"pharos {k}"


class Processes:
    """The processes of one run; ``stop`` ends every one it started. Logs, Pharos's configs,
    the peers' secret and the state files go under ``logs``."""

    def __init__(self, reactor: IReactorTime, logs: Path) -> None:
        self.reactor = reactor
        self.processes = IReactorProcess(reactor)  # the same reactor, for spawning
        self.logs = logs
        self.children: list[Child] = []
        self.engine_urls: list[str] = []
        self.pharos_url: str | None = None
        #: Every instance's base URL, in instance order.
        self.pharos_urls: list[str] = []
        #: The names of instances restarted so far (their CPU time is not comparable).
        self.restarted: set[str] = set()
        self._argv: list[list[str]] = []
        self._stopping: Deferred[None] | None = None

    async def start(self, spec: FleetSpec) -> list[str]:
        """Start the fleet; the base URLs the harness sends to (Pharos's, or the engines')."""
        pool = new_pool(self.reactor)
        try:
            engines = [spawn(self.processes, f"engine {n}", engine_command(spec),
                             self.logs / f"engine-{n}.log") for n in range(spec.engines)]
            self.children += engines
            try:
                self.engine_urls = list(await gatherResults([c.url for c in engines],
                                                            consumeErrors=True))
            except FirstError as e:
                e.subFailure.raiseException()
            for child, url in zip(engines, self.engine_urls, strict=True):
                await wait_until(self.reactor, child, url + ENGINE_READY, pool)
            if spec.policy is None:
                return list(self.engine_urls)
            if self._stopping is not None:
                raise StartError("stopped while starting")
            self._configure(spec)
            for k, argv in enumerate(self._argv):
                self.children.append(spawn(self.processes, instance_name(k, spec.instances),
                                           argv, self.logs / f"{_stem(k, spec.instances)}.log",
                                           cwd=self.logs, announces=False))
            for k, url in enumerate(self.pharos_urls):
                await wait_until(self.reactor, self._child(instance_name(k, spec.instances)),
                                 url + "/healthz", pool)
            self.pharos_url = self.pharos_urls[0]
            return list(self.pharos_urls)
        except StartError:
            raise
        except Exception as e:
            raise StartError(f"starting the fleet: {e}") from e
        finally:
            await pool.closeCachedConnections()

    def _configure(self, spec: FleetSpec) -> None:
        """Write each instance's config (and the peers' secret); their command lines."""
        assert spec.policy is not None
        ports = [free_port() for _ in range(spec.instances)]
        peer_ports = [free_port() for _ in range(spec.instances)] if spec.peers else []
        secret = self.logs / "peers.secret"
        if spec.peers:
            secret.parent.mkdir(parents=True, exist_ok=True)
            secret.write_text(secrets.token_hex(16) + "\n")
            secret.chmod(0o600)
        members = tuple(f"127.0.0.1:{p}" for p in peer_ports)
        self.pharos_urls = [f"http://127.0.0.1:{p}" for p in ports]
        self._argv = []
        for k, port in enumerate(ports):
            stem = _stem(k, spec.instances)
            config = self.logs / f"{stem}.yaml"
            config.parent.mkdir(parents=True, exist_ok=True)
            peers = PeerSetup(members[k], str(secret.resolve()), members) if spec.peers \
                else None
            state = str((self.logs / f"{stem}.state").resolve()) if spec.state_file else None
            config.write_text(pharos_config(port, self.engine_urls, spec.kind, spec.policy,
                                            spec.capacity, spec.access, state_file=state,
                                            peers=peers))
            self._argv.append([*console_script("twistd"), "-n", "--pidfile=", "pharos", "-c",
                               str(config)])

    def _child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    async def restart(self, k: int, grace: float = RESTART_GRACE) -> dict[str, Any]:
        """SIGTERM instance ``k``, wait for its exit (SIGKILL after ``grace`` seconds), start it
        again with the same config and wait for ``/healthz`` 200. Reactor times: ``term_at``,
        ``exited_at``, ``healthy_at`` (``None``: it did not come back; ``error`` says why)."""
        instances = len(self._argv)
        name = instance_name(k, instances)
        event: dict[str, Any] = {"instance": k, "url": self.pharos_urls[k],
                                 "term_at": self.reactor.seconds(), "exited_at": None,
                                 "healthy_at": None, "error": None}
        old = self._child(name)
        self.restarted.add(name)
        await stop(self.reactor, old, grace)
        event["exited_at"] = self.reactor.seconds()
        if self._stopping is not None:
            event["error"] = "the fleet is stopping"
            return event
        n = sum(1 for c in self.children if c.name == name)
        child = spawn(self.processes, name, self._argv[k],
                      self.logs / f"{_stem(k, instances)}.restart{n}.log", cwd=self.logs,
                      announces=False)
        self.children = [c for c in self.children if c is not old] + [child]
        pool = new_pool(self.reactor)
        try:
            await wait_until(self.reactor, child, self.pharos_urls[k] + "/healthz", pool)
            event["healthy_at"] = self.reactor.seconds()
        except StartError as e:
            event["error"] = str(e)
        finally:
            await pool.closeCachedConnections()
        return event

    def cpu_seconds(self) -> dict[str, float | None]:
        """CPU seconds each process has used so far (``engine <n>``, ``pharos``)."""
        return {c.name: c.cpu_seconds() for c in self.children}

    def stop(self) -> Deferred[None]:
        """Stop Pharos first, then the engines, each with bounded waits. Every call fires
        once all of them are stopped, however many calls there are."""
        if self._stopping is None:
            self._stopping = Deferred.fromCoroutine(self._stop())
        d: Deferred[None] = Deferred()

        def relay(result: object) -> object:
            d.callback(None)
            return result

        self._stopping.addBoth(relay)
        return d

    async def _stop(self) -> None:
        children, self.children = self.children, []
        engines = [c for c in children if not c.name.startswith("pharos")]
        await gatherResults([Deferred.fromCoroutine(stop(self.reactor, c))
                             for c in children if c.name.startswith("pharos")])
        await gatherResults([Deferred.fromCoroutine(stop(self.reactor, c)) for c in engines])


def _stem(k: int, instances: int) -> str:
    """The file name stem of instance ``k``'s log, config and state file."""
    return "pharos" if instances == 1 else f"pharos-{k}"
