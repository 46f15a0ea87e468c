#!/usr/bin/env bash
# Issue 10 item 2: shared prefixes on engines whose caches hold only part of them, whatever
# order the traffic starts in. Three vLLM-like doubles (64 sequences, Pharos not told: capacity
# learned) with 250-block pools (4,000 tokens: about half of the eight 500-token system
# prompts once running requests have their blocks), W1 at 20 req/s with short questions
# (10-40 tokens: a hit caches ~95 % of a prompt) and short replies (10-30 tokens). Two starts:
# `serial` (the first 16 requests one at a time, 0.5 s apart) and `burst` (all 16 at once).
# KV usage as vLLM counts it (running requests' blocks) unless KV=fill.
# Usage: contrib/bench/shared-prefix.sh OUT_DIR   (then: pharos bench report OUT_DIR)
set -euo pipefail
out=${1:?usage: shared-prefix.sh OUT_DIR}
pharos=${PHAROS:-.venv/bin/pharos}
seeds=${SEEDS:-1,2,3}
policies=${POLICIES:-round-robin,prefix-aware,least-load,cost}
kv=${KV:-running}
for start in ${STARTS:-serial burst}; do
    "$pharos" bench compare --engines 3 --kind vllm --engine-arg=--max-num-seqs=64 \
        --engine-arg=--num-gpu-blocks-override=250 --engine-arg=--kv-usage="$kv" \
        --workload w1 --rate 20 --duration "${DURATION:-40}" --warmup "${WARMUP:-15}" \
        --seeds "$seeds" --policies "$policies" \
        --workload-arg 'prompt_tokens=[500,500]' --workload-arg 'question_tokens=[10,40]' \
        --workload-arg 'output_tokens=[10,30]' --workload-arg start="$start" \
        --out "$out/kv-$kv/$start" --resume
done
