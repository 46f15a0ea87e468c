"""``make demo`` until the data plane lands: ``pharos doctor`` on real engines when they are
installed here (``make live-engines``), on the recorded captures in fixtures/ otherwise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.live.engines import engines  # noqa: E402

PHAROS = str(Path(sys.executable).parent / "pharos")


def doctor(*args: str) -> None:
    subprocess.run([PHAROS, "doctor", *args], check=False, timeout=120)


def main() -> int:
    live = False
    if engines.llamacpp_available():
        live = True
        print("== live engine: llama.cpp b11312 (built from source), started here ==")
        model = engines.gguf_tiny_model()
        assert model is not None
        with engines.start_llama_server(model) as eng:
            doctor("--url", eng.url)
    if engines.vllm_available():
        live = True
        print("== live engine: vLLM 0.32.0 (CPU build), started here (about 40 s) ==")
        model_dir = engines.hf_model_dir()
        assert model_dir is not None
        with engines.start_vllm(model_dir) as eng:
            doctor("--url", eng.url)
    if live:
        return 0
    print("== no live engines installed here (make live-engines builds them): "
          "replaying recorded captures from fixtures/ ==")
    shown: set[str] = set()
    for paths in sorted((ROOT / "fixtures").glob("*/*/*/paths.tsv"), reverse=True):
        engine = paths.parent.parent.parent.name
        if engine in shown:
            continue
        shown.add(engine)
        doctor("--capture", str(paths.parent))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
