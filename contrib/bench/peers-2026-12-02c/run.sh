#!/usr/bin/env bash
# Issue 13: 1 -> 3 instances with peers told of dispatches, before against after, W1 as in
# ../peers-2026-12-02/run.sh (three vLLM doubles, 64 sequences, 600-block pools, eight
# 2,000-token system prompts at 6 req/s, 60 s with 20 s of warm-up), policy cost.
#   one                 1 instance, the tree on PYTHONPATH (no peers: the dispatch ops are
#                       never built, so both trees run the same code here)
#   three-peers-before  3 instances, peers, the tree in $BEFORE
#   three-peers         3 instances, peers, the tree on PYTHONPATH (dispatches told)
#   three-peers-ret     3 instances, peers, the tree in $RET (dispatches told, and each
#                       target's learned retention in every delta)
#   three-peers-retonly 3 instances, peers, the tree in $RETONLY (retention in every delta,
#                       no dispatch ops: records count as sends, as before)
# Seeds outermost, variants innermost (interleaved), so drift of the machine falls on every
# variant alike.
# Usage: run.sh OUT_DIR   (SEEDS=1,2,3,4,5 VARIANTS="..." BEFORE=/path/to/tree RET=/path RETONLY=/path)
set -euo pipefail
out=${1:?usage: run.sh OUT_DIR}
pharos=${PHAROS:-.venv/bin/pharos}
seeds=${SEEDS:-1,2,3,4,5}
variants=${VARIANTS:-three-peers-before three-peers one}

args() {
    case $1 in
        one) ;;
        three-peers|three-peers-*) echo --instances 3 --peers ;;
        *) echo "unknown variant $1" >&2; exit 2 ;;
    esac
}

for seed in ${seeds//,/ }; do
    for v in $variants; do
        path=${PYTHONPATH:-}
        [[ $v == *-before ]] && path=${BEFORE:?three-peers-before needs BEFORE=tree}
        [[ $v == *-ret ]] && path=${RET:?three-peers-ret needs RET=tree}
        [[ $v == *-retonly ]] && path=${RETONLY:?three-peers-retonly needs RETONLY=tree}
        echo "$(date -u +%H:%M:%S) seed $seed $v load $(cut -d' ' -f1-3 /proc/loadavg)"
        # shellcheck disable=SC2046
        PYTHONPATH=$path "$pharos" bench compare --engines 3 --kind vllm \
            --engine-arg=--max-num-seqs=64 --engine-arg=--num-gpu-blocks-override=600 \
            --backend-capacity 64 --duration 60 --warmup 20 --seeds "$seed" --policies cost \
            --workload w1 --rate 6 --workload-arg 'prompt_tokens=[2000,2000]' \
            --out "$out/$v" --resume $(args "$v")
    done
done
