"""The config file (spec §10): YAML in, frozen dataclasses out.

Every default lives here, once. Parsing is strict: an unknown field is an error naming its full
path (a typo such as ``per-model`` for ``per_model`` must fail at startup or reload instead of
silently dropping a setting), and every error in a file is collected and reported together, so an
operator fixes a file in one pass. ``null`` in the file means the same as leaving a field out.

Why hand-written and not a schema library (weighed for issue 10, 2026-12-02, CPython 3.11):
msgspec 0.23 stops at the first error (``Expected `str`, got `int` - at `$.backends[0].url```),
so a file with four mistakes takes four runs. pydantic 2.14 reports them all with their paths,
but importing it and defining one model adds 19 MB of RSS (11.4 -> 30.7 MB in a bare
interpreter), a fifth of the 100 MB budget Pharos's whole process has with every default cap
full (91.8 MB, ``pharos bench memory``), and the rules that take most of this file (durations,
``null`` turning a guard off, sections refused until built, the listen strports, per-kind
backend checks) would be validators either way. The JSON Schema (``pharos config-schema``)
gives editors what a library would, and a test keeps it equal to these dataclasses.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
import urllib.parse
import zoneinfo
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal, TypeAlias, TypeGuard, TypeVar, get_args

import yaml

from pharos.engine.signals import COUNT_SIGNALS, LOAD_SIGNALS, LOG_SIGNALS, Residency, Signal
from pharos.hot import UTILIZATION
from pharos.models import ModelSpec, parse_models, parse_shadow, parse_split
from pharos.placement import LOAD_WAIT_BOUND_SEC, REPLICA_UTILIZATION
from pharos.policy import BOUNDED_LOAD_EPSILON, KV_PRESSURE_THRESHOLD
from pharos.prefix import DEFAULT_CAPACITY

Policy: TypeAlias = Literal["cost", "least-load", "round-robin", "random", "p2c", "prefix-hash"]
BackendKind: TypeAlias = Literal[
    "auto", "ollama", "llamacpp", "llama-swap", "vllm", "sglang", "openai"
]
Scale: TypeAlias = Literal["ratio", "percent"]
LogScheme: TypeAlias = Literal["docker", "file"]
#: A log probe's fixed value, typed for its signal: ``Residency`` for residency, ``int`` for the
#: counts, ``float`` for kv_usage, ``str`` for version.
FixedValue: TypeAlias = Residency | int | float | str
_Choice = TypeVar("_Choice", bound=str)

POLICIES: Final[tuple[Policy, ...]] = get_args(Policy)
BACKEND_KINDS: Final[tuple[BackendKind, ...]] = get_args(BackendKind)
SCALES: Final[tuple[Scale, ...]] = get_args(Scale)

DEFAULT_LISTEN: Final = ":8090"
DEFAULT_PEER_LISTEN: Final = ":8081"
DEFAULT_POLICY: Final[Policy] = "cost"
DEFAULT_KIND: Final[BackendKind] = "auto"
DEFAULT_SCALE: Final[Scale] = "ratio"
DEFAULT_WEIGHT: Final = 1
#: The tenant of a key that names none: with no ``tenants:`` every key shares it, and the fair
#: queue is the one-tenant case (spec §8's weighted round-robin over keys).
DEFAULT_TENANT: Final = "default"
DEFAULT_RETENTION_DAYS: Final = 400
DEFAULT_DRAIN_GRACE: Final = 5.0
DEFAULT_DRAIN_TIMEOUT: Final = 600.0
#: Time to the first byte of an engine's reply, by route family. Generation covers a cold load
#: and a long prefill behind a busy engine's queue, and a non-streamed reply whose first byte
#: is its last (Ollama, vLLM: a 4,000-token reply at 10 tokens/s is 400 s). A backend that
#: stops answering its scrapes abandons its requests within seconds; this is the backstop.
DEFAULT_FIRST_BYTE_GENERATE: Final = 600.0
DEFAULT_FIRST_BYTE_EMBEDDINGS: Final = 120.0
#: A reply that sends nothing for this long is cut, as an engine death is.
DEFAULT_STREAM_IDLE: Final = 120.0
#: A client's request line and headers must arrive within this (slowloris).
DEFAULT_REQUEST_HEADERS: Final = 10.0
#: A request's body must arrive whole within this of its head (a body trickled a byte at a
#: time); 32 MiB at 1 Mbit/s takes 270 s.
DEFAULT_REQUEST_BODY: Final = 300.0
#: A client connection with no request in progress and no byte from the client for this long
#: is closed (keep-alive idle; Twisted's own default).
DEFAULT_IDLE: Final = 60.0
#: Requests waiting this long with none starting and no lease given back: /healthz is 503.
DEFAULT_QUEUE_STUCK: Final = 300.0
#: Responses conversation state (``responses:``, ``pharos.responses``): records kept at most,
#: their longest life, and the plaintext bytes of one (a whole conversation up to a response,
#: 256 KiB about 64k tokens): at most 256 MiB of ciphertext with the defaults.
DEFAULT_RESPONSES_MAX: Final = 1_000
DEFAULT_RESPONSES_MAX_AGE: Final = 24 * 3600.0
DEFAULT_RESPONSES_MAX_BYTES: Final = 256 * 1024
#: A ``dns:`` backend entry's name is resolved again this often (peers' re-resolve, §12).
DEFAULT_DNS_REFRESH: Final = 10.0
#: Processes serving the public port (``workers:``; ``auto`` is the cores this process may
#: run on). More than ``MAX_WORKERS`` is refused: each is a whole Pharos with its own memory.
DEFAULT_WORKERS: Final = 1
MAX_WORKERS: Final = 64

#: Fields a reload applies without a restart (§10 hot reload): a whole top-level section, or
#: ``section.field`` for a section only part of which can change under a running service (the
#: routing guards are read afresh by every pick; the prefix index's size is fixed when it is
#: built; the data-plane timeouts are read by every new request, the header deadline is held by
#: the listening site). Every other field, including any added later, is reported as needing a
#: restart, which is the safe side. Quotas and fair-queue weights ride on keys and tenants.
LIVE_FIELDS: Final = frozenset({
    "backends", "dns_backends", "keys", "tenants",
    "routing.bounded_load_epsilon", "routing.kv_pressure_threshold",
    "routing.hot_prefix_utilization", "routing.session_affinity", "routing.eviction_pricing",
    "routing.replica_utilization", "routing.load_wait_bound", "routing.swap_grouping",
    "timeouts.first_byte_generate", "timeouts.first_byte_embeddings", "timeouts.stream_idle",
    "timeouts.queue_stuck",
    "policy", "models", "routing.split", "routing.shadow",
})

#: Sections parsed (so their errors are reported) but refused until their feature exists.
NOT_YET: Final[dict[str, str]] = {}
#: A backend's fields refused likewise (none left: ``logs:`` feeds its log probes).
BACKEND_NOT_YET: Final[dict[str, str]] = {}

#: Connections the kernel holds for Pharos to accept: Twisted's default of 50 dropped most of a
#: burst of 1,000 clients (their connections reset or retried after seconds; the kernel caps it
#: at net.core.somaxconn, 4096 here).
LISTEN_BACKLOG: Final = 1024
#: Residency values a log line can report; ``unknown`` is what no line says.
_FIXED_RESIDENCIES: Final = (Residency.LOADED, Residency.LOADING, Residency.COLD)
#: Twisted's own server endpoint types, so ``tcp:8090`` is not read as host ``tcp``, port 8090.
_ENDPOINT_TYPES: Final = frozenset({"tcp", "tcp6", "ssl", "unix", "systemd"})
_LISTEN_FORMS: Final = (
    ":port, host:port, [ipv6]:port or a Twisted endpoint such as tcp:8090:interface=127.0.0.1"
)
_HOST_PORT = re.compile(r"(?P<host>[A-Za-z0-9._-]*):(?P<port>[0-9]+)")
_IPV6_PORT = re.compile(r"\[(?P<host>[^\]]+)\]:(?P<port>[0-9]+)")
_ENDPOINT = re.compile(r"(?P<type>[A-Za-z][A-Za-z0-9_+-]*):(?P<rest>.*)", re.DOTALL)
_HOSTNAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CONTAINER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_METRIC = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_UNITS: Final = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0,
}


class ConfigError(Exception):
    """A config file that can't be used; ``errors`` holds every problem found, not just one."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration (``5s``, ``10m``, ``1h30m``, ``250ms``), as the spec writes
    them; raises ``ValueError`` for anything else, including a negative duration."""
    if text == "0":
        return 0.0
    total, pos = 0.0, 0
    while pos < len(text):
        part = _DURATION_PART.match(text, pos)
        if part is None:
            break
        total += float(part.group(1)) * _DURATION_UNITS[part.group(2)]
        pos = part.end()
    if pos == 0 or pos != len(text):
        raise ValueError(f"not a duration: {text!r}")
    return total


def _port(digits: str) -> int:
    port = int(digits)
    if port > 65535:
        raise ValueError("port out of range")
    return port


def _quote(value: str) -> str:
    """Escape a strports argument as Twisted's ``quoteStringArgument`` does; written out so that
    parsing a config doesn't import Twisted's endpoint machinery."""
    return value.replace("\\", "\\\\").replace(":", "\\:")


def _parse_listen(address: str) -> tuple[str, int | None]:
    """The strports description and, where the address names one, the port."""
    if match := _IPV6_PORT.fullmatch(address):
        host = str(ipaddress.IPv6Address(match["host"]))  # ValueError if it isn't one
        port = _port(match["port"])
        return f"tcp6:{port}:interface={_quote(host)}", port
    match = _HOST_PORT.fullmatch(address)
    if match and match["host"].lower() not in _ENDPOINT_TYPES:
        port = _port(match["port"])
        if not match["host"]:
            return f"tcp:{port}", port
        return f"tcp:{port}:interface={match['host']}", port
    if (match := _ENDPOINT.fullmatch(address)) and match["rest"]:
        first = match["rest"].split(":", 1)[0]
        if match["type"].lower() in ("tcp", "tcp6") and first.isdigit():
            return address, _port(first)
        return address, None
    raise ValueError(f"not a listen address: {address!r}")


@dataclass(frozen=True, slots=True)
class Listen:
    """A listening address as the operator wrote it; ``strports()`` is what Twisted takes."""

    address: str

    def strports(self) -> str:
        """The Twisted strports description: ``:8090`` → ``tcp:8090:backlog=1024``,
        ``127.0.0.1:8090`` → ``tcp:8090:interface=127.0.0.1:backlog=1024``; an endpoint
        string passes through unchanged (its backlog is the operator's)."""
        desc = _parse_listen(self.address)[0]
        return desc if desc == self.address else f"{desc}:backlog={LISTEN_BACKLOG}"

    def port(self) -> int | None:
        """The TCP port, when the address names one (peers.dns without a port takes it)."""
        return _parse_listen(self.address)[1]


@dataclass(frozen=True, slots=True)
class PromSpec:
    """One metric from a Prometheus text endpoint, as the library's ``Prom`` constructor takes."""

    path: str
    metric: str
    per_model: str | None = None
    scale: Scale = DEFAULT_SCALE


@dataclass(frozen=True, slots=True)
class LogSpec:
    """A log-line pattern, compiled once here; ``value`` is the fixed value a matching line
    reports, or ``None`` when the named group ``value`` in ``match`` holds it."""

    match: re.Pattern[str]
    value: FixedValue | None = None


@dataclass(frozen=True, slots=True)
class OwnProbe:
    """A probe the operator adds to one backend (§4); it goes ahead of the recipe for its
    signal."""

    name: str
    signal: Signal
    spec: PromSpec | LogSpec


@dataclass(frozen=True, slots=True)
class LogFeed:
    """Where a static backend's engine log comes from: a Docker container or a local file."""

    scheme: LogScheme
    target: str  # the container name for docker, the absolute path for file


def _no_aliases() -> Mapping[str, str]:
    return MappingProxyType({})


#: ``backends[].cost_model``'s fields, in the order of ``CostModel`` (a, b, d).
COST_MODEL_FIELDS = ("prefill_token_s", "prefill_pair_s", "prefill_fixed_s")


@dataclass(frozen=True, slots=True)
class CostModel:
    """A backend's measured prefill cost, ``P(u, c) = a·u + b·u·(c + u/2) + d`` seconds for
    ``u`` uncached tokens after ``c`` cached ones (``pharos calibrate`` prints it). Routing
    prices the backend's prefills with it instead of the learned per-token speed."""

    prefill_token_s: float  # a
    prefill_pair_s: float  # b
    prefill_fixed_s: float  # d

    def terms(self) -> tuple[float, float, float]:
        """(a, b, d), as the policy's candidates carry them."""
        return (self.prefill_token_s, self.prefill_pair_s, self.prefill_fixed_s)


@dataclass(frozen=True, slots=True)
class Backend:
    """One statically listed engine. ``url`` has no trailing slash, so paths join onto it."""

    url: str
    kind: BackendKind = DEFAULT_KIND
    memory_gb: float | None = None
    capacity: int | None = None
    #: Models the host keeps loaded at once (``OLLAMA_MAX_LOADED_MODELS``, llama.cpp router
    #: mode's ``--models-max``); None: unlimited but for ``memory_gb`` (llama-swap: 1).
    max_loaded_models: int | None = None
    #: The engine's model name → the name clients use (and targets have).
    aliases: Mapping[str, str] = field(default_factory=_no_aliases, hash=False)
    logs: LogFeed | None = None
    probes: tuple[OwnProbe, ...] = ()
    cost_model: CostModel | None = None

    @property
    def cost_model_terms(self) -> tuple[float, float, float] | None:
        """``cost_model``'s (a, b, d) for the policy's candidates; None: learned speed."""
        return None if self.cost_model is None else self.cost_model.terms()


@dataclass(frozen=True, slots=True)
class DnsBackends:
    """A ``backends:`` entry with ``dns: NAME`` (a Kubernetes headless Service): every address
    NAME resolves to is a backend, resolved again every ``refresh`` seconds. ``template`` holds
    the members' settings; its ``url`` is empty."""

    name: str
    port: int
    refresh: float = DEFAULT_DNS_REFRESH
    template: Backend = Backend(url="")

    def member(self, address: str) -> Backend:
        """The backend at one resolved address (IPv6 in brackets)."""
        host = f"[{address}]" if ":" in address else address
        return dataclasses.replace(self.template, url=f"http://{host}:{self.port}")


@dataclass(frozen=True, slots=True)
class Key:
    """One API key, stored only as the SHA-256 of the secret; limits of ``None`` are unlimited
    and an empty ``models`` allows every model."""

    name: str
    sha256: str
    rpm: int | None = None
    tokens_per_day: int | None = None
    weight: int = DEFAULT_WEIGHT
    models: tuple[str, ...] = ()
    admin: bool = False
    tenant: str = DEFAULT_TENANT


@dataclass(frozen=True, slots=True)
class Tenant:
    """A group of keys sharing a fair-queue share and, optionally, a daily token budget and a
    requests-per-minute limit across its keys (``None``: unlimited)."""

    name: str
    weight: int = DEFAULT_WEIGHT
    rpm: int | None = None
    tokens_per_day: int | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """Usage accounting; ``timezone`` ``None`` means the host's zone."""

    timezone: str | None = None
    retention_days: int = DEFAULT_RETENTION_DAYS
    journal: str | None = None  # a file: one JSON line per finished request


@dataclass(frozen=True, slots=True)
class Drain:
    """Shutdown timing in seconds (§9 readiness and drain)."""

    grace: float = DEFAULT_DRAIN_GRACE
    timeout: float = DEFAULT_DRAIN_TIMEOUT


@dataclass(frozen=True, slots=True)
class Timeouts:
    """The data plane's time limits in seconds (config ``timeouts:``)."""

    first_byte_generate: float = DEFAULT_FIRST_BYTE_GENERATE
    first_byte_embeddings: float = DEFAULT_FIRST_BYTE_EMBEDDINGS
    stream_idle: float = DEFAULT_STREAM_IDLE
    request_headers: float = DEFAULT_REQUEST_HEADERS
    queue_stuck: float = DEFAULT_QUEUE_STUCK
    request_body: float = DEFAULT_REQUEST_BODY
    idle: float = DEFAULT_IDLE


@dataclass(frozen=True, slots=True)
class DecisionLogConfig:
    """``observability.decision_log``: a JSON line per routing decision of the sampled share
    of requests (by request id), and one when each ends."""

    path: str
    sample_rate: float = 1.0


@dataclass(frozen=True, slots=True)
class Observability:
    """``observability:``; ``decision_log`` None: off."""

    decision_log: DecisionLogConfig | None = None
    #: JSON lines of every config generation and shadow decision (``pharos.shadow``); None:
    #: off.
    shadow_log: str | None = None


@dataclass(frozen=True, slots=True)
class Routing:
    """The cost policy's guards and the prefix index's size (spec §6, §7). ``None`` turns a
    guard off; the defaults are documented where they are defined (``pharos.policy``,
    ``pharos.hot``, ``pharos.prefix``)."""

    bounded_load_epsilon: float | None = BOUNDED_LOAD_EPSILON
    kv_pressure_threshold: float = KV_PRESSURE_THRESHOLD
    hot_prefix_utilization: float | None = UTILIZATION
    session_affinity: bool = True
    #: Price the live prefixes a prompt would push out of a small cache (``pharos.retention``).
    eviction_pricing: bool = True
    prefix_entries: int = DEFAULT_CAPACITY
    #: An A/B split of every model without its own: (policy, percent) in file order, adding
    #: up to 100 (``pharos.models``); None: no split.
    split: tuple[tuple[str, int], ...] | None = None
    #: Policies run beside the routing one, off the request path (``pharos.shadow``).
    shadow: tuple[str, ...] = ()
    #: Model placement (``pharos.placement``, issue 15): a model warm somewhere gets another
    #: host once its slot demand exceeds this share of its warm slots (or waiting costs more
    #: than the load and its eviction); None: no demand rule.
    replica_utilization: float | None = REPLICA_UTILIZATION
    #: Seconds a request waits (for a warm slot, or behind another model on a single-model
    #: host) before a load is allowed for it.
    load_wait_bound: float = LOAD_WAIT_BOUND_SEC
    #: Serve the loaded model's queued requests before a swap (within the bound).
    swap_grouping: bool = True


@dataclass(frozen=True, slots=True)
class Responses:
    """``responses:``: Pharos keeps ``/v1/responses`` conversations for ``store: true``
    requests and expands ``previous_response_id`` (``pharos.responses``); off unless
    ``store``. ``key_file`` (required with ``store``) holds the AES-256 key."""

    store: bool = False
    key_file: str | None = None
    max_responses: int = DEFAULT_RESPONSES_MAX
    max_age: float = DEFAULT_RESPONSES_MAX_AGE
    max_bytes_per_conversation: int = DEFAULT_RESPONSES_MAX_BYTES


@dataclass(frozen=True, slots=True)
class Peers:
    """The peer mesh (§12); exactly one of ``members`` and ``dns`` is set, and the secret is
    required because peers never run unauthenticated."""

    secret_file: str
    listen: Listen = Listen(DEFAULT_PEER_LISTEN)
    members: tuple[str, ...] = ()
    dns: str | None = None


@dataclass(frozen=True, slots=True)
class Config:
    """The whole config file; ``Config()`` is what an empty file means."""

    listen: Listen = Listen(DEFAULT_LISTEN)
    policy: Policy = DEFAULT_POLICY
    backends: tuple[Backend, ...] = ()
    #: ``backends:`` entries with ``dns:`` instead of ``url:``, kept apart: their members are
    #: known only once resolved (pharos.discovery.dns).
    dns_backends: tuple[DnsBackends, ...] = ()
    keys: tuple[Key, ...] = ()
    tenants: tuple[Tenant, ...] = ()
    state_file: str | None = None
    usage: Usage = Usage()
    drain: Drain = Drain()
    peers: Peers | None = None
    routing: Routing = Routing()
    observability: Observability = Observability()
    timeouts: Timeouts = Timeouts()
    #: Worker processes sharing the public port and their state (pharos.workers); ``auto``
    #: is resolved when the file is read.
    workers: int = DEFAULT_WORKERS
    #: The fleet's models: one name for engines' names, each model's routing
    #: (``pharos.models``).
    models: tuple[ModelSpec, ...] = ()
    #: Responses conversation state (``pharos.responses``); off by default.
    responses: Responses = Responses()


def available_cores() -> int:
    """The cores this process may run on (``taskset`` narrows them): what ``workers: auto``
    means."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def load_config(path: str | Path, *, refuse_unbuilt: bool = True) -> Config:
    """Read and parse a config file; an unreadable file is a ``ConfigError`` too, so callers
    (startup, hot reload) handle one exception."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"{path}: cannot read: {e}"]) from e
    config = parse_config(text, refuse_unbuilt=refuse_unbuilt)
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
    when it cannot be read or is empty: peers never run unauthenticated (spec §12)."""
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    if not secret:
        raise ValueError(f"{path} is empty; peers need a shared secret")
    return secret


def parse_config(text: str, *, library_names: frozenset[str] | None = None,
                 refuse_unbuilt: bool = False) -> Config:
    """Parse config YAML. ``library_names`` are the probe names own probes may not reuse; ``None``
    takes the probe library's (imported only when a backend has own probes).
    ``refuse_unbuilt``: also refuse the sections whose feature is not built yet (``NOT_YET``):
    what ``load_config`` does for ``pharos check`` and start-up; without it they are parsed
    and checked only."""
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
    parser = _Parser(library_names)
    parser.refuse_unbuilt = refuse_unbuilt
    parser.errors.extend(loader.duplicates)
    config = parser.config(raw)
    if parser.errors:
        raise ConfigError(parser.errors)
    return config


def reload_diff(old: Config, new: Config) -> tuple[list[str], list[str]]:
    """The changed fields as (applied live, needing a restart), in file order (§10 hot reload):
    a top-level name, or ``section.field`` inside a section that is only partly live."""
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


#: ``reload_diff`` names whose place in the file differs (the dataclass flattens the YAML).
_FILE_NAMES: Final = {"timeouts.first_byte_generate": "timeouts.first_byte.generate",
                      "timeouts.first_byte_embeddings": "timeouts.first_byte.embeddings",
                      "dns_backends": "backends"}


def file_name(name: str) -> str:
    """A ``reload_diff`` name as the operator writes it in the file."""
    return _FILE_NAMES.get(name, name)


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


def _show(value: object) -> str:
    """A value as an error message shows it: YAML spellings, not Python's."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return str(value)  # a YAML date or timestamp, as written


def _is_int(value: object) -> TypeGuard[int]:
    """YAML's true is a Python int; for config it is not a number."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def backend_url(raw: object) -> str | None:
    """``raw`` as a backend URL (absolute http or https, no query or fragment, no trailing
    slash), or ``None`` when it is not one: the static list's rule, which Docker labels
    (``pharos.url``) follow too."""
    if not isinstance(raw, str):
        return None
    try:
        parts = urllib.parse.urlsplit(raw)
        valid = (
            parts.scheme in ("http", "https")
            and bool(parts.hostname)
            and (parts.port is None or parts.port > 0)
            and not parts.query
            and not parts.fragment
        )
    except ValueError:  # a port that isn't a number, a bracket left open
        valid = False
    return raw.rstrip("/") if valid else None


def _is_dns_entry(item: object) -> bool:
    """A ``backends:`` item naming a DNS name instead of a URL."""
    return isinstance(item, dict) and "dns" in item


def _at(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _one_of(values: Collection[str]) -> str:
    return "one of " + ", ".join(values)


class _Parser:
    """Walks the loaded YAML, collecting every error with its path."""

    def __init__(self, library_names: frozenset[str] | None) -> None:
        self.errors: list[str] = []
        self._library_names = library_names
        self.refuse_unbuilt = False

    def library_names(self) -> frozenset[str]:
        """The probe library's names, imported on first need, so a config without own probes
        never loads the probe library."""
        if self._library_names is None:
            from pharos.engine.library import LIBRARY_PROBE_NAMES

            self._library_names = LIBRARY_PROBE_NAMES
        return self._library_names

    def error(self, path: str, message: str) -> None:
        self.errors.append(f"{path or 'top level'}: {message}")

    def expected(self, path: str, what: str, got: object) -> None:
        self.error(path, f"expected {what}, got {_show(got)}")

    def mapping(
        self, raw: object, path: str, known: Collection[str], required: Collection[str] = ()
    ) -> dict[str, object] | None:
        """The fields of a mapping, reporting unknown and missing ones; ``None`` if it isn't a
        mapping at all."""
        if not isinstance(raw, dict):
            self.expected(path, "a mapping", raw)
            return None
        for key in raw:
            if key not in known:
                self.error(path, f"unknown field {_show(key)}")
        for name in required:
            if name not in raw:
                self.error(path, f"missing required field {name!r}")
        return {k: v for k, v in raw.items() if isinstance(k, str) and k in known}

    def items(self, raw: object, path: str) -> list[object]:
        """A list's items; null is an empty list."""
        if raw is None:
            return []
        if not isinstance(raw, list):
            self.expected(path, "a list", raw)
            return []
        return raw

    def text(self, raw: object, path: str, what: str = "a non-empty string") -> str | None:
        if isinstance(raw, str) and raw:
            return raw
        self.expected(path, what, raw)
        return None

    def integer(self, raw: object, path: str, minimum: int = 1) -> int | None:
        if _is_int(raw) and raw >= minimum:
            return raw
        what = "a positive integer" if minimum == 1 else "a non-negative integer"
        self.expected(path, what, raw)
        return None

    def choice(self, raw: object, path: str, choices: Sequence[_Choice]) -> _Choice | None:
        for choice in choices:
            if raw == choice:
                return choice
        self.expected(path, _one_of(choices), raw)
        return None

    def duration(self, raw: object, path: str, default: float) -> float:
        if raw is None:
            return default
        if _is_number(raw) and raw >= 0:
            return float(raw)
        if isinstance(raw, str):
            try:
                return parse_duration(raw)
            except ValueError:
                pass
        self.expected(path, "a duration such as 5s, 10m or 1h30m, or a number of seconds", raw)
        return default

    def listen(self, raw: object, path: str, default: str) -> Listen:
        if raw is None:
            return Listen(default)
        address = f":{raw}" if _is_int(raw) else raw
        if isinstance(address, str):
            try:
                _parse_listen(address)
                return Listen(address)
            except ValueError:
                pass
        self.expected(path, _LISTEN_FORMS, raw)
        return Listen(default)

    def not_yet(self, m: Mapping[str, object], path: str, fields: Mapping[str, str]) -> None:
        """Refuse fields whose feature is not built yet: accepted and ignored would be worse
        (a ``keys:`` section that lets everyone in). Each refusal goes with the change that
        builds its feature."""
        if not self.refuse_unbuilt:
            return
        for name, what in fields.items():
            if m.get(name) is not None:
                self.error(_at(path, name), f"not supported yet ({what}); remove it")

    def config(self, raw: object) -> Config:
        if raw is None:
            return Config()
        m = self.mapping(
            raw,
            "",
            ("listen", "policy", "backends", "keys", "tenants", "state_file", "usage", "drain",
             "peers", "routing", "timeouts", "observability", "workers", "models",
             "responses"),
        )
        if m is None:
            return Config()
        self.not_yet(m, "", NOT_YET)
        listen = self.listen(m.get("listen"), "listen", DEFAULT_LISTEN)
        policy = DEFAULT_POLICY
        if m.get("policy") is not None:
            policy = self.choice(m["policy"], "policy", POLICIES) or policy
        state_file = None
        if m.get("state_file") is not None:
            state_file = self.text(m["state_file"], "state_file", "a path")
        backends = self.backends(m.get("backends"))
        dns_backends = self.dns_backends(m.get("backends"))
        keys = self.keys(m.get("keys"))
        tenants = self.tenants(m.get("tenants"))
        named = {t.name for t in tenants} | {DEFAULT_TENANT}
        for i, key in enumerate(keys):
            if key.tenant not in named:
                self.error(f"keys[{i}].tenant", f"no tenant named {key.tenant!r} in tenants")
        workers = self.workers(m.get("workers"))
        peers = self.peers(m.get("peers"))
        responses = self.responses(m.get("responses"))
        if workers > 1 and responses.store:
            self.error("responses.store", "conversations are kept in one process's memory: "
                       "not with more than one worker (workers: 1)")
        if workers > 1 and peers is not None:
            self.error("workers", "more than one worker with peers: is not supported yet "
                       "(run one worker per instance in a mesh); remove one of them")
        if workers > 1 and not listen.strports().startswith(("tcp:", "tcp6:")):
            self.error("workers", f"more than one worker needs a TCP listen address (the "
                       f"workers share its socket), not {listen.address!r}")
        return Config(
            listen=listen,
            policy=policy,
            backends=backends,
            dns_backends=dns_backends,
            keys=keys,
            tenants=tenants,
            state_file=state_file,
            usage=self.usage(m.get("usage")),
            drain=self.drain(m.get("drain")),
            peers=peers,
            routing=self.routing(m.get("routing")),
            observability=self.observability(m.get("observability")),
            timeouts=self.timeouts(m.get("timeouts")),
            workers=workers,
            models=parse_models(m.get("models"), self.error, self._cost_terms),
            responses=responses,
        )

    def workers(self, raw: object) -> int:
        """``workers: N`` (1 to ``MAX_WORKERS``) or ``auto`` (the available cores)."""
        if raw is None:
            return DEFAULT_WORKERS
        if raw == "auto":
            return min(available_cores(), MAX_WORKERS)
        if not _is_int(raw) or not 1 <= raw <= MAX_WORKERS:
            self.expected("workers", f"an integer from 1 to {MAX_WORKERS} or auto", raw)
            return DEFAULT_WORKERS
        return raw

    def observability(self, raw: object) -> Observability:
        if raw is None:
            return Observability()
        m = self.mapping(raw, "observability", ("decision_log", "shadow_log"))
        if m is None:
            return Observability()
        shadow_log = (self.text(m["shadow_log"], "observability.shadow_log", "a file path")
                      if m.get("shadow_log") is not None else None)
        if m.get("decision_log") is None:
            return Observability(shadow_log=shadow_log)
        path = "observability.decision_log"
        d = self.mapping(m["decision_log"], path, ("path", "sample_rate"), required=("path",))
        if d is None or "path" not in d:
            return Observability(shadow_log=shadow_log)
        file = self.text(d["path"], _at(path, "path"), "a file path")
        rate = 1.0
        if d.get("sample_rate") is not None:
            raw_rate = d["sample_rate"]
            if _is_number(raw_rate) and 0 < raw_rate <= 1:
                rate = float(raw_rate)
            else:
                self.expected(_at(path, "sample_rate"), "a number above 0, at most 1", raw_rate)
        if file is None:
            return Observability(shadow_log=shadow_log)
        return Observability(DecisionLogConfig(path=file, sample_rate=rate),
                             shadow_log=shadow_log)

    def timeouts(self, raw: object) -> Timeouts:
        if raw is None:
            return Timeouts()
        m = self.mapping(raw, "timeouts",
                         ("first_byte", "stream_idle", "request_headers", "queue_stuck",
                          "request_body", "idle"))
        if m is None:
            return Timeouts()
        generate, embeddings = DEFAULT_FIRST_BYTE_GENERATE, DEFAULT_FIRST_BYTE_EMBEDDINGS
        if m.get("first_byte") is not None:
            fb = self.mapping(m["first_byte"], "timeouts.first_byte", ("generate", "embeddings"))
            if fb is not None:
                generate = self.positive(fb.get("generate"), "timeouts.first_byte.generate",
                                         generate)
                embeddings = self.positive(fb.get("embeddings"),
                                           "timeouts.first_byte.embeddings", embeddings)
        return Timeouts(
            first_byte_generate=generate,
            first_byte_embeddings=embeddings,
            stream_idle=self.positive(m.get("stream_idle"), "timeouts.stream_idle",
                                      DEFAULT_STREAM_IDLE),
            request_headers=self.positive(m.get("request_headers"), "timeouts.request_headers",
                                          DEFAULT_REQUEST_HEADERS),
            queue_stuck=self.positive(m.get("queue_stuck"), "timeouts.queue_stuck",
                                      DEFAULT_QUEUE_STUCK),
            request_body=self.positive(m.get("request_body"), "timeouts.request_body",
                                       DEFAULT_REQUEST_BODY),
            idle=self.positive(m.get("idle"), "timeouts.idle", DEFAULT_IDLE),
        )

    def positive(self, raw: object, path: str, default: float) -> float:
        """A duration above zero (a zero time limit would refuse everything)."""
        value = self.duration(raw, path, default)
        if raw is not None and value <= 0:
            self.expected(path, "a duration above zero", raw)
            return default
        return value

    def routing(self, raw: object) -> Routing:
        if raw is None:
            return Routing()
        known = ("bounded_load_epsilon", "kv_pressure_threshold", "hot_prefix_utilization",
                 "session_affinity", "eviction_pricing", "prefix_entries",
                 "replica_utilization", "load_wait_bound", "swap_grouping", "split", "shadow")
        m = self.mapping(raw, "routing", known)
        if m is None:
            return Routing()
        base = Routing()
        out: dict[str, object] = {}

        def number(name: str, low: float, high: float | None, nullable: bool) -> None:
            if name not in m:
                return
            value = m[name]
            if value is None and nullable:
                out[name] = None
            elif _is_number(value) and low <= value and (high is None or value <= high):
                out[name] = float(value)
            else:
                span = (f"a number from {low} to {high}" if high is not None
                        else f"a number >= {low}")
                self.expected(f"routing.{name}", span + (" or null (off)" if nullable else ""),
                              value)

        number("bounded_load_epsilon", 0.0, None, True)
        number("kv_pressure_threshold", 0.0, 1.0, True)
        if "kv_pressure_threshold" in out and out["kv_pressure_threshold"] is None:
            out["kv_pressure_threshold"] = 1.0  # null: off, which 1.0 means to the policy
        number("hot_prefix_utilization", 0.01, 1.0, True)
        number("replica_utilization", 0.01, 1.0, True)
        if m.get("load_wait_bound") is not None:  # not a guard: null is the default
            out["load_wait_bound"] = self.positive(
                m["load_wait_bound"], "routing.load_wait_bound", base.load_wait_bound)
        for name in ("session_affinity", "eviction_pricing", "swap_grouping"):
            if name not in m:
                continue
            if m[name] is None:
                out[name] = False  # null: off, like every guard
            elif isinstance(m[name], bool):
                out[name] = m[name]
            else:
                self.expected(f"routing.{name}", "true, false or null (off)", m[name])
        if m.get("prefix_entries") is not None:  # not a guard: null is the default
            entries = self.integer(m["prefix_entries"], "routing.prefix_entries")
            out["prefix_entries"] = entries if entries is not None else base.prefix_entries
        if m.get("split") is not None:
            out["split"] = parse_split(m["split"], "routing.split", self.error)
        if m.get("shadow") is not None:
            out["shadow"] = parse_shadow(m["shadow"], "routing.shadow", self.error) or ()
        return dataclasses.replace(base, **out)  # type: ignore[arg-type]

    def _cost_terms(self, raw: object, path: str) -> tuple[float, float, float] | None:
        """A ``models[].cost_model`` (the backends' fields), as (a, b, d)."""
        model = self.cost_model(raw, path)
        return None if model is None else model.terms()

    def backends(self, raw: object) -> tuple[Backend, ...]:
        backends: list[Backend] = []
        urls: set[str] = set()
        for i, item in enumerate(self.items(raw, "backends")):
            if _is_dns_entry(item):
                continue
            backend = self.backend(item, f"backends[{i}]")
            if backend is None:
                continue
            if backend.url and backend.url in urls:
                self.error(f"backends[{i}].url", f"duplicate backend url {backend.url!r}")
            urls.add(backend.url)
            backends.append(backend)
        return tuple(backends)

    def backend(self, raw: object, path: str) -> Backend | None:
        known = ("url", "kind", "memory_gb", "capacity", "aliases", "logs", "probes",
                 "cost_model", "max_loaded_models")
        if isinstance(raw, dict):
            for name in ("port", "refresh"):
                if name in raw:
                    self.error(_at(path, name), "only a dns entry takes it (a url names its "
                                                "own port)")
            raw = {k: v for k, v in raw.items() if k not in ("port", "refresh")}
        m = self.mapping(raw, path, known, required=("url",))
        if m is None:
            return None
        self.not_yet(m, path, BACKEND_NOT_YET)
        url = self.url(m["url"], _at(path, "url")) if "url" in m else None
        kind = DEFAULT_KIND
        if m.get("kind") is not None:
            kind = self.choice(m["kind"], _at(path, "kind"), BACKEND_KINDS) or kind
        memory_gb = None
        if (raw_memory := m.get("memory_gb")) is not None:
            if _is_number(raw_memory) and raw_memory > 0:
                memory_gb = float(raw_memory)
            else:
                self.expected(_at(path, "memory_gb"), "a positive number", raw_memory)
        capacity = None
        if m.get("capacity") is not None:
            capacity = self.integer(m["capacity"], _at(path, "capacity"))
        max_loaded = None
        if m.get("max_loaded_models") is not None:
            max_loaded = self.integer(m["max_loaded_models"], _at(path, "max_loaded_models"))
        logs = None
        if m.get("logs") is not None:
            logs = self.log_feed(m["logs"], _at(path, "logs"))
        return Backend(
            url=url or "",
            kind=kind,
            memory_gb=memory_gb,
            capacity=capacity,
            max_loaded_models=max_loaded,
            aliases=self.aliases(m.get("aliases"), _at(path, "aliases")),
            logs=logs,
            probes=self.probes(m.get("probes"), _at(path, "probes")),
            cost_model=self.cost_model(m.get("cost_model"), _at(path, "cost_model")),
        )

    def cost_model(self, raw: object, path: str) -> CostModel | None:
        """``{prefill_token_s, prefill_pair_s, prefill_fixed_s}``: all three, each >= 0."""
        if raw is None:
            return None
        names = COST_MODEL_FIELDS
        m = self.mapping(raw, path, names, required=names)
        if m is None or any(n not in m for n in names):
            return None
        values: list[float] = []
        for n in names:
            v = m[n]
            if not _is_number(v) or v < 0:
                self.expected(_at(path, n), "a number of seconds >= 0", v)
                return None
            values.append(float(v))
        if values[0] == 0 and values[1] == 0:
            self.error(path, "prefill_token_s and prefill_pair_s are both 0: every prompt "
                             "would cost the same (calibrate again)")
            return None
        return CostModel(*values)

    def dns_backends(self, raw: object) -> tuple[DnsBackends, ...]:
        """The ``dns:`` entries of ``backends:`` (the others are ``backends()``'s)."""
        groups: list[DnsBackends] = []
        seen: set[tuple[str, int]] = set()
        for i, item in enumerate(raw if isinstance(raw, list) else []):
            if not _is_dns_entry(item):
                continue
            group = self.dns_backend(item, f"backends[{i}]")
            if group is None:
                continue
            if (group.name, group.port) in seen:
                self.error(f"backends[{i}].dns", f"duplicate dns backend {group.name!r} "
                                                 f"port {group.port}")
            seen.add((group.name, group.port))
            groups.append(group)
        return tuple(groups)

    def dns_backend(self, raw: dict[object, object], path: str) -> DnsBackends | None:
        """``{dns: NAME, port, kind, refresh}`` plus the per-engine settings every member
        shares (memory_gb, capacity, aliases, probes)."""
        refused = {"url": "an entry has either url or dns, not both",
                   "logs": "a log feed is one engine's; a dns entry's members have none"}
        for field_name, why in refused.items():
            if field_name in raw:
                self.error(_at(path, field_name), why)
        shared = ("kind", "memory_gb", "capacity", "aliases", "probes", "cost_model",
                  "max_loaded_models")
        known = ("dns", "port", "refresh", *shared)
        m = self.mapping({k: v for k, v in raw.items() if k not in refused}, path, known,
                         required=("dns", "port"))
        if m is None:
            return None
        name = self.text(m.get("dns"), _at(path, "dns"), "a host name")
        if name is not None and not _HOSTNAME.fullmatch(name):
            self.expected(_at(path, "dns"), "a host name", name)
            name = None
        port = None
        if "port" in m:
            port = self.integer(m["port"], _at(path, "port"))
            if port is not None and port > 65535:
                self.expected(_at(path, "port"), "a port from 1 to 65535", port)
                port = None
        refresh = self.duration(m.get("refresh"), _at(path, "refresh"), DEFAULT_DNS_REFRESH)
        if refresh <= 0:
            self.expected(_at(path, "refresh"), "a duration above 0", m.get("refresh"))
            refresh = DEFAULT_DNS_REFRESH
        template = self.backend({"url": "http://dns.invalid",
                                 **{k: v for k, v in m.items() if k in shared}}, path)
        if name is None or port is None or template is None:
            return None
        return DnsBackends(name=name, port=port, refresh=refresh,
                           template=dataclasses.replace(template, url=""))

    def url(self, raw: object, path: str) -> str | None:
        if (url := backend_url(raw)) is not None:
            return url
        self.expected(path, "an absolute http or https URL", raw)
        return None

    def log_feed(self, raw: object, path: str) -> LogFeed | None:
        if isinstance(raw, str):
            if raw.startswith("docker://") and _CONTAINER.fullmatch(raw[len("docker://") :]):
                return LogFeed("docker", raw[len("docker://") :])
            if raw.startswith("file:///"):
                return LogFeed("file", raw[len("file://") :])
        self.expected(path, "docker://<container> or file:///<absolute path>", raw)
        return None

    def aliases(self, raw: object, path: str) -> Mapping[str, str]:
        if raw is None:
            return _no_aliases()
        if not isinstance(raw, dict):
            self.expected(path, "a mapping of engine model name to client model name", raw)
            return _no_aliases()
        aliases: dict[str, str] = {}
        engine_name_of: dict[str, str] = {}
        for engine_name, client_name in raw.items():
            where = f"{path}[{_show(engine_name)}]"
            if not isinstance(engine_name, str) or not engine_name:
                self.error(path, f"expected engine model names as keys, got {_show(engine_name)}")
                continue
            if not isinstance(client_name, str) or not client_name:
                self.expected(where, "a non-empty string", client_name)
                continue
            if client_name in engine_name_of:
                self.error(
                    where,
                    f"{engine_name_of[client_name]!r} and {engine_name!r} both map to "
                    f"{client_name!r}",
                )
                continue
            engine_name_of[client_name] = engine_name
            aliases[engine_name] = client_name
        return MappingProxyType(aliases)

    def probes(self, raw: object, path: str) -> tuple[OwnProbe, ...]:
        probes: list[OwnProbe] = []
        names: set[str] = set()
        for i, item in enumerate(self.items(raw, path)):
            probe = self.probe(item, f"{path}[{i}]", names)
            if probe is not None:
                probes.append(probe)
        return tuple(probes)

    def probe(self, raw: object, path: str, names: set[str]) -> OwnProbe | None:
        """One own probe, checked against the rules of spec §4."""
        m = self.mapping(raw, path, ("name", "signal", "prom", "log"), required=("name", "signal"))
        if m is None:
            return None
        name = self.text(m["name"], _at(path, "name")) if "name" in m else None
        if name is not None:
            if name in self.library_names():
                self.error(_at(path, "name"), f"{name!r} is already a library probe's name")
            elif name in names:
                self.error(_at(path, "name"), f"duplicate probe name {name!r}")
            names.add(name)
        signal = None
        if "signal" in m:
            choices = [s.value for s in Signal]
            if (value := self.choice(m["signal"], _at(path, "signal"), choices)) is not None:
                signal = Signal(value)
        prom, log = m.get("prom"), m.get("log")
        spec: PromSpec | LogSpec | None = None
        if prom is not None and log is not None:
            self.error(path, "expected exactly one of prom, log, got both")
        elif prom is not None:
            spec = self.prom(prom, _at(path, "prom"), signal)
        elif log is not None:
            spec = self.log(log, _at(path, "log"), signal)
        else:
            self.error(path, "missing required field: one of prom, log")
        if name is None or signal is None or spec is None:
            return None
        return OwnProbe(name=name, signal=signal, spec=spec)

    def prom(self, raw: object, path: str, signal: Signal | None) -> PromSpec | None:
        m = self.mapping(
            raw, path, ("path", "metric", "per_model", "scale"), required=("path", "metric")
        )
        if m is None:
            return None
        if signal is not None and signal not in LOAD_SIGNALS:
            loads = [s.value for s in Signal if s in LOAD_SIGNALS]
            self.error(
                path, f"a prom probe reads only {', '.join(loads)}, not {signal.value!r}"
            )
        url_path = None
        if "path" in m:
            url_path = self.text(m["path"], _at(path, "path"))
            if url_path is not None and not url_path.startswith("/"):
                self.expected(_at(path, "path"), "a path starting with /", url_path)
                url_path = None
        metric = None
        if "metric" in m:
            metric = self.text(m["metric"], _at(path, "metric"))
            if metric is not None and not _METRIC.fullmatch(metric):
                self.expected(_at(path, "metric"), "a Prometheus metric name", metric)
                metric = None
        per_model = None
        if (raw_label := m.get("per_model")) is not None:
            per_model = self.text(raw_label, _at(path, "per_model"))
            if per_model is not None and not _LABEL.fullmatch(per_model):
                self.expected(_at(path, "per_model"), "a Prometheus label name", per_model)
                per_model = None
        scale = DEFAULT_SCALE
        if (raw_scale := m.get("scale")) is not None:
            if signal is not None and signal is not Signal.KV_USAGE:
                self.error(_at(path, "scale"), f"applies only to kv_usage, not {signal.value!r}")
            scale = self.choice(raw_scale, _at(path, "scale"), SCALES) or scale
        if url_path is None or metric is None:
            return None
        return PromSpec(path=url_path, metric=metric, per_model=per_model, scale=scale)

    def log(self, raw: object, path: str, signal: Signal | None) -> LogSpec | None:
        m = self.mapping(raw, path, ("match", "value"), required=("match",))
        if m is None:
            return None
        if signal is not None and signal not in LOG_SIGNALS:
            readable = [s.value for s in Signal if s in LOG_SIGNALS]
            self.error(
                path, f"a log probe reads only {', '.join(readable)}, not {signal.value!r}"
            )
            signal = None  # no fixed value can be right for it
        pattern = None
        if "match" in m and (source := self.text(m["match"], _at(path, "match"))) is not None:
            try:
                pattern = re.compile(source)
            except re.error as e:
                self.error(_at(path, "match"), f"pattern does not compile: {e}")
        raw_value = m.get("value")
        value: FixedValue | None = None
        if raw_value is not None and signal is not None:
            value = self.fixed_value(raw_value, _at(path, "value"), signal)
        if pattern is not None:
            has_group = "value" in pattern.groupindex
            if has_group and raw_value is not None:
                self.error(
                    path, "expected a named group 'value' in match or a fixed value, got both"
                )
            elif not has_group and raw_value is None:
                self.error(
                    _at(path, "match"),
                    "needs a named group 'value', as in (?P<value>...), or a fixed value",
                )
            if signal is Signal.RESIDENCY and "model" not in pattern.groupindex:
                # a residency value covers only the model the line names (spec §4)
                self.error(
                    _at(path, "match"),
                    "a residency line must name its model: add a group (?P<model>...)",
                )
        if pattern is None:
            return None
        return LogSpec(match=pattern, value=value)

    def fixed_value(self, raw: object, path: str, signal: Signal) -> FixedValue | None:
        """A log probe's fixed value, valid for its signal (checked here, not per line)."""
        if signal is Signal.RESIDENCY:
            residency = self.choice(raw, path, [r.value for r in _FIXED_RESIDENCIES])
            return None if residency is None else Residency(residency)
        if signal in COUNT_SIGNALS:
            return self.integer(raw, path, minimum=0)
        if signal is Signal.KV_USAGE:
            if _is_number(raw) and 0 <= raw <= 1:
                return float(raw)
            self.expected(path, "a number from 0 to 1", raw)
            return None
        return self.text(raw, path)

    def keys(self, raw: object) -> tuple[Key, ...]:
        keys: list[Key] = []
        owner_of_name: set[str] = set()
        owner_of_hash: dict[str, str] = {}
        for i, item in enumerate(self.items(raw, "keys")):
            path = f"keys[{i}]"
            key = self.key(item, path)
            if key is None:
                continue
            if key.name:
                if key.name in owner_of_name:
                    self.error(_at(path, "name"), f"duplicate key name {key.name!r}")
                owner_of_name.add(key.name)
            if key.sha256:
                if key.sha256 in owner_of_hash:
                    self.error(
                        _at(path, "sha256"),
                        f"duplicate key hash, already used by {owner_of_hash[key.sha256]!r}",
                    )
                owner_of_hash.setdefault(key.sha256, key.name)
            keys.append(key)
        return tuple(keys)

    def key(self, raw: object, path: str) -> Key | None:
        known = ("name", "sha256", "rpm", "tokens_per_day", "weight", "models", "admin",
                 "tenant")
        m = self.mapping(raw, path, known, required=("name", "sha256"))
        if m is None:
            return None
        name = self.text(m["name"], _at(path, "name")) if "name" in m else None
        sha256 = None
        if "sha256" in m:
            if isinstance(m["sha256"], str) and _SHA256.fullmatch(m["sha256"]):
                sha256 = m["sha256"]
            else:
                self.expected(_at(path, "sha256"), "64 lowercase hex digits", m["sha256"])
        limits: dict[str, int | None] = {}
        for limit in ("rpm", "tokens_per_day"):
            raw_limit = m.get(limit)
            limits[limit] = None if raw_limit is None else self.integer(raw_limit, _at(path, limit))
        weight = DEFAULT_WEIGHT
        if m.get("weight") is not None:
            weight = self.integer(m["weight"], _at(path, "weight")) or weight
        models: list[str] = []
        for j, model in enumerate(self.items(m.get("models"), _at(path, "models"))):
            if (text := self.text(model, f"{path}.models[{j}]")) is not None:
                models.append(text)
        admin = False
        if (raw_admin := m.get("admin")) is not None:
            if isinstance(raw_admin, bool):
                admin = raw_admin
            else:
                self.expected(_at(path, "admin"), "true or false", raw_admin)
        tenant = DEFAULT_TENANT
        if m.get("tenant") is not None:
            tenant = self.text(m["tenant"], _at(path, "tenant")) or tenant
        return Key(
            name=name or "",
            sha256=sha256 or "",
            rpm=limits["rpm"],
            tokens_per_day=limits["tokens_per_day"],
            weight=weight,
            models=tuple(models),
            admin=admin,
            tenant=tenant,
        )

    def tenants(self, raw: object) -> tuple[Tenant, ...]:
        tenants: list[Tenant] = []
        names: set[str] = set()
        for i, item in enumerate(self.items(raw, "tenants")):
            path = f"tenants[{i}]"
            m = self.mapping(item, path, ("name", "weight", "rpm", "tokens_per_day"),
                             required=("name",))
            if m is None:
                continue
            name = self.text(m["name"], _at(path, "name")) if "name" in m else None
            if name is None:
                continue
            if name in names:
                self.error(_at(path, "name"), f"duplicate tenant name {name!r}")
            names.add(name)
            weight = DEFAULT_WEIGHT
            if m.get("weight") is not None:
                weight = self.integer(m["weight"], _at(path, "weight")) or weight
            limits: dict[str, int | None] = {}
            for limit in ("rpm", "tokens_per_day"):
                raw_limit = m.get(limit)
                limits[limit] = (None if raw_limit is None
                                 else self.integer(raw_limit, _at(path, limit)))
            tenants.append(Tenant(name=name, weight=weight, rpm=limits["rpm"],
                                  tokens_per_day=limits["tokens_per_day"]))
        return tuple(tenants)

    def usage(self, raw: object) -> Usage:
        if raw is None:
            return Usage()
        m = self.mapping(raw, "usage", ("timezone", "retention_days", "journal"))
        if m is None:
            return Usage()
        timezone = None
        if (raw_zone := m.get("timezone")) is not None:
            timezone = self.text(raw_zone, "usage.timezone", "an IANA time zone name")
            if timezone is not None:
                try:
                    zoneinfo.ZoneInfo(timezone)
                except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
                    self.expected("usage.timezone", "an IANA time zone name", timezone)
                    timezone = None
        retention = DEFAULT_RETENTION_DAYS
        if m.get("retention_days") is not None:
            retention = self.integer(m["retention_days"], "usage.retention_days") or retention
        journal = None
        if m.get("journal") is not None:
            journal = self.text(m["journal"], "usage.journal", "a file path")
        return Usage(timezone=timezone, retention_days=retention, journal=journal)

    def drain(self, raw: object) -> Drain:
        if raw is None:
            return Drain()
        m = self.mapping(raw, "drain", ("grace", "timeout"))
        if m is None:
            return Drain()
        return Drain(
            grace=self.duration(m.get("grace"), "drain.grace", DEFAULT_DRAIN_GRACE),
            timeout=self.duration(m.get("timeout"), "drain.timeout", DEFAULT_DRAIN_TIMEOUT),
        )

    def responses(self, raw: object) -> Responses:
        """``responses:``; ``key_file`` is required once ``store`` is true (its content is
        checked by ``load_config``)."""
        if raw is None:
            return Responses()
        path = "responses"
        m = self.mapping(raw, path, ("store", "key_file", "max_responses", "max_age",
                                     "max_bytes_per_conversation"))
        if m is None:
            return Responses()
        store = False
        if m.get("store") is not None:
            if isinstance(m["store"], bool):
                store = m["store"]
            else:
                self.expected(_at(path, "store"), "true or false", m["store"])
        key_file = None
        if m.get("key_file") is not None:
            key_file = self.text(m["key_file"], _at(path, "key_file"), "a file path")
        elif store:
            self.error(_at(path, "key_file"), "required with store: true (a file holding "
                       "the AES-256 key: openssl rand -hex 32 > FILE)")
        base = Responses()
        count = base.max_responses
        if m.get("max_responses") is not None:
            count = self.integer(m["max_responses"], _at(path, "max_responses")) or count
        size = base.max_bytes_per_conversation
        if m.get("max_bytes_per_conversation") is not None:
            size = self.integer(m["max_bytes_per_conversation"],
                                _at(path, "max_bytes_per_conversation")) or size
        return Responses(store=store, key_file=key_file, max_responses=count,
                         max_age=self.positive(m.get("max_age"), _at(path, "max_age"),
                                               base.max_age),
                         max_bytes_per_conversation=size)

    def peers(self, raw: object) -> Peers | None:
        if raw is None:
            return None
        known = ("listen", "secret_file", "members", "dns")
        m = self.mapping(raw, "peers", known, required=("secret_file",))
        if m is None:
            return None
        secret_file = None
        if "secret_file" in m:
            secret_file = self.text(m["secret_file"], "peers.secret_file", "a path")
        members: list[str] = []
        if m.get("members") is not None:
            items = self.items(m["members"], "peers.members")
            for i, item in enumerate(items):
                member = self.address(item, f"peers.members[{i}]", port_required=True)
                if member is not None:
                    members.append(member)
            if isinstance(m["members"], list) and not items:
                self.expected("peers.members", "a non-empty list of host:port", m["members"])
        dns = None
        if m.get("dns") is not None:
            dns = self.address(m["dns"], "peers.dns", port_required=False)
        has_members, has_dns = m.get("members") is not None, m.get("dns") is not None
        if has_members and has_dns:
            self.error("peers", "expected exactly one of members, dns, got both")
        elif not has_members and not has_dns:
            self.error("peers", "missing required field: one of members, dns")
        return Peers(
            secret_file=secret_file or "",
            listen=self.listen(m.get("listen"), "peers.listen", DEFAULT_PEER_LISTEN),
            members=tuple(members),
            dns=dns,
        )

    def address(self, raw: object, path: str, *, port_required: bool) -> str | None:
        """A peer address: host:port or [ipv6]:port, or (``dns``) a bare host name."""
        if isinstance(raw, str):
            host, port, ipv6 = raw, "", False
            if match := _IPV6_PORT.fullmatch(raw):
                host, port, ipv6 = match["host"], match["port"], True
            elif ":" in raw:
                host, _, port = raw.rpartition(":")
            valid_host = _is_ipv6(host) if ipv6 else bool(_HOSTNAME.fullmatch(host))
            valid_port = (port.isdigit() and 0 < int(port) <= 65535) if port else not port_required
            if valid_host and valid_port:
                return raw
        self.expected(path, "host:port" if port_required else "a host name or host:port", raw)
        return None
