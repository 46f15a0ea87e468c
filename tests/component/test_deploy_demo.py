"""``make demo``'s first screen (issue 18 item 6): the curl hint is printed plainly, once, after
the fleet is ready, and the request it suggests works."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
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


def test_demo_prints_its_curl_hint_plainly_once_when_ready(tmp_path: Path) -> None:
    """``twistd -n pharos --demo`` (on a free port through ``-c``, as ``make demo`` runs it
    on 8090) prints the hint as plain lines, not ``[stderr#error]`` log events, exactly once,
    after the log line saying the public listener is open; the chat request it names answers
    with a stream; on Ctrl-C Pharos drains with its engines still up (none reported
    unreachable)."""
    port = free_port()
    cfg = tmp_path / "demo.yaml"
    cfg.write_text(f"listen: 127.0.0.1:{port}\ndrain: {{grace: 0s, timeout: 5s}}\n")
    proc = subprocess.Popen([TWISTD, "-n", "--pidfile=", "pharos", "--demo", "-c", str(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, proc.communicate()[0].decode()
            assert time.monotonic() < deadline, "the demo never became ready"
            time.sleep(0.1)
        # Ready: the hint was written in the same reactor turn as the listener opened (or the
        # one after); ask what it suggests meanwhile.
        body = {"model": "llama3.2:3b", "stream": True,
                "messages": [{"role": "user", "content": "Hello"}]}
        req = urllib.request.Request(f"{base}/v1/chat/completions", json.dumps(body).encode(),
                                     {"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            stream = r.read().decode()
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert stream.rstrip().endswith("data: [DONE]"), stream[-200:]
    lines = out.splitlines()
    hint = f"Pharos demo on {base} in front of three simulated engines. Try:"
    assert lines.count(hint) == 1, out
    at = lines.index(hint)
    opened = [i for i, line in enumerate(lines) if "public listener open" in line]
    assert opened and opened[0] < at, out
    curl = lines[at + 1]
    assert curl.startswith(f"  curl -N {base}/v1/chat/completions "), curl
    (suggested,) = re.findall(r"-d '(.*)'$", curl)
    assert json.loads(suggested) == body
    assert "[stderr#error]" not in out and "[stdout#info]" not in out, out
    assert "unreachable" not in out and "Traceback" not in out, out
    assert "Server Shut Down" in out
