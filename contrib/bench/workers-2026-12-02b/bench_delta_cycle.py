"""CPU of one peer tick, sender and receiver together, in one process (no HTTP): two
instances over the in-memory transport of the tests (``tests/support/peer_mesh.py``), 40
usage cells (20 keys, day and minute), 3 targets. ``busy``: each tick carries one new prefix op
(16 hashes) and one key's usage changed; ``idle``: nothing changed. Run with
``PYTHONPATH=TREE`` for each code tree; prints JSON (ms per tick, best of ``--repeat``)."""

from __future__ import annotations

import argparse
import json
import time

from twisted.internet.task import Clock

from pharos.prefix import PrefixOp
from tests.support.peer_mesh import MemoryNetwork, instance, llamacpp


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ticks", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    clock = Clock()
    clock.advance(86400 * 20000 + 3600)
    net = MemoryNetwork()
    engines = {f"http://e{i}:1": llamacpp(slots=4) for i in range(3)}
    x, y = (instance(m, ["a:1", "b:1"], net, clock, engines) for m in ["a:1", "b:1"])
    for inst in (x, y):
        inst.node.tick = 0.05
        inst.node.startService()
    clock.advance(0.6)
    for k in range(20):
        r = x.ledger.reserve(f"k{k}", "t", 10, None)
        x.ledger.settle(r, "m", 5, 0, 5)  # type: ignore[arg-type]
    clock.advance(0.2)
    out: dict[str, float] = {}
    for mode in ("busy", "idle"):
        best = float("inf")
        for _ in range(a.repeat):
            net.delivered.clear()
            t0 = time.process_time()
            for i in range(a.ticks):
                if mode == "busy":
                    x.node.push(PrefixOp("http://e0:1#m", tuple(range(i, i + 16)),
                                         clock.seconds()))
                    r = x.ledger.reserve(f"k{i % 20}", "t", 10, None)
                    x.ledger.settle(r, "m", 5, 0, 5)  # type: ignore[arg-type]
                clock.advance(0.05)  # both nodes' sender loops tick once
            best = min(best, (time.process_time() - t0) / a.ticks * 1000)
            sent = len(net.delivered)
        out[f"{mode}_ms_per_tick_pair"] = round(best, 4)
        out[f"{mode}_deltas_per_tick_pair"] = round(sent / a.ticks, 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
