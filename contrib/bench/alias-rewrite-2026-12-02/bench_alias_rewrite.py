"""The body sent to an engine that serves a model under another name (issue 17 item 1): the
targeted rewrite of the model's bytes (``pharos.models.rewrite_model``, what ``forward_body``
does now) against re-encoding the decoded body (what it did before), on chat bodies of 1 KB to
1 MB with ``model`` after ``messages`` (the OpenAI SDK's order: the rewrite's pass over the
bytes before the key is longest). Interleaved rounds; the median and the least of the per-call
times.

Usage: PYTHONPATH=. python contrib/bench/alias-rewrite-2026-12-02/bench_alias_rewrite.py
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
import timeit

from pharos.models import rewrite_model


def body(size: int, escaped: bool = False) -> bytes:
    """A chat body of about ``size`` bytes: messages first, then model and options;
    ``escaped``: non-ASCII text sent as \\u escapes (Python's json.dumps default)."""
    turn = "The quick brown fox jumps over the lazy dog, \"quoted\" {braces} [brackets]. "
    if escaped:
        turn = "Ünïcödé tëxt, \"quoted\" {braces} [brackets]. "
    messages: list[dict[str, str]] = []
    while len(json.dumps(messages)) < size:
        messages.append({"role": "user" if len(messages) % 2 == 0 else "assistant",
                         "content": turn * 4})
    return json.dumps({"messages": messages, "model": "llama-8b", "stream": True,
                       "max_tokens": 256, "temperature": 0.2}, ensure_ascii=escaped).encode()


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    print(f"# {platform.node()} Python {platform.python_version()} "
          f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print("| body | text | rewrite us (median, min) | re-encode us (median, min) | "
          "re-encode / rewrite (medians) |")
    print("| --- | --- | --- | --- | --- |")
    for size, escaped in [(s, e) for e in (False, True)
                          for s in (1_000, 16_000, 256_000, 1_000_000)]:
        raw = body(size, escaped)
        decoded = json.loads(raw)
        assert json.loads(rewrite_model(raw, "llama3.1:8b", True) or b"") == {
            **decoded, "model": "llama3.1:8b"}

        def rewrite(raw: bytes = raw) -> object:
            return rewrite_model(raw, "llama3.1:8b", True)

        def reencode(decoded: dict[str, object] = decoded) -> object:
            d = dict(decoded)
            d["model"] = "llama3.1:8b"
            return json.dumps(d, ensure_ascii=False, separators=(",", ":")).encode()

        number = max(20, 4_000_000 // len(raw))
        a: list[float] = []
        b: list[float] = []
        for _ in range(rounds):
            a.append(timeit.timeit(rewrite, number=number) / number * 1e6)
            b.append(timeit.timeit(reencode, number=number) / number * 1e6)
        ra, rb = statistics.median(a), statistics.median(b)
        text = "\\u escapes" if escaped else "plain UTF-8"
        print(f"| {len(raw) / 1000:.0f} KB | {text} | {ra:.1f}, {min(a):.1f} | "
              f"{rb:.1f}, {min(b):.1f} | {rb / ra:.1f}x |")


if __name__ == "__main__":
    main()
