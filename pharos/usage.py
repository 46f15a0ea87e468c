"""Usage and quotas: per-origin counter cells, the requests-per-minute window, and daily
token budgets held by reservation.

**Cells** are keyed by (origin, kind, bucket, key, tenant, model). A process increments only
its own origin's cells; other origins' are read-only copies. ``merge`` keeps the field-wise
max per cell, so deltas may arrive late, twice or out of order with the same result. Totals
sum over origins. Minute cells count admissions and live two minutes; Day cells count
finished requests and live ``retention_days``.

**RPM** is prev_minute × (1 − elapsed share) + current_minute, counted at admission (a
refused request is not counted), so a burst is limited before it reaches an engine.

**Tokens per day** are held by reservation: admission reserves the estimated tokens
(``estimate_tokens``) against the key's and the tenant's remaining budget; ``settle``
replaces it with the reply's real usage. Charging only after the reply would let every
request admitted while others stream spend the same remaining budget.

Unknown is ``None``, never 0: a reply without token counts is *unmetered*, an unknown limit
is no limit. Pure: an injected clock, dates in ``usage.timezone``, no I/O.
"""

from __future__ import annotations

import csv
import enum
import io
import math
import zoneinfo
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import date, datetime, time, tzinfo
from typing import Final, Literal, TypeAlias, get_args

from twisted.internet.interfaces import IReactorTime

from pharos.config import DEFAULT_RETENTION_DAYS

#: Completion tokens assumed without ``max_tokens`` (engines' own defaults run to the
#: context's end, so such a request is the one whose usage can pass its estimate).
DEFAULT_COMPLETION_ESTIMATE: Final = 1024
#: The largest integer a float or any JSON reader holds exactly: an absurd ``max_tokens``
#: cannot fit a budget, and nothing downstream sees an integer it cannot represent.
MAX_ESTIMATE: Final = 2**53 - 1
#: Minute cells kept: the current minute and the one before (all the window reads).
MINUTE_CELLS_KEPT: Final = 2
#: A peer's reservations count until it has been silent this long (gauges).
PEER_SILENCE_SEC: Final = 2.0
#: Names one peer's reservations may hold: far above any key set, so more is refused.
MAX_RESERVED_NAMES: Final = 10_000
#: Counted fields of a cell, in the order of exports, rows and CSV columns.
COUNT_FIELDS: Final = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens",
                       "unmetered")

GroupBy: TypeAlias = Literal["key", "model", "tenant"]
Budget: TypeAlias = Literal["key", "tenant"]
#: A usage row or an exported cell: plain JSON-able data.
Row: TypeAlias = dict[str, str | int]

_EPOCH_ORDINAL: Final = date(1970, 1, 1).toordinal()
#: Slack so the moment ``admit_rpm`` names is admitted despite float rounding.
_RPM_SLACK: Final = 1e-9


class Kind(enum.Enum):
    """A Day cell counts finished requests for a day; a Minute cell counts admissions."""

    DAY = "day"
    MINUTE = "minute"


@dataclass(frozen=True, slots=True)
class CellKey:
    """Which counter: ``bucket`` is the day number in the usage timezone (days since
    1970-01-01 there) or the unix minute; ``model`` is "" for Minute cells."""

    origin: str
    kind: Kind
    bucket: int
    key: str
    tenant: str
    model: str

    def sort_key(self) -> tuple[str, str, int, str, str, str]:
        return (self.origin, self.kind.value, self.bucket, self.key, self.tenant, self.model)


@dataclass(frozen=True, slots=True)
class Counts:
    """A cell's counters. ``cached_tokens`` are part of ``prompt_tokens`` (as engines report
    them); ``unmetered`` counts served requests whose usage is unknown."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    unmetered: int = 0

    @property
    def tokens(self) -> int:
        """What a quota counts: prompt plus completion tokens (known ones only)."""
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.requests + other.requests,
                      self.prompt_tokens + other.prompt_tokens,
                      self.cached_tokens + other.cached_tokens,
                      self.completion_tokens + other.completion_tokens,
                      self.unmetered + other.unmetered)

    def max(self, other: Counts) -> Counts:
        """Field-wise max: the merge of two copies of one cell."""
        return Counts(max(self.requests, other.requests),
                      max(self.prompt_tokens, other.prompt_tokens),
                      max(self.cached_tokens, other.cached_tokens),
                      max(self.completion_tokens, other.completion_tokens),
                      max(self.unmetered, other.unmetered))


ZERO: Final = Counts()


class Calendar:
    """Days in the usage timezone (``None``: the host's). A day number counts days since
    1970-01-01 in that zone, so peers agree on buckets whatever their own zone."""

    def __init__(self, timezone: str | None = None) -> None:
        self.zone: tzinfo | None = zoneinfo.ZoneInfo(timezone) if timezone else None

    def day_of(self, ts: float) -> int:
        """The day number holding unix time ``ts``."""
        return datetime.fromtimestamp(ts, self.zone).date().toordinal() - _EPOCH_ORDINAL

    def to_date(self, day: int) -> date:
        """The date of a day number."""
        return date.fromordinal(day + _EPOCH_ORDINAL)

    def from_date(self, d: date) -> int:
        """The day number of a date."""
        return d.toordinal() - _EPOCH_ORDINAL

    def _midnight(self, day: int) -> datetime:
        at = datetime.combine(self.to_date(day), time(), tzinfo=self.zone)
        return at.astimezone() if self.zone is None else at

    def start(self, day: int) -> float:
        """Unix time the day starts (where midnight falls in a DST gap: the transition)."""
        return self._midnight(day).timestamp()

    def label(self, day: int) -> str:
        """The day's start in RFC 3339 with the zone's offset, so a reader elsewhere knows
        which day it is."""
        return self._midnight(day).isoformat()


@dataclass(eq=False, slots=True)
class Reservation:
    """Tokens held against a key's and tenant's budget for ``day``; each request holds its own."""

    key: str
    tenant: str
    day: int
    tokens: int
    open: bool = True


@dataclass(frozen=True, slots=True)
class Refusal:
    """A reservation that did not fit ``budget``. ``retry_after``: seconds to the next day
    (at least 1), or ``None`` when the estimate exceeds the whole daily budget."""

    budget: Budget
    retry_after: float | None


def estimate_tokens(prompt_tokens: int, max_tokens: int | None,
                    default_completion: int = DEFAULT_COMPLETION_ESTIMATE) -> int:
    """A request's reservation: prompt tokens plus ``max_tokens`` or ``default_completion``.
    Negatives count as 0; at least 1, so a spent budget refuses everything."""
    completion = default_completion if max_tokens is None else max_tokens
    return min(MAX_ESTIMATE, max(1, max(0, prompt_tokens) + max(0, completion)))


def rpm_estimate(prev: float, cur: float, elapsed: float) -> float:
    """The last minute's requests; ``elapsed``: the share of the current minute gone."""
    return prev * (1.0 - elapsed) + cur


def rpm_wait(prev: float, cur: float, limit: int, elapsed: float) -> float:
    """Seconds until one more request fits ``limit`` (estimate + 1 ≤ limit) if nothing else
    is admitted meanwhile; 0 when it fits now. A limit below 1 admits nothing: 60 s."""
    room = limit - 1
    if room < 0:
        return 60.0
    if rpm_estimate(prev, cur, elapsed) <= room + _RPM_SLACK * max(1, limit):
        return 0.0
    if cur <= room:  # fits later this minute, as the previous minute's share shrinks
        return (1.0 - (room - cur) / prev - elapsed) * 60.0
    # Only next minute, when this minute's count is the one that shrinks.
    return (1.0 - elapsed) * 60.0 + (1.0 - room / cur) * 60.0


def columns(by: GroupBy) -> tuple[str, ...]:
    """The columns of a usage row grouped ``by``: JSON fields and CSV header alike."""
    return ("day", by, *COUNT_FIELDS)


def to_csv(rows: Iterable[Mapping[str, str | int]], by: GroupBy) -> str:
    """Rows as CSV (RFC 4180, CRLF), with a header of ``columns(by)``."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns(by), extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _bump(index: dict[tuple[int, str], int], at: tuple[int, str], delta: int) -> None:
    value = index.get(at, 0) + delta
    if value:
        index[at] = value
    else:
        index.pop(at, None)


def _count(raw: Mapping[str, object], name: str) -> int:
    value = raw.get(name)
    if type(value) is not int or value < 0:
        raise ValueError(f"usage cell: {name} must be a non-negative integer, not {value!r}")
    return value


def _text(raw: Mapping[str, object], name: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str):
        raise ValueError(f"usage cell: {name} must be a string, not {value!r}")
    return value


def parse_cell(raw: Mapping[str, object]) -> tuple[CellKey, Counts]:
    """One exported cell back; ``ValueError`` names what is malformed."""
    try:
        kind = Kind(raw.get("kind"))
    except ValueError:
        raise ValueError(
            f"usage cell: kind must be 'day' or 'minute', not {raw.get('kind')!r}") from None
    bucket = raw.get("bucket")
    if type(bucket) is not int:
        raise ValueError(f"usage cell: bucket must be an integer, not {bucket!r}")
    model = _text(raw, "model")
    if kind is Kind.MINUTE and model:
        raise ValueError(f"usage cell: a minute cell has no model, not {model!r}")
    cell = CellKey(_text(raw, "origin"), kind, bucket, _text(raw, "key"), _text(raw, "tenant"),
                   model)
    return cell, Counts(*(_count(raw, name) for name in COUNT_FIELDS))


@dataclass(slots=True)
class PeerReserved:
    """A peer's open reservations for ``day`` as last reported, and when (our clock)."""

    heard_at: float
    day: int
    keys: dict[str, int]
    tenants: dict[str, int]


def _reserved_names(raw: object, name: str) -> dict[str, int]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"reserved.{name}: expected an object, got {type(raw).__name__}")
    if len(raw) > MAX_RESERVED_NAMES:
        raise ValueError(f"reserved.{name}: {len(raw)} entries, more than "
                         f"{MAX_RESERVED_NAMES}")
    out: dict[str, int] = {}
    for k, v in raw.items():
        if not isinstance(k, str) or type(v) is not int or not 0 <= v <= MAX_ESTIMATE:
            raise ValueError(f"reserved.{name}: expected names to non-negative integers, "
                             f"got {k!r}: {v!r}")
        if v:
            out[k] = v
    return out


class Ledger:
    """This process's usage cells, copies of its peers', and its open reservations.
    ``origin`` is stable across restarts when the state file is reloaded, so restored cells
    keep counting up; ``retention_days`` counts today."""

    def __init__(self, clock: IReactorTime, origin: str, timezone: str | None = None,
                 retention_days: int = DEFAULT_RETENTION_DAYS,
                 on_reserve: Callable[[], None] | None = None) -> None:
        self.clock = clock
        self.origin = origin
        self.calendar = Calendar(timezone)
        self.retention_days = retention_days
        self._cells: dict[CellKey, Counts] = {}
        self._buckets: dict[tuple[Kind, int], set[CellKey]] = {}
        # Sums over origins, kept as cells change (so admission is O(1)):
        # (minute, key or tenant) -> requests; (day, key or tenant) -> known tokens.
        self._key_minute: dict[tuple[int, str], int] = {}
        self._tenant_minute: dict[tuple[int, str], int] = {}
        self._key_tokens: dict[tuple[int, str], int] = {}
        self._tenant_tokens: dict[tuple[int, str], int] = {}
        # (day, key or tenant) -> tokens held by open reservations.
        self._key_reserved: dict[tuple[int, str], int] = {}
        self._tenant_reserved: dict[tuple[int, str], int] = {}
        #: Peers' open reservations by origin (their in-flight requests' held tokens).
        self.peers: dict[str, PeerReserved] = {}
        #: Called after a reservation against a limit (``PeerNode.kick``: peers learn at once).
        self.on_reserve = on_reserve
        self._day: int | None = None
        self._day_start = math.inf
        self._day_end = -math.inf
        self._minute: int | None = None

    # -- time --------------------------------------------------------------------------

    def _today(self) -> int:
        """Today's day number; a new day drops Day cells past retention."""
        now = self.clock.seconds()
        if not self._day_start <= now < self._day_end or self._day is None:
            day = self.calendar.day_of(now)
            self._day_start, self._day_end = self.calendar.start(day), self.calendar.start(day + 1)
            if day != self._day:
                self._day = day
                for kind, bucket in list(self._buckets):
                    if kind is Kind.DAY and bucket <= day - self.retention_days:
                        self._drop_bucket(kind, bucket)
            return day
        return self._day

    def _this_minute(self, now: float | None = None) -> int:
        """The unix minute of ``now``; a new minute drops Minute cells the window no longer
        reads."""
        minute = math.floor((self.clock.seconds() if now is None else now) / 60.0)
        if minute != self._minute:
            self._minute = minute
            for kind, bucket in list(self._buckets):
                if kind is Kind.MINUTE and bucket <= minute - MINUTE_CELLS_KEPT:
                    self._drop_bucket(kind, bucket)
        return minute

    def today(self) -> date:
        """Today's date in the usage timezone."""
        return self.calendar.to_date(self._today())

    # -- cells -------------------------------------------------------------------------

    def _index(self, cell: CellKey, requests: int, tokens: int) -> None:
        if cell.kind is Kind.MINUTE:
            _bump(self._key_minute, (cell.bucket, cell.key), requests)
            _bump(self._tenant_minute, (cell.bucket, cell.tenant), requests)
        else:
            _bump(self._key_tokens, (cell.bucket, cell.key), tokens)
            _bump(self._tenant_tokens, (cell.bucket, cell.tenant), tokens)

    def _put(self, cell: CellKey, counts: Counts) -> None:
        old = self._cells.get(cell)
        if old is None:
            self._buckets.setdefault((cell.kind, cell.bucket), set()).add(cell)
            old = ZERO
        self._cells[cell] = counts
        self._index(cell, counts.requests - old.requests, counts.tokens - old.tokens)

    def _drop_bucket(self, kind: Kind, bucket: int) -> None:
        for cell in self._buckets.pop((kind, bucket), ()):
            old = self._cells.pop(cell)
            self._index(cell, -old.requests, -old.tokens)

    def _add(self, kind: Kind, bucket: int, key: str, tenant: str, model: str,
             delta: Counts) -> None:
        """Increment one of this origin's own cells (the only cells a process increments)."""
        cell = CellKey(self.origin, kind, bucket, key, tenant, model)
        self._put(cell, self._cells.get(cell, ZERO) + delta)

    def export(self, *, minutes: bool = True) -> list[Row]:
        """Every live cell of every origin as JSON-able dicts, in a fixed order. The state
        file passes ``minutes=False``: Minute cells are never persisted."""
        self._today()
        self._this_minute()
        out: list[Row] = []
        for cell in sorted(self._cells, key=CellKey.sort_key):
            if cell.kind is Kind.MINUTE and not minutes:
                continue
            counts = self._cells[cell]
            out.append({"origin": cell.origin, "kind": cell.kind.value, "bucket": cell.bucket,
                        "key": cell.key, "tenant": cell.tenant, "model": cell.model,
                        **{name: getattr(counts, name) for name in COUNT_FIELDS}})
        return out

    def iter_export(self, *, minutes: bool = True) -> Iterator[Row]:
        """``export`` one cell at a time, unordered, with counts as they are when it comes (a
        cell dropped meanwhile is left out). Only the keys are copied: new (cell, counts)
        pairs would outlive young collections and bring on a full GC."""
        self._today()
        self._this_minute()
        cells, table = list(self._cells), self._cells
        return (
            {"origin": cell.origin, "kind": cell.kind.value, "bucket": cell.bucket,
             "key": cell.key, "tenant": cell.tenant, "model": cell.model,
             **{name: getattr(counts, name) for name in COUNT_FIELDS}}
            for cell in cells if minutes or cell.kind is not Kind.MINUTE
            if (counts := table.get(cell)) is not None)

    def merge(self, exported: Iterable[Mapping[str, object]]) -> int:
        """Fold in exported cells, field-wise max per cell; all or nothing (``ValueError``
        before any is merged). Expired cells are skipped. Returns how many changed."""
        parsed = [parse_cell(raw) for raw in exported]
        today, minute = self._today(), self._this_minute()
        changed = 0
        for cell, counts in parsed:
            if cell.kind is Kind.MINUTE and cell.bucket <= minute - MINUTE_CELLS_KEPT:
                continue
            if cell.kind is Kind.DAY and cell.bucket <= today - self.retention_days:
                continue
            old = self._cells.get(cell)
            new = counts if old is None else old.max(counts)
            if new != old:
                self._put(cell, new)
                changed += 1
        return changed

    # -- requests per minute -----------------------------------------------------------

    def admit_rpm(self, key: str, tenant: str, limit: int | None,
                  tenant_limit: int | None = None) -> float | None:
        """Admit and count one request under the key's and tenant's RPM limits; or count
        nothing and return the seconds (≥ 1) until the window leaves room for it."""
        now = self.clock.seconds()
        minute = self._this_minute(now)
        elapsed = now / 60.0 - minute
        wait = 0.0
        for index, name, cap in ((self._key_minute, key, limit),
                                 (self._tenant_minute, tenant, tenant_limit)):
            if cap is not None:
                wait = max(wait, rpm_wait(index.get((minute - 1, name), 0),
                                          index.get((minute, name), 0), cap, elapsed))
        if wait > 0.0:
            return max(1.0, wait)
        self._add(Kind.MINUTE, minute, key, tenant, "", Counts(requests=1))
        return None

    # -- tokens per day ----------------------------------------------------------------

    def _pick(self, key: str | None, tenant: str | None, by_key: dict[tuple[int, str], int],
              by_tenant: dict[tuple[int, str], int]) -> int:
        if key is not None:
            return by_key.get((self._today(), key), 0)
        if tenant is not None:
            return by_tenant.get((self._today(), tenant), 0)
        raise TypeError("name a key or a tenant")

    def spent_today(self, *, key: str | None = None, tenant: str | None = None) -> int:
        """Known tokens counted today for a key or a tenant, summed over origins."""
        return self._pick(key, tenant, self._key_tokens, self._tenant_tokens)

    def reserved_today(self, *, key: str | None = None, tenant: str | None = None) -> int:
        """Tokens held today by this process's open reservations for a key or a tenant."""
        return self._pick(key, tenant, self._key_reserved, self._tenant_reserved)

    def reserve(self, key: str, tenant: str, tokens: int, key_limit: int | None,
                tenant_limit: int | None = None) -> Reservation | Refusal:
        """Hold ``tokens`` against today's remaining budget of the key and its tenant, or
        refuse naming the budget that does not fit. Spent plus held never passes a limit,
        which bounds overspend to what requests use beyond their estimates."""
        tokens = max(1, tokens)
        day = self._today()
        checks: tuple[tuple[Budget, int | None, dict[tuple[int, str], int],
                            dict[tuple[int, str], int], str], ...] = (
            ("key", key_limit, self._key_tokens, self._key_reserved, key),
            ("tenant", tenant_limit, self._tenant_tokens, self._tenant_reserved, tenant))
        for budget, limit, spent, held, name in checks:
            if limit is None:
                continue
            if tokens > limit:
                return Refusal(budget, None)
            theirs = self._peers_reserved(day, budget, name) if self.peers else 0
            if spent.get((day, name), 0) + held.get((day, name), 0) + theirs + tokens > limit:
                return Refusal(budget, max(1.0, self._day_end - self.clock.seconds()))
        _bump(self._key_reserved, (day, key), tokens)
        _bump(self._tenant_reserved, (day, tenant), tokens)
        if self.on_reserve is not None and (key_limit is not None or tenant_limit is not None):
            self.on_reserve()
        return Reservation(key, tenant, day, tokens)

    def _close(self, reservation: Reservation) -> bool:
        if not reservation.open:
            return False
        reservation.open = False
        _bump(self._key_reserved, (reservation.day, reservation.key), -reservation.tokens)
        _bump(self._tenant_reserved, (reservation.day, reservation.tenant),
              -reservation.tokens)
        return True

    def release(self, reservation: Reservation) -> bool:
        """Free a reservation with nothing counted: the client left while queued, or the
        request was refused after admission. False if it was already closed."""
        return self._close(reservation)

    def settle(self, reservation: Reservation, model: str, prompt_tokens: int | None,
               cached_tokens: int | None, completion_tokens: int | None) -> bool:
        """Replace the reservation with the reply's real usage, counted today. Unknown (or
        negative) prompt or completion tokens count the request as unmetered, never as 0.
        False, nothing counted, if already closed (a retried request counts once)."""
        if not self._close(reservation):
            return False
        if prompt_tokens is None or completion_tokens is None or min(
                prompt_tokens, completion_tokens) < 0:
            delta = Counts(requests=1, unmetered=1)
        else:
            cached = cached_tokens if cached_tokens is not None and cached_tokens > 0 else 0
            delta = Counts(requests=1, prompt_tokens=prompt_tokens, cached_tokens=cached,
                           completion_tokens=completion_tokens)
        self._add(Kind.DAY, self._today(), reservation.key, reservation.tenant, model, delta)
        return True

    # -- peers' reservations ----------------------------------------------------------------

    def export_reserved(self) -> dict[str, object]:
        """Today's open reservations per key and tenant, absolute (gauges, so peers count
        each other's in-flight requests against a budget)."""
        day = self._today()
        return {"day": day,
                "keys": {k: n for (d, k), n in self._key_reserved.items() if d == day},
                "tenants": {t: n for (d, t), n in self._tenant_reserved.items() if d == day}}

    def merge_reserved(self, origin: str, raw: object, now: float) -> None:
        """A peer's reservations replace its previous report (kept on ``ValueError``); they
        count until the peer is silent ``PEER_SILENCE_SEC``."""
        if raw is None:
            self.peers.pop(origin, None)
            return
        if not isinstance(raw, Mapping):
            raise ValueError(f"reserved: expected an object, got {type(raw).__name__}")
        day = raw.get("day")
        if type(day) is not int:
            raise ValueError(f"reserved.day: expected an integer, got {day!r}")
        self.peers[origin] = PeerReserved(now, day, _reserved_names(raw.get("keys"), "keys"),
                                          _reserved_names(raw.get("tenants"), "tenants"))

    def forget_reserved(self, origin: str) -> None:
        """Drop a peer's reservations at once (it is leaving)."""
        self.peers.pop(origin, None)

    def peers_reserved(self, *, key: str | None = None, tenant: str | None = None) -> int:
        """Tokens live peers hold today for a key or a tenant."""
        if key is not None:
            return self._peers_reserved(self._today(), "key", key)
        if tenant is not None:
            return self._peers_reserved(self._today(), "tenant", tenant)
        raise TypeError("name a key or a tenant")

    def _peers_reserved(self, day: int, budget: Budget, name: str) -> int:
        now = self.clock.seconds()
        total = 0
        for origin, p in list(self.peers.items()):
            if p.heard_at > now:
                p.heard_at = now  # the clock went back: silence counts from now
            if now - p.heard_at >= PEER_SILENCE_SEC:
                del self.peers[origin]
                continue
            if p.day == day:
                total += (p.keys if budget == "key" else p.tenants).get(name, 0)
        return total

    def export_recent(self) -> list[Row]:
        """Own cells a delta carries (Day: today and yesterday; Minute: current and previous),
        absolute, so a lost delta is repaired by the next."""
        today, minute = self._today(), self._this_minute()
        out: list[Row] = []
        for bucket in ((Kind.DAY, today - 1), (Kind.DAY, today), (Kind.MINUTE, minute - 1),
                       (Kind.MINUTE, minute)):
            for cell in sorted(self._buckets.get(bucket, ()), key=CellKey.sort_key):
                if cell.origin != self.origin:
                    continue
                counts = self._cells[cell]
                out.append({"origin": cell.origin, "kind": cell.kind.value,
                            "bucket": cell.bucket, "key": cell.key, "tenant": cell.tenant,
                            "model": cell.model,
                            **{name: getattr(counts, name) for name in COUNT_FIELDS}})
        return out

    # -- history -----------------------------------------------------------------------

    def rows(self, from_day: date, to_day: date, by: GroupBy = "key") -> list[Row]:
        """Usage per day (inclusive range) and per ``by``, summed over origins, ordered by day
        then group; days without usage have no rows."""
        if by not in get_args(GroupBy):
            raise ValueError(f"by must be one of {get_args(GroupBy)}, not {by!r}")
        self._today()
        low, high = self.calendar.from_date(from_day), self.calendar.from_date(to_day)
        days = sorted(bucket for kind, bucket in self._buckets
                      if kind is Kind.DAY and low <= bucket <= high)
        out: list[Row] = []
        for day in days:
            groups: dict[str, Counts] = {}
            for cell in self._buckets[(Kind.DAY, day)]:
                group = getattr(cell, by)
                groups[group] = groups.get(group, ZERO) + self._cells[cell]
            label = self.calendar.label(day)
            for group in sorted(groups):
                counts = groups[group]
                out.append({"day": label, by: group,
                            **{name: getattr(counts, name) for name in COUNT_FIELDS}})
        return out

