"""Every YAML config example in README.rst passes ``pharos check``: the README cannot drift
from the parser, and a refused section cannot hide in an example."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pharos.config import load_config, parse_config
from tests.support.readme import config_examples


def test_the_readme_has_config_examples() -> None:
    """The extraction finds the README's config example (so the check below checks one)."""
    assert config_examples()


@pytest.mark.parametrize("n", range(len(config_examples())))
def test_readme_config_example_passes_pharos_check(n: int, tmp_path: Path) -> None:
    """``pharos check`` accepts README example ``n`` (exit 0)."""
    path = tmp_path / "pharos.yaml"
    path.write_text(config_examples()[n])
    exe = Path(sys.executable).parent / "pharos"
    r = subprocess.run([str(exe), "check", "-c", str(path)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_state_file_and_drain_sections_load(tmp_path: Path) -> None:
    """``state_file:`` and ``drain:`` are built: load_config (pharos check, start-up)
    takes them, durations in the documentation's spelling."""
    path = tmp_path / "pharos.yaml"
    path.write_text("state_file: /var/lib/pharos/state.json\ndrain: {grace: 5s, timeout: 10m}\n")
    config = load_config(path)
    assert config.state_file == "/var/lib/pharos/state.json"
    assert (config.drain.grace, config.drain.timeout) == (5.0, 600.0)


def test_null_turns_every_guard_off() -> None:
    """In routing:, null turns each guard off, as docs/routing.rst says; prefix_entries: null is
    the default size."""
    r = parse_config("routing:\n  bounded_load_epsilon: null\n  kv_pressure_threshold: null\n"
                     "  hot_prefix_utilization: null\n  session_affinity: null\n"
                     "  prefix_entries: null\n").routing
    assert r.bounded_load_epsilon is None and r.hot_prefix_utilization is None
    assert r.kv_pressure_threshold == 1.0 and r.session_affinity is False
    assert r.prefix_entries == parse_config("").routing.prefix_entries
