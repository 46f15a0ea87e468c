"""A fresh simulated fleet for one comparison run: ``engines`` engine doubles, each its own
``pharos sim-engine`` process (as real engines are separate processes; see contrib/bench's
README for the measurement behind this choice), and, for a Pharos policy, a fresh Pharos
(twistd) with a generated config naming that policy, answering ``/healthz`` 200 before the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, FirstError, gatherResults

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

    def to_json(self) -> dict[str, Any]:
        """The ``fleet`` part of a result file's spec."""
        return {"engines": self.engines, "kind": self.kind,
                "engine_args": list(self.engine_args),
                "models": dict(self.models) if self.models else None,
                "pharos_policy": self.policy, "capacity": self.capacity,
                "access": self.access}


def engine_command(spec: FleetSpec) -> list[str]:
    """The command line of one engine double (on a port the kernel picks)."""
    models = []
    for name, gb in (spec.models or {}).items():
        models += ["--model", f"{name}={gb:g}" if gb else name]
    return [*console_script("pharos"), "sim-engine", "--kind", spec.kind, "--port", "0",
            *models, *spec.engine_args]


def pharos_config(port: int, urls: Sequence[str], kind: str, policy: str,
                  capacity: int | None = None, access: str | None = None) -> str:
    """Pharos's YAML config: the engines as static backends, the policy, and the keys and
    tenants when ``access`` holds them."""
    lines = [f"listen: 127.0.0.1:{port}", f"policy: {policy}", "backends:"]
    for url in urls:
        lines += [f"  - url: {url}", f"    kind: {kind}"]
        if capacity is not None:
            lines.append(f"    capacity: {capacity}")
    return "\n".join(lines) + "\n" + (access or "")


class Fleet:
    """The processes of one run; ``stop`` ends every one it started. Logs and Pharos's config
    go under ``logs``."""

    def __init__(self, reactor: Any, logs: Path) -> None:
        self.reactor = reactor
        self.logs = logs
        self.children: list[Child] = []
        self.engine_urls: list[str] = []
        self.pharos_url: str | None = None
        self._stopping: Deferred[None] | None = None

    async def start(self, spec: FleetSpec) -> list[str]:
        """Start the fleet; the base URLs the harness sends to (Pharos's, or the engines')."""
        pool = new_pool(self.reactor)
        try:
            engines = [spawn(self.reactor, f"engine {n}", engine_command(spec),
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
            port = free_port()
            config = self.logs / "pharos.yaml"
            config.write_text(pharos_config(port, self.engine_urls, spec.kind, spec.policy,
                                         spec.capacity, spec.access))
            pharos = spawn(self.reactor, "pharos",
                           [*console_script("twistd"), "-n", "--pidfile=", "pharos", "-c",
                            str(config)], self.logs / "pharos.log", cwd=self.logs,
                           announces=False)
            self.children.append(pharos)
            self.pharos_url = f"http://127.0.0.1:{port}"
            await wait_until(self.reactor, pharos, self.pharos_url + "/healthz", pool)
            return [self.pharos_url]
        except StartError:
            raise
        except Exception as e:
            raise StartError(f"starting the fleet: {e}") from e
        finally:
            await pool.closeCachedConnections()

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
        engines = [c for c in children if c.name != "pharos"]
        for c in children:
            if c.name == "pharos":
                await stop(self.reactor, c)
        await gatherResults([Deferred.fromCoroutine(stop(self.reactor, c)) for c in engines])
