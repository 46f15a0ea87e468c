"""``pharos.policy`` compiled by mypyc (``pharos.compiled``, built by ``make install``) decides
exactly as its source, the reference: every policy over random fleets, requests and configs
gives the same target, queueing, terms, reason, outcome and guards. A built file is imported
only while it was built from the current source; otherwise the source is."""

from __future__ import annotations

import ast
import dataclasses
import importlib.machinery
import importlib.util
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pharos
from pharos import compiled, policy, reasons
from tests.support.policy import reference

SOURCE = Path(compiled.__file__).with_name("policy.py")
ARTIFACT = Path(compiled.artifact(str(SOURCE)))


REF = reference(SOURCE)
reasons.install(REF)  # both worded, as the scheduler's decisions are
reasons.install(policy)
IS_COMPILED = compiled.status.get("pharos.policy") == "compiled"
needs_build = pytest.mark.skipif(not IS_COMPILED, reason="pharos.policy is not compiled here "
                                 f"({compiled.status.get('pharos.policy')})")


def test_a_built_file_is_used() -> None:
    """Where ``make install`` built the compiled policy, it is what ``pharos.policy`` is (a
    refused build would leave the comparisons below skipped), unless PHAROS_COMPILED=0."""
    if not ARTIFACT.exists():
        pytest.skip("not built here (make install builds it)")
    status = compiled.status.get("pharos.policy")
    assert status == "compiled" or status == f"interpreted ({compiled.ENV}=0)", status
    if status == "compiled":
        assert policy.pick is not REF.pick and Path(policy.__file__) == ARTIFACT


# --- the same decisions ---------------------------------------------------------------------

#: Candidate's field types as the source spells them.
TYPES = {node.target.id: ast.unparse(node.annotation)
         for cls in ast.parse(SOURCE.read_text()).body
         if isinstance(cls, ast.ClassDef) and cls.name == "Candidate"
         for node in cls.body if isinstance(node, ast.AnnAssign)
         and isinstance(node.target, ast.Name)}


def _opt(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "target_id": st.integers(0, 40),
    "capacity": st.integers(1, 16),
    "free_slots": st.integers(-2, 16),
    "queue_ahead": st.integers(0, 10),
    "kv_usage": _opt(st.sampled_from([0.0, 0.5, 0.9, 0.95, 1.0]) | st.floats(0.0, 1.0)),
    "matched_tokens": st.integers(-5, 9000),
    "prefill_sec_per_token": _opt(st.floats(1e-5, 0.05)),
    "inflight": st.integers(0, 16),
    "victims": st.lists(st.sampled_from(["a", "b"]), max_size=2).map(tuple),
    "load_basis": _opt(st.sampled_from(["load_sec=size/host", "load_sec=size/default"])),
    "held": _opt(st.sampled_from(["queued for a warm slot", "swap held"])),
    "prefill_model": _opt(st.tuples(st.floats(0.0, 0.01), st.floats(0.0, 1e-7),
                                    st.floats(0.0, 0.05))),
    "kv_free_tokens": _opt(st.integers(0, 9000)),
}
BY_TYPE: dict[str, st.SearchStrategy[Any]] = {
    "int": st.integers(0, 10_000),
    "float": st.floats(0.0, 60.0),
    "bool": st.booleans(),
    "int | None": _opt(st.integers(0, 10_000)),
    "float | None": _opt(st.floats(0.01, 60.0)),
    "bool | None": _opt(st.booleans()),
}
CANDIDATE = st.fixed_dictionaries({name: FIELDS[name] if name in FIELDS else BY_TYPE[t]
                                   for name, t in TYPES.items()})
FLEETS = st.lists(CANDIDATE, max_size=12, unique_by=lambda c: c["target_id"])
REQUESTS = st.fixed_dictionaries({
    "prompt_tokens": st.integers(0, 9000), "seed": st.integers(0, (1 << 64) - 1),
    "affinity": _opt(st.integers(0, 40)), "seq": st.integers(0, 100),
    "root": _opt(st.integers(0, (1 << 64) - 1))})
CONFIGS = st.fixed_dictionaries({
    "name": st.sampled_from(sorted(REF.POLICIES)),
    "tie_window_sec": st.sampled_from([0.0, 0.001, 0.5]),
    "tie_window_share": st.sampled_from([0.0, 0.1, 0.5]),
    "kv_pressure_threshold": st.sampled_from([0.0, 0.5, 0.9, 1.0]),
    "bounded_load_epsilon": st.sampled_from([None, 0.0, 1.0]),
    "session_affinity": st.booleans()})


def test_every_candidate_field_is_varied() -> None:
    """The strategies cover every Candidate field (a new one fails here until it is)."""
    assert [name for name, t in TYPES.items() if name not in FIELDS and t not in BY_TYPE] == []
    assert set(TYPES) == {f.name for f in dataclasses.fields(REF.Candidate)}


def _decide(module: Any, req: dict[str, Any], fleet: list[dict[str, Any]],
            cfg: dict[str, Any]) -> tuple[object, ...]:
    """Everything a decision says, by ``module``'s code over its own value types."""
    d = module.pick(module.RouteReq(**req), [module.Candidate(**c) for c in fleet],
                    module.PolicyConfig(**cfg))
    winner = d.target_terms  # read first, as the scheduler does
    return (d.target_id, d.enqueue, winner, d.reason, d.why, d.guards, d.score_terms,
            reasons.deciding_term(d.scores, d.target_id))


@needs_build
@settings(max_examples=400)
@given(REQUESTS, FLEETS, CONFIGS)
def test_compiled_and_interpreted_decide_alike(
    req: dict[str, Any], fleet: list[dict[str, Any]], cfg: dict[str, Any]
) -> None:
    """Over random fleets (every Candidate field varied), requests and configs of all six
    policies, the compiled policy's decision equals the interpreted source's in every part:
    target, queueing, the winner's terms, reason, outcome, guards, every candidate's terms
    and the deciding term."""
    assert _decide(policy, req, fleet, cfg) == _decide(REF, req, fleet, cfg)


@needs_build
def test_compiled_and_interpreted_decide_alike_on_the_bench_fleets() -> None:
    """The same on ``pharos bench pick``'s 64-candidate mixed fleets, with matches."""
    from pharos.bench.pick import mixed_candidates

    rng = random.Random(5)
    for n in range(200):
        fleet = [{f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
                 for c in mixed_candidates(64, rng)]
        for name in REF.POLICIES:
            req = {"prompt_tokens": rng.choice([0, 500, 8000]), "seed": rng.getrandbits(64),
                   "seq": n, "root": rng.getrandbits(64)}
            cfg = {"name": name}
            assert _decide(policy, req, fleet, cfg) == _decide(REF, req, fleet, cfg)


# --- never a stale build --------------------------------------------------------------------


def test_the_built_file_is_no_module_python_finds_on_its_own() -> None:
    """Without Pharos's finder, Python imports pharos.policy from its source: the built
    file's name is no module's, so a build can never shadow the source unchecked."""
    spec = importlib.machinery.PathFinder.find_spec("pharos.policy", list(pharos.__path__))
    assert spec is not None and spec.origin == str(SOURCE)
    assert ".mypyc." in ARTIFACT.name


def test_without_a_build_the_source_is_imported(tmp_path: Path) -> None:
    """No built file: the source, with the reason, and no warning."""
    source = tmp_path / "policy.py"
    shutil.copyfile(SOURCE, source)
    module, why = compiled.load("policy", str(source))
    assert module is None and why.startswith("interpreted (not built")


@needs_build
def test_a_build_of_another_source_is_refused(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The built file carries the SHA-256 of the source it was built from: beside the same
    source it is used, beside an edited one it is refused with a warning (the source is
    imported), and PHAROS_COMPILED=0 refuses it too."""
    source = tmp_path / "policy.py"
    shutil.copyfile(SOURCE, source)
    shutil.copyfile(ARTIFACT, compiled.artifact(str(source)))
    module, why = compiled.load("pharos.policy", str(source))
    assert module is not None and why == "compiled"
    embedded = module.SOURCE_SHA256
    assert embedded == compiled.source_digest(str(SOURCE))
    monkeypatch.setenv(compiled.ENV, "0")
    assert compiled.load("pharos.policy", str(source)) == (None, "interpreted (PHAROS_COMPILED=0)")
    monkeypatch.delenv(compiled.ENV)
    source.write_text(SOURCE.read_text() + "\n# edited\n")
    with pytest.warns(RuntimeWarning, match="built from another policy.py"):
        module, why = compiled.load("pharos.policy", str(source))
    assert module is None and "built from another policy.py" in why
