"""The scheduler: admission, occupancy, the per-key fair queue and leases, as parts composed
into ``Scheduler``: the wait queue (``queue``), each target's candidate (``candidates``),
placement memory (``hosts``), the prefix index and what replies teach (``learning``) and the
peers' requests in flight (``peers``); ``pharos.policy`` decides.
"""

from pharos.sched.candidates import Candidates, with_match
from pharos.sched.hosts import Hosts, max_loaded, names_victims
from pharos.sched.learning import HOT_MIN_TOKENS, REPROBE_ROUNDS, Learning
from pharos.sched.lease import Lease, LeaseOwner
from pharos.sched.peers import MAX_GAUGE_ENTRIES, GaugeError, PeerGauges, PeerLoad
from pharos.sched.queue import Waiter, WaitQueue, request_cost
from pharos.sched.request import (
    CAPACITY_CONFIG,
    CAPACITY_DEFAULT,
    CAPACITY_ENGINE,
    CAPACITY_LEARNED,
    DEFAULT_CAPACITY,
    FLEET_MIN_TARGETS,
    PACE_MAX_SEC,
    PEER_SILENCE_SEC,
    QUEUE_LIMIT,
    Guards,
    Placement,
    QueueFull,
    RouteSettings,
    SchedRequest,
    Unavailable,
    UnknownModel,
)
from pharos.sched.scheduler import Scheduler

__all__ = [
    "CAPACITY_CONFIG", "CAPACITY_DEFAULT", "CAPACITY_ENGINE", "CAPACITY_LEARNED",
    "DEFAULT_CAPACITY", "FLEET_MIN_TARGETS", "HOT_MIN_TOKENS", "MAX_GAUGE_ENTRIES",
    "PACE_MAX_SEC", "PEER_SILENCE_SEC", "QUEUE_LIMIT", "REPROBE_ROUNDS", "Candidates",
    "GaugeError", "Guards", "Hosts", "Learning", "Lease", "LeaseOwner", "PeerGauges", "PeerLoad",
    "Placement", "QueueFull", "RouteSettings", "SchedRequest", "Scheduler", "Unavailable",
    "UnknownModel", "WaitQueue", "Waiter", "max_loaded", "names_victims", "request_cost",
    "with_match",
]
