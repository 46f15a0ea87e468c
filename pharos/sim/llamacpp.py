"""llama.cpp b11312's wire format, cloned from ``fixtures/llamacpp/b11312/idle`` (live).

The double owns ``/props`` (``total_slots``, ``model_alias``), ``/slots`` (one entry per slot;
a busy slot takes the shape of the busy capture's, an idle one that has served keeps its last
task's id and prompt size as the prefix capture shows; ``n_ctx`` stays the recorded one),
``/metrics`` (requests processing and deferred, token counters) and ``/v1/models``. Bodies
are compact JSON in the recorded key order (nlohmann). Cached tokens show as
``timings.cache_n`` and ``usage.prompt_tokens_details.cached_tokens``. llama.cpp serves its
one model whatever name a request gives.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Mapping
from typing import Any

from pharos.engine.capture import Capture, Recorded
from pharos.engine.library import LLAMACPP
from pharos.sim.model import EngineStatus, Job
from pharos.sim.wire import Flavor, PromPage, compact_json


class LlamacppFlavor(Flavor):
    """llama.cpp's bodies with the double's slots, load and model name."""

    kind = LLAMACPP

    def __init__(
        self,
        capture: Capture,
        seconds: Callable[[], float],
        rng: random.Random,
        models: Mapping[str, int] | None = None,
        busy: Capture | None = None,
    ) -> None:
        super().__init__(capture, seconds, rng)
        self._props = self.body_of("/props")
        self._v1 = self.body_of("/v1/models")
        recorded = self._props["model_alias"]
        if models is not None and len(models) != 1:
            raise ValueError("a llama.cpp server serves exactly one model")
        self._name: str
        self._size: int
        self._name, self._size = next(iter(models.items())) if models else (
            recorded, int(self._v1["data"][0]["meta"]["size"]))
        slots = self.body_of("/slots")
        self._idle_slot = slots[0]
        self._busy_slot: dict[str, Any] = dict(self._idle_slot, is_processing=True)
        if busy is not None:
            found = [s for s in _json(busy, "/slots") if s.get("is_processing")]
            if found:
                self._busy_slot = found[0]
        self._metrics = PromPage(capture.paths["/metrics"].body)
        refusal = next(iter(self.book.refusals.values()), None)
        self._error_template = _error_template(refusal)
        self.dynamic = {"/props": self._props_body, "/slots": self._slots,
                        "/metrics": self._metrics_body, "/v1/models": self._models_body}

    def catalogue(self) -> dict[str, int]:
        """The one model, by its alias."""
        return {self._name: self._size}

    def served_model(self, requested: str | None) -> str | None:
        """Any name reaches the one model."""
        return self._name

    def error(self, status: int, message: str, path: str = "") -> Recorded:
        """The shape of the recorded 501 refusal with this status and message."""
        err = copy.deepcopy(self._error_template)
        inner = err["error"]
        inner["code"] = status
        inner["message"] = message
        inner["type"] = {400: "invalid_request_error", 404: "not_found_error",
                         503: "unavailable_error"}.get(status, "server_error")
        return Recorded(status, "application/json; charset=utf-8",
                        compact_json(err).encode())

    def _props_body(self, status: EngineStatus) -> bytes:
        doc = copy.deepcopy(self._props)
        doc["total_slots"] = status.slots
        doc["model_alias"] = self._name
        return compact_json(doc).encode()

    def _slots(self, status: EngineStatus) -> bytes:
        by_slot = {j.slot: j for j in status.jobs}
        served = {j.slot: j for j in status.served}
        out = []
        for i in range(status.slots):
            job = by_slot.get(i)
            last = served.get(i)
            if job is not None:
                out.append(self._busy(i, job))
            elif last is not None:
                out.append(self._served(i, last))
            else:
                out.append(dict(copy.deepcopy(self._idle_slot), id=i))
        return compact_json(out).encode()

    def _served(self, slot: int, job: Job) -> dict[str, Any]:
        """An idle slot that has served: the last task's id and prompt size stay, its counts
        are reset (the shape of the prefix capture's slot 1)."""
        s = self._busy(slot, job)
        s["is_processing"] = False
        _put(s, "n_prompt_tokens_processed", 0)
        _put(s, "n_prompt_tokens_cache", 0)
        for nxt in s.get("next_token") or ():
            _put(nxt, "has_next_token", False)
            _put(nxt, "has_new_line", False)
            _put(nxt, "n_remain", -1)
            _put(nxt, "n_decoded", 0)
        return s

    def _busy(self, slot: int, job: Job) -> dict[str, Any]:
        s = copy.deepcopy(self._busy_slot)
        s["id"] = slot
        _put(s, "id_task", job.id)
        _put(s, "n_prompt_tokens", job.prompt_tokens)
        _put(s, "n_prompt_tokens_processed", job.prompt_tokens - job.cached_tokens)
        _put(s, "n_prompt_tokens_cache", job.cached_tokens)
        params = s.get("params")
        if isinstance(params, dict):
            limit = job.request.max_tokens or -1
            _put(params, "max_tokens", limit)
            _put(params, "n_predict", limit)
        for nxt in s.get("next_token") or ():
            _put(nxt, "n_decoded", job.tokens_done)
            _put(nxt, "n_remain", max(0, job.output_tokens - job.tokens_done))
        return s

    def _metrics_body(self, status: EngineStatus) -> bytes:
        values: dict[str, float] = {
            "llamacpp:requests_processing": status.running,
            "llamacpp:requests_deferred": status.waiting,
            "llamacpp:prompt_tokens_total": status.computed_tokens_total,
            "llamacpp:prompt_tokens_cached_total": status.cached_tokens_total,
            "llamacpp:prompt_seconds_total": status.prefill_seconds_total,
            "llamacpp:tokens_predicted_total": status.generated_tokens_total,
            "llamacpp:tokens_predicted_seconds_total": status.decode_seconds_total,
            "llamacpp:n_tokens_max": status.tokens_max,
        }
        return self._metrics.render(lambda name, _labels: values.get(name), _cpp_number)

    def _models_body(self, status: EngineStatus) -> bytes:
        doc = copy.deepcopy(self._v1)
        for m in doc.get("models") or ():
            m["name"] = m["model"] = self._name
        for d in doc.get("data") or ():
            d["id"] = self._name
            if isinstance(d.get("aliases"), list):
                d["aliases"] = [self._name]
            if isinstance(d.get("created"), int):
                d["created"] = int(self.seconds())
        return compact_json(doc).encode()


def _cpp_number(v: float) -> str:
    """A double as llama.cpp's metrics print it (an ostream: six significant digits)."""
    return f"{v:g}"


def _put(obj: dict[str, Any], key: str, value: int) -> None:
    if key in obj:
        obj[key] = value


def _json(capture: Capture, path: str) -> Any:
    return json.loads(capture.paths[path].body)


def _error_template(refusal: Recorded | None) -> dict[str, Any]:
    if refusal is not None:
        doc = json.loads(refusal.body)
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            return doc
    return {"error": {"code": 500, "message": "", "type": "server_error"}}
