"""The result file of one run: its specification (what was run, where, on which commit), one
record per request (no prompt text) and the summary. Report and compare read these alone."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import pharos
from pharos.bench.pick import machine
from pharos.bench.records import RequestRecord

#: Bumped only when a field changes meaning; readers ignore fields they do not know.
FORMAT = 1


def git_commit() -> dict[str, Any]:
    """The commit of the Pharos checkout this runs from and whether its tracked files differ
    from it; ``None`` values outside a git checkout."""
    where = Path(pharos.__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=where, capture_output=True, text=True, timeout=10,
                               check=True).stdout.strip() != ""
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": head or None, "dirty": dirty}


def environment() -> dict[str, Any]:
    """Where and when: Pharos version and commit, the machine, the date (UTC)."""
    return {
        "pharos": pharos.__version__,
        **git_commit(),
        "machine": {**machine(), "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def result_document(spec: dict[str, Any], records: list[RequestRecord],
                    summary: dict[str, Any]) -> dict[str, Any]:
    """The JSON document of a run."""
    return {"format": FORMAT, "spec": spec, "summary": summary,
            "records": [r.to_json() for r in records]}


def write_result(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` whole or not at all (a temporary file renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def read_result(path: Path) -> dict[str, Any] | None:
    """A result document, or ``None`` when the file is not one."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("spec"), dict) \
            or not isinstance(doc.get("summary"), dict):
        return None
    return doc


def records_of(doc: dict[str, Any]) -> list[RequestRecord]:
    """The request records of a result document."""
    return [RequestRecord.from_json(r) for r in doc.get("records") or ()]
