"""Client captures (spec §14): what a real client sends, recorded through a sink in front of
Pharos and kept under ``tests/clients/<client>/<version>/``.

A capture is ``calls.jsonl`` (one request a line, in the order the client sent them: method,
path, query, headers, the body exactly as its bytes arrived, as text, and the status Pharos
answered) and ``meta.json`` (client, version, how and when it was recorded). Keys never land in
a capture: ``Authorization`` and ``x-api-key`` values are replaced by ``<KEY>`` or
``<OTHER-KEY>`` (the replay puts its own keys back), and text a client fills from the machine
(temporary paths, dates, ids) is replaced by placeholders so a re-recording on another day or
machine compares equal.

``Recorder`` wraps a site's root resource; ``compare`` gives the diff between a committed
capture and a fresh recording of the installed client (empty: no change), which the client
tests fail with. ``PHAROS_RECORD_CLIENTS=1`` rewrites the committed capture instead.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from twisted.web.resource import IResource, Resource, getChildForRequest
from twisted.web.server import Request, Site

HERE = Path(__file__).resolve().parents[1] / "clients"  # the captures beside their recorder
#: What a capture holds in place of the test's key, and of any other key a client sent.
KEY = "<KEY>"
OTHER_KEY = "<OTHER-KEY>"

#: Headers a capture leaves out: the transport's (host and port change every run) and values
#: the client derives from the machine or the moment rather than from what it was asked.
DROPPED = frozenset({
    "host", "content-length", "connection", "accept-encoding", "transfer-encoding",
    "x-stainless-retry-count", "x-stainless-timeout", "x-stainless-read-timeout",
    "x-stainless-os", "x-stainless-arch", "x-stainless-runtime-version",
    "x-stainless-package-version", "x-stainless-runtime", "x-stainless-lang",
    "x-stainless-async", "x-stainless-helper-method", "x-stainless-poll-helper",
    "x-stainless-raw-response", "x-stainless-stream-helper",
})
#: Headers kept by name only: their value says which machine or run it was (user-agent
#: strings carry the OS and runtime version; session ids are random).
NAME_ONLY = frozenset({"user-agent", "x-claude-code-session-id", "x-client-request-id",
                       "x-app", "x-request-id"})
SECRET = frozenset({"authorization", "x-api-key"})

#: Text a client fills in from the machine or the moment, and what replaces it.
SCRUB: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<UUID>"),
    (re.compile(r"/tmp/[A-Za-z0-9_.\-/]*"), "<TMP>"),
)
#: Dates only in bodies (a header's date is a version: anthropic-version 2023-06-01).
DATES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b20\d\d-\d\d-\d\d\b"), "<DATE>"),
    (re.compile(r"\b20\d\d/\d\d/\d\d\b"), "<DATE>"),
)


def scrub(text: str, extra: Sequence[tuple[re.Pattern[str], str]] = ()) -> str:
    """``text`` with machine- and moment-specific parts replaced by placeholders."""
    for pattern, repl in (*extra, *SCRUB):
        text = pattern.sub(repl, text)
    return text


@dataclass
class Call:
    """One request as the client sent it (keys replaced, machine details scrubbed)."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: str
    status: int | None = None

    def json(self) -> Any:
        """The body parsed (None: empty or not JSON)."""
        try:
            return json.loads(self.body) if self.body else None
        except ValueError:
            return None


def _secret(name: str, value: str, known: Collection[str]) -> str:
    if name == "authorization":
        scheme, _, rest = value.partition(" ")
        if rest:
            return f"{scheme} {KEY if rest.strip() in known else OTHER_KEY}"
    return KEY if value.strip() in known else OTHER_KEY


class Recorder(Resource):
    """Wraps a site's root: every request is recorded (``calls``), then served as before;
    ``keys``: the keys the test configured (recorded as ``<KEY>``, any other as
    ``<OTHER-KEY>``, so a replay sends a good key where the client did, a wrong one where it
    did)."""

    isLeaf = True

    def __init__(self, inner: IResource, keys: Collection[str] = (),
                 extra_scrub: Sequence[tuple[re.Pattern[str], str]] = ()) -> None:
        super().__init__()
        self.inner = inner
        self.keys = frozenset(keys)
        self.extra_scrub = tuple(extra_scrub)
        self.calls: list[Call] = []
        self.skip: Callable[[Call], bool] = lambda call: False

    @classmethod
    def around(cls, site: Site, **kw: Any) -> Recorder:
        """Put a recorder in front of ``site``'s resource; the recorder."""
        recorder = cls(site.resource, **kw)
        site.resource = recorder
        return recorder

    def render(self, request: Request) -> Any:
        assert request.content is not None
        raw = request.content.read()
        request.content.seek(0)
        headers: dict[str, str] = {}
        for name_b, values in request.requestHeaders.getAllRawHeaders():
            name = name_b.decode("latin-1").lower()
            if name in DROPPED:
                continue
            value = ",".join(v.decode("latin-1") for v in values)
            if name in SECRET:
                value = _secret(name, value, self.keys)
            elif name in NAME_ONLY:
                value = "<VALUE>"
            headers[name] = scrub(value, self.extra_scrub)
        uri = request.uri.decode("latin-1")
        path, _, query = uri.partition("?")
        call = Call(request.method.decode("latin-1"), path, query,
                    dict(sorted(headers.items())),
                    scrub(raw.decode("utf-8", "replace"), (*self.extra_scrub, *DATES)))
        if not self.skip(call):
            self.calls.append(call)

            def done(result: object) -> object:
                call.status = request.code
                return result

            request.notifyFinish().addBoth(done)
        return getChildForRequest(self.inner, request).render(request)


# --- the committed captures -----------------------------------------------------------------


def capture_dir(client: str, version: str) -> Path:
    return HERE / client / version


def load(client: str, version: str) -> list[Call]:
    """The committed capture of ``client`` at ``version`` (FileNotFoundError: none)."""
    path = capture_dir(client, version) / "calls.jsonl"
    return [Call(**json.loads(line)) for line in path.read_text().splitlines() if line]


def versions(client: str) -> list[str]:
    """The versions of ``client`` with a committed capture."""
    d = HERE / client
    return sorted(p.name for p in d.iterdir() if (p / "calls.jsonl").is_file()) if d.is_dir() \
        else []


def all_captures() -> list[tuple[str, str]]:
    """Every committed (client, version)."""
    return sorted((p.parent.parent.name, p.parent.name)
                  for p in HERE.glob("*/*/calls.jsonl"))


def save(client: str, version: str, calls: Iterable[Call], how: str) -> Path:
    """Write a capture (replacing any at that version); its folder."""
    d = capture_dir(client, version)
    d.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(asdict(c), ensure_ascii=False, sort_keys=True) for c in calls]
    (d / "calls.jsonl").write_text("\n".join(lines) + "\n")
    meta = {"client": client, "version": version, "recorded": time.strftime("%Y-%m-%d"),
            "how": how, "keys": f"Authorization and x-api-key values replaced by {KEY}"}
    (d / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return d


def _view(calls: Sequence[Call]) -> list[str]:
    """What a diff compares: each call's method, path, query, headers, status and body
    (JSON bodies pretty-printed with sorted keys so a diff names the field; their text as
    sent is compared too, so a change in escaping shows)."""
    out: list[str] = []
    for i, c in enumerate(calls):
        out.append(f"#{i} {c.method} {c.path}{'?' + c.query if c.query else ''} -> {c.status}")
        out.extend(f"  {k}: {v}" for k, v in c.headers.items())
        parsed = c.json()
        if parsed is not None:
            out.extend("  " + line for line in
                       json.dumps(parsed, indent=1, sort_keys=True,
                                  ensure_ascii=False).splitlines())
            escaped = "\\u" in c.body
            out.append(f"  (body as sent: {len(c.body)} chars, "
                       f"{'unicode-escaped' if escaped else 'raw'} text)")
        elif c.body:
            out.append(f"  body: {c.body!r}")
    return out


def compare(client: str, version: str, fresh: Sequence[Call], how: str) -> str:
    """The diff between the committed capture and ``fresh`` ("": the same). With
    ``PHAROS_RECORD_CLIENTS=1`` the committed capture is rewritten first (no diff)."""
    if os.environ.get("PHAROS_RECORD_CLIENTS") == "1":
        save(client, version, fresh, how)
    try:
        committed = load(client, version)
    except FileNotFoundError:
        return (f"no committed capture of {client} {version} (the installed version): record "
                f"it with PHAROS_RECORD_CLIENTS=1 and commit tests/clients/{client}/{version}/"
                f" (committed versions: {versions(client) or 'none'})")
    a, b = _view(committed), _view(fresh)
    if a == b:
        return ""
    return "\n".join(difflib.unified_diff(a, b, f"tests/clients/{client}/{version} (committed)",
                                          f"{client} {version} (installed, now)", lineterm=""))

