"""Layer 1: resolve, its drop reasons, Plan.scrape and Plan.follow, and kind detection,
against an in-memory backend whose every answer the test chooses."""

from __future__ import annotations

from collections import Counter

import pytest

from pharos.engine import library as lib
from pharos.engine.fetch import FetchError
from pharos.engine.plan import (
    BackendUnreachable,
    DetectionFailed,
    Plan,
    detect_kind,
    resolve,
)
from pharos.engine.probes import log_line, prom
from pharos.engine.signals import Load, Signal
from tests.support.plan import FakeBackend, run

LLAMACPP_METRICS = b"""\
llamacpp:requests_processing 2
llamacpp:requests_deferred 1
"""


def llamacpp(
    build: str = "b11312-0c1e570", extra: dict[str, tuple[int, bytes] | Exception] | None = None
) -> FakeBackend:
    answers: dict[str, tuple[int, bytes] | Exception] = {
        "/props": (200, b'{"total_slots":2,"build_info":"%s"}' % build.encode()),
        "/v1/models": (200, b'{"object":"list","data":[{"id":"tiny"}]}'),
        "/metrics": (200, LLAMACPP_METRICS),
        "/slots": (200, b'[{"id":0,"is_processing":true},{"id":1,"is_processing":false}]'),
    }
    answers.update(extra or {})
    return FakeBackend(answers)


def reasons(plan: Plan) -> dict[str, str]:
    return {d.probe.name: d.describe() for d in plan.dropped}


def test_resolve_keeps_first_probe_per_signal_and_drops_redundant() -> None:
    """/metrics reads Running first, so /slots is redundant and leaves the plan."""
    plan, snap = run(resolve(llamacpp(), lib.LLAMACPP))
    assert [p.name for p in plan.active] == [
        "llamacpp-props-version", "openai-models", "llamacpp-props-capacity",
        "llamacpp-running", "llamacpp-waiting"]
    assert reasons(plan)["llamacpp-slots-running"].startswith("redundant")
    assert plan.version == "b11312"
    assert snap.load == {"": Load(running=2, waiting=1, capacity=2)}
    assert snap.sources[Signal.RUNNING] == "llamacpp-running"


def test_resolve_falls_back_when_metrics_are_off() -> None:
    """Without --metrics (/metrics 501), /slots supplies Running and Waiting stays unknown."""
    plan, snap = run(resolve(llamacpp(extra={"/metrics": (501, b"{}")}), lib.LLAMACPP))
    assert snap.load[""].running == 1
    assert snap.load[""].waiting is None
    r = reasons(plan)
    assert r["llamacpp-running"] == "status 501"
    assert r["llamacpp-waiting"] == "status 501"


def test_resolve_version_guard_drops_old_and_unknown_versions() -> None:
    """requests_deferred before b8772 read 0 with a queue: guarded off, so Waiting is unknown."""
    plan, snap = run(resolve(llamacpp("b6890-abc1234"), lib.LLAMACPP))
    assert reasons(plan)["llamacpp-waiting"].startswith("version guard")
    assert snap.load[""].waiting is None
    props = b'{"total_slots":2}'
    plan, snap = run(resolve(llamacpp(extra={"/props": (200, props)}), lib.LLAMACPP))
    assert plan.version is None
    assert reasons(plan)["llamacpp-waiting"].startswith("version guard")


def test_resolve_every_drop_reason() -> None:
    """404, status N, fetch error, parse error and no value each name themselves."""
    backend = FakeBackend({
        "/api/version": (200, b'{"version":"v260"}'),        # no value (not Ollama's)
        "/v1/models": (500, b"oops"),                         # status 500
        "/api/ps": FetchError("refused"),                     # fetch error
        "/api/tags": (200, b"<html>"),                        # parse error
    })                                                        # and no /metrics: 404
    own = [prom("own-running", "/metrics", Signal.RUNNING, "x", own=True)]
    plan, _snap = run(resolve(backend, lib.OLLAMA, own=own))
    r = reasons(plan)
    assert r["ollama-version"] == "no value"
    assert r["openai-models"] == "status 500"
    assert r["ollama-ps-residency"].startswith("fetch error")
    assert r["ollama-tags-size"].startswith("parse error")
    assert r["own-running"] == "404"
    assert r["ollama-log-num-parallel"] == "no log feed"
    assert plan.active == ()


def test_resolve_unreachable_backend_raises() -> None:
    """A backend that answers nothing at all is an error, not an empty plan."""
    backend = FakeBackend({p: FetchError("refused") for p in
                           ("/version", "/v1/models", "/metrics")})
    with pytest.raises(BackendUnreachable):
        run(resolve(backend, lib.VLLM))


def test_own_probe_goes_ahead_of_the_recipe() -> None:
    """An own probe for a signal wins over the library probe for it."""
    own = [prom("mine", "/metrics", Signal.RUNNING, "llamacpp:requests_deferred", own=True)]
    plan, snap = run(resolve(llamacpp(), lib.LLAMACPP, own=own))
    assert snap.sources[Signal.RUNNING] == "mine"
    assert snap.load[""].running == 1
    assert reasons(plan)["llamacpp-running"].startswith("redundant: mine")


def test_log_probe_active_with_a_feed_and_redundant_behind_a_scraped_one() -> None:
    """A log probe stays in the plan while there is a feed, unless a scraped probe reads it."""
    plan, _ = run(resolve(FakeBackend({"/api/version": (200, b'{"version":"0.32.15"}')}),
                          lib.OLLAMA, has_log_feed=True))
    assert "ollama-log-num-parallel" in [p.name for p in plan.log_probes]
    own = [log_line("my-cap", Signal.CAPACITY, r"slots=(?P<value>\d+)", own=True)]
    plan, _ = run(resolve(llamacpp(), lib.LLAMACPP, own=own, has_log_feed=True))
    assert [p.name for p in plan.log_probes] == ["my-cap"]
    plan, _ = run(resolve(llamacpp(), lib.LLAMACPP, own=own[::-1], has_log_feed=False))
    assert reasons(plan)["my-cap"] == "no log feed"


def test_scrape_one_get_per_path_and_load_rounds() -> None:
    """A full round GETs each planned path once; a load round only the load paths."""
    backend = llamacpp()
    plan, _ = run(resolve(backend, lib.LLAMACPP))
    backend.gets.clear()
    snap, failures = run(plan.scrape(backend, full=True))
    assert failures == ()
    assert backend.gets == Counter({"/props": 1, "/v1/models": 1, "/metrics": 1})
    backend.gets.clear()
    snap, _ = run(plan.scrape(backend, full=False))
    assert backend.gets == Counter({"/metrics": 1})
    assert snap.load == {"": Load(running=2, waiting=1)}
    assert snap.version is None  # not read on a load round


def test_scrape_failure_leaves_signal_unknown_and_reports_it() -> None:
    """A planned probe that fails makes its signal unknown this round, never a stale value."""
    backend = llamacpp()
    plan, _ = run(resolve(backend, lib.LLAMACPP))
    backend.answers["/metrics"] = (200, b"llamacpp:requests_processing 1.5\n")
    snap, failures = run(plan.scrape(backend, full=False))
    assert snap.load == {}
    why = {f.probe.name: f.reason for f in failures}
    assert why["llamacpp-running"].startswith("parse error")
    assert why["llamacpp-waiting"] == "no value"  # its metric left the page


def test_follow_emits_per_line_and_last_line_wins() -> None:
    """Each matching log line gives a snapshot of its own; later lines replace earlier ones."""
    plan, _ = run(resolve(FakeBackend({"/api/version": (200, b'{"version":"0.32.15"}')}),
                          lib.OLLAMA, has_log_feed=True))
    lines = [
        b'level=INFO msg="server config" env="map[OLLAMA_NUM_PARALLEL:2 no_proxy:]"',
        b"[GIN] 200 | POST /api/chat",
        b'level=INFO msg="server config" env="map[OLLAMA_NUM_PARALLEL:4 no_proxy:]"',
    ]
    snaps = list(plan.follow(lines))
    assert [s.load[""].capacity for s in snaps] == [2, 4]


def test_detect_order_and_guards() -> None:
    """Fingerprints in order; llama-swap's v-prefixed /api/version never reads as Ollama."""
    swap = FakeBackend({"/running": (200, b'{"running":[]}'),
                        "/api/version": (200, b'{"version":"v250"}')})
    assert run(detect_kind(swap)) == lib.LLAMASWAP
    ollama = FakeBackend({"/api/version": (200, b'{"version":"0.32.15"}')})
    assert run(detect_kind(ollama)) == lib.OLLAMA
    assert run(detect_kind(llamacpp())) == lib.LLAMACPP
    vllm = FakeBackend({"/version": (200, b'{"version":"0.32.0"}'),
                        "/metrics": (200, b'vllm:num_requests_running{model_name="m"} 0\n')})
    assert run(detect_kind(vllm)) == lib.VLLM
    vllm_no_metrics = FakeBackend({"/version": (200, b'{"version":"0.32.0"}')})
    assert run(detect_kind(vllm_no_metrics)) == lib.OPENAI
    sglang = FakeBackend({"/get_server_info": (200, b'{"version":"0.5.23"}')})
    assert run(detect_kind(sglang)) == lib.SGLANG
    generic = FakeBackend({"/v1/models": (200, b'{"data":[]}')})
    assert run(detect_kind(generic)) == lib.OPENAI


@pytest.mark.parametrize("bad", [FetchError("refused"), (503, b"loading")])
def test_detect_fails_instead_of_guessing(bad: tuple[int, bytes] | Exception) -> None:
    """A fetch error or a 503 on a fingerprint path fails detection rather than guess."""
    backend = FakeBackend({"/props": bad, "/v1/models": (200, b'{"data":[]}')})
    with pytest.raises(DetectionFailed):
        run(detect_kind(backend))


def test_resolve_auto_detects_then_resolves() -> None:
    """kind auto runs detection, then that kind's recipe."""
    plan, _ = run(resolve(llamacpp(), lib.AUTO))
    assert plan.kind == lib.LLAMACPP


def vllm_page(kv: str, running: str = "3") -> bytes:
    return (b'vllm:num_requests_running{model_name="tiny"} %s\n'
            b'vllm:num_requests_waiting{model_name="tiny"} 0\n'
            b'vllm:kv_cache_usage_perc{model_name="tiny"} %s\n') % (running.encode(), kv.encode())


@pytest.mark.parametrize("kv", ["1.7", "-0.2", "NaN", "+Inf"])
def test_kv_usage_outside_0_1_is_unknown_that_round_and_known_again_after(kv: str) -> None:
    """A vLLM page whose KV usage is outside 0..1 (or not a number) leaves KV usage unknown for
    that round, never clamped, while its counts stay known; the next good page is read again,
    so a page that flaps between known and unknown gives exactly what each round said."""
    backend = FakeBackend({
        "/version": (200, b'{"version":"0.32.0"}'),
        "/v1/models": (200, b'{"object":"list","data":[{"id":"tiny"}]}'),
        "/metrics": (200, vllm_page("0.25")),
    })
    plan, _ = run(resolve(backend, lib.VLLM))
    for page, want in [(kv, None), ("0.5", 0.5), (kv, None), ("1", 1.0)]:
        backend.answers["/metrics"] = (200, vllm_page(page))
        snap, failures = run(plan.scrape(backend, full=False))
        assert snap.load["tiny"] == Load(running=3, waiting=0, kv_usage=want)
        assert ("vllm-kv-cache-usage-perc" in {f.probe.name for f in failures}) is (want is None)
