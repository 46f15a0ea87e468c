"""Layer 3: the finished-request record, ``/metrics``, the debug request line and no prompt
text anywhere (issue 12 items 1, 5, 8), over loopback in front of engine doubles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from twisted.internet.defer import ensureDeferred, gatherResults
from twisted.logger import ILogObserver, Logger, formatEvent, globalLogPublisher
from twisted.web.http_headers import Headers
from zope.interface import implementer

from pharos.config import DecisionLogConfig, Key, Observability, RoutingConfig, UsageConfig
from pharos.obs.reqlog import RequestLog
from pharos.proxy.auth import digest
from pharos.proxy.done import DECISIONS, Done
from tests.support.fleet import Fleet, eventually, start_fleet, within

ADMIN, ALICE = "phk-admin", "phk-alice"
KEYS = (Key(name="ops", sha256=digest(ADMIN), admin=True),
        Key(name="alice", sha256=digest(ALICE), models=("tiny",), rpm=1000))

#: Every series and its label names: a rename or a new label is a deliberate change here.
SNAPSHOT = {
    "pharos_requests": {"key", "model", "status"},
    "pharos_tokens": {"key", "model", "type"},
    "pharos_unmetered_requests": {"key", "model"},
    "pharos_decisions": {"stage", "outcome"},
    "pharos_ttft_seconds": {"model"},
    "pharos_estimated_ttft_seconds": {"model"},
    "pharos_overhead_seconds": set(),
    "pharos_queue_wait_seconds": {"key"},
    "pharos_backend_up": {"backend", "kind", "version"},
    "pharos_backend_probes_active": {"backend"},
    "pharos_target_inflight": {"backend", "model"},
    "pharos_target_signals_unknown": {"backend", "model"},
    "pharos_target_capacity": {"backend", "model", "source"},
    "pharos_target_prefill_seconds_per_token": {"backend", "model"},
    "pharos_target_load_seconds": {"backend", "model"},
    "pharos_target_service_seconds": {"backend", "model"},
    "pharos_queue_waiting": set(),
    "pharos_queue_paced": set(),
    "pharos_prefix_predictions": {"source", "outcome"},
    "pharos_prefix_unfollowed": {"reason"},
    "pharos_policy_requests": {"policy", "model", "status"},
    "pharos_policy_ttft_seconds": {"policy"},
    "pharos_shadow_decisions": {"model", "policy", "shadow", "agree"},
    "pharos_shadow_gain_seconds": {"model", "policy", "shadow"},
    "pharos_shadow_errors": set(),  # no shadow raised
    "pharos_shadow_dropped": set(),
}


async def start(**config: Any) -> Fleet:
    return await start_fleet([("vllm", {}, {"kind": "vllm"}),
                              ("vllm", {"seed": 1}, {"kind": "vllm"})], **config)


def headers(key: str | None = None, **more: str) -> Headers:
    h = Headers({b"content-type": [b"application/json"]})
    if key is not None:
        h.setRawHeaders(b"authorization", [f"Bearer {key}".encode()])
    for k, v in more.items():
        h.setRawHeaders(k.replace("_", "-").encode(), [v.encode()])
    return h


async def post(f: Fleet, path: str, body: Any, key: str | None = None,
               **more: str) -> tuple[int, bytes, Headers]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = await treq.post(f.url + path, data, headers=headers(key, **more), pool=f.pool)
    return r.code, await r.content(), r.headers


def chat(model: str = "tiny", text: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": text}],
            **extra}


async def scrape(f: Fleet) -> tuple[str, dict[str, list[Sample]]]:
    r = await treq.get(f.url + "/metrics", pool=f.pool)
    assert r.code == 200
    assert r.headers.getRawHeaders(b"content-type")[0].startswith(b"text/plain")
    text = (await r.content()).decode()
    families: dict[str, list[Sample]] = {}
    for fam in text_string_to_metric_families(text):
        families[fam.name] = list(fam.samples)
    return text, families


def values(samples: list[Sample], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in samples if s.name == name}


def collector(events: list[dict[str, Any]]) -> ILogObserver:
    """A log observer appending every event to ``events``."""
    @implementer(ILogObserver)
    def observe(event: dict[str, Any]) -> None:
        events.append(event)

    return observe


def recorded(f: Fleet) -> list[Done]:
    done: list[Done] = []
    f.pharos.public.on_done.append(done.append)
    return done


@pytest_twisted.ensureDeferred
async def test_every_ending_becomes_a_done_and_a_metric() -> None:
    """An answered chat, a streamed one, a 401, a 400, a 403, an unknown model and a 413 each
    make one Done with the right admission/route/upstream decisions and status, and
    /metrics (no key) parses with prometheus-client's parser and counts them by key, model
    and status, with the TTFT and estimated TTFT histograms side by side."""
    f = await start(keys=KEYS)
    done = recorded(f)
    try:
        code, _, h = await post(f, "/v1/chat/completions", chat(), ALICE,
                                x_request_id="client-id.42")
        assert code == 200 and h.getRawHeaders(b"x-request-id") == [b"client-id.42"]
        code, _, h = await post(f, "/v1/chat/completions", chat(stream=True), ALICE,
                                x_request_id="bad id\twith spaces")
        assert code == 200
        made = (h.getRawHeaders(b"x-request-id") or [b""])[0]
        assert len(made) == 32 and made != b"bad id\twith spaces"
        assert (await post(f, "/v1/chat/completions", chat()))[0] == 401
        assert (await post(f, "/v1/chat/completions", b"{not json", ALICE))[0] == 400
        assert (await post(f, "/v1/chat/completions", chat("other"), ALICE))[0] == 403
        assert (await post(f, "/v1/chat/completions", chat("nope"), ADMIN))[0] == 404
        big = {"model": "tiny", "prompt": "x" * (33 * 1024 * 1024)}
        assert (await post(f, "/v1/completions", big, ADMIN))[0] == 413
        await eventually(lambda: len(done) == 7)
        ok, streamed, unauth, bad, forbidden, unknown, large = done
        assert ok.request_id == "client-id.42" and ok.key == "alice" and ok.status == 200
        assert ok.target is not None and ok.target_model == "tiny" and ok.reason
        assert ok.decisions[0] == ("admission", "ok")
        assert ("upstream", "ok") in ok.decisions and ("queue", "immediate") in ok.decisions
        assert [s for s, _ in ok.decisions].count("route") == 1
        assert ok.ttft is not None and ok.est_ttft is not None and ok.overhead is not None
        assert ok.queue_wait == 0.0 and ok.duration >= ok.ttft
        assert ok.prompt_tokens and ok.completion_tokens and ok.metered
        assert streamed.request_id == made.decode()
        assert ("usage", "pharos_asked") in streamed.decisions
        assert (unauth.key, unauth.status, unauth.decisions) == (
            None, 401, (("admission", "unauthorized"),))
        assert (bad.status, bad.decisions) == (400, (("admission", "bad_request"),))
        assert (forbidden.status, forbidden.decisions) == (
            403, (("admission", "model_not_allowed"),))
        assert unknown.status == 404 and ("route", "unknown_model") in unknown.decisions
        assert (large.status, large.decisions) == (413, (("admission", "too_large"),))
        for d in done:
            for stage, outcome in d.decisions:
                assert outcome in DECISIONS[stage], (stage, outcome)

        text, fams = await scrape(f)
        req = values(fams["pharos_requests"], "pharos_requests_total")
        assert req[(("key", "alice"), ("model", "tiny"), ("status", "200"))] == 2
        assert req[(("key", "none"), ("model", "unknown"), ("status", "401"))] == 1
        assert req[(("key", "alice"), ("model", "unknown"), ("status", "400"))] == 1
        assert req[(("key", "alice"), ("model", "unknown"), ("status", "403"))] == 1
        assert req[(("key", "ops"), ("model", "unknown"), ("status", "404"))] == 1
        assert req[(("key", "none"), ("model", "unknown"), ("status", "413"))] == 1
        dec = values(fams["pharos_decisions"], "pharos_decisions_total")
        assert dec[(("outcome", "ok"), ("stage", "admission"))] == 3
        assert dec[(("outcome", "too_large"), ("stage", "admission"))] == 1
        assert dec[(("outcome", "unexpected_load"), ("stage", "load"))] == 0  # declared
        assert dec[(("outcome", "new_plan"), ("stage", "resolve"))] >= 2  # background
        assert dec[(("outcome", "ok"), ("stage", "scrape"))] >= 2
        ttft = values(fams["pharos_ttft_seconds"], "pharos_ttft_seconds_count")
        est = values(fams["pharos_estimated_ttft_seconds"], "pharos_estimated_ttft_seconds_count")
        assert ttft == est == {(("model", "tiny"),): 2}
        tokens = values(fams["pharos_tokens"], "pharos_tokens_total")
        prompt = tokens[(("key", "alice"), ("model", "tiny"), ("type", "prompt"))]
        assert prompt == ok.prompt_tokens + (streamed.prompt_tokens or 0)
        up = values(fams["pharos_backend_up"], "pharos_backend_up")
        assert sorted(dict(k)["backend"] for k in up) == sorted(d.url for d in f.doubles)
        assert all(v == 1 for v in up.values())
        assert len(values(fams["pharos_target_inflight"], "pharos_target_inflight")) == 2
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_the_set_of_series_and_labels_is_fixed() -> None:
    """Snapshot: after traffic that fills every family, the metric names and their label
    names are exactly ``SNAPSHOT`` (a rename is a deliberate change)."""
    f = await start(routing=RoutingConfig(shadow=("least-load",)))
    try:
        for _ in range(3):
            assert (await post(f, "/v1/chat/completions", chat(text="a long prompt " * 400)))[
                0] == 200
        f.pharos.sched.unfollowed["test"] += 1
        f.pharos.sched.predictions[("local", "predicted_hit")] += 0
        for t in f.pharos.state.targets:  # learned speeds and capacity
            t.stats.prefill_sec_per_token.add(0.001)
            t.stats.load_sec.add(1.0)
            t.learned_capacity = 4
        f.pharos.metrics.unmetered[("anonymous", "tiny")] += 1  # a reply without usage
        await eventually(lambda: f.pharos.shadow.pending() == 0)
        _, fams = await scrape(f)
        got = {}
        for name, samples in fams.items():
            labels: set[str] = set()
            for s in samples:
                labels |= set(s.labels) - {"le"}
            got[name] = labels
        assert {n for n in got if n.startswith("pharos_")} == set(SNAPSHOT)
        assert {n: got[n] for n in SNAPSHOT} == SNAPSHOT
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_journal_drops_and_failures_are_exposed(tmp_path: Path) -> None:
    """With a usage journal and a decision log configured, /metrics counts per journal the
    records it dropped (buffer full or closed) and failed to write: 0 while the writer keeps
    up, and what a journal really dropped once it did; without journals the series are
    absent (the snapshot test)."""
    f = await start(usage=UsageConfig(journal=str(tmp_path / "usage.jsonl")),
                    observability=Observability(
                        decision_log=DecisionLogConfig(str(tmp_path / "decisions.jsonl"))))
    try:
        assert (await post(f, "/v1/chat/completions", chat()))[0] == 200
        _, fams = await scrape(f)
        assert values(fams["pharos_journal_dropped_records"],
                      "pharos_journal_dropped_records_total") == {
            (("journal", "decision_log"),): 0.0, (("journal", "usage"),): 0.0}
        assert set(values(fams["pharos_journal_failed_records"],
                          "pharos_journal_failed_records_total").values()) == {0.0}
        usage = f.pharos.journal
        assert usage is not None
        await usage.close()  # a closed journal drops what it is given, and counts it
        assert usage.write({"n": 1}) is False
        _, fams = await scrape(f)
        assert values(fams["pharos_journal_dropped_records"],
                      "pharos_journal_dropped_records_total")[(("journal", "usage"),)] == 1.0
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_client_names_cannot_inject_or_multiply_series() -> None:
    """A thousand made-up model names (quotes, newlines, a fake series inside) count under
    one ``unknown`` label; a listed model whose name has quotes and a newline is escaped and
    parses back to itself; no fake series appears."""
    evil = 'ev"il\\\nmodel} pharos_fake 1'
    f = await start_fleet([("vllm", {}, {"kind": "vllm", "aliases": {"tiny": evil}})])
    try:
        for i in range(30):
            name = f'nope{i}"}} 1\npharos_injected{{a="b'
            assert (await post(f, "/v1/chat/completions", chat(name)))[0] == 404
        for i in range(1000):  # the same through the subscriber, without the HTTP cost
            f.pharos.metrics.done(Done(time=0, request_id="x", key="anonymous",
                                       tenant="default", model=f"m{i}", route="/v1/completions",
                                       status=404))
        assert (await post(f, "/v1/chat/completions", chat(evil)))[0] == 200
        text, fams = await scrape(f)
        assert "pharos_injected" not in fams and "pharos_fake" not in fams
        assert "nope" not in text
        models = {s.labels["model"] for s in fams["pharos_requests"]}
        assert models == {"unknown", evil}
        req = values(fams["pharos_requests"], "pharos_requests_total")
        assert req[(("key", "anonymous"), ("model", "unknown"), ("status", "404"))] == 1030
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_a_removed_backend_takes_its_series_with_it() -> None:
    """After a reload drops one of two backends, its up, probes, in-flight and capacity
    series are gone from /metrics; the other's stay."""
    f = await start()
    try:
        assert (await post(f, "/v1/chat/completions", chat()))[0] == 200
        gone, kept = f.doubles[0].url, f.doubles[1].url
        f.pharos.state.set_backends([b for b in f.pharos.config.backends if b.url == kept])
        text, fams = await scrape(f)
        assert gone not in text and kept in text
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_scrapes_during_concurrent_streams_are_consistent() -> None:
    """300 concurrent slow streams with scrapes in between: every scrape parses, the
    in-flight gauges sum to the leases held at that instant, each histogram's count equals
    its +Inf bucket, and at the end every request is counted once."""
    f = await start_fleet([("vllm", {"slots": 64, "decode_s": 0.01}, {"kind": "vllm"}),
                           ("vllm", {"seed": 1, "slots": 64, "decode_s": 0.01},
                            {"kind": "vllm"})])
    n = 300
    try:
        async def one() -> int:
            code, body, _ = await post(f, "/v1/chat/completions",
                                       chat(stream=True, max_tokens=20))
            assert body.endswith(b"data: [DONE]\n\n")
            return code

        running = gatherResults([ensureDeferred(one()) for _ in range(n)])
        seen_busy = False
        while not running.called:
            _, fams = await scrape(f)
            inflight = sum(s.value for s in fams["pharos_target_inflight"])
            seen_busy = seen_busy or inflight > 0
            for name in ("pharos_ttft_seconds", "pharos_overhead_seconds"):
                for key, count in values(fams[name], name + "_count").items():
                    inf = values(fams[name], name + "_bucket")[
                        tuple(sorted((*key, ("le", "+Inf"))))]
                    assert inf == count
        codes = await within(running, 60)
        assert codes == [200] * n and seen_busy
        _, fams = await scrape(f)
        assert sum(values(fams["pharos_requests"], "pharos_requests_total").values()) == n
        assert sum(s.value for s in fams["pharos_target_inflight"]) == 0
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_the_debug_request_line() -> None:
    """With the request log on, each request logs one debug event whose line has the
    request id, key, model, target, reason, decisions as stage=outcome, status, TTFT,
    overhead and duration."""
    f = await start(keys=KEYS)
    events: list[dict[str, Any]] = []
    f.pharos.public.on_done.append(RequestLog(Logger(observer=collector(events))))
    try:
        assert (await post(f, "/v1/chat/completions", chat(), ALICE, x_request_id="r-1"))[
            0] == 200
        assert (await post(f, "/v1/chat/completions", chat(), "phk-wrong"))[0] == 401
        await eventually(lambda: len(events) == 2)
        line = formatEvent(events[0])
        assert events[0]["log_level"].name == "debug"
        for part in ("request r-1", "key=alice", "model=tiny", f"status={200}",
                     "admission=ok", "queue=immediate", "upstream=ok", "ttft_ms=",
                     "overhead_ms=", "duration_ms="):
            assert part in line, (part, line)
        assert any(d.url in line for d in f.doubles)
        assert "admission=unauthorized" in formatEvent(events[1])
    finally:
        await f.stop()


MARKER = "zebra-marker-7f3a"


@pytest_twisted.ensureDeferred
async def test_no_prompt_text_on_any_surface(tmp_path: Path) -> None:
    """A marker in the prompts of chat (plain and streamed), completions, messages, Ollama's
    chat and generate, an unknown model's request and a refused one never shows up in
    /metrics, the log (every event, formatted), the journal file, the Done records, the
    request lines or any reply header."""
    journal = tmp_path / "journal.jsonl"
    f = await start_fleet([("vllm", {}, {"kind": "vllm"}),
                           ("ollama", {"loaded": ["llama3.2:3b"]}, {"kind": "ollama"})],
                          usage=UsageConfig(journal=str(journal)))
    done = recorded(f)
    events: list[dict[str, Any]] = []
    f.pharos.public.on_done.append(RequestLog(Logger(observer=collector(events))))
    everything = collector(events)
    globalLogPublisher.addObserver(everything)
    sent = [
        ("/v1/chat/completions", chat(text=MARKER)),
        ("/v1/chat/completions", chat(text=MARKER, stream=True)),
        ("/v1/completions", {"model": "tiny", "prompt": MARKER, "max_tokens": 4}),
        ("/v1/messages", {"model": "tiny", "max_tokens": 4,
                          "messages": [{"role": "user", "content": MARKER}]}),
        ("/api/chat", {"model": "llama3.2:3b",
                       "messages": [{"role": "user", "content": MARKER}]}),
        ("/api/generate", {"model": "llama3.2:3b", "prompt": MARKER}),
        ("/v1/chat/completions", chat(model="nope", text=MARKER)),
        ("/v1/chat/completions", b'{"model": "tiny", "messages": "' + MARKER.encode() + b'"'),
    ]
    replies: list[Headers] = []
    try:
        codes = []
        for path, body in sent:
            code, _, h = await post(f, path, body, x_request_id="probe-1")
            codes.append(code)
            replies.append(h)
        # The doubles serve no /v1/messages: the engine's 404 becomes a 400 (spec §9).
        assert codes == [200, 200, 200, 400, 200, 200, 404, 400]
        await eventually(lambda: len(done) == len(sent))
        text, _ = await scrape(f)
        assert MARKER not in text
        for h in replies:
            for name, vs in h.getAllRawHeaders():
                assert MARKER.encode() not in name + b"".join(vs)
        assert all(MARKER not in repr(d) and MARKER not in json.dumps(d.journal())
                   for d in done)
        for e in events:
            assert MARKER not in formatEvent(e) and MARKER not in repr(e)
    finally:
        globalLogPublisher.removeObserver(everything)
        await f.stop()
    lines = journal.read_text()
    assert lines.count("\n") == len(sent) and MARKER not in lines


def test_every_dashboard_query_names_an_exported_series() -> None:
    """contrib/grafana/pharos.json: every panel query names only series Pharos exports
    (``SNAPSHOT``'s families with their _total, _bucket, _count and _sum samples), and every
    family is shown on some panel."""
    import re

    root = Path(__file__).resolve().parents[2]
    doc = json.loads((root / "contrib" / "grafana" / "pharos.json").read_text())
    exported = set()
    for name in SNAPSHOT:
        exported |= {name, name + "_total", name + "_bucket", name + "_count", name + "_sum"}
    shown = set()
    for panel in doc["panels"]:
        for target in panel["targets"]:
            names = set(re.findall(r"\bpharos_[a-z_]+", target["expr"]))
            assert names and names <= exported, (panel["title"], names - exported)
            shown |= names
    covered = {n for n in SNAPSHOT if any(s.startswith(n) for s in shown)}
    assert covered == set(SNAPSHOT) - {"pharos_prefix_unfollowed"}
