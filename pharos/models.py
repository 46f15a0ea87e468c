"""The fleet's models: one name for a model that engines serve under different names, and
each model's routing: its policy, an A/B split between policies, shadow policies, and a
prefill cost model.

``models:`` in the config::

    models:
      - name: llama-8b                      # what clients ask for
        aliases: [llama3.1:8b, meta-llama/Llama-3.1-8B-Instruct]   # what engines serve
        policy: cost                        # default: the top-level policy
        split: {cost: 90, least-load: 10}   # default: routing.split (none: no A/B)
        shadow: [least-load, p2c]           # default: routing.shadow
        cost_model: {prefill_token_s: 1e-4, prefill_pair_s: 3.3e-9, prefill_fixed_s: 0.005}

An engine's alias is renamed to the model's name as each of its snapshots arrives (the
backend's own ``aliases:`` first, then the fleet's), so routing, allow-lists, usage and the
prefix index see one name. Only the body sent to an engine names the engine's own model:
``rewrite_model`` splices the top-level ``model`` value and leaves every other byte as sent.

Split arms are chosen from the conversation key (``x-session-id`` or ``user``), else the
request id: a conversation always lands on the same arm, and a retry keeps its policy. Pure
values and functions; no I/O, nothing imported from the proxy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Protocol, TypeVar

from pharos.config.model import SPLIT_TOTAL, ModelSpec
from pharos.policy import PolicyConfig

# --- the running fleet ----------------------------------------------------------------------

class HasAliases(Protocol):
    """A backend spec: the engine's model names to the names clients use."""

    @property
    def aliases(self) -> Mapping[str, str]: ...


_B = TypeVar("_B", bound=HasAliases)


def arm(split: Sequence[tuple[str, int]], key: bytes) -> str:
    """The split's arm for ``key``: its hash mod 100 into the cumulative weights, so a key
    always gets the same arm."""
    point = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % SPLIT_TOTAL
    for name, weight in split:
        if point < weight:
            return name
        point -= weight
    return split[-1][0]  # unreachable: the weights add up to SPLIT_TOTAL


@dataclass(frozen=True, slots=True)
class ModelRouting:
    """How one model is routed: each arm's policy config, its split and its shadows."""

    arms: Mapping[str, PolicyConfig]
    split: tuple[tuple[str, int], ...] | None
    shadow: tuple[str, ...]
    default: str  # the arm without a split
    #: Nothing set for it (no model policy, no split): the scheduler's own policy routes it.
    plain: bool = False


class Fleet:
    """The models in force (one config generation): names, aliases and each model's routing.
    Swapped whole on a reload; a request reads one."""

    def __init__(self, models: Sequence[ModelSpec] = (), base: PolicyConfig | None = None,
                 split: Sequence[tuple[str, int]] | None = None,
                 shadow: Sequence[str] = (), generation: int = 0) -> None:
        self.models = tuple(models)
        self.base = base or PolicyConfig()
        self.split = tuple(split) if split else None
        self.shadow = tuple(shadow)
        self.generation = generation
        #: Every alias and name to the model's name.
        self.names: Mapping[str, str] = MappingProxyType(
            {n: m.name for m in self.models for n in (m.name, *m.aliases)})
        self._aliases = {a: m.name for m in self.models for a in m.aliases}
        self._configs: dict[tuple[str, tuple[float, float, float] | None], PolicyConfig] = {}
        self._default = self._routing(None)
        self._by_model = {m.name: self._routing(m) for m in self.models}

    def _config(self, name: str) -> PolicyConfig:
        key = (name, None)
        cfg = self._configs.get(key)
        if cfg is None:
            cfg = self._configs[key] = (self.base if name == self.base.name
                                        else dataclasses.replace(self.base, name=name))  # type: ignore[arg-type]
        return cfg

    def _routing(self, m: ModelSpec | None) -> ModelRouting:
        policy = m.policy if m is not None and m.policy is not None else None
        split = m.split if m is not None and m.split is not None else (
            None if policy is not None else self.split)
        shadow = m.shadow if m is not None and m.shadow is not None else self.shadow
        default = policy or self.base.name
        names = {default, *(n for n, _ in split or ())}
        return ModelRouting({n: self._config(n) for n in names}, split, shadow, default,
                       plain=policy is None and split is None)

    def routing(self, model: str) -> ModelRouting:
        """The model's routing (the global one for a model not in ``models:``)."""
        return self._by_model.get(model, self._default)

    def policy_for(self, model: str, key: bytes) -> PolicyConfig | None:
        """The policy config for ``model`` and request ``key``: the split's arm, else the
        model's policy; None: the scheduler's."""
        r = self._by_model.get(model, self._default)
        if r.plain:
            return None
        if r.split is None:
            return r.arms[r.default]
        return r.arms[arm(r.split, key)]

    def cost_models(self) -> dict[str, tuple[float, float, float]]:
        """Each model's prefill cost model, by name."""
        return {m.name: m.cost_model for m in self.models if m.cost_model is not None}

    # --- names ---------------------------------------------------------------------------

    def resolve(self, model: str | None, served: Callable[[], Collection[str]]) -> str | None:
        """The name a request's model stands for; with none, the one model served, else None."""
        if model is None:
            names = served()
            if len(names) != 1:
                return None
            return next(iter(names))
        return self.names.get(model, model)

    def with_aliases(self, specs: Iterable[_B]) -> list[_B]:
        """Backend specs with the fleet's aliases composed after their own."""
        if not self._aliases:
            return list(specs)
        out: list[_B] = []
        for spec in specs:
            merged = {e: self.names.get(c, c) for e, c in spec.aliases.items()}
            for engine_name, name in self._aliases.items():
                merged.setdefault(engine_name, name)
            out.append(dataclasses.replace(spec, aliases=MappingProxyType(merged)))  # type: ignore[type-var]
        return out

    def listing(self, served: Collection[str]) -> list[tuple[str, str | None]]:
        """``/v1/models``' names: each served model (None), then its aliases (its name)."""
        out: list[tuple[str, str | None]] = []
        for name in sorted(served):
            out.append((name, None))
            spec = next((m for m in self.models if m.name == name), None)
            if spec is not None:
                out.extend((a, name) for a in spec.aliases if a not in served)
        return out


# --- the body's model, rewritten in place ---------------------------------------------------

_KEY: Final = b'"model"'
#: After the key: the colon and a JSON string value (group 1: its contents as sent).
_VALUE: Final = re.compile(rb'[ \t\r\n]*:[ \t\r\n]*"((?:[^"\\]|\\.)*)"', re.DOTALL)
#: ``model`` spelled with escapes needs one of its letters as ``\\u0064``-``\\u006f``: no
#: encoder escapes ASCII letters, so a body holding ``\\u006`` is simply re-encoded.
_ESCAPED_LETTER: Final = b"\\u006"


def rewrite_model(raw: bytes, served: str, present: bool) -> bytes | None:
    """``raw`` with its top-level ``model`` value replaced by ``served`` (``present``), or
    ``"model":served`` inserted after the opening brace; every other byte as sent. None
    where the spot is not certain (key escaped, written twice, not a string): re-encode. The
    one plain occurrence is the top-level key: the decode found a top-level ``model``,
    spelled plainly (an occurrence of ``"model"``, and there is one) or with escapes (a
    ``\\u006`` in the body, declined)."""
    value = json.dumps(served, ensure_ascii=False).encode()
    if not present:
        start = raw.find(b"{")
        if start < 0 or raw[:start].strip() or _KEY in raw or _ESCAPED_LETTER in raw:
            return None
        rest = raw[start + 1:]
        sep = b"" if rest.lstrip().startswith(b"}") else b","
        return raw[:start + 1] + _KEY + b":" + value + sep + rest
    at = raw.find(_KEY)
    if at < 0 or raw.find(_KEY, at + len(_KEY)) >= 0 or _ESCAPED_LETTER in raw:
        return None
    m = _VALUE.match(raw, at + len(_KEY))
    if m is None:
        return None
    return raw[:m.start(1) - 1] + value + raw[m.end():]


def request_key(session: int | None, request_id: str) -> bytes:
    """What picks a request's split arm: its conversation's hash, else its request id."""
    if session is not None:
        return session.to_bytes(8, "big")
    return request_id.encode("utf-8", "surrogatepass")


def describe(fleet: Fleet) -> dict[str, Any]:
    """The fleet's routing for people and the shadow log, per model and global."""
    def one(r: ModelRouting) -> dict[str, Any]:
        return {"policy": r.default, "split": dict(r.split) if r.split else None,
                "shadow": list(r.shadow)}
    return {"generation": fleet.generation, "global": one(fleet._default),
            "models": {m.name: {"aliases": list(m.aliases), **one(fleet.routing(m.name))}
                       for m in fleet.models}}
