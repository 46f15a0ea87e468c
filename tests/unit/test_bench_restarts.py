"""The multi-instance bench's pure parts: the restart option, the load balancer's skip of an
instance that is down, the restarted instance's hit-rate windows, the instances' configs
(peers, state file) and the options compare refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from twisted.internet.testing import MemoryReactorClock

from pharos.bench.compare import main_compare
from pharos.bench.fleet import FleetSpec, PeerSetup, instance_name, pharos_config
from pharos.bench.openloop import next_available
from pharos.bench.records import RequestRecord
from pharos.bench.restarts import Restart, per_instance, restart_summary, window
from pharos.config import load_config


def rec(i: int, url: str, sent: float, cached: int, prompt: int = 100, *,
        warmup: bool = False, ok: bool = True) -> RequestRecord:
    return RequestRecord(index=i, at=sent, tag="w1", model="tiny", max_tokens=4, url=url,
                         sent=sent, warmup=warmup, status=200 if ok else 503,
                         error=None if ok else "http_503", prompt_tokens=prompt,
                         cached_tokens=cached, completion_tokens=4)


def test_restart_parses_instance_at_seconds() -> None:
    """``K@SECONDS`` is a restart; anything else is refused with the expected form."""
    assert Restart.parse("1@40") == Restart(1, 40.0)
    assert Restart.parse("0@2.5").to_json() == {"instance": 0, "at": 2.5}
    for bad in ("1", "@40", "a@1", "1@b", "-1@3", "1@-2", "1@nan"):
        with pytest.raises(ValueError, match="INSTANCE@SECONDS"):
            Restart.parse(bad)


def test_next_available_skips_instances_that_are_down() -> None:
    """A request whose turn falls on a down instance goes to the next one up, in order and
    wrapping; an up target keeps it; when none is up it stays (and fails, counted)."""
    urls = ["a", "b", "c"]
    down: set[str] = {"b"}

    def up(u: str) -> bool:
        return u not in down

    assert [next_available(urls, t, up) for t in urls] == ["a", "c", "c"]
    down = {"c", "a"}
    assert next_available(urls, "c", up) == "b"
    down = set(urls)
    assert next_available(urls, "b", up) == "b"


def test_windows_and_the_restart_summary() -> None:
    """Before = the restarted instance's own successful requests from the warm-up's end to
    SIGTERM; after = those sent within one probe interval of /healthz 200 again; the others'
    hit rate over the same window; regained = after / before. Failed and warm-up requests,
    and other instances' requests, are not the instance's."""
    records = [
        rec(0, "b", 1.0, 90, warmup=True),   # warm-up: not counted
        rec(1, "b", 12.0, 80),
        rec(2, "b", 15.0, 60),
        rec(3, "a", 15.0, 10),               # another instance
        rec(4, "b", 18.0, 0, ok=False),      # failed
        rec(5, "b", 30.0, 35),               # after it is back
        rec(6, "b", 33.0, 35),
        rec(7, "b", 36.0, 90),               # past the probe interval
        rec(8, "c", 31.0, 50),
    ]
    assert window(records, 10.0, 20.0, "b") == {
        "from_s": 10.0, "to_s": 20.0, "requests": 2, "hit_rate": 0.7}
    assert window(records, 10.0, 20.0)["requests"] == 3
    events = [{"instance": 1, "url": "b", "term_at": 20.0, "exited_at": 26.0,
               "healthy_at": 29.5, "error": None},
              {"instance": 2, "url": "c", "term_at": 40.0, "exited_at": 45.0,
               "healthy_at": None, "error": "did not come back"}]
    [back, lost] = restart_summary(records, events, warmup=10.0)
    assert back["before"]["hit_rate"] == 0.7 and back["before"]["requests"] == 2
    assert back["after"] == {"from_s": 29.5, "to_s": 34.5, "requests": 2, "hit_rate": 0.35}
    assert back["others_after"]["hit_rate"] == 0.5
    assert back["regained"] == pytest.approx(0.5)
    assert "regained" not in lost and lost["error"] == "did not come back"
    no_hits = restart_summary([rec(1, "b", 12.0, 0), rec(2, "b", 30.0, 10)], events[:1], 10.0)
    assert no_hits[0]["regained"] is None  # before was 0: no ratio
    assert per_instance(records, ["a", "b"]) == {
        "a": {"counted": 1, "ok": 1, "hit_rate": 0.1},
        "b": {"counted": 6, "ok": 5, "hit_rate": 0.6}}


def test_instance_configs_with_peers_and_a_state_file(tmp_path: Path) -> None:
    """An instance's config names its state file and its peers (its own listener, the secret
    file and every member) and parses as Pharos's config; without them it is as before."""
    secret = tmp_path / "peers.secret"
    secret.write_text("s3cret\n")
    members = ("127.0.0.1:7001", "127.0.0.1:7002")
    text = pharos_config(8123, ["http://127.0.0.1:1"], "vllm", "cost", capacity=8,
                         state_file=str(tmp_path / "p.state"),
                         peers=PeerSetup(members[1], str(secret), members))
    doc = yaml.safe_load(text)
    assert doc["state_file"] == str(tmp_path / "p.state")
    assert doc["peers"] == {"listen": "127.0.0.1:7002", "secret_file": str(secret),
                            "members": list(members)}
    path = tmp_path / "pharos.yaml"
    path.write_text(text)
    config = load_config(str(path))
    assert config.peers is not None and config.peers.members == members
    assert config.state_file == str(tmp_path / "p.state")
    assert "peers" not in pharos_config(1, ["http://127.0.0.1:1"], "vllm", "cost")
    assert instance_name(0, 1) == "pharos" and instance_name(2, 3) == "pharos 2"


def test_fleet_spec_json_names_instances_only_when_not_the_default() -> None:
    """One instance without peers or state file is described as before (old result files
    still match on --resume); several name their instances, peers and state file."""
    assert "instances" not in FleetSpec(3, "vllm", policy="cost").to_json()
    several = FleetSpec(3, "vllm", policy="cost", instances=3, peers=True).to_json()
    assert (several["instances"], several["peers"], several["state_file"]) == (3, True, False)


@pytest.mark.parametrize(("extra", "message"), [
    (["--instances", "0"], "--instances must be at least 1"),
    (["--instances", "2", "--policies", "prefix-aware,cost"], "not for prefix-aware"),
    (["--peers"], "--peers needs --instances 2 or more"),
    (["--instances", "2", "--restart", "2@1"], "there are 2 instances"),
    (["--instances", "2", "--restart", "1@9"], "after the run's 5 s"),
    (["--restart", "x"], "INSTANCE@SECONDS"),
])
def test_compare_refuses_instance_options_that_cannot_work(
        extra: list[str], message: str, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    """Options about instances are refused by name where they cannot apply (baselines send
    straight to the engines; peers need a second instance; a restart names an instance that
    exists, within the run) rather than ignored."""
    argv = ["--workload", "w1", "--rate", "1", "--duration", "5", "--out", str(tmp_path),
            "--policies", "cost", *extra]
    with pytest.raises(SystemExit) as e:
        main_compare(argv, reactor=MemoryReactorClock())
    assert e.value.code == 2
    assert message in capsys.readouterr().err
