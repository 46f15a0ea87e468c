#!/usr/bin/env bash
# The real-time cross-check: pharos bench compare with ../light-2026-12-02/run.sh's settings
# (three vLLM doubles, 64 sequences, Pharos told 64, 600-block pools, 3 req/s, 60 s with 20 s
# of warm-up), mix only, seeds SEEDS (default 1,2), least-load and cost interleaved.
# Usage: realtime.sh OUT_DIR   (from the checkout's root; uptime before and after)
set -euo pipefail
out=${1:?usage: realtime.sh OUT_DIR}
seeds=${SEEDS:-1,2}
uptime
.venv/bin/pharos bench compare --engines 3 --kind vllm --engine-arg=--max-num-seqs=64 \
  --engine-arg=--num-gpu-blocks-override=600 --backend-capacity 64 --duration 60 --warmup 20 \
  --seeds "$seeds" --policies least-load,cost --out "$out" --resume --workload mix --rate 3 \
  --workload-arg 'prompt_tokens=[2000,2000]' --workload-arg 'unique_tokens=[1000,3000]'
uptime
