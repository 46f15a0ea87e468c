"""Shadow policies: each decision that placed a request is run again, off the request path,
by the policies its model names in ``shadow:`` on the same inputs, and compared with the pick
that routed it.

**Off the request path, bounded.** ``offer`` (the scheduler's ``on_route``) queues a
reference to the decision's immutable inputs (at most ``QUEUE_LIMIT``) and returns; a reactor
turn later ``BATCH`` of them run. A decision offered to a full queue is dropped and counted
(``dropped``); a shadow policy that raises is counted (``errors``) and never reaches the
request, which was routed before.

**What is counted**, per (model, routing policy, shadow policy): decisions, agreements, and
the estimated gain: the ``cost`` policy's estimate for the routing pick less its estimate for
the shadow's pick (seconds; positive: the shadow's target looked faster).

**The log** (``observability.shadow_log``): one JSON line per config generation and one per
shadow decision, holding everything the policies saw but no prompt text. Each line's ``sha``
is the SHA-256 of the previous ``sha`` and this line without it, so an edited, removed or
reordered line breaks the chain; ``pharos replay-shadow LOG`` checks the chain and re-runs
every decision from its line alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from pharos.models import Fleet, describe
from pharos.policy import Candidate, PolicyConfig, RouteReq, pick, score

log = Logger()

#: Decisions waiting for their shadows, at most; more are dropped and counted.
QUEUE_LIMIT: Final = 1000
#: Decisions run per reactor turn.
BATCH: Final = 50
#: The first line's ``prev``.
GENESIS: Final = "0" * 64


class Sink(Protocol):
    """Where log lines go (``pharos.journal.Journal``): False when one was dropped."""

    def write(self, record: Mapping[str, object]) -> bool: ...


@dataclass
class Tally:
    """One (model, routing policy, shadow policy)'s counts."""

    decisions: int = 0
    agree: int = 0
    gain_sum: float = 0.0
    gain_n: int = 0  # decisions whose gain is known (both picks have an estimate)

    def doc(self) -> dict[str, Any]:
        return {"decisions": self.decisions, "agree": self.agree,
                "agreement": self.agree / self.decisions if self.decisions else None,
                "gain_sec_sum": self.gain_sum,
                "gain_sec_mean": self.gain_sum / self.gain_n if self.gain_n else None,
                "gain_known": self.gain_n}


@dataclass(frozen=True, slots=True)
class _Item:
    generation: int
    model: str
    routing: PolicyConfig
    shadows: tuple[PolicyConfig, ...]
    cost: PolicyConfig
    route: RouteReq
    candidates: tuple[Candidate, ...]
    target: int | None


@dataclass
class Outcome:
    """One shadow decision, as logged and replayed."""

    picks: dict[str, int | None] = field(default_factory=dict)
    gains: dict[str, float | None] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def run_shadows(route: RouteReq, candidates: tuple[Candidate, ...], target: int | None,
                shadows: Iterable[PolicyConfig], cost: PolicyConfig) -> Outcome:
    """Each shadow policy's pick on the same inputs and its estimated gain (pure: the
    replay calls it too). A policy that raises is named in ``errors``."""
    out = Outcome()
    ests: dict[int, float | None] | None = None
    for cfg in shadows:
        try:
            d = pick(route, candidates, cfg)
        except Exception:
            out.errors.append(cfg.name)
            continue
        out.picks[cfg.name] = d.target_id
        gain = None
        if target is not None and d.target_id is not None:
            if ests is None:
                ests = {s.target_id: s.est_ttft for s in score(route, candidates, cost)}
            mine, theirs = ests.get(target), ests.get(d.target_id)
            if mine is not None and theirs is not None:
                gain = mine - theirs
        out.gains[cfg.name] = gain
    return out


def _canonical(doc: Mapping[str, object]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def seal(prev: str, doc: Mapping[str, object]) -> str:
    """The line's ``sha``: SHA-256 of the previous ``sha`` and the line without it."""
    return hashlib.sha256(prev.encode() + b"\n" + _canonical(doc)).hexdigest()


def candidate_doc(c: Candidate) -> dict[str, Any]:
    """A candidate's every field (tuples as lists)."""
    return {f.name: (list(v) if isinstance(v := getattr(c, f.name), tuple) else v)
            for f in dataclasses.fields(c)}


def candidate_of(doc: Mapping[str, Any]) -> Candidate:
    """A candidate from ``candidate_doc`` (lists back to tuples)."""
    fields: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v)
                              for k, v in doc.items()}
    return Candidate(**fields)


def config_doc(cfg: PolicyConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


class Shadow:
    """Runs the shadow policies of each placed decision a turn later, counts them, and logs
    them when a sink is given."""

    def __init__(self, clock: IReactorTime, fleet: Fleet, default: Callable[[], PolicyConfig],
                 sink: Sink | None = None, queue_limit: int = QUEUE_LIMIT,
                 batch: int = BATCH) -> None:
        self.clock = clock
        self.default = default  # the scheduler's policy (a request without its own)
        self.sink = sink
        self.queue_limit = queue_limit
        self.batch = batch
        self._queue: deque[_Item] = deque()
        self._call: IDelayedCall | None = None
        self._prev = GENESIS
        self.dropped = 0
        self.errors: Counter[str] = Counter()  # by shadow policy
        self.tallies: dict[tuple[str, str, str], Tally] = {}
        self.logged_dropped = 0  # lines the sink dropped (the chain then restarts there)
        self.fleet = fleet
        self._log_config()

    def set_fleet(self, fleet: Fleet) -> None:
        """A new config generation: logged; decisions already queued keep theirs."""
        self.fleet = fleet
        self._log_config()

    def _log_config(self) -> None:
        self._write({"type": "config", "generation": self.fleet.generation,
                     "policy": config_doc(self.fleet.base), "fleet": describe(self.fleet)})

    def _write(self, doc: dict[str, Any]) -> None:
        if self.sink is None:
            return
        doc["prev"] = self._prev
        sha = seal(self._prev, doc)
        if self.sink.write({**doc, "sha": sha}):
            self._prev = sha
        else:
            self.logged_dropped += 1

    # --- the scheduler's side: offer and return ------------------------------------------

    def offer(self, req: Any, placed: Any) -> None:
        """``Scheduler.on_route``: queue the decision if its model has shadows (nothing else)."""
        fleet = self.fleet
        r = fleet.routing(req.model)
        if not r.shadow or placed.route is None:
            return
        if len(self._queue) >= self.queue_limit:
            self.dropped += 1
            return
        routing = req.policy or self.default()
        self._queue.append(_Item(
            fleet.generation, req.model, routing,
            tuple(dataclasses.replace(routing, name=n) for n in r.shadow),
            dataclasses.replace(routing, name="cost"), placed.route, placed.candidates,
            placed.decision.target_id))
        if self._call is None:
            self._call = self.clock.callLater(0, self._drain)

    def _drain(self) -> None:
        self._call = None
        for _ in range(min(self.batch, len(self._queue))):
            self._run(self._queue.popleft())
        if self._queue:
            self._call = self.clock.callLater(0, self._drain)

    def _run(self, item: _Item) -> None:
        out = run_shadows(item.route, item.candidates, item.target, item.shadows, item.cost)
        for name in out.errors:
            self.errors[name] += 1
        for name, chosen in out.picks.items():
            t = self.tallies.setdefault((item.model, item.routing.name, name), Tally())
            t.decisions += 1
            t.agree += chosen == item.target
            gain = out.gains.get(name)
            if gain is not None:
                t.gain_sum += gain
                t.gain_n += 1
        if self.sink is not None:
            self._write({
                "type": "shadow", "generation": item.generation, "model": item.model,
                "policy": item.routing.name, "config": config_doc(item.routing),
                "req": dataclasses.asdict(item.route),
                "candidates": [candidate_doc(c) for c in item.candidates],
                "target": item.target, "picks": out.picks, "gains": out.gains,
                "errors": out.errors})

    def pending(self) -> int:
        """Decisions queued for their shadows now."""
        return len(self._queue)

    def doc(self) -> dict[str, Any]:
        """``GET /admin/shadow``."""
        return {
            "generation": self.fleet.generation, "pending": len(self._queue),
            "queue_limit": self.queue_limit, "dropped": self.dropped,
            "errors": dict(self.errors), "log_dropped": self.logged_dropped,
            "routing": describe(self.fleet),
            "tallies": [{"model": m, "policy": p, "shadow": s, **t.doc()}
                        for (m, p, s), t in sorted(self.tallies.items())]}


# --- replay ---------------------------------------------------------------------------------

def replay(lines: Iterable[str]) -> tuple[int, list[str]]:
    """Check a shadow log's ``sha`` chain and rebuild each decision from its line. Returns
    the decisions checked and the problems found (each naming its line)."""
    problems: list[str] = []
    prev = GENESIS
    checked = 0
    generations: set[int] = set()
    for n, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict):
                raise ValueError("not an object")
            sha = doc.pop("sha")
            if doc.get("prev") != prev:
                problems.append(f"line {n}: does not follow the line before it (a line was "
                                f"removed, added or reordered before it)")
            if seal(doc.get("prev", ""), doc) != sha:
                problems.append(f"line {n}: its sha does not match its contents (edited)")
            prev = sha
            kind = doc["type"]
            if kind == "config":
                generations.add(int(doc["generation"]))
                continue
            if kind != "shadow":
                problems.append(f"line {n}: unknown type {kind!r}")
                continue
            if int(doc["generation"]) not in generations:
                problems.append(f"line {n}: generation {doc['generation']} has no config line")
            checked += 1
            problems.extend(f"line {n}: {p}" for p in _check(doc))
        except (KeyError, ValueError, TypeError) as e:
            problems.append(f"line {n}: unreadable ({type(e).__name__}: {e})")
    return checked, problems


def _check(doc: Mapping[str, Any]) -> list[str]:
    """One shadow line rebuilt: its routing pick and each shadow's pick and gain."""
    cfg = PolicyConfig(**doc["config"])
    route = RouteReq(**doc["req"])
    cands = tuple(candidate_of(c) for c in doc["candidates"])
    out: list[str] = []
    routed = pick(route, cands, cfg).target_id
    if routed != doc["target"]:
        out.append(f"{cfg.name} picks {routed}, the line says {doc['target']}")
    names = [*doc["picks"], *doc["errors"]]
    again = run_shadows(route, cands, doc["target"],
                        [dataclasses.replace(cfg, name=n) for n in names],
                        dataclasses.replace(cfg, name="cost"))
    for name in names:
        if (name in again.errors) != (name in doc["errors"]):
            out.append(f"shadow {name}: raised {name in again.errors} on replay, "
                       f"the line says {name in doc['errors']}")
            continue
        if name in doc["errors"]:
            continue
        if again.picks[name] != doc["picks"][name]:
            out.append(f"shadow {name} picks {again.picks[name]}, the line says "
                       f"{doc['picks'][name]}")
        a, b = again.gains.get(name), doc["gains"].get(name)
        if (a is None) != (b is None) or (a is not None and b is not None
                                          and abs(a - b) > 1e-9 * max(1.0, abs(a))):
            out.append(f"shadow {name}: gain {a} on replay, the line says {b}")
    return out


def main_replay(argv: list[str]) -> int:
    """``pharos replay-shadow LOG``: 0 all checks, 1 problems printed, 2 unreadable."""
    if len(argv) != 1:
        print("usage: pharos replay-shadow LOG")
        return 2
    try:
        with open(argv[0], encoding="utf-8") as f:
            checked, problems = replay(f)
    except OSError as e:
        print(f"pharos replay-shadow: cannot read {argv[0]}: {e.strerror or e}")
        return 2
    for p in problems:
        print(p)
    print(f"{checked} shadow decisions replayed, {len(problems)} problems")
    return 1 if problems else 0
