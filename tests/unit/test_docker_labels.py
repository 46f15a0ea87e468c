"""Layer 1: Docker discovery's pure parts (issue 14 items 3, 4): labels → backend per spec
§10's table, refusals with a reason, the Engine API's version negotiation and timestamps, the
socket switch, and the log stream's two framings (stdcopy frames, TTY raw)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from pharos.config import Backend, LogFeed
from pharos.discovery.docker import (
    API_VERSION,
    Container,
    Demux,
    DockerError,
    backend_of,
    container_of,
    negotiate,
    socket_from_env,
    unix_timestamp,
)
from pharos.discovery.feed import LineSplitter

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "docker" / "1.50"
SUMMARY: dict[str, Any] = json.loads((FIXTURES / "containers_json").read_bytes())[0]
CID = SUMMARY["Id"]


def summary(labels: dict[str, str], ports: tuple[int, ...] = (8080,),
            networks: dict[str, str] | None = None) -> dict[str, Any]:
    """The fixture's container with these labels, exposed ports and networks."""
    s = json.loads(json.dumps(SUMMARY))
    s["Labels"] = labels
    s["Ports"] = [{"PrivatePort": p, "Type": "tcp"} for p in ports]
    template = s["NetworkSettings"]["Networks"]["bridge"]
    nets = networks if networks is not None else {"bridge": "172.17.0.4"}
    s["NetworkSettings"]["Networks"] = {n: {**template, "IPAddress": ip}
                                        for n, ip in nets.items()}
    return s


def made(labels: dict[str, str], **kw: Any) -> Backend | str:
    c = container_of(summary({"pharos.enable": "true", **labels}, **kw))
    assert isinstance(c, Container)
    return backend_of(c)


def test_the_fixture_container_reads_as_recorded() -> None:
    """The recorded ContainerSummary gives its id, name, one TCP port and bridge IP."""
    c = container_of(SUMMARY)
    assert isinstance(c, Container)
    assert (c.id, c.name, c.tcp_ports) == (CID, "funny_chatelet", (8080,))
    assert c.networks == (("bridge", "172.17.0.4", ""),)


def test_enable_alone_makes_a_backend_from_ip_and_the_one_port() -> None:
    """Zero-config: pharos.enable=true alone → http://<first network IP>:<the one port>, kind
    auto, nothing else set, and the container's log stream as its feed."""
    b = made({})
    assert b == Backend(url="http://172.17.0.4:8080", kind="auto",
                        logs=LogFeed("docker", CID))


def test_every_label_of_the_table() -> None:
    """pharos.port, kind, memory_gb and capacity are taken as the static list takes them."""
    b = made({"pharos.port": "11434", "pharos.kind": "ollama", "pharos.memory_gb": "24",
              "pharos.capacity": "4"}, ports=(11434, 9090))
    assert isinstance(b, Backend)
    assert (b.url, b.kind, b.memory_gb, b.capacity) == ("http://172.17.0.4:11434", "ollama",
                                                         24.0, 4)


def test_pharos_url_wins_over_ip_and_port() -> None:
    """pharos.url (Pharos on the host, or another network) is used as written, no slash."""
    b = made({"pharos.url": "http://127.0.0.1:18000/"}, ports=(1, 2, 3))
    assert isinstance(b, Backend) and b.url == "http://127.0.0.1:18000"


def test_first_network_by_name_and_ipv6_only() -> None:
    """The IP comes from the first network in name order; an IPv6-only one is bracketed."""
    b = made({}, networks={"zeta": "10.9.0.2", "alpha": "10.1.0.2"})
    assert isinstance(b, Backend) and b.url == "http://10.1.0.2:8080"
    s = summary({"pharos.enable": "true"})
    s["NetworkSettings"]["Networks"]["bridge"].update(IPAddress="", GlobalIPv6Address="fd00::4")
    c = container_of(s)
    assert isinstance(c, Container)
    b6 = backend_of(c)
    assert isinstance(b6, Backend) and b6.url == "http://[fd00::4]:8080"


@pytest.mark.parametrize(("labels", "kw", "why"), [
    ({"pharos.kind": "tensorrt"}, {}, "pharos.kind 'tensorrt' is not one of"),
    ({"pharos.port": "http"}, {}, "pharos.port 'http' is not a port"),
    ({"pharos.port": "70000"}, {}, "pharos.port '70000' is not a port"),
    ({"pharos.port": "0"}, {}, "pharos.port '0' is not a port"),
    ({}, {"ports": (8000, 8080)}, "several TCP ports (8000, 8080); set pharos.port"),
    ({}, {"ports": ()}, "exposes no TCP port"),
    ({"pharos.memory_gb": "lots"}, {}, "pharos.memory_gb 'lots' is not a positive number"),
    ({"pharos.memory_gb": "nan"}, {}, "is not a positive number"),
    ({"pharos.capacity": "-1"}, {}, "pharos.capacity '-1' is not a positive integer"),
    ({"pharos.url": "gpu-box:8000"}, {}, "pharos.url 'gpu-box:8000' is not an absolute"),
    ({"pharos.url": "http://x:1", "pharos.port": "1"}, {}, "both set"),
    ({"pharos.memory-gb": "24"}, {}, "unknown label 'pharos.memory-gb'"),
    ({}, {"networks": {"host": ""}}, "first network 'host' gives it no IP address"),
    ({}, {"networks": {}}, "on no network"),
])
def test_labels_that_make_no_backend_say_why(labels: dict[str, str], kw: dict[str, Any],
                                             why: str) -> None:
    """A container whose labels make no backend is refused with the label and the fix."""
    result = made(labels, **kw)
    assert isinstance(result, str) and why in result, result


@pytest.mark.parametrize("bad", [
    "not a dict", {"Id": "zz"}, {"Id": CID, "Labels": {"a": 1}}, {"Id": CID, "Labels": [1]},
])
def test_summaries_of_the_wrong_shape_are_reasons_not_errors(bad: Any) -> None:
    """Garbage in a list entry is a reason string, never an exception."""
    assert isinstance(container_of(bad), str)


def test_summary_with_odd_fields_still_reads() -> None:
    """Ports and networks of the wrong shape are skipped, not fatal; names default to the id."""
    c = container_of({"Id": CID, "Ports": [None, {"PrivatePort": "x", "Type": "tcp"},
                                            {"PrivatePort": 53, "Type": "udp"}],
                      "NetworkSettings": {"Networks": {"n": None}}})
    assert isinstance(c, Container)
    assert (c.name, c.tcp_ports, c.networks) == (CID[:12], (), (("n", "", ""),))


def test_version_negotiation_is_the_clis() -> None:
    """The daemon's Api-Version if older than Pharos's, else Pharos's; none is an error."""
    assert negotiate("1.43") == "1.43"
    assert negotiate("1.53") == API_VERSION == negotiate(API_VERSION)
    assert negotiate("1.9") == "1.9"
    for bad in (None, "", "garbage", "1"):
        with pytest.raises(DockerError):
            negotiate(bad)


def test_started_at_to_since() -> None:
    """State.StartedAt (RFC 3339, nanoseconds) → the seconds.nanoseconds ``since`` takes."""
    assert unix_timestamp("2020-01-06T09:06:59.461876391Z") == "1578301619.461876391"
    assert unix_timestamp("2020-01-06T10:06:59.5+01:00") == "1578301619.500000000"
    assert unix_timestamp("2020-01-06T09:06:59Z") == "1578301619.000000000"
    for none in ("0001-01-01T00:00:00Z", "", None, 5, "yesterday"):
        assert unix_timestamp(none) is None


def test_socket_from_env() -> None:
    """DOCKER_HOST=unix://… names the socket; another scheme is refused by name; unset, the
    default socket only if it exists."""
    assert socket_from_env({"DOCKER_HOST": "unix:///run/x.sock"})[0] == "/run/x.sock"
    path, why = socket_from_env({"DOCKER_HOST": "tcp://10.0.0.1:2375"})
    assert path is None and "not a unix:// socket" in why
    assert socket_from_env({}, "/nope", exists=lambda p: False)[0] is None
    assert socket_from_env({}, "/yes.sock", exists=lambda p: True)[0] == "/yes.sock"


def frames(*parts: tuple[int, bytes]) -> bytes:
    return b"".join(struct.pack(">BxxxL", s, len(d)) + d for s, d in parts)


def demuxed(data: bytes, chunk: int) -> tuple[list[bytes], list[bytes]]:
    out: list[bytes] = []
    err: list[bytes] = []
    demux = Demux(LineSplitter(out.append).feed, LineSplitter(err.append).feed)
    for i in range(0, len(data), chunk):
        demux.feed(data[i:i + chunk])
    return out, err


@pytest.mark.parametrize("chunk", [1, 3, 7, 8, 9, 4096])
def test_recorded_multiplexed_stream_in_any_chunking(chunk: int) -> None:
    """The recorded stdcopy stream gives the engine log's lines, stdout and stderr apart,
    however TCP cuts it (a header split across reads included)."""
    lines = (FIXTURES.parent.parent / "ollama" / "0.32.15" / "loaded" / "engine.log"
             ).read_bytes().split(b"\n")[:3]
    out, err = demuxed((FIXTURES / "containers_id_logs.multiplexed").read_bytes(), chunk)
    assert out == [lines[0], lines[2]] and err == [lines[1]]


def test_recorded_raw_stream_drops_crlf() -> None:
    """A TTY container's raw stream (CRLF line ends) splits into the same lines."""
    got: list[bytes] = []
    LineSplitter(got.append).feed((FIXTURES / "containers_id_logs.raw").read_bytes())
    assert len(got) == 3 and all(not line.endswith(b"\r") for line in got)
    assert b"OLLAMA_NUM_PARALLEL:2" in got[0]


def test_interleaved_partial_lines_stay_per_stream() -> None:
    """A line cut across frames is rebuilt per stream: stderr between its halves does not
    glue onto stdout's line."""
    out, err = demuxed(frames((1, b"hal"), (2, b"oops\n"), (1, b"f\n"), (0, b"in\n")), 5)
    assert out == [b"half", b"in"] and err == [b"oops"]


def test_systemerr_frame_ends_the_stream_with_its_message() -> None:
    """Stream type 3 is the daemon's error: the feed ends with it."""
    demux = Demux(lambda b: None, lambda b: None)
    with pytest.raises(DockerError, match="log driver failed"):
        demux.feed(frames((1, b"ok\n"), (3, b"log driver failed")))


@pytest.mark.parametrize("garbage", [b"hello world, no frames here\n", b"\x05\0\0\0\0\0\0\1x",
                                     b"\x01\1\2\3\0\0\0\1x"])
def test_unframed_bytes_on_a_multiplexed_stream_are_an_error(garbage: bytes) -> None:
    """Bytes that are not stdcopy frames break the feed (its follower reconnects)."""
    demux = Demux(lambda b: None, lambda b: None)
    with pytest.raises(DockerError, match="not multiplexed"):
        demux.feed(garbage)


def test_a_huge_frame_is_streamed_not_buffered() -> None:
    """A 10 MB frame (one long line) is passed through in pieces: the splitter drops it whole
    and counts it, and the next line arrives."""
    out: list[bytes] = []
    splitter = LineSplitter(out.append)
    demux = Demux(splitter.feed, splitter.feed)
    big = b"x" * 10_000_000 + b"\n"
    data = frames((1, big), (1, b"next\n"))
    for i in range(0, len(data), 65536):
        demux.feed(data[i:i + 65536])
    assert out == [b"next"] and splitter.too_long == 1
