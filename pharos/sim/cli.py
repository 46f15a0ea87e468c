"""``pharos sim-engine --kind K --port P``: one engine double until Ctrl-C, on the reactor the
console script (pharos.cli) hands it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from twisted.internet.interfaces import IReactorCore, IReactorTCP

from pharos.engine.library import VLLM
from pharos.sim.batch import VLLM_KNOBS
from pharos.sim.double import KINDS
from pharos.sim.model import (
    DEFAULT_CACHE_TOKENS,
    DEFAULT_DECODE_S,
    DEFAULT_HOST_MEMORY,
    DEFAULT_LOAD_S,
    DEFAULT_MAX_OUTPUT_TOKENS,
    DEFAULT_PREFILL_S,
    DEFAULT_SLOTS,
    KV_USAGE_COUNTS,
    Knobs,
)


def parser() -> argparse.ArgumentParser:
    """The ``sim-engine`` arguments (also usable as a subparser's parents)."""
    p = argparse.ArgumentParser(
        prog="pharos sim-engine",
        description="Run one simulated engine (its wire format cloned from its pinned "
                    "capture, its timing from its kind's behaviour model) until Ctrl-C.",
    )
    p.add_argument("--kind", required=True, choices=KINDS, help="the engine to simulate")
    p.add_argument("--port", type=int, default=0, help="TCP port (default: any free one)")
    p.add_argument("--interface", default="127.0.0.1", help="address to listen on")
    p.add_argument("--slots", type=int, default=DEFAULT_SLOTS,
                   help=f"parallel requests per model (default {DEFAULT_SLOTS})")
    p.add_argument("--model", action="append", default=[], metavar="NAME[=GB]",
                   help="a served model (repeatable; default: the capture's models)")
    p.add_argument("--loaded", action="append", default=None, metavar="NAME",
                   help="a model in memory at start (Ollama; default: none)")
    p.add_argument("--prefill-ms", type=float, default=None,
                   help="milliseconds per uncached prompt token (default: the kind's, "
                        f"{DEFAULT_PREFILL_S * 1000:g} but vLLM "
                        f"{float(VLLM_KNOBS['prefill_s']) * 1000:g})")
    p.add_argument("--decode-ms", type=float, default=None,
                   help="milliseconds per generated token (default: the kind's, "
                        f"{DEFAULT_DECODE_S * 1000:g} but vLLM "
                        f"{float(VLLM_KNOBS['decode_s']) * 1000:g})")
    p.add_argument("--load-s", type=float, default=DEFAULT_LOAD_S,
                   help="seconds to load a cold model")
    p.add_argument("--host-memory-gb", type=float, default=DEFAULT_HOST_MEMORY / 1e9,
                   help="memory the loaded models share, GB")
    p.add_argument("--cache-tokens", type=int, default=None,
                   help="prefix cache (and KV pool) size in tokens (default: the kind's, "
                        f"{DEFAULT_CACHE_TOKENS} but vLLM {VLLM_KNOBS['cache_tokens']})")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_OUTPUT_TOKENS,
                   help="cap on generated tokens per request")
    p.add_argument("--fixtures", type=Path, default=None,
                   help="the fixtures/ directory holding the pinned captures")
    batch = p.add_argument_group(
        "vLLM-like engine", "the batch model's numbers (default: the kind's; vLLM's are the "
        "related system's simulator defaults, assumed)")
    batch.add_argument("--max-num-seqs", type=int, dest="slots", default=argparse.SUPPRESS,
                       help="vLLM's name for --slots: sequences in one batch")
    batch.add_argument("--max-num-batched-tokens", type=int, default=None,
                       help="tokens one engine step may compute")
    batch.add_argument("--block-size", type=int, default=None, help="tokens per KV block")
    batch.add_argument("--num-gpu-blocks-override", type=int, default=None,
                       help="KV blocks in the pool (sets the pool's tokens: blocks x block size)")
    batch.add_argument("--prefill-pair-ns", type=float, default=None,
                       help="b of P(u, c) = a*u + b*u*(c + u/2) + d, nanoseconds per token pair")
    batch.add_argument("--prefill-fixed-ms", type=float, default=None,
                       help="d of P(u, c): milliseconds any prefill costs")
    batch.add_argument("--decode-seq-us", type=float, default=None,
                       help="microseconds each further sequence adds to a decode step")
    batch.add_argument("--kv-usage", choices=KV_USAGE_COUNTS, default=None,
                       help="what kv_cache_usage_perc counts: blocks of running requests "
                            "(running, as vLLM does; the default) or the prefix cache's fill")
    return p


def double_args(args: argparse.Namespace) -> dict[str, Any]:
    """``start_double`` keyword arguments from parsed ``sim-engine`` arguments."""
    out: dict[str, Any] = {
        "slots": args.slots,
        "load_s": args.load_s,
        "host_memory": int(args.host_memory_gb * 1e9),
        "max_output_tokens": args.max_tokens,
    }
    # Unset numbers stay unset: the double then uses its kind's defaults.
    given = {
        "prefill_s": None if args.prefill_ms is None else args.prefill_ms / 1000,
        "decode_s": None if args.decode_ms is None else args.decode_ms / 1000,
        "cache_tokens": args.cache_tokens,
        "batch_tokens": args.max_num_batched_tokens,
        "block_tokens": args.block_size,
        "prefill_pair_s": None if args.prefill_pair_ns is None else args.prefill_pair_ns / 1e9,
        "prefill_fixed_s": None if args.prefill_fixed_ms is None
        else args.prefill_fixed_ms / 1000,
        "decode_seq_s": None if args.decode_seq_us is None else args.decode_seq_us / 1e6,
        "kv_usage_counts": args.kv_usage,
    }
    if args.num_gpu_blocks_override is not None:
        block = args.block_size or int(VLLM_KNOBS["block_tokens"] if args.kind == VLLM
                                       else Knobs().block_tokens)
        given["cache_tokens"] = args.num_gpu_blocks_override * block
    out.update((k, v) for k, v in given.items() if v is not None)
    if args.model:
        models: dict[str, int] = {}
        for spec in args.model:
            name, _, gb = spec.partition("=")
            models[name] = int(float(gb) * 1e9) if gb else 0
        out["models"] = models
    if args.loaded is not None:
        out["loaded"] = tuple(args.loaded)
    if args.fixtures is not None:
        out["fixtures"] = args.fixtures
    return out


def main_sim_engine(argv: Sequence[str] | None, reactor: IReactorCore) -> int:
    """Run one double on ``reactor`` (the console script passes the global one) until
    interrupted; the exit code."""
    args = parser().parse_args(argv)
    from pharos.sim.double import start_double

    try:
        double, port = start_double(args.kind, IReactorTCP(reactor), port=args.port,
                                    interface=args.interface, **double_args(args))
    except (OSError, ValueError) as e:
        print(f"pharos sim-engine: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a port in use is a CannotListenError
        print(f"pharos sim-engine: {e}", file=sys.stderr)
        return 1
    print(f"{args.kind} double listening on {double.url}", flush=True)
    reactor.addSystemEventTrigger("before", "shutdown", double.stop)
    reactor.addSystemEventTrigger("before", "shutdown", port.stopListening)
    reactor.run()
    return 0

