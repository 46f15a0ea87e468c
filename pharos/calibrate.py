"""``pharos calibrate``: fit an idle engine's prefill cost model from its own timings.

The cost model prices ``u`` uncached tokens after ``c`` cached ones at ``P(u, c) = a·u +
b·u·(c + u/2) + d`` seconds. Prompts of known cached and uncached length go one at a time,
timed by the engine's *own* numbers so network and HTTP time stay out of the fit:

- vLLM: the ``vllm:request_prefill_time_seconds`` histogram's sum and count, read before and
  after each probe, cached tokens from ``vllm:prompt_tokens_cached_total``
  (``fixtures/vllm/0.32.0/prefix/metrics``);
- llama.cpp: the reply's ``timings.prompt_ms``, ``prompt_n`` and ``cache_n``
  (``fixtures/llamacpp/b11312/idle/streams/completion.body``);
- Ollama: the native reply's ``prompt_eval_duration`` (nanoseconds, the uncached part only) and
  ``prompt_eval_count`` (the whole prompt), with ``prompt_eval_cached_count`` where the engine
  sends it (FACTS.md, Ollama), else the cached part taken as the prefix probe's count.

The fit is a non-negative least squares (``nnls``: exact for three terms). Every run sends
fresh prompts from its own seed, so nothing cached earlier is mistaken for work. A busy
engine is waited for (``--busy-wait``) and then refused; a probe another request disturbed
(vLLM's count moved by more than one) is sent again once; a probe whose numbers cannot be
true is refused with what it said, and too few good probes fail the run rather than fit
noise.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from pharos.config import COST_MODEL_FIELDS
from pharos.engine.fetch import Fetched, Fetcher, FetchError, HTTPFetcher, make_client
from pharos.engine.library import AUTO, LLAMACPP, OLLAMA, VLLM
from pharos.engine.plan import DetectionFailed, detect_kind
from pharos.engine.probes import prom_samples

#: The engine kinds that report a per-request prefill time calibration can read.
SUPPORTED = (VLLM, LLAMACPP, OLLAMA)
#: Cached and uncached prompt lengths probed by default, in tokens (about 4 bytes each).
DEFAULT_CACHED = (0, 1024, 3072)
DEFAULT_UNCACHED = (128, 512, 2048)
#: Good probes below this are too few to fit three terms through noise.
MIN_SAMPLES = 5
#: Seconds between looks at a busy engine.
BUSY_POLL = 0.5
#: The cost model's keys in a config file (``backends[].cost_model``).
COST_MODEL_KEYS = COST_MODEL_FIELDS

_WORDS = ("amber", "basin", "cobalt", "delta", "ember", "fjord", "granite", "harbor", "indigo",
          "juniper", "kestrel", "lagoon", "meadow", "nectar", "orchid", "pebble", "quartz",
          "raven", "saffron", "tundra", "umber", "velvet", "willow", "xenon", "yarrow", "zephyr",
          "anchor", "bramble", "cinder", "dune")


class CalibrationError(Exception):
    """The engine cannot be calibrated now; the message says why."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One probe: tokens computed and found cached, the engine's prefill seconds, and the
    seconds the whole request took as the client saw it."""

    uncached: int
    cached: int
    engine_sec: float
    wall_sec: float


@dataclass(frozen=True, slots=True)
class Fit:
    """``P(u, c) = a·u + b·u·(c + u/2) + d``, every term non-negative."""

    a: float
    b: float
    d: float
    rms_sec: float
    r2: float | None  # None: the probes' times do not vary

    def predict(self, uncached: int, cached: int) -> float:
        """The fitted prefill seconds."""
        u = uncached
        return self.a * u + self.b * u * (cached + u / 2) + self.d


def _features(s: Sample) -> tuple[float, float, float]:
    u = float(s.uncached)
    return (u, u * (s.cached + u / 2), 1.0)


def _solve(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float] | None:
    """Least squares on the normal equations (Gauss-Jordan with partial pivoting); None when
    the columns are dependent."""
    n = len(rows[0])
    m = [[sum(r[i] * r[j] for r in rows) for j in range(n)]
         + [sum(r[i] * y for r, y in zip(rows, ys, strict=True))] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda k: abs(m[k][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for k in range(n):
            if k != col:
                f = m[k][col] / m[col][col]
                m[k] = [x - f * p for x, p in zip(m[k], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def nnls(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """Non-negative least squares for a handful of columns: the best unconstrained fit over
    every subset of columns that comes out non-negative (exact: the optimum has some active
    set). Columns are scaled to unit norm first."""
    n = len(rows[0])
    norms = [max(sum(r[j] ** 2 for r in rows) ** 0.5, 1e-300) for j in range(n)]
    scaled = [[r[j] / norms[j] for j in range(n)] for r in rows]
    best: tuple[float, list[float]] = (sum(y * y for y in ys), [0.0] * n)
    for k in range(1, n + 1):
        for cols in combinations(range(n), k):
            sol = _solve([[r[j] for j in cols] for r in scaled], ys)
            if sol is None or any(x < 0 for x in sol):
                continue
            coef = [0.0] * n
            for j, x in zip(cols, sol, strict=True):
                coef[j] = x
            err = sum((y - sum(c * v for c, v in zip(coef, r, strict=True))) ** 2
                      for r, y in zip(scaled, ys, strict=True))
            if err < best[0] - 1e-18:
                best = (err, coef)
    return [c / norms[j] for j, c in enumerate(best[1])]


def fit(samples: Sequence[Sample]) -> Fit:
    """The cost model through ``samples`` (at least ``MIN_SAMPLES``)."""
    if len(samples) < MIN_SAMPLES:
        raise CalibrationError(f"{len(samples)} good probes; a fit needs {MIN_SAMPLES}")
    if len({(s.uncached, s.cached) for s in samples}) < 3:
        raise CalibrationError("the probes cover fewer than 3 distinct (uncached, cached) "
                               "lengths: the engine counted every prompt alike")
    rows = [_features(s) for s in samples]
    ys = [s.engine_sec for s in samples]
    a, b, d = nnls(rows, ys)
    got = Fit(a, b, d, 0.0, None)
    resid = [y - got.predict(s.uncached, s.cached) for s, y in zip(samples, ys, strict=True)]
    rms = (sum(r * r for r in resid) / len(resid)) ** 0.5
    mean = sum(ys) / len(ys)
    total = sum((y - mean) ** 2 for y in ys)
    r2 = 1 - sum(r * r for r in resid) / total if total > 0 else None
    return Fit(a, b, d, rms, r2)


class Prompts:
    """Fresh prompt text from a seed: words, about ``BYTES_PER_TOKEN`` bytes a token, and a
    run tag first so no two runs (or prefixes) share a cached block."""

    BYTES_PER_TOKEN = 4

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._n = 0
        self.seed = seed

    def text(self, tokens: int) -> str:
        self._n += 1
        head = f"calibration {self.seed} part {self._n}: "
        words = [head]
        size = len(head)
        want = max(tokens, 1) * self.BYTES_PER_TOKEN
        while size < want:
            w = self._rng.choice(_WORDS) + " "
            words.append(w)
            size += len(w)
        return "".join(words)[:want]


@dataclass(frozen=True, slots=True)
class Probe:
    """What one request to the engine told: tokens, engine seconds (None: not reported)."""

    prompt_tokens: int | None
    cached_tokens: int | None
    engine_sec: float | None
    disturbed: bool = False


class Engine:
    """One engine kind's way to send a probe and read its numbers; ``busy`` says what is
    running (None: idle, or the kind cannot tell)."""

    kind = ""

    def __init__(self, fetcher: HTTPFetcher, model: str, timeout: float,
                 clock: IReactorTime) -> None:
        self.fetcher = fetcher
        self.model = model
        self.timeout = timeout
        self.clock = clock
        #: Seconds the last probe's generation request took, as the client saw it.
        self.last_wall = 0.0

    async def busy(self) -> str | None:
        return None

    async def probe(self, prompt: str) -> Probe:
        raise NotImplementedError

    async def _post(self, path: str, doc: Mapping[str, Any]) -> dict[str, Any]:
        start = self.clock.seconds()
        got = await self.fetcher.post(path, json.dumps(doc).encode(), self.timeout)
        self.last_wall = self.clock.seconds() - start
        if got.status != 200:
            raise CalibrationError(f"POST {path} answered {got.status}: "
                                   f"{got.body[:200].decode('utf-8', 'replace')}")
        try:
            reply = json.loads(got.body)
        except ValueError as e:
            raise CalibrationError(f"POST {path}: the reply is not JSON ({e})") from None
        if not isinstance(reply, dict):
            raise CalibrationError(f"POST {path}: the reply is not a JSON object")
        return reply


def _num(doc: Mapping[str, Any], *path: str) -> float | None:
    cur: Any = doc
    for p in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(p)
    return float(cur) if isinstance(cur, (int, float)) and not isinstance(cur, bool) else None


class VllmEngine(Engine):
    kind = VLLM

    async def _metrics(self) -> dict[str, float]:
        got = await self.fetcher.fetch("/metrics")
        if got.status != 200:
            raise CalibrationError(f"GET /metrics answered {got.status}")
        out: dict[str, float] = {}
        for name, samples in prom_samples(got.body).items():
            out[name] = sum(value for _, value in samples)
        return out

    async def busy(self) -> str | None:
        m = await self._metrics()
        running = m.get("vllm:num_requests_running", 0.0) + m.get(
            "vllm:num_requests_waiting", 0.0)
        return f"{running:g} requests running or waiting" if running else None

    async def probe(self, prompt: str) -> Probe:
        before = await self._metrics()
        if "vllm:request_prefill_time_seconds_sum" not in before:
            raise CalibrationError("the engine's /metrics has no "
                                   "vllm:request_prefill_time_seconds histogram")
        await self._post("/v1/completions", {"model": self.model, "prompt": prompt,
                                             "max_tokens": 1, "temperature": 0})
        after = await self._metrics()

        def delta(name: str) -> float | None:
            if name not in before or name not in after:
                return None
            return after[name] - before[name]

        count = delta("vllm:request_prefill_time_seconds_count")
        total = delta("vllm:prompt_tokens_total")
        cached = delta("vllm:prompt_tokens_cached_total")
        if cached is None:
            cached = delta("vllm:prefix_cache_hits_total")
        return Probe(None if total is None else int(total),
                     None if cached is None else int(cached),
                     delta("vllm:request_prefill_time_seconds_sum"),
                     disturbed=count != 1)


class LlamacppEngine(Engine):
    kind = LLAMACPP

    async def busy(self) -> str | None:
        try:
            got = await self.fetcher.fetch("/slots")
        except FetchError:
            return None
        if got.status != 200:
            return None  # --no-slots: the kind cannot tell
        try:
            slots = json.loads(got.body)
        except ValueError:
            return None
        n = sum(1 for s in slots if isinstance(s, dict) and s.get("is_processing"))
        return f"{n} slots processing" if n else None

    async def probe(self, prompt: str) -> Probe:
        reply = await self._post("/v1/completions", {
            "model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 0,
            "cache_prompt": True})
        computed, cached = _num(reply, "timings", "prompt_n"), _num(reply, "timings", "cache_n")
        ms = _num(reply, "timings", "prompt_ms")
        total = None if computed is None or cached is None else int(computed + cached)
        return Probe(total, None if cached is None else int(cached),
                     None if ms is None else ms / 1000)


class OllamaEngine(Engine):
    kind = OLLAMA

    async def busy(self) -> str | None:
        return None  # Ollama shows no running count

    async def probe(self, prompt: str) -> Probe:
        reply = await self._post("/api/generate", {
            "model": self.model, "prompt": prompt, "raw": True, "stream": False,
            "options": {"num_predict": 1, "temperature": 0}})
        ns = _num(reply, "prompt_eval_duration")
        total = _num(reply, "prompt_eval_count")
        cached = _num(reply, "prompt_eval_cached_count")
        return Probe(None if total is None else int(total),
                     None if cached is None else int(cached),
                     None if ns is None else ns / 1e9)


ENGINES: Mapping[str, type[Engine]] = {
    VLLM: VllmEngine, LLAMACPP: LlamacppEngine, OLLAMA: OllamaEngine}


@dataclass
class Report:
    """What a run found: the probes kept, those refused (with why), and the fit."""

    kind: str
    model: str
    seed: int
    samples: list[Sample] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    fit: Fit | None = None

    def overhead_sec(self) -> float | None:
        """Median seconds a probe took beyond the engine's prefill (HTTP, network, decode)."""
        extra = [s.wall_sec - s.engine_sec for s in self.samples]
        return statistics.median(extra) if extra else None


class Calibrator:
    """Runs the probe plan against one engine on ``clock``."""

    def __init__(self, engine: Engine, clock: IReactorTime, *, seed: int,
                 cached: Sequence[int] = DEFAULT_CACHED,
                 uncached: Sequence[int] = DEFAULT_UNCACHED,
                 busy_wait: float = 30.0,
                 say: Callable[[str], None] = lambda _: None) -> None:
        self.engine = engine
        self.clock = clock
        self.prompts = Prompts(seed)
        self.cached = tuple(cached)
        self.uncached = tuple(uncached)
        self.busy_wait = busy_wait
        self.say = say
        self.report = Report(engine.kind, engine.model, seed)

    async def run(self) -> Report:
        """Every probe of the plan, then the fit; raises ``CalibrationError``."""
        await self._send(self.prompts.text(16), None)  # loads the model first
        for c in self.cached:
            prefix = self.prompts.text(c) if c else ""
            prefix_count = None
            if prefix:
                first = await self._send(prefix, None)
                prefix_count = first.uncached + first.cached if first else None
            for u in self.uncached:
                await self._send(prefix + self.prompts.text(u), prefix_count)
        self.report.fit = fit(self.report.samples)
        return self.report

    async def _idle(self) -> None:
        waited = 0.0
        while (what := await self.engine.busy()) is not None:
            if waited >= self.busy_wait:
                raise CalibrationError(f"the engine is busy ({what}) after {waited:.0f} s; "
                                       "calibration needs an idle engine")
            await _sleep(self.clock, BUSY_POLL)
            waited += BUSY_POLL

    async def _send(self, prompt: str, prefix_count: int | None) -> Sample | None:
        """One probe (sent again once if another request disturbed it): its sample when its
        numbers are sound, else None with the reason in ``refused``."""
        for attempt in (1, 2):
            await self._idle()
            got = await self.engine.probe(prompt)
            wall = self.engine.last_wall
            if not got.disturbed:
                break
            if attempt == 2:
                self.report.refused.append("another request ran beside the probe twice")
                return None
        sample, why = _sample(got, wall, prefix_count)
        if sample is None:
            self.report.refused.append(why)
            self.say(f"refused a probe: {why}")
            return None
        self.say(f"probe: {sample.uncached} uncached after {sample.cached} cached: "
                 f"{sample.engine_sec * 1000:.3f} ms")
        self.report.samples.append(sample)
        return sample


def _sample(got: Probe, wall: float, prefix_count: int | None) -> tuple[Sample | None, str]:
    total, cached, sec = got.prompt_tokens, got.cached_tokens, got.engine_sec
    if sec is None or total is None:
        return None, "the engine reported no prefill time or prompt count"
    if cached is None:
        cached = min(prefix_count or 0, total)
    if sec <= 0 or total <= 0:
        return None, f"impossible numbers: {sec!r} s for {total} prompt tokens"
    if cached < 0 or cached > total:
        return None, f"impossible numbers: {cached} cached of {total} prompt tokens"
    if cached == total:
        return None, "the whole prompt was cached: nothing computed to time"
    return Sample(total - cached, cached, sec, wall), ""


def _sleep(clock: IReactorTime, seconds: float) -> Deferred[None]:
    d: Deferred[None] = Deferred()
    clock.callLater(seconds, d.callback, None)
    return d


async def engine_for(fetcher: HTTPFetcher, kind: str, model: str | None,
                     timeout: float, clock: IReactorTime) -> Engine:
    """The engine adapter, its kind detected and its model found when not given."""
    if kind == AUTO:
        try:
            kind = await detect_kind(fetcher)
        except DetectionFailed as e:
            raise CalibrationError(f"cannot tell the engine's kind: {e}") from None
    if kind not in ENGINES:
        raise CalibrationError(f"{kind} reports no per-request prefill time calibration can "
                               f"read (supported: {', '.join(SUPPORTED)})")
    if model is None:
        model = await _only_model(fetcher, kind)
    return ENGINES[kind](fetcher, model, timeout, clock)


async def _only_model(fetcher: Fetcher, kind: str) -> str:
    path = "/api/ps" if kind == OLLAMA else "/v1/models"
    try:
        got: Fetched = await fetcher.fetch(path)
        doc = json.loads(got.body)
    except (FetchError, ValueError) as e:
        raise CalibrationError(f"GET {path}: {e}; name the model with --model") from None
    items = doc.get("models" if kind == OLLAMA else "data") if isinstance(doc, dict) else None
    names = [m.get("name" if kind == OLLAMA else "id") for m in items or ()
             if isinstance(m, dict)]
    found = [n for n in names if isinstance(n, str)]
    if len(found) != 1:
        raise CalibrationError(f"GET {path} lists {len(found)} models"
                               f"{' loaded' if kind == OLLAMA else ''}; "
                               "name the one to calibrate with --model")
    return found[0]


def fragment(url: str, report: Report) -> str:
    """The config fragment that gives the backend this cost model."""
    f = report.fit
    assert f is not None
    over = report.overhead_sec()
    r2 = "unknown" if f.r2 is None else f"{f.r2:.6f}"
    lines = [
        f"# pharos calibrate: {report.kind} at {url}, model {report.model}, seed {report.seed}",
        f"# {len(report.samples)} probes kept, {len(report.refused)} refused; fit rms "
        f"{f.rms_sec * 1000:.3f} ms, r2 {r2}",
    ]
    if over is not None:
        lines.append(f"# beyond the engine's prefill (HTTP, network, the first token): median "
                     f"{over * 1000:.2f} ms a probe")
    lines += [
        "backends:",
        f"  - url: {url}",
        f"    kind: {report.kind}",
        "    cost_model:",
        f"      {COST_MODEL_KEYS[0]}: {f.a:.6g}",
        f"      {COST_MODEL_KEYS[1]}: {f.b:.6g}",
        f"      {COST_MODEL_KEYS[2]}: {f.d:.6g}",
    ]
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pharos calibrate",
        description="fit an idle engine's prefill cost model and print a config fragment")
    p.add_argument("--url", required=True, help="the engine's base URL")
    p.add_argument("--kind", default=AUTO, choices=(AUTO, *SUPPORTED),
                   help="engine kind (default: detect)")
    p.add_argument("--model", help="the model to probe (default: the engine's only one)")
    p.add_argument("--seed", type=int, default=None,
                   help="prompt seed (default: random, printed)")
    p.add_argument("--cached", default=",".join(map(str, DEFAULT_CACHED)),
                   help="cached prefix lengths in tokens, comma-separated")
    p.add_argument("--uncached", default=",".join(map(str, DEFAULT_UNCACHED)),
                   help="uncached lengths in tokens, comma-separated")
    p.add_argument("--busy-wait", type=float, default=30.0,
                   help="seconds to wait for a busy engine before giving up (default 30)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds each probe may take (default 120)")
    p.add_argument("--out", help="also write the config fragment to this file")
    p.add_argument("--json", action="store_true", help="print one JSON document instead")
    return p


def _lengths(text: str, name: str, minimum: int) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"pharos calibrate: --{name}: not a list of integers: {text!r}") from None
    if not out or any(x < minimum for x in out):
        raise SystemExit(f"pharos calibrate: --{name}: lengths must be >= {minimum}")
    return out


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line, checked before the reactor starts (bad input exits with usage)."""
    a = parser().parse_args(argv)
    a.cached = _lengths(a.cached, "cached", 0)
    a.uncached = _lengths(a.uncached, "uncached", 1)
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1 << 30)
    return a


async def main_calibrate(a: argparse.Namespace, reactor: IReactorTime) -> int:
    """Run a calibration as ``parse_args`` read it; 0 with the fragment printed, else 2."""
    cached, uncached, seed = a.cached, a.uncached, a.seed
    url = a.url.rstrip("/")
    fetcher = HTTPFetcher(url, make_client(reactor), reactor, timeout=5.0)
    try:
        engine = await engine_for(fetcher, a.kind, a.model, a.timeout, reactor)
        cal = Calibrator(engine, reactor, seed=seed, cached=cached, uncached=uncached,
                         busy_wait=a.busy_wait,
                         say=lambda line: print(line, file=sys.stderr))
        report = await cal.run()
    except (CalibrationError, FetchError) as e:
        print(f"pharos calibrate: {e}", file=sys.stderr)
        return 2
    text = fragment(url, report)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(text)
    if a.json:
        f_ = report.fit
        assert f_ is not None
        print(json.dumps({
            "url": url, "kind": report.kind, "model": report.model, "seed": seed,
            "fit": {COST_MODEL_KEYS[0]: f_.a, COST_MODEL_KEYS[1]: f_.b,
                    COST_MODEL_KEYS[2]: f_.d, "rms_sec": f_.rms_sec, "r2": f_.r2},
            "overhead_sec": report.overhead_sec(),
            "samples": [{"uncached": s.uncached, "cached": s.cached,
                         "engine_sec": s.engine_sec, "wall_sec": s.wall_sec}
                        for s in report.samples],
            "refused": report.refused}, indent=1))
    else:
        print(text, end="")
    return 0
