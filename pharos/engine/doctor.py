"""``pharos doctor``: what Pharos reads from each backend, and what would surprise a new user.
Built from ``resolve`` (and the log probes over the backend's log), as text or as JSON."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pharos.engine.fetch import Fetcher, FetchError
from pharos.engine.library import LLAMASWAP, OLLAMA, ollama_remote_models
from pharos.engine.plan import (
    BackendUnreachable,
    DetectionFailed,
    Plan,
    resolve,
)
from pharos.engine.probes import Probe
from pharos.engine.signals import (
    LOAD_ORDER,
    WHOLE_BACKEND,
    Residency,
    Signal,
    Snapshot,
    merge,
)

#: Routes coding agents call; a POST {} names no model, so a served route answers 400.
CODING_AGENT_ROUTES: tuple[str, ...] = ("/v1/messages", "/v1/responses")


@dataclass
class BackendReport:
    """Everything doctor says about one backend."""

    url: str
    kind: str | None = None
    version: str | None = None
    plan: Plan | None = None
    snapshot: Snapshot = field(default_factory=Snapshot)
    log_snapshot: Snapshot | None = None
    error: str | None = None
    surprises: list[str] = field(default_factory=list)

    def signals(self) -> dict[str, Any]:
        """Signal values, models keyed by name; ``None`` wherever the value is unknown."""
        snap = self.merged()
        models: dict[str, Any] | None = None
        names = list(snap.models) if snap.models is not None else None
        if names is None:
            extra = [m for m in snap.load if m != WHOLE_BACKEND]
            extra += list(snap.residency or ())
            names = list(dict.fromkeys(extra)) or None
        if names is not None:
            models = {m: _model_signals(snap, m) for m in names}
        whole = snap.load.get(WHOLE_BACKEND)
        return {
            "version": snap.version,
            "models": models,
            "backend": {s.value: (whole.get(s) if whole else None) for s in LOAD_ORDER},
        }

    def merged(self) -> Snapshot:
        """Scraped values, with log values filling the signals no scraped probe knows."""
        if self.log_snapshot is None:
            return self.snapshot
        parts = [(self.snapshot.sources.get(s, ""), s, self.snapshot) for s in Signal]
        parts += [(self.log_snapshot.sources.get(s, ""), s, self.log_snapshot) for s in Signal]
        return merge(parts)

    def unknown(self) -> list[str]:
        """The signals no probe knows on this backend."""
        snap = self.merged()
        return [s.value for s in Signal if not snap.known(s)]

    def as_json(self) -> dict[str, Any]:
        """The JSON shape of ``pharos doctor --json``."""
        snap = self.merged()
        active = []
        dropped = []
        if self.plan is not None:
            for p in self.plan.active:
                active.append(
                    {
                        "probe": p.name,
                        "signal": p.signal.value,
                        "source": _source(p),
                        "feed": p.feed,
                        "value": _jsonable(snap.value(p.signal))
                        if snap.sources.get(p.signal) == p.name
                        else None,
                    }
                )
            for d in self.plan.dropped:
                dropped.append(
                    {
                        "probe": d.probe.name,
                        "signal": d.probe.signal.value,
                        "source": _source(d.probe),
                        "reason": d.reason,
                        "detail": d.detail,
                    }
                )
        return {
            "url": self.url,
            "kind": self.kind,
            "version": self.version,
            "error": self.error,
            "signals": self.signals(),
            "active": active,
            "dropped": dropped,
            "unknown": self.unknown() if self.error is None else [s.value for s in Signal],
            "surprises": self.surprises,
        }


def _model_signals(snap: Snapshot, model: str) -> dict[str, Any]:
    info = snap.model_info(model)
    load = snap.load_for(model)  # the whole backend's values hold for each of its models
    out: dict[str, Any] = {
        "residency": None if info.state is Residency.UNKNOWN else info.state.value,
        "vram_bytes": info.vram_bytes,
        "size_bytes": info.size_bytes,
    }
    for s in LOAD_ORDER:
        out[s.value] = load.get(s)
    return out


def _source(p: Probe) -> str:
    if p.own:
        return "own"
    return "log" if p.is_log else "path"


def _jsonable(v: object) -> Any:
    if isinstance(v, Residency):
        return v.value
    if isinstance(v, Mapping):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, tuple | list):
        return [_jsonable(x) for x in v]
    return v


async def examine(
    url: str,
    fetcher: Fetcher,
    kind: str,
    own: Sequence[Probe] = (),
    log_lines: Iterable[bytes] | None = None,
    capacity: int | None = None,
    aliases: Mapping[str, str] | None = None,
    post: Any = None,
    memory_gb: float | None = None,
    check_memory: bool = False,
) -> BackendReport:
    """Resolve one backend and collect what doctor reports about it. ``post(path, body)``
    (live only) checks the coding-agent routes; ``check_memory`` explains ``memory_gb``."""
    report = BackendReport(url)
    try:
        plan, snap = await resolve(fetcher, kind, own, has_log_feed=log_lines is not None)
    except (BackendUnreachable, DetectionFailed) as e:
        report.error = f"{type(e).__name__}: {e}"
        return report
    report.plan, report.snapshot = plan, snap
    report.kind, report.version = plan.kind, plan.version
    if log_lines is not None and plan.log_probes:
        # A log value holds until a newer matching line replaces it: the last line wins.
        parts = [(name, sig, s) for s in plan.follow(log_lines) for sig, name in s.sources.items()]
        report.log_snapshot = merge(parts[::-1])
    await _surprises(report, fetcher, capacity, aliases or {}, post)
    if check_memory:
        report.surprises.append(_memory_note(report, memory_gb))
    return report


def _memory_note(report: BackendReport, memory_gb: float | None) -> str:
    """What model placement can do on this backend with the config's ``memory_gb``."""
    swap = report.kind == LLAMASWAP
    if memory_gb is not None:
        return (f"memory_gb: {memory_gb:g} in config: a cold load is checked to fit beside the "
                "busy models, and the idle models it evicts are priced")
    if swap:
        return ("memory_gb: not configured: llama-swap holds one model at a time, so a load "
                "is taken to swap out every other model (no size check)")
    if report.merged().known(Signal.RESIDENCY):
        return ("memory_gb: not configured: placement sees residency only (which models are "
                "loaded), with no fit check: a cold load is taken to fit and its evictions "
                "are not priced; set memory_gb: for the memory its models may use")
    return "memory_gb: not configured (the engine reports no residency: one model, always loaded)"


async def _surprises(
    report: BackendReport,
    fetcher: Fetcher,
    capacity: int | None,
    aliases: Mapping[str, str],
    post: Any,
) -> None:
    snap = report.merged()
    engine_capacity = any(load.capacity is not None for load in snap.load.values())
    if capacity is not None:
        if engine_capacity:
            report.surprises.append(
                f"capacity: {capacity} in config is not used: the engine reports its own"
            )
        else:
            report.surprises.append(
                f"capacity: {capacity} in config is used: the engine reports none"
            )
    elif not engine_capacity:
        report.surprises.append(
            "capacity: unknown (engine reports none, config sets none): Pharos learns it under "
            "load from the engine's running and waiting counts (starting from 2 slots; "
            "POST /admin/explain shows the learned value); set capacity: to fix it"
        )
    listed = set(snap.models or ())
    for engine_name, client_name in aliases.items():
        state = "listed" if engine_name in listed else "NOT listed by the engine"
        report.surprises.append(f"alias {engine_name} -> {client_name}: {state}")
    if report.kind == OLLAMA:
        try:
            tags = await fetcher.fetch("/api/tags")
        except FetchError:
            tags = None
        if tags is not None and tags.status == 200:
            for name in ollama_remote_models(tags.body):
                report.surprises.append(
                    f"model {name} is a cloud stub (remote_host): Pharos routes to it like a "
                    "local model, and its prompts leave the network"
                )
    if post is None:
        report.surprises.append("coding-agent routes: not checked (no live backend)")
        return
    for route in CODING_AGENT_ROUTES:
        try:
            status = await post(route, b"{}")
        except FetchError as e:
            report.surprises.append(f"{route}: no answer ({e})")
            continue
        served = "served" if status != 404 else "not served (404)"
        report.surprises.append(f"{route}: {served} (POST {{}} answered {status})")


def render_json(reports: Sequence[BackendReport]) -> str:
    """The whole doctor run as one JSON document."""
    return json.dumps({"backends": [r.as_json() for r in reports]}, indent=2)


def render_text(reports: Sequence[BackendReport], source_note: str = "") -> str:
    """The doctor run for a person."""
    out: list[str] = []
    if source_note:
        out.append(source_note)
    for r in reports:
        doc = r.as_json()
        out.append(f"backend {r.url}")
        if r.error:
            out.append(f"  error: {r.error}")
            out.append("")
            continue
        out.append(f"  kind: {r.kind}   version: {r.version or 'unknown'}")
        out.append("  active probes:")
        for a in doc["active"]:
            val = json.dumps(a["value"]) if a["value"] is not None else "no match yet"
            feed = a["source"] if a["feed"] == "log" else f"{a['source']} {a['feed']}"
            out.append(f"    {a['probe']:<28} {a['signal']:<11} {feed:<22} {val}")
        if doc["dropped"]:
            out.append("  dropped probes:")
            for d in doc["dropped"]:
                why = d["reason"] + (f": {d['detail']}" if d["detail"] else "")
                out.append(f"    {d['probe']:<28} {d['signal']:<11} {why}")
        out.append("  unknown signals: " + (", ".join(doc["unknown"]) or "none"))
        models = doc["signals"]["models"]
        if models:
            out.append("  models:")
            for name, sig in models.items():
                vals = " ".join(f"{k}={_show(v)}" for k, v in sig.items())
                out.append(f"    {name}: {vals}")
        whole = doc["signals"]["backend"]
        out.append("  backend: " + " ".join(f"{k}={_show(v)}" for k, v in whole.items()))
        for s in r.surprises:
            out.append(f"  note: {s}")
        out.append("")
    return "\n".join(out)


def _show(v: object) -> str:
    return "unknown" if v is None else str(v)
