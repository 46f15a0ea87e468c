"""Several Pharos instances in one run, and restarting one of them mid-run.

With ``--instances N`` the harness is the round-robin load balancer in front of N instances;
with ``--restart K@T`` instance K gets SIGTERM T seconds in, is waited for and started again
with the same config. Meanwhile a ``HealthWatch`` polls every ``/healthz`` and a request whose
turn falls on an instance that is down goes to the next one up (``next_available``).

``restart_summary`` reads from the records alone how fast a restarted instance routes well
again: its hit rate over its first probe interval after ``/healthz`` answered 200, against
its own hit rate before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import treq
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import IReactorTime
from twisted.web.client import HTTPConnectionPool

from pharos.bench.records import RequestRecord
from pharos.bench.summary import hit_rate
from pharos.periodic import Periodic

#: Seconds of one probe interval: a full scrape round (every 5 s), the window over
#: which a restarted instance's hit rate is measured once it is back.
PROBE_INTERVAL: Final = 5.0
#: Seconds between two health polls of one instance.
HEALTH_POLL: Final = 0.25
#: Seconds a health poll may take.
HEALTH_TIMEOUT: Final = 2.0


@dataclass(frozen=True, slots=True)
class Restart:
    """Restart instance ``instance`` (0-based) ``at`` seconds into the run."""

    instance: int
    at: float

    @classmethod
    def parse(cls, text: str) -> Restart:
        """``K@SECONDS`` (``1@40``); ValueError says what is wrong."""
        k, sep, t = text.partition("@")
        try:
            instance, at = int(k), float(t)
        except ValueError:
            instance, at = -1, -1.0
        if not sep or instance < 0 or not at >= 0:
            raise ValueError(f"not INSTANCE@SECONDS (e.g. 1@40): {text!r}")
        return cls(instance, at)

    def to_json(self) -> dict[str, Any]:
        return {"instance": self.instance, "at": self.at}


def window(records: Iterable[RequestRecord], start: float, end: float,
           url: str | None = None, others: bool = False) -> dict[str, Any]:
    """The successful requests sent in ``[start, end)`` (seconds from the run's start) to
    ``url`` (to every URL but ``url`` with ``others``; every URL when ``url`` is None): how
    many, and their hit rate (cached over prompt tokens; ``None`` when none)."""
    def chosen(r: RequestRecord) -> bool:
        if url is None:
            return True
        return (r.url != url) if others else (r.url == url)

    picked = [r for r in records if r.ok and r.sent is not None and start <= r.sent < end
              and chosen(r)]
    return {"from_s": round(start, 3), "to_s": round(end, 3), "requests": len(picked),
            "hit_rate": hit_rate(picked)}


def per_instance(records: Sequence[RequestRecord], urls: Sequence[str]) -> dict[str, Any]:
    """Each instance's counted requests and hit rate (by the URL the harness sent to)."""
    out: dict[str, Any] = {}
    for url in urls:
        mine = [r for r in records if not r.warmup and r.url == url]
        ok = [r for r in mine if r.ok]
        out[url] = {"counted": len(mine), "ok": len(ok), "hit_rate": hit_rate(ok)}
    return out


def restart_summary(records: Sequence[RequestRecord], events: Sequence[Mapping[str, Any]],
                    warmup: float, interval: float = PROBE_INTERVAL) -> list[dict[str, Any]]:
    """For each restart that came back (``events``: ``url``, ``term_at``, ``healthy_at``): the
    instance's hit rate ``before`` (sent between the warm-up's end and SIGTERM), ``after``
    (sent in the first ``interval`` seconds after ``/healthz`` answered 200 again), the others'
    over that window, and ``regained`` = after / before (``None``: unknown, or before is 0)."""
    out = []
    for e in events:
        row: dict[str, Any] = {k: e.get(k) for k in ("instance", "url", "term_at", "exited_at",
                                                     "healthy_at", "error")}
        url, term, back = e.get("url"), e.get("term_at"), e.get("healthy_at")
        if url is None or term is None or back is None:
            out.append(row)
            continue
        before = window(records, warmup, term, url)
        after = window(records, back, back + interval, url)
        row.update(before=before, after=after,
                   others_after=window(records, back, back + interval, url, others=True),
                   interval_s=interval)
        b, a = before["hit_rate"], after["hit_rate"]
        row["regained"] = a / b if a is not None and b else None
        out.append(row)
    return out


class HealthWatch:
    """Polls each base URL's ``/healthz`` every ``interval`` seconds; ``up(url)``: its last
    definite answer was 200. Another status or a refused connection is down; a timed-out poll
    changes nothing (a loaded healthy instance can answer late, and a balancer marks an
    instance down only on evidence). Every URL is up until its first poll answers."""

    def __init__(self, reactor: IReactorTime, urls: Sequence[str], pool: HTTPConnectionPool,
                 interval: float = HEALTH_POLL) -> None:
        self.reactor = reactor
        self.urls = list(urls)
        self.pool = pool
        self.interval = interval
        self.state: dict[str, bool] = dict.fromkeys(self.urls, True)
        self._busy: set[str] = set()
        self._loop = Periodic(reactor, interval, self._poll, now=True, what="health poll")

    def up(self, url: str) -> bool:
        return self.state.get(url, True)

    def start(self) -> None:
        self._loop.startService()

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stopService()

    def _poll(self) -> None:
        for url in self.urls:
            if url not in self._busy:
                self._busy.add(url)
                Deferred.fromCoroutine(self._one(url))

    async def _one(self, url: str) -> None:
        try:
            response = await treq.get(url + "/healthz", pool=self.pool, timeout=HEALTH_TIMEOUT)
            await treq.content(response)
            self.state[url] = response.code == 200
        except ConnectionRefusedError:
            self.state[url] = False
        except Exception:  # timed out, reset: no evidence either way
            pass
        finally:
            self._busy.discard(url)
