"""Plans: which probes answer on one backend, discovered at runtime.

``resolve`` runs a kind's recipe (own probes first) once and keeps, per signal, the first probe
that reads a known value; ``Plan.scrape`` asks only those, one GET per path.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from twisted.internet.defer import DeferredList
from twisted.python.failure import Failure

from pharos.engine.fetch import Fetched, Fetcher, FetchError
from pharos.engine.library import AUTO, FINGERPRINTS, OPENAI, RECIPES
from pharos.engine.probes import Probe, ProbeError
from pharos.engine.signals import FAST_SIGNALS, Signal, Snapshot, merge

# Drop reasons, as doctor and /status show them.
NOT_FOUND = "404"
FETCH_ERROR = "fetch error"
PARSE_ERROR = "parse error"
NO_VALUE = "no value"
REDUNDANT = "redundant"
VERSION_GUARD = "version guard"
NO_LOG_FEED = "no log feed"


class BackendUnreachable(Exception):
    """Every path the recipe asked got no answer at all."""


class DetectionFailed(Exception):
    """No fingerprint matched and some got no answer or a 503: a guess would be wrong."""


@dataclass(frozen=True, slots=True)
class Dropped:
    """A probe left out of the plan, and why."""

    probe: Probe
    reason: str
    detail: str = ""

    def describe(self) -> str:
        """The reason with its detail, as doctor prints it."""
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


@dataclass(frozen=True, slots=True)
class ProbeFailure:
    """A planned probe that failed in one scrape round."""

    probe: Probe
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    """The probes that answered on one backend at its current version, own probes first."""

    kind: str
    version: str | None
    active: tuple[Probe, ...]
    dropped: tuple[Dropped, ...] = ()

    @property
    def http_probes(self) -> tuple[Probe, ...]:
        """The active probes that read an HTTP path."""
        return tuple(p for p in self.active if not p.is_log)

    @property
    def log_probes(self) -> tuple[Probe, ...]:
        """The active probes that read the log feed."""
        return tuple(p for p in self.active if p.is_log)

    def paths(self, full: bool = True) -> tuple[str, ...]:
        """The distinct paths one round GETs: all on a full round, load paths otherwise."""
        seen: dict[str, None] = {}
        for p in self.http_probes:
            if (full or p.signal in FAST_SIGNALS) and p.path is not None:
                seen.setdefault(p.path)
        return tuple(seen)

    async def scrape(
        self, fetcher: Fetcher, full: bool = True
    ) -> tuple[Snapshot, tuple[ProbeFailure, ...]]:
        """One round of the plan's HTTP probes, one GET per path. A failing probe leaves its
        signal unknown and is reported, so the caller re-resolves (its fallback was dropped)."""
        probes = [p for p in self.http_probes if full or p.signal in FAST_SIGNALS]
        answers = await fetch_all(fetcher, self.paths(full))
        parts: list[tuple[str, Signal, Snapshot]] = []
        failures: list[ProbeFailure] = []
        for probe in probes:
            assert probe.path is not None
            snap, why = run_probe(probe, answers[probe.path])
            if snap is None:
                failures.append(ProbeFailure(probe, why))
            else:
                parts.append((probe.name, probe.signal, snap))
        return merge(parts), tuple(failures)

    def follow_line(self, line: bytes) -> Snapshot | None:
        """The signals one log line sets, or ``None``; an unusable value is skipped, never
        made up."""
        parts: list[tuple[str, Signal, Snapshot]] = []
        for probe in self.log_probes:
            try:
                snap = probe.parse(line)
            except ProbeError:
                continue
            if snap.known(probe.signal):
                parts.append((probe.name, probe.signal, snap))
        return merge(parts) if parts else None

    def follow(self, lines: Iterable[bytes]) -> Iterator[Snapshot]:
        """A snapshot for each line that set a value, holding only that line's signals."""
        for line in lines:
            snap = self.follow_line(line)
            if snap is not None:
                yield snap


Answer = Fetched | FetchError


async def fetch_all(fetcher: Fetcher, paths: Sequence[str]) -> dict[str, Answer]:
    """GET each path once, side by side; a failed GET is kept as its ``FetchError``."""
    ds = [fetcher.fetch(p) for p in paths]
    results = await DeferredList(ds, consumeErrors=True)
    out: dict[str, Answer] = {}
    for path, (ok, value) in zip(paths, results, strict=True):
        if ok:
            assert isinstance(value, Fetched)
            out[path] = value
        else:
            assert isinstance(value, Failure)
            err = value.value
            out[path] = err if isinstance(err, FetchError) else FetchError(
                f"{type(err).__name__}: {err}")
    return out


def run_probe(probe: Probe, answer: Answer) -> tuple[Snapshot | None, str]:
    """Run one probe on its answer: its snapshot, or ``None`` and the drop reason."""
    if isinstance(answer, FetchError):
        return None, f"{FETCH_ERROR}: {answer}"
    if answer.status == 404:
        return None, NOT_FOUND
    if answer.status != 200:
        return None, f"status {answer.status}"
    try:
        snap = probe.parse(answer.body)
    except ProbeError as e:
        return None, f"{PARSE_ERROR}: {e}"
    if not snap.known(probe.signal):
        return None, NO_VALUE
    return snap, ""


async def resolve(
    fetcher: Fetcher,
    kind: str,
    own: Sequence[Probe] = (),
    has_log_feed: bool = False,
) -> tuple[Plan, Snapshot]:
    """Run the recipe of ``kind`` (detected first when ``auto``) plus the own probes. Raises
    ``BackendUnreachable`` when nothing answers, ``DetectionFailed`` when ``auto`` cannot tell
    the kind safely."""
    if kind == AUTO:
        kind = await detect_kind(fetcher)
    probes = [*own, *RECIPES[kind]]
    paths = list(dict.fromkeys(p.path for p in probes if p.path is not None))
    answers = await fetch_all(fetcher, paths)
    if paths and all(isinstance(a, FetchError) for a in answers.values()):
        first = next(iter(answers.values()))
        raise BackendUnreachable(str(first))

    # The version decides the guarded probes, so read it first.
    version: str | None = None
    for p in probes:
        if p.signal is Signal.VERSION and p.path is not None and p.when is None:
            snap, _ = run_probe(p, answers[p.path])
            if snap is not None:
                version = snap.version
                break

    active: list[Probe] = []
    dropped: list[Dropped] = []
    parts: list[tuple[str, Signal, Snapshot]] = []
    owner: dict[Signal, Probe] = {}
    for p in probes:
        if p.is_log:
            if not has_log_feed:
                dropped.append(Dropped(p, NO_LOG_FEED))
            elif p.signal in owner:
                dropped.append(Dropped(p, REDUNDANT, f"{owner[p.signal].name} reads it"))
            else:
                owner[p.signal] = p
                active.append(p)
            continue
        if p.when is not None and (version is None or not p.when(version)):
            detail = f"needs {p.guard or 'a known version'}, version {version or 'unknown'}"
            dropped.append(Dropped(p, VERSION_GUARD, detail))
            continue
        assert p.path is not None
        snap, why = run_probe(p, answers[p.path])
        if snap is None:
            reason, _, detail = why.partition(": ")
            dropped.append(Dropped(p, reason, detail))
        elif p.signal in owner:
            dropped.append(Dropped(p, REDUNDANT, f"{owner[p.signal].name} reads it"))
        else:
            owner[p.signal] = p
            active.append(p)
            parts.append((p.name, p.signal, snap))
    plan = Plan(kind, version, tuple(active), tuple(dropped))
    return plan, merge(parts)


async def detect_kind(fetcher: Fetcher) -> str:
    """The engine kind by the fingerprints, in order; the generic kind only when safe: if
    a fingerprint got no answer or a 503 (an engine loading its model, or overloaded), the
    generic guess would hold until the next resolve, so detection fails and is retried."""
    paths = list(dict.fromkeys(p.path for _, ps in FINGERPRINTS for p in ps if p.path))
    answers = await fetch_all(fetcher, paths)
    unsure: list[str] = []
    for kind, fingerprint in FINGERPRINTS:
        if all(run_probe(p, answers[p.path])[0] is not None for p in fingerprint if p.path):
            return kind
    for path, answer in answers.items():
        if isinstance(answer, FetchError):
            unsure.append(f"{path}: {answer}")
        elif answer.status == 503:
            unsure.append(f"{path}: status 503")
    if unsure:
        raise DetectionFailed("no fingerprint matched and " + "; ".join(unsure))
    return OPENAI

