#!/usr/bin/env bash
# The committed sweep (issue 4 §5, issue 5 §6): every workload, every policy, fresh simulated
# engines per run, policies innermost, two seeds. Rates sit near 70% of what a cache-blind
# fleet of three vLLM-like doubles sustains here (W1 at 6 req/s: round robin's p99 TTFT is
# ~1.4 s there). Usage: contrib/bench/sweep.sh OUT_DIR   (then: pharos bench report OUT_DIR)
set -euo pipefail
out=${1:?usage: sweep.sh OUT_DIR}
pharos=${PHAROS:-.venv/bin/pharos}
seeds=${SEEDS:-1}
duration=${DURATION:-60}
warmup=${WARMUP:-20}
policies=${POLICIES:-round-robin,random,p2c,prefix-hash,cost}

# Three vLLM-like engines (max-num-seqs 64, Pharos told so). Small KV pools (600 blocks of 16
# tokens = 9,600 tokens) for the shared-prompt workloads, so each engine holds only some of
# the 8 system prompts; larger ones (1,200 blocks) where contexts grow long.
vllm() {
    local blocks=$1; shift
    "$pharos" bench compare --engines 3 --kind vllm --engine-arg=--max-num-seqs=64 \
        --engine-arg=--num-gpu-blocks-override="$blocks" --backend-capacity 64 \
        --duration "$duration" --warmup "$warmup" --seeds "$seeds" --policies "$policies" \
        --out "$out" --resume "$@"
}

vllm 600 --workload w1 --rate 6 --workload-arg 'prompt_tokens=[2000,2000]'
vllm 600 --workload hot --rate 6 --workload-arg 'prompt_tokens=[2000,2000]'
# mix and w6 at 6 req/s turned out past the small-pool fleet's capacity (round robin's p99
# TTFT 4-7 s): they also run at 3 req/s.
vllm 600 --workload mix --rate 3 --rate 6 --workload-arg 'prompt_tokens=[2000,2000]' \
    --workload-arg 'unique_tokens=[1000,3000]'
vllm 600 --workload w6 --rate 3 --rate 6 --workload-arg 'prompt_tokens=[1000,3000]'
vllm 1200 --workload w4 --rate 6
vllm 1200 --workload w2 --rate 8 --workload-arg think=5 --workload-arg min_think=2
vllm 1200 --workload w3 --rate 3 --workload-arg 'steps=[4,8]' \
    --workload-arg 'result_tokens=[100,600]'
# Several models on Ollama-like hosts (two 4 GB models fit in each host's 10 GB; load 8 s).
"$pharos" bench compare --engines 3 --kind ollama --model-gb 4 --workload multi-model \
    --rate 1 --duration "$duration" --warmup "$warmup" --seeds "$seeds" \
    --policies "$policies" --out "$out" --resume

"$pharos" bench report "$out" --out "${REPORT:-$out/report}"
