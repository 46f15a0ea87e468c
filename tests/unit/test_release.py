"""Releases: one version (``pharos.__version__``) that both ``--version`` flags print and
everything else reads or matches."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

from pharos import __version__
from pharos.cli import main
from pharos.tap import Options

ROOT = Path(__file__).resolve().parent.parent.parent
#: An image tag or a release file name carrying a version.
VERSIONED = re.compile(r"pharos[-_]router[:-](\d+\.\d+\.\d+\w*)")


def test_pharos_version_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"pharos {__version__}\n"


def test_twistd_pharos_version_prints_pharos_version(
        capsys: pytest.CaptureFixture[str]) -> None:
    """usage.Options' own --version prints Twisted's: after ``pharos`` it is Pharos's."""
    with pytest.raises(SystemExit) as stop:
        Options().parseOptions(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"pharos {__version__}\n"


def test_the_version_is_kept_in_one_place() -> None:
    """setup.cfg and the docs read ``pharos.__version__``; the files that must name a version
    (an image tag in a manifest, an example file name) name that one."""
    assert re.match(r"\d+\.\d+\.\d+", __version__)
    cfg = (ROOT / "setup.cfg").read_text()
    assert re.findall(r"(?m)^version\s*=.*$", cfg) == ["version = attr: pharos.__version__"]
    assert runpy.run_path(str(ROOT / "docs" / "conf.py"))["release"] == __version__
    named = [f"{path.relative_to(ROOT)}: {found}"
             for pattern in ("*.rst", "docs/*.rst", "contrib/**/*.yaml", "contrib/**/*.service",
                             "Dockerfile")
             for path in sorted(ROOT.glob(pattern))
             for found in VERSIONED.findall(path.read_text(encoding="utf-8"))
             if found != __version__]
    assert not named, f"version {__version__} elsewhere: {named}"
