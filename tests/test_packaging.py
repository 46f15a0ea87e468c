"""Packaging: a wheel built from this tree, installed normally into a fresh virtualenv, gives
``twistd`` the ``pharos`` plugin and the ``pharos`` console script."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.packaging
def test_wheel_installs_twistd_plugin(tmp_path: Path) -> None:
    """The wheel holds twisted/plugins/pharos_dropin.py (and no twisted/__init__.py), and
    after a non-editable install twistd --help lists pharos."""
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                    "-q", "-w", str(dist), str(ROOT)], check=True, timeout=300)
    wheel = next(dist.glob("*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "twisted/plugins/pharos_dropin.py" in names
    assert "twisted/__init__.py" not in names
    assert "twisted/plugins/__init__.py" not in names
    assert "pharos/engine/library.py" in names
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
           "--disable-pip-version-check"]
    subprocess.run([*pip, str(wheel)], check=True, timeout=600)
    out = subprocess.run([str(venv / "bin" / "twistd"), "--help"], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "pharos" in out.stdout
    check = subprocess.run([str(venv / "bin" / "pharos"), "--help"], capture_output=True,
                           text=True, timeout=60, cwd=tmp_path)
    assert "doctor" in check.stdout
