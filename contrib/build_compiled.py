"""Build ``pharos.policy`` and ``pharos.linkhash`` with mypyc (``make install`` runs this;
``pharos.compiled`` says why and how the result is used).

For each module of ``pharos.compiled.COMPILED``: the source is copied into a scratch directory
with its SHA-256 appended (``SOURCE_SHA256``), compiled there by mypyc (mypy is a dev
dependency; a C compiler and Python's headers are needed), and the extension is moved next
to the source as ``<module>.mypyc<EXT_SUFFIX>``, a name no import reaches but
``pharos.compiled``'s finder, which takes it only while the source's hash is the embedded
one. Nothing is built when the file there is already current.

    python contrib/build_compiled.py [--force]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pharos import compiled  # noqa: E402


def current(name: str, source: Path) -> bool:
    """The built file of ``source`` imports and carries its hash (in a child process: an
    extension module cannot be unloaded, and this one may be rebuilt next)."""
    code = ("import sys; from pharos import compiled; "
            "m, why = compiled.load(sys.argv[1], sys.argv[2]); sys.exit(m is None)")
    env = {k: v for k, v in os.environ.items() if k != compiled.ENV}
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", code, name, str(source)],
                       cwd=ROOT, env=env, capture_output=True)
    return r.returncode == 0


def build(name: str, source: Path) -> Path:
    """Compile ``source`` and put the extension next to it; returns its path.

    It is compiled as a top-level module of the same last name (``policy``): mypyc builds a
    module inside a package as a shim plus a shared library that must sit on ``sys.path``,
    while a top-level module is one file, whose ``PyInit_policy`` the finder's import as
    ``pharos.policy`` calls (compiled classes say ``policy`` as their ``__module__``)."""
    data = source.read_bytes()
    digest = compiled.source_digest(str(source))
    out = Path(compiled.artifact(str(source)))
    stem = name.rpartition(".")[2]
    with tempfile.TemporaryDirectory(prefix="pharos-mypyc-") as tmp:
        Path(tmp, stem + ".py").write_bytes(
            data + f'\n\nSOURCE_SHA256 = "{digest}"\n'.encode())
        # The compiled modules it imports, as sources to type-check against (not compiled
        # with it: at run time it imports them as any module does).
        for dep in compiled.IMPORTS.get(stem, ()):
            Path(tmp, "pharos").mkdir(exist_ok=True)
            Path(tmp, "pharos", "__init__.py").touch()
            shutil.copyfile(source.with_name(dep), Path(tmp, "pharos", dep))
        subprocess.run([sys.executable, "-m", "mypyc", stem + ".py"], cwd=tmp, check=True)
        (built,) = [p for p in Path(tmp).iterdir()
                    if p.name.startswith(stem + ".") and p.suffix in (".so", ".pyd")]
        partial = out.with_name(out.name + ".partial")
        shutil.copyfile(built, partial)
        os.replace(partial, out)  # a process importing it meanwhile sees the old or the new
    return out


def main() -> int:
    """Entry point: see the module docstring."""
    p = argparse.ArgumentParser(prog="build_compiled.py")
    p.add_argument("--force", action="store_true", help="build even when current")
    a = p.parse_args()
    for name in compiled.COMPILED:
        source = ROOT.joinpath(*name.split(".")).with_suffix(".py")
        if not a.force and current(name, source):
            print(f"{name}: current ({compiled.artifact(str(source))})")
            continue
        print(f"{name}: built {build(name, source)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
