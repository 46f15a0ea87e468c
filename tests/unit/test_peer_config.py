"""Layer 1: peers in the config (spec §12): accepted now that the mesh exists, and refused by
``pharos check`` and start-up without a readable, non-empty secret file."""

from __future__ import annotations

from pathlib import Path

import pytest

from pharos.cli import main
from pharos.config import ConfigError, load_config, read_peer_secret


def write(tmp_path: Path, secret: str | None) -> Path:
    secret_path = tmp_path / "secret"
    if secret is not None:
        secret_path.write_text(secret)
    cfg = tmp_path / "pharos.yaml"
    cfg.write_text(f"peers: {{secret_file: {secret_path}, members: ['10.0.0.2:8081']}}\n")
    return cfg


def test_peers_start_with_a_readable_secret(tmp_path: Path) -> None:
    """A peers section with a secret file loads; the secret is the file less whitespace."""
    config = load_config(write(tmp_path, "s3cret\n"))
    assert config.peers is not None
    assert read_peer_secret(config.peers.secret_file) == b"s3cret"


@pytest.mark.parametrize("secret,why", [(None, "cannot read"), ("  \n", "is empty")])
def test_peers_refused_without_a_secret(tmp_path: Path, secret: str | None, why: str) -> None:
    """A missing or empty secret file fails loading (start-up and reload) naming the field."""
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, secret))
    assert "peers.secret_file" in str(e.value) and why in str(e.value)


def test_pharos_check_fails_without_a_secret(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``pharos check`` exits 1 and names the secret file."""
    cfg = write(tmp_path, None)
    with pytest.raises(SystemExit) as e:
        main(["check", "-c", str(cfg)])
    assert e.value.code == 1
    assert "peers.secret_file" in capsys.readouterr().err
    (tmp_path / "secret").write_text("x")
    with pytest.raises(SystemExit) as e:
        main(["check", "-c", str(cfg)])
    assert e.value.code == 0
