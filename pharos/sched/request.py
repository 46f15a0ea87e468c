"""The scheduler's vocabulary: requests, settings, placements, errors and shared constants."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pharos.hot import UTILIZATION
from pharos.placement import ReplicaRule
from pharos.policy import Candidate, Decision, PolicyConfig, RouteReq
from pharos.prefix import EMPTY, Chain, Match

#: Waiters per instance before a new request gets 429.
QUEUE_LIMIT = 1000
#: Slots of a target whose engine and config say nothing: saturated after this many requests
#: or as soon as the engine reports a queue (assumed).
DEFAULT_CAPACITY = 2
#: A Running count above this is no engine's: taken as unknown (a broken metrics page).
MAX_PLAUSIBLE_CAPACITY = 4096
#: Consecutive rounds with an engine queue before its Running is taken as the capacity.
QUEUE_ROUNDS = 2
#: Fleets of fewer targets are decided by the full pass alone: the kept fleet's scan and
#: upkeep cost more than testing a few kept candidates.
FLEET_MIN_TARGETS = 8
#: Where a target's capacity came from (explain, doctor).
CAPACITY_ENGINE, CAPACITY_CONFIG, CAPACITY_LEARNED, CAPACITY_DEFAULT = (
    "engine", "config", "learned", "default")
#: Sessions remembered for affinity (least recently used go first).
SESSIONS = 100_000
#: Engines whose prefix cache serves every request as soon as a prompt is computed, so a
#: prompt is recorded at its reply's first byte: vLLM (live test
#: test_prefix_is_shared_from_the_first_token). llama.cpp and Ollama cache per slot: recorded
#: when the reply ends.
SHARED_CACHE_KINDS = frozenset({"vllm"})
#: A peer's gauges count until it has been silent this long.
PEER_SILENCE_SEC = 2.0
#: Waiters behind a blocked head that swap grouping tries (``WaitQueue.serve``).
PASS_LIMIT = 64
#: The longest pacing holds a target for a key over its share after a streamed request was
#: sent there, if no first byte comes sooner (an engine that stalls is the watchdog's).
#: Assumed. A reply that is not streamed holds nothing: its first byte is its last, and a
#: predicted TTFT in its place would throttle the flooding key wherever it is long.
PACE_MAX_SEC = 2.0

#: A waiter's target set (model, engine kind, targets excluded): the same set, the same slots.
Selection = tuple[str, str | None, frozenset[int]]


class UnknownModel(Exception):
    """No backend has ever listed the model (404)."""


class Unavailable(Exception):
    """Backends list the model, but none of them is up (503)."""


class QueueFull(Exception):
    """The fair queue is at its limit (429)."""


@dataclass(frozen=True, slots=True)
class SchedRequest:
    """What the scheduler needs of one request; ``exclude`` holds targets already tried."""

    model: str
    prompt_tokens: int
    seed: int
    exclude: frozenset[int] = frozenset()
    kind: str | None = None  # only backends of this kind (Ollama's native routes)
    chain: Chain = EMPTY  # the prompt's prefix chain (empty: no prediction)
    session: int | None = None  # the conversation it names (x-session-id or ``user``), hashed
    output_tokens: int | None = None  # the client's output limit (max_tokens), if it set one
    stream: bool = False  # its reply is streamed: its first byte ends its prefill (pacing)
    #: The policy routing it (its model's, or its A/B arm: ``pharos.models``); None: the
    #: scheduler's. A retry carries the same, so it stays on its arm.
    policy: PolicyConfig | None = None


@dataclass(frozen=True, slots=True)
class Guards:
    """The scheduler's side of the load guards; the policy's are in ``PolicyConfig``."""

    #: A root prefix gets another owner once it would keep one owner busier than this; None:
    #: no spreading.
    hot_prefix_utilization: float | None = UTILIZATION
    sessions: int = SESSIONS
    #: Price the live roots a prompt would push out of the only cache holding them
    #: (``pharos.retention``); False: off.
    eviction_pricing: bool = True
    #: Model placement (``pharos.placement.ReplicaRule``; the cost policy only).
    placement: ReplicaRule = field(default_factory=ReplicaRule)


@dataclass(frozen=True, slots=True)
class RouteSettings:
    """The routing settings a reload may change, swapped whole (``Scheduler.reconfigure``)
    so a decision never reads a mix. ``model_costs``: each model's prefill cost model
    (``models[].cost_model``), for backends that have none of their own."""

    policy: PolicyConfig
    guards: Guards = field(default_factory=Guards)
    model_costs: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Placement:
    """A decision with what went into it (for the lease, explain and tests)."""

    decision: Decision
    candidates: tuple[Candidate, ...]
    cold: dict[int, bool]
    matches: dict[int, Match]  # the index's prediction per target (before hot pricing)
    hot_owners: frozenset[int]  # targets priced as holding a hot root they do not hold
    affinity: int | None  # the session's last target, if any
    route: RouteReq | None = None  # what the policy was given (shadow policies replay it)

