#!/usr/bin/env python3
"""Write tiny llama-architecture GGUF models for llama.cpp's ``llama-server``.

Random weights (fixed seed), a GPT-2-style byte-level BPE vocabulary trained here on local text
(Python's own stdlib sources, in sorted order), and a ChatML chat template.  Needs the ``gguf``
(0.19.0), ``tokenizers`` and ``numpy`` packages: ``setup.sh`` installs them into
``$CACHE/tools-venv`` and runs this script with that venv's python.

Sizes:

* ``tiny``: under 1 MB, for fast functional tests.
* ``slow``: about 50 MB, so each token costs real compute and requests stay in flight long
  enough to observe running/deferred requests on the server.

Output: ``${PHAROS_ENGINE_CACHE:-~/.cache/pharos-engines}/models/tiny-llama-<size>.gguf``
(or ``--out-dir``).  An existing file is kept unless ``--force``.

The output projection is scaled so logits spread widely (std ~4) and the rows of the special
tokens are zero: the end-of-turn token then has a vanishing probability, so a generation runs to
``max_tokens`` instead of stopping at random.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEED = 1234
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LOGIT_STD = 4.0
CORPUS_BYTES = 3_000_000


@dataclass(frozen=True)
class Size:
    name: str
    vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx_train: int


SIZES = {
    "tiny": Size("tiny", vocab=2048, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=192,
                 n_ctx_train=8192),
    "slow": Size("slow", vocab=4096, n_embd=512, n_layer=6, n_head=8, n_head_kv=4, n_ff=1536,
                 n_ctx_train=8192),
}


def default_cache() -> Path:
    env = os.environ.get("PHAROS_ENGINE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "pharos-engines"


def corpus_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in stdlib.glob("*.py") if p.is_file())


def corpus(limit: int = CORPUS_BYTES) -> Iterator[str]:
    """Python's stdlib sources (top-level modules, sorted), at most ``limit`` bytes."""
    total = 0
    for path in corpus_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for i in range(0, len(text), 4096):
            chunk = text[i:i + 4096]
            yield chunk
            total += len(chunk)
            if total >= limit:
                return


def train_tokenizer(vocab_size: int) -> tuple[list[str], list[str], dict[str, int]]:
    """Return (tokens by id, merges as 'a b', special token ids)."""
    tk: Any = importlib.import_module("tokenizers")
    decoders, models = tk.decoders, tk.models
    pre_tokenizers, trainers = tk.pre_tokenizers, tk.trainers

    tok = tk.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    tokens = [""] * len(vocab)
    for piece, idx in vocab.items():
        tokens[idx] = piece
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    specials = {s: vocab[s] for s in SPECIAL_TOKENS}
    return tokens, merges, specials


def write_gguf(size: Size, out: Path) -> None:
    np: Any = importlib.import_module("numpy")
    gguf: Any = importlib.import_module("gguf")

    tokens, merges, specials = train_tokenizer(size.vocab)
    n_vocab = len(tokens)
    rng = np.random.default_rng(SEED)

    tmp = out.with_suffix(".gguf.tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(f"pharos-tiny-llama-{size.name}")
    w.add_context_length(size.n_ctx_train)
    w.add_embedding_length(size.n_embd)
    w.add_block_count(size.n_layer)
    w.add_feed_forward_length(size.n_ff)
    w.add_head_count(size.n_head)
    w.add_head_count_kv(size.n_head_kv)
    w.add_rope_dimension_count(size.n_embd // size.n_head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([
        gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in tokens
    ])
    w.add_token_merges(merges)
    w.add_bos_token_id(specials[ENDOFTEXT])
    w.add_eos_token_id(specials[IM_END])
    w.add_eot_token_id(specials[IM_END])
    w.add_pad_token_id(specials[ENDOFTEXT])
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)

    def mat(rows: int, cols: int, std: float = 0.02) -> Any:
        return rng.normal(0.0, std, size=(rows, cols)).astype(np.float16)

    def ones(n: int) -> Any:
        return np.ones(n, dtype=np.float32)

    head_dim = size.n_embd // size.n_head
    w.add_tensor("token_embd.weight", mat(n_vocab, size.n_embd, 1.0))
    for i in range(size.n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones(size.n_embd))
        w.add_tensor(p + "attn_q.weight", mat(size.n_embd, size.n_embd))
        w.add_tensor(p + "attn_k.weight", mat(size.n_head_kv * head_dim, size.n_embd))
        w.add_tensor(p + "attn_v.weight", mat(size.n_head_kv * head_dim, size.n_embd))
        w.add_tensor(p + "attn_output.weight", mat(size.n_embd, size.n_embd))
        w.add_tensor(p + "ffn_norm.weight", ones(size.n_embd))
        w.add_tensor(p + "ffn_gate.weight", mat(size.n_ff, size.n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(size.n_ff, size.n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(size.n_embd, size.n_ff))
    w.add_tensor("output_norm.weight", ones(size.n_embd))
    output = mat(n_vocab, size.n_embd, LOGIT_STD / size.n_embd ** 0.5)
    for idx in specials.values():
        output[idx, :] = 0
    w.add_tensor("output.weight", output)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizes", nargs="*", metavar="SIZE", help="tiny and/or slow (default: both)")
    ap.add_argument("--out-dir", type=Path, default=None)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    out_dir: Path = args.out_dir or default_cache() / "models"
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.sizes or ["tiny", "slow"]:
        if name not in SIZES:
            ap.error(f"unknown size {name!r} (choose from {', '.join(SIZES)})")
        out = out_dir / f"tiny-llama-{name}.gguf"
        if out.exists() and not args.force:
            print(f"gguf {name}: cached at {out}")
            continue
        t0 = time.monotonic()
        write_gguf(SIZES[name], out)
        print(f"gguf {name}: wrote {out} ({out.stat().st_size / 1e6:.1f} MB, "
              f"{time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
