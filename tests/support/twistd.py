"""Running Pharos under twistd on a free port."""

from __future__ import annotations

import socket
import sys
import time
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent
TWISTD = str(BIN / "twistd")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(port: int, timeout: float = 15.0) -> int:
    """Poll /healthz until it answers; return its status."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                return int(r.status)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
