"""``/metrics``: Pharos's series in Prometheus's text format.

``Metrics`` subscribes to the proxy's ``on_done`` and the state's ``on_decision`` and keeps
plain in-memory counters and histograms: recording a request is a few dict increments, no
lock, no prometheus-client object on the hot path. A scrape runs one custom collector over a
private ``CollectorRegistry`` that copies those counters and reads the state as it is now, so
a removed backend's series are gone and a scrape sees one instant (the collector never
yields). ``MetricsPage`` serves it synchronously (``prometheus_client.twisted`` imports the
global reactor and collects in a thread).

Label values are bounded: ``key`` is a configured key name (``anonymous`` without keys,
``none`` without a valid key), ``model`` a model some backend listed, else ``unknown`` (a
million made-up names make one series), and ``stage``/``outcome`` come from ``DECISIONS``.
Escaping of what remains is prometheus-client's.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from twisted.web.resource import Resource
from twisted.web.server import Request

from pharos.engine.signals import Residency
from pharos.journal import Journal
from pharos.peer.node import PeerNode
from pharos.proxy.done import DECISIONS, Done
from pharos.sched import Scheduler
from pharos.state.registry import BackendState
from pharos.state.state import State


class ShadowCounts(Protocol):
    """What the shadow series read (``pharos.shadow.Shadow``)."""

    @property
    def tallies(self) -> Mapping[tuple[str, str, str], Any]: ...

    @property
    def errors(self) -> Mapping[str, int]: ...

    @property
    def dropped(self) -> int: ...


#: The ``model`` label of a model no backend has listed; the ``key`` label without a key.
UNKNOWN_MODEL: Final = "unknown"
NO_KEY: Final = "none"

#: Histogram buckets, seconds. TTFT spans a cached prompt on a GPU to a cold load on CPU.
TTFT_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Pharos's own time against its 2 ms p99 budget.
OVERHEAD_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1)
QUEUE_BUCKETS: Final = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)


class Histogram:
    """A Prometheus histogram's state: per-bucket counts (the last one +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> tuple[list[tuple[str, float]], float]:
        """Buckets as ``(le, cumulative count)`` with +Inf, and the sum."""
        out: list[tuple[str, float]] = []
        total = 0
        for bound, n in zip((*map(repr, self.bounds), "+Inf"), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out, self.sum


class Metrics(Collector):
    """The in-memory counters (fed by ``done`` and ``decision``) and the collector that
    exposes them with the state's gauges."""

    def __init__(self, state: State, sched: Scheduler, *, shadow: ShadowCounts | None = None,
                 peers: PeerNode | None = None,
                 journals: Mapping[str, Journal] | None = None) -> None:
        self.state = state
        self.sched = sched
        self.requests: Counter[tuple[str, str, str]] = Counter()
        self.tokens: Counter[tuple[str, str, str]] = Counter()
        self.unmetered: Counter[tuple[str, str]] = Counter()
        self.decisions: Counter[tuple[str, str]] = Counter(
            {(stage, o): 0 for stage, outcomes in DECISIONS.items() for o in outcomes})
        self.ttft: dict[str, Histogram] = {}
        self.est_ttft: dict[str, Histogram] = {}
        self.overhead = Histogram(OVERHEAD_BUCKETS)
        self.queue_wait: dict[str, Histogram] = {}
        self._known: set[str] = set()  # models some backend listed (labels as themselves)
        #: The peer node, when peers are configured (its series are absent otherwise).
        self.peers = peers
        #: The journals (usage journal, decision log) by name, when configured: what each
        #: dropped (its buffer full: the disk fell behind) or failed to write is counted.
        self.journals = dict(journals or {})
        #: Requests and TTFT by the policy that routed them (an A/B split's arms side by
        #: side), and the shadow policies' counts when set (``pharos.shadow``).
        self.by_policy: Counter[tuple[str, str, str]] = Counter()
        self.policy_ttft: dict[str, Histogram] = {}
        self.shadow = shadow
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def model_label(self, model: str, served: bool) -> str:
        """``model`` when a backend lists (or listed) it, else ``unknown``."""
        if model in self._known:
            return model
        if model and (served or self.state.listed_anywhere(model)):
            self._known.add(model)
            return model
        return UNKNOWN_MODEL

    def done(self, d: Done) -> None:
        """One finished request (an ``on_done`` subscriber)."""
        key = d.key if d.key is not None else NO_KEY
        model = self.model_label(d.model, d.target is not None)
        self.requests[(key, model, str(d.status))] += 1
        if d.policy is not None:
            self.by_policy[(d.policy, model, str(d.status))] += 1
            if d.ttft is not None:
                ph = self.policy_ttft.get(d.policy)
                if ph is None:
                    ph = self.policy_ttft[d.policy] = Histogram(TTFT_BUCKETS)
                ph.observe(d.ttft)
        decisions = self.decisions
        for pair in d.decisions:
            decisions[pair] += 1
        if d.target is not None:
            if d.metered:
                tokens = self.tokens
                tokens[(key, model, "prompt")] += d.prompt_tokens or 0
                tokens[(key, model, "cached")] += d.cached_tokens or 0
                tokens[(key, model, "completion")] += d.completion_tokens or 0
            elif d.status < 400:
                self.unmetered[(key, model)] += 1
        if d.ttft is not None:
            h = self.ttft.get(model)
            if h is None:
                h = self.ttft[model] = Histogram(TTFT_BUCKETS)
            h.observe(d.ttft)
            if d.est_ttft is not None:
                h = self.est_ttft.get(model)
                if h is None:
                    h = self.est_ttft[model] = Histogram(TTFT_BUCKETS)
                h.observe(d.est_ttft)
        if d.overhead is not None:
            self.overhead.observe(d.overhead)
            if d.queue_wait is not None:
                h = self.queue_wait.get(key)
                if h is None:
                    h = self.queue_wait[key] = Histogram(QUEUE_BUCKETS)
                h.observe(d.queue_wait)

    def decision(self, backend: BackendState, stage: str, outcome: str) -> None:
        """A background round's decision (``State.on_decision``)."""
        self.decisions[(stage, outcome)] += 1

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterator[Metric]:
        """Every series, read from memory now (no I/O, no yield to the reactor)."""
        yield from self._requests()
        yield from self._histograms()
        yield from self._backends()
        yield from self._targets()
        yield from self._scheduler()
        if self.peers is not None:
            yield from self._peers(self.peers)
        if self.journals:
            yield from self._journals()
        yield from self._policies()

    def _policies(self) -> Iterator[Metric]:
        m = CounterMetricFamily("pharos_policy_requests", "Finished requests by the policy "
                                "that routed them (a split's arm), model and status.",
                                labels=("policy", "model", "status"))
        for labels, n in sorted(self.by_policy.items()):
            m.add_metric(labels, n)
        yield m
        h = HistogramMetricFamily("pharos_policy_ttft_seconds", "Time to the engine's first "
                                  "byte by the policy that routed the request.",
                                  labels=("policy",))
        for name, hist in sorted(self.policy_ttft.items()):
            buckets, total = hist.cumulative()
            h.add_metric((name,), buckets, total)
        yield h
        shadow = self.shadow
        if shadow is None:
            return
        decisions = CounterMetricFamily("pharos_shadow_decisions", "Shadow decisions by model, "
                                        "routing policy, shadow policy and whether the shadow "
                                        "picked the same target.",
                                        labels=("model", "policy", "shadow", "agree"))
        gain = CounterMetricFamily("pharos_shadow_gain_seconds", "The cost model's estimate "
                                   "for the routing pick less its estimate for the shadow's "
                                   "(summed; positive: the shadow's target looked faster).",
                                   labels=("model", "policy", "shadow"))
        for (model, policy, name), t in sorted(shadow.tallies.items()):
            decisions.add_metric((model, policy, name, "true"), t.agree)
            decisions.add_metric((model, policy, name, "false"), t.decisions - t.agree)
            gain.add_metric((model, policy, name), t.gain_sum)
        errors = CounterMetricFamily("pharos_shadow_errors", "Shadow policies that raised "
                                     "(the request was not affected).", labels=("shadow",))
        for name, n in sorted(shadow.errors.items()):
            errors.add_metric((name,), n)
        dropped = CounterMetricFamily("pharos_shadow_dropped", "Decisions not shadowed: the "
                                      "shadow queue was full.")
        dropped.add_metric((), shadow.dropped)
        yield from (decisions, gain, errors, dropped)

    def _journals(self) -> Iterator[Metric]:
        dropped = CounterMetricFamily("pharos_journal_dropped_records", "Records a journal "
                                      "dropped rather than wait: its buffer was full (the disk "
                                      "fell behind) or it was closed.", labels=("journal",))
        failed = CounterMetricFamily("pharos_journal_failed_records", "Records a journal "
                                     "could not write (a failed batch, or not serializable).",
                                     labels=("journal",))
        for name, journal in sorted(self.journals.items()):
            dropped.add_metric((name,), journal.dropped)
            failed.add_metric((name,), journal.failed)
        yield from (dropped, failed)

    def _requests(self) -> Iterator[Metric]:
        m = CounterMetricFamily("pharos_requests", "Finished requests by key, model and the "
                                "status the client got (499: the client left first).",
                                labels=("key", "model", "status"))
        for labels, n in sorted(self.requests.items()):
            m.add_metric(labels, n)
        yield m
        m = CounterMetricFamily("pharos_tokens", "Tokens of this instance's replies by key, "
                                "model and type (prompt, cached, completion).",
                                labels=("key", "model", "type"))
        for labels, n in sorted(self.tokens.items()):
            m.add_metric(labels, n)
        yield m
        m = CounterMetricFamily("pharos_unmetered_requests", "Replies that reached the client "
                                "without usage Pharos could read.", labels=("key", "model"))
        for labels2, n in sorted(self.unmetered.items()):
            m.add_metric(labels2, n)
        yield m
        m = CounterMetricFamily("pharos_decisions", "Every branch a request or a background "
                                "round took (spec section 13's table).",
                                labels=("stage", "outcome"))
        for labels2, n in sorted(self.decisions.items()):
            m.add_metric(labels2, n)
        yield m

    def _histograms(self) -> Iterator[Metric]:
        def family(name: str, doc: str, by: str | None,
                   hists: dict[str, Histogram]) -> HistogramMetricFamily:
            m = HistogramMetricFamily(name, doc, labels=(by,) if by else ())
            for label, h in sorted(hists.items()):
                buckets, total = h.cumulative()
                m.add_metric((label,) if by else (), buckets, total)
            return m

        yield family("pharos_ttft_seconds", "Time to the engine's first byte, from the send "
                     "of the attempt that answered.", "model", self.ttft)
        yield family("pharos_estimated_ttft_seconds", "The policy's TTFT estimate for the "
                     "target that answered (the same requests as pharos_ttft_seconds).",
                     "model", self.est_ttft)
        yield family("pharos_overhead_seconds", "Pharos's own time before the first upstream "
                     "send (auth, admission, body, prefix lookup, routing; queue wait "
                     "excluded).", None, {"": self.overhead})
        yield family("pharos_queue_wait_seconds", "Time a request that reached an engine "
                     "spent in the fair queue (0: straight through).", "key", self.queue_wait)

    def _backends(self) -> Iterator[Metric]:
        state = self.state
        now = state.clock.seconds()
        up = GaugeMetricFamily("pharos_backend_up", "1 while the backend answers its "
                               "scrapes and is not ejected.",
                               labels=("backend", "kind", "version"))
        probes = GaugeMetricFamily("pharos_backend_probes_active", "Probes in the backend's "
                                   "resolved plan (a change after an upgrade is engine "
                                   "drift).", labels=("backend",))
        for url, b in sorted(state.backends.items()):
            up.add_metric((url, b.kind or "unknown", b.version or "unknown"),
                          1 if state.is_up(b, now) else 0)
            if b.plan is not None:
                probes.add_metric((url,), len(b.plan.active))
        yield up
        yield probes

    def _targets(self) -> Iterator[Metric]:
        state, sched = self.state, self.sched
        labels = ("backend", "model")
        inflight = GaugeMetricFamily("pharos_target_inflight", "Requests this instance has "
                                     "on the target now.", labels=labels)
        unknown = GaugeMetricFamily("pharos_target_signals_unknown", "How many of residency, "
                                    "running, waiting, capacity and KV usage are unknown now.",
                                    labels=labels)
        capacity = GaugeMetricFamily("pharos_target_capacity", "The target's capacity in "
                                     "requests and where it came from (engine, config, "
                                     "learned).", labels=(*labels, "source"))
        prefill = GaugeMetricFamily("pharos_target_prefill_seconds_per_token", "Learned "
                                    "prefill seconds per uncached prompt token.", labels=labels)
        load = GaugeMetricFamily("pharos_target_load_seconds", "Learned model load seconds.",
                                 labels=labels)
        service = GaugeMetricFamily("pharos_target_service_seconds", "Learned seconds per "
                                    "request (warm).", labels=labels)
        backends = state.backends
        for t in state.targets:
            b = t.backend
            if backends.get(b.url) is not b:
                continue  # a removed backend's targets go with it
            lv = (b.url, t.model)
            v = state.view(t)
            inflight.add_metric(lv, t.inflight)
            unknown.add_metric(lv, (v.residency is Residency.UNKNOWN) + (v.running is None)
                               + (v.waiting is None) + (v.capacity is None)
                               + (v.kv_usage is None))
            cap, source = sched.capacity_of(t)
            if cap is not None:
                capacity.add_metric((*lv, source), cap)
            for family, ewma in ((prefill, t.stats.prefill_sec_per_token),
                                 (load, t.stats.load_sec), (service, t.stats.service_sec)):
                if ewma.value is not None:
                    family.add_metric(lv, ewma.value)
        yield from (inflight, unknown, capacity, prefill, load, service)

    def _scheduler(self) -> Iterator[Metric]:
        sched = self.sched
        waiting = GaugeMetricFamily("pharos_queue_waiting", "Requests in the fair queue now.")
        waiting.add_metric((), sched.waiting)
        yield waiting
        paced = CounterMetricFamily("pharos_queue_paced", "Grants held back until the "
                                    "prefills already sent to the target started: a key over "
                                    "its share while one under its share is active.")
        paced.add_metric((), sched.queue.paced)
        yield paced
        m = CounterMetricFamily("pharos_prefix_predictions", "Prefix decisions of requests "
                                "that had a prediction, by where the predicting slot came "
                                "from (local, peer, restored).", labels=("source", "outcome"))
        for (source, outcome), n in sorted(sched.predictions.items()):
            m.add_metric((source, outcome), n)
        yield m
        m = CounterMetricFamily("pharos_prefix_unfollowed", "Requests on a chained route the "
                                "prefix index could not follow, by reason.", labels=("reason",))
        for reason, n in sorted(sched.unfollowed.items()):
            m.add_metric((reason,), n)
        yield m

    @staticmethod
    def _peers(node: PeerNode) -> Iterator[Metric]:
        """Per peer member: when it was last heard from (absent until it answered), whether
        it speaks another wire proto or shares state under another fingerprint; the ops its
        full pending list dropped; deltas this instance refused, by reason."""
        heard = GaugeMetricFamily("pharos_peer_last_heard_timestamp_seconds",
                                  "Unix time of the last successful exchange with the peer",
                                  labels=["peer"])
        proto = GaugeMetricFamily("pharos_peer_proto_mismatch",
                                  "1 when the peer answered 409: another wire proto",
                                  labels=["peer"])
        fp = GaugeMetricFamily("pharos_peer_fingerprint_mismatch",
                               "1 when the peer's backends, keys or usage zone differ",
                               labels=["peer"])
        dropped = CounterMetricFamily("pharos_peer_dropped_prefix_ops",
                                      "Prefix ops dropped on the peer's full pending list",
                                      labels=["peer"])
        for p in node.peers.values():
            if p.myself:
                continue
            if p.heard_at is not None:
                heard.add_metric([p.member], p.heard_at)
            proto.add_metric([p.member], float(p.proto_mismatch))
            fp.add_metric([p.member], float(p.origin in node.fingerprint_mismatch))
            dropped.add_metric([p.member], p.dropped_ops)
        refused = CounterMetricFamily("pharos_peer_deltas_refused",
                                      "Peer deltas (or parts) refused, by reason",
                                      labels=["reason"])
        for reason in ("garbage", "proto", "malformed", "snapshot"):
            refused.add_metric([reason], node.refused.get(reason, 0))
        yield from (heard, proto, fp, dropped, refused)

    def exposition(self) -> bytes:
        """The text format, as a scrape gets it."""
        return generate_latest(self.registry)


class MetricsPage(Resource):
    """``GET /metrics``: no key needed; synchronous, one collect per scrape."""

    isLeaf = True

    def __init__(self, metrics: Metrics) -> None:
        super().__init__()
        self.metrics = metrics

    def render_GET(self, request: Request) -> bytes:
        body = self.metrics.exposition()
        request.setHeader(b"content-type", CONTENT_TYPE_LATEST.encode())
        request.setHeader(b"content-length", b"%d" % len(body))
        return body

    def render_HEAD(self, request: Request) -> bytes:
        return self.render_GET(request)
