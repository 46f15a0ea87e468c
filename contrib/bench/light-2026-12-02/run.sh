#!/usr/bin/env bash
set -euo pipefail
cd /work/main
out=/tmp/light2/out
for w in "$@"; do
  args=(--workload-arg 'prompt_tokens=[2000,2000]' --workload-arg 'unique_tokens=[1000,3000]')
  [ "$w" = w6 ] && args=(--workload-arg 'prompt_tokens=[1000,3000]')
  .venv/bin/pharos bench compare --engines 3 --kind vllm --engine-arg=--max-num-seqs=64 \
    --engine-arg=--num-gpu-blocks-override=600 --backend-capacity 64 --duration 60 --warmup 20 \
    --seeds 1,2,3,4,5 --policies least-load,cost --out "$out" --resume --workload "$w" --rate 3 "${args[@]}"
done
