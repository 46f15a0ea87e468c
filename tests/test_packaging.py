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
    # the engine doubles (twistd pharos --demo) find their captures in the installed wheel
    doubles = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "from pharos.sim.double import KINDS, pinned_capture\n"
         "print(' '.join(pinned_capture(k).version for k in KINDS))"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert doubles.returncode == 0, doubles.stderr
    assert doubles.stdout.split() == ["0.32.15", "b11312", "0.32.0", "v250"]


def test_setup_cfg_lists_the_pinned_captures() -> None:
    """setup.cfg's data_files are exactly the captures the doubles are cloned from."""
    sys.path.insert(0, str(ROOT / "contrib"))
    try:
        from data_files import block  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    assert block() in (ROOT / "setup.cfg").read_text(), "run: python contrib/data_files.py"
