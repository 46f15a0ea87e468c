"""Layer 3: Ollama's model management through Pharos over loopback (issue 17 item 7): pull,
push, create, copy, delete and blobs reach one Ollama backend (named by x-pharos-backend or the
only one up) for an admin, past the scheduler, both bodies streamed; the ollama Python client
pulls and uploads through Pharos; a large upload holds bounded memory behind a slow engine; an
upload cut half way is seen cut by the engine and stores nothing."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import urllib.parse
from pathlib import Path
from typing import Any

import ollama
import pytest_twisted
import treq
from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.web.client import ResponseFailed
from twisted.web.http_headers import Headers

from pharos.config import Key
from pharos.proxy.auth import digest
from tests.support.blob_upload import digest_of, upload
from tests.support.fleet import Fleet, eventually, sleep, start_fleet, within

ADMIN, USER = "phk-admin-mm", "phk-user-mm"
KEYS = (Key(name="ops", sha256=digest(ADMIN), admin=True),
        Key(name="user", sha256=digest(USER)))
#: The upload the memory test sends: 1 GiB (9 s here at load 14); ``PHAROS_BLOB_TEST_BYTES``
#: sets another size.
BIG = int(os.environ.get("PHAROS_BLOB_TEST_BYTES", str(1 << 30)))
#: How fast the slow engine reads a blob (bytes per second).
SLOW_READ = 128 << 20
#: RSS growth allowed for the whole process (client, Pharos and engine double together).
RSS_BOUND = 100 << 20


async def call(f: Fleet, method: str, path: str, key: str | None = ADMIN,
               body: Any = None, backend: str | None = None) -> tuple[int, bytes, Headers]:
    headers = Headers({b"content-type": [b"application/json"]})
    if key is not None:
        headers.setRawHeaders(b"authorization", [f"Bearer {key}".encode()])
    if backend is not None:
        headers.setRawHeaders(b"x-pharos-backend", [backend.encode()])
    data = json.dumps(body).encode() if body is not None else None
    r = await treq.request(method, f.url + path, data=data, headers=headers, pool=f.pool)
    return r.code, await r.content(), r.headers


def lines(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(x) for x in raw.splitlines() if x.strip()]


def tags(f: Fleet, i: int) -> set[str]:
    return set(f.doubles[i].flavor.catalogue())


@pytest_twisted.ensureDeferred
async def test_pull_with_the_ollama_client_streams_progress() -> None:
    """ollama.Client(host=pharos).pull streams Ollama's progress lines through Pharos to
    success (the model then listed by the engine); stream=False gets the one success line;
    a pull the registry refuses ends with its error."""
    f = await start_fleet([("ollama", {}, {"kind": "ollama"})], keys=KEYS)
    client = ollama.Client(host=f.url, headers={"Authorization": f"Bearer {ADMIN}"})
    try:
        def run() -> dict[str, Any]:
            streamed = [p.model_dump(exclude_none=True)
                        for p in client.pull("tinyllama:1.1b", stream=True)]
            once = client.pull("phi3:mini").model_dump(exclude_none=True)
            try:
                client.pull("nothing:missing")
                refused = None
            except ollama.ResponseError as e:
                refused = e.error
            return {"streamed": streamed, "once": once, "refused": refused}

        got = await deferToThread(run)
        statuses = [p["status"] for p in got["streamed"]]
        assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
        progress = [p for p in got["streamed"] if "completed" in p]
        assert len(progress) >= 3 and progress[-1]["completed"] == progress[-1]["total"]
        assert got["once"]["status"] == "success"
        assert "file does not exist" in got["refused"]
        assert {"tinyllama:1.1b", "phi3:mini"} <= tags(f, 0)
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_a_keyless_pull_as_the_ollama_cli_sends_it_streams() -> None:
    """The ``ollama`` CLI sends no key (it has no option for one): with no keys configured
    its ``ollama pull NAME`` request (POST /api/pull, ``{"name": ..., "insecure": false}``,
    ``Accept: application/x-ndjson``, no stream field) gets the engine's NDJSON progress, the
    first lines reaching the client before the engine wrote ``success`` (streamed, not
    collected); the ollama Python client without headers pulls too."""
    f = await start_fleet([("ollama", {}, {"kind": "ollama"})])
    try:
        r = await treq.post(
            f.url + "/api/pull", b'{"name":"tinyllama:1.1b","insecure":false}',
            headers=Headers({b"content-type": [b"application/json"],
                             b"accept": [b"application/x-ndjson"],
                             b"user-agent": [b"ollama/0.12.3 (amd64 linux) Go/go1.24.1"]}),
            pool=f.pool, unbuffered=True)
        assert r.code == 200
        assert r.headers.getRawHeaders(b"content-type") == [b"application/x-ndjson"]
        chunks: list[tuple[bytes, bool]] = []
        await treq.collect(r, lambda c: chunks.append((c, "tinyllama:1.1b" in tags(f, 0))))
        got = lines(b"".join(c for c, _ in chunks))
        assert got[0]["status"] == "pulling manifest" and got[-1]["status"] == "success"
        assert not chunks[0][1]  # the first bytes came before the pull had finished
        assert "tinyllama:1.1b" in tags(f, 0)
        client = ollama.Client(host=f.url)
        done = await deferToThread(lambda: [p.status for p in client.pull("phi3:mini",
                                                                          stream=True)])
        assert done[-1] == "success" and "phi3:mini" in tags(f, 0)
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_management_needs_an_admin_key() -> None:
    """No key: 401; a key without admin: 403, and nothing reaches the engine."""
    f = await start_fleet([("ollama", {}, {"kind": "ollama"})], keys=KEYS)
    try:
        for method, path, body in [("POST", "/api/pull", {"model": "x"}),
                                   ("DELETE", "/api/delete", {"model": "x"}),
                                   ("HEAD", "/api/blobs/sha256:00", None),
                                   ("POST", "/api/copy", {"source": "a", "destination": "b"})]:
            code, _, _ = await call(f, method, path, None, body)
            assert code == 401, path
            code, raw, _ = await call(f, method, path, USER, body)
            assert code == 403, path
            if method != "HEAD":
                assert "admin" in json.loads(raw)["error"]
        assert f.doubles[0].manage is not None and f.doubles[0].manage.pulls == 0
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_the_backend_is_named_or_the_only_ollama_one() -> None:
    """Two Ollama backends: without x-pharos-backend a 409 names both; named by URL or
    host:port the request goes there only; an unknown name or a vLLM backend is a 400 naming
    the Ollama choices; a wrong method is 405."""
    f = await start_fleet([("ollama", {}, {"kind": "ollama"}), ("ollama", {"seed": 1},
                                                                 {"kind": "ollama"}),
                           ("vllm", {}, {"kind": "vllm"})], keys=KEYS)
    a, b = f.doubles[0].url, f.doubles[1].url
    try:
        code, raw, _ = await call(f, "POST", "/api/pull", body={"model": "m1", "stream": False})
        assert code == 409
        message = json.loads(raw)["error"]
        assert a in message and b in message and "x-pharos-backend" in message
        code, raw, headers = await call(f, "POST", "/api/pull", backend=a,
                                        body={"model": "m1", "stream": False})
        assert code == 200 and json.loads(raw) == {"status": "success"}
        assert headers.getRawHeaders(b"x-pharos-backend") == [a.encode()]
        assert "m1" in tags(f, 0) and "m1" not in tags(f, 1)
        netloc = urllib.parse.urlsplit(b).netloc
        code, raw, _ = await call(f, "POST", "/api/pull", backend=netloc,
                                  body={"model": "m2", "stream": False})
        assert code == 200 and "m2" in tags(f, 1) and "m2" not in tags(f, 0)
        code, raw, _ = await call(f, "POST", "/api/pull", backend="http://nowhere:1",
                                  body={"model": "m3"})
        assert code == 400 and a in json.loads(raw)["error"]
        code, raw, _ = await call(f, "POST", "/api/pull", backend=f.doubles[2].url,
                                  body={"model": "m3"})
        assert code == 400 and "not Ollama" in json.loads(raw)["error"]
        code, raw, headers = await call(f, "GET", "/api/pull", backend=a)
        assert code == 405 and headers.getRawHeaders(b"allow") == [b"POST"]
        assert isinstance(json.loads(raw)["error"], str)
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_no_ollama_backend_is_a_409() -> None:
    """Only a vLLM backend: a management request is a 409 saying no Ollama backend is up."""
    f = await start_fleet([("vllm", {}, {"kind": "vllm"})], keys=KEYS)
    try:
        code, raw, _ = await call(f, "POST", "/api/pull", body={"model": "m"})
        assert code == 409 and "no Ollama backend" in json.loads(raw)["error"]
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_blobs_create_copy_delete_with_the_ollama_client(tmp_path: Path) -> None:
    """The ollama client's create_blob uploads through Pharos (HEAD 404 before, 200 after),
    create uses the blob, copy and delete change the engine's models; a body whose digest
    does not match is the engine's 400 and stores nothing; copy of an unknown model is 404."""
    f = await start_fleet([("ollama", {}, {"kind": "ollama"})], keys=KEYS)
    store = f.doubles[0].manage
    assert store is not None
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(os.urandom(3 << 20))
    blob = "sha256:" + hashlib.sha256(gguf.read_bytes()).hexdigest()
    client = ollama.Client(host=f.url, headers={"Authorization": f"Bearer {ADMIN}"})
    try:
        code, _, _ = await call(f, "HEAD", f"/api/blobs/{blob}")
        assert code == 404

        def run() -> dict[str, Any]:
            got = client.create_blob(gguf)
            created = [p.status for p in client.create(model="mine:1", files={"m.gguf": got},
                                                      stream=True)]
            copied = client.copy("mine:1", "yours:1").status
            deleted = client.delete("mine:1").status
            try:
                client.copy("nothing:1", "x:1")
                missing = None
            except ollama.ResponseError as e:
                missing = e.status_code
            return {"digest": got, "created": created, "copied": copied, "deleted": deleted,
                    "missing": missing}

        got = await deferToThread(run)
        assert got["digest"] == blob and store.blobs == {blob: 3 << 20}
        assert got["created"][-1] == "success"
        assert got["copied"] == "success" and got["deleted"] == "success"
        assert got["missing"] == 404
        assert "yours:1" in tags(f, 0) and "mine:1" not in tags(f, 0)
        code, _, _ = await call(f, "HEAD", f"/api/blobs/{blob}")
        assert code == 200
        wrong = "sha256:" + "0" * 64
        r = await treq.post(f"{f.url}/api/blobs/{wrong}", b"not the right bytes",
                            headers=Headers({b"authorization": [f"Bearer {ADMIN}".encode()]}),
                            pool=f.pool)
        assert r.code == 400 and "digest mismatch" in json.loads(await r.content())["error"]
        assert wrong not in store.blobs
    finally:
        await f.stop()


def _cut_upload(url: str, digest_path: str, length: int, sent: int) -> None:
    """Send a blob upload's head and the first ``sent`` of ``length`` bytes, then reset the
    connection."""
    host, port = urllib.parse.urlsplit(url).hostname, urllib.parse.urlsplit(url).port
    assert host is not None and port is not None
    with socket.create_connection((host, port)) as s:
        s.sendall(f"POST {digest_path} HTTP/1.1\r\nHost: {host}\r\n"
                  f"Authorization: Bearer {ADMIN}\r\nContent-Length: {length}\r\n\r\n".encode())
        chunk = os.urandom(64 * 1024)
        done = 0
        while done < sent:
            s.sendall(chunk)
            done += len(chunk)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")


@pytest_twisted.ensureDeferred
async def test_an_upload_cut_half_way_stores_nothing() -> None:
    """A client that sends half a blob and resets its connection: the engine's upload is cut
    too (it saw part of the body, never its end), nothing is stored, and HEAD says 404."""
    f = await start_fleet([("ollama", {}, {"kind": "ollama"})], keys=KEYS)
    store = f.doubles[0].manage
    assert store is not None
    blob = "sha256:" + "1" * 64
    try:
        await deferToThread(_cut_upload, f.url, f"/api/blobs/{blob}", 8 << 20, 4 << 20)
        await eventually(lambda: len(store.cut_uploads) == 1, 10)
        assert 0 < store.cut_uploads[0] < 8 << 20
        assert store.blobs == {}
        code, _, _ = await call(f, "HEAD", f"/api/blobs/{blob}")
        assert code == 404
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_a_large_upload_behind_a_slow_engine_holds_bounded_memory() -> None:
    """A blob of PHAROS_BLOB_TEST_BYTES (default 1 GiB) uploaded through Pharos to an engine
    reading 128 MiB/s arrives whole (the engine's digest matches,
    201) while the process (client, Pharos and engine together) grows by less than 100 MB:
    the client was held back (its producer paused) instead of Pharos buffering."""
    digest_of(BIG)  # before the fleet: hashing the source holds the reactor for seconds
    f = await start_fleet([("ollama", {}, {"kind": "ollama"})], keys=KEYS)
    store = f.doubles[0].manage
    assert store is not None
    store.read_rate = SLOW_READ
    try:
        m = await upload(f.url, ADMIN, BIG, f.pool)
        assert m.status == 201, m.body
        assert store.blobs == {digest_of(BIG): BIG}
        assert m.pauses > 0
        assert m.growth < RSS_BOUND, f"RSS grew {m.growth / 2**20:.1f} MiB"
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_an_engine_that_dies_mid_upload_is_a_502() -> None:
    """The engine's connections dropped while a blob is on its way: the client gets a 502 in
    Ollama's shape (or its connection cut), never a success, and nothing is stored."""
    size = 256 << 20
    digest_of(size)
    f = await start_fleet([("ollama", {}, {"kind": "ollama"})], keys=KEYS)
    store = f.doubles[0].manage
    assert store is not None
    store.read_rate = 8 << 20
    try:
        sending = ensureDeferred(upload(f.url, ADMIN, size, f.pool))
        await sleep(1.0)
        f.doubles[0].kill()
        try:
            m = await within(sending, 60)
        except ResponseFailed:
            pass  # the connection was cut before the reply could be read
        else:
            assert m.status == 502, m.body
            assert "did not answer" in json.loads(m.body)["error"]
        assert store.blobs == {}
    finally:
        await f.stop()
