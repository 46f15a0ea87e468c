"""Ollama 0.32.15's wire format, cloned from ``fixtures/ollama/0.32.15/loaded`` (from-source).

The double owns ``/api/tags`` (its model catalogue), ``/api/ps`` (its loaded models) and
``/v1/models``, and the ``OLLAMA_NUM_PARALLEL`` of the startup line in its log; every body is
re-serialized like Go's ``encoding/json``. Ollama reports no cached tokens (its
``prompt_eval_count`` counts them with the rest), so neither does the double.
"""

from __future__ import annotations

import copy
import hashlib
import random
import re
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from pharos.engine.capture import Capture, Recorded
from pharos.engine.library import OLLAMA
from pharos.sim.model import LOADED, EngineStatus
from pharos.sim.wire import Flavor, go_json, rfc3339nano, zone_of

#: ``OLLAMA_KEEP_ALIVE:5m0s`` in the capture's server config line (Ollama's default).
KEEP_ALIVE_S = 300.0
#: Ollama's ``keep_alive < 0``: loaded for good (``expires_at`` ~292 years out).
_FOREVER_S = (2**63 - 1) / 1e9
_NUM_PARALLEL = re.compile(r"\bOLLAMA_NUM_PARALLEL:[0-9a-z]*")


class OllamaFlavor(Flavor):
    """Ollama's bodies with the double's models, residency and parallelism."""

    kind = OLLAMA
    dumps = staticmethod(go_json)

    def __init__(
        self,
        capture: Capture,
        seconds: Callable[[], float],
        rng: random.Random,
        models: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(capture, seconds, rng)
        tags = self.body_of("/api/tags")
        self._tags_doc = tags
        self._recorded_tags = {m["name"]: m for m in tags["models"]}
        self._tag_template = tags["models"][0]
        self._models = dict(models) if models is not None else {
            m["name"]: m["size"] for m in tags["models"]}
        if not self._models:
            raise ValueError("an Ollama double needs at least one model")
        ps = self.body_of("/api/ps")
        self._ps_doc = ps
        self._ps_template = ps["models"][0]
        self._zone: timedelta | None = zone_of(self._ps_template["expires_at"])
        v1 = self.body_of("/v1/models")
        self._v1_doc = v1
        self._v1_entries = {d["id"]: d for d in v1["data"] or ()}
        self._v1_trailing = capture.paths["/v1/models"].body.endswith(b"\n")
        self.dynamic = {"/api/tags": self._tags, "/api/ps": self._ps, "/v1/models": self._v1}

    def catalogue(self) -> dict[str, int]:
        """Name → size as ``/api/tags`` lists them."""
        return dict(self._models)

    def add_model(self, name: str, size: int) -> None:
        """A model pulled, created or copied in (model management, ``pharos.sim.manage``)."""
        self._models[name] = size

    def remove_model(self, name: str) -> None:
        """A deleted model (the double keeps at least one, as its bodies need a template)."""
        if len(self._models) > 1:
            self._models.pop(name, None)

    def served_model(self, requested: str | None) -> str | None:
        """Ollama's name rule: a name without a tag means ``:latest``."""
        if requested is None:
            return None
        if requested in self._models:
            return requested
        if ":" not in requested and f"{requested}:latest" in self._models:
            return f"{requested}:latest"
        return None

    def error(self, status: int, message: str, path: str = "") -> Recorded:
        """Native routes: gin's ``{"error": "..."}``; ``/v1`` routes: the OpenAI shape."""
        if path.startswith("/v1/"):
            body = {"error": {"message": message, "type": "api_error", "param": None,
                              "code": None}}
            return Recorded(status, "application/json", (go_json(body) + "\n").encode())
        return Recorded(status, "application/json; charset=utf-8",
                        go_json({"error": message}).encode())

    def log_lines(self, slots: int) -> list[bytes] | None:
        """The recorded log, its server config lines saying the double's parallelism."""
        if self.capture.log_lines is None:
            return None
        return [_NUM_PARALLEL.sub(f"OLLAMA_NUM_PARALLEL:{slots}", ln).encode()
                for ln in self.capture.log_lines]

    def _tag(self, name: str) -> dict[str, Any]:
        size = self._models[name]
        recorded = self._recorded_tags.get(name)
        entry = copy.deepcopy(recorded if recorded is not None else self._tag_template)
        if recorded is None:
            entry["name"] = entry["model"] = name
            entry["digest"] = hashlib.sha256(name.encode()).hexdigest()
        entry["size"] = size
        return entry

    def _tags(self, status: EngineStatus) -> bytes:
        doc = copy.deepcopy(self._tags_doc)
        doc["models"] = [self._tag(name) for name in self._models]
        return go_json(doc).encode()

    def _ps(self, status: EngineStatus) -> bytes:
        now = self.seconds()
        loaded = [m for m in status.models if m.state == LOADED]
        expiry = {m.name: (m.expires_at if m.expires_at is not None else now + _FOREVER_S)
                  for m in loaded}
        entries = []
        for m in sorted(loaded, key=lambda m: expiry[m.name], reverse=True):
            tag = self._tag(m.name)
            e = copy.deepcopy(self._ps_template)
            e["name"] = e["model"] = m.name
            e["size"] = m.size
            e["digest"] = tag["digest"]
            e["details"] = {k: tag["details"].get(k, v) for k, v in e["details"].items()}
            e["expires_at"] = rfc3339nano(expiry[m.name], self._zone)
            e["size_vram"] = m.size
            entries.append(e)
        doc = copy.deepcopy(self._ps_doc)
        doc["models"] = entries
        return go_json(doc).encode()

    def _v1(self, status: EngineStatus) -> bytes:
        doc = copy.deepcopy(self._v1_doc)
        template = next(iter(self._v1_entries.values()))
        data = []
        for name in self._models:
            entry = copy.deepcopy(self._v1_entries.get(name, template))
            entry["id"] = name
            data.append(entry)
        doc["data"] = data or None  # Ollama answers data: null when it has no models
        return (go_json(doc) + ("\n" if self._v1_trailing else "")).encode()

