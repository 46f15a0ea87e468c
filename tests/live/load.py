"""Client-side ground truth for live tests: slow streams whose state the client itself sees."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import urllib.parse
from typing import Any


class SlowStream(threading.Thread):
    """One streamed chat request; ``started`` is set once its first token arrived.

    A request whose first token arrived is running on the engine; one still without it after
    the others started is waiting. ``stop()`` closes the connection (the engine cancels it).
    """

    def __init__(self, base_url: str, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        url = urllib.parse.urlparse(base_url)
        assert url.hostname in ("127.0.0.1", "localhost")
        self._conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
        self._body = json.dumps({**body, "stream": True}).encode()
        self.started = threading.Event()
        self.finished = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._conn.request("POST", "/v1/chat/completions", self._body,
                               {"Content-Type": "application/json"})
            resp = self._conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"status {resp.status}: {resp.read()[:200]!r}")
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                event = json.loads(line[5:])
                for choice in event.get("choices") or ():
                    if (choice.get("delta") or {}).get("content"):
                        self.started.set()
        except (OSError, http.client.HTTPException, ValueError, AttributeError) as e:
            if not self.finished.is_set():
                self.error = e
        finally:
            self.finished.set()

    def stop(self) -> None:
        """Close the connection: the client is gone, and the engine stops generating."""
        self.finished.set()
        with contextlib.suppress(OSError):
            sock = self._conn.sock
            if sock is not None:
                sock.shutdown(2)
        self._conn.close()


def doctor(url: str) -> dict[str, Any]:
    """What ``pharos doctor --url URL --json`` (kind detected) reads from one engine now."""
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).parent / "pharos"
    r = subprocess.run([str(exe), "doctor", "--url", url, "--json", "--timeout", "10"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    report: dict[str, Any] = json.loads(r.stdout)["backends"][0]
    return report


def start_streams(base_url: str, body: dict[str, Any], n: int) -> list[SlowStream]:
    """Start ``n`` slow streams at once."""
    streams = [SlowStream(base_url, body) for _ in range(n)]
    for s in streams:
        s.start()
    return streams


def wait_started(streams: list[SlowStream], count: int, timeout: float = 120.0) -> None:
    """Wait until at least ``count`` streams have their first token."""
    import time

    deadline = time.monotonic() + timeout
    while sum(s.started.is_set() for s in streams) < count:
        errors = [s.error for s in streams if s.error is not None]
        assert not errors, errors
        assert time.monotonic() < deadline, "streams did not start in time"
        time.sleep(0.05)


def stop_all(streams: list[SlowStream]) -> None:
    """Close every stream and wait for their threads."""
    for s in streams:
        s.stop()
    for s in streams:
        s.join(timeout=30)


class BlockingFetcher:
    """Pharos's Fetcher over blocking urllib GETs: resolve runs in-process in tens of
    milliseconds, so a read falls inside the window where the client-side truth holds."""

    def __init__(self, base_url: str) -> None:
        self.base = base_url.rstrip("/")

    def fetch(self, path: str) -> Any:
        import urllib.error
        import urllib.request

        from twisted.internet.defer import fail, succeed

        from pharos.engine.fetch import Fetched, FetchError

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(self.base + path, timeout=5) as r:
                return succeed(Fetched(r.status, r.headers.get("content-type", ""), r.read()))
        except urllib.error.HTTPError as e:
            return succeed(Fetched(e.code, e.headers.get("content-type", ""), e.read()))
        except OSError as e:
            return fail(FetchError(str(e)))


def read(url: str) -> dict[str, Any]:
    """What Pharos's resolve (kind detected) reads from the engine now, as doctor's JSON."""
    from pharos.engine.doctor import examine
    from tests.support.plan import run

    doc: dict[str, Any] = run(examine(url, BlockingFetcher(url), "auto")).as_json()
    return doc


def same_prompt_twice(url: str, seed: int, words: int = 450) -> list[dict[str, Any]]:
    """The replies to one long prompt sent twice, one after the other (a prefix-cache probe)."""
    from tests.live.engines import engines

    body = {"model": "tiny", "max_tokens": 4,
            "messages": [{"role": "user", "content": engines.long_prompt(words, seed=seed)}]}
    replies = []
    for _ in range(2):
        status, raw = engines.http_post_json(url + "/v1/chat/completions", body)
        assert status == 200, raw[:300]
        replies.append(json.loads(raw))
    return replies
