"""llama-swap v250's wire format, cloned from ``fixtures/llama-swap/v250/loaded`` (from-source).

llama-swap runs one ``llama-server`` per configured model and, in its default group, one at a
time: a request for another model stops the running one (once its requests end) and starts the
requested one. The double owns ``/running`` (every process not stopped: ``ready``, or
``starting`` while it loads; sorted by model; ``json.Encoder``, so a trailing newline) and
``/v1/models`` (``status.value`` ``loaded`` or ``unloaded``; top-level keys sorted). Every
other recorded path is served as recorded.

Generation is proxied to ``llama-server`` unchanged, so replies come from the pinned llama.cpp
capture. llama-swap reports no model sizes; the double's sizes only size its memory, which
holds one model unless ``host_memory`` says otherwise.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Mapping
from typing import Any

from pharos.engine.capture import Capture, Recorded
from pharos.engine.library import LLAMASWAP
from pharos.sim.model import LOADED, LOADING, EngineStatus
from pharos.sim.wire import Flavor, ReplyBook, compact_json, go_json

#: Bytes a configured model weighs in the double's memory when ``models`` does not say (llama-
#: swap reports no sizes; the capture's models are 7-12 B parameters at Q4: 4-7 GB).
DEFAULT_SIZE = 5_000_000_000
#: The first ``${PORT}`` llama-swap assigns (its ``startPort`` default), in sorted model order.
START_PORT = 5800
_STATES = {LOADED: "ready", LOADING: "starting"}


class LlamaswapFlavor(Flavor):
    """llama-swap's bodies with the double's models and residency; llama.cpp's replies."""

    kind = LLAMASWAP
    dumps = staticmethod(compact_json)

    def __init__(
        self,
        capture: Capture,
        seconds: Callable[[], float],
        rng: random.Random,
        models: Mapping[str, int] | None = None,
        upstream: Capture | None = None,
    ) -> None:
        super().__init__(capture, seconds, rng)
        if upstream is not None:  # the proxied llama-server's replies and refusals
            self.book = ReplyBook(upstream.replies, compact_json)
        v1 = self.body_of("/v1/models")
        self._v1_doc = v1
        self._v1_entries = {d["id"]: d for d in v1["data"]}
        running = self.body_of("/running")
        self._running_doc = running
        self._running_entries = {r["model"]: r for r in running["running"]}
        self._running_template = next(
            (r for r in running["running"] if r["state"] == "ready"), running["running"][0])
        self._models = dict(models) if models is not None else dict.fromkeys(
            sorted(self._v1_entries), DEFAULT_SIZE)
        if not self._models:
            raise ValueError("a llama-swap double needs at least one model")
        self.dynamic = {"/running": self._running, "/v1/models": self._v1}

    def catalogue(self) -> dict[str, int]:
        """Name → the size the double's memory gives it (llama-swap itself reports none)."""
        return dict(self._models)

    def served_model(self, requested: str | None) -> str | None:
        """A configured model id, or one of its recorded aliases; no default model."""
        if requested is None:
            return None
        if requested in self._models:
            return requested
        for name, entry in self._v1_entries.items():
            aliases = entry.get("meta", {}).get("llamaswap", {}).get("aliases") or ()
            if requested in aliases and name in self._models:
                return name
        return None

    def error(self, status: int, message: str, path: str = "") -> Recorded:
        """llama-swap's own errors: ``{"error": ..., "src": "llama-swap"}`` (the recorded
        404 of ``/props``), ``json.Marshal``, no newline."""
        return Recorded(status, "application/json",
                        go_json({"error": message, "src": "llama-swap"}).encode())

    def _port(self, name: str) -> int:
        return START_PORT + sorted(self._models).index(name)

    def _running(self, status: EngineStatus) -> bytes:
        entries = []
        for m in sorted(status.models, key=lambda m: m.name):
            state = _STATES.get(m.state)
            if state is None:
                continue
            recorded = self._running_entries.get(m.name)
            e = copy.deepcopy(recorded if recorded is not None else self._running_template)
            if recorded is None:
                e["model"] = m.name
                e["cmd"] = (f"/app/llama-server --port {self._port(m.name)} "
                            f"--model /models/{m.name}.gguf")
                e["proxy"] = f"http://localhost:{self._port(m.name)}"
                e["name"] = e["description"] = ""
            e["state"] = state
            entries.append(e)
        doc = copy.deepcopy(self._running_doc)
        doc["running"] = entries
        return (go_json(doc) + "\n").encode()

    def _v1(self, status: EngineStatus) -> bytes:
        running = {m.name for m in status.models if m.state in _STATES}
        template = min(self._v1_entries.values(), key=lambda d: len(d))
        data: list[dict[str, Any]] = []
        for name in sorted(self._models):
            recorded = self._v1_entries.get(name)
            entry = copy.deepcopy(recorded if recorded is not None else template)
            if recorded is None:
                entry["id"] = name
                entry.pop("name", None)
                entry.pop("description", None)
                entry["meta"] = {"llamaswap": {"type": "model"}}
            entry["created"] = int(self.seconds())
            entry["status"] = {"value": "loaded" if name in running else "unloaded"}
            data.append(entry)
        doc = copy.deepcopy(self._v1_doc)
        doc["data"] = data
        return (go_json(doc) + "\n").encode()
