"""The capture format of ``fixtures/`` (see fixtures/README.md): raw bodies exactly as an
engine served them, written by ``pharos doctor --record``, read by replay tests and
``CaptureFetcher``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: Every probe's and fingerprint's path, so detection and resolve replay over every capture.
RECORD_PATHS: tuple[str, ...] = (
    "/",
    "/health",
    "/api/version",
    "/api/tags",
    "/api/ps",
    "/v1/models",
    "/props",
    "/slots",
    "/metrics",
    "/running",
    "/version",
    "/get_server_info",
)

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def body_name(path: str) -> str:
    """The file that holds the body of ``path`` in a capture directory."""
    if path == "/":
        return "root"
    return _UNSAFE.sub("_", path.lstrip("/"))


@dataclass(frozen=True, slots=True)
class Recorded:
    """One recorded answer."""

    status: int
    content_type: str
    body: bytes


@dataclass(frozen=True, slots=True)
class RecordedReply:
    """One recorded reply to a client request (``streams/``)."""

    name: str
    method: str
    path: str
    status: int
    content_type: str
    request: bytes
    body: bytes


@dataclass(frozen=True, slots=True)
class Capture:
    """One ``fixtures/<engine>/<version>/<state>/`` directory, read whole."""

    directory: Path
    meta: Mapping[str, Any]
    paths: Mapping[str, Recorded]
    log_lines: tuple[str, ...] | None = None
    replies: tuple[RecordedReply, ...] = field(default_factory=tuple)

    @property
    def engine(self) -> str:
        """The engine directory name (a Pharos kind, or the engine's own name)."""
        return str(self.meta["engine"])

    @property
    def version(self) -> str:
        """The engine version as the engine reports it."""
        return str(self.meta["version"])

    @property
    def state(self) -> str:
        """The state directory name (idle, busy, ...)."""
        return self.directory.name

    @classmethod
    def load(cls, directory: Path) -> Capture:
        """Read a capture directory; a malformed one raises ``ValueError`` naming the file."""
        meta = yaml.safe_load((directory / "meta.yaml").read_text())
        if not isinstance(meta, dict) or "engine" not in meta or "version" not in meta:
            raise ValueError(f"{directory / 'meta.yaml'}: needs engine and version")
        paths: dict[str, Recorded] = {}
        for path, status, ctype in _tsv(directory / "paths.tsv", 3):
            body_file = directory / body_name(path)
            body = body_file.read_bytes() if body_file.exists() else b""
            paths[path] = Recorded(int(status), "" if ctype == "-" else ctype, body)
        log = directory / "engine.log"
        lines = tuple(log.read_text().splitlines()) if log.exists() else None
        replies: list[RecordedReply] = []
        streams = directory / "streams"
        if (streams / "replies.tsv").exists():
            for name, method, path, status, ctype in _tsv(streams / "replies.tsv", 5):
                req = streams / f"{name}.request.json"
                replies.append(
                    RecordedReply(
                        name,
                        method,
                        path,
                        int(status),
                        "" if ctype == "-" else ctype,
                        req.read_bytes() if req.exists() else b"",
                        (streams / f"{name}.body").read_bytes(),
                    )
                )
        return cls(directory, meta, paths, lines, tuple(replies))


def _tsv(path: Path, columns: int) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cells = tuple(line.split("\t"))
        if len(cells) != columns:
            raise ValueError(f"{path}:{n}: expected {columns} tab-separated columns")
        rows.append(cells)
    return rows


def find_captures(root: Path) -> list[Path]:
    """Every capture directory under ``root`` (those holding a paths.tsv), sorted."""
    return sorted(p.parent for p in root.glob("*/*/*/paths.tsv"))


def write_capture(
    directory: Path,
    meta: Mapping[str, Any],
    paths: Mapping[str, Recorded],
    replies: tuple[RecordedReply, ...] = (),
) -> None:
    """Write one capture directory in the fixture format, bodies byte for byte."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "meta.yaml").write_text(yaml.safe_dump(dict(meta), sort_keys=False))
    rows = ["# path\tstatus\tcontent type"]
    for path, rec in paths.items():
        rows.append(f"{path}\t{rec.status}\t{rec.content_type or '-'}")
        (directory / body_name(path)).write_bytes(rec.body)
    (directory / "paths.tsv").write_text("\n".join(rows) + "\n")
    if replies:
        streams = directory / "streams"
        streams.mkdir(exist_ok=True)
        rows = ["# name\tmethod\tpath\tstatus\tcontent type"]
        for r in replies:
            rows.append(f"{r.name}\t{r.method}\t{r.path}\t{r.status}\t{r.content_type or '-'}")
            (streams / f"{r.name}.request.json").write_bytes(r.request)
            (streams / f"{r.name}.body").write_bytes(r.body)
        (streams / "replies.tsv").write_text("\n".join(rows) + "\n")
