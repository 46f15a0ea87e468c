"""Traffic sent as several API keys, for the fair queue: who sends which part of a workload, as
which key, in which tenant.

A *clients file* (YAML) names client groups and, optionally, tenants::

    tenants:                    # optional: tenants with a weight
      - {name: a, weight: 1}
    clients:
      - name: light             # the group's label in records and summaries
        share: 0.0909           # the fraction of --rate it sends (not normalised: 0 sends none)
        weight: 1               # its keys' fair-queue weight (default 1)
        tenant: a               # its keys' tenant (default: Pharos's default tenant)
        count: 1                # keys in the group: NAME, or NAME-000 ... when more than one
        key: shared             # optional: send as this key instead (the one-key baseline)

Each group's requests are generated on their own at ``rate * share`` with a seed drawn from the
run's seed and the group's name, then merged by send time, so a group sends the same requests
whatever the others send. A group of several keys deals its requests round robin. The secrets
are ``pharos-bench-<key name>``, fixed and public (a benchmark, not an account);
``access_yaml`` is the ``keys:``/``tenants:`` part of Pharos's config, with a usage journal
whose engine-leg TTFT splits a client's TTFT into the wait in Pharos and the engine's part.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pharos.bench.workloads import Request, generate

#: The prefix of every benchmark key's secret.
SECRET_PREFIX = "pharos-bench-"
#: Where Pharos journals each request, relative to its working directory (the fleet's logs).
JOURNAL = "journal.jsonl"


@dataclass(frozen=True, slots=True)
class Sender:
    """Who sends one request: the client group's label, the key's name and secret."""

    client: str
    key: str
    secret: str

    def headers(self) -> dict[str, str]:
        """The request's ``Authorization`` header."""
        return {"authorization": f"Bearer {self.secret}"}


@dataclass(frozen=True, slots=True)
class Client:
    """One client group (see the module's doc)."""

    name: str
    share: float
    weight: int = 1
    tenant: str | None = None
    count: int = 1
    key: str | None = None

    def key_names(self) -> list[str]:
        """The keys it sends as, in dealing order."""
        if self.key is not None:
            return [self.key]
        if self.count == 1:
            return [self.name]
        width = len(str(self.count - 1))
        return [f"{self.name}-{n:0{width}d}" for n in range(self.count)]


@dataclass(frozen=True, slots=True)
class Population:
    """The client groups of a run and the tenants their keys belong to."""

    clients: tuple[Client, ...]
    tenants: tuple[tuple[str, int], ...] = ()

    def keys(self) -> dict[str, tuple[int, str | None]]:
        """Every key by name: its weight and tenant. A key several groups send as must have
        the same weight and tenant in each."""
        out: dict[str, tuple[int, str | None]] = {}
        for c in self.clients:
            for name in c.key_names():
                if out.setdefault(name, (c.weight, c.tenant)) != (c.weight, c.tenant):
                    raise ValueError(f"key {name!r} is given two weights or tenants")
        return out

    def traffic(self, workload: str, seed: int, rate: float, duration: float,
                **kw: Any) -> tuple[list[Request], list[Sender]]:
        """The merged requests, sorted by send time, and who sends each."""
        tagged: list[tuple[float, int, int, Request, Sender]] = []
        for g, c in enumerate(self.clients):
            if c.share <= 0:
                continue
            names = c.key_names()
            reqs = generate(workload, group_seed(seed, c.name), rate * c.share, duration, **kw)
            for i, r in enumerate(reqs):
                key = names[i % len(names)]
                tagged.append((r.at, g, i, r, Sender(c.name, key, SECRET_PREFIX + key)))
        tagged.sort(key=lambda t: t[:3])
        return [t[3] for t in tagged], [t[4] for t in tagged]

    def access_yaml(self) -> str:
        """The ``tenants:``, ``keys:`` and ``usage:`` (journal) sections of Pharos's config."""
        lines = [f"usage: {{journal: {JOURNAL}}}"]
        if self.tenants:
            lines.append("tenants:")
            lines += [f"  - {{name: {name}, weight: {weight}}}" for name, weight in self.tenants]
        lines.append("keys:")
        for name, (weight, tenant) in self.keys().items():
            digest = hashlib.sha256((SECRET_PREFIX + name).encode()).hexdigest()
            entry = f"  - {{name: {name}, sha256: {digest}, weight: {weight}"
            if tenant is not None:
                entry += f", tenant: {tenant}"
            lines.append(entry + "}")
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        """The ``clients`` part of a result file's spec."""
        return {"tenants": [{"name": n, "weight": w} for n, w in self.tenants],
                "clients": [{"name": c.name, "share": c.share, "weight": c.weight,
                             "tenant": c.tenant, "count": c.count, "key": c.key}
                            for c in self.clients]}


def group_seed(seed: int, name: str) -> int:
    """The workload seed of client group ``name`` in a run seeded ``seed``."""
    digest = hashlib.blake2b(f"pharos.bench.clients:{seed}:{name}".encode(), digest_size=6)
    return int.from_bytes(digest.digest(), "big")


def parse(doc: Any) -> Population:
    """A population from a clients file's document; ValueError says what is wrong."""
    if not isinstance(doc, dict) or not isinstance(doc.get("clients"), list) \
            or not doc["clients"]:
        raise ValueError("a clients file is a mapping with a non-empty 'clients' list")
    unknown = set(doc) - {"clients", "tenants"}
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    tenants: list[tuple[str, int]] = []
    for t in doc.get("tenants") or ():
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise ValueError(f"a tenant needs a name: {t!r}")
        tenants.append((t["name"], _positive_int(t.get("weight", 1), "tenant weight")))
    clients: list[Client] = []
    fields = {"name", "share", "weight", "tenant", "count", "key"}
    for c in doc["clients"]:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not c["name"]:
            raise ValueError(f"a client needs a name: {c!r}")
        if set(c) - fields:
            raise ValueError(f"client {c['name']!r}: unknown fields {sorted(set(c) - fields)}")
        share = c.get("share")
        if isinstance(share, bool) or not isinstance(share, int | float) or share < 0:
            raise ValueError(f"client {c['name']!r}: share must be a number >= 0")
        tenant, key = c.get("tenant"), c.get("key")
        if tenant is not None and tenant not in {n for n, _ in tenants}:
            raise ValueError(f"client {c['name']!r}: no tenant named {tenant!r}")
        clients.append(Client(c["name"], float(share),
                              _positive_int(c.get("weight", 1), "weight"),
                              None if tenant is None else str(tenant),
                              _positive_int(c.get("count", 1), "count"),
                              None if key is None else str(key)))
    if len({c.name for c in clients}) != len(clients):
        raise ValueError("client names must differ")
    population = Population(tuple(clients), tuple(tenants))
    population.keys()  # the consistency check
    return population


def load(path: Path) -> Population:
    """A population from a clients file."""
    return parse(yaml.safe_load(path.read_text()))



def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a whole number >= 1, not {value!r}")
    return value
