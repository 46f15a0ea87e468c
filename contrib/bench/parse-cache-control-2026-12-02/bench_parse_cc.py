"""Time ``parse`` of an ~8k-token /v1/messages body with 35 tools (issue 18 item 5 follow-up).

Run once per code version; ``run.sh`` interleaves the versions. Two bodies: Claude Code's shape
(``cache_control`` on a system block, on the last tool and on the newest message's block) and
the same body without any marker. Prints one JSON line: per body the median of ``ROUNDS``
medians of ``N`` calls, in microseconds."""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

from pharos.proxy.parse import parse

N = 200
ROUNDS = 9
CC = {"type": "ephemeral"}


def body(marked: bool) -> bytes:
    """~32 KB of message text and 35 tools: about 8k tokens at 4 bytes a token."""
    def mark(block: dict[str, Any]) -> dict[str, Any]:
        return {**block, "cache_control": CC} if marked else block
    tools = [{"name": f"tool_{i}", "description": f"Does thing {i}. " * 12,
              "input_schema": {"type": "object", "properties": {
                  "path": {"type": "string", "description": "a path"},
                  "count": {"type": "integer"}}, "required": ["path"]}} for i in range(35)]
    tools[-1] = mark(tools[-1])
    system = [{"type": "text", "text": "billing header"},
              mark({"type": "text", "text": "You are an agent. " * 200})]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "<reminder> " * 300},
                                     {"type": "text", "text": "do the task " * 100}]},
        {"role": "system", "content": "# Environment\n" + "- a fact\n" * 300},
    ]
    for i in range(6):
        messages.append({"role": "assistant", "content": [{"type": "text",
                                                           "text": f"step {i} " * 120}]})
        messages.append({"role": "user", "content": f"result {i} " * 110})
    messages[-1] = {"role": "user", "content": [mark({"type": "text",
                                                      "text": messages[-1]["content"]})]}
    return json.dumps({"model": "m", "max_tokens": 32000, "stream": True, "system": system,
                       "tools": tools, "messages": messages}).encode()


def main() -> None:
    out: dict[str, Any] = {}
    for name, marked in (("marked", True), ("plain", False)):
        raw = body(marked)
        parse(raw, "/v1/messages")
        meds = []
        for _ in range(ROUNDS):
            times = []
            for _ in range(N):
                t = time.perf_counter()
                parse(raw, "/v1/messages")
                times.append(time.perf_counter() - t)
            meds.append(statistics.median(times))
        p = parse(raw, "/v1/messages")
        out[name] = {"us": round(statistics.median(meds) * 1e6, 1), "bytes": len(raw),
                     "prompt_tokens": p.prompt_tokens, "links": len(p.chain)}
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
