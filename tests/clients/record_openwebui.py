"""Record Open WebUI's capture (by hand: Open WebUI is not installed by ``make install``).

    python -m tests.clients.record_openwebui VENV [--port 18081] [--connection openai|ollama]

``VENV`` holds Open WebUI (``python3 -m venv VENV && VENV/bin/pip install open-webui==0.12.4
torch==2.13.0+cpu``: 2.9 GB, about 5 minutes; CPU torch keeps the CUDA wheels out; its pins,
openai 2.x and anthropic 0.x among them, conflict with the clients the tests pin, so it cannot
share the test venv). This starts Pharos with a key in front of an Ollama-like double and
llama.cpp's recorded replies (as test_clients.py does) behind a recording sink, starts Open
WebUI offline (no login, its OpenAI connection at Pharos with the key, its Ollama connection at
Pharos without one, persistent config off), opens it in headless Chromium, types one chat to
``tiny`` over the OpenAI connection and waits for the reply and the requests Open WebUI sends
after it; the capture goes to tests/clients/open-webui/<version>/ and is replayed at layer 3 by
test_clients_replay.py. Open WebUI logs that it cannot load its embedding model (offline) and
serves chat regardless.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from twisted.internet import defer, reactor, threads
from twisted.python.failure import Failure

from pharos.config import Key
from pharos.proxy.auth import digest
from tests.support.cdp import Pipe
from tests.support.fleet import start_fleet
from tests.support.recorded_engine import start_recorded_llamacpp
from tests.support.sink import Recorder, save

SECRET = "phk-client-capture"
HOW = "python -m tests.clients.record_openwebui VENV (by hand)"


def openwebui(venv: Path, port: int, pharos: str, data: Path,
              connection: str) -> subprocess.Popen[bytes]:
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(data / "home"),
           "DATA_DIR": str(data), "ENABLE_PERSISTENT_CONFIG": "False", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "OFFLINE_MODE": "true", "WEBUI_AUTH": "False",
           "ENABLE_VERSION_UPDATE_CHECK": "false", "ANONYMIZED_TELEMETRY": "false",
           "RAG_EMBEDDING_MODEL_AUTO_UPDATE": "false", "OPENAI_API_BASE_URL": pharos + "/v1",
           "OPENAI_API_KEY": SECRET, "OLLAMA_BASE_URL": pharos, "ENABLE_OLLAMA_API": "true",
           "ENABLE_OPENAI_API": "true" if connection == "openai" else "false"}
    log = open(data / "open-webui.log", "wb")  # noqa: SIM115 (the process keeps it)
    return subprocess.Popen([str(venv / "bin" / "open-webui"), "serve", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=log, stderr=log,
                            start_new_session=True)


def wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


def chat(port: int, model: str, text: str, profile: Path) -> str:
    """Type ``text`` to ``model`` in Open WebUI's page; the page's text afterwards."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Chromium is not installed (apt-get install chromium)"
    browser = Pipe(chromium, ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                              "--disable-background-networking", "--disable-component-update",
                              "--disable-sync", "--window-size=1200,900",
                              f"--user-data-dir={profile}"), profile)
    try:
        tab = browser.open(f"http://127.0.0.1:{port}/?models={model}")
        time.sleep(10)
        # the release notes' modal covers the page on a first visit
        browser.evaluate(tab, "[...document.querySelectorAll('button')]"
                              ".filter(b => /Let's Go/.test(b.innerText)).forEach(b => b.click())")
        time.sleep(2)
        assert browser.evaluate(tab, "(() => { const e = document.getElementById('chat-input');"
                                     " if (e) e.focus(); return !!e })()"), "no chat input"
        browser.call("Input.insertText", {"text": text}, session=tab)
        time.sleep(1)
        key = {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13}
        browser.call("Input.dispatchKeyEvent", {"type": "keyDown", "text": "\r", **key},
                     session=tab)
        browser.call("Input.dispatchKeyEvent", {"type": "keyUp", **key}, session=tab)
        time.sleep(40)  # the reply, then its title, tags and follow-up requests
        return str(browser.evaluate(tab, "document.body.innerText"))
    finally:
        browser.close()


async def record(venv: Path, port: int, connection: str) -> None:
    version = subprocess.run([str(venv / "bin" / "python"), "-c",
                              "import importlib.metadata as m; print(m.version('open-webui'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    engine, url = start_recorded_llamacpp()
    # The Ollama connection sends no key: Pharos runs without keys for it.
    keys = (Key(name="team", sha256=digest(SECRET)),) if connection == "openai" else ()
    fleet = await start_fleet([("ollama", {"loaded": ["llama3.2:3b"]}, {"kind": "ollama"})],
                              extra=[url], keys=keys)
    fleet.ports.append(engine)
    recorder = Recorder.around(fleet.ports[-2].factory,  # type: ignore[attr-defined]
                               keys=(SECRET,))
    work = Path(tempfile.mkdtemp(prefix="pharos-openwebui-"))
    (work / "home").mkdir()
    proc = openwebui(venv, port, fleet.url, work, connection)
    try:
        await threads.deferToThread(wait_http, f"http://127.0.0.1:{port}/health", 300)
        model = "tiny" if connection == "openai" else "llama3.2:3b"
        page = await threads.deferToThread(chat, port, model, "Hello there", work / "chrome")
        print(page[-600:])
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        await fleet.stop()
    client = "open-webui" if connection == "openai" else "open-webui-ollama"
    d = save(client, version, recorder.calls, f"{HOW} --connection {connection}")
    print(f"{len(recorder.calls)} calls recorded into {d}")
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("venv", type=Path)
    ap.add_argument("--port", type=int, default=18081)
    ap.add_argument("--connection", choices=("openai", "ollama"), default="openai",
                    help="the connection the chat goes through (ollama: the other one off, "
                         "Pharos without keys); captures open-webui / open-webui-ollama")
    args = ap.parse_args()
    failed: list[Failure] = []

    def failure(f: Failure) -> None:
        failed.append(f)
        f.printTraceback()

    def run() -> Any:
        d = defer.ensureDeferred(record(args.venv, args.port, args.connection))
        d.addErrback(failure)
        d.addBoth(lambda _: reactor.stop())
        return d

    reactor.callWhenRunning(run)
    reactor.run()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
