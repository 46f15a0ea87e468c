"""``pharos bench run``: one open-loop run of a seeded workload against Pharos or, with several
``--url`` and ``--dispatch``, straight against engines, written to one result file."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from twisted.internet.defer import Deferred
from twisted.internet.error import ReactorNotRunning
from twisted.internet.interfaces import IReactorCore, IReactorTime
from twisted.python.failure import Failure

from pharos.bench.clients import Population, Sender, load
from pharos.bench.openloop import DEFAULT_TIMEOUT, DISPATCH, OpenLoop
from pharos.bench.progress import Progress
from pharos.bench.result import environment, result_document, write_result
from pharos.bench.summary import DEFAULT_SLO_TPOT, DEFAULT_SLO_TTFT, Slo, summarize
from pharos.bench.workloads import WORKLOADS, Request, generate


@dataclass(frozen=True)
class RunSpec:
    """What one run sends, where, and how it is judged."""

    workload: str
    rate: float
    duration: float
    seed: int
    urls: tuple[str, ...]
    warmup: float = 0.0
    #: Keyword arguments of the workload generator (``arrivals``, ``cv``, sizes, ...).
    workload_args: dict[str, Any] = field(default_factory=dict)
    #: What the run is called in reports (a policy name), if anything.
    policy: str | None = None
    #: How the harness spreads requests over several URLs (``None``: one URL).
    dispatch: str | None = None
    slo: Slo = field(default_factory=Slo)
    timeout: float = DEFAULT_TIMEOUT
    max_requests: int | None = None
    #: Who sends the requests, as which API keys (``None``: no key, one stream).
    clients: Population | None = None

    def requests(self) -> list[Request]:
        """The workload: the same for the same workload, seed, rate, duration and arguments."""
        return self.traffic()[0]

    def traffic(self) -> tuple[list[Request], list[Sender] | None]:
        """The workload and, with ``clients``, who sends each request (each client group's
        stream the same whatever the others send)."""
        senders: list[Sender] | None = None
        if self.clients is None:
            reqs = generate(self.workload, self.seed, self.rate, self.duration,
                            **self.workload_args)
        else:
            reqs, senders = self.clients.traffic(self.workload, self.seed, self.rate,
                                                 self.duration, **self.workload_args)
        if self.max_requests is not None:
            reqs = reqs[: self.max_requests]
            senders = senders[: self.max_requests] if senders is not None else None
        return reqs, senders

    def to_json(self) -> dict[str, Any]:
        """The ``spec`` part of the result file (without the environment)."""
        return {
            "workload": self.workload, "rate": self.rate, "duration": self.duration,
            "seed": self.seed, "warmup": self.warmup, "workload_args": self.workload_args,
            "policy": self.policy, "urls": list(self.urls), "dispatch": self.dispatch,
            "slo": {"ttft_s": self.slo.ttft, "tpot_s": self.slo.tpot},
            "timeout": self.timeout, "max_requests": self.max_requests,
            "clients": self.clients.to_json() if self.clients is not None else None,
        }


async def execute(reactor: IReactorTime, spec: RunSpec, requests: Sequence[Request] | None = None,
                  extra: dict[str, Any] | None = None, label: str = "",
                  started: Callable[[OpenLoop], None] | None = None,
                  senders: Sequence[Sender] | None = None,
                  available: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """Run ``spec`` (or the caller's ``requests`` and ``senders``) on ``reactor``; the result
    document. ``extra`` joins the spec (the fleet); ``started`` sees the run begin (to abort
    it, or schedule restarts); ``available`` skips base URLs that are down (``OpenLoop``)."""
    if requests is None:
        reqs, senders = spec.traffic()
    else:
        reqs = list(requests)
    env = environment()
    loop = OpenLoop(reactor, reqs, spec.urls, dispatch=spec.dispatch or "round-robin",
                    seed=spec.seed, timeout=spec.timeout, warmup=spec.warmup, senders=senders,
                    available=available)
    progress = Progress(reactor, loop, len(reqs), spec.duration, label)
    if started is not None:
        started(loop)
    cpu = time.process_time()
    progress.start()
    try:
        records = await loop.run()
    finally:
        progress.stop()
    summary = summarize(records, spec.duration, spec.warmup, spec.slo)
    summary["cpu_s"] = {"harness": round(time.process_time() - cpu, 3)}
    return result_document({**spec.to_json(), **(extra or {}), **env}, records, summary)


def describe(summary: dict[str, Any]) -> str:
    """A few lines for the terminal."""
    def ms(d: dict[str, Any], key: str) -> str:
        return "-" if d.get(key) is None else f"{d[key] * 1000:.0f}"

    def num(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    t, p, e = summary["ttft_s"], summary["tpot_s"], summary["e2e_s"]
    lines = [
        f"{summary['counted']} counted ({summary['warmup_requests']} warm-up), "
        f"{summary['ok']} ok, errors {summary['errors'] or 'none'}",
        f"TTFT ms p50 {ms(t, 'p50')} p90 {ms(t, 'p90')} p99 {ms(t, 'p99')}; "
        f"TPOT ms p50 {ms(p, 'p50')} p99 {ms(p, 'p99')}; e2e ms p50 {ms(e, 'p50')} "
        f"p99 {ms(e, 'p99')}",
        f"throughput {num(summary['throughput_rps'], '.2f')} req/s, goodput "
        f"{num(summary['goodput_rps'], '.2f')} req/s, hit rate "
        f"{num(summary['hit_rate'], '.3f')}, busiest engine share "
        f"{num(summary['busiest_share'], '.2f')}, send lag p99 "
        f"{ms(summary['send_lag_s'], 'p99')} ms",
    ]
    return "\n".join(lines)


def workload_args(pairs: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as generator keyword arguments: a value is JSON when it parses (``cv=4``,
    ``prompt_tokens=[50,100]``: lists become ranges), else a string (``arrivals=gamma``)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"not KEY=VALUE: {pair!r}")
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        out[key.replace("-", "_")] = tuple(value) if isinstance(value, list) else value
    return out


def add_workload_options(p: argparse.ArgumentParser) -> None:
    """The options ``run`` and ``compare`` share."""
    p.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    p.add_argument("--duration", type=float, required=True, help="seconds of offered load")
    p.add_argument("--warmup", type=float, default=None,
                   help="seconds at the start whose requests are sent but not counted")
    p.add_argument("--workload-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="a workload generator argument (repeatable), e.g. arrivals=gamma, "
                        "cv=4, prompt_tokens=[2000,8000]")
    p.add_argument("--slo-ttft", type=float, default=DEFAULT_SLO_TTFT,
                   help=f"goodput bound on TTFT, seconds (default {DEFAULT_SLO_TTFT})")
    p.add_argument("--slo-tpot", type=float, default=DEFAULT_SLO_TPOT,
                   help=f"goodput bound on time per output token, seconds "
                        f"(default {DEFAULT_SLO_TPOT})")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help="seconds after its scheduled time a request is cancelled and counted "
                        f"as a timeout; a run ends at most this long after its last send "
                        f"(default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--max-requests", type=int, default=None,
                   help="send only the first N requests of the workload")
    p.add_argument("--clients", type=Path, default=None, metavar="FILE",
                   help="send the workload as several API keys: a YAML file of client groups "
                        "(share of --rate, keys, weight, tenant; see pharos.bench.clients); "
                        "records and the summary are split by group")


def parser() -> argparse.ArgumentParser:
    """The ``run`` arguments."""
    p = argparse.ArgumentParser(
        prog="pharos bench run",
        description="Send a seeded workload open loop (each request at its scheduled time) "
                    "and write one result file.")
    p.add_argument("--url", action="append", required=True,
                   help="base URL of Pharos, or of an engine (repeat with --dispatch)")
    add_workload_options(p)
    p.add_argument("--rate", type=float, required=True, help="mean requests per second")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--policy-label", default=None, help="what reports call this run")
    p.add_argument("--dispatch", choices=DISPATCH, default=None,
                   help="with several --url: how the harness spreads requests over them")
    p.add_argument("--out", type=Path, required=True, help="the result file to write")
    return p


def drive(reactor: IReactorCore, job: Callable[[], Deferred[int]]) -> int:
    """Run ``job`` on ``reactor`` until it ends (or Ctrl-C); its exit code (1 on a crash)."""
    code = [1]

    def go() -> None:
        d = job()

        def done(result: int | Failure) -> None:
            if isinstance(result, Failure):
                result.printTraceback(file=sys.stderr)
            else:
                code[0] = result
            with contextlib.suppress(ReactorNotRunning):  # stopping already (a signal)
                reactor.stop()

        d.addBoth(done)

    reactor.callWhenRunning(go)
    reactor.run()
    return code[0]


def load_clients(path: Path) -> Population:
    """The clients file at ``path``; ValueError names the file and what is wrong with it."""
    try:
        return load(path)
    except (OSError, yaml.YAMLError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None


def main_run(argv: Sequence[str], reactor: IReactorCore) -> int:
    """``pharos bench run ...`` on ``reactor`` (the console script passes the global one)."""
    a = parser().parse_args(argv)
    if len(a.url) > 1 and a.dispatch is None:
        parser().error("several --url need --dispatch (round-robin, random or prefix-aware)")
    try:
        kw = workload_args(a.workload_arg)
    except ValueError as e:
        parser().error(str(e))
    spec = RunSpec(
        workload=a.workload, rate=a.rate, duration=a.duration, seed=a.seed,
        urls=tuple(a.url), warmup=a.warmup or 0.0, workload_args=kw,
        policy=a.policy_label or a.dispatch, dispatch=a.dispatch,
        slo=Slo(a.slo_ttft, a.slo_tpot), timeout=a.timeout, max_requests=a.max_requests)
    try:
        if a.clients is not None:
            spec = replace(spec, clients=load_clients(a.clients))
        requests, senders = spec.traffic()
    except (TypeError, ValueError) as e:
        print(f"pharos bench run: {e}", file=sys.stderr)
        return 2

    async def job() -> int:
        doc = await execute(IReactorTime(reactor), spec, requests, label=a.workload,
                            senders=senders)
        write_result(a.out, doc)
        print(describe(doc["summary"]))
        print(f"wrote {a.out}")
        return 0

    return drive(reactor, lambda: Deferred.fromCoroutine(job()))
