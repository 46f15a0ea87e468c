#!/usr/bin/env bash
# Issue 16 item 3: W1 (sweep.sh's line, as in ../peers-2026-12-02/: three vLLM doubles, 64
# sequences, 600-block pools, eight 2,000-token system prompts at 6 req/s, 60 s with 20 s of
# warm-up), policy cost, through one Pharos with workers: 1 and with workers: 2 (default listen
# mode). Seeds outermost, variants innermost, so drift of the machine falls on both alike.
# Usage: run_w1.sh OUT_DIR   (SEEDS=1,2,3)
set -euo pipefail
out=${1:?usage: run_w1.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-.venv/bin/python}
seeds=${SEEDS:-1,2,3}
for seed in ${seeds//,/ }; do
    for w in 1 2; do
        uptime >> "$out/uptime.txt"
        "$python" "$here/bench_workers.py" w1 --workers "$w" -- --engines 3 --kind vllm \
            --engine-arg=--max-num-seqs=64 --engine-arg=--num-gpu-blocks-override=600 \
            --backend-capacity 64 --duration 60 --warmup 20 --seeds "$seed" --policies cost \
            --workload w1 --rate 6 --workload-arg 'prompt_tokens=[2000,2000]' \
            --out "$out/workers-$w" --resume
    done
done
uptime >> "$out/uptime.txt"
