#!/usr/bin/env bash
# Issue 10 item 4 in real time on a tree (a worktree): ../light-2026-12-02/run.sh's settings
# (three vLLM doubles, 64 sequences, Pharos told 64, 600-block pools, 3 req/s, 60 s after 20 s
# of warm-up), least-load and cost side by side, seeds 1-5, mix and w6.
# Usage: light.sh TREE OUT_DIR
set -euo pipefail
tree=${1:?usage: light.sh TREE OUT_DIR}
out=${2:?usage: light.sh TREE OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
for w in w6 mix; do
  args=(--workload-arg 'prompt_tokens=[2000,2000]' --workload-arg 'unique_tokens=[1000,3000]')
  [ "$w" = w6 ] && args=(--workload-arg 'prompt_tokens=[1000,3000]')
  PYTHONPATH="$tree" .venv/bin/pharos bench compare --engines 3 --kind vllm \
    --engine-arg=--max-num-seqs=64 --engine-arg=--num-gpu-blocks-override=600 \
    --backend-capacity 64 --duration 60 --warmup 20 --seeds "${SEEDS:-1,2,3,4,5}" \
    --policies least-load,cost --out "$out" --resume --workload "$w" --rate 3 "${args[@]}"
done
