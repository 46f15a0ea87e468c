"""The doubles' wire layer without sockets: bodies rebuilt from the pinned captures, request
parsing, and the reply shapes derived from recorded siblings."""

from __future__ import annotations

import json
from typing import Any

import pytest
from twisted.internet.task import Clock

from pharos.engine.library import LLAMACPP, OLLAMA, VLLM
from pharos.engine.probes import prom_samples
from pharos.sim.double import EngineDouble, pinned_capture
from pharos.sim.model import GenRequest, Job
from pharos.sim.prompt import (
    CHAT,
    COMPLETIONS,
    OLLAMA_GENERATE,
    BadRequest,
    ReplyKey,
    keep_alive,
    parse_body,
    prompt_text,
    reply_key,
)
from pharos.sim.wire import go_json, shape_of, split_events

GB = 10**9


class Quiet:
    """A listener that ignores everything."""

    def token(self, job: Job, index: int, text: str, last: bool) -> None:
        pass

    def done(self, job: Job) -> None:
        pass


def body(double: EngineDouble, path: str) -> bytes:
    return double.flavor.get(path, double.model.status()).body


@pytest.mark.parametrize(
    ("kind", "paths"),
    [
        (OLLAMA, ("/api/tags", "/v1/models", "/api/version", "/")),
        (LLAMACPP, ("/props", "/slots", "/metrics", "/health")),
        (VLLM, ("/metrics", "/version", "/health")),
    ],
)
def test_status_bodies_at_rest_are_the_recorded_bytes(kind: str, paths: tuple[str, ...]) -> None:
    """With the capture's own numbers (idle, its models, its slots), a rebuilt status body is
    byte for byte the recorded one: the serializer writes in the engine's style."""
    # the capture's KV pool (8192 blocks of 32 tokens), which the vLLM double reports as its own
    pool: dict[str, Any] = {"cache_tokens": 8192 * 32, "block_tokens": 32} if kind == VLLM else {}
    double = EngineDouble(kind, Clock(), **pool)
    for path in paths:
        assert body(double, path) == pinned_capture(kind).paths[path].body, path


def test_ollama_ps_lists_loaded_models_latest_expiry_first() -> None:
    """/api/ps lists the loaded models in the recorded entry shape, sorted by expires_at,
    the latest first, with the recorded zone offset and the catalogue's sizes."""
    clock = Clock()
    clock.advance(1_800_000_000)
    double = EngineDouble(OLLAMA, clock, loaded=("llama3.2:3b", "qwen3:8b"))
    double.model.submit(GenRequest("qwen3:8b", b"hello"), Quiet())
    doc = json.loads(body(double, "/api/ps"))
    recorded = json.loads(pinned_capture(OLLAMA).paths["/api/ps"].body)
    assert shape_of(doc) == shape_of(recorded)
    assert [m["name"] for m in doc["models"]] == ["qwen3:8b", "llama3.2:3b"]
    first = doc["models"][0]
    assert first["expires_at"].endswith("-08:00")
    assert first["size"] == first["size_vram"] == double.flavor.catalogue()["qwen3:8b"]


def test_ollama_catalogue_of_other_models_keeps_the_entry_shape() -> None:
    """A double serving models the capture never listed clones the recorded entries."""
    double = EngineDouble(OLLAMA, Clock(), models={"tiny:1b": GB, "big:70b": 40 * GB})
    tags = json.loads(body(double, "/api/tags"))
    recorded = json.loads(pinned_capture(OLLAMA).paths["/api/tags"].body)
    assert shape_of(tags) == shape_of(recorded)
    assert [(m["name"], m["size"]) for m in tags["models"]] == [("tiny:1b", GB),
                                                                ("big:70b", 40 * GB)]
    v1 = json.loads(body(double, "/v1/models"))
    assert [d["id"] for d in v1["data"]] == ["tiny:1b", "big:70b"]


def test_llamacpp_busy_slot_takes_the_busy_capture_shape() -> None:
    """A processing slot in /slots has the keys of the busy capture's processing slot, with
    the double's task, prompt and cache numbers; idle slots stay the idle shape. (The first
    request takes slot 1: llama.cpp's least recently used slot, the highest id on a tie.)"""
    double = EngineDouble(LLAMACPP, Clock(), slots=2)
    job = double.model.submit(GenRequest("tiny", b"x" * 40, max_tokens=7), Quiet())
    slots = json.loads(body(double, "/slots"))
    busy = next(s for s in json.loads(pinned_capture(LLAMACPP, state="busy").paths["/slots"]
                                      .body) if s["is_processing"])
    idle = json.loads(pinned_capture(LLAMACPP).paths["/slots"].body)[0]
    assert shape_of(slots[1]) == shape_of(busy) and shape_of(slots[0]) == shape_of(idle)
    assert (slots[1]["id_task"], slots[1]["n_prompt_tokens"]) == (job.id, 10)
    assert slots[1]["params"]["n_predict"] == 7
    props = json.loads(body(double, "/props"))
    assert props["total_slots"] == 2


def test_vllm_metrics_change_only_the_samples_the_double_owns() -> None:
    """Under load the gauges and counters the double owns move; every other line of the
    recorded page stays identical, and a renamed model renames only the label."""
    double = EngineDouble(VLLM, Clock(), slots=1, models={"other": 0})
    for _ in range(3):
        double.model.submit(GenRequest("other", b"y" * 64), Quiet())
    page = body(double, "/metrics").decode()
    recorded = pinned_capture(VLLM).paths["/metrics"].body.decode()
    samples = prom_samples(page.encode())
    assert samples["vllm:num_requests_running"][0] == ({"engine": "0", "model_name": "other"},
                                                       1.0)
    assert samples["vllm:num_requests_waiting"][0][1] == 2.0
    assert samples["vllm:prompt_tokens_total"][0][1] == 16.0
    owned = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
             "prefix_cache_queries_total", "prompt_tokens_total", "prompt_tokens_by_source",
             "request_success_total", "cache_config_info")
    for mine, theirs in zip(page.splitlines(), recorded.splitlines(), strict=True):
        if any(o in mine for o in owned):
            continue
        assert mine == theirs.replace('model_name="tiny"', 'model_name="other"')


def test_go_json_escapes_like_encoding_json() -> None:
    """Ollama's bodies escape <, >, & and the line separators as Go does; other text as is."""
    assert go_json({"a": "<b>&é\u2028"}) == '{"a":"\\u003cb\\u003e\\u0026é\\u2028"}'


def test_escaped_and_raw_bodies_are_the_same_prompt() -> None:
    """A body with \\uXXXX escapes and the same body in raw UTF-8 give one prompt text, and
    tools count as prompt text ahead of the messages."""
    raw = '{"messages":[{"role":"user","content":"héllo wörld 你好"}]}'.encode()
    escaped = json.dumps(json.loads(raw)).encode()  # ensure_ascii: \\u escapes
    assert raw != escaped
    one = prompt_text(CHAT, parse_body(raw))
    assert one == prompt_text(CHAT, parse_body(escaped)) == "héllo wörld 你好".encode()
    tools = [{"type": "function", "function": {"name": "f"}}]
    with_tools = prompt_text(CHAT, {**json.loads(raw), "tools": tools})
    assert with_tools.endswith(one) and len(with_tools) > len(one)
    assert GenRequest("m", with_tools).prompt_tokens > GenRequest("m", one).prompt_tokens


def test_request_parsing() -> None:
    """Reply shapes, prompts of completions and generate, keep_alive durations, bad bodies."""
    assert reply_key(CHAT, {"stream": True, "stream_options": {"include_usage": True}}) == \
        ReplyKey(CHAT, True, True)
    assert reply_key(OLLAMA_GENERATE, {}) == ReplyKey(OLLAMA_GENERATE, True, False)
    assert reply_key(COMPLETIONS, {}) == ReplyKey(COMPLETIONS, False, False)
    assert prompt_text(COMPLETIONS, {"prompt": ["ab", "cd"]}) == b"abcd"
    assert prompt_text(OLLAMA_GENERATE, {"system": "s", "prompt": "p"}) == b"sp"
    assert keep_alive({"keep_alive": "5m"}) == 300.0
    assert keep_alive({"keep_alive": "1h30m"}) == 5400.0
    assert keep_alive({"keep_alive": 0}) == 0.0
    assert keep_alive({"keep_alive": "-1"}) == -1.0
    for bad in (b"[1]", b"{", b'{"messages": 3}'):
        with pytest.raises(BadRequest):
            prompt_text(CHAT, parse_body(bad))
    with pytest.raises(BadRequest):
        keep_alive({"keep_alive": "soon"})


@pytest.mark.parametrize(
    ("kind", "key", "derived_from"),
    [
        (VLLM, ReplyKey(COMPLETIONS, True, False), "completion_stream_usage"),
        (LLAMACPP, ReplyKey(COMPLETIONS, True, False), "completion_stream_usage"),
        (OLLAMA, ReplyKey(OLLAMA_GENERATE, False, False), "api_generate_stream"),
    ],
)
def test_unrecorded_shapes_derive_from_a_recorded_sibling(
    kind: str, key: ReplyKey, derived_from: str
) -> None:
    """A streamed reply without include_usage drops the recorded usage-only chunk (llama.cpp
    has none: its usage rides on the finish chunk); Ollama's non-streamed generate is its
    stream's final line framed like the recorded non-streamed chat."""
    double = EngineDouble(kind, Clock())
    template = double.flavor.book.find(key)
    assert template is not None and template.name.startswith(derived_from)
    recorded = next(r for r in pinned_capture(kind).replies if r.name == derived_from)
    _, events = split_events(recorded.body, recorded.content_type)
    usage_only = [e for e in events if isinstance(e, dict) and e.get("choices") == []]
    if key.stream:
        assert len(template.events) == len(events) - len(usage_only)
    else:
        assert not template.streamed and template.events[0] == events[-1]
        assert template.content_type == "application/json; charset=utf-8"


def test_a_shape_with_no_recorded_sibling_is_not_invented() -> None:
    """Ollama's capture records no streamed /v1/completions: the double has no template."""
    double = EngineDouble(OLLAMA, Clock())
    assert double.flavor.book.find(ReplyKey(COMPLETIONS, True, False)) is None


def test_ollama_log_says_the_doubles_parallelism() -> None:
    """The double's log is the recorded one with its own OLLAMA_NUM_PARALLEL."""
    lines = EngineDouble(OLLAMA, Clock(), slots=7).log_lines()
    assert lines is not None
    config = [ln for ln in lines if b'msg="server config"' in ln]
    assert config and all(b"OLLAMA_NUM_PARALLEL:7 " in ln for ln in config)
    assert EngineDouble(VLLM, Clock()).log_lines() is None

