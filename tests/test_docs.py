"""The documentation site under docs/ builds with Sphinx, warnings as errors (``make docs``),
and its pages keep to what a reader has: no references to documents or history they lack."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

#: What an engineering log cites and a reader of the docs does not have.
HISTORY = re.compile(
    r"spec §|DESIGN §|\bissue \d+|"
    # a commit hash, short or full (not the 16-digit hashes of /admin/index)
    r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])(?:[0-9a-f]{7,12}|[0-9a-f]{40})\b"
)


@pytest.mark.skipif(importlib.util.find_spec("sphinx") is None,
                    reason="sphinx is not installed (make install installs it: extra dev)")
def test_docs_build_without_warnings(tmp_path: Path) -> None:
    """``sphinx-build -W`` into a temporary directory: any warning (a broken reference, a
    page outside the toctree, bad markup) fails the build and this test with its words."""
    out = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr or out.stdout
    assert out.stderr.strip() == "", out.stderr
    assert (tmp_path / "html" / "index.html").is_file()


def test_docs_cite_no_engineering_history() -> None:
    """No page cites the spec or design sections, issue numbers or commit hashes."""
    pages = sorted(DOCS.glob("*.rst"))
    assert pages
    found = [f"{page.name}:{n}: {line.strip()}"
             for page in pages
             for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
             if HISTORY.search(line)]
    assert not found, "\n".join(found)
