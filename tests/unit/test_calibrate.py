"""``pharos calibrate``'s fit, its refusals, the ``cost_model`` it prints, and how routing
uses it (issue 17 item 5)."""

from __future__ import annotations

import random

import pytest

from pharos.calibrate import (
    CalibrationError,
    Probe,
    Report,
    Sample,
    _sample,
    fit,
    fragment,
    nnls,
)
from pharos.config import ConfigError, CostModel, parse_config
from pharos.policy import Candidate, PolicyConfig, RouteReq, pick

PLAN = [(u, c) for c in (0, 1024, 3072) for u in (128, 512, 2048)] + [(1024, 0), (3072, 0)]


def _p(a: float, b: float, d: float, u: int, c: int) -> float:
    return a * u + b * u * (c + u / 2) + d


def _samples(a: float, b: float, d: float, noise: float = 0.0, seed: int = 1) -> list[Sample]:
    rng = random.Random(seed)
    return [Sample(u, c, _p(a, b, d, u, c) * (1 + rng.uniform(-noise, noise)), 0.0)
            for u, c in PLAN]


@pytest.mark.parametrize("a,b,d", [(100e-6, 3.3e-9, 0.005), (5e-4, 1e-8, 0.0),
                                   (2e-5, 0.0, 0.02), (7e-5, 4e-10, 0.001)])
def test_fit_recovers_exact_parameters(a: float, b: float, d: float) -> None:
    """Exact engine times give back a, b and d (to 1e-6 relative, zero terms as ~0)."""
    got = fit(_samples(a, b, d))
    assert got.a == pytest.approx(a, rel=1e-6, abs=1e-12)
    assert got.b == pytest.approx(b, rel=1e-6, abs=1e-15)
    assert got.d == pytest.approx(d, rel=1e-6, abs=1e-9)
    assert got.r2 == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(5))
def test_fit_recovers_random_parameters_through_noise(seed: int) -> None:
    """With 0.1 % noise on every probe (a busy engine's jitter), random parameters come back
    within 5 %."""
    rng = random.Random(seed)
    a, b, d = rng.uniform(2e-5, 5e-4), rng.uniform(1e-9, 2e-8), rng.uniform(0.002, 0.05)
    got = fit(_samples(a, b, d, noise=0.001, seed=seed))
    assert got.a == pytest.approx(a, rel=0.05)
    assert got.b == pytest.approx(b, rel=0.05)
    assert got.d == pytest.approx(d, rel=0.05)


def test_nnls_keeps_every_term_non_negative() -> None:
    """Times that an unconstrained fit would explain with a negative fixed cost get d = 0,
    and the other terms still fit."""
    rows = [(float(u), float(u * u / 2), 1.0) for u in (100, 200, 400, 800)]
    ys = [1e-4 * u - 0.01 for u, _, _ in rows]  # a = 1e-4, d = -0.01
    a, b, d = nnls(rows, ys)
    assert min(a, b, d) >= 0
    assert d == 0


def test_too_few_or_alike_probes_are_refused() -> None:
    """A fit needs five good probes of three distinct lengths; fewer is an error, not a
    guess."""
    with pytest.raises(CalibrationError, match="good probes"):
        fit(_samples(1e-4, 0, 0)[:3])
    alike = [Sample(100, 0, 0.01, 0.0)] * 4 + [Sample(200, 0, 0.02, 0.0)] * 2
    with pytest.raises(CalibrationError, match="distinct"):
        fit(alike)


@pytest.mark.parametrize("probe,why", [
    (Probe(100, 0, None), "no prefill time"),
    (Probe(None, 0, 0.01), "no prefill time"),
    (Probe(100, 0, -0.5), "impossible"),
    (Probe(100, 0, 0.0), "impossible"),
    (Probe(100, 150, 0.01), "impossible"),
    (Probe(100, 100, 0.01), "whole prompt"),
])
def test_a_lying_probe_is_refused_with_what_it_said(probe: Probe, why: str) -> None:
    """Numbers an engine cannot have measured are refused, never fitted."""
    sample, reason = _sample(probe, 0.1, None)
    assert sample is None
    assert why in reason


def test_an_engine_without_a_cached_count_takes_the_prefix_probe_count() -> None:
    """Ollama before 0.33.3 sends no cached count: the cached part is the prefix probe's
    prompt count, the rest computed."""
    sample, _ = _sample(Probe(1500, None, 0.2), 0.25, 1000)
    assert sample == Sample(500, 1000, 0.2, 0.25)


def test_the_fragment_is_a_config_pharos_accepts() -> None:
    """What calibrate prints parses as a config whose backend carries the fitted model."""
    report = Report("vllm", "tiny", 7, samples=_samples(1e-4, 3.3e-9, 0.005))
    report.fit = fit(report.samples)
    cfg = parse_config(fragment("http://127.0.0.1:8000", report))
    (backend,) = cfg.backends
    assert backend.kind == "vllm"
    assert backend.cost_model is not None
    assert backend.cost_model.prefill_token_s == pytest.approx(1e-4, rel=1e-5)
    assert backend.cost_model.prefill_pair_s == pytest.approx(3.3e-9, rel=1e-5)
    assert backend.cost_model.prefill_fixed_s == pytest.approx(0.005, rel=1e-5)


@pytest.mark.parametrize("body,error", [
    ("{prefill_token_s: 1e-4, prefill_pair_s: 0}", "missing required field 'prefill_fixed_s'"),
    ("{prefill_token_s: 1e-4, prefill_pair_s: 0, prefill_fixed_s: 0, speed: 2}",
     "unknown field"),
    ("{prefill_token_s: -1e-4, prefill_pair_s: 0, prefill_fixed_s: 0}", "seconds >= 0"),
    ("{prefill_token_s: 0, prefill_pair_s: 0, prefill_fixed_s: 0.1}", "both 0"),
    ("fast", "a mapping"),
])
def test_a_bad_cost_model_is_refused_by_name(body: str, error: str) -> None:
    """Every malformed cost_model is an error naming backends[0].cost_model."""
    with pytest.raises(ConfigError) as e:
        parse_config(f"backends:\n  - url: http://127.0.0.1:8000\n    cost_model: {body}\n")
    assert "backends[0].cost_model" in str(e.value)
    assert error in str(e.value)


def _cand(i: int, model: tuple[float, float, float] | None, matched: int = 0) -> Candidate:
    return Candidate(target_id=i, warm=True, capacity=4, free_slots=4, queue_ahead=0,
                     kv_usage=None, matched_tokens=matched, prefill_sec_per_token=1e-4,
                     load_sec=None, service_sec=None, fits_if_cold=None, loading=False,
                     inflight=0, prefill_model=model)


def test_routing_prices_a_calibrated_backend_by_its_model() -> None:
    """A candidate with a cost model is priced P(u, c), not by the learned speed: a backend
    calibrated as slow loses to one with the same learned speed and no model, and its score
    shows the model's prefill."""
    slow = CostModel(1e-3, 1e-8, 0.05).terms()
    decision = pick(RouteReq(2000, seed=1), [_cand(0, slow, matched=500), _cand(1, None)],
                    PolicyConfig())
    assert decision.target_id == 1
    score = next(s for s in decision.scores if s.target_id == 0)
    assert score.prefill == pytest.approx(_p(1e-3, 1e-8, 0.05, 1500, 500))
