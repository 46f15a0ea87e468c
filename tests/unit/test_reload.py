"""Layer 1: hot reload (spec §10): the config file is read again when it changes; keys,
tenants and backends apply live, other fields wait for a restart, a bad file changes
nothing."""

from __future__ import annotations

import os
from pathlib import Path

from twisted.internet.task import Clock

from pharos.config import Config, load_config
from pharos.proxy.auth import digest
from pharos.reload import RELOAD_EVERY, ConfigWatcher

A, B = digest("phk-a"), digest("phk-b")


def write(path: Path, text: str, stamp: float) -> None:
    path.write_text(text)
    os.utime(path, (stamp, stamp))


def watcher(tmp_path: Path) -> tuple[ConfigWatcher, Path, list[Config], Clock]:
    path = tmp_path / "pharos.yaml"
    write(path, f"keys: [{{name: a, sha256: {A}}}]\n", 1000)
    applied: list[Config] = []
    w = ConfigWatcher(str(path), load_config(path), applied.append)
    clock = Clock()
    w.clock = clock
    w.startService()
    return w, path, applied, clock


def test_a_changed_key_set_applies_at_the_next_check(tmp_path: Path) -> None:
    """A new key appears within one interval of the file changing; nothing is applied while
    the file is unchanged."""
    w, path, applied, clock = watcher(tmp_path)
    clock.advance(RELOAD_EVERY)
    assert applied == []
    write(path, f"keys: [{{name: a, sha256: {A}}}, {{name: b, sha256: {B}}}]\n", 2000)
    clock.advance(RELOAD_EVERY)
    assert [k.name for k in applied[-1].keys] == ["a", "b"]
    assert w.current is applied[-1]
    w.stopService()


def test_a_bad_file_keeps_the_running_config(tmp_path: Path) -> None:
    """A file that does not parse is not applied (the running config stays), and a later
    good version is."""
    w, path, applied, clock = watcher(tmp_path)
    before = w.current
    write(path, "keys: [{name: a}]\n", 2000)
    clock.advance(RELOAD_EVERY)
    assert applied == [] and w.current is before
    write(path, f"keys: [{{name: c, sha256: {B}}}]\n", 3000)
    clock.advance(RELOAD_EVERY)
    assert [k.name for k in applied[-1].keys] == ["c"]
    w.stopService()


def test_fields_that_need_a_restart_are_not_applied(tmp_path: Path) -> None:
    """A changed listen or policy is left as it runs; the key change beside it applies."""
    w, path, applied, clock = watcher(tmp_path)
    write(path, f"listen: 127.0.0.1:9999\npolicy: least-load\n"
                f"keys: [{{name: b, sha256: {B}}}]\n", 2000)
    clock.advance(RELOAD_EVERY)
    (new,) = applied
    assert [k.name for k in new.keys] == ["b"]
    assert new.listen == Config().listen and new.policy == Config().policy
    write(path, "listen: 127.0.0.1:9998\n" + f"keys: [{{name: b, sha256: {B}}}]\n", 3000)
    clock.advance(RELOAD_EVERY)
    assert len(applied) == 1  # only a restart field changed: nothing to apply
    w.stopService()
