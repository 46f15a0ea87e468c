"""Responses conversation state: the stored conversations behind ``previous_response_id``,
encrypted at rest, scoped to a tenant, bounded in count, age and size.

One record per stored response holds the whole conversation up to it, so a newer turn never
depends on an older record that retention dropped. Each record is JSON under AES-256-GCM
(key from ``responses.key_file``, fresh 96-bit nonce) with the tenant and response id as
associated data: a blob moved to another tenant's or id's place fails authentication like a
tampered one, and either reads as absent. Records live in memory only (never in the state
file or peer messages: no prompt text leaves the process), so a restart forgets them.

Retention: at most ``max_responses`` records (oldest dropped first), none older than
``max_age``; a record past ``max_bytes`` of plaintext JSON is not stored. Pure: no I/O, the
clock injected.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

#: The key's size: AES-256.
KEY_BYTES = 32
NONCE_BYTES = 12


def read_key(path: str) -> bytes:
    """The AES-256 key in ``path``: 32 raw bytes, or 64 hex digits (``openssl rand -hex 32``),
    surrounding whitespace ignored for the hex form. ``ValueError`` saying why otherwise."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    if len(raw) == KEY_BYTES:
        return raw
    text = raw.strip()
    if len(text) == 2 * KEY_BYTES:
        try:
            return bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            pass
    raise ValueError(f"{path} must hold a 256-bit key: 32 bytes, or 64 hex digits "
                     f"(openssl rand -hex 32 > {path}); it holds {len(raw)} bytes")


@dataclass(frozen=True, slots=True)
class Stats:
    """Counts for metrics (no content): records and ciphertext bytes held, outcomes since start."""

    held: int
    bytes: int
    stored: int
    too_large: int
    expired: int
    evicted: int
    rejected: int  # a blob that failed authentication (tampered or misplaced)


class ConversationStore:
    """Encrypted conversation records by (tenant, response id); see the module docstring."""

    def __init__(self, key: bytes, clock: Callable[[], float], *,
                 max_responses: int, max_age: float, max_bytes: int) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"the key must be {KEY_BYTES} bytes, not {len(key)}")
        self._aead = AESGCM(key)
        self.clock = clock
        self.max_responses = max_responses
        self.max_age = max_age
        self.max_bytes = max_bytes
        #: (tenant, id) -> (stored at, nonce + ciphertext), oldest first.
        self._records: OrderedDict[tuple[str, str], tuple[float, bytes]] = OrderedDict()
        self._bytes = 0
        self._stored = self._too_large = self._expired = self._evicted = self._rejected = 0

    def __len__(self) -> int:
        return len(self._records)

    @staticmethod
    def _aad(tenant: str, rid: str) -> bytes:
        return b"pharos-responses-v1\0" + tenant.encode("utf-8", "surrogatepass") + b"\0" + \
            rid.encode("utf-8", "surrogatepass")

    def put(self, tenant: str, rid: str, items: list[Any]) -> bool:
        """Store ``items`` as response ``rid`` of ``tenant``; False over ``max_bytes``. An id
        already held (an engine that repeats ids) drops the held record too: either would lie."""
        plain = json.dumps(items, ensure_ascii=False, separators=(",", ":")).encode(
            "utf-8", "surrogatepass")
        if len(plain) > self.max_bytes:
            self._too_large += 1
            return False
        now = self.clock()
        self._expire(now)
        key = (tenant, rid)
        held = self._records.pop(key, None)
        if held is not None:
            self._bytes -= len(held[1])
            return False
        nonce = os.urandom(NONCE_BYTES)
        blob = nonce + self._aead.encrypt(nonce, plain, self._aad(tenant, rid))
        self._records[key] = (now, blob)
        self._bytes += len(blob)
        self._stored += 1
        while len(self._records) > self.max_responses:
            _, (_, old) = self._records.popitem(last=False)
            self._bytes -= len(old)
            self._evicted += 1
        return True

    def get(self, tenant: str, rid: str) -> list[Any] | None:
        """The conversation stored as ``rid`` for ``tenant``; None when there is none (another
        tenant's, expired, dropped, or failing authentication)."""
        self._expire(self.clock())
        held = self._records.get((tenant, rid))
        if held is None:
            return None
        blob = held[1]
        try:
            plain = self._aead.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:],
                                       self._aad(tenant, rid))
        except InvalidTag:
            self._rejected += 1
            return None
        items = json.loads(plain)
        return items if isinstance(items, list) else None

    def _expire(self, now: float) -> None:
        records = self._records
        while records:
            key, (at, blob) = next(iter(records.items()))
            if now - at <= self.max_age:
                break
            del records[key]
            self._bytes -= len(blob)
            self._expired += 1

    def stats(self) -> Stats:
        return Stats(len(self._records), self._bytes, self._stored, self._too_large,
                     self._expired, self._evicted, self._rejected)

    # --- for tests: the blob as held (tamper checks) ----------------------------------------

    def _blob(self, tenant: str, rid: str) -> bytes:
        return self._records[(tenant, rid)][1]

    def _replace_blob(self, tenant: str, rid: str, blob: bytes) -> None:
        at, old = self._records[(tenant, rid)]
        self._records[(tenant, rid)] = (at, blob)
        self._bytes += len(blob) - len(old)


class StoreCollector(Collector):
    """The store's counts on ``/metrics`` (no content, no ids)."""

    def __init__(self, store: ConversationStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        s = self.store.stats()
        yield GaugeMetricFamily("pharos_responses_stored", "Responses conversations held.",
                                value=s.held)
        yield GaugeMetricFamily("pharos_responses_bytes", "Ciphertext bytes of the "
                                "Responses conversations held.", value=s.bytes)
        c = CounterMetricFamily("pharos_responses_records", "Responses conversations stored, "
                                "and those not stored or dropped, by outcome.",
                                labels=("outcome",))
        for outcome, n in (("stored", s.stored), ("too_large", s.too_large),
                           ("expired", s.expired), ("evicted", s.evicted),
                           ("rejected", s.rejected)):
            c.add_metric((outcome,), n)
        yield c
