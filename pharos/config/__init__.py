"""The config file: YAML in, frozen dataclasses out (``pharos.config.model``), and what is
generated from them (``pharos.config.describe``)."""

from pharos.config.kinds import ConfigError, parse_duration
from pharos.config.load import (
    LIVE_FIELDS,
    Reloaded,
    file_name,
    load_config,
    parse_config,
    read_peer_secret,
    reload_diff,
    with_live,
)
from pharos.config.model import (
    BACKEND_KINDS,
    COST_MODEL_FIELDS,
    DEFAULT_DRAIN_GRACE,
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_IDLE,
    DEFAULT_REQUEST_BODY,
    DEFAULT_REQUEST_HEADERS,
    DEFAULT_RETENTION_DAYS,
    DEFAULT_TENANT,
    DEFAULT_WEIGHT,
    LISTEN_BACKLOG,
    MAX_WORKERS,
    POLICIES,
    Backend,
    BackendKind,
    Config,
    CostModel,
    DecisionLogConfig,
    DnsBackends,
    DrainConfig,
    Key,
    Listen,
    ModelSpec,
    Observability,
    PeersConfig,
    Policy,
    Responses,
    RoutingConfig,
    Tenant,
    Timeouts,
    UsageConfig,
    available_cores,
    backend_url,
    exposure_warning,
)
from pharos.config.probes import DEFAULT_SCALE, SCALES, LogFeed, LogSpec, OwnProbe, PromSpec

__all__ = [
    "BACKEND_KINDS", "COST_MODEL_FIELDS", "DEFAULT_DRAIN_GRACE", "DEFAULT_DRAIN_TIMEOUT",
    "DEFAULT_IDLE", "DEFAULT_REQUEST_BODY", "DEFAULT_REQUEST_HEADERS", "DEFAULT_RETENTION_DAYS",
    "DEFAULT_SCALE", "DEFAULT_TENANT", "DEFAULT_WEIGHT", "LISTEN_BACKLOG", "LIVE_FIELDS",
    "MAX_WORKERS", "POLICIES", "SCALES", "Backend", "BackendKind", "Config", "ConfigError",
    "CostModel", "DecisionLogConfig", "DnsBackends", "DrainConfig", "Key", "Listen", "LogFeed",
    "LogSpec", "ModelSpec", "Observability", "OwnProbe", "PeersConfig", "Policy", "PromSpec",
    "Reloaded", "Responses", "RoutingConfig", "Tenant", "Timeouts", "UsageConfig",
    "available_cores", "backend_url", "exposure_warning", "file_name", "load_config",
    "parse_config", "parse_duration", "read_peer_secret", "reload_diff", "with_live",
]
