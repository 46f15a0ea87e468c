"""Trace one ``pharos bench placement`` run: every engine load, what it evicted, what Pharos
priced, and whether the load was avoidable in hindsight (issue 15 item 5: why 2 hosts cost
389 loads per 1,000 against a floor near 190).

    PYTHONPATH=. .venv/bin/python contrib/bench/placement-2026-12-02c/trace_placement.py \
        --hosts 2 --models 8 --seed 1 [--policy cost] [--events trace.jsonl]

The run is ``pharos.bench.placement.run_one`` itself (same fleet, same requests, virtual
time); the harness's engine hosts and the scheduler are subclassed only to record: each
engine's ``_try_load`` (a load started, the idle models it unloaded, every host's residency
just before) and ``_unload`` outside a load (keep-alive expiry), and the scheduler's
``on_route`` (each granted request's decision: target, cold or warm, the victims and reload
price of every cold candidate, holds, the reason). Recording reads the decision's reason,
which is built lazily from the same pick: it changes nothing the run does.

Each engine load is classified: ``first`` (the model's first load in the run), ``replica``
(loaded on another host at the time), ``after-eviction`` (its last unload was a victim of an
earlier load; that load is charged), ``after-expiry``. Each eviction is judged against the
victim's next request (from the run's arrivals) and against the alternatives Pharos had: the
victim Ollama would have unloaded on each other host with an idle model (its least recently
used idle one) and any idle model in the fleet (Belady: the one requested last).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from twisted.internet.task import Clock

import pharos.bench.placement as bp
from pharos.placement import ReplicaRule
from pharos.sched import Placement, SchedRequest
from pharos.sim.model import COLD

Event = dict[str, Any]


class Tracer:
    """What one run did, as events in time order."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.hosts: list[Any] = []
        self.clock: Clock | None = None

    def fleet(self) -> dict[str, list[tuple[str, str, bool, float]]]:
        """Every host's resident models now: (name, state, idle, last_used)."""
        out = {}
        for h in self.hosts:
            out[h.url] = [(m.name, m.state, m.idle, m.last_used)
                          for m in h.model._models.values() if m.state != COLD]
        return out

    def now(self) -> float:
        assert self.clock is not None
        return self.clock.seconds()


def install(tr: Tracer) -> None:
    """Subclass the harness's host and scheduler (module globals ``run_one`` reads)."""
    base_host, base_sched = bp._Host, bp.Scheduler

    class Host(base_host):  # type: ignore[misc,valid-type]
        def __init__(self, url: str, cfg: bp.FleetConfig, clock: Clock, names: Sequence[str],
                     seed: int) -> None:
            super().__init__(url, cfg, clock, names, seed)
            tr.clock = clock
            tr.hosts.append(self)
            m = self.model
            orig_try, orig_unload = m._try_load, m._unload
            evicting: list[list[str]] = []

            def try_load(mm: Any) -> None:
                before, snapshot = m.loads, tr.fleet()
                evicting.append([])
                try:
                    orig_try(mm)
                finally:
                    ev = evicting.pop()
                if m.loads > before:
                    tr.events.append({"kind": "load", "t": tr.now(), "host": url,
                                      "model": mm.name, "evicted": ev, "fleet": snapshot})

            def unload(mm: Any) -> None:
                if evicting:
                    evicting[-1].append(mm.name)
                else:
                    tr.events.append({"kind": "expire", "t": tr.now(), "host": url,
                                      "model": mm.name})
                orig_unload(mm)

            m._try_load = try_load
            m._unload = unload

    class Sched(base_sched):  # type: ignore[misc,valid-type]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.on_route = self._trace

        def _trace(self, req: SchedRequest, placed: Placement) -> None:
            d = placed.decision
            targets = self.state.targets
            cands = []
            for c, terms in zip(d.candidates, d.score_terms, strict=True):
                t = targets[c.target_id]
                cands.append({"host": t.backend.url, "cold": placed.cold[c.target_id],
                              "free": c.free_slots, "held": c.held, "victims": list(c.victims),
                              "reload": c.reload_sec, "est": terms[1],
                              "fits": c.fits_if_cold})
            win = targets[d.target_id] if d.target_id is not None else None
            tr.events.append({
                "kind": "route", "t": tr.now(), "model": req.model,
                "host": win.backend.url if win is not None else None,
                "cold": placed.cold.get(d.target_id, False) if d.target_id is not None
                else None, "reason": d.reason, "cands": cands})

    bp._Host = Host  # type: ignore[misc]
    bp.Scheduler = Sched  # type: ignore[misc]


def next_after(times: dict[str, list[float]], model: str, t: float) -> float:
    """Seconds from ``t`` to the next arrival of ``model`` (inf: none)."""
    ts = times.get(model, [])
    i = bisect_right(ts, t)
    return ts[i] - t if i < len(ts) else math.inf


def lru_idle(residents: list[list[Any]]) -> str | None:
    """The model Ollama would unload first on a full host: its least recently used idle one."""
    idle = [r for r in residents if r[2] and r[1] == "loaded"]
    return min(idle, key=lambda r: r[3])[0] if idle else None


def analyse(cfg: bp.FleetConfig, seed: int, tr: Tracer, start: float) -> dict[str, Any]:
    """The loads classified and the evictions judged (see the module docstring)."""
    reqs = bp.workload(cfg, seed)
    times: dict[str, list[float]] = defaultdict(list)
    for r in reqs:
        times[r.model].append(start + r.at)
    rank = {f"model-{i}": i for i in range(cfg.models)}
    per_host = 1 if cfg.kind == "llama-swap" else int(cfg.memory_gb // cfg.model_gb)
    by_model: Counter[int] = Counter()
    loads = [e for e in tr.events if e["kind"] == "load"]
    routes = [e for e in tr.events if e["kind"] == "route"]
    last_unload: dict[tuple[str, str], tuple[str, int | None, float]] = {}
    ever: set[str] = set()
    classes: Counter[str] = Counter()
    charged: Counter[int] = Counter()  # load index -> reloads of its victims it caused
    victims_rank: Counter[int] = Counter()
    gaps: list[float] = []
    regret_host = regret_fleet = evictions = 0
    regret_tie = 0
    forced = forced_soon = 0  # evictions where no other host could have loaded it
    priced: Counter[str] = Counter()
    replica_reasons: Counter[str] = Counter()
    route_by: dict[tuple[str, str], list[Event]] = defaultdict(list)
    for e in routes:
        if e["host"] is not None:
            route_by[(e["host"], e["model"])].append(e)
    reload_gap: list[float] = []
    idx_of: dict[int, int] = {}
    for i, e in enumerate(tr.events):
        if e["kind"] == "expire":
            last_unload[(e["host"], e["model"])] = ("expiry", None, e["t"])
            continue
        if e["kind"] != "load":
            continue
        li = len(idx_of)
        idx_of[i] = li
        m, h, t = e["model"], e["host"], e["t"]
        elsewhere = any(r[0] == m for u, rs in e["fleet"].items() if u != h for r in rs)
        # the model's last unload on any host
        prev = [v for (hh, mm), v in last_unload.items() if mm == m]
        prev_u = max(prev, key=lambda v: v[2]) if prev else None
        if m not in ever:
            cls = "first"
        elif elsewhere:
            cls = "replica"
        elif prev_u is not None and prev_u[0] == "eviction":
            cls = "after-eviction"
            assert prev_u[1] is not None
            charged[prev_u[1]] += 1
            reload_gap.append(t - prev_u[2])
        elif prev_u is not None:
            cls = "after-expiry"
        else:
            cls = "other"
        ever.add(m)
        classes[cls] += 1
        by_model[rank.get(m, -1)] += 1
        # Pharos's decision for it: the latest route to (host, model) at or before t
        rs = [r for r in route_by.get((h, m), []) if r["t"] <= t]
        rt = rs[-1] if rs else None
        if rt is None:
            priced["no route"] += 1
        elif not rt["cold"]:
            priced["routed as warm (unseen load)"] += 1
        else:
            won = next((c for c in rt["cands"] if c["host"] == h), None)
            pv = sorted(won["victims"]) if won else []
            priced["victims as priced" if pv == sorted(e["evicted"]) else
                   "victims differ from priced"] += 1
            if cls == "replica":
                reason = rt["reason"]
                replica_reasons["replica needed (demand)" if "replica needed" in reason else
                                "waited the bound" if "waited" in reason else
                                "cost (warm hosts held/full)"] += 1
        for v in e["evicted"]:
            evictions += 1
            last_unload[(h, v)] = ("eviction", li, t)
            victims_rank[rank.get(v, -1)] += 1
            gv = next_after(times, v, t)
            gaps.append(gv)
            alts = []
            for u, rs2 in e["fleet"].items():
                if u == h:
                    continue
                if len(rs2) < per_host:
                    alts.append(math.inf)  # room there: no victim at all
                elif (lv := lru_idle(rs2)) is not None:
                    alts.append(next_after(times, lv, t))
            if not alts:
                forced += 1
                forced_soon += gv <= 30
            if any(a > gv for a in alts):
                regret_host += 1
                if rt is not None and rt["cold"] and "tie within" in rt["reason"]:
                    regret_tie += 1
            idle_all = [r[0] for rs2 in e["fleet"].values() for r in rs2
                        if r[2] and r[1] == "loaded" and r[0] != v]
            if any(next_after(times, w, t) > gv for w in idle_all):
                regret_fleet += 1
    fin = [g for g in gaps if g != math.inf]
    cold_routes = [e for e in routes if e["cold"]]
    ties = sum(1 for e in cold_routes if "tie within" in e["reason"])
    held: Counter[str] = Counter()
    for e in routes:
        for c in e["cands"]:
            if c["held"]:
                held[c["held"].split(":")[0]] += 1
    return {
        "loads": len(loads), "classes": dict(classes),
        "loads_by_model_rank": {k: by_model[k] for k in sorted(by_model)},
        "evictions": evictions,
        "victims_by_rank": {k: victims_rank[k] for k in sorted(victims_rank)},
        "victim_next_request_s": {
            "median": statistics.median(fin) if fin else None,
            "within_10s": sum(g <= 10 for g in gaps), "within_30s": sum(g <= 30 for g in gaps),
            "within_60s": sum(g <= 60 for g in gaps)},
        "reload_after_eviction_gap_median_s": statistics.median(reload_gap)
        if reload_gap else None,
        "evictions_where_another_hosts_victim_was_needed_later": regret_host,
        "  of_them_decided_by_a_tie": regret_tie,
        "evictions_where_an_idle_model_in_the_fleet_was_needed_later": regret_fleet,
        "evictions_with_no_other_host_able_to_load": forced,
        "  of_them_victim_requested_within_30s": forced_soon,
        "pharos_view_of_each_load": dict(priced),
        "replica_loads_by_reason": dict(replica_reasons),
        "cold_routes": len(cold_routes), "cold_routes_decided_by_a_tie": ties,
        "holds_seen_on_candidates": dict(held),
        "loads_charged_per_evicting_load": dict(Counter(charged.values())),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--models", type=int, default=8)
    p.add_argument("--kind", default="ollama")
    p.add_argument("--rate", type=float, default=1.2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--policy", default="cost")
    p.add_argument("--events", default=None, help="write every event here (JSON lines)")
    p.add_argument("--replica-utilization", type=float, default=None,
                   help="routing.replica_utilization for this run (default: Pharos's)")
    a = p.parse_args()
    cfg = bp.FleetConfig(hosts=a.hosts, models=a.models, kind=a.kind, rate=a.rate,
                         keep_alive=300.0 if a.kind == "ollama" else None)
    tr = Tracer()
    install(tr)
    rule = (ReplicaRule() if a.replica_utilization is None
            else ReplicaRule(utilization=a.replica_utilization))
    run = bp.run_one(cfg, a.policy, a.seed, rule=rule)
    start = 1.0 if a.policy in bp.PHAROS_POLICIES else 0.0
    out = analyse(cfg, a.seed, tr, start)
    row = bp.summarize(cfg, run)
    print(json.dumps({"config": cfg.name, "policy": a.policy, "seed": a.seed,
                      "replica_utilization": rule.utilization,
                      "loads": run.loads, "cold_dispatches": run.cold_dispatches,
                      "p50": row["p50"], "p95": row["p95"], **out}, indent=1, default=str))
    if a.events:
        with open(a.events, "w") as f:
            for e in tr.events:
                f.write(json.dumps(e, default=str) + "\n")


if __name__ == "__main__":
    main()
