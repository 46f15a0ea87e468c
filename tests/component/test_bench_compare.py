"""``pharos bench compare`` end to end (fresh engine doubles and Pharos as child processes, a
short run per policy) and ``pharos bench report`` on what it wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from pharos.bench.compare import ALL_POLICIES, served_models, workload_models
from pharos.bench.fleet import FleetSpec, engine_command, pharos_config
from pharos.bench.report import main_report
from pharos.bench.workloads import Request

ROOT = Path(__file__).resolve().parents[2]
#: A small, fast workload: short prompts and replies, so each run drains at once.
SMALL = ["--workload-arg", "prompt_tokens=[40,80]", "--workload-arg", "question_tokens=[5,10]",
         "--workload-arg", "output_tokens=[3,6]"]


def test_compare_writes_a_result_per_policy_and_report_reads_them(tmp_path: Path) -> None:
    """Every policy gets a result file for the same requests at the same times, the Pharos
    policies (the baselines round-robin, random, p2c and prefix-hash among them) served
    through Pharos (``x-pharos-backend`` naming an engine) and only the peer baseline
    prefix-aware straight from the engines; every child process is gone afterwards; report writes
    report.md with a table row per policy, computed winners, and both charts."""
    out = tmp_path / "results"
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "pharos"), "bench", "compare", "--workload", "w1",
         "--rate", "3", "--duration", "2", "--warmup", "0.5", "--seeds", "1", "--engines", "2",
         "--timeout", "15", "--backend-capacity", "4", *SMALL, "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # this test's own process group only
            proc.wait()
    assert proc.returncode == 0, output
    docs = {}
    for policy in ALL_POLICIES:
        path = out / "w1" / "3" / f"{policy}-seed1.json"
        assert path.exists(), output
        docs[policy] = json.loads(path.read_text())
    schedules = {p: [r["at"] for r in d["records"]] for p, d in docs.items()}
    assert len(set(map(tuple, schedules.values()))) == 1 and schedules["cost"]
    for policy, doc in docs.items():
        spec, summary = doc["spec"], doc["summary"]
        assert spec["policy"] == policy and spec["seed"] == 1 and spec["fleet"]["engines"] == 2
        assert "machine" in spec and "date" in spec and "commit" in spec
        assert summary["ok"] == summary["counted"] > 0, summary["errors"]
        assert all("messages" not in r for r in doc["records"])
        engines = set(spec["engine_urls"])
        assert {r["engine"] for r in doc["records"]} <= engines
        via_pharos = policy != "prefix-aware"  # every baseline but the peer's goes through
        assert (spec["urls"] != spec["engine_urls"]) == via_pharos
        assert all((r["reason"] is not None) == via_pharos for r in doc["records"])
    leftovers = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""

    report = tmp_path / "report"
    assert main_report([str(out), "--out", str(report)]) == 0
    text = (report / "report.md").read_text()
    for policy in ALL_POLICIES:
        assert f"| {policy} | 3 |" in text
    assert "- **p99 TTFT**:" in text and "- **hit rate**:" in text
    assert (report / "w1-p99-ttft.png").read_bytes()[:4] == b"\x89PNG"
    assert (report / "w1-goodput.png").read_bytes()[:4] == b"\x89PNG"


def test_fleet_command_lines_and_config() -> None:
    """Engine options reach every double's command line; an Ollama fleet is given every
    model the workload can ask for (other kinds only models other than their own); Pharos's
    config names the engines, their kind, the policy and the capacity."""
    spec = FleetSpec(engines=2, kind="vllm", engine_args=("--slots=8",))
    cmd = engine_command(spec)
    assert cmd[-6:] == ["sim-engine", "--kind", "vllm", "--port", "0", "--slots=8"]
    reqs = [Request(0.0, f"model-{m}", ({"role": "user", "content": "x"},), 4)
            for m in (1, 0, 1)]
    names = workload_models("w1", {}, reqs)
    assert names == ["model-0", "model-1"]
    assert workload_models("multi-model", {"models": 3}, reqs) == [
        "model-0", "model-1", "model-2"]
    assert len(workload_models("multi-model", {}, [])) == 8
    assert served_models("ollama", (), names, 4.0) == {"model-0": 4.0, "model-1": 4.0}
    assert served_models("ollama", ("--model=a=1",), names, 4.0) is None
    assert served_models("vllm", (), ["tiny"], 4.0) is None
    assert served_models("vllm", (), names, 4.0) == {"model-0": 0.0, "model-1": 0.0}
    ollama = engine_command(FleetSpec(1, "ollama", models={"model-0": 4.0}))
    assert ollama[-2:] == ["--model", "model-0=4"]
    config = pharos_config(8123, ["http://127.0.0.1:1", "http://127.0.0.1:2"], "vllm", "cost",
                           capacity=8)
    assert config.splitlines() == [
        "listen: 127.0.0.1:8123", "policy: cost", "backends:",
        "  - url: http://127.0.0.1:1", "    kind: vllm", "    capacity: 8",
        "  - url: http://127.0.0.1:2", "    kind: vllm", "    capacity: 8"]
