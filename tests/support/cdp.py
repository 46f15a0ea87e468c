"""Test helper: Chromium driven over ``--remote-debugging-pipe`` (the DevTools protocol as
NUL-separated JSON on fds 3 and 4), enough to open a page and read its live DOM later; no
WebSocket client or browser-automation package needed. Blocking: run it off the reactor."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any


class Pipe:
    """One headless Chromium and its DevTools pipe."""

    def __init__(self, chromium: str, flags: tuple[str, ...], profile: Path) -> None:
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()

        def fds() -> None:
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.proc = subprocess.Popen(
            [chromium, *flags, "--remote-debugging-pipe", "about:blank"],
            preexec_fn=fds, pass_fds=(3, 4), env={"HOME": str(profile)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0

    def open(self, url: str) -> str:
        """A new tab on ``url``; its session id."""
        target = self.call("Target.createTarget", {"url": url})["targetId"]
        return str(self.call("Target.attachToTarget", {"targetId": target, "flatten": True})
                   ["sessionId"])

    def evaluate(self, session: str, expression: str) -> Any:
        """The value of ``expression`` in the tab, now."""
        result = self.call("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True}, session=session)
        return result.get("result", {}).get("value")

    def call(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                doc = json.loads(raw)
                if doc.get("id") == self._id:
                    if "error" in doc:
                        raise RuntimeError(doc["error"])
                    return dict(doc.get("result", {}))
            assert time.monotonic() < deadline, f"no answer to {method}"
            chunk = os.read(self._r, 1 << 16)
            assert chunk, "chromium closed the pipe"
            self._buf += chunk

    def close(self) -> None:
        """Close the browser (killed if it does not go) and the pipe."""
        with contextlib.suppress(Exception):  # it may be gone already
            self.call("Browser.close", timeout=5)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self._w)
        os.close(self._r)
