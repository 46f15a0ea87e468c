"""Own probes from config, built with the library's constructors, and log feeds for doctor."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pharos.config import LogFeed, LogSpec, OwnProbe, PromSpec
from pharos.engine.probes import Probe, log_line, prom
from pharos.engine.signals import Residency


def own_probes(specs: Sequence[OwnProbe]) -> tuple[Probe, ...]:
    """Library probes from the operator's own probe specs (validated by config)."""
    out: list[Probe] = []
    for spec in specs:
        if isinstance(spec.spec, PromSpec):
            p = spec.spec
            out.append(prom(spec.name, p.path, spec.signal, p.metric, per_model=p.per_model,
                            scale=p.scale, own=True))
        else:
            assert isinstance(spec.spec, LogSpec)
            v = spec.spec.value
            fixed = None if v is None else v.value if isinstance(v, Residency) else str(v)
            out.append(log_line(spec.name, spec.signal, spec.spec.match, fixed, own=True))
    return tuple(out)


class LogFeedUnavailable(Exception):
    """A log feed doctor cannot read (Docker feeds come with Docker discovery)."""


def read_log_feed(feed: LogFeed | str) -> list[bytes]:
    """Every line of a ``file://`` log feed, from its start (doctor reads it whole)."""
    if isinstance(feed, str):
        scheme, _, target = feed.partition("://")
    else:
        scheme, target = feed.scheme, feed.target
    if scheme != "file":
        raise LogFeedUnavailable(f"{scheme}:// log feeds are not read yet")
    return Path(target).read_bytes().splitlines()
