#!/usr/bin/env python3
"""Write a tiny Hugging Face Llama model (config, safetensors, tokenizer) for vLLM.

Run with the vLLM venv's python (it has ``torch``, ``transformers`` and ``tokenizers``); nothing
is fetched from any hub.  Hidden 256, 2 layers, 4 heads, 2 KV heads, vocabulary 4096 (a
byte-level BPE trained here on Python's own stdlib sources, sorted), random weights from a fixed
seed, saved in bfloat16, and a ``PreTrainedTokenizerFast`` with a ChatML chat template.

Output: ``${PHAROS_ENGINE_CACHE:-~/.cache/pharos-engines}/models/tiny-llama-hf/`` (or
``--out-dir``).  An existing model (``config.json`` present) is kept unless ``--force``.

As in ``make_gguf.py`` the output projection is scaled so logits spread widely and the rows of
the special tokens are zero, so generations run to ``max_tokens`` instead of stopping at random.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SEED = 1234
VOCAB_SIZE = 4096
HIDDEN = 256
INTERMEDIATE = 768
LAYERS = 2
HEADS = 4
KV_HEADS = 2
MAX_POSITIONS = 4096
LOGIT_STD = 4.0
CORPUS_BYTES = 3_000_000
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


def default_cache() -> Path:
    env = os.environ.get("PHAROS_ENGINE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "pharos-engines"


def corpus(limit: int = CORPUS_BYTES) -> Iterator[str]:
    """Python's stdlib sources (top-level modules, sorted), at most ``limit`` bytes."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(p for p in stdlib.glob("*.py") if p.is_file()):
        text = path.read_text(encoding="utf-8", errors="replace")
        for i in range(0, len(text), 4096):
            chunk = text[i:i + 4096]
            yield chunk
            total += len(chunk)
            if total >= limit:
                return


def build(out: Path) -> None:
    # Imported by name so that a type checker without these packages still passes.
    torch: Any = importlib.import_module("torch")
    tk: Any = importlib.import_module("tokenizers")
    tf: Any = importlib.import_module("transformers")
    decoders, models = tk.decoders, tk.models
    pre_tokenizers, trainers = tk.pre_tokenizers, tk.trainers

    tok = tk.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = tf.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=ENDOFTEXT,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        additional_special_tokens=[IM_START],
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHATML_TEMPLATE
    ids = {s: tok.token_to_id(s) for s in SPECIAL_TOKENS}

    config = tf.LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=ids[ENDOFTEXT],
        eos_token_id=ids[IM_END],
        pad_token_id=ids[ENDOFTEXT],
        initializer_range=0.02,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(SEED)
    model = tf.LlamaForCausalLM(config)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(SEED)
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name == "lm_head.weight":
                param.normal_(0.0, LOGIT_STD / HIDDEN ** 0.5, generator=gen)
                for idx in ids.values():
                    param[idx].zero_()
            elif name == "model.embed_tokens.weight":
                param.normal_(0.0, 1.0, generator=gen)
            else:
                param.normal_(0.0, 0.02, generator=gen)
    model = model.to(torch.bfloat16)
    model.generation_config = tf.GenerationConfig(
        bos_token_id=ids[ENDOFTEXT], eos_token_id=ids[IM_END], pad_token_id=ids[ENDOFTEXT],
    )

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    fast.save_pretrained(tmp)
    # Some tokenizer writers omit the template from tokenizer_config.json; make sure it is there.
    cfg_path = tmp / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    if cfg.get("chat_template") != CHATML_TEMPLATE and not (tmp / "chat_template.jinja").exists():
        cfg["chat_template"] = CHATML_TEMPLATE
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=None)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    out: Path = args.out_dir or default_cache() / "models" / "tiny-llama-hf"
    if (out / "config.json").exists() and not args.force:
        print(f"hf model: cached at {out}")
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    build(out)
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"hf model: wrote {out} ({size / 1e6:.1f} MB, {time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
