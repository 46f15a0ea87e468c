"""The config file as frozen dataclasses: each field's ``setting`` says its kind,
default, rule, whether a reload applies it live, and a line for the reference. Every default
lives here, once; the rules between fields are the small named checks below the classes."""

# mypy: disable-error-code="func-returns-value"
# (a reader returns ``p.expected(...)``: the error reported, ``None`` read)
from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import urllib.parse
import zoneinfo
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Literal, TypeAlias, get_args

from pharos.config.kinds import (
    Bool,
    Choice,
    Custom,
    Duration,
    Int,
    Items,
    Number,
    Parser,
    Section,
    Text,
    at,
    is_int,
    setting,
    show,
)
from pharos.config.probes import LOG_FEED, PROBES, LogFeed, OwnProbe
from pharos.hot import UTILIZATION
from pharos.placement import LOAD_WAIT_BOUND_SEC, REPLICA_UTILIZATION
from pharos.policy import BOUNDED_LOAD_EPSILON, KV_PRESSURE_THRESHOLD
from pharos.prefix import DEFAULT_CAPACITY

Policy: TypeAlias = Literal["cost", "least-load", "round-robin", "random", "p2c", "prefix-hash"]
BackendKind: TypeAlias = Literal[
    "auto", "ollama", "llamacpp", "llama-swap", "vllm", "sglang", "openai"
]
POLICIES: Final[tuple[Policy, ...]] = get_args(Policy)
BACKEND_KINDS: Final[tuple[BackendKind, ...]] = get_args(BackendKind)

#: Loopback only: without keys the admin routes answer loopback clients alone, so a listener
#: on every interface is the operator's explicit choice (``listen: ":8090"``).
DEFAULT_LISTEN: Final = "127.0.0.1:8090"
DEFAULT_PEER_LISTEN: Final = ":8081"
#: The tenant of a key that names none: with no ``tenants:`` every key shares it, and the fair
#: queue is the one-tenant case (weighted round-robin over keys).
DEFAULT_TENANT: Final = "default"
DEFAULT_WEIGHT: Final = 1
DEFAULT_RETENTION_DAYS: Final = 400
DEFAULT_DRAIN_GRACE: Final = 5.0
DEFAULT_DRAIN_TIMEOUT: Final = 600.0
#: A client's request line and headers must arrive within this (slowloris).
DEFAULT_REQUEST_HEADERS: Final = 10.0
#: A request's body must arrive whole within this of its head (a body trickled a byte at a
#: time); 32 MiB at 1 Mbit/s takes 270 s.
DEFAULT_REQUEST_BODY: Final = 300.0
#: A client connection with no request in progress and no byte for this long is closed
#: (keep-alive idle; Twisted's own default).
DEFAULT_IDLE: Final = 60.0
#: More workers than this are refused: each is a whole Pharos with its own memory.
MAX_WORKERS: Final = 64
#: Connections the kernel holds to accept: Twisted's default of 50 drops most of a burst of
#: clients (the kernel caps it at net.core.somaxconn).
LISTEN_BACKLOG: Final = 1024
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


@dataclass(frozen=True)
class Digest(Text):
    """A key's SHA-256 as ``keys[].sha256`` and ``observability.metrics_key`` take it; the
    error of anything else (a placeholder copied from the docs) says where one comes from."""

    what: str = "64 lowercase hex digits"
    check: Callable[[str], object] | None = _SHA256.fullmatch
    pattern: str | None = "^[0-9a-f]{64}$"

    def parse(self, p: Parser, raw: object, path: str) -> str | None:
        if isinstance(raw, str) and _SHA256.fullmatch(raw):
            return raw
        p.error(path, f"expected {self.what}, got {show(raw)}: run `pharos keys new` and "
                      f"paste the sha256 it prints")
        return None


SHA256_HEX: Final = Digest()


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

    def loopback(self) -> bool:
        """Whether only this host can reach the address: a TCP interface on loopback
        (``127.0.0.0/8``, ``::1``, ``localhost``) or a UNIX socket. Every interface, another
        address, or an endpoint kind not known here is not."""
        desc = _parse_listen(self.address)[0]
        kind, _, rest = desc.partition(":")
        if kind.lower() == "unix":
            return True
        if kind.lower() not in ("tcp", "tcp6"):
            return False
        host = ""
        for part in re.split(r"(?<!\\):", rest)[1:]:
            name, _, value = part.partition("=")
            if name == "interface":
                host = value.replace("\\:", ":").replace("\\\\", "\\")
        if host.lower() == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False


def _listen(p: Parser, raw: object, path: str) -> Listen | None:
    address = f":{raw}" if is_int(raw) else raw
    if isinstance(address, str):
        try:
            _parse_listen(address)
            return Listen(address)
        except ValueError:
            pass
    return p.expected(path, _LISTEN_FORMS, raw)


LISTEN: Final = Custom(_LISTEN_FORMS, _listen, {"anyOf": [
    {"type": "string"}, {"type": "integer", "minimum": 1, "maximum": 65535}]},
    lambda listen: listen.address)


def backend_url(raw: object) -> str | None:
    """``raw`` as a backend URL (absolute http or https, no query or fragment, no trailing
    slash), or ``None`` when it is not one: the static list's rule, which Docker labels
    (``pharos.url``) follow too."""
    if not isinstance(raw, str):
        return None
    try:
        parts = urllib.parse.urlsplit(raw)
        valid = (parts.scheme in ("http", "https") and bool(parts.hostname)
                 and (parts.port is None or parts.port > 0)
                 and not parts.query and not parts.fragment)
    except ValueError:  # a port that isn't a number, a bracket left open
        valid = False
    return raw.rstrip("/") if valid else None


def _url(p: Parser, raw: object, path: str) -> str | None:
    url = backend_url(raw)
    return url if url is not None else p.expected(path, "an absolute http or https URL", raw)


def _aliases(p: Parser, raw: object, path: str) -> Mapping[str, str] | None:
    if not isinstance(raw, dict):
        return p.expected(path, "a mapping of engine model name to client model name", raw)
    aliases: dict[str, str] = {}
    engine_name_of: dict[str, str] = {}
    for engine_name, client_name in raw.items():
        where = f"{path}[{show(engine_name)}]"
        if not isinstance(engine_name, str) or not engine_name:
            p.error(path, f"expected engine model names as keys, got {show(engine_name)}")
        elif not isinstance(client_name, str) or not client_name:
            p.expected(where, "a non-empty string", client_name)
        elif client_name in engine_name_of:
            p.error(where, f"{engine_name_of[client_name]!r} and {engine_name!r} both map to "
                           f"{client_name!r}")
        else:
            engine_name_of[client_name] = engine_name
            aliases[engine_name] = client_name
    return MappingProxyType(aliases)


def _no_aliases() -> Mapping[str, str]:
    return MappingProxyType({})


#: ``backends[].cost_model``'s fields, in the order of ``CostModel`` (a, b, d).
COST_MODEL_FIELDS = ("prefill_token_s", "prefill_pair_s", "prefill_fixed_s")
_SECONDS = Number("a number of seconds >= 0", low=0)


@dataclass(frozen=True, slots=True)
class CostModel:
    """A measured prefill cost, ``P(u, c) = a·u + b·u·(c + u/2) + d`` seconds for ``u``
    uncached tokens after ``c`` cached ones (``pharos calibrate`` prints it). Routing prices
    the prefills with it instead of the learned per-token speed."""

    prefill_token_s: float = setting(_SECONDS, "a: seconds per uncached token", example=1e-4)
    prefill_pair_s: float = setting(_SECONDS, "b: seconds per token pair", example=3e-9)
    prefill_fixed_s: float = setting(_SECONDS, "d: seconds per prefill", example=0.005)

    def terms(self) -> tuple[float, float, float]:
        """(a, b, d), as the policy's candidates carry them."""
        return (self.prefill_token_s, self.prefill_pair_s, self.prefill_fixed_s)


def _check_cost(p: Parser, m: dict[str, Any], values: dict[str, Any], path: str) -> None:
    if values.get("prefill_token_s") == 0 and values.get("prefill_pair_s") == 0:
        p.error(path, "prefill_token_s and prefill_pair_s are both 0: every prompt would "
                      "cost the same (calibrate again)")


COST_MODEL: Final = Section(CostModel, _check_cost)
_COUNT = Int()


@dataclass(frozen=True, slots=True)
class Backend:
    """One statically listed engine. ``url`` has no trailing slash, so paths join onto it."""

    url: str = setting(Custom("an absolute http or https URL", _url, {
        "type": "string", "pattern": "^https?://"}), "the engine's base URL",
        example="http://127.0.0.1:11434")
    kind: BackendKind = setting(Choice(BACKEND_KINDS), "the engine (auto: detected)",
                                default="auto")
    memory_gb: float | None = setting(
        Number("a positive number", above=0), "what its models may use: loads are checked "
        "and priced", default=None, example=24)
    capacity: int | None = setting(_COUNT, "requests it runs at once (default: its probes')",
                                   default=None)
    max_loaded_models: int | None = setting(
        _COUNT, "models the host keeps loaded at once (OLLAMA_MAX_LOADED_MODELS, llama.cpp "
        "--models-max); none: unlimited but for memory_gb (llama-swap: 1)", default=None)
    aliases: Mapping[str, str] = setting(
        Custom("a mapping of engine model name to client model name", _aliases,
               {"type": "object", "additionalProperties": {"type": "string"}}, dict),
        "the engine's model name to the name clients use", default=_no_aliases)
    logs: LogFeed | None = setting(LOG_FEED, "the engine's log, for log probes", default=None)
    probes: tuple[OwnProbe, ...] = setting(PROBES, "own probes, ahead of the recipe's",
                                           default=())
    cost_model: CostModel | None = setting(
        COST_MODEL, "prefill seconds a·u + b·u·(c + u/2) + d, as pharos calibrate prints "
        "it; none: the learned speed", default=None)

    @property
    def cost_model_terms(self) -> tuple[float, float, float] | None:
        """``cost_model``'s (a, b, d) for the policy's candidates; None: learned speed."""
        return None if self.cost_model is None else self.cost_model.terms()


def _backend(p: Parser, raw: object, path: str) -> Backend | None:
    if isinstance(raw, dict):
        for name in ("port", "refresh"):
            if name in raw:
                p.error(at(path, name), "only a dns entry takes it (a url names its own port)")
        raw = {k: v for k, v in raw.items() if k not in ("port", "refresh")}
    backend: Backend | None = Section(Backend).parse(p, raw, path)
    return backend


@dataclass(frozen=True, slots=True)
class DnsBackends:
    """A ``backends:`` entry with ``dns: NAME`` (a Kubernetes headless Service): every address
    NAME resolves to is a backend, resolved again every ``refresh`` seconds. ``template`` holds
    the members' settings; its ``url`` is empty."""

    name: str = setting(Text("a host name", _HOSTNAME.fullmatch), "instead of url: every "
                        "address this name resolves to is a backend", file="dns",
                        example="engines.default.svc")
    port: int = setting(Int(1, 65535, label="a port from 1 to 65535"),
                        "with dns: the members' port", example=8000)
    refresh: float = setting(Duration(positive=True), "with dns: how often the name is "
                             "resolved", default=10.0)
    template: Backend = setting(Section(Backend), "the members' settings", default=Backend(""),
                                file="")

    def member(self, address: str) -> Backend:
        """The backend at one resolved address (IPv6 in brackets)."""
        host = f"[{address}]" if ":" in address else address
        return dataclasses.replace(self.template, url=f"http://{host}:{self.port}")


def _dns_backend(p: Parser, raw: dict[str, object], path: str) -> DnsBackends | None:
    """``{dns: NAME, port, refresh}`` plus the per-engine settings every member shares."""
    refused = {"url": "an entry has either url or dns, not both",
               "logs": "a log feed is one engine's; a dns entry's members have none"}
    for name, why in refused.items():
        if name in raw:
            p.error(at(path, name), why)
    own = {k: v for k, v in raw.items() if k in ("dns", "port", "refresh")}
    group: DnsBackends | None = Section(DnsBackends).parse(p, own, path)
    shared = {k: v for k, v in raw.items() if k not in own and k not in refused}
    template = Section(Backend).parse(p, {"url": "http://dns.invalid", **shared}, path)
    if group is None or not group.name or not group.port:
        return None
    return dataclasses.replace(group, template=dataclasses.replace(template, url=""))


def _backends(p: Parser, raw: object, path: str) -> tuple[Backend, ...]:
    urls: set[str] = set()
    out: list[Backend] = []
    for i, item in enumerate(p.items(raw, path)):
        if isinstance(item, dict) and "dns" in item:
            continue
        if (backend := _backend(p, item, f"{path}[{i}]")) is not None:
            if backend.url and backend.url in urls:
                p.error(f"{path}[{i}].url", f"duplicate backend url {backend.url!r}")
            urls.add(backend.url)
            out.append(backend)
    return tuple(out)


def _dns_backends(p: Parser, raw: object, path: str) -> tuple[DnsBackends, ...]:
    seen: set[tuple[str, int]] = set()
    out: list[DnsBackends] = []
    for i, item in enumerate(raw if isinstance(raw, list) else []):
        if not (isinstance(item, dict) and "dns" in item):
            continue
        if (group := _dns_backend(p, item, f"{path}[{i}]")) is not None:
            if (group.name, group.port) in seen:
                p.error(f"{path}[{i}].dns",
                        f"duplicate dns backend {group.name!r} port {group.port}")
            seen.add((group.name, group.port))
            out.append(group)
    return tuple(out)


def _dns_document(d: DnsBackends) -> dict[str, Any]:
    engine = Section(Backend).dump(d.template)
    del engine["url"], engine["logs"]
    return {**Section(DnsBackends).dump(d), **engine}


def _backends_schema() -> dict[str, Any]:
    item = Section(Backend).schema()
    item["properties"].update(Section(DnsBackends).schema()["properties"])
    del item["required"]
    return {"type": "array", "items": {**item, "oneOf": [
        {"required": ["url"]}, {"required": ["dns", "port"]}]}}


_URL_ENTRY = Section(Backend)
BACKENDS: Final = Custom("a list of backends", _backends, _backends_schema(),
                         lambda bs: [_URL_ENTRY.dump(b) for b in bs],
                         (("[]", Backend), ("[] (a dns entry)", DnsBackends)))
DNS_BACKENDS: Final = Custom("a list of dns entries", _dns_backends, {},
                             lambda ds: [_dns_document(d) for d in ds])
_LIMIT = "requests a minute (none: unlimited)"


@dataclass(frozen=True, slots=True)
class Key:
    """One API key, stored only as the SHA-256 of the secret; limits of ``None`` are unlimited
    and an empty ``models`` allows every model."""

    name: str = setting(Text(), "the key's name: usage is recorded by it", example="alice")
    sha256: str = setting(SHA256_HEX, "the SHA-256 of the secret (pharos keys new --name NAME)")
    rpm: int | None = setting(_COUNT, _LIMIT, default=None)
    tokens_per_day: int | None = setting(_COUNT, "tokens a day (none: unlimited)",
                                         default=None)
    weight: int = setting(_COUNT, "its share of the fair queue within its tenant",
                          default=DEFAULT_WEIGHT)
    models: tuple[str, ...] = setting(Items(Text()), "models it may use (empty: every one)",
                                      default=())
    admin: bool = setting(Bool(), "whether it may use /admin", default=False)
    tenant: str = setting(Text(), "a name from tenants", default=DEFAULT_TENANT)


def _unique_keys(p: Parser, keys: list[tuple[int, Any]], path: str) -> None:
    names: set[str] = set()
    hashes: dict[str, str] = {}
    for i, key in keys:
        if key.name and key.name in names:
            p.error(f"{path}[{i}].name", f"duplicate key name {key.name!r}")
        names.add(key.name)
        if key.sha256 and key.sha256 in hashes:
            p.error(f"{path}[{i}].sha256",
                    f"duplicate key hash, already used by {hashes[key.sha256]!r}")
        hashes.setdefault(key.sha256, key.name)


@dataclass(frozen=True, slots=True)
class Tenant:
    """A group of keys: its share of the fair queue and its budgets over all its keys."""

    name: str = setting(Text(), "the tenant's name, as keys name it", example="lab")
    weight: int = setting(_COUNT, "its share of the fair queue", default=DEFAULT_WEIGHT)
    rpm: int | None = setting(_COUNT, _LIMIT, default=None)
    tokens_per_day: int | None = setting(_COUNT, "tokens a day (none: unlimited)",
                                         default=None)


def _unique_tenants(p: Parser, tenants: list[tuple[int, Any]], path: str) -> None:
    names: set[str] = set()
    for i, tenant in tenants:
        if tenant.name and tenant.name in names:
            p.error(f"{path}[{i}].name", f"duplicate tenant name {tenant.name!r}")
        names.add(tenant.name)


def _is_zone(name: str) -> bool:
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return False
    return True


_FILE = Text("a file path")


@dataclass(frozen=True, slots=True)
class UsageConfig:
    """Usage accounting: the day's boundary, its history, a journal."""

    timezone: str | None = setting(Text("an IANA time zone name", _is_zone),
                                   "the zone of a day's boundary (none: the host's)",
                                   default=None, example="Europe/Paris")
    retention_days: int = setting(_COUNT, "days of usage kept", default=DEFAULT_RETENTION_DAYS)
    journal: str | None = setting(_FILE, "a file: one JSON line per finished request",
                                  default=None)


@dataclass(frozen=True, slots=True)
class DrainConfig:
    """Shutdown timing in seconds: readiness off, then requests in flight finish."""

    grace: float = setting(Duration(), "readiness is off this long before the listener closes",
                           default=DEFAULT_DRAIN_GRACE)
    timeout: float = setting(Duration(), "the longest requests in flight may take to finish",
                             default=DEFAULT_DRAIN_TIMEOUT)


_POSITIVE = Duration(positive=True)


@dataclass(frozen=True, slots=True)
class Timeouts:
    """The data plane's time limits in seconds."""

    first_byte_generate: float = setting(
        _POSITIVE, "to an engine's first body byte for chat, completions, messages, responses "
        "and generate: a non-streamed reply's first byte is its last", default=600.0,
        file="first_byte.generate", live=True)
    first_byte_embeddings: float = setting(
        _POSITIVE, "to an engine's first body byte for embeddings", default=120.0,
        file="first_byte.embeddings", live=True)
    stream_idle: float = setting(_POSITIVE, "a reply silent this long is cut, as an engine "
                                 "death is", default=120.0, live=True)
    request_headers: float = setting(_POSITIVE, "a client's request head must arrive whole "
                                     "within this", default=DEFAULT_REQUEST_HEADERS)
    queue_stuck: float = setting(_POSITIVE, "requests waiting with no progress this long: "
                                 "/healthz answers 503", default=300.0, live=True)
    request_body: float = setting(_POSITIVE, "a request's body must arrive whole within this "
                                  "of its head", default=DEFAULT_REQUEST_BODY)
    idle: float = setting(_POSITIVE, "a client connection idle this long between requests is "
                          "closed", default=DEFAULT_IDLE)


@dataclass(frozen=True, slots=True)
class DecisionLogConfig:
    """A JSON line per routing decision of the sampled share of requests (by request id), and
    one when each ends."""

    path: str = setting(_FILE, "the JSON lines file", example="/var/log/pharos/decisions.jsonl")
    sample_rate: float = setting(Number("a number above 0, at most 1", above=0, high=1),
                                 "the share of requests logged", default=1.0)


@dataclass(frozen=True, slots=True)
class Observability:
    """Logs of routing decisions and config generations, and who may read ``/metrics``."""

    decision_log: DecisionLogConfig | None = setting(
        Section(DecisionLogConfig), "a JSON line per sampled routing decision (none: off)",
        default=None)
    shadow_log: str | None = setting(_FILE, "JSON lines of every config generation and shadow "
                                     "decision, for pharos replay-shadow (none: off)",
                                     default=None)
    metrics_key: str | None = setting(
        SHA256_HEX, "the SHA-256 of a token that reads /metrics from other hosts (pharos keys "
        "new); an admin key does too; loopback clients need none (none: an admin key, or "
        "loopback only without keys)", default=None, live=True)


def _share(low: float) -> Number:
    return Number(f"a number from {low} to 1.0 or null (off)", low=low, high=1.0)


_GUARD = Bool("true, false or null (off)")
_POLICY = Choice(POLICIES)
#: A split's weights add up to this.
SPLIT_TOTAL: Final = 100


def _split(p: Parser, raw: object, path: str) -> tuple[tuple[str, int], ...] | None:
    """``{policy: weight, ...}`` adding up to 100. None (reported) when anything is wrong: a
    split is applied whole or not at all."""
    if not isinstance(raw, dict) or not raw:
        return p.expected(path, "a mapping of policy to percent", raw)
    arms = []
    for name, weight in raw.items():
        if name not in POLICIES:
            p.error(at(path, name) if isinstance(name, str) else path,
                    f"unknown policy: expected {_POLICY.what}, got {show(name)}")
        elif not is_int(weight) or weight < 0:
            p.expected(at(path, name), "a whole percent >= 0", weight)
        else:
            arms.append((name, weight))
    if len(arms) < len(raw):
        return None
    if (total := sum(w for _, w in arms)) != SPLIT_TOTAL:
        return p.error(path, f"the weights add up to {total}, not {SPLIT_TOTAL}")
    return tuple(arms)


def _shadow(p: Parser, raw: object, path: str) -> tuple[str, ...] | None:
    """``[policy, ...]``: known policies, each once; None (reported) otherwise."""
    if not isinstance(raw, list):
        return p.expected(path, "a list of policies", raw)
    out: list[str] = []
    for i, name in enumerate(raw):
        if _POLICY.parse(p, name, f"{path}[{i}]") is not None and name in out:
            p.error(f"{path}[{i}]", f"{name!r} is listed twice")
        elif name in POLICIES:
            out.append(name)
    return tuple(out) if len(out) == len(raw) else None


SPLIT: Final = Custom("a mapping of policy to percent", _split, {
    "type": "object", "additionalProperties": {"type": "integer", "minimum": 0},
    "propertyNames": {"enum": list(POLICIES)}}, lambda split: dict(split))
SHADOW: Final = Custom("a list of policies", _shadow, {
    "type": "array", "items": {"enum": list(POLICIES)}, "uniqueItems": True})


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    """The cost policy's guards and the prefix index's size; null turns a guard off."""

    bounded_load_epsilon: float | None = setting(
        Number("a number >= 0.0 or null (off)", low=0.0), "a backend more loaded than "
        "(1 + this) times the mean takes no new request", default=BOUNDED_LOAD_EPSILON,
        null=None, live=True)
    kv_pressure_threshold: float = setting(
        _share(0.0), "a backend whose KV cache is fuller than this is avoided",
        default=KV_PRESSURE_THRESHOLD, null=1.0, live=True)
    hot_prefix_utilization: float | None = setting(
        _share(0.01), "a hot prefix spreads to another backend past this utilization",
        default=UTILIZATION, null=None, live=True)
    session_affinity: bool = setting(_GUARD, "a session stays on its backend", default=True,
                                     null=False, live=True)
    eviction_pricing: bool = setting(_GUARD, "price the live prefixes a prompt would push out "
                                     "of a small cache", default=True, null=False, live=True)
    prefix_entries: int = setting(_COUNT, "prefix index entries, 110-140 bytes each",
                                  default=DEFAULT_CAPACITY)
    split: tuple[tuple[str, int], ...] | None = setting(
        SPLIT, "an A/B split of every model without its own: policy to percent, adding up "
        "to 100", default=None, live=True, example={"cost": 90, "least-load": 10})
    shadow: tuple[str, ...] = setting(SHADOW, "policies run beside the routing one, off the "
                                      "request path", default=(), live=True)
    replica_utilization: float | None = setting(
        _share(0.01), "a model warm somewhere gets another host once its slot demand passes "
        "this share of its warm slots", default=REPLICA_UTILIZATION, null=None, live=True)
    load_wait_bound: float = setting(_POSITIVE, "the longest a request waits before a load is "
                                     "allowed for it", default=LOAD_WAIT_BOUND_SEC, live=True)
    swap_grouping: bool = setting(_GUARD, "serve the loaded model's queued requests before a "
                                  "swap", default=True, null=False, live=True)


@dataclass(frozen=True, slots=True)
class Responses:
    """Responses conversation state: ``/v1/responses`` conversations of ``store: true``
    requests, kept in memory, encrypted, for ``previous_response_id``."""

    store: bool = setting(Bool(), "keep conversations and expand previous_response_id",
                          default=False)
    key_file: str | None = setting(_FILE, "the AES-256 key: 32 bytes or 64 hex digits "
                                   "(required with store: true)", default=None)
    max_responses: int = setting(_COUNT, "responses kept at most", default=1_000)
    max_age: float = setting(_POSITIVE, "the longest a response is kept", default=24 * 3600.0)
    max_bytes_per_conversation: int = setting(
        _COUNT, "the plaintext bytes of one conversation, at most", default=256 * 1024)


def _check_responses(p: Parser, m: dict[str, Any], values: dict[str, Any], path: str) -> None:
    if values.get("store") and m.get("key_file") is None:
        p.error(at(path, "key_file"), "required with store: true (a file holding the AES-256 "
                                      "key: openssl rand -hex 32 > FILE)")


def _address(port_required: bool) -> Custom:
    """A peer address: host:port or [ipv6]:port, or (``dns``) a bare host name."""
    what = "host:port" if port_required else "a host name or host:port"

    def read(p: Parser, raw: object, path: str) -> str | None:
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
        return p.expected(path, what, raw)

    return Custom(what, read, {"type": "string"})


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class PeersConfig:
    """The peer mesh; exactly one of ``members`` and ``dns`` is set, and the secret is
    required because peers never run unauthenticated."""

    secret_file: str = setting(Text("a path"), "the file holding the peers' shared secret",
                               example="/run/secrets/pharos-peer")
    listen: Listen = setting(LISTEN, "the peer port's address",
                             default=Listen(DEFAULT_PEER_LISTEN))
    members: tuple[str, ...] = setting(Items(_address(True), min_items=1),
                                       "every instance's peer address", default=(),
                                       example=["pharos-a:8081", "pharos-b:8081"])
    dns: str | None = setting(_address(False), "instead of members: a name resolving to every "
                              "instance (its port: listen's)", default=None)


def _check_peers(p: Parser, m: dict[str, Any], values: dict[str, Any], path: str) -> None:
    has_members, has_dns = m.get("members") is not None, m.get("dns") is not None
    if has_members and has_dns:
        p.error(path, "expected exactly one of members, dns, got both")
    elif not has_members and not has_dns:
        p.error(path, "missing required field: one of members, dns")


def available_cores() -> int:
    """The cores this process may run on (``taskset`` narrows them): what ``workers: auto``
    means."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _workers(p: Parser, raw: object, path: str) -> int | None:
    if raw == "auto":
        return min(available_cores(), MAX_WORKERS)
    if not is_int(raw) or not 1 <= raw <= MAX_WORKERS:
        return p.expected(path, f"an integer from 1 to {MAX_WORKERS} or auto", raw)
    return raw


#: ``models[].cost_model``: the backends' kind, kept as its (a, b, d) terms.
_MODEL_COST: Final = Custom(COST_MODEL.what, lambda p, raw, path: (
    None if (c := COST_MODEL.parse(p, raw, path)) is None else c.terms()), COST_MODEL.schema(),
    lambda terms: dict(zip(COST_MODEL_FIELDS, terms, strict=True)), (("", CostModel),))


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One name for a model that engines serve under others, and its routing. An engine's
    alias is renamed to the name as its snapshots arrive, after the backend's own aliases."""

    name: str = setting(Text(), "what clients ask for", example="llama-8b")
    aliases: tuple[str, ...] = setting(Items(Text()), "the names engines serve it under",
                                       default=(), example=["llama3.1:8b"])
    policy: str | None = setting(_POLICY, "its routing policy (none: the top-level policy)",
                                 default=None, example="least-load")
    #: (policy, weight) in file order, weights adding up to ``SPLIT_TOTAL``.
    split: tuple[tuple[str, int], ...] | None = setting(
        SPLIT, "an A/B split of its requests, by conversation: policy to percent, adding up to "
        "100; not with policy (none: routing.split, unless it has a policy)", default=None,
        example={"cost": 90, "least-load": 10})
    shadow: tuple[str, ...] | None = setting(
        SHADOW, "policies run beside its routing one, off the request path (none: "
        "routing.shadow)", default=None, example=["least-load", "p2c"])
    #: The model's prefill cost (a, b, d) on backends that have no ``cost_model`` of their own.
    cost_model: tuple[float, float, float] | None = setting(
        _MODEL_COST, "its prefill seconds on backends without a cost_model of their own "
        "(none: the learned speed there)", default=None)


def _check_model(p: Parser, m: dict[str, Any], values: dict[str, Any], path: str) -> None:
    """An alias is neither its model's name nor another of its aliases; a model has a policy
    or a split, not both."""
    aliases: list[str] = []
    for j, alias in enumerate(m["aliases"] if isinstance(m.get("aliases"), list) else ()):
        if not isinstance(alias, str) or not alias:
            continue  # reported as not a name
        if alias == values.get("name") or alias in aliases:
            p.error(f"{path}.aliases[{j}]", f"{alias!r} is already this model's name or alias")
        else:
            aliases.append(alias)
    values["aliases"] = tuple(aliases)
    if values.get("policy") is not None and values.get("split") is not None:
        p.error(at(path, "split"), "a model has a policy or a split, not both")


def _unique_models(p: Parser, models: list[tuple[int, Any]], path: str) -> None:
    """Every name and alias used once across the list: else a request's model would depend on
    the order."""
    taken: dict[str, str] = {}  # name or alias -> where it was first used
    for i, model in models:
        named = [(model.name, f"{path}[{i}].name")] if model.name else []
        for n, where in named + [(a, f"{path}[{i}].aliases[{j}]")
                                 for j, a in enumerate(model.aliases)]:
            if n in taken:
                p.error(where, f"{n!r} is already used by {taken[n]}")
            taken.setdefault(n, where)


@dataclass(frozen=True, slots=True)
class Config:
    """The whole config file; ``Config()`` is what an empty file means."""

    listen: Listen = setting(LISTEN, "the public port's address (by default this host "
                             "only; \":8090\": every interface)", default=Listen(DEFAULT_LISTEN))
    policy: Policy = setting(Choice(POLICIES), "the routing policy", default="cost", live=True)
    backends: tuple[Backend, ...] = setting(BACKENDS, "the engines: a url entry each, or a dns "
                                            "entry for every address of a name", default=(),
                                            live=True)
    #: ``backends:`` entries with ``dns:`` instead of ``url:``, kept apart: their members are
    #: known only once resolved (pharos.discovery.dns).
    dns_backends: tuple[DnsBackends, ...] = setting(DNS_BACKENDS, "", default=(),
                                                    file="backends", live=True)
    keys: tuple[Key, ...] = setting(Items(Section(Key), _unique_keys), "API keys (none: no "
                                    "key needed)", default=(), live=True)
    tenants: tuple[Tenant, ...] = setting(Items(Section(Tenant), _unique_tenants), "groups of "
                                          "keys", default=(), live=True)
    state_file: str | None = setting(Text("a path"), "where learned state survives a restart",
                                     default=None, example="/var/lib/pharos/state.json")
    usage: UsageConfig = setting(Section(UsageConfig), "usage accounting", default=UsageConfig())
    drain: DrainConfig = setting(Section(DrainConfig), "shutdown timing", default=DrainConfig())
    peers: PeersConfig | None = setting(Section(PeersConfig, _check_peers), "the peer mesh: "
                                        "instances sharing their view of the engines",
                                        default=None)
    routing: RoutingConfig = setting(Section(RoutingConfig), "the cost policy's guards",
                                     default=RoutingConfig())
    observability: Observability = setting(Section(Observability), "decision and shadow logs",
                                           default=Observability())
    timeouts: Timeouts = setting(Section(Timeouts), "the data plane's time limits",
                                 default=Timeouts())
    workers: int = setting(Custom(f"an integer from 1 to {MAX_WORKERS} or auto", _workers, {
        "oneOf": [{"type": "integer", "minimum": 1, "maximum": MAX_WORKERS}, {"const": "auto"}]}),
        "processes sharing the public port (auto: the cores this process may run on)",
        default=1)
    models: tuple[ModelSpec, ...] = setting(
        Items(Section(ModelSpec, _check_model), _unique_models), "the fleet's models: one name "
        "for engines' names, each model's policy, split, shadow and cost model", default=(),
        live=True)
    responses: Responses = setting(Section(Responses, _check_responses), "Responses "
                                   "conversation state (off by default)", default=Responses())


def _check_config(p: Parser, m: dict[str, Any], values: dict[str, Any], path: str) -> None:
    named = {t.name for t in values.get("tenants", ())} | {DEFAULT_TENANT}
    for i, key in enumerate(values.get("keys", ())):
        if key.tenant not in named:
            p.error(f"keys[{i}].tenant", f"no tenant named {key.tenant!r} in tenants")
    workers = values.get("workers", 1)
    if workers > 1 and values.get("responses", Responses()).store:
        p.error("responses.store", "conversations are kept in one process's memory: not with "
                                   "more than one worker (workers: 1)")
    if workers > 1 and values.get("peers") is not None:
        p.error("workers", "more than one worker with peers: is not supported yet (run one "
                           "worker per instance in a mesh); remove one of them")
    listen = values.get("listen", Listen(DEFAULT_LISTEN))
    if workers > 1 and not listen.strports().startswith(("tcp:", "tcp6:")):
        p.error("workers", f"more than one worker needs a TCP listen address (the workers "
                           f"share its socket), not {listen.address!r}")


CONFIG: Final = Section(Config, _check_config)


def exposure_warning(config: Config) -> str | None:
    """The risk of ``config`` in a line, when it listens beyond this host without keys (a
    start logs it, ``pharos check`` prints it): ``None`` when it does not."""
    if config.keys or config.listen.loopback():
        return None
    return (f"listen {config.listen.address!r} is not loopback and no keys are configured: "
            f"anyone who can reach it may use every model through Pharos without a key; the "
            f"admin routes, /usage, the pages, model management and /metrics answer loopback "
            f"clients only until keys are configured (pharos keys new; docs: Security)")
