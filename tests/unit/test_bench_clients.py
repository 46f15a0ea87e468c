"""Traffic sent as several API keys (``pharos.bench.clients``): each client group's stream is
its own, keys are dealt and declared consistently, Pharos accepts the generated config, the
harness sends each request's key, and the summary is split by group."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from pharos.bench.clients import SECRET_PREFIX, Population, parse
from pharos.bench.fleet import pharos_config
from pharos.bench.openloop import OpenLoop
from pharos.bench.records import TIMEOUT, RequestRecord
from pharos.bench.summary import summarize
from pharos.config import parse_config

W6 = {"prompt_tokens": (20, 40), "output_tokens": (5, 10)}


def population(doc: dict[str, Any]) -> Population:
    return parse(doc)


def test_a_group_sends_the_same_requests_whatever_the_others_send() -> None:
    """The light group's requests (times and bodies) are identical alone and beside a heavy
    group ten times its rate, so 'light alone' is the same traffic minus the heavy key."""
    alone = population({"clients": [{"name": "light", "share": 0.1},
                                     {"name": "heavy", "share": 0}]})
    both = population({"clients": [{"name": "light", "share": 0.1},
                                    {"name": "heavy", "share": 1.0}]})
    reqs_a, who_a = alone.traffic("w6", 7, 20.0, 10.0, **W6)
    reqs_b, who_b = both.traffic("w6", 7, 20.0, 10.0, **W6)
    light_b = [r for r, s in zip(reqs_b, who_b, strict=True) if s.client == "light"]
    assert {s.client for s in who_a} == {"light"}
    assert light_b == reqs_a and len(reqs_a) > 5
    assert len(reqs_b) > 5 * len(reqs_a)
    assert [r.at for r in reqs_b] == sorted(r.at for r in reqs_b)


def test_a_group_of_keys_is_dealt_round_robin_and_a_shared_key_is_one_key() -> None:
    """``count: 3`` sends as g-0, g-1, g-2 in turn; ``key: shared`` on two groups makes one
    key, each request still labelled with its group."""
    many = population({"clients": [{"name": "g", "share": 1, "count": 3}]})
    _, who = many.traffic("w6", 1, 10.0, 3.0, **W6)
    assert [s.key for s in who[:6]] == ["g-0", "g-1", "g-2"] * 2
    assert who[0].headers() == {"authorization": f"Bearer {SECRET_PREFIX}g-0"}
    one = population({"clients": [{"name": "x", "share": 0.5, "key": "shared"},
                                  {"name": "y", "share": 0.5, "key": "shared"}]})
    _, who = one.traffic("w6", 1, 10.0, 3.0, **W6)
    assert {s.key for s in who} == {"shared"} and {s.client for s in who} == {"x", "y"}
    assert list(one.keys()) == ["shared"]


def test_the_generated_config_is_one_pharos_accepts() -> None:
    """The keys and tenants section, after the fleet's backends, parses as a Pharos config:
    each key's SHA-256 is that of its benchmark secret, in its tenant, with its weight."""
    pop = population({"tenants": [{"name": "a"}, {"name": "b", "weight": 2}],
                      "clients": [{"name": "a", "share": 1, "count": 100, "tenant": "a"},
                                  {"name": "b", "share": 1, "tenant": "b", "weight": 3}]})
    text = pharos_config(8000, ["http://127.0.0.1:9"], "vllm", "cost", 8, pop.access_yaml())
    config = parse_config(text)
    assert len(config.keys) == 101
    b = next(k for k in config.keys if k.name == "b")
    assert b.sha256 == hashlib.sha256(f"{SECRET_PREFIX}b".encode()).hexdigest()
    assert (b.tenant, b.weight) == ("b", 3)
    assert {t.name: t.weight for t in config.tenants} == {"a": 1, "b": 2}


@pytest.mark.parametrize("doc, message", [
    ({"clients": []}, "non-empty"),
    ({"clients": [{"name": "x", "share": -1}]}, "share"),
    ({"clients": [{"name": "x", "share": 1, "tenant": "nobody"}]}, "no tenant"),
    ({"clients": [{"name": "x", "share": 1, "count": 0}]}, "count"),
    ({"clients": [{"name": "x", "share": 1, "key": "k", "weight": 1},
                  {"name": "y", "share": 1, "key": "k", "weight": 2}]}, "two weights"),
    ({"clients": [{"name": "x", "share": 1, "colour": "red"}]}, "unknown"),
])
def test_a_bad_clients_file_is_a_clear_error(doc: dict[str, Any], message: str) -> None:
    """Each mistake is a ValueError naming it, never a half-built population."""
    with pytest.raises(ValueError, match=message):
        parse(doc)


def test_the_harness_sends_each_requests_key_and_labels_its_record() -> None:
    """OpenLoop puts the sender's ``Authorization`` header on its request and its group and
    key on the record (the engine leg is a stand-in that never answers: timeouts)."""
    pop = population({"clients": [{"name": "light", "share": 0.2},
                                   {"name": "heavy", "share": 1.0}]})
    reqs, who = pop.traffic("w6", 3, 10.0, 2.0, **W6)
    clock = Clock()
    sent: list[tuple[str, Any]] = []

    class Client:
        def request(self, method: str, url: str, **kw: Any) -> Deferred[Any]:
            sent.append((url, kw["headers"]))
            return Deferred()

    loop = OpenLoop(clock, reqs, ["http://pharos"], clock=clock, timeout=1.0, senders=who,
                    pool=object())  # type: ignore[arg-type]
    loop.client = Client()  # type: ignore[assignment]
    records: list[RequestRecord] = []
    loop.run().addCallback(records.extend)
    clock.advance(5.0)
    clock.advance(5.0)
    assert len(sent) == len(reqs)
    for (_, headers), s, r in zip(sent, who, records, strict=True):
        assert headers.getRawHeaders(b"authorization") == [f"Bearer {s.secret}".encode()]
        assert (r.client, r.key, r.error) == (s.client, s.key, TIMEOUT)
    with pytest.raises(ValueError, match="senders"):
        OpenLoop(clock, reqs, ["http://pharos"], clock=clock, senders=who[:1],
                 pool=object())  # type: ignore[arg-type]


def test_the_summary_splits_by_client_group() -> None:
    """``per_client`` counts each group's requests, served ones, distinct keys, TTFT p95 and
    what it was served per second; a run without groups has no ``per_client``."""
    def rec(i: int, client: str, key: str, ttft: float | None, error: str | None = None
            ) -> RequestRecord:
        return RequestRecord(index=i, at=1.0, tag="w6", model="tiny", max_tokens=10,
                             client=client, key=key, status=None if error else 200,
                             error=error, ttft=ttft, e2e=None if ttft is None else ttft + 1,
                             completion_tokens=None if error else 10)
    records = [rec(i, "a", f"a-{i % 4}", 0.1 * (i + 1)) for i in range(20)]
    records += [rec(20, "b", "b", 0.5), rec(21, "b", "b", None, TIMEOUT)]
    s = summarize(records, duration=12.0, warmup=2.0)
    a, b = s["per_client"]["a"], s["per_client"]["b"]
    assert (a["counted"], a["ok"], a["keys"]) == (20, 20, 4)
    assert a["ttft_s"]["p95"] == pytest.approx(1.9)
    assert a["throughput_rps"] == pytest.approx(2.0)
    assert a["output_tokens_per_s"] == pytest.approx(20.0)
    assert (b["counted"], b["ok"], b["errors"]) == (2, 1, {"timeout": 1})
    for r in records:
        r.client = None
    assert "per_client" not in summarize(records, duration=12.0, warmup=2.0)
