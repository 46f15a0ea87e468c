"""Layer 1: the finished-request record (``Done``), its decisions from the fixed table under
every interleaving the exchange rig draws, the background rounds' decisions, the request id,
the journal line, and ``--log-level``."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.python import usage
from twisted.web.test.requesthelper import DummyRequest

from pharos.proxy.done import DECISIONS, Done, Trace, request_id
from pharos.proxy.errors import ApiError, model_not_allowed, too_large
from pharos.tap import Options
from tests.support.exchange import EVENTS, Rig
from tests.support.state import make, ollama, spec

#: The keys the usage journal wrote before ``Done`` (issue 11 item 5): still written.
JOURNAL_KEYS = {"time", "key", "tenant", "model", "route", "target", "status", "outcome",
                "prompt_tokens", "cached_tokens", "completion_tokens", "ttft_ms", "duration_ms"}


@settings(max_examples=200, deadline=None)
@given(st.lists(EVENTS, min_size=1, max_size=40))
def test_each_attempt_records_its_branches_from_the_table(events: list[tuple[Any, ...]]) -> None:
    """Whatever happens to the requests (departures, 500/503, resets, refusals, backends
    down, timeouts), every exchange's decisions come from ``DECISIONS``; each lease taken has
    one route reason and one queue outcome, no attempt has two upstream outcomes, a request
    that ended ok ends with ``upstream=ok``, and one the engine answered 503 before a retry
    shows ``busy_retried``."""
    rig = Rig()
    try:
        for e in events:
            kind = e[0]
            if kind == "request":
                rig.request()
            elif kind == "leave":
                rig.leave(e[1], e[2])
            elif kind == "headers":
                rig.headers(e[1], e[2])
            elif kind == "data":
                rig.data(e[1])
            elif kind == "end":
                rig.end(e[1], e[2])
            elif kind == "down":
                rig.down(e[1])
            else:
                rig.clock.advance(e[1])
            rig.reactor_turn()
        rig.finish()
        for _, _, _, ex in rig.requests:
            stages = Counter(s for s, _ in ex.decisions)
            for stage, outcome in ex.decisions:
                assert outcome in DECISIONS[stage], (stage, outcome)
            granted = [o for s, o in ex.decisions if s == "route"
                       and o not in ("unknown_model", "unavailable", "queue_full",
                                     "client_left")]
            assert len(granted) == ex.attempts == stages["queue"]
            assert stages["upstream"] <= ex.attempts
            if ex.outcome == "ok":
                assert [o for s, o in ex.decisions if s == "upstream"][-1] == "ok"
            if ex.attempts and ex.first_sent is not None:
                assert ex.queue_wait_before_send <= ex.queue_wait
    finally:
        rig.close()


def test_background_rounds_report_resolve_scrape_and_generation() -> None:
    """The state's rounds tell ``on_decision`` of the first plan, each scrape, and each
    generation bump with its cause (unloaded, unlisted, new_version)."""
    fake = ollama()
    state, clock, _ = make({"http://a:1": fake})
    seen: Counter[tuple[str, str]] = Counter()
    state.on_decision = lambda b, stage, outcome: seen.update([(stage, outcome)])
    state.set_backends([spec()])
    state.service.startService()
    clock.advance(0.5)
    assert seen[("resolve", "new_plan")] == 1
    fake.answers["/api/ps"] = (200, b'{"models":[]}')
    for _ in range(5):
        clock.advance(1.0)
    assert seen[("generation", "unloaded")] == 1 and seen[("scrape", "ok")] >= 4
    fake.answers["/v1/models"] = (200, b'{"data":[{"id":"a"}]}')
    for _ in range(5):
        clock.advance(1.0)
    assert seen[("generation", "unlisted")] == 1
    fake.answers["/api/version"] = (200, b'{"version":"0.33.3"}')
    for _ in range(10):
        clock.advance(1.0)
    assert seen[("scrape", "new_version")] >= 1 and seen[("generation", "new_version")] >= 1
    assert seen[("resolve", "same_plan")] >= 1
    for (stage, outcome) in seen:
        assert outcome in DECISIONS[stage]
    state.service.stopService()


def _request(header: bytes | None) -> Any:
    request = DummyRequest([b""])
    if header is not None:
        request.requestHeaders.setRawHeaders(b"x-request-id", [header])
    return request


@pytest.mark.parametrize("sent, kept", [
    (b"abc-123", True), (b"a.b:c_d", True), (b"x" * 128, True), (b"x" * 129, False),
    (b"", False), (b"has space", False), (b"quote\"", False), (b"\xff\xfe", False),
    (None, False)])
def test_request_id_echoes_only_a_well_formed_one(sent: bytes | None, kept: bool) -> None:
    """The client's x-request-id is kept when it is 1-128 id characters; anything else gets
    a fresh 32-hex-digit id (never the client's bytes in a log or header)."""
    got = request_id(_request(sent))
    if kept:
        assert sent is not None and got == sent.decode()
    else:
        assert len(got) == 32 and int(got, 16) >= 0


def test_refusals_map_to_admission_outcomes() -> None:
    """Each refusal before the exchange records its admission outcome; an unlisted 4xx is a
    bad request; nothing is recorded twice once admitted."""
    cases = [(ApiError(401, "x", code="invalid_api_key"), "unauthorized"),
             (model_not_allowed("k", "m"), "model_not_allowed"),
             (ApiError(429, "x", code="rate_limited"), "rate_limited"),
             (ApiError(429, "x", code="quota_exceeded"), "quota_exceeded"),
             (ApiError(400, "x", code="request_exceeds_quota"), "quota_exceeded"),
             (too_large(10), "too_large"),
             (ApiError(400, "x", code="invalid_json"), "bad_request")]
    for e, outcome in cases:
        trace = Trace(0.0, "id", "/v1/chat/completions")
        trace.refused(e)
        done = trace.finish(1.0, e.status)
        assert done.decisions == (("admission", outcome),)
        assert (done.status, done.duration, done.key) == (e.status, 1.0, None)


def test_the_journal_line_keeps_the_old_keys_and_adds_the_record() -> None:
    """``Done.journal`` has every key the journal wrote before, plus the request id, reason,
    decisions as stage=outcome and the timings in ms; it is JSON-serializable."""
    import json

    d = Done(time=1.5, request_id="r", key="k", tenant="t", model="m", route="/v1/completions",
             status=200, target="http://e", reason="least loaded",
             decisions=(("admission", "ok"), ("route", "least_loaded")), outcome="ok",
             ttft=0.25, est_ttft=0.3, overhead=0.0004, queue_wait=0.0, duration=1.0,
             prompt_tokens=3, cached_tokens=0, completion_tokens=4, metered=True)
    j = d.journal()
    assert set(j) >= JOURNAL_KEYS
    assert j["decisions"] == ["admission=ok", "route=least_loaded"]
    assert (j["ttft_ms"], j["overhead_ms"], j["duration_ms"]) == (250.0, 0.4, 1000.0)
    assert d.decision_text() == "admission=ok route=least_loaded"
    json.dumps(j)
    with pytest.raises(AttributeError):
        d.status = 500  # type: ignore[misc]


def test_log_level_option() -> None:
    """``twistd pharos --log-level debug`` is accepted (it turns the request line on), info
    is the default, and any other level is refused rather than ignored."""
    o = Options()
    o.parseOptions(["--demo"])
    assert o["log-level"] == "info"
    o = Options()
    o.parseOptions(["--demo", "--log-level", "debug"])
    assert o["log-level"] == "debug"
    with pytest.raises(usage.UsageError, match="log-level"):
        Options().parseOptions(["--demo", "--log-level", "loud"])
