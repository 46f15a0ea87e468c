"""The admin API's documents: the config in effect, a JSON merge patch of it, each backend's
plan, signals and learned estimates, and the prefix index's census.

``GET /admin/config`` shows the running config in the file's own shape (``to_document``;
``parse_config`` of it gives the running config again, checked before every patch), every
secret redacted (``redact``: keys' hashes and a URL's password; the peers' secret is never in
the config, only its file's path), and the config generation.

``PATCH /admin/config`` takes an RFC 7386 merge patch of that document and applies it as a
reload applies the file: ``parse_config``, ``reload_diff``, ``with_live``. It is refused whole
(422 with every error) when it does not parse, names an unknown field, or changes a field that
needs a restart. A patch lives in memory only: the file's next change (or ``POST
/admin/reload``, SIGHUP) reads the file again and its values replace the patched ones.

Merge-patch semantics: an object merges, anything else (lists included) replaces, ``null``
removes a field (so it takes its default; a guard only ``null`` turns off cannot be turned off
by a merge patch: edit the file). A key sent back with its hash still ``<redacted>`` keeps the
running key's hash (matched by name).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import yaml

from pharos.config import Config, ConfigError, file_name, parse_config, reload_diff, with_live
from pharos.config.describe import to_document
from pharos.config.model import COST_MODEL
from pharos.engine.doctor import BackendReport
from pharos.engine.signals import FAST_SIGNALS, LOAD_ORDER, Residency, Signal, Snapshot, merge
from pharos.prefix import IndexCensus, PrefixIndex
from pharos.proxy.errors import ApiError
from pharos.sched import Scheduler
from pharos.state.registry import BackendState, Target
from pharos.state.state import State
from pharos.state.stats import STAT_FIELDS

#: What a secret is shown as.
REDACTED = "<redacted>"
#: Entries ``GET /admin/index?list=N`` lists at most.
MAX_LISTED = 1000


# --- the config as a document -----------------------------------------------------------------

def redact_url(url: str) -> str:
    """A URL with the password of its user part (if any) replaced by ``<redacted>``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{REDACTED}@{host}"))


def redact(doc: dict[str, Any]) -> dict[str, Any]:
    """A copy of a ``to_document`` document safe to show: keys' hashes and URL passwords
    replaced by ``<redacted>``."""
    out = json.loads(json.dumps(doc))
    for key in out.get("keys") or ():
        if isinstance(key, dict) and "sha256" in key:
            key["sha256"] = REDACTED
    for backend in out.get("backends") or ():
        if isinstance(backend, dict) and isinstance(backend.get("url"), str):
            backend["url"] = redact_url(backend["url"])
    return out


def merge_patch(target: object, patch: object) -> object:
    """RFC 7386 JSON merge patch: an object patch merges member by member (``null``
    removes), anything else replaces the target. Neither argument is changed."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = merge_patch(out.get(name), value)
    return out


@dataclass
class Patched:
    """What a patch did: the fields applied (file names), or why nothing was."""

    applied: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()


@dataclass
class ConfigAdmin:
    """The config in effect and its patches. ``apply`` puts a config in force as a reload does
    (also as the file watcher's running config, so the file's next change is compared with
    the patched one); ``path``: the config file, if any."""

    current: Callable[[], Config]
    apply: Callable[[Config], None]
    generation: Callable[[], int]
    path: str | None = None
    #: The generation the last patch made (None: none yet).
    patched_generation: int | None = field(default=None)

    def document(self) -> dict[str, Any]:
        """``GET /admin/config``'s body."""
        generation = self.generation()
        return {"generation": generation, "file": self.path,
                "patched": generation == self.patched_generation,
                "config": redact(to_document(self.current()))}

    def patch(self, body: bytes) -> Patched:
        """Apply a merge patch (the request body) or refuse it whole. Raises ``ApiError`` for
        a body that is not a JSON object (400) and when workers share the port (409)."""
        try:
            patch = json.loads(body)
        except ValueError as e:
            raise ApiError(400, f"the merge patch is not valid JSON: {e}",
                           code="invalid_json") from None
        if not isinstance(patch, dict):
            raise ApiError(400, "a merge patch of the config is a JSON object",
                           code="invalid_patch")
        running = self.current()
        if running.workers > 1:
            raise ApiError(409, f"workers: {running.workers}: a patch would change one worker's "
                                f"config; edit the file and reload", code="workers")
        base_doc = to_document(running)
        _expressible(running, base_doc)
        merged = merge_patch(base_doc, patch)
        if not isinstance(merged, dict):  # unreachable: the patch is an object
            raise ApiError(400, "a merge patch of the config is a JSON object",
                           code="invalid_patch")
        _keep_hashes(merged, running)
        try:
            new = parse_config(_yaml(merged))
        except ConfigError as e:
            return Patched(errors=tuple(e.errors))
        live, restart = reload_diff(running, new)
        if restart:
            return Patched(errors=tuple(
                f"{name}: needs a restart; a patch changes only live fields (edit the file "
                f"and restart)" for name in dict.fromkeys(map(file_name, restart))))
        if live:
            self.apply(with_live(running, new, live))
            self.patched_generation = self.generation()
        return Patched(applied=tuple(dict.fromkeys(map(file_name, live))))


def _yaml(doc: dict[str, Any]) -> str:
    """A document as YAML text for ``parse_config`` (JSON text would not do: YAML 1.1 reads
    JSON's ``3e-09`` as a string)."""
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def _expressible(running: Config, doc: dict[str, Any]) -> None:
    """Refuse a patch when the running config does not come back from its own document (a
    field ``to_document`` does not know): a patch over it would change what nobody asked."""
    try:
        back = parse_config(_yaml(doc))
    except ConfigError as e:
        raise ApiError(500, f"the running config cannot be written as a document: "
                            f"{'; '.join(e.errors)}", type="server_error",
                       code="pharos_error") from None
    live, restart = reload_diff(running, back)
    if live or restart:
        raise ApiError(500, f"the running config cannot be written as a document "
                            f"({', '.join(live + restart)}); edit the file", type="server_error",
                       code="pharos_error")


def _keep_hashes(doc: dict[str, Any], running: Config) -> None:
    """A key whose hash was sent back ``<redacted>`` keeps the running key's of that name."""
    hashes = {k.name: k.sha256 for k in running.keys}
    for key in doc.get("keys") or ():
        if (isinstance(key, dict) and key.get("sha256") == REDACTED
                and key.get("name") in hashes):
            key["sha256"] = hashes[key["name"]]


# --- backends ---------------------------------------------------------------------------------

def _report(b: BackendState) -> BackendReport:
    """Doctor's report from the backend's last rounds (the fast signals from the last load
    round, the rest from the last full one), as ``/status`` builds it."""
    parts: list[tuple[str, Signal, Snapshot]] = []
    if b.load is not None:
        parts += [(name, s, b.load) for s, name in b.load.sources.items() if s in FAST_SIGNALS]
    if b.full is not None:
        parts += [(name, s, b.full) for s, name in b.full.sources.items()]
    return BackendReport(b.url, kind=b.kind, version=b.version, plan=b.plan,
                         snapshot=merge(parts), error=b.failing)


def _age(now: float, at: float | None) -> float | None:
    return None if at is None else round(max(0.0, now - at), 3)


def _plain(value: object) -> object:
    if isinstance(value, Residency):
        return value.value
    return value


def backends_document(state: State, sched: Scheduler) -> dict[str, Any]:
    """``GET /admin/backends``: each backend's plan (kind, version, active and dropped
    probes), signals, ejection state, and per target its view, capacity with its source and
    learned estimates (EWMA value and sample count; unknown is null)."""
    now = state.clock.seconds()
    out = []
    for b in state.backends.values():
        report = _report(b).as_json()
        out.append({
            "url": redact_url(b.url),
            "up": state.is_up(b, now),
            "kind": b.kind, "version": b.version,
            "plan": {"kind": b.kind, "version": b.version, "active": report["active"],
                     "dropped": report["dropped"], "unknown": report["unknown"]},
            "signals": report["signals"],
            "ejection": {"ejected": b.ejected, "failing": b.failing,
                         "failed_rounds": b.failed_rounds, "removed": b.removed,
                         "last_full_round_age_s": _age(now, b.full_at),
                         "last_load_round_age_s": _age(now, b.load_at),
                         "last_reply_age_s": _age(now, b.replied_at)},
            "config": {"capacity": b.spec.capacity, "memory_gb": b.spec.memory_gb,
                       "cost_model": COST_MODEL.dump(b.spec.cost_model)},
            "targets": [_target(state, sched, t) for t in state.targets if t.backend is b],
        })
    return {"backends": out}


def _target(state: State, sched: Scheduler, t: Target) -> dict[str, Any]:
    v = state.view(t)
    capacity, source = sched.capacity_of(t)
    return {
        "model": t.model, "served": t.served, "generation": t.gen,
        "residency": v.residency.value,
        "signals": {sig.value: _plain(getattr(v, sig.value)) for sig in LOAD_ORDER},
        "signals_from_log": sorted(v.from_log),
        "inflight": t.inflight, "unstarted": t.unstarted,
        "capacity": capacity, "capacity_source": source,
        "learned_capacity": t.learned_capacity,
        "estimates": {name: {"value": getattr(t.stats, name).value,
                             "samples": getattr(t.stats, name).samples}
                      for name in STAT_FIELDS},
    }


# --- the prefix index -------------------------------------------------------------------------

def index_document(census: IndexCensus, index: PrefixIndex, state: State, listed: int,
                   key_of: Callable[[int], str | None], gen_of: Callable[[int], int | None]
                   ) -> dict[str, Any]:
    """``GET /admin/index``: entries, capacity, estimated bytes, per target the entries a lookup can
    match (and stale ones), the ``listed`` most recent entries as hashes (no prompt text)."""
    targets = state.targets
    rows = []
    for tid in sorted(set(census.current) | set(census.stale)):
        t = targets[tid] if 0 <= tid < len(targets) else None
        rows.append({"target": t.key if t is not None else None,
                     "backend": redact_url(t.backend.url) if t is not None else None,
                     "model": t.model if t is not None else None,
                     "predicted_entries": census.current.get(tid, 0),
                     "stale_entries": census.stale.get(tid, 0)})
    doc: dict[str, Any] = {"entries": census.entries, "capacity": index.capacity,
                           "bytes_estimate": census.bytes, "targets": rows}
    if listed:
        doc["recent"] = [{"hash": f"{e.key:016x}",
                          "slots": [{"target": s.target_key, "last_used": s.last_used}
                                    for s in e.slots]}
                         for e in islice(index.iter_export(key_of, gen_of), listed)]
    return doc


def listed_count(args: Mapping[bytes, list[bytes]] | None) -> int:
    """``?list=N`` (0 to ``MAX_LISTED``); 400 for anything else."""
    raw = (args or {}).get(b"list")
    if not raw:
        return 0
    text = raw[-1].decode("latin-1")
    if not text.isdigit() or int(text) > MAX_LISTED:
        raise ApiError(400, f"list is a number of entries from 0 to {MAX_LISTED}",
                       code="invalid_parameter")
    return int(text)
