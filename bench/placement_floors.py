"""What no router can beat on ``pharos bench placement``'s fleets, from the traffic alone: the
"no router below" column of docs/performance.rst's placement table and the bounds stated
under it. Run from a checkout after ``make install`` (it reads the workload and the engine
model from ``pharos``; no engine, no network, a second of CPU)::

    .venv/bin/python bench/placement_floors.py    # a Markdown table on stdout

The ``multi-model`` workload draws each request's model independently (Zipf, exponent 1.1)
at Poisson arrivals, so a request finds its model in memory (loaded or loading) with
probability at most the share of the ``C`` most requested models, ``C`` being the copies the
fleet's memory holds, whatever the router did before (Poisson arrivals see time averages).
A request whose model is not in memory waits for a whole load (3 s) whether it is sent at
once or held. Hence:

* ``miss >=``: the fraction of requests that wait a whole load, at least ``1 - top-C share``.
  Over 5 % the p95 TTFT is at least the load time, held requests or not.
* ``loads >= (at arrival)``: a router sending every request on arrival starts a load for each
  such request: at least that many loads per 1,000 (holding requests back can share a load).
* ``A0``: the fewest loads per 1,000 expected of any router sending requests on arrival, with
  zero service time: the ``C - 1`` most requested models resident and one copy for the rest,
  the most recent (Aho, Denning and Ullman 1971: optimal for independent draws).
* ``A0 with service``: the most requested model's slot demand (its rate times the mean
  service, decode and prefill at the simulated engines' defaults, from the workload) needs
  ``demand / slots`` copies on average; a fluid estimate mixes A0 over the copies left for
  the others (``f`` of the time one copy fewer). An estimate, not a bound.
"""

from __future__ import annotations

import math
import statistics

from pharos.bench.placement import FleetConfig, workload
from pharos.engine.library import LLAMASWAP
from pharos.sim.model import DEFAULT_DECODE_S, DEFAULT_PREFILL_S

FLEETS = (FleetConfig(hosts=3, models=8), FleetConfig(hosts=2, models=8),
          FleetConfig(hosts=4, models=16), FleetConfig(kind=LLAMASWAP, hosts=3, models=8,
                                                       rate=0.6))


def shares(cfg: FleetConfig) -> list[float]:
    w = [1 / (m + 1) ** cfg.exponent for m in range(cfg.models)]
    return [x / sum(w) for x in w]


def a0(p: list[float], copies: int) -> float:
    """Expected misses per request of A0 over ``copies`` copies for the models ``p``."""
    if copies >= len(p):
        return 0.0
    rest = p[max(0, copies - 1):]
    q = sum(rest)
    return q - sum(x * x for x in rest) / q


def main() -> None:
    print("| fleet | C | top-C share | miss >= | loads >= (at arrival) | A0 | model-0 slot "
          "demand | A0 with service (estimate) |")
    print("|---|---|---|---|---|---|---|---|")
    for cfg in FLEETS:
        p = shares(cfg)
        c = cfg.resident
        top = sum(p[:c])
        service = statistics.mean(
            r.max_tokens * DEFAULT_DECODE_S
            + sum(len(str(m["content"])) for m in r.messages) / 4 * DEFAULT_PREFILL_S
            for seed in (1, 2, 3, 4, 5) for r in workload(cfg, seed))
        demand = p[0] * cfg.rate * service
        per_copy = cfg.slots
        need = demand / per_copy  # copies of model-0 on average
        extra = max(0.0, need - 1)
        whole = math.floor(extra)
        f = extra - whole
        others = p[1:]
        est = (1 - f) * a0(others, c - 1 - whole) + f * a0(others, c - 2 - whole) \
            if need > 1 else a0(p, c)
        print(f"| {cfg.name} | {c} | {top:.3f} | {1 - top:.3f} | {1000 * (1 - top):.0f} | "
              f"{1000 * a0(p, c):.0f} | {demand:.2f} slots ({need:.2f} copies) | "
              f"{1000 * est:.0f} |")


if __name__ == "__main__":
    main()
