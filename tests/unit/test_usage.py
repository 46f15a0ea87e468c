"""Layer 1: usage cells and quotas (``pharos.usage``, spec §11, issue 11 items 3 and 5): merge
by field-wise max (commutative, idempotent, associative), totals over origins, the RPM
sliding window and its retry-after, daily token budgets held by reservation and reconciled
with the real usage (the overspend bound), unmetered requests, history rows and CSV in the
usage timezone."""

from __future__ import annotations

import csv
import io
import os
import random
import time
from collections.abc import Iterator
from datetime import date, datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from pharos.usage import (
    COUNT_FIELDS,
    MAX_ESTIMATE,
    Budget,
    Calendar,
    Ledger,
    Refusal,
    Reservation,
    Row,
    columns,
    estimate_tokens,
    rpm_estimate,
    rpm_wait,
    to_csv,
)

BANGKOK = "Asia/Bangkok"  # +07:00, no daylight saving


def at(text: str, zone: str = BANGKOK) -> float:
    """Unix time of a local wall-clock time in ``zone``."""
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone)).timestamp()


def ledger(now: float, origin: str = "a", zone: str | None = BANGKOK,
           retention_days: int = 400) -> tuple[Ledger, Clock]:
    clock = Clock()
    clock.advance(now)
    return Ledger(clock, origin, zone, retention_days), clock


def reserved(book: Ledger, key: str, tenant: str, tokens: int,
             key_limit: int | None = None, tenant_limit: int | None = None) -> Reservation:
    got = book.reserve(key, tenant, tokens, key_limit, tenant_limit)
    assert isinstance(got, Reservation), got
    return got


def refused(got: Reservation | Refusal, budget: Budget, retry_after: float | None) -> bool:
    """``got`` is a refusal by ``budget`` with that retry-after (to the millisecond)."""
    assert isinstance(got, Refusal), got
    if retry_after is None or got.retry_after is None:
        return got == Refusal(budget, retry_after)
    return got.budget == budget and abs(got.retry_after - retry_after) < 1e-3


def serve(book: Ledger, key: str, tenant: str, model: str, prompt: int, completion: int,
          cached: int = 0) -> None:
    """One request with no limits, settled with known usage."""
    assert book.settle(reserved(book, key, tenant, prompt + completion), model, prompt,
                       cached, completion)


# -- cells, export and merge -------------------------------------------------------------

def test_settle_counts_the_real_usage_in_todays_day_cell() -> None:
    """A settled request adds one request and the engine's token counts to this origin's
    Day cell for (today, key, tenant, model), where today is the date in usage.timezone."""
    book, _ = ledger(at("2026-09-28T23:30:00"))
    serve(book, "k", "t", "m", prompt=100, completion=20, cached=64)
    [cell] = book.export()
    assert cell == {"origin": "a", "kind": "day",
                    "bucket": Calendar(BANGKOK).from_date(date(2026, 9, 28)), "key": "k",
                    "tenant": "t", "model": "m", "requests": 1, "prompt_tokens": 100,
                    "cached_tokens": 64, "completion_tokens": 20, "unmetered": 0}
    assert book.spent_today(key="k") == 120
    assert book.spent_today(tenant="t") == 120


NOW = at("2026-09-28T12:00:30")
TODAY = Calendar(BANGKOK).day_of(NOW)
MINUTE = int(NOW // 60)

cell_keys = st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["day", "minute"]),
                      st.sampled_from([0, 1]), st.sampled_from(["k1", "k2"]),
                      st.sampled_from(["m1", "m2"]))
exported_cells = st.lists(
    st.tuples(cell_keys, st.lists(st.integers(0, 50), min_size=5, max_size=5)),
    max_size=12).map(lambda raw: [
        {"origin": origin, "kind": kind,
         "bucket": (TODAY - ago) if kind == "day" else (MINUTE - ago), "key": key,
         "tenant": "t", "model": model if kind == "day" else "",
         **dict(zip(COUNT_FIELDS, counts, strict=True))}
        for (origin, kind, ago, key, model), counts in raw])


def merged(*exports: list[Row]) -> list[Row]:
    book, _ = ledger(NOW)
    for exported in exports:
        book.merge(exported)
    return book.export()


@settings(max_examples=200)
@given(st.lists(exported_cells, min_size=1, max_size=5), st.randoms())
def test_merge_is_commutative_and_idempotent(exports: list[list[Row]],
                                             rng: random.Random) -> None:
    """Merging the same exports in any order, with any of them repeated, gives the same
    cells: deltas may arrive late, twice or out of order."""
    shuffled = [*exports, *rng.choices(exports, k=rng.randint(0, 4))]
    rng.shuffle(shuffled)
    assert merged(*shuffled) == merged(*exports)


@given(exported_cells, exported_cells, exported_cells)
def test_merge_is_associative(a: list[Row], b: list[Row], c: list[Row]) -> None:
    """(a ∪ b) ∪ c = a ∪ (b ∪ c): a peer relaying what it merged gives the same result as
    hearing each origin directly."""
    assert merged(merged(a, b), c) == merged(a, merged(b, c))


@given(exported_cells)
def test_merge_keeps_the_field_wise_max(cells: list[Row]) -> None:
    """Each merged cell holds the max of every copy of it, field by field."""
    book, _ = ledger(NOW)
    book.merge(cells)
    got = {(c["origin"], c["kind"], c["bucket"], c["key"], c["model"]): c
           for c in book.export()}
    for cell in cells:
        have = got[(cell["origin"], cell["kind"], cell["bucket"], cell["key"], cell["model"])]
        for name in COUNT_FIELDS:
            assert int(have[name]) >= int(cell[name])
    for name in COUNT_FIELDS:
        for ident, have in got.items():
            copies = [int(c[name]) for c in cells
                      if (c["origin"], c["kind"], c["bucket"], c["key"], c["model"]) == ident]
            assert have[name] == max(copies)


def test_a_stale_echo_of_own_cells_changes_nothing() -> None:
    """A peer echoing an older copy of this origin's cell does not lower it, and later
    increments keep counting up from the higher value."""
    book, _ = ledger(NOW)
    serve(book, "k", "t", "m", 10, 5)
    old = book.export()
    serve(book, "k", "t", "m", 10, 5)
    assert book.merge(old) == 0
    serve(book, "k", "t", "m", 10, 5)
    assert book.spent_today(key="k") == 45


def test_totals_sum_over_origins() -> None:
    """Two origins' cells for the same key add up in spend and rows; neither replaces the
    other."""
    a, _ = ledger(NOW, "a")
    b, _ = ledger(NOW, "b")
    serve(a, "k", "t", "m", 100, 10)
    serve(b, "k", "t", "m", 200, 20)
    a.merge(b.export())
    assert a.spent_today(key="k") == 330
    [row] = a.rows(date(2026, 9, 28), date(2026, 9, 28))
    assert (row["requests"], row["prompt_tokens"], row["completion_tokens"]) == (2, 300, 30)


@pytest.mark.parametrize("bad", [
    {"kind": "hour"}, {"bucket": "1"}, {"requests": -1}, {"prompt_tokens": True},
    {"origin": 7}, {"model": "m", "kind": "minute"}, {"unmetered": None}])
def test_merge_refuses_a_malformed_cell_and_merges_nothing(bad: dict[str, object]) -> None:
    """A malformed cell (wrong kind, types, negative or boolean counts, a model on a minute
    cell) raises ValueError naming it, and the good cells beside it are not merged."""
    book, _ = ledger(NOW)
    good: dict[str, object] = {"origin": "b", "kind": "day", "bucket": TODAY, "key": "k",
                               "tenant": "t", "model": "m", "requests": 1,
                               "prompt_tokens": 1, "cached_tokens": 0,
                               "completion_tokens": 1, "unmetered": 0}
    with pytest.raises(ValueError, match="usage cell"):
        book.merge([good, {**good, **bad}])
    assert book.export() == []


def test_minute_cells_older_than_two_minutes_are_dropped_and_never_persisted() -> None:
    """Minute cells live for the current and the previous minute only: older ones leave the
    export and are skipped when merged; ``export(minutes=False)`` (the state file) has no
    Minute cells at all."""
    book, clock = ledger(at("2026-09-28T12:00:00"))
    assert book.admit_rpm("k", "t", None) is None
    serve(book, "k", "t", "m", 1, 1)
    kinds = [c["kind"] for c in book.export()]
    assert sorted(kinds) == ["day", "minute"]
    assert [c["kind"] for c in book.export(minutes=False)] == ["day"]
    clock.advance(60)
    assert sorted(c["kind"] for c in book.export()) == ["day", "minute"]
    clock.advance(60)
    stale = [{**c, "origin": "b"} for c in book.export()]
    assert [c["kind"] for c in book.export()] == ["day"]
    old_minute = {**stale[0], "kind": "minute", "bucket": int(clock.seconds() // 60) - 2,
                  "model": ""}
    book.merge([old_minute])
    assert [c["kind"] for c in book.export()] == ["day"]


def test_day_cells_are_kept_for_retention_days() -> None:
    """Day cells stay for ``retention_days`` days including today, then leave the history,
    the export and the merge."""
    book, clock = ledger(at("2026-09-28T12:00:00"), retention_days=3)
    serve(book, "k", "t", "m", 1, 1)
    copy = book.export()
    clock.advance(2 * 86400)
    assert len(book.rows(date(2026, 9, 1), date(2026, 10, 30))) == 1
    clock.advance(86400)
    assert book.rows(date(2026, 9, 1), date(2026, 10, 30)) == []
    assert book.export() == []
    assert book.merge(copy) == 0


# -- requests per minute -----------------------------------------------------------------

def test_rpm_admits_up_to_the_limit_and_does_not_count_refusals() -> None:
    """Within one minute the key gets exactly ``limit`` requests; the refused ones are not
    counted, so the next minute's window holds only the admitted ones."""
    book, clock = ledger(at("2026-09-28T12:00:00"))
    got = [book.admit_rpm("k", "t", 10) for _ in range(25)]
    assert got[:10] == [None] * 10
    assert all(wait is not None and wait >= 1 for wait in got[10:])
    [minute] = [c for c in book.export() if c["kind"] == "minute"]
    assert minute["requests"] == 10
    # Half a minute on: the previous minute weighs half, so 5 more fit.
    clock.advance(90)
    assert [book.admit_rpm("k", "t", 10) for _ in range(6)] == [None] * 5 + [
        pytest.approx(6.0)]


def test_rpm_is_per_key_and_the_tenant_limit_spans_its_keys() -> None:
    """Keys have separate windows; a tenant limit counts the requests of all its keys."""
    book, _ = ledger(at("2026-09-28T12:00:00"))
    for _ in range(3):
        assert book.admit_rpm("k1", "t", 3) is None
        assert book.admit_rpm("k2", "u", 3) is None
    assert book.admit_rpm("k1", "t", 3) is not None
    assert book.admit_rpm("k3", "u", 3, tenant_limit=4) is None
    assert book.admit_rpm("k4", "u", None, tenant_limit=4) is not None


def test_peer_minute_cells_count_in_the_window() -> None:
    """Admissions another instance counted (merged Minute cells) fill this instance's window
    too: the RPM limit holds across instances, within one sync tick."""
    a, _ = ledger(at("2026-09-28T12:00:00"), "a")
    b, _ = ledger(at("2026-09-28T12:00:00"), "b")
    for _ in range(4):
        assert b.admit_rpm("k", "t", 5) is None
    a.merge(b.export())
    assert a.admit_rpm("k", "t", 5) is None
    assert a.admit_rpm("k", "t", 5) is not None


@given(st.integers(1, 500), st.integers(0, 600), st.integers(0, 600),
       st.floats(0.0, 0.999))
def test_rpm_wait_names_the_moment_the_request_fits(limit: int, prev: int, cur: int,
                                                    elapsed: float) -> None:
    """``rpm_wait`` is exact: with nothing else admitted, the request fits (estimate + 1 ≤
    limit) at that many seconds from now and not half a second earlier."""
    wait = rpm_wait(prev, cur, limit, elapsed)

    def fits_after(seconds: float) -> bool:
        t = elapsed + seconds / 60.0
        p, c = (prev, cur) if t < 1 else (cur, 0) if t < 2 else (0, 0)
        return rpm_estimate(p, c, t % 1) + 1 <= limit + 1e-6

    assert fits_after(wait)
    if wait > 0.5:
        assert not fits_after(wait - 0.5)
    assert wait <= (2 - elapsed) * 60 + 1e-9


def test_rpm_retry_after_admits_when_it_says() -> None:
    """The retry-after of a refusal is at least 1 s, and a retry that waited it is admitted."""
    book, clock = ledger(at("2026-09-28T12:00:10"))
    for _ in range(60):
        book.admit_rpm("k", "t", 60)
    wait = book.admit_rpm("k", "t", 60)
    assert wait is not None and wait >= 1
    clock.advance(wait - 0.5)
    assert book.admit_rpm("k", "t", 60) is not None
    clock.advance(0.5)
    assert book.admit_rpm("k", "t", 60) is None


# -- tokens per day: reservation and reconciliation --------------------------------------

def test_estimate_is_prompt_plus_max_tokens_or_the_default_and_capped() -> None:
    """The estimate adds max_tokens (or the documented default) to the prompt estimate,
    counts negatives as 0 and is at least 1, and saturates at MAX_ESTIMATE however large
    max_tokens is."""
    assert estimate_tokens(100, 50) == 150
    assert estimate_tokens(100, None, default_completion=1024) == 1124
    assert estimate_tokens(-5, -5) == 1
    assert estimate_tokens(10, 10**30) == MAX_ESTIMATE


def test_a_huge_max_tokens_is_refused_cleanly() -> None:
    """max_tokens of 10^9 does not fit a daily budget: refused with no retry-after (waiting
    cannot help), nothing held; without a limit it is admitted and held as a plain int."""
    book, _ = ledger(NOW)
    tokens = estimate_tokens(100, 10**9)
    assert refused(book.reserve("k", "t", tokens, 1_000_000), "key", None)
    assert book.reserved_today(key="k") == 0
    held = reserved(book, "k", "t", estimate_tokens(100, 10**40))
    assert held.tokens == MAX_ESTIMATE


def test_held_tokens_count_against_the_budget_until_settled() -> None:
    """Open reservations use up the remaining budget; settling replaces the hold with the
    real usage, so what the estimate over-held is free again."""
    book, _ = ledger(NOW)
    first = reserved(book, "k", "t", 600, key_limit=1000)
    assert isinstance(book.reserve("k", "t", 600, 1000), Refusal)
    assert book.settle(first, "m", 150, 0, 50)
    assert book.spent_today(key="k") == 200
    assert book.reserved_today(key="k") == 0
    reserved(book, "k", "t", 800, key_limit=1000)
    assert refused(book.reserve("k", "t", 1, 1000), "key", at("2026-09-29T00:00:00") - NOW)


def test_refusal_names_the_tenant_budget_and_the_next_day() -> None:
    """The tenant's budget spans its keys; a refusal by it says "tenant", and its
    retry-after is the seconds to the next midnight in the usage timezone."""
    book, _ = ledger(at("2026-09-28T23:00:00"))
    reserved(book, "k1", "t", 700, 1000, 1000)
    assert refused(book.reserve("k2", "t", 400, 1000, 1000), "tenant", 3600)
    assert isinstance(book.reserve("k2", "t", 400, 1000, None), Reservation)


def test_the_budget_refills_at_midnight_in_the_usage_timezone() -> None:
    """A spent budget admits again once the day changes in usage.timezone (not UTC)."""
    book, clock = ledger(at("2026-09-28T23:59:00"))
    book.settle(reserved(book, "k", "t", 1000, 1000), "m", 900, 0, 100)
    assert refused(book.reserve("k", "t", 1, 1000), "key", 60)
    clock.advance(60)
    assert isinstance(book.reserve("k", "t", 1000, 1000), Reservation)


def test_unknown_usage_is_unmetered_never_zero() -> None:
    """Settling with unknown prompt or completion counts releases the hold and counts a
    request and an unmetered one, with no tokens: not 0 tokens as if known."""
    book, _ = ledger(NOW)
    book.settle(reserved(book, "k", "t", 500, 1000), "m", None, None, None)
    book.settle(reserved(book, "k", "t", 500, 1000), "m", 30, None, None)
    book.settle(reserved(book, "k", "t", 500, 1000), "m", 30, 0, -1)
    [row] = book.rows(date(2026, 9, 28), date(2026, 9, 28))
    assert (row["requests"], row["unmetered"], row["prompt_tokens"]) == (3, 3, 0)
    assert book.reserved_today(key="k") == 0
    assert book.spent_today(key="k") == 0


def test_release_frees_the_hold_and_counts_nothing() -> None:
    """A request released (client left while queued, refused later) holds nothing and is
    counted nowhere."""
    book, _ = ledger(NOW)
    held = reserved(book, "k", "t", 1000, 1000)
    assert book.release(held)
    assert book.reserved_today(key="k") == 0
    assert book.export() == []
    assert isinstance(book.reserve("k", "t", 1000, 1000), Reservation)


def test_settling_or_releasing_twice_counts_once() -> None:
    """A second settle or release of the same reservation is a no-op (a retried request is
    counted once) and never frees another request's hold."""
    book, _ = ledger(NOW)
    first = reserved(book, "k", "t", 100)
    other = reserved(book, "k", "t", 300)
    assert book.settle(first, "m", 10, 0, 10)
    assert not book.settle(first, "m", 10, 0, 10)
    assert not book.release(first)
    assert book.reserved_today(key="k") == 300
    assert book.spent_today(key="k") == 20
    assert book.release(other) and not book.settle(other, "m", 1, 0, 1)
    assert [c["requests"] for c in book.export()] == [1]


def test_a_request_across_midnight_frees_yesterdays_hold_and_counts_today() -> None:
    """Tokens count when the reply ends: a request admitted before midnight and finished
    after it frees the previous day's hold and is counted in the new day."""
    book, clock = ledger(at("2026-09-28T23:59:50"))
    held = reserved(book, "k", "t", 500, 1000)
    clock.advance(20)
    book.settle(held, "m", 100, 0, 100)
    assert book.spent_today(key="k") == 200
    assert book.reserved_today(key="k") == 0
    assert [r["day"] for r in book.rows(date(2026, 9, 28), date(2026, 9, 29))] == [
        "2026-09-29T00:00:00+07:00"]
    clock.advance(-20)
    assert book.reserved_today(key="k") == 0


def test_a_burst_at_the_quota_edge_admits_exactly_what_fits() -> None:
    """1,000 concurrent requests of one key at its quota edge: exactly the ones whose
    estimates fit are admitted while all are outstanding, and once all settle the day's
    spend is within the budget (charging after the reply would admit all 1,000)."""
    book, _ = ledger(NOW)
    limit = 50_000
    book.settle(reserved(book, "k", "t", 40_000), "m", 30_000, 0, 10_000)
    got = [book.reserve("k", "t", 300, limit) for _ in range(1000)]
    admitted = [r for r in got if isinstance(r, Reservation)]
    assert len(admitted) == 33
    for r in admitted:
        book.settle(r, "m", 200, 0, 100)
    assert book.spent_today(key="k") == 40_000 + 33 * 300 <= limit


Op = tuple[str, int, int]
ops = st.lists(st.tuples(st.sampled_from(["reserve", "reserve", "settle", "release", "lost"]),
                         st.integers(0, 10**6), st.integers(1, 400)), max_size=120)


def run(ops_: list[Op], overrun: bool) -> None:
    """Drive two keys of one tenant through reservations (estimate ``size``) settled with a
    real usage of at most the estimate (or up to 3x it when ``overrun``), released, or
    settled as unknown, checking the budgets after every step."""
    book, _ = ledger(NOW)
    key_limit, tenant_limit = 2_000, 3_000
    open_: list[Reservation] = []
    overruns = 0
    for i, (op, pick, size) in enumerate(ops_):
        key = "k1" if i % 2 else "k2"
        if op == "reserve":
            got = book.reserve(key, "t", size, key_limit, tenant_limit)
            if isinstance(got, Reservation):
                open_.append(got)
        elif open_:
            r = open_.pop(pick % len(open_))
            if op == "release":
                book.release(r)
            elif op == "lost":
                book.settle(r, "m", None, None, None)
            else:
                real = pick % (3 * r.tokens + 1 if overrun else r.tokens + 1)
                overruns += max(0, real - r.tokens)
                book.settle(r, "m", real // 2, 0, real - real // 2)
        for name in ("k1", "k2"):
            assert book.spent_today(key=name) <= key_limit + overruns
        assert book.spent_today(tenant="t") <= tenant_limit + overruns
        if not overruns:
            for name in ("k1", "k2"):
                assert (book.spent_today(key=name) + book.reserved_today(key=name)
                        <= key_limit)
            assert (book.spent_today(tenant="t") + book.reserved_today(tenant="t")
                    <= tenant_limit)


@settings(max_examples=300)
@given(ops)
def test_concurrent_reservations_never_overspend_with_true_estimates(ops_: list[Op]) -> None:
    """Any interleaving of many outstanding reservations, settles, releases and unmetered
    ends, with real usage within each estimate (max_tokens honoured): spent plus held
    never passes the key's or the tenant's budget, so the day's spend never does."""
    run(ops_, overrun=False)


@settings(max_examples=300)
@given(ops)
def test_overspend_only_comes_from_usage_beyond_estimates(ops_: list[Op]) -> None:
    """With real usage up to 3x the estimate, the day's spend passes the budget by at most
    what settled requests used beyond their estimates: reservations never add to it."""
    run(ops_, overrun=True)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.integers(1, 400), st.integers(0, 1200)), max_size=80))
def test_sequential_traffic_overspends_by_at_most_one_request(
        requests: list[tuple[int, int]]) -> None:
    """One request at a time (each settled before the next is admitted), whatever its real
    usage against its estimate: the spend passes the budget by less than one request's
    tokens, because once it is passed every reservation is refused."""
    book, _ = ledger(NOW)
    limit = 2_000
    largest = 0
    for estimate, real in requests:
        got = book.reserve("k", "t", estimate, limit)
        if isinstance(got, Reservation):
            book.settle(got, "m", real // 2, 0, real - real // 2)
            largest = max(largest, real)
        assert book.spent_today(key="k") <= limit + largest
        assert book.spent_today(key="k") - limit < max(largest, 1)


# -- history -----------------------------------------------------------------------------

def history() -> Ledger:
    book, clock = ledger(at("2026-09-27T10:00:00"))
    serve(book, "k1", "t", "m1", 10, 1, cached=4)
    clock.advance(86400)
    serve(book, "k1", "t", "m1", 20, 2)
    serve(book, "k1", "t", "m2", 30, 3, cached=8)
    serve(book, "k2", "u", "m2", 40, 4)
    book.settle(reserved(book, "k2", "u", 10), "m2", None, None, None)
    return book


def test_rows_group_by_key_model_or_tenant_with_the_days_offset() -> None:
    """Rows sum per day and per key, model or tenant, in order, with the day's start in
    RFC 3339 with the usage timezone's offset; days outside the range are left out."""
    book = history()
    assert book.rows(date(2026, 9, 28), date(2026, 9, 28), "key") == [
        {"day": "2026-09-28T00:00:00+07:00", "key": "k1", "requests": 2,
         "prompt_tokens": 50, "cached_tokens": 8, "completion_tokens": 5, "unmetered": 0},
        {"day": "2026-09-28T00:00:00+07:00", "key": "k2", "requests": 2,
         "prompt_tokens": 40, "cached_tokens": 0, "completion_tokens": 4, "unmetered": 1}]
    by_model = book.rows(date(2026, 9, 1), date(2026, 9, 30), "model")
    assert [(str(r["day"])[:10], r["model"], r["requests"]) for r in by_model] == [
        ("2026-09-27", "m1", 1), ("2026-09-28", "m1", 1), ("2026-09-28", "m2", 3)]
    by_tenant = book.rows(date(2026, 9, 28), date(2026, 9, 28), "tenant")
    assert [(r["tenant"], r["prompt_tokens"]) for r in by_tenant] == [("t", 50), ("u", 40)]
    assert book.rows(date(2026, 9, 29), date(2026, 9, 27)) == []
    with pytest.raises(ValueError, match="by must be"):
        book.rows(date(2026, 9, 28), date(2026, 9, 28), "origin")  # type: ignore[arg-type]


def test_csv_has_the_same_columns_and_values_as_the_rows() -> None:
    """The CSV has a header of the row columns and one line per row with the same values."""
    rows = history().rows(date(2026, 9, 1), date(2026, 9, 30), "model")
    text = to_csv(rows, "model")
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert text.splitlines()[0] == ",".join(columns("model"))
    assert parsed == [{name: str(value) for name, value in row.items()} for row in rows]


def test_days_follow_daylight_saving() -> None:
    """In a zone with daylight saving, the day that springs forward has 23 hours and each
    day's label carries that day's own offset."""
    cal = Calendar("Europe/Berlin")
    day = cal.from_date(date(2026, 3, 29))
    assert cal.start(day + 1) - cal.start(day) == 23 * 3600
    assert cal.label(day) == "2026-03-29T00:00:00+01:00"
    assert cal.label(day + 1) == "2026-03-30T00:00:00+02:00"
    assert cal.day_of(cal.start(day + 1) - 1) == day


@pytest.fixture
def host_zone() -> Iterator[None]:
    """The host's zone set to America/New_York for the test."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    time.tzset()
    yield
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


def test_no_timezone_means_the_hosts_zone(host_zone: None) -> None:
    """Without usage.timezone, days are the host's dates, labelled with its offset on that
    day (summer and winter differ)."""
    book, _ = ledger(at("2026-07-01T23:30:00", "America/New_York"), zone=None)
    assert book.today() == date(2026, 7, 1)
    cal = Calendar(None)
    assert cal.label(cal.from_date(date(2026, 7, 1))) == "2026-07-01T00:00:00-04:00"
    assert cal.label(cal.from_date(date(2026, 12, 1))) == "2026-12-01T00:00:00-05:00"
