"""Where the client captures live and how the real clients are run."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

SECRET = "phk-client-capture"
CLIENTS = Path(__file__).resolve().parents[1] / "clients"


def node_version(package: str) -> str:
    """The installed version of a pinned npm package (``make install`` runs npm ci)."""
    manifest = CLIENTS / "node_modules" / package / "package.json"
    assert manifest.is_file(), f"{package} is not installed under tests/clients: make install"
    return str(json.loads(manifest.read_text())["version"])


def claude_code(prompt: str, workdir: Path, model: str = "tiny") -> Callable[[str], Any]:
    """A runner for ``claude -p PROMPT`` (npm @anthropic-ai/claude-code) with
    ANTHROPIC_BASE_URL at Pharos, the key in ANTHROPIC_API_KEY, every model named ``model``,
    no traffic but to Pharos, a fresh HOME: (exit code, stdout, stderr)."""
    exe = CLIENTS / "node_modules" / ".bin" / "claude"
    node_version("@anthropic-ai/claude-code")

    def run(url: str) -> tuple[int, str, str]:
        (workdir / "home").mkdir(exist_ok=True)
        (workdir / "cwd").mkdir(exist_ok=True)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(workdir / "home"), "SHELL": "/bin/bash",
               "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": SECRET,
               "ANTHROPIC_MODEL": model, "ANTHROPIC_SMALL_FAST_MODEL": model,
               "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
               "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1"}
        r = subprocess.run([str(exe), "-p", prompt], capture_output=True, text=True, env=env,
                           timeout=300, cwd=workdir / "cwd", stdin=subprocess.DEVNULL)
        return r.returncode, r.stdout, r.stderr
    return run
