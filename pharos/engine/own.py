"""Own probes from config, built with the library's constructors, and log feeds for doctor."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from pharos.config import LogFeed, LogSpec, OwnProbe, PromSpec
from pharos.discovery.feed import LineSplitter
from pharos.discovery.logfile import CHUNK_BYTES
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


class LogFileLines:
    """A log file's lines from its start, read in bounded chunks on each iteration (an engine
    log can be gigabytes), overlong lines dropped as the feed drops them. Opened at once, so
    a missing file is an error before doctor starts."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb"):
            pass

    def __iter__(self) -> Iterator[bytes]:
        lines: list[bytes] = []
        splitter = LineSplitter(lines.append)
        with open(self.path, "rb") as f:
            while data := f.read(CHUNK_BYTES):
                splitter.feed(data)
                yield from lines
                lines.clear()
        splitter.flush()
        yield from lines


def read_log_feed(feed: LogFeed | str) -> LogFileLines:
    """The lines of a ``file://`` log feed, from its start (doctor reads it whole)."""
    if isinstance(feed, str):
        scheme, _, target = feed.partition("://")
    else:
        scheme, target = feed.scheme, feed.target
    if scheme != "file":
        raise LogFeedUnavailable(f"{scheme}:// log feeds are read through their own API")
    return LogFileLines(target)
