"""``pharos bench compare``: every policy on the same requests, each run on a fresh fleet.

For each rate, each seed and each policy (innermost, so machine drift falls on every policy
alike): fresh engine doubles, for a Pharos policy a fresh Pharos in front, then the same
requests at the same times, the warm-up discarded, one result file per run at
``OUT/<workload>/<rate>/<policy>-seed<N>.json``. The baselines ``round-robin``, ``random``,
``p2c`` and ``prefix-hash`` are Pharos policies: they go through Pharos like ``cost``, so a
comparison differs in the decision alone. Only the peer baseline ``prefix-aware``
(production-stack's router) is the harness dispatching straight to the engines.
Medians over seeds are the report's business.

``--instances N`` puts N Pharos instances in front of the engines (``--peers``: as each other's
peers; ``--state-file``: each with a state file), the harness sending to them round robin;
``--restart K@T`` restarts instance K T seconds into the run, the harness skipping instances
that fail their health check meanwhile (``pharos.bench.restarts``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.interfaces import IReactorCore, IReactorTime
from twisted.internet.task import deferLater

from pharos.bench.clients import Population, Sender
from pharos.bench.fleet import FleetSpec, Processes
from pharos.bench.openloop import DISPATCH, OpenLoop, new_pool
from pharos.bench.processes import StartError
from pharos.bench.restarts import HealthWatch, Restart, per_instance, restart_summary
from pharos.bench.result import read_result, records_of, write_result
from pharos.bench.run import (
    RunSpec,
    add_workload_options,
    drive,
    execute,
    load_clients,
    workload_args,
)
from pharos.bench.summary import Slo
from pharos.bench.workloads import Request, multi_model
from pharos.config import POLICIES
from pharos.engine.library import OLLAMA
from pharos.sim.double import KINDS

#: Every policy ``compare`` can run: Pharos's own (baselines included), then the harness's
#: dispatch baselines that Pharos has no policy for.
ALL_POLICIES: tuple[str, ...] = (*POLICIES, *(d for d in DISPATCH if d not in POLICIES))
#: The model name the vLLM and llama.cpp doubles serve unless told otherwise.
DOUBLE_MODEL = "tiny"
#: Default size of each model an Ollama double is given for the workload, GB.
DEFAULT_MODEL_GB = 4.0


def rate_name(rate: float) -> str:
    """A rate as a directory name: ``6``, ``0.5``."""
    return f"{rate:g}"


def result_path(out: Path, workload: str, rate: float, policy: str, seed: int) -> Path:
    """Where one run's result file goes."""
    return out / workload / rate_name(rate) / f"{policy}-seed{seed}.json"


def plan(rates: Sequence[float], seeds: Sequence[int], policies: Sequence[str]
         ) -> list[tuple[float, int, str]]:
    """The runs in order: rates, then seeds, then policies innermost."""
    return [(r, s, p) for r in rates for s in seeds for p in policies]


def workload_models(workload: str, kw: dict[str, Any], requests: Sequence[Request]
                    ) -> list[str]:
    """Every model the workload can ask for: for ``multi-model`` its whole catalogue (the same
    for every seed, though a short run may not draw each), else those ``requests`` name."""
    if workload == "multi-model":
        if kw.get("names"):
            return sorted(kw["names"])
        count = kw.get("models", inspect.signature(multi_model).parameters["models"].default)
        return [f"model-{m}" for m in range(count)]
    return sorted({r.model for r in requests})


def served_models(kind: str, engine_args: Sequence[str], names: Sequence[str],
                  model_gb: float) -> dict[str, float] | None:
    """The models the doubles must serve (name → GB), unless the engine arguments name
    them: on Ollama, each of ``names`` at ``model_gb`` (its catalogue is the capture's
    otherwise); elsewhere, only when they are other than the doubles' own model."""
    if any(a.split("=", 1)[0] in ("--model", "--served-model-name") for a in engine_args):
        return None
    names = sorted(names)
    if kind == OLLAMA:
        return {n: model_gb for n in names}
    if names != [DOUBLE_MODEL]:
        return {n: 0.0 for n in names}
    return None


def _same_run(path: Path, spec: dict[str, Any]) -> bool:
    """Whether ``path`` already holds the result of the run ``spec`` describes, compared
    through JSON as the file stores it (a tuple in ``spec`` reads back as a list)."""
    doc = read_result(path)
    if doc is None:
        return False
    planned = json.loads(json.dumps(spec))
    keys = ("workload", "rate", "duration", "seed", "warmup", "workload_args", "policy", "slo",
            "timeout", "max_requests", "fleet", "clients", "restart")
    return all(doc["spec"].get(k) == planned.get(k) for k in keys)


class Comparison:
    """The runs of one ``compare`` command; ``shutdown`` ends the current one early."""

    def __init__(self, reactor: IReactorTime, a: argparse.Namespace,
                 clients: Population | None = None) -> None:
        self.reactor = reactor
        self.a = a
        self.clients = clients
        self.fleet: Processes | None = None
        self.loop: OpenLoop | None = None
        self.failed = 0
        self.stopping = False
        self._restarting: list[Deferred[dict[str, Any]]] = []
        self._workload: tuple[tuple[float, int],
                              tuple[list[Request], list[Sender] | None]] | None = None

    async def run(self) -> int:
        a = self.a
        runs = plan(a.rate, a.seeds, a.policies)
        warmup = a.warmup if a.warmup is not None else a.duration / 10
        for k, (rate, seed, policy) in enumerate(runs, 1):
            if self.stopping:
                break
            base = RunSpec(workload=a.workload, rate=rate, duration=a.duration, seed=seed,
                           urls=(), warmup=warmup, workload_args=workload_args(a.workload_arg),
                           slo=Slo(a.slo_ttft, a.slo_tpot), timeout=a.timeout,
                           max_requests=a.max_requests, clients=self.clients)
            requests, senders = self._traffic(base)
            fleet = FleetSpec(engines=a.engines, kind=a.kind, engine_args=tuple(a.engine_arg),
                              models=served_models(
                                  a.kind, a.engine_arg,
                                  workload_models(a.workload, base.workload_args, requests),
                                  a.model_gb),
                              policy=policy if policy in POLICIES else None,
                              capacity=a.backend_capacity,
                              access=self.clients.access_yaml() if self.clients else None,
                              instances=a.instances, peers=a.peers, state_file=a.state_file)
            spec = replace(base, policy=policy,
                           dispatch=policy if policy not in POLICIES else None)
            path = result_path(a.out, a.workload, rate, policy, seed)
            head = f"[{k}/{len(runs)}] {a.workload} rate {rate:g} seed {seed} {policy}"
            planned = {**spec.to_json(), "fleet": fleet.to_json(), **self._restart_spec()}
            if a.resume and _same_run(path, planned):
                print(f"{head}: done already ({path})", flush=True)
                continue
            print(f"{head}: {len(requests)} requests", flush=True)
            await self._one(spec, fleet, requests, senders, path, head)
        return 1 if self.failed else 0

    def _traffic(self, base: RunSpec) -> tuple[list[Request], list[Sender] | None]:
        """The workload of ``base`` and its senders, made once per rate and seed."""
        key = (base.rate, base.seed)
        if self._workload is None or self._workload[0] != key:
            self._workload = (key, base.traffic())
        return self._workload[1]

    def _restart_spec(self) -> dict[str, Any]:
        """The restarts as the result file's spec names them (none: nothing, as before)."""
        restarts: list[Restart] = self.a.restart
        return {"restart": [r.to_json() for r in restarts]} if restarts else {}

    async def _one(self, spec: RunSpec, fleet_spec: FleetSpec, requests: list[Request],
                   senders: list[Sender] | None, path: Path, head: str) -> None:
        logs = self.a.out / "logs" / spec.workload / rate_name(spec.rate) / path.stem
        self.fleet = fleet = Processes(self.reactor, logs)
        watch: HealthWatch | None = None
        pool = new_pool(self.reactor)
        self._restarting = []
        try:
            urls = await fleet.start(fleet_spec)
            spec = replace(spec, urls=tuple(urls))
            extra: dict[str, Any] = {"fleet": fleet_spec.to_json(),
                                     "engine_urls": fleet.engine_urls, **self._restart_spec()}
            if self.a.restart:
                watch = HealthWatch(self.reactor, urls, pool)
                watch.start()
            cpu = fleet.cpu_seconds()
            doc = await execute(self.reactor, spec, requests, extra, label=head,
                                started=self._started, senders=senders,
                                available=watch.up if watch is not None else None)
            events = await gatherResults(self._restarting) if self._restarting else []
            for name, after in fleet.cpu_seconds().items():
                before = cpu.get(name)
                doc["summary"]["cpu_s"][name] = None if after is None or before is None \
                    or name in fleet.restarted else round(after - before, 3)
            if len(urls) > 1 and fleet_spec.policy is not None:
                records = records_of(doc)
                doc["summary"]["per_instance"] = per_instance(records, urls)
            if self.a.restart:
                doc["restarts"] = events
                doc["summary"]["restarts"] = restart_summary(records_of(doc), events,
                                                             spec.warmup)
            if self.stopping:
                print(f"{head}: interrupted, no result written", file=sys.stderr, flush=True)
                return
            write_result(path, doc)
            s = doc["summary"]
            p99 = s["ttft_s"]["p99"]
            print(f"{head}: p99 TTFT {'-' if p99 is None else f'{p99 * 1000:.0f} ms'}, "
                  f"goodput {s['goodput_rps'] or 0:.2f} req/s, errors "
                  f"{sum(s['errors'].values())}, wrote {path}", flush=True)
        except StartError as e:
            if self.stopping:
                print(f"{head}: interrupted while starting", file=sys.stderr, flush=True)
                return
            self.failed += 1
            print(f"{head}: failed to start: {e}", file=sys.stderr, flush=True)
        finally:
            if watch is not None:
                watch.stop()
            self.loop = None
            self.fleet = None
            await fleet.stop()
            await pool.closeCachedConnections()

    def _started(self, loop: OpenLoop) -> None:
        """The run begins: schedule its restarts (times from now, the run's start)."""
        self.loop = loop
        fleet = self.fleet
        start = self.reactor.seconds()
        restarts: list[Restart] = self.a.restart
        for r in restarts:
            self._restarting.append(Deferred.fromCoroutine(
                self._restart_at(fleet, r.instance, r.at, start)))

    async def _restart_at(self, fleet: Processes | None, k: int, at: float, start: float
                          ) -> dict[str, Any]:
        """Restart instance ``k`` of ``fleet`` ``at`` seconds after ``start``; the event with
        its times from ``start``."""
        await deferLater(self.reactor, at, lambda: None)
        if fleet is None or self.stopping:
            return {"instance": k, "error": "not run"}
        event = await fleet.restart(k)
        for key in ("term_at", "exited_at", "healthy_at"):
            if event.get(key) is not None:
                event[key] = round(event[key] - start, 3)
        print(f"  restart of instance {k}: SIGTERM at {event['term_at']} s, exited at "
              f"{event['exited_at']} s, healthy again at {event['healthy_at']} s"
              + (f" ({event['error']})" if event.get("error") else ""), flush=True)
        return event

    def shutdown(self) -> Deferred[None] | None:
        """The reactor is stopping (Ctrl-C, SIGTERM): abort the current run (its result is
        not written) and wait until its processes are stopped."""
        self.stopping = True
        fleet, loop = self.fleet, self.loop
        if loop is not None:
            loop.abort()
        return fleet.stop() if fleet is not None else None


def _csv(kind: type, choices: Sequence[str] | None = None) -> Any:
    def parse(text: str) -> list[Any]:
        values = [kind(v.strip()) for v in text.split(",") if v.strip()]
        bad = [v for v in values if choices is not None and v not in choices]
        if bad or not values:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {', '.join(choices or ('values',))}")
        return values
    return parse


def _restart(text: str) -> Restart:
    try:
        return Restart.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parser() -> argparse.ArgumentParser:
    """The ``compare`` arguments."""
    p = argparse.ArgumentParser(
        prog="pharos bench compare",
        description="Run every policy on the same requests, each on a fresh simulated fleet, "
                    "one result file per run.")
    add_workload_options(p)
    p.add_argument("--rate", type=float, action="append", required=True,
                   help="mean requests per second (repeatable)")
    p.add_argument("--seeds", type=_csv(int), default=[1], help="repetitions, e.g. 1,2,3")
    p.add_argument("--engines", type=int, default=3, help="engine doubles per fleet")
    p.add_argument("--kind", choices=KINDS, default="vllm", help="engine kind to simulate")
    p.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                   help="an option for every engine double, as pharos sim-engine takes it "
                        "(repeatable), e.g. --engine-arg=--slots=8")
    p.add_argument("--model-gb", type=float, default=DEFAULT_MODEL_GB,
                   help="size of each model an Ollama double serves for the workload "
                        f"(default {DEFAULT_MODEL_GB:g})")
    p.add_argument("--backend-capacity", type=int, default=None, metavar="N",
                   help="each backend's capacity in Pharos's config (default: none, Pharos "
                        "reads it from the engine or assumes one)")
    p.add_argument("--policies", type=_csv(str, ALL_POLICIES), default=list(ALL_POLICIES),
                   help=f"comma-separated, from {', '.join(ALL_POLICIES)} (default: all)")
    p.add_argument("--instances", type=int, default=1, metavar="N",
                   help="Pharos instances in front of the engines, the harness sending to them "
                        "round robin (default 1; Pharos policies only)")
    p.add_argument("--peers", action="store_true",
                   help="the instances are each other's peers (a secret file, every instance "
                        "in peers.members)")
    p.add_argument("--state-file", action="store_true",
                   help="each instance keeps a state file (restored when it restarts)")
    p.add_argument("--restart", type=_restart, action="append", default=[],
                   metavar="K@SECONDS",
                   help="SIGTERM instance K (0-based) this many seconds into the run, start it "
                        "again once it exited (repeatable); meanwhile the harness skips "
                        "instances whose /healthz is not 200, as a load balancer does")
    p.add_argument("--resume", action="store_true",
                   help="skip runs whose result file already matches their specification")
    p.add_argument("--out", type=Path, required=True, help="directory for the result files")
    return p


def main_compare(argv: Sequence[str], reactor: IReactorCore) -> int:
    """``pharos bench compare ...`` on ``reactor``."""
    a = parser().parse_args(argv)
    if a.engines < 1:
        parser().error("--engines must be at least 1")
    if a.instances < 1:
        parser().error("--instances must be at least 1")
    multi = a.instances > 1 or a.peers or a.state_file or a.restart
    baselines = [p for p in a.policies if p not in POLICIES]
    if multi and baselines:
        parser().error(f"--instances, --peers, --state-file and --restart are about Pharos "
                       f"instances: not for {', '.join(baselines)} (choose --policies from "
                       f"{', '.join(POLICIES)})")
    if a.peers and a.instances < 2:
        parser().error("--peers needs --instances 2 or more")
    for r in a.restart:
        if r.instance >= a.instances:
            parser().error(f"--restart {r.instance}@{r.at:g}: there are {a.instances} "
                           f"instances (0 to {a.instances - 1})")
        if r.at >= a.duration:
            parser().error(f"--restart {r.instance}@{r.at:g}: after the run's "
                           f"{a.duration:g} s")
    try:
        clients = load_clients(a.clients) if a.clients is not None else None
        # the generator's own checks, on a short stretch of the workload
        RunSpec(workload=a.workload, rate=a.rate[0], duration=min(a.duration, 1.0),
                seed=a.seeds[0], urls=(), workload_args=workload_args(a.workload_arg),
                clients=clients).traffic()
    except (TypeError, ValueError) as e:
        print(f"pharos bench compare: {e}", file=sys.stderr)
        return 2
    comparison = Comparison(IReactorTime(reactor), a, clients)
    reactor.addSystemEventTrigger("before", "shutdown", comparison.shutdown)
    return drive(reactor, lambda: Deferred.fromCoroutine(comparison.run()))
