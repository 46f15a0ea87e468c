"""Layer 3: the example key entries of docs/*.rst and contrib/ are placeholders that
``pharos check`` refuses, naming the field and ``pharos keys new``, and none is the SHA-256 of
a common word (copying one would give anyone the key)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pharos.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
PHAROS = str(Path(sys.executable).parent / "pharos")
#: Words whose SHA-256 no example key entry may be: copying one would give a guessable key.
WORDS = ("test", "foo", "bar", "secret", "admin", "password", "changeme", "key", "alice",
         "ops", "example", "pharos", "letmein", "123456")
#: A key digest in YAML, as docs and contrib write it (not the admin API's JSON).
SHA256_LINE = re.compile(r"^\s*(?:-\s*)?(?P<field>sha256|metrics_key):\s*"
                         r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s#]+)", re.MULTILINE)
#: A config holding a digest where each field takes it, and the field's name in errors.
HOLDERS = {"sha256": ("keys:\n  - name: example\n    sha256: {}\n", "keys[0].sha256"),
           "metrics_key": ("observability:\n  metrics_key: {}\n", "observability.metrics_key")}


def example_entries() -> list[tuple[str, str, str]]:
    """Every key digest written in YAML in docs/*.rst and contrib/ (outside the bench
    archive): key entries and ``metrics_key``, as (file, field, value)."""
    files = sorted(ROOT.glob("docs/*.rst")) + sorted(
        p for p in (ROOT / "contrib").rglob("*")
        if p.is_file() and "bench" not in p.relative_to(ROOT).parts
        and p.suffix in (".yaml", ".yml", ".rst", ".md", ".sh", ".txt", ""))
    out = []
    for path in files:
        for m in SHA256_LINE.finditer(path.read_text(errors="replace")):
            out.append((str(path.relative_to(ROOT)), m["field"], m["value"].strip("\"'")))
    return out


def test_the_examples_have_key_entries() -> None:
    """The scan finds the key entries of docs/keys.rst and contrib/k8s (so the next test is
    not vacuous)."""
    files = {(f, field) for f, field, _ in example_entries()}
    assert {("docs/keys.rst", "sha256"), ("contrib/k8s/configmap.yaml", "sha256"),
            ("docs/security.rst", "metrics_key")} <= files, files


@pytest.mark.parametrize(("where", "field", "value"), example_entries())
def test_check_refuses_each_example_key_entry(tmp_path: Path, where: str, field: str,
                                              value: str) -> None:
    """Each example digest of the docs and contrib is a placeholder ``pharos check`` refuses,
    naming the field and ``pharos keys new``, and none is the SHA-256 of a common word."""
    assert value not in {hashlib.sha256(w.encode()).hexdigest() for w in WORDS}, where
    holder, name = HOLDERS[field]
    cfg = tmp_path / "pharos.yaml"
    cfg.write_text(holder.format(json.dumps(value)))
    r = subprocess.run([PHAROS, "check", "-c", str(cfg)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1, (where, value, r.stdout)
    assert name in r.stderr and "pharos keys new" in r.stderr, r.stderr
    with pytest.raises(ConfigError):
        load_config(str(cfg))


def test_the_readme_example_keys_are_no_common_words_hash() -> None:
    """The README's config must pass ``pharos check``, so its two key entries are real
    digests: of random bytes nobody holds, never of a word anyone could guess."""
    readme = (ROOT / "README.rst").read_text()
    digests = [m["value"].strip("\"'") for m in SHA256_LINE.finditer(readme)]
    assert len(digests) == 2, digests
    words = {hashlib.sha256(w.encode()).hexdigest() for w in WORDS}
    assert not words & set(digests)
