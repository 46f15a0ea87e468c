"""``pharos sim-engine --kind K --port P``: one engine double, alone, until Ctrl-C.

The console script (pharos.cli) hands it the global reactor.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pharos.sim.double import KINDS
from pharos.sim.model import (
    DEFAULT_CACHE_TOKENS,
    DEFAULT_DECODE_S,
    DEFAULT_HOST_MEMORY,
    DEFAULT_LOAD_S,
    DEFAULT_MAX_OUTPUT_TOKENS,
    DEFAULT_PREFILL_S,
    DEFAULT_SLOTS,
)


def parser() -> argparse.ArgumentParser:
    """The ``sim-engine`` arguments (also usable as a subparser's parents)."""
    p = argparse.ArgumentParser(
        prog="pharos sim-engine",
        description="Run one simulated engine (its wire format cloned from its pinned "
                    "capture, its timing from the simple latency model) until Ctrl-C.",
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
    p.add_argument("--prefill-ms", type=float, default=DEFAULT_PREFILL_S * 1000,
                   help="milliseconds per uncached prompt token")
    p.add_argument("--decode-ms", type=float, default=DEFAULT_DECODE_S * 1000,
                   help="milliseconds per generated token")
    p.add_argument("--load-s", type=float, default=DEFAULT_LOAD_S,
                   help="seconds to load a cold model")
    p.add_argument("--host-memory-gb", type=float, default=DEFAULT_HOST_MEMORY / 1e9,
                   help="memory the loaded models share, GB")
    p.add_argument("--cache-tokens", type=int, default=DEFAULT_CACHE_TOKENS,
                   help="prefix cache (and KV pool) size in tokens")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_OUTPUT_TOKENS,
                   help="cap on generated tokens per request")
    p.add_argument("--fixtures", type=Path, default=None,
                   help="the fixtures/ directory holding the pinned captures")
    return p


def double_args(args: argparse.Namespace) -> dict[str, Any]:
    """``start_double`` keyword arguments from parsed ``sim-engine`` arguments."""
    out: dict[str, Any] = {
        "slots": args.slots,
        "prefill_s": args.prefill_ms / 1000,
        "decode_s": args.decode_ms / 1000,
        "load_s": args.load_s,
        "host_memory": int(args.host_memory_gb * 1e9),
        "cache_tokens": args.cache_tokens,
        "max_output_tokens": args.max_tokens,
    }
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


def main_sim_engine(argv: Sequence[str] | None, reactor: Any) -> int:
    """Run one double on ``reactor`` (the console script passes the global one) until
    interrupted; the exit code."""
    args = parser().parse_args(argv)
    from pharos.sim.double import start_double

    try:
        double, port = start_double(args.kind, reactor, port=args.port,
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

