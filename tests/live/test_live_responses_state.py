"""Layer 4: Responses conversation state (issue 17 item 6) against a real llama.cpp
(``llama-server`` b11312 built from source, the tiny generated GGUF), which keeps no state and
refuses ``previous_response_id``: through Pharos with ``responses.store`` on, the OpenAI
Python SDK's multi-turn ``responses.create`` (plain, then streamed) is served, each turn's
prompt holding the turns before. Skipped with ``PHAROS_LIVE=0``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_twisted
from openai.types.responses import ResponseCompletedEvent
from twisted.internet.threads import deferToThread

from pharos.config import Key, Responses
from pharos.proxy.auth import digest
from tests.live.engines import engines
from tests.support.fleet import start_fleet
from tests.support.live import ensure_installed

pytestmark = pytest.mark.live

SECRET = "phk-live-responses"


@pytest.fixture(scope="module")
def llama() -> Iterator[engines.RunningEngine]:
    """llama-server with the tiny GGUF as ``tiny``."""
    ensure_installed("llamacpp")
    model = engines.gguf_tiny_model()
    assert model is not None
    with engines.start_llama_server(model, alias="tiny", ctx=8192) as eng:
        yield eng


@pytest_twisted.ensureDeferred
async def test_multi_turn_responses_on_llamacpp(llama: engines.RunningEngine,
                                                tmp_path: Path) -> None:
    """llama.cpp itself refuses previous_response_id (400); through Pharos a second turn
    (plain) and a third (streamed) naming the turn before are answered, each with more input
    tokens than the turn before holds, and the reply ids are llama.cpp's own."""
    key = tmp_path / "key"
    key.write_text("cd" * 32)
    fleet = await start_fleet([], extra=[llama.url],
                              keys=(Key(name="team", sha256=digest(SECRET)),),
                              responses=Responses(store=True, key_file=str(key)))
    direct = openai.OpenAI(base_url=llama.url + "/v1", api_key="unused", max_retries=0)
    api = openai.OpenAI(base_url=fleet.url + "/v1", api_key=SECRET, max_retries=0)

    def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        r1 = api.responses.create(model="tiny", input="Hello there", store=True,
                                  max_output_tokens=8)
        try:
            direct.responses.create(model="tiny", input="x", previous_response_id=r1.id,
                                    max_output_tokens=4)
            out["direct"] = None
        except openai.APIStatusError as e:
            out["direct"] = e.status_code
        r2 = api.responses.create(model="tiny", input="And then?", store=True,
                                  previous_response_id=r1.id, max_output_tokens=8)
        events = list(api.responses.create(model="tiny", input="Go on", store=True,
                                           previous_response_id=r2.id, stream=True,
                                           max_output_tokens=8))
        out.update(r1=r1, r2=r2, final=events[-1])
        return out

    try:
        got = await deferToThread(run)
    finally:
        direct.close()
        api.close()
        await fleet.stop()
    assert got["direct"] == 400
    r1, r2, final = got["r1"], got["r2"], got["final"]
    assert isinstance(final, ResponseCompletedEvent)
    assert r1.usage and r2.usage and final.response.usage
    assert r2.usage.input_tokens > r1.usage.input_tokens + r1.usage.output_tokens
    assert final.response.usage.input_tokens > r2.usage.input_tokens + r2.usage.output_tokens
    assert len({r1.id, r2.id, final.response.id}) == 3
