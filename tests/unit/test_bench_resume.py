"""``pharos bench compare --resume``: a run whose result file already holds its specification
is skipped, and a run whose specification differs is run again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from pharos.bench.compare import Comparison, parser
from pharos.bench.fleet import FleetSpec
from pharos.bench.result import environment, result_document, write_result
from pharos.bench.run import RunSpec


def compare_args(out: Path, *extra: str) -> list[str]:
    """The restart bench's command line (docs/performance.rst, "Several instances and
    restarts"), short, with a workload argument that parses to a tuple
    (``prompt_tokens=[...]``)."""
    return ["--engines", "3", "--kind", "vllm", "--engine-arg=--max-num-seqs=64",
            "--backend-capacity", "64", "--duration", "10", "--warmup", "2", "--seeds", "1",
            "--policies", "cost", "--workload", "w1", "--rate", "6",
            "--workload-arg", "prompt_tokens=[200,200]", "--instances", "3", "--peers",
            "--state-file", "--out", str(out), *extra]


def runs_started(argv: list[str]) -> list[Path]:
    """The result paths of the runs ``compare`` starts for ``argv``; each "run" only writes the
    result file a real run would (its spec as ``Comparison._one`` stores it), starting nothing."""
    comparison = Comparison(Clock(), parser().parse_args(argv))
    started: list[Path] = []

    async def one(spec: RunSpec, fleet: FleetSpec, requests: list[Any], senders: Any,
                  path: Path, head: str) -> None:
        started.append(path)
        stored = {**spec.to_json(), "fleet": fleet.to_json(), "engine_urls": [],
                  **comparison._restart_spec(), **environment()}
        write_result(path, result_document(stored, [], {"errors": {}}))

    comparison._one = one  # type: ignore[method-assign,assignment]
    d = Deferred.fromCoroutine(comparison.run())
    assert d.called and d.result == 0
    return started


def test_resume_skips_a_finished_run(tmp_path: Path) -> None:
    """A run finished with the same command line (restarts and a tuple-valued workload
    argument included) is not run again on ``--resume``; without ``--resume`` it is."""
    argv = compare_args(tmp_path, "--restart", "1@3", "--restart", "0@6")
    first = runs_started(argv)
    assert len(first) == 1 and first[0].exists()
    assert runs_started([*argv, "--resume"]) == []
    assert runs_started(argv) == first


def test_resume_runs_a_different_spec_again(tmp_path: Path) -> None:
    """A result file of another specification (other restarts, none, or no state file) does not
    count as done: ``--resume`` runs it again."""
    base = compare_args(tmp_path)
    assert len(runs_started([*base, "--restart", "1@3"])) == 1
    assert len(runs_started([*base, "--restart", "2@3", "--resume"])) == 1
    assert len(runs_started([*base, "--resume"])) == 1
    assert runs_started([*base, "--resume"]) == []
    no_state = [a for a in base if a != "--state-file"]
    assert len(runs_started([*no_state, "--resume"])) == 1
