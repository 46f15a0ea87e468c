"""Reading a config file, and what a reload changes. Parsing is strict: an unknown field is an
error naming its full path (a typo must fail instead of silently dropping a setting), and
every error in a file is reported together, so an operator fixes a file in one pass."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from pharos.config.kinds import ConfigError, Parser, settings
from pharos.config.model import CONFIG, Config

#: Fields a reload applies without a restart: a top-level section, or ``section.field`` for a
#: partly live section (``setting(live=True)``). Every other field, including any added
#: later, is reported as needing a restart: the safe side.
LIVE_FIELDS: Final = frozenset(
    [name for name, s in settings(Config) if s.live]
    + [f"{name}.{sub}" for name, s in settings(Config) if not s.live
       and dataclasses.is_dataclass(s.default)
       for sub, inner in settings(type(s.default)) if inner.live])


def load_config(path: str | Path) -> Config:
    """Read and parse a config file; an unreadable file is a ``ConfigError`` too, so callers
    (startup, hot reload) handle one exception."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"{path}: cannot read: {e}"]) from e
    config = parse_config(text)
    if config.responses.store and config.responses.key_file is not None:
        from pharos.responses import read_key

        try:
            read_key(config.responses.key_file)
        except ValueError as e:
            raise ConfigError([f"responses.key_file: {e}"]) from None
    if config.peers is not None:
        try:
            read_peer_secret(config.peers.secret_file)
        except ValueError as e:
            raise ConfigError([f"peers.secret_file: {e}"]) from None
    return config


def read_peer_secret(path: str) -> bytes:
    """The peers' shared secret: the file's bytes less surrounding whitespace. ``ValueError``
    when it cannot be read or is empty: peers never run unauthenticated."""
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    if not secret:
        raise ValueError(f"{path} is empty; peers need a shared secret")
    return secret


def parse_config(text: str, *, library_names: frozenset[str] | None = None) -> Config:
    """Parse config YAML. ``library_names`` are the probe names own probes may not reuse; ``None``
    takes the probe library's (imported only when a backend has own probes)."""
    loader = _Loader(text)
    try:
        raw = loader.get_single_data()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError([f"{where}{e.problem or e.context or e}"]) from e
    except yaml.YAMLError as e:
        raise ConfigError([str(e)]) from e
    finally:
        loader.dispose()
    parser = Parser(library_names)
    parser.errors.extend(loader.duplicates)
    config = Config() if raw is None else CONFIG.parse(parser, raw, "")
    if parser.errors:
        raise ConfigError(parser.errors)
    assert isinstance(config, Config)
    return config


def reload_diff(old: Config, new: Config) -> tuple[list[str], list[str]]:
    """The changed fields as (applied live, needing a restart), in file order: a top-level
    name, or ``section.field`` inside a section that is only partly live."""
    live: list[str] = []
    restart: list[str] = []
    for f in dataclasses.fields(Config):
        a, b = getattr(old, f.name), getattr(new, f.name)
        if a == b:
            continue
        if f.name in LIVE_FIELDS:
            live.append(f.name)
        elif _partly_live(f.name) and dataclasses.is_dataclass(a) and type(a) is type(b):
            for sub in dataclasses.fields(a):
                if getattr(a, sub.name) != getattr(b, sub.name):
                    name = f"{f.name}.{sub.name}"
                    (live if name in LIVE_FIELDS else restart).append(name)
        else:
            restart.append(f.name)
    return live, restart


def file_name(name: str) -> str:
    """A ``reload_diff`` name as the operator writes it in the file."""
    section, _, sub = name.partition(".")
    top = dict(settings(Config))[section]
    if not sub:
        return top.file
    return f"{top.file}.{dict(settings(type(top.default)))[sub].file}"


def _partly_live(section: str) -> bool:
    return any(name.startswith(section + ".") for name in LIVE_FIELDS)


def with_live(running: Config, new: Config, live: Collection[str]) -> Config:
    """``running`` with the ``live`` fields of ``reload_diff`` taken from ``new``: what a
    reload puts in force (everything else stays as it runs until a restart)."""
    top: dict[str, Any] = {}
    for name in live:
        section, _, sub = name.partition(".")
        if not sub:
            top[section] = getattr(new, section)
            continue
        base = top.get(section, getattr(running, section))
        top[section] = dataclasses.replace(base,
                                           **{sub: getattr(getattr(new, section), sub)})
    return dataclasses.replace(running, **top)


@dataclass(frozen=True, slots=True)
class Reloaded:
    """What one reload did: the fields applied live and those needing a restart (names as
    ``reload_diff`` gives them), or the file's errors (then nothing was applied)."""

    applied: tuple[str, ...] = ()
    restart: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        """Whether the file differs from the running config at all."""
        return bool(self.applied or self.restart)


class _Loader(yaml.SafeLoader):
    """A SafeLoader that records duplicate mapping keys (plain PyYAML keeps the last one
    silently, which would hide a typo as surely as an unknown field)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[str] = []
        self._checked: set[int] = set()

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """Check the node's own keys once, before merge keys (``<<``) add theirs: a key that
        overrides a merged one is intended, a key written twice is not."""
        if id(node) not in self._checked:
            self._checked.add(id(node))
            seen: set[tuple[str, str]] = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                    continue
                if (key_node.tag, key_node.value) in seen:
                    mark = key_node.start_mark
                    self.duplicates.append(
                        f"line {mark.line + 1}, column {mark.column + 1}: "
                        f"duplicate mapping key {key_node.value!r}"
                    )
                seen.add((key_node.tag, key_node.value))
        super().flatten_mapping(node)
