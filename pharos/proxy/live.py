"""The live-reloadable part of the config as one immutable value: a reload builds the next
one and swaps it whole, and a request reads one, so it never sees half of a reload."""

from __future__ import annotations

from dataclasses import dataclass, field

from pharos.config import Config
from pharos.models import Fleet
from pharos.proxy.auth import Keyring


@dataclass(frozen=True, slots=True)
class Live:
    """One generation of the config: the file as parsed, its key ring (keys, quotas, tenants)
    and its fleet of models (aliases, per-model policy, split, shadows)."""

    config: Config = field(default_factory=Config)
    keyring: Keyring = field(default_factory=Keyring)
    fleet: Fleet = field(default_factory=Fleet)

    @classmethod
    def of(cls, config: Config, fleet: Fleet) -> Live:
        return cls(config, Keyring(config.keys, config.tenants), fleet)


class LiveConfig:
    """Where the current ``Live`` is kept: swapped by a reload, read by every request."""

    __slots__ = ("now",)

    def __init__(self, now: Live | None = None) -> None:
        self.now = now or Live()
