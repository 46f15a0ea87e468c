"""Record live captures of the real engines with ``pharos doctor --record`` (the one recorder).

    python -m tests.live.capture llamacpp|vllm [--out fixtures]

drives each engine through its states and records each into
``<out>/<engine>/<version>/<state>/``: ``idle`` (with the recorded replies to streamed and
non-streamed chat and completions), ``busy`` (more requests than slots or sequences, so some
wait), ``prefix`` (after the same long prompt twice) and, for llama.cpp, ``nometrics`` (started
without --metrics, where /slots is the fallback).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

from tests.live.engines import engines
from tests.live.load import same_prompt_twice, start_streams, stop_all, wait_started

PHAROS = str(Path(sys.executable).parent / "pharos")


def record(eng: engines.RunningEngine, directory: Path, *extra: str) -> None:
    """One ``pharos doctor --record`` of the engine into ``directory``."""
    cmd = [PHAROS, "doctor", "--url", eng.url, "--record", str(directory), *extra,
           "--meta", f"engine_command={shlex.join(eng.argv)}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
    print(f"recorded {directory}")


def slow_body(max_tokens: int) -> dict[str, object]:
    return {"model": "tiny", "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": max_tokens, **engines.RUN_TO_MAX_TOKENS}


def capture_llamacpp(out: Path) -> None:
    base = out / "llamacpp" / f"b{engines.LLAMA_BUILD_NUMBER}"
    model = engines.gguf_slow_model()
    tiny = engines.gguf_tiny_model()
    assert model is not None and tiny is not None
    with engines.start_llama_server(tiny, parallel=engines.LLAMA_PARALLEL) as eng:
        record(eng, base / "idle", "--streams")
    with engines.start_llama_server(model, parallel=engines.LLAMA_PARALLEL) as eng:
        streams = start_streams(eng.url, slow_body(engines.LLAMA_SLOW_MAX_TOKENS),
                                engines.LLAMA_PARALLEL + 1)
        try:
            wait_started(streams, engines.LLAMA_PARALLEL)
            time.sleep(0.5)
            record(eng, base / "busy")
        finally:
            stop_all(streams)
    with engines.start_llama_server(tiny, parallel=engines.LLAMA_PARALLEL) as eng:
        same_prompt_twice(eng.url, seed=3)
        record(eng, base / "prefix")
    # started without --metrics: /metrics answers 501 and /slots is the fallback
    with engines.start_llama_server(model, parallel=engines.LLAMA_PARALLEL,
                                    metrics=False) as eng:
        streams = start_streams(eng.url, slow_body(engines.LLAMA_SLOW_MAX_TOKENS), 1)
        try:
            wait_started(streams, 1)
            record(eng, base / "nometrics")
        finally:
            stop_all(streams)


def capture_vllm(out: Path) -> None:
    base = out / "vllm" / engines.VLLM_VERSION
    model = engines.hf_model_dir()
    assert model is not None
    with engines.start_vllm(model, max_num_seqs=engines.VLLM_MAX_NUM_SEQS) as eng:
        record(eng, base / "idle", "--streams")
        streams = start_streams(eng.url, slow_body(engines.VLLM_SLOW_MAX_TOKENS),
                                engines.VLLM_CONCURRENT)
        try:
            wait_started(streams, engines.VLLM_MAX_NUM_SEQS)
            time.sleep(0.5)
            record(eng, base / "busy")
        finally:
            stop_all(streams)
        time.sleep(2)
        same_prompt_twice(eng.url, seed=3)
        record(eng, base / "prefix")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("engine", choices=["llamacpp", "vllm"])
    parser.add_argument("--out", default="fixtures", help="fixtures root (default: fixtures)")
    args = parser.parse_args()
    out = Path(args.out)
    if args.engine == "llamacpp":
        capture_llamacpp(out)
    else:
        capture_vllm(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
