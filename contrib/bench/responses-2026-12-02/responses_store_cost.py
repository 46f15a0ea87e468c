"""What the Responses conversation state costs a store-eligible request (issue 17 item 6):
ConversationStore.put and .get (JSON + AES-256-GCM) and ConversationState.parse with a
previous_response_id (lookup, decrypt, expansion, re-encode, parse, prefix chain) against a
plain parse of the same expanded body (no chain: /v1/responses is not chained without the
state) and the parse of the same conversation sent whole as a chat (with its chain: what a
client keeping the state itself costs), for conversations of 2, 20 and 100 turns. CPU time per
call (time.process_time over N calls, best of 5 rounds). Usage:
    .venv/bin/python contrib/bench/responses-2026-12-02/responses_store_cost.py > results.json
"""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Any

from pharos.proxy.auth import Identity
from pharos.proxy.conversation import ConversationState
from pharos.proxy.parse import parse
from pharos.responses import ConversationStore

WHO = Identity(name="k", tenant="t")
TEXT = "The quick brown fox jumps over the lazy dog. " * 8  # ~360 bytes a message


def conversation(turns: int) -> list[Any]:
    items: list[Any] = []
    for i in range(turns):
        items.append({"role": "user", "content": f"{i} {TEXT}"})
        items.append({"type": "message", "role": "assistant", "id": f"msg_{i:032d}",
                      "status": "completed",
                      "content": [{"type": "output_text", "annotations": [], "text": TEXT}]})
    return items


def best(f: Any, n: int) -> float:
    rounds = []
    for _ in range(5):
        t = time.process_time()
        for _ in range(n):
            f()
        rounds.append((time.process_time() - t) / n)
    return min(rounds)


def main() -> None:
    store = ConversationStore(os.urandom(32), time.monotonic, max_responses=1_000_000,
                              max_age=1e9, max_bytes=64 << 20)
    state = ConversationState(store)
    rows = []
    for turns in (2, 20, 100):
        items = conversation(turns)
        plain = len(json.dumps(items, separators=(",", ":")))
        ids = iter(range(10**9))
        # best() calls each lambda at once, inside this iteration (B023 does not apply).
        put = best(lambda: store.put("t", f"r{next(ids)}", items), 200)  # noqa: B023
        store.put("t", f"prev{turns}", items)
        get = best(lambda: store.get("t", f"prev{turns}"), 200)  # noqa: B023
        body = json.dumps({"model": "tiny", "input": "next?",
                           "previous_response_id": f"prev{turns}", "store": True}).encode()
        expand = best(lambda: state.parse(body, WHO, None), 200)  # noqa: B023
        expanded = json.dumps({"model": "tiny", "store": True,
                               "input": [*items, {"role": "user", "content": "next?"}]}
                              ).encode()
        baseline = best(lambda: parse(expanded, "/v1/responses", None), 200)  # noqa: B023
        messages = [{"role": i["role"], "content": i["content"] if isinstance(i["content"], str)
                     else i["content"][0]["text"]} for i in items]
        chat = json.dumps({"model": "tiny", "messages": [
            *messages, {"role": "user", "content": "next?"}]}).encode()
        chat_parse = best(lambda: parse(chat, "/v1/chat/completions", None), 200)  # noqa: B023
        rows.append({"turns": turns, "items": len(items), "plaintext_bytes": plain,
                     "put_us": round(put * 1e6, 1), "get_us": round(get * 1e6, 1),
                     "expand_parse_us": round(expand * 1e6, 1),
                     "plain_parse_of_expanded_body_us": round(baseline * 1e6, 1),
                     "chat_parse_same_conversation_us": round(chat_parse * 1e6, 1)})
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      "machine": f"{platform.machine()} {os.cpu_count()} cores, "
                                 f"Python {platform.python_version()}",
                      "load_average": os.getloadavg(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
