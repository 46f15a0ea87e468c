"""vLLM 0.32.0's wire format, cloned from ``fixtures/vllm/0.32.0/idle`` (live).

The double owns ``/v1/models`` and, in ``/metrics``, the running/waiting/KV gauges and the
prompt, cache, preemption, generation and finished-request counters; every other line of the
50 KB page stays as recorded (``model_name`` renamed when the double serves another name).
Bodies are compact JSON (pydantic), cached tokens in ``prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Mapping

from prometheus_client.utils import floatToGoString

from pharos.engine.capture import Capture, Recorded
from pharos.engine.library import VLLM
from pharos.engine.probes import prom_samples
from pharos.sim.model import EngineStatus
from pharos.sim.wire import Flavor, PromPage, compact_json, like_id


class VllmFlavor(Flavor):
    """vLLM's bodies with the double's load and model name."""

    kind = VLLM

    def __init__(
        self,
        capture: Capture,
        seconds: Callable[[], float],
        rng: random.Random,
        models: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(capture, seconds, rng)
        self._v1 = self.body_of("/v1/models")
        recorded = self._v1["data"][0]["id"]
        if models is not None and len(models) != 1:
            raise ValueError("the vLLM double serves exactly one model")
        self._name: str
        self._size: int
        self._name, self._size = next(iter(models.items())) if models else (recorded, 0)
        self._relabel = ({f'model_name="{recorded}"': f'model_name="{self._name}"'}
                         if self._name != recorded else None)
        page = capture.paths["/metrics"].body
        self._metrics = PromPage(page)
        # The recorded pool's labels, rewritten to the double's own pool (label text, so the
        # 50 KB page stays as recorded elsewhere).
        self._pool_labels = [
            (f',{k}="{v}"', k) for labels, _ in prom_samples(page).get(
                "vllm:cache_config_info", ()) for k, v in labels.items()
            if k in ("block_size", "num_gpu_blocks", "kv_cache_size_tokens")]
        self.dynamic = {"/metrics": self._metrics_body, "/v1/models": self._models_body}

    def catalogue(self) -> dict[str, int]:
        """The one served model."""
        return {self._name: self._size}

    def error(self, status: int, message: str, path: str = "") -> Recorded:
        """vLLM's ``ErrorResponse`` (not in the captures)."""
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
        body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
        return Recorded(status, "application/json", compact_json(body).encode())

    def _metrics_body(self, status: EngineStatus) -> bytes:
        plain: dict[str, float] = {
            "vllm:num_requests_running": status.running,
            "vllm:num_requests_waiting": status.waiting,
            "vllm:kv_cache_usage_perc": status.kv_usage,
            "vllm:prefix_cache_queries_total": (
                status.prompt_tokens_total if status.prefix_queries_total is None
                else status.prefix_queries_total),
            "vllm:prefix_cache_hits_total": (
                status.cached_tokens_total if status.prefix_hits_total is None
                else status.prefix_hits_total),
            "vllm:num_preemptions_total": status.preemptions,
            "vllm:prompt_tokens_total": status.prompt_tokens_total,
            "vllm:prompt_tokens_cached_total": status.cached_tokens_total,
            "vllm:generation_tokens_total": status.generated_tokens_total,
            # The prefill-time histogram's sum and count (fixtures/vllm/0.32.0/prefix/metrics);
            # its buckets stay as recorded.
            "vllm:request_prefill_time_seconds_sum": status.prefill_seconds_total,
            "vllm:request_prefill_time_seconds_count": status.prefills_total,
        }
        labelled: dict[tuple[str, str], float] = {
            ("vllm:num_requests_waiting_by_reason", 'reason="capacity"'): status.waiting,
            ("vllm:prompt_tokens_by_source_total", 'source="local_compute"'):
                status.computed_tokens_total,
            ("vllm:prompt_tokens_by_source_total", 'source="local_cache_hit"'):
                status.cached_tokens_total,
        }
        for reason, n in status.finished.items():
            labelled[("vllm:request_success_total", f'finished_reason="{reason}"')] = n

        def value(name: str, labels: str) -> float | None:
            if name in plain:
                return plain[name]
            for (metric, label), v in labelled.items():
                if metric == name and label in labels:
                    return v
            return None

        relabel = dict(self._relabel or {})
        if status.kv_block_tokens:
            pool = {"block_size": status.kv_block_tokens,
                    "num_gpu_blocks": status.kv_capacity // status.kv_block_tokens,
                    "kv_cache_size_tokens": status.kv_capacity}
            relabel.update((old, f',{k}="{pool[k]}"') for old, k in self._pool_labels)
        return self._metrics.render(value, floatToGoString, relabel)

    def _models_body(self, status: EngineStatus) -> bytes:
        doc = copy.deepcopy(self._v1)
        now = int(self.seconds())
        for d in doc["data"]:
            d["id"] = self._name
            d["created"] = now
            for perm in d.get("permission") or ():
                perm["id"] = like_id(perm["id"], self.rng)
                perm["created"] = now
        return compact_json(doc).encode()
