"""Packaging: the release artefacts (``make dist``: an sdist and a wheel built from it),
installed normally into a fresh virtualenv, give ``twistd`` the ``pharos`` plugin, the
``pharos`` console script and a demo that serves; and ``make demo`` installs and starts
Pharos on a machine with Python and nothing else (no npm, no C compiler)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from pharos import __version__

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fresh_env() -> dict[str, str]:
    """This environment without what would let a fresh virtualenv see this tree or this
    virtualenv (PYTHONPATH, the outer make's variables)."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "MAKEFLAGS", "MFLAGS",
                         "MAKELEVEL", "PHAROS_COMPILED")}


def serve_demo(twistd: Path, workdir: Path, env: dict[str, str] | None = None) -> str:
    """Start ``twistd -n --pidfile= pharos --demo`` (on a free port through ``-c``, as ``make
    demo`` runs it on 8090), wait until /healthz answers 200, stop it with SIGINT (Ctrl-C) and
    return its log. Every wait is bounded; the process is killed if it outlives the test."""
    port = free_port()
    cfg = workdir / "demo.yaml"
    cfg.write_text(f"listen: 127.0.0.1:{port}\ndrain: {{grace: 0s, timeout: 5s}}\n")
    log = workdir / "demo.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(twistd), "-n", "--pidfile=", "pharos", "--demo",
                                 "-c", str(cfg)], stdout=out, stderr=subprocess.STDOUT,
                                cwd=workdir, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "no /healthz: " + log.read_text(errors="replace")
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text
    return text


@pytest.mark.packaging
@pytest.mark.skipif(importlib.util.find_spec("build") is None,
                    reason="build is not installed (make install installs it: extra dev)")
def test_dist_wheel_installs_and_serves_the_demo(tmp_path: Path) -> None:
    """``make dist``'s build (the sdist, then the wheel from it): the sdist carries the
    license, the changelog and the captures; the wheel holds twisted/plugins/pharos_dropin.py
    (and no twisted/__init__.py), and after a non-editable install into a fresh virtualenv
    twistd --help lists pharos, both ``--version`` flags print the version, and ``twistd
    pharos --demo`` serves until /healthz answers."""
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)],
                           capture_output=True, text=True, timeout=900, cwd=tmp_path,
                           env=fresh_env())
    assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    assert sdist.name == f"pharos_router-{__version__}.tar.gz"
    assert wheel.name.startswith(f"pharos_router-{__version__}-py3-none-any")
    top = f"pharos_router-{__version__}/"
    with tarfile.open(sdist) as tar:
        members = set(tar.getnames())
    for name in ("LICENSE", "CHANGELOG.rst", "README.rst", "pharos/__init__.py",
                 "twisted/plugins/pharos_dropin.py", "fixtures/vllm/0.32.0/idle/meta.yaml"):
        assert top + name in members, name
    names = zipfile.ZipFile(wheel).namelist()
    info = f"pharos_router-{__version__}.dist-info/"
    assert {info + "licenses/LICENSE", info + "LICENSE"} & set(names), "no LICENSE"
    assert "twisted/plugins/pharos_dropin.py" in names
    assert "twisted/__init__.py" not in names
    assert "twisted/plugins/__init__.py" not in names
    assert "pharos/engine/library.py" in names
    venv = tmp_path / "venv"
    env = fresh_env()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=env)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
           "--disable-pip-version-check"]
    subprocess.run([*pip, str(wheel)], check=True, timeout=600, env=env, cwd=tmp_path)

    def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                              timeout=120, env=env, cwd=tmp_path)

    out = run(venv / "bin" / "twistd", "--help")
    assert out.returncode == 0, out.stderr
    assert "pharos" in out.stdout
    check = run(venv / "bin" / "pharos", "--help")
    assert "doctor" in check.stdout
    # pharos comes from the wheel, and the engine doubles (twistd pharos --demo) find their
    # captures in it
    doubles = run(venv / "bin" / "python", "-c",
                  "import pharos\n"
                  "from pharos.sim.double import FIXTURES, KINDS, pinned_capture\n"
                  "print(pharos.__file__); print(FIXTURES)\n"
                  "print(' '.join(pinned_capture(k).version for k in KINDS))")
    assert doubles.returncode == 0, doubles.stderr
    where, fixtures, versions = doubles.stdout.splitlines()
    assert Path(where).is_relative_to(venv) and Path(fixtures).is_relative_to(venv), where
    assert versions.split() == ["0.32.15", "b11312", "0.32.0", "v250"]
    for version in (["pharos", "--version"], ["twistd", "pharos", "--version"]):
        out = run(venv / "bin" / version[0], *version[1:])
        assert (out.returncode, out.stdout) == (0, f"pharos {__version__}\n"), out.stderr
    log = serve_demo(venv / "bin" / "twistd", tmp_path, env)
    assert "public listener open" in log, log


def test_setup_cfg_lists_the_pinned_captures() -> None:
    """setup.cfg's data_files are exactly the captures the doubles are cloned from."""
    sys.path.insert(0, str(ROOT / "contrib"))
    try:
        from data_files import block  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    assert block() in (ROOT / "setup.cfg").read_text(), "run: python contrib/data_files.py"


#: What ``make demo``'s chain may find on PATH: Python, make and the shell's file tools.
#: npm, node and a C compiler are left out on purpose.
DEMO_TOOLS = ("make", "sh", "touch", "rm", "mkdir", "cp", "mv", "cat", "ls", "env", "uname")
#: What the Node clients and the compiled modules need, which the demo must not.
NOT_FOR_THE_DEMO = ("npm", "node", "npx", "cc", "gcc", "clang", "c++")


def python_only_path(bin_dir: Path) -> str:
    """A directory holding only ``python3`` (the base interpreter, not this virtualenv) and
    ``DEMO_TOOLS``, as symlinks: a PATH with nothing else."""
    bin_dir.mkdir()
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    (bin_dir / "python3").symlink_to(base)
    for tool in DEMO_TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} is missing here"
        (bin_dir / tool).symlink_to(found)
    for tool in NOT_FOR_THE_DEMO:
        assert shutil.which(tool, path=str(bin_dir)) is None, tool
    return str(bin_dir)


def tracked_copy(dest: Path) -> None:
    """The tracked files of this checkout, as they are in the work tree, copied to ``dest``."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True,
                            timeout=60)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: " + listed.stderr.decode(errors="replace"))
    for name in listed.stdout.decode().split("\0"):
        src = ROOT / name
        if not name or not src.is_file():
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / name)


@pytest.mark.packaging
def test_make_demo_needs_only_python(tmp_path: Path) -> None:
    """On a PATH with Python, make and the shell's tools but no npm and no C compiler, in a
    copy of the tree: ``make -n demo`` plans a virtualenv, a pip install and twistd (no npm
    ci, no mypyc build); ``make install-runtime`` (the part of ``make demo`` before twistd)
    succeeds into a fresh virtualenv, after which ``make -n demo`` plans twistd alone; and
    that virtualenv imports pharos and serves the demo until /healthz answers."""
    tree = tmp_path / "tree"
    tracked_copy(tree)
    venv = tmp_path / "venv"
    env = fresh_env()
    env["PATH"] = python_only_path(tmp_path / "bin")
    make = [str(tmp_path / "bin" / "make"), "--no-print-directory", "-C", str(tree),
            f"VENV={venv}"]

    plan = subprocess.run([*make, "-n", "demo"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert "npm" not in plan.stdout and "build_compiled" not in plan.stdout, plan.stdout
    assert "-m venv" in plan.stdout and "pip install" in plan.stdout, plan.stdout
    twistd_line = f"{venv}/bin/twistd -n --pidfile= pharos --demo"
    assert plan.stdout.splitlines()[-1] == twistd_line, plan.stdout

    install = subprocess.run([*make, "install-runtime"], capture_output=True, text=True,
                             env=env, timeout=1200)
    assert install.returncode == 0, install.stdout + install.stderr
    again = subprocess.run([*make, "-n", "demo"], capture_output=True, text=True, env=env,
                           timeout=60)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [twistd_line], again.stdout

    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import pharos, pharos.policy; from pharos import compiled\n"
         "print(pharos.__file__); print(compiled.status['pharos.policy'])"],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    where, status = probe.stdout.splitlines()
    assert Path(where).is_relative_to(tree), where
    assert status.startswith("interpreted"), status
    log = serve_demo(venv / "bin" / "twistd", tmp_path, env)
    assert "public listener open" in log, log
