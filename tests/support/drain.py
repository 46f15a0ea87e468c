"""The pharos console script and a blocking wait, for process tests."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

PHAROS = str(Path(sys.executable).parent / "pharos")


def until(check: Any, timeout: float = 30.0) -> Any:
    """Poll ``check`` every 50 ms until it returns something true; that value."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
