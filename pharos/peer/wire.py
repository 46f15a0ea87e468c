"""The delta on the wire: versioned JSON, ``POST /peer/delta`` every tick.

A delta carries this origin's absolute gauges and recent usage cells, so a lost one is
repaired by the next, plus the prefix ops since the last tick (lossy hints). Unknown fields
are ignored, so a later release may add some without a bump; a peer on another ``proto`` is
answered 409 (``ProtoMismatch``).

A delta also carries ``dispatch``: the requests this origin sent since its last delta, each a
predicted record; without it (an older peer) its records stand for its sends. And
``retention``: per target the root tokens its cache was last seen to retain and when (the
receiver keeps the latest), so every instance drops stale predictions alike.

Decoding checks the shape only; each owning module checks its part when it merges. No prompt
text travels: prefix ops are 64-bit hashes and a target key.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pharos.config import Config
from pharos.peer.snapshot import PROTO
from pharos.prefix import PrefixOp
from pharos.retention import RootsRow, parse_roots_row

#: Prefix ops one delta may carry: a peer's pending list holds at most this many.
MAX_OPS: Final = 10_000
#: Links one prefix op may name (a chain of 1 KiB blocks: 64 MiB of prompt).
MAX_HASHES: Final = 65_536
#: Cells one delta may carry (today's and yesterday's of every key × model, two minutes').
MAX_CELLS: Final = 200_000
_U64: Final = 2**64


class WireError(ValueError):
    """A peer message that is not a delta (garbage, wrong shape): the reply is 400."""


class ProtoMismatch(WireError):
    """A delta of another wire version: the reply is 409, and the sender flags it."""

    def __init__(self, proto: object) -> None:
        super().__init__(f"peer proto {proto!r}, this instance speaks {PROTO}")
        self.proto = proto


@dataclass(frozen=True, slots=True)
class Delta:
    """One tick's message from ``origin``. ``gauges`` holds the scheduler's parts
    (``inflight``, ``waiting``) and usage's (``reserved``)."""

    origin: str
    fingerprint: str
    #: The sender's count of its deltas (increasing): gauges of an older one never replace a
    #: newer one's, so deltas applied in any order and any number of times end the same.
    seq: int = 0
    leaving: bool = False
    gauges: Mapping[str, Any] = field(default_factory=dict)
    cells: Sequence[Mapping[str, Any]] = ()
    prefix: Sequence[PrefixOp] = ()
    proto: int = PROTO
    #: The sender's dispatches since its last delta; None: an older peer (records stand).
    dispatched: Sequence[PrefixOp] | None = None
    #: Each target's learned retention (rows without roots); None: not sent.
    retention: Sequence[RootsRow] | None = None


def fingerprint(config: Config) -> str:
    """A hash (16 hex digits) of what peers must agree on to share state: the static backend
    set (ops and gauges name targets by URL; DNS groups by name and port), the key and tenant
    names (usage cells), and the usage timezone (day buckets)."""
    what: dict[str, object] = {"backends": sorted(b.url for b in config.backends),
            "keys": sorted([k.name, k.tenant] for k in config.keys),
            "tenants": sorted(t.name for t in config.tenants),
            "timezone": config.usage.timezone}
    if config.dns_backends:  # absent without groups: older fingerprints stay
        what["dns"] = sorted(f"{d.name}:{d.port}" for d in config.dns_backends)
    data = json.dumps(what, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _op(op: PrefixOp) -> dict[str, Any]:
    return {"target": op.target_key, "hashes": list(op.hashes), "last_used": op.last_used,
            "remove": op.remove}


def _dispatch_op(op: PrefixOp) -> dict[str, Any]:
    return {"target": op.target_key, "hashes": list(op.hashes), "last_used": op.last_used,
            "root_tokens": op.root_tokens, "moved": op.moved}


def encode(delta: Delta) -> bytes:
    """The delta as compact UTF-8 JSON."""
    body: dict[str, Any] = {
        "proto": delta.proto, "origin": delta.origin, "fingerprint": delta.fingerprint,
        "seq": delta.seq, "leaving": delta.leaving, "gauges": delta.gauges,
        "cells": list(delta.cells), "prefix": [_op(op) for op in delta.prefix]}
    if delta.dispatched is not None:
        body["dispatch"] = [_dispatch_op(op) for op in delta.dispatched]
    if delta.retention is not None:
        body["retention"] = [{"target": r.target, "retained": r.retained,
                              "learned_at": r.learned_at} for r in delta.retention]
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode()


def _parse_op(raw: object, i: int, part: str = "prefix") -> PrefixOp:
    if not isinstance(raw, Mapping):
        raise WireError(f"{part}[{i}]: expected an object")
    target, hashes, last_used = raw.get("target"), raw.get("hashes"), raw.get("last_used")
    remove = raw.get("remove", False)
    if not isinstance(target, str):
        raise WireError(f"{part}[{i}].target: expected a string")
    if not isinstance(hashes, list) or len(hashes) > MAX_HASHES or not all(
            type(h) is int and 0 <= h < _U64 for h in hashes):
        raise WireError(f"{part}[{i}].hashes: expected at most {MAX_HASHES} unsigned "
                        "64-bit integers")
    if type(last_used) not in (int, float) or not math.isfinite(last_used):  # type: ignore[arg-type]
        raise WireError(f"{part}[{i}].last_used: expected a finite number")
    if not isinstance(remove, bool):
        raise WireError(f"{part}[{i}].remove: expected true or false")
    return PrefixOp(target, tuple(hashes), float(last_used), remove)  # type: ignore[arg-type]


def _parse_dispatch(raw: object, i: int) -> PrefixOp:
    op = _parse_op(raw, i, "dispatch")
    assert isinstance(raw, Mapping)
    tokens, moved = raw.get("root_tokens"), raw.get("moved", False)
    if tokens is not None and (type(tokens) is not int or tokens < 0):
        raise WireError(f"dispatch[{i}].root_tokens: expected a non-negative integer or null")
    if not isinstance(moved, bool):
        raise WireError(f"dispatch[{i}].moved: expected true or false")
    if not op.hashes:
        raise WireError(f"dispatch[{i}].hashes: expected at least one hash")
    return PrefixOp(op.target_key, op.hashes, op.last_used, dispatched=True,
                    root_tokens=tokens, moved=moved)


def _reject_constant(name: str) -> float:
    raise WireError(f"not JSON: {name}")


def decode(data: bytes) -> Delta:
    """A delta from its bytes; ``WireError`` for anything that is not one (the reason names
    the field), ``ProtoMismatch`` for another wire version. Unknown fields are ignored."""
    try:
        raw = json.loads(data, parse_constant=_reject_constant)
    except WireError:
        raise
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise WireError(f"not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise WireError("expected a JSON object")
    proto = raw.get("proto")
    if type(proto) is not int:
        raise WireError(f"proto: expected an integer, got {proto!r}")
    if proto != PROTO:
        raise ProtoMismatch(proto)
    origin, fp = raw.get("origin"), raw.get("fingerprint")
    if not isinstance(origin, str) or not origin:
        raise WireError("origin: expected a non-empty string")
    if not isinstance(fp, str):
        raise WireError("fingerprint: expected a string")
    seq = raw.get("seq", 0)
    if type(seq) is not int or seq < 0:
        raise WireError(f"seq: expected a non-negative integer, got {seq!r}")
    leaving = raw.get("leaving", False)
    if not isinstance(leaving, bool):
        raise WireError("leaving: expected true or false")
    gauges = raw.get("gauges", {})
    if not isinstance(gauges, dict):
        raise WireError("gauges: expected an object")
    cells = raw.get("cells", [])
    if not isinstance(cells, list) or len(cells) > MAX_CELLS or not all(
            isinstance(c, dict) for c in cells):
        raise WireError(f"cells: expected a list of at most {MAX_CELLS} objects")
    ops = raw.get("prefix", [])
    if not isinstance(ops, list) or len(ops) > MAX_OPS:
        raise WireError(f"prefix: expected a list of at most {MAX_OPS} ops")
    prefix = tuple(_parse_op(op, i) for i, op in enumerate(ops))
    sent = raw.get("dispatch")
    dispatched: tuple[PrefixOp, ...] | None = None
    if sent is not None:
        if not isinstance(sent, list) or len(sent) > MAX_OPS:
            raise WireError(f"dispatch: expected a list of at most {MAX_OPS} ops")
        dispatched = tuple(_parse_dispatch(op, i) for i, op in enumerate(sent))
    kept = raw.get("retention")
    retention: tuple[RootsRow, ...] | None = None
    if kept is not None:
        if not isinstance(kept, list) or len(kept) > MAX_OPS:
            raise WireError(f"retention: expected a list of at most {MAX_OPS} rows")
        rows = []
        for i, row in enumerate(kept):
            try:
                rows.append(parse_roots_row(row))
            except ValueError as e:
                raise WireError(f"retention[{i}]: {e}") from None
        retention = tuple(RootsRow(r.target, r.retained, r.learned_at, ()) for r in rows)
    return Delta(origin, fp, seq, leaving, gauges, cells, prefix, proto, dispatched,
                 retention)
