"""Layer 3 in a real browser (issue 12 item 7): headless Chromium loads ``/status`` and
``/live`` against a fleet with traffic flowing, saves screenshots under the test's tmp dir,
and the rendered DOM shows every backend, and the map's counters, read from the live DOM over
the DevTools pipe, show it received events.
Skipped, with the reason, where Chromium is absent (``apt-get install chromium``)."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThread
from twisted.internet.utils import getProcessOutputAndValue

from tests.support.cdp import Pipe
from tests.support.fleet import sleep
from tests.support.pages import MARKER, start_pages

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None,
                                reason="Chromium is not installed (apt-get install chromium)")


async def chromium(url: str, *args: str, profile: Path) -> bytes:
    """Run headless Chromium on ``url`` with ``args``; its stdout (the DOM with --dump-dom)."""
    assert CHROMIUM is not None
    flags = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", f"--user-data-dir={profile}", "--window-size=1200,1000",
             "--timeout=3000", "--run-all-compositor-stages-before-draw")
    d: Deferred[tuple[bytes, bytes, int]] = getProcessOutputAndValue(
        CHROMIUM, (*flags, *args, url), env={"HOME": str(profile)})
    out, err, code = await d.addTimeout(60, reactor)
    assert code == 0, err[-2000:]
    return out


def read_map_counters(url: str, profile: Path) -> dict[str, Any]:
    """Open ``url`` in headless Chromium and wait (up to 30 s) until the map's script counted
    events; its counters as the page shows them."""
    assert CHROMIUM is not None
    browser = Pipe(CHROMIUM, ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                              "--no-first-run", "--disable-background-networking",
                              "--disable-component-update", "--disable-sync",
                              f"--user-data-dir={profile}"), profile)
    try:
        tab = browser.open(url)
        read = ("({events: +document.getElementById('events').textContent,"
                " requests: +document.getElementById('requests').textContent,"
                " stream: document.getElementById('stream').textContent})")
        deadline = time.monotonic() + 30
        while True:
            counters = browser.evaluate(tab, read) or {}
            if counters.get("requests") or time.monotonic() > deadline:
                return dict(counters)
            time.sleep(0.2)
    finally:
        browser.close()


@pytest_twisted.ensureDeferred
async def test_status_and_live_render_in_chromium(tmp_path: Path) -> None:
    """With requests flowing, /status's DOM names every backend and lists requests, /live's
    DOM lists every backend and its counters (read from the running page) show events and
    requests received and the stream open; both pages are saved as screenshots (status.png,
    live.png) under the tmp dir."""
    rig = await start_pages(keys=())
    flowing = True

    seen_readers: list[int] = []

    async def traffic() -> None:
        while flowing:
            if rig.pages.live.readers:
                seen_readers.append(len(rig.pages.live.readers))
            await rig.chat(stream=True)
            await sleep(0.05)

    loop = Deferred.fromCoroutine(traffic())
    try:
        await sleep(0.3)
        dom = {}
        for page in ("status", "live"):
            # With --screenshot, --dump-dom waits for it: the DOM after --timeout, with the
            # map's events in (alone, it dumps at the load event, before any arrive).
            dom[page] = (await chromium(rig.url + "/" + page, "--dump-dom",
                                        f"--screenshot={tmp_path / page}.png",
                                        profile=tmp_path / f"profile-{page}")).decode()
            assert (tmp_path / f"{page}.png").stat().st_size > 5000
        status, live = dom["status"], dom["live"]
        for url in rig.fleet.pharos.state.backends:
            assert f'data-backend="{url}"' in status
            assert f'data-backend="{url}"' in live
        assert status.count("<tr>") > 10
        # --dump-dom dumps at the load event, before the stream's events arrive: the map's
        # own counters are read from the live DOM over the DevTools pipe.
        assert re.search(r'id="events">\d+<', live) and 'src="/live/map.js"' in live
        counters = await deferToThread(read_map_counters, rig.url + "/live",
                                       tmp_path / "profile-cdp")
        assert counters["events"] > 0 and counters["requests"] > 0, counters
        assert counters["stream"] != "connecting" and seen_readers
        assert MARKER not in status and MARKER not in live
        print(f"screenshots: {tmp_path / 'status.png'} {tmp_path / 'live.png'}")
    finally:
        flowing = False
        await loop
        await rig.close()
