"""``pharos bench placement``: model placement on simulated multi-model fleets.

Virtual time, not loopback: each host is an engine double's behaviour model without sockets
(the Ollama-like ``SlotModel``, or the llama-swap-like one swapping in arrival order), its
status bodies rendered by the double's flavor, and Pharos's real ``State`` and ``Scheduler``
polling and routing them, all on one ``Clock``: the same seed gives the same run anywhere.

Each ``multi-model`` request (Zipf popularity) takes a lease at its time (one fair-queue key),
runs on the leased host's model, and releases the lease with the sample the proxy would build.
TTFT is from arrival to first token.

Policies: ``cost`` (placement on), the baselines ``random`` and ``round-robin`` (only the
decision differs), and ``loaded-first``, NOMYO router's rule, dispatched by the harness
straight to the engines: the least busy host with the model loaded and a free slot, else the
least busy host, reading residency exactly (only helping it); Pharos has no such policy.

Counted per run: requests served, cold loads (swaps included), TTFT percentiles overall and
per model, and every ``SAMPLE_SEC`` the hosts each model is loaded on.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from pharos.bench.workloads import Request, multi_model
from pharos.config import Backend as BackendSpec
from pharos.engine.fetch import Fetched
from pharos.engine.library import LLAMASWAP, OLLAMA
from pharos.placement import ReplicaRule
from pharos.policy import PolicyConfig
from pharos.sched import Guards, Lease, RouteSettings, SchedRequest, Scheduler
from pharos.sim.double import EngineDouble
from pharos.sim.model import (
    DEFAULT_DECODE_S,
    DEFAULT_PREFILL_S,
    LOADED,
    LOADING,
    UNLOAD,
    GenRequest,
    Job,
)
from pharos.sim.slots import SlotModel
from pharos.state.state import State
from pharos.state.stats import Sample

#: Pharos's policies the benchmark runs, then the harness's NOMYO-style dispatch.
PHAROS_POLICIES = ("cost", "random", "round-robin")
HARNESS_POLICIES = ("loaded-first",)
POLICIES = (*PHAROS_POLICIES, *HARNESS_POLICIES)
#: Seconds between samples of where each model is loaded.
SAMPLE_SEC = 5.0
#: Seconds of virtual time after the last arrival for the queue to drain.
DRAIN_SEC = 600.0
GB = 1_000_000_000


@dataclass(frozen=True)
class FleetConfig:
    """One fleet and its traffic. ``kind``: ``ollama`` (hosts with ``memory_gb`` each, models
    of ``model_gb``) or ``llama-swap`` (one model at a time, whatever the memory)."""

    hosts: int = 3
    models: int = 8
    kind: str = OLLAMA
    model_gb: float = 4.0
    memory_gb: float = 8.0
    slots: int = 2
    load_s: float = 3.0
    rate: float = 1.2
    requests: int = 1000
    exponent: float = 1.1
    #: Ollama's default keep-alive; llama-swap's default ttl is 0 (never unloads by itself).
    keep_alive: float | None = 300.0
    output_tokens: tuple[int, int] = (50, 300)
    #: Time compression: load, prefill, decode and keep-alive ``compress`` times shorter, the
    #: rate ``compress`` times higher (TTFTs come out that much shorter): the real-time
    #: cross-check's fleet (``pharos bench compare`` with the same engine arguments).
    compress: float = 1.0
    #: Pharos is told each host's ``memory_gb`` (False: residency only, no fit check, as
    #: ``pharos bench compare``'s config has it).
    pharos_memory: bool = True

    @property
    def name(self) -> str:
        extra = "" if self.compress == 1 else f"-x{self.compress:g}"
        if not self.pharos_memory and self.kind == OLLAMA:
            extra += "-nomem"
        return f"{self.kind}-{self.hosts}h-{self.models}m{extra}"

    @property
    def resident(self) -> int:
        """Model copies the fleet holds at once."""
        per_host = 1 if self.kind == LLAMASWAP else int(self.memory_gb // self.model_gb)
        return self.hosts * per_host


@dataclass
class RunResult:
    """One run: counts, TTFTs and the placement over time."""

    config: str
    policy: str
    seed: int
    requests: int
    served: int
    loads: int
    ttft: list[float | None]  # by arrival index; None: never served
    models: list[str]  # by arrival index
    #: (time, {model: hosts it is loaded on}) every SAMPLE_SEC.
    placement: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    #: Requests Pharos dispatched to a target it saw cold (None: the harness's dispatch).
    cold_dispatches: int | None = None
    #: Victims Pharos named before a cold load (``Lease.unload``; None: harness dispatch).
    unloads: int | None = None

    @property
    def loads_per_1000(self) -> float:
        return 1000.0 * self.loads / self.requests

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class _Host:
    """A simulated engine without sockets: its model, its flavor's status bodies."""

    def __init__(self, url: str, cfg: FleetConfig, clock: Clock, names: Sequence[str],
                 seed: int) -> None:
        self.url = url
        size = int(cfg.model_gb * GB)
        memory = (size if cfg.kind == LLAMASWAP else int(cfg.memory_gb * GB))
        k = cfg.compress
        self.double = EngineDouble(
            cfg.kind, clock, models=dict.fromkeys(names, size), slots=cfg.slots, seed=seed,
            load_s=cfg.load_s / k, host_memory=memory,
            keep_alive=None if cfg.keep_alive is None else cfg.keep_alive / k,
            decode_s=DEFAULT_DECODE_S / k, prefill_s=DEFAULT_PREFILL_S / k)
        self.inflight: Counter[str] = Counter()

    @property
    def model(self) -> SlotModel:
        m = self.double.model
        assert isinstance(m, SlotModel)
        return m

    def fetch(self, path: str) -> Deferred[Fetched]:
        rec = self.double.flavor.get(path, self.double.model.status())
        return succeed(Fetched(rec.status, rec.content_type, rec.body))

    def loaded(self) -> set[str]:
        return {m.name for m in self.double.model.status().models
                if m.state in (LOADED, LOADING)}


class _Listener:
    """A request's reply as the proxy sees it: first token, end."""

    def __init__(self, on_first: Callable[[Job], None], on_done: Callable[[Job], None]) -> None:
        self.on_first = on_first
        self.on_done = on_done
        self.first = False

    def token(self, job: Job, index: int, text: str, last: bool) -> None:
        if not self.first:
            self.first = True
            self.on_first(job)

    def done(self, job: Job) -> None:
        self.on_done(job)


def workload(cfg: FleetConfig, seed: int) -> list[Request]:
    """The run's requests: ``multi-model`` at ``cfg.rate``, the first ``cfg.requests``."""
    rate = cfg.rate * cfg.compress
    duration = cfg.requests / rate * 1.2 + 10
    reqs = multi_model(seed, rate, duration, models=cfg.models, exponent=cfg.exponent,
                       output_tokens=cfg.output_tokens)
    return reqs[: cfg.requests]


def _prompt(r: Request) -> bytes:
    return "\n".join(str(m["content"]) for m in r.messages).encode()


def run_one(cfg: FleetConfig, policy: str, seed: int, *,
            rule: ReplicaRule | None = None) -> RunResult:
    """One run of ``policy`` on a fresh fleet of ``cfg`` with the workload of ``seed``."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
    clock = Clock()
    reqs = workload(cfg, seed)
    names = [f"model-{m}" for m in range(cfg.models)]
    hosts = [_Host(f"http://host-{i}:11434", cfg, clock, names, seed * 100 + i)
             for i in range(cfg.hosts)]
    by_url = {h.url: h for h in hosts}
    rng = random.Random(f"pharos.bench.placement:{seed}")
    ttft: list[float | None] = [None] * len(reqs)
    state: State | None = None
    sched: Scheduler | None = None
    if policy in PHAROS_POLICIES:
        state = State(clock, None, rng=rng.random, fetcher_for=lambda spec: by_url[spec.url])
        sched = Scheduler(state, RouteSettings(PolicyConfig(name=policy),  # type: ignore[arg-type]
                                         Guards(placement=rule or ReplicaRule())),
                          seed=lambda: rng.getrandbits(63))
        state.on_round = lambda b: sched.kick() if sched is not None else None
        state.set_backends([
            BackendSpec(url=h.url, kind=cfg.kind, capacity=cfg.slots,  # type: ignore[arg-type]
                        memory_gb=cfg.memory_gb if cfg.kind == OLLAMA and cfg.pharos_memory
                        else None)
            for h in hosts])
        state.service.startService()
        clock.advance(1.0)  # the first round: catalogues known
    start = clock.seconds()
    cold = 0
    unload_models = [0]

    def submit(host: _Host, i: int, on_first: Callable[[Job], None],
               on_done: Callable[[Job], None]) -> None:
        r = reqs[i]
        host.inflight[r.model] += 1
        host.double.model.submit(GenRequest(r.model, _prompt(r), r.max_tokens),
                                 _Listener(on_first, on_done))

    def through_pharos(i: int) -> None:
        assert sched is not None
        r = reqs[i]
        prompt = _prompt(r)
        d = sched.acquire("k", 1, SchedRequest(r.model, max(1, len(prompt) // 4),
                                               rng.getrandbits(63), output_tokens=r.max_tokens))

        def granted(lease: Lease) -> None:
            nonlocal cold
            cold += lease.cold
            host = by_url[lease.target.backend.spec.url]
            granted_at = clock.seconds()

            def first(job: Job) -> None:
                ttft[i] = clock.seconds() - (start + r.at)
                lease.first_byte()

            def done(job: Job) -> None:
                host.inflight[r.model] -= 1
                lease.release(Sample(
                    ok=True, dispatched_cold=lease.cold,
                    ttft_sec=(job.first_token_at or clock.seconds()) - granted_at,
                    duration_sec=clock.seconds() - granted_at,
                    prompt_tokens=job.prompt_tokens, cached_tokens=job.cached_tokens,
                    prompt_eval_sec=job.prefill_seconds,
                    load_sec=job.load_seconds if cfg.kind == OLLAMA else None,
                    prefill_window_sec=lease.prefill_window_sec))

            for victim in lease.unload:  # what the proxy asks before sending (Ollama)
                unload_models[0] += 1
                host.double.model.submit(GenRequest(victim, control=UNLOAD, keep_alive=0.0),
                                         _Listener(lambda job: None, lambda job: None))
            submit(host, i, first, done)

        d.addCallback(granted)

    def loaded_first(i: int) -> None:
        r = reqs[i]
        busy = {h.url: sum(h.inflight.values()) for h in hosts}
        warm = [h for h in hosts if r.model in h.loaded() and h.inflight[r.model] < cfg.slots]
        pool = warm or hosts
        low = min(busy[h.url] for h in pool)
        host = rng.choice([h for h in pool if busy[h.url] == low])

        def first(job: Job) -> None:
            ttft[i] = clock.seconds() - (start + r.at)

        def done(job: Job) -> None:
            host.inflight[r.model] -= 1

        submit(host, i, first, done)

    arrive = through_pharos if sched is not None else loaded_first
    for i, r in enumerate(reqs):
        clock.callLater(r.at, arrive, i)
    placement: list[tuple[float, dict[str, int]]] = []

    def sample() -> None:
        counts = dict.fromkeys(names, 0)
        for h in hosts:
            for m in h.loaded():
                counts[m] += 1
        placement.append((round(clock.seconds() - start, 3), counts))
        clock.callLater(SAMPLE_SEC, sample)

    sample()
    end = start + (reqs[-1].at if reqs else 0.0) + DRAIN_SEC
    while clock.calls and clock.seconds() < end:
        if all(t is not None for t in ttft) and clock.seconds() > start + reqs[-1].at + 60:
            break
        clock.advance(max(0.0, clock.calls[0].getTime() - clock.seconds()))
    if state is not None:
        state.service.stopService()
    for h in hosts:
        h.double.model.stop()
    return RunResult(cfg.name, policy, seed, len(reqs), sum(t is not None for t in ttft),
                     sum(h.model.loads for h in hosts), ttft, [r.model for r in reqs],
                     placement, cold if sched is not None else None,
                     unload_models[0] if sched is not None else None)


# -- the report ------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank); None without values."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def tail_models(cfg: FleetConfig) -> list[str]:
    """The models a perfect placement would not keep resident: popularity rank at or past
    the fleet's resident copies (model-0 is the most popular)."""
    return [f"model-{m}" for m in range(min(cfg.resident, cfg.models), cfg.models)]


def summarize(cfg: FleetConfig, run: RunResult) -> dict[str, Any]:
    """One run's figures: loads per 1,000, p50/p95 TTFT, tail models' p95 and fair wait
    (one load on top of the resident models' p95: ``load_s + p95(head)``)."""
    served = [t for t in run.ttft if t is not None]
    tails = set(tail_models(cfg))
    pairs = [(t, m) for t, m in zip(run.ttft, run.models, strict=True) if t is not None]
    head = [t for t, m in pairs if m not in tails]
    tail = [t for t, m in pairs if m in tails]
    head95 = pct(head, 0.95)
    fair = None if head95 is None else cfg.load_s / cfg.compress + head95
    return {
        "config": run.config, "policy": run.policy, "seed": run.seed,
        "requests": run.requests, "served": run.served, "loads": run.loads,
        "cold_dispatches": run.cold_dispatches, "unloads": run.unloads,
        "loads_per_1000": run.loads_per_1000,
        "p50": pct(served, 0.5), "p95": pct(served, 0.95),
        "tail_requests": len(tail), "tail_p95": pct(tail, 0.95), "tail_fair": fair,
    }


def goals(cfg: FleetConfig, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The placement goals over the seeds (medians of each run's figure): cost's loads per
    1,000 at most 1/5 of random's, p95 at most half the best baseline's, p50 no worse than
    the best baseline's, tail p95 within 2x of the fair wait."""
    def med(policy: str, key: str) -> float | None:
        vals = [r[key] for r in rows if r["policy"] == policy and r[key] is not None]
        return statistics.median(vals) if vals else None

    by = {p: {k: med(p, k) for k in ("loads_per_1000", "p50", "p95", "tail_p95", "tail_fair")}
          for p in POLICIES if any(r["policy"] == p for r in rows)}
    cost = by.get("cost", {})
    baselines = [p for p in by if p != "cost"]
    p95s = [v for p in baselines if (v := by[p]["p95"]) is not None]
    p50s = [v for p in baselines if (v := by[p]["p50"]) is not None]
    best95 = min(p95s) if p95s else None
    best50 = min(p50s) if p50s else None

    def ok(a: float | None, b: float | None) -> bool | None:
        return None if a is None or b is None else a <= b

    rnd = by.get("random", {}).get("loads_per_1000")
    fair = cost.get("tail_fair")
    return {
        "config": cfg.name, "medians": by,
        "loads": {"cost": cost.get("loads_per_1000"), "limit": None if rnd is None else rnd / 5,
                  "met": ok(cost.get("loads_per_1000"), None if rnd is None else rnd / 5)},
        "p95": {"cost": cost.get("p95"), "limit": None if best95 is None else best95 / 2,
                "met": ok(cost.get("p95"), None if best95 is None else best95 / 2)},
        "p50": {"cost": cost.get("p50"), "limit": best50, "met": ok(cost.get("p50"), best50)},
        "tail": {"cost": cost.get("tail_p95"), "limit": None if fair is None else 2 * fair,
                 "met": ok(cost.get("tail_p95"), None if fair is None else 2 * fair)},
    }


# -- the chart: hosts per model over time, an SVG written by hand ------------------------------

_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf")


def chart_svg(runs: Sequence[RunResult], hosts: int, title: str) -> str:
    """One panel per run (a policy each): hosts each model is loaded on, every SAMPLE_SEC,
    as stacked strips (a strip per model, its height the hosts holding it)."""
    if not runs:
        return ""
    models = sorted({m for r in runs for _, c in r.placement for m in c},
                    key=lambda n: int(n.rsplit("-", 1)[1]) if n.rsplit("-", 1)[1].isdigit()
                    else 0)
    pw, ph, left, top, gap = 760, 26 * len(models), 110, 40, 50
    width = left + pw + 20
    height = top + len(runs) * (ph + gap) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="20" font-size="14">{_esc(title)}</text>']
    tmax = max((r.placement[-1][0] for r in runs if r.placement), default=1.0) or 1.0
    for k, run in enumerate(runs):
        y0 = top + k * (ph + gap)
        out.append(f'<text x="{left}" y="{y0 - 6}" font-size="12">{_esc(run.policy)} '
                   f'(seed {run.seed}): {run.loads} loads, '
                   f'{run.loads_per_1000:.0f} per 1,000 requests</text>')
        band = ph / len(models)
        for j, m in enumerate(models):
            yb = y0 + (j + 1) * band
            out.append(f'<text x="{left - 6}" y="{yb - band / 3:.1f}" text-anchor="end">'
                       f'{_esc(m)}</text>')
            out.append(f'<line x1="{left}" x2="{left + pw}" y1="{yb:.1f}" y2="{yb:.1f}" '
                       f'stroke="#ddd"/>')
            pts = run.placement
            for (t, c), nxt in zip(pts, [*pts[1:], None], strict=True):
                n = c.get(m, 0)
                if not n:
                    continue
                t1 = nxt[0] if nxt is not None else t + SAMPLE_SEC
                x = left + pw * t / tmax
                w = max(0.5, pw * (t1 - t) / tmax)
                h = band * 0.9 * n / max(1, hosts)
                out.append(f'<rect x="{x:.1f}" y="{yb - h:.1f}" width="{w:.1f}" '
                           f'height="{h:.1f}" fill="{_COLOURS[j % len(_COLOURS)]}"/>')
        out.append(f'<text x="{left + pw}" y="{y0 + ph + 14}" text-anchor="end">'
                   f'{tmax:.0f} s</text>')
        out.append(f'<text x="{left}" y="{y0 + ph + 14}">0 s (strip height: hosts holding '
                   f'the model, full = {hosts})</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# -- the command -----------------------------------------------------------------------------


def _fmt(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _mark(met: bool | None) -> str:
    return "?" if met is None else ("met" if met else "MISSED")


def goals_table(gs: Sequence[dict[str, Any]]) -> str:
    """The goals per config as a Markdown table."""
    lines = ["| config | loads/1000 cost (limit: random/5) | p95 s cost (limit: best "
             "baseline/2) | p50 s cost (limit: best baseline) | tail p95 s cost (limit: 2x "
             "fair) |", "|---|---|---|---|---|"]
    for g in gs:
        cells = []
        for key, nd in (("loads", 0), ("p95", 2), ("p50", 2), ("tail", 2)):
            v = g[key]
            cells.append(f"{_fmt(v['cost'], nd)} ({_fmt(v['limit'], nd)}) {_mark(v['met'])}")
        lines.append(f"| {g['config']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def medians_table(gs: Sequence[dict[str, Any]]) -> str:
    """Every policy's medians over the seeds."""
    lines = ["| config | policy | loads/1000 | p50 s | p95 s | tail p95 s |",
             "|---|---|---|---|---|---|"]
    for g in gs:
        for p, v in g["medians"].items():
            lines.append(f"| {g['config']} | {p} | {_fmt(v['loads_per_1000'], 0)} | "
                         f"{_fmt(v['p50'])} | {_fmt(v['p95'])} | {_fmt(v['tail_p95'])} |")
    return "\n".join(lines) + "\n"


def run_grid(cfg: FleetConfig, seeds: Sequence[int], policies: Sequence[str], out: Path | None,
             log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Every policy on every seed (seed outer, policy inner); writes ``out/<config>/`` (runs,
    summary rows, goals, chart of the first seed) when ``out`` is given."""
    rows: list[dict[str, Any]] = []
    first: list[RunResult] = []
    for seed in seeds:
        for policy in policies:
            run = run_one(cfg, policy, seed)
            row = summarize(cfg, run)
            rows.append(row)
            log(f"{cfg.name} seed {seed} {policy}: served {run.served}/{run.requests}, "
                f"{run.loads} loads ({run.loads_per_1000:.0f}/1000), p50 {_fmt(row['p50'])} "
                f"p95 {_fmt(row['p95'])} tail p95 {_fmt(row['tail_p95'])}")
            if seed == seeds[0]:
                first.append(run)
            if out is not None:
                d = out / cfg.name / "runs"
                d.mkdir(parents=True, exist_ok=True)
                (d / f"{policy}-seed{seed}.json").write_text(json.dumps(run.to_json()) + "\n")
    g = goals(cfg, rows)
    if out is not None:
        d = out / cfg.name
        (d / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
        (d / "goals.json").write_text(json.dumps({"fleet": asdict(cfg), **g}, indent=1) + "\n")
        (d / "hosts-per-model.svg").write_text(chart_svg(
            first, cfg.hosts, f"{cfg.name}: hosts holding each model over time, seed "
                              f"{seeds[0]}"))
    return {"rows": rows, "goals": g}


def main_placement(argv: Sequence[str]) -> int:
    """``pharos bench placement [--hosts N] [--models M] [--kind K] [--seeds 1,2] [--out D]``."""
    p = argparse.ArgumentParser(prog="pharos bench placement", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--models", type=int, default=8)
    p.add_argument("--kind", choices=(OLLAMA, LLAMASWAP), default=OLLAMA)
    p.add_argument("--memory-gb", type=float, default=8.0, help="per host (ollama)")
    p.add_argument("--model-gb", type=float, default=4.0)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--load-s", type=float, default=3.0)
    p.add_argument("--rate", type=float, default=1.2)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--exponent", type=float, default=1.1, help="Zipf exponent of popularity")
    p.add_argument("--compress", type=float, default=1.0,
                   help="load, prefill, decode and keep-alive this many times shorter, the "
                        "rate this many times higher (the real-time cross-check's fleet)")
    p.add_argument("--no-pharos-memory", action="store_true",
                   help="do not tell Pharos the hosts' memory_gb (as bench compare does not)")
    p.add_argument("--seeds", default="1,2,3,4,5")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    try:
        seeds = [int(s) for s in a.seeds.split(",") if s]
    except ValueError:
        p.error("--seeds: comma-separated integers")
    policies = [s for s in a.policies.split(",") if s]
    for pol in policies:
        if pol not in POLICIES:
            p.error(f"--policies: unknown {pol!r} (known: {', '.join(POLICIES)})")
    if not seeds or a.hosts < 1 or a.models < 1 or a.requests < 1 or a.slots < 1:
        p.error("--seeds, --hosts, --models, --requests and --slots need at least one")
    cfg = FleetConfig(hosts=a.hosts, models=a.models, kind=a.kind, model_gb=a.model_gb,
                      memory_gb=a.memory_gb, slots=a.slots, load_s=a.load_s, rate=a.rate,
                      requests=a.requests, exponent=a.exponent,
                      keep_alive=300.0 if a.kind == OLLAMA else None, compress=a.compress,
                      pharos_memory=not a.no_pharos_memory)
    if not a.compress > 0:
        p.error("--compress must be > 0")
    result = run_grid(cfg, seeds, policies, a.out, log=lambda s: print(s, file=sys.stderr))
    print(medians_table([result["goals"]]))
    print(goals_table([result["goals"]]))
    return 0
