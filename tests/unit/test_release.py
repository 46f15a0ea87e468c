"""Releases: one version (``pharos.__version__``) that both ``--version`` flags print and
everything else reads or matches, a changelog with its entry, news fragments towncrier can
gather, and the license setup.cfg names."""

from __future__ import annotations

import re
import runpy
import tomllib
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


def test_changelog_has_this_version_and_the_towncrier_marker() -> None:
    text = (ROOT / "CHANGELOG.rst").read_text(encoding="utf-8")
    assert ".. towncrier release notes start\n" in text
    after = text.split(".. towncrier release notes start\n", 1)[1]
    assert re.search(rf"(?m)^Pharos {re.escape(__version__)}( \(.*\))?\n-+$", after)
    assert "Upgrading\n---------\n" in text


def test_news_fragments_have_a_known_type() -> None:
    """A fragment named with a type towncrier does not know would be left out of the
    changelog without a word."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["towncrier"]
    types = {t["directory"] for t in conf["type"]}
    folder = ROOT / conf["directory"]
    assert (folder / "README.rst").is_file()
    bad = [p.name for p in folder.iterdir()
           if p.name != "README.rst"
           and not re.fullmatch(rf"\+?[\w.-]+\.({'|'.join(types)})(\.\d+)?\.rst", p.name)]
    assert not bad, f"news fragments of no known type {sorted(types)}: {bad}"


def test_license_is_the_mit_one_setup_cfg_names() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n")
    assert "Copyright (c) the Pharos authors" in text
    assert re.search(r"(?m)^license = MIT$", (ROOT / "setup.cfg").read_text())


def test_an_installed_demo_finds_its_captures_in_the_scheme_data_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a checkout the doubles read the captures from where pip put the wheel's
    data_files: the install scheme's data directory, which under Debian's own Python is
    /usr/local while ``sys.prefix`` is /usr."""
    import sysconfig

    from pharos.sim import double

    data = tmp_path / "usr-local"
    (data / "share" / "pharos" / "fixtures").mkdir(parents=True)
    monkeypatch.setattr(double, "__file__", str(tmp_path / "site" / "pharos" / "sim" / "x.py"))
    monkeypatch.setattr(sysconfig, "get_path", lambda name: str(data))
    monkeypatch.setattr(double.sys, "prefix", str(tmp_path / "usr"))
    assert double._fixtures() == data / "share" / "pharos" / "fixtures"
